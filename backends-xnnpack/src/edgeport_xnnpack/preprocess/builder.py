"""GraphBuilder: the state preprocess lowers one fx graph into (values, nodes, constant data, layouts).

Layouts: every lowered value is either ``NCHW`` (the tensor's logical, contiguous layout) or ``NHWC`` (a 4-D
tensor kept channels-last, as XNNPACK's convolutions and poolings want it). Inputs and outputs of the delegate
are ``NCHW``; :meth:`GraphBuilder.value` converts on demand with one ``XNNStaticTranspose`` per value and
direction (cached), or a free ``XNNStaticReshape`` when the permutation does not move memory (H*W == 1 or
C == 1), and permutes constants at lowering time. This is what ExecuTorch's XNNPACK delegate does at
partition boundaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edgeport.errors import LoweringError
from edgeport_xnnpack.schema.graph import FP32, INVALID_ID, ConstantDataOffset, Graph, TensorValue, XNode

NCHW, NHWC = "nchw", "nhwc"
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
ALIGNMENT = 16
KEEP_DIMS = 0x40
# node kinds whose output_min_max ExecuTorch's runtime and this library both honour
MINMAX_KINDS = {"XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNFullyConnected", "XNNConv2d",
                "XNNDepthwiseConv2d", "XNNMaxPooling2d", "XNNAvgPooling2d", "XNNGlobalAvgPooling2d", "XNNClamp"}


@dataclass
class Val:
    """A lowered tensor: its value id, layout, and logical (NCHW) shape."""

    id: int
    layout: str
    shape: tuple[int, ...]

    @property
    def dims(self) -> list[int]:
        s = self.shape
        return [s[0], s[2], s[3], s[1]] if self.layout == NHWC else list(s)


def logical_shape(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The static shape of ``node``'s (first) tensor output."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    if not hasattr(val, "shape") or any(type(d) is not int for d in val.shape):
        return None
    return tuple(val.shape)


def nhwc_dim(dim: int) -> int:
    """The NHWC position of NCHW dimension ``dim`` of a 4-D tensor."""
    return (0, 3, 1, 2)[dim % 4]


class GraphBuilder:
    def __init__(self) -> None:
        self.graph = Graph()
        self.data = bytearray()
        self.env: dict[torch.fx.Node, Val] = {}
        self.constants: dict[torch.fx.Node, torch.Tensor] = {}
        self.outputs: set[torch.fx.Node] = set()  # fx nodes whose values leave the delegate
        self.extra_outputs: dict[tuple[torch.fx.Node, int], Val] = {}  # (multi-output node, index > 0) -> value
        self.views: Any = None  # preprocess.views.Views: view ops not emitted yet
        self._converted: dict[tuple[int, str], Val] = {}
        self._producer: dict[int, int] = {}
        self._const_ids: dict[tuple[int, str], Val] = {}
        self._aliases: dict[int, list[torch.fx.Node]] = {}
        self._keepalive: list[torch.Tensor] = []
        #: the debug handle of the edge node being lowered: nodes added meanwhile carry it (0: none)
        self.current_handle = 0

    # -- values -----------------------------------------------------------------------------------------------
    def new_value(self, dims: list[int] | tuple[int, ...], data_index: int = 0) -> int:
        if len(dims) > 6:
            raise LoweringError(f"XNNPACK tensors have at most 6 dimensions, got {list(dims)}")
        vid = len(self.graph.values)
        self.graph.values.append(TensorValue(FP32, [int(d) for d in dims], vid, constant_buffer_idx=data_index))
        return vid

    def new_val(self, shape: tuple[int, ...] | list[int], layout: str = NCHW) -> Val:
        val = Val(-1, layout, tuple(int(d) for d in shape))
        val.id = self.new_value(val.dims)
        return val

    def constant_array(self, array: np.ndarray) -> int:
        """A constant value holding ``array`` (float32), its bytes appended to the constant data."""
        arr = np.ascontiguousarray(array, dtype=np.float32)
        self.data.extend(bytes(-len(self.data) % ALIGNMENT))
        offset = len(self.data)
        self.data.extend(arr.tobytes())
        self.graph.constant_data.append(ConstantDataOffset(offset, arr.nbytes))
        return self.new_value(arr.shape, len(self.graph.constant_data) - 1)

    def constant_tensor(self, tensor: torch.Tensor, layout: str = NCHW) -> Val:
        key = (id(tensor), layout)
        if key not in self._const_ids:
            t = tensor.detach().to(torch.float32).contiguous()
            if layout == NHWC:
                t = t.permute(TO_NHWC)
            val = Val(-1, layout, tuple(tensor.shape))
            val.id = self.constant_array(t.contiguous().numpy())
            self._const_ids[key] = val
            self._keepalive.append(tensor)
        return self._const_ids[key]

    def is_constant(self, arg: Any) -> bool:
        return isinstance(arg, torch.fx.Node) and arg in self.constants

    def tensor(self, arg: Any) -> torch.Tensor:
        if not self.is_constant(arg):
            raise LoweringError(f"{getattr(arg, 'name', arg)!r} must be a constant tensor")
        return self.constants[arg]

    def val(self, arg: Any) -> Val:
        """The lowered value of an fx node (constants are materialized in NCHW)."""
        if isinstance(arg, torch.fx.Node):
            if self.views is not None and arg in self.views.pending:
                return self.views.materialize(arg)
            if arg in self.env:
                return self.env[arg]
            if arg in self.constants:
                return self.constant_tensor(self.constants[arg])
        raise LoweringError(f"argument {getattr(arg, 'name', arg)!r} has not been lowered")

    def value(self, arg: Any, layout: str) -> Val:
        """``arg`` in ``layout`` (4-D tensors only for NHWC), converting once per value if needed."""
        if self.is_constant(arg) and arg not in self.env:
            t = self.constants[arg]
            return self.constant_tensor(t, layout if t.dim() == 4 else NCHW)
        return self.convert(self.val(arg), layout)

    def convert(self, v: Val, layout: str) -> Val:
        """``v`` in ``layout`` (a no-op unless ``v`` is 4-D in the other layout)."""
        if v.layout == layout or len(v.shape) != 4:
            return v
        key = (v.id, layout)
        if key not in self._converted:
            out = self.new_val(v.shape, layout)
            n, c, h, w = v.shape
            if c == 1 or h * w == 1:  # same bytes in both layouts
                self.add("XNNStaticReshape", num_dims=4, new_shape=out.dims, input_id=v.id, output_id=out.id)
            else:
                perm = TO_NHWC if layout == NHWC else TO_NCHW
                self.add("XNNStaticTranspose", num_dims=4, perm=perm, input_id=v.id, output_id=out.id)
            self._converted[key] = out
        return self._converted[key]

    def set(self, node: torch.fx.Node, val: Val) -> Val:
        shape = logical_shape(node) or val.shape
        if tuple(shape) != val.shape:
            raise LoweringError(f"{node.name}: lowered shape {val.shape} differs from the graph's {tuple(shape)}")
        self.env[node] = val
        self._aliases.setdefault(val.id, []).append(node)
        return val

    def output_of(self, node: torch.fx.Node, layout: str = NCHW) -> Val:
        """A fresh value for ``node``'s (single tensor) output in ``layout``."""
        shape = logical_shape(node)
        if shape is None:
            raise LoweringError(f"{node.name}: no static tensor shape in meta['val']")
        return self.new_val(shape, layout if len(shape) == 4 else NCHW)

    # -- nodes ------------------------------------------------------------------------------------------------
    def add(self, kind: str, minmax: tuple[float, float] | None = None, debug_handle: int | None = None,
            **fields: Any) -> XNode:
        """Append a node; its debug handle is the edge node being lowered (:attr:`current_handle`) unless given."""
        node = XNode(kind, fields, self.current_handle if debug_handle is None else debug_handle, minmax)
        self.graph.nodes.append(node)
        for o in node.outputs():
            self._producer[o] = len(self.graph.nodes) - 1
        return node

    def fuse_clamp(self, source: Any, lo: float, hi: float) -> bool:
        """Fold a clamp into the node producing ``source`` when that is the clamp's only consumer."""
        if not isinstance(source, torch.fx.Node) or source not in self.env:
            return False
        v = self.env[source]
        aliases = self._aliases.get(v.id, [])
        consumers = {u for a in aliases for u in a.users if u not in aliases}
        if len(consumers) != 1 or any(a in self.outputs for a in aliases):
            return False
        if any(x.id == v.id for k, x in self._converted.items()) or any(k[0] == v.id for k in self._converted):
            return False
        idx = self._producer.get(v.id)
        if idx is None:
            return False
        node = self.graph.nodes[idx]
        if node.kind not in MINMAX_KINDS:
            return False
        old_lo, old_hi = node.output_min_max or (-math.inf, math.inf)
        node.output_min_max = (max(old_lo, lo), min(old_hi, hi))
        return True

    # -- finish -----------------------------------------------------------------------------------------------
    def finish(self, inputs: list[Val], outputs: list[Val], slots: list[int] | None = None,
               num_slots: int | None = None) -> Graph:
        """Mark the external values. ``slots[k]``: the delegate argument (external id) of ``inputs[k]``, out of
        ``num_slots`` inputs (default: ``k`` of ``len(inputs)``); a non-tensor argument (a symbolic size) has a
        slot but no value, as in ExecuTorch's blobs."""
        g = self.graph
        slots = list(range(len(inputs))) if slots is None else slots
        num_slots = len(inputs) if num_slots is None else num_slots
        for k, v in zip(slots, inputs, strict=True):
            tv = g.values[v.id]
            tv.flags, tv.external_id = 1, k
        seen: set[int] = {v.id for v in inputs}
        final: list[int] = []
        for v in outputs:
            vid = v.id
            if v.layout == NHWC:
                vid = self.convert(v, NCHW).id
            if vid in seen or g.values[vid].constant_buffer_idx:
                copy = self.new_value(g.values[vid].dims)
                self.add("XNNStaticReshape", num_dims=len(g.values[vid].dims), new_shape=g.values[vid].dims,
                         input_id=vid, output_id=copy)
                vid = copy
            seen.add(vid)
            final.append(vid)
        for j, vid in enumerate(final):
            tv = g.values[vid]
            tv.flags, tv.external_id = 2, num_slots + j
        g.num_externs = num_slots + len(final)
        g.input_ids = [v.id for v in inputs]
        g.output_ids = final
        for tv in g.values:
            if not tv.flags:
                tv.external_id = INVALID_ID
        return g
