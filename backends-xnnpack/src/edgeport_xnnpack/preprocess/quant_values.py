"""Int8 values shared by the static (:mod:`.quantized`) and dynamic (:mod:`.dynamic_quantized`) lowerings: the
``quantized_decomposed`` op names, per-tensor parameters, the plan records, and helpers that add quantized values
and constants to the XNNPACK graph."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name
from edgeport.errors import LoweringError
from edgeport_xnnpack.preprocess.builder import ALIGNMENT, NCHW, GraphBuilder, Val
from edgeport_xnnpack.schema.graph import QINT8, ConstantDataOffset, PerTensorQuant, TensorValue

Q = "quantized_decomposed.quantize_per_tensor.default"
DQ = "quantized_decomposed.dequantize_per_tensor.default"
DQC = "quantized_decomposed.dequantize_per_channel.default"
QT = "quantized_decomposed.quantize_per_tensor.tensor"
DQT = "quantized_decomposed.dequantize_per_tensor.tensor"
CHOOSE = "quantized_decomposed.choose_qparams.tensor"


@dataclass(frozen=True)
class QParams:
    """Per-tensor int8 parameters of a quantize / dequantize node."""

    scale: float
    zero_point: int
    qmin: int = -128
    qmax: int = 127

    def same(self, other: QParams) -> bool:
        return self.zero_point == other.zero_point and math.isclose(self.scale, other.scale, rel_tol=1e-6)

    def clamp_range(self) -> tuple[float, float]:
        """The real range a narrower quant range than [-128, 127] clamps to (``inf`` where it does not)."""
        lo = (self.qmin - self.zero_point) * self.scale if self.qmin > -128 else -math.inf
        hi = (self.qmax - self.zero_point) * self.scale if self.qmax < 127 else math.inf
        return lo, hi


def qarg(node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def per_tensor_params(node: Any) -> QParams | None:
    """The parameters of an int8 ``quantize_per_tensor`` / ``dequantize_per_tensor`` node, else ``None``."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or op_name(node.target) not in (Q, DQ):
        return None
    scale, zp, qmin, qmax, dtype = (qarg(node, i + 1, n) for i, n in enumerate(
        ("scale", "zero_point", "quant_min", "quant_max", "dtype")))
    if dtype != torch.int8 or isinstance(scale, torch.fx.Node) or isinstance(zp, torch.fx.Node):
        return None
    return QParams(float(scale), int(zp), int(qmin), int(qmax))


def is_op(node: Any, *names: str) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and op_name(node.target) in names


@dataclass
class Weight:
    """An int8 weight: data, scales (one per output channel, or one), and whether per channel."""

    data: torch.Tensor
    scales: np.ndarray
    per_channel: bool


@dataclass
class QOp:
    """One op lowered in int8."""

    node: torch.fx.Node
    kind: str
    inputs: list[torch.fx.Node]              # the dequantize nodes of the activation inputs
    in_params: list[QParams]
    last: torch.fx.Node                      # the node whose value is quantized (the op, or its fused clamp)
    fused: list[torch.fx.Node]               # clamps folded into the op's output range
    quants: list[torch.fx.Node]              # the quantize nodes absorbed after ``last``
    out: QParams
    minmax: tuple[float, float] | None = None
    weight: Weight | None = None
    bias: torch.Tensor | None = None         # float, or int32 on the accumulator's scale (the quantizer's)
    weight_nodes: list[torch.fx.Node] = field(default_factory=list)



class SkipInt8(Exception):
    """Why an op stays float."""



def new_value(b: GraphBuilder, datatype: int, dims: list[int], quant: Any, data_index: int = 0) -> int:
    if len(dims) > 6:
        raise LoweringError(f"XNNPACK tensors have at most 6 dimensions, got {list(dims)}")
    vid = len(b.graph.values)
    b.graph.values.append(TensorValue(datatype, [int(d) for d in dims], vid, constant_buffer_idx=data_index,
                                      quant=quant))
    return vid


def new_qval(b: GraphBuilder, shape: tuple[int, ...], layout: str, params: QParams) -> Val:
    """A fresh qint8 value of logical shape ``shape`` in ``layout`` (NCHW unless 4-D)."""
    val = Val(-1, layout if len(shape) == 4 else NCHW, tuple(int(d) for d in shape))
    val.id = new_value(b, QINT8, val.dims, PerTensorQuant(params.scale, params.zero_point))
    return val


def new_constant(b: GraphBuilder, array: np.ndarray, datatype: int, quant: Any) -> int:
    arr = np.ascontiguousarray(array)
    b.data.extend(bytes(-len(b.data) % ALIGNMENT))
    offset = len(b.data)
    b.data.extend(arr.tobytes())
    b.graph.constant_data.append(ConstantDataOffset(offset, arr.nbytes))
    return new_value(b, datatype, list(arr.shape), quant, len(b.graph.constant_data) - 1)


def is_quantized(b: GraphBuilder, v: Val) -> bool:
    return b.graph.values[v.id].datatype == QINT8


def qparams_of(b: GraphBuilder, v: Val) -> QParams:
    q = b.graph.values[v.id].quant
    return QParams(q.scale, q.zero_point)

