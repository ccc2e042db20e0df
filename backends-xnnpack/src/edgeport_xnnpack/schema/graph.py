"""In-memory model of an XNNPACK delegate graph (``xnnpack.fbs``) and the layout facts the writer and reader share.

Torch-free. A node is ``XNode(kind, fields)`` where ``kind`` is the union member name (``"XNNConv2d"``) and
``fields`` holds that member table's fields by name (missing ones read as 0). Values are
:class:`TensorValue`; a value with ``quant`` set is serialized as an ``XNNQuantizedTensorValue``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

INVALID_ID = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF
FILE_IDENTIFIER = b"XN01"
ACCEPTED_IDENTIFIERS = (b"XN00", b"XN01")

# datatype enum (same numbers as xnnpack.h's enum xnn_datatype)
FP32, FP16, QINT8, QUINT8, QINT32, QCINT8, QCINT32 = 1, 2, 3, 4, 5, 6, 7
QDINT8 = 9  # int8 quantized at run time, one scale / zero point per row (dynamic quantization)
QBINT4 = 10  # 4-bit weights, one scale per block of ``group_size`` input channels (two values per byte)

# Table layouts: field name -> scalar kind, in vtable slot order. Kinds: u32, i32, f32, [u32], [f32].
_NODE2x1 = (("input1_id", "u32"), ("input2_id", "u32"), ("output_id", "u32"), ("flags", "u32"))
_NODE1x1 = (("input_id", "u32"), ("output_id", "u32"), ("flags", "u32"))
_CONV = tuple((n, "u32") for n in (
    "padding_top", "padding_right", "padding_bottom", "padding_left", "kernel_height", "kernel_width",
    "subsampling_height", "subsampling_width", "dilation_height", "dilation_width", "group_input_channels",
    "group_output_channels", "groups", "adjustment_height", "adjustment_width", "input1_id", "filter_id",
    "bias_id", "output_id", "flags"))
_POOL = tuple((n, "u32") for n in (
    "padding_top", "padding_right", "padding_bottom", "padding_left", "pooling_height", "pooling_width",
    "stride_height", "stride_width", "dilation_height", "dilation_width", "input_id", "output_id", "flags"))
_CAT = tuple((n, "u32") for n in (
    "axis", "input1_id", "input2_id", "input3_id", "input4_id", "output_id", "flags", "input5_id"))
_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "_XNNNode2x1": _NODE2x1,
    "_XNNNode1x1": _NODE1x1,
    "_XNNNodeConv": _CONV,
    "_XNNPooling2D": _POOL,
    "_XNNCat": _CAT,
    "XNNFullyConnected": (("input1_id", "u32"), ("filter_id", "u32"), ("bias_id", "u32"), ("output_id", "u32"),
                          ("flags", "u32")),
    "XNNStaticTranspose": (("num_dims", "u32"), ("perm", "[u32]"), ("input_id", "u32"), ("output_id", "u32"),
                           ("flags", "u32")),
    "XNNStaticResizeBilinear2D": (("new_height", "u32"), ("new_width", "u32"), ("input_id", "u32"),
                                  ("output_id", "u32"), ("flags", "u32")),
    "XNNStaticConstantPad": (("pre_paddings", "[u32]"), ("post_paddings", "[u32]"), ("padding_value", "f32"),
                             ("input_id", "u32"), ("output_id", "u32"), ("flags", "u32")),
    "XNNELU": (("alpha", "f32"), ("input_id", "u32"), ("output_id", "u32"), ("flags", "u32")),
    "XNNStaticReshape": (("num_dims", "u32"), ("new_shape", "[u32]"), ("input_id", "u32"), ("output_id", "u32"),
                         ("flags", "u32")),
    "XNNStaticSlice": (("num_dims", "u32"), ("offsets", "[u32]"), ("sizes", "[u32]"), ("input_id", "u32"),
                       ("output_id", "u32"), ("flags", "u32")),
    "XNNScaledDotProductAttention": tuple((n, "u32") for n in (
        "query_id", "key_id", "value_id", "scale_id", "mask_id", "output_id", "flags")),
    "XNNArgMaxPooling2d": tuple((n, "u32") for n in (
        "padding_top", "padding_right", "padding_bottom", "padding_left", "pooling_height", "pooling_width",
        "input_id", "output_value_id", "output_index_id", "flags")),
    "XNNLeakyReLU": (("negative_slope", "f32"), ("input_id", "u32"), ("output_id", "u32"), ("flags", "u32")),
}

# XNodeUnion members in order (union type = position + 1) -> the table that member uses.
NODE_KINDS: tuple[tuple[str, str], ...] = (
    ("XNNAdd", "_XNNNode2x1"), ("XNNFullyConnected", "XNNFullyConnected"), ("XNNSoftmax", "_XNNNode1x1"),
    ("XNNSigmoid", "_XNNNode1x1"), ("XNNStaticTranspose", "XNNStaticTranspose"), ("XNNClamp", "_XNNNode1x1"),
    ("XNNConv2d", "_XNNNodeConv"), ("XNNDiv", "_XNNNode2x1"),
    ("XNNStaticResizeBilinear2D", "XNNStaticResizeBilinear2D"), ("XNNStaticConstantPad", "XNNStaticConstantPad"),
    ("XNNAvgPooling2d", "_XNNPooling2D"), ("XNNMinimum", "_XNNNode2x1"), ("XNNDepthwiseConv2d", "_XNNNodeConv"),
    ("XNNMaxPooling2d", "_XNNPooling2D"), ("XNNMultiply", "_XNNNode2x1"), ("XNNSubtract", "_XNNNode2x1"),
    ("XNNFloor", "_XNNNode1x1"), ("XNNConvert", "_XNNNode1x1"), ("XNNGlobalAvgPooling2d", "_XNNNode1x1"),
    ("XNNStaticReshape", "XNNStaticReshape"), ("XNNArgMaxPooling2d", "XNNArgMaxPooling2d"),
    ("XNNSquareRoot", "_XNNNode1x1"), ("XNNCeiling", "_XNNNode1x1"), ("XNNHardswish", "_XNNNode1x1"),
    ("XNNLeakyReLU", "XNNLeakyReLU"), ("XNNMaximum", "_XNNNode2x1"), ("XNNNegate", "_XNNNode1x1"),
    ("XNNSquare", "_XNNNode1x1"), ("XNNELU", "XNNELU"), ("XNNAbs", "_XNNNode1x1"), ("XNNPReLU", "_XNNNode2x1"),
    ("XNNConcatenate2", "_XNNCat"), ("XNNConcatenate3", "_XNNCat"), ("XNNConcatenate4", "_XNNCat"),
    ("XNNStaticSlice", "XNNStaticSlice"), ("XNNScaledDotProductAttention", "XNNScaledDotProductAttention"),
    ("XNNBatchMatrixMultiply", "_XNNNode2x1"), ("XNNConcatenate5", "_XNNCat"),
    ("XNNConvTranspose2d", "_XNNNodeConv"), ("XNNReciprocalSquareRoot", "_XNNNode1x1"), ("XNNLog", "_XNNNode1x1"),
    ("XNNGelu", "_XNNNode1x1"), ("XNNTanh", "_XNNNode1x1"), ("XNNExp", "_XNNNode1x1"), ("XNNSin", "_XNNNode1x1"),
    ("XNNCopy", "_XNNNode1x1"), ("XNNCos", "_XNNNode1x1"),
)
NODE_TYPE = {kind: i + 1 for i, (kind, _) in enumerate(NODE_KINDS)}
NODE_TABLE = dict(NODE_KINDS)


def node_layout(kind: str) -> tuple[tuple[str, str], ...]:
    """The (field, scalar kind) list of a node kind's table."""
    return _TABLES[NODE_TABLE[kind]]


# field names that hold value ids read / written by a node
INPUT_FIELDS = ("input_id", "input1_id", "input2_id", "input3_id", "input4_id", "input5_id", "filter_id",
                "bias_id", "query_id", "key_id", "value_id", "scale_id", "mask_id")
OUTPUT_FIELDS = ("output_id", "output_value_id", "output_index_id")
CAT_INPUTS = {"XNNConcatenate2": 2, "XNNConcatenate3": 3, "XNNConcatenate4": 4, "XNNConcatenate5": 5}


@dataclass
class PerTensorQuant:
    scale: float
    zero_point: int = 0


@dataclass
class PerChannelQuant:
    scale: list[float]
    channel_dim: int = 0
    scale_buffer_idx: int = 0
    num_scales: int = 0


@dataclass
class PerChannelGroupQuant:
    """Blockwise scales of a ``qbint4`` filter: ``[out_channels, in_channels / group_size]`` of them, as
    float32 in ``scale`` or (ExecuTorch 1.5.1) bfloat16 in the constant data entry ``scale_buffer_idx``."""

    scale: list[float]
    channel_dim: int = 0
    group_size: int = 0
    scale_buffer_idx: int = 0
    num_scales: int = 0


@dataclass
class PerTokenDynamicQuant:
    """Parameters computed at run time for each row: the trailing ``num_nonbatch_dims`` dims form a row."""

    num_nonbatch_dims: int = 1


@dataclass
class TensorValue:
    """An ``XNNTensorValue`` (or, with ``quant``, an ``XNNQuantizedTensorValue``)."""

    datatype: int
    dims: list[int]
    id_out: int
    constant_buffer_idx: int = 0
    external_id: int = INVALID_ID
    flags: int = 0
    dq_datatype: int = 0
    quant: PerTensorQuant | PerChannelQuant | PerChannelGroupQuant | PerTokenDynamicQuant | None = None
    quant_kind: int = 0  # union type of unsupported quant params read from a blob (0 = none / known)


@dataclass
class XNode:
    kind: str
    fields: dict[str, Any]
    debug_handle: int = 0
    output_min_max: tuple[float, float] | None = None

    def get(self, name: str) -> Any:
        value = self.fields.get(name)
        if value is not None:
            return value
        return [] if name in _LIST_FIELDS else 0

    def inputs(self) -> list[int]:
        """Value ids this node reads (``INVALID_ID`` entries, e.g. a missing bias, left out)."""
        get = self.fields.get
        out = []
        for f in id_fields(self.kind)[0]:
            v = get(f)
            if v is None:
                v = 0
            if v != INVALID_ID:
                out.append(v)
        return out

    def outputs(self) -> list[int]:
        get = self.fields.get
        return [0 if (v := get(f)) is None else v for f in id_fields(self.kind)[1]]


_LIST_FIELDS = frozenset(("perm", "new_shape", "offsets", "sizes", "pre_paddings", "post_paddings"))
_ID_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def id_fields(kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the fields of a node kind that hold the value ids it reads and writes, in order (computed once
    per kind; the ids themselves are read from a node's fields on every call, as they may be rewritten)."""
    names = _ID_FIELDS.get(kind)
    if names is None:
        layout = node_layout(kind)
        ins = tuple(f for f, _ in layout if f in INPUT_FIELDS)
        if kind in CAT_INPUTS:
            ins = tuple(f"input{i + 1}_id" for i in range(CAT_INPUTS[kind]))
        names = _ID_FIELDS[kind] = (ins, tuple(f for f, _ in layout if f in OUTPUT_FIELDS))
    return names


@dataclass
class ConstantDataOffset:
    offset: int = 0
    size: int = 0
    named_key: str | None = None


@dataclass
class Graph:
    """An ``XNNGraph`` plus the blob's constant data region."""

    nodes: list[XNode] = field(default_factory=list)
    values: list[TensorValue] = field(default_factory=list)
    num_externs: int = 0
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    constant_data: list[ConstantDataOffset] = field(default_factory=lambda: [ConstantDataOffset()])
    version: str = "0"
    legacy_buffers: list[Any] | None = None  # Buffer.storage views of an old blob (constant_buffer)
