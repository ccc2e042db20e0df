"""Walks one partition's graph and builds its QNN graph (:class:`Lowering`) on a :class:`GraphBuilder`.

Values are QNN tensors with their *logical* (PyTorch) shape and a layout flag: 4-D activations go to NHWC when
an op needs it (convolution, pooling, batch norm) and stay there through layout-free ops (activations,
elementwise ops with each other or with constants); a ``Transpose`` back to NCHW is emitted only where an NCHW
consumer or a graph output needs it. Graph outputs are copied into declared output tensors (``Reshape``), so
any value (an input, the same value twice) can be an output.

The same code validates single nodes for the partitioner (:func:`validate_node`): each ``add_node`` of the
builder asks the real backend (``backendValidateOpConfig``) first.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edgeport.aot.capability_partitioner import op_name
from edgeport.errors import LoweringError

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)
#: fp32 ops the HTP fails to prepare (graphFinalize: QNN_COMMON_ERROR_MEM_ALLOC, "could not create op:
#: q::flat_from_vtcm") when none of their inputs is an ElementWiseMultiply's output and a Multiply follows them
#: anywhere downstream (measured: Div, Exp, SquareRoot, Power; not Rsqrt, Log, Abs, Neg, Sigmoid, Tanh). T5's
#: ``log(x) / c * k``, ``exp(x) / c``. Such an op reads ``x * 1.0`` (exact) instead of ``x``.
MUL_FED = frozenset({"ElementWiseDivide", "ElementWiseExp", "ElementWiseSquareRoot", "ElementWisePower"})


@dataclass(frozen=True)
class Val:
    """A QNN tensor: ``name``, logical (NCHW) ``shape``; ``nhwc`` when stored NHWC (4-D only)."""

    name: str
    shape: tuple[int, ...]
    nhwc: bool = False
    dtype: Any = np.float32
    quant: Any = None  #: QuantParams of a quantized tensor (uint8/int8), else None

    @property
    def qnn_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[i] for i in NCHW_TO_NHWC) if self.nhwc else self.shape


@dataclass(frozen=True)
class Const:
    """A constant (weight) in its logical layout; becomes a static tensor where an op reads it as a tensor."""

    data: np.ndarray


@dataclass(frozen=True)
class QConst(Const):
    """A quantized constant (a dequantized weight): ``data`` is the real value, ``raw`` the integers."""

    raw: np.ndarray = None  # type: ignore[assignment]
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()
    axis: int | None = None


@dataclass(frozen=True)
class Deq:
    """The float value of a quantized tensor ``q`` (a delegated dequantize): quantized ops read ``q`` directly,
    float ops get a ``Dequantize`` (emitted once)."""

    q: Val


Lowered = Val | Const | Deq | tuple
LoweringFn = Callable[["Lowering", torch.fx.Node], Lowered]


def fake(node: Any) -> torch.Tensor:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(val, (list, tuple)):
        val = val[0]
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"{getattr(node, 'name', node)}: no tensor metadata (meta['val'])")
    return val


def static_shape(node: Any) -> tuple[int, ...]:
    shape = fake(node).shape
    if any(not isinstance(d, int) for d in shape):
        raise LoweringError(f"{node.name}: dynamic shape {tuple(shape)}; QNN graphs here are static")
    return tuple(int(d) for d in shape)


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


class Lowering:
    """State of one partition's lowering; the op lowerings of :mod:`.ops` call its helpers."""

    def __init__(self, builder: Any, lowerings: dict[str, LoweringFn]) -> None:
        self.g = builder
        self.lowerings = lowerings
        self.values: dict[torch.fx.Node, Lowered] = {}
        self._layout_cache: dict[tuple[str, bool], Val] = {}
        self._count = 0
        self._scalars: dict[tuple, str] = {}
        self.qmode: tuple[Any, Any] | None = None  #: (dtype, QuantParams) of the outputs while lowering quantized
        self.quant_lowerings: dict[str, LoweringFn] = {}
        self.op_counts: dict[str, int] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}  #: QNN shapes of the float tensors made by nodes and inputs
        self._mul_outputs: set[str] = set()

    # -- names and nodes ------------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def node(self, op: str, inputs: list[str], out_shape: tuple[int, ...], params: dict[str, Any] | None = None,
             *, nhwc: bool = False, logical: tuple[int, ...] | None = None, like: Val | None = None) -> Val:
        """Add QNN node ``op``; ``out_shape`` is the QNN (physical) shape of its output: float32, or quantized
        as ``like`` is, or (while lowering a quantized op) with the op's output quantization."""
        name = self.fresh(op.lower())
        out = f"{name}_out"
        if like is not None:
            dtype, quant = like.dtype, like.quant
        elif self.qmode is not None:
            dtype, quant = self.qmode
        else:
            dtype, quant = np.float32, None
        shape = tuple(int(d) for d in out_shape)
        if op in MUL_FED and quant is None and not any(i in self._mul_outputs for i in inputs):
            inputs = list(inputs)
            for k, i in enumerate(inputs):
                if i in self._shapes:  # a float tensor computed in the graph (not a constant)
                    inputs[k] = self.node("ElementWiseMultiply", [i, self.scalar(1.0, len(self._shapes[i]))],
                                          self._shapes[i]).name
                    break
        self.g.add_node(op, name, inputs, [(out, shape, dtype, quant)], params or {})
        if quant is None and np.dtype(dtype) == np.float32:
            self._shapes[out] = shape
            if op == "ElementWiseMultiply":
                self._mul_outputs.add(out)
        self.op_counts[op] = self.op_counts.get(op, 0) + 1
        if logical is None:
            logical = tuple(out_shape[i] for i in NHWC_TO_NCHW) if nhwc else tuple(out_shape)
        return Val(out, tuple(int(d) for d in logical), nhwc, dtype, quant)

    def scalar(self, value: float, rank: int) -> str:
        """A static float32 scalar, shaped ``(1,) * rank`` for QNN's equal-rank broadcasting."""
        key = ("scalar", float(value), rank)
        if key not in self._scalars:
            self._scalars[key] = self.static(np.full((1,) * max(rank, 1), value, np.float32), "scalar")
        return self._scalars[key]

    def qscalar(self, value: float, rank: int) -> str:
        """A static scalar in the current quantized output type, holding ``value`` exactly (the largest or
        smallest code)."""
        from edgeport_qnn.sdk import QuantParams

        dtype = np.dtype(self.qmode[0])
        if dtype.kind != "u":
            raise LoweringError(f"a quantized scalar operand of type {dtype} is not lowered")
        top = int(np.iinfo(dtype).max)
        v = float(value)
        code, quant = ((top, QuantParams(v / top, 0)) if v > 0 else (0, QuantParams(-v / top, top)) if v < 0
                       else (0, QuantParams(1.0, 0)))
        key = ("qscalar", v, rank, dtype.str)
        if key not in self._scalars:
            name = self.fresh("qscalar")
            self.g.add_static(name, np.full((1,) * max(rank, 1), code, dtype), quant)
            self._scalars[key] = name
        return self._scalars[key]

    def binary(self, op: str, a: Val, b: str | float, nhwc_like: Val | None = None) -> Val:
        """``a`` (any layout) op ``b`` (a tensor name of the same physical shape or broadcastable, or a scalar)."""
        other = self.scalar(b, len(a.shape)) if isinstance(b, (int, float)) else b
        return self.node(op, [a.name, other], a.qnn_shape, nhwc=a.nhwc, logical=a.shape)

    def unary(self, op: str, a: Val) -> Val:
        return self.node(op, [a.name], a.qnn_shape, nhwc=a.nhwc, logical=a.shape)

    def static(self, data: np.ndarray, prefix: str = "const") -> str:
        name = self.fresh(prefix)
        self.g.add_static(name, np.ascontiguousarray(data))
        return name

    def input(self, shape: tuple[int, ...], name: str) -> Val:
        self.g.add_input(name, shape, np.float32)
        self._shapes[name] = tuple(shape)
        return Val(name, shape)

    # -- values ---------------------------------------------------------------------------------------------
    def value(self, node: Any) -> Val:
        """The tensor a node produced (a constant becomes a static tensor in its logical layout)."""
        v = self.values.get(node) if isinstance(node, torch.fx.Node) else None
        if isinstance(v, Deq):
            if self.qmode is not None:
                return v.q
            key = (v.q.name, "float")
            if key not in self._layout_cache:
                self._layout_cache[key] = self.node("Dequantize", [v.q.name], v.q.qnn_shape, nhwc=v.q.nhwc,
                                                    logical=v.q.shape, like=Val("", (), dtype=np.float32))
            return self._layout_cache[key]
        if isinstance(v, QConst) and v.axis is None and self.qmode is not None:
            from edgeport_qnn.sdk import QuantParams

            name = self.fresh("qconst")
            quant = QuantParams(v.scales[0], v.zero_points[0])
            self.g.add_static(name, np.ascontiguousarray(v.raw), quant)
            return Val(name, tuple(v.raw.shape), dtype=v.raw.dtype.type, quant=quant)
        if isinstance(v, Const):
            return Val(self.static(v.data.astype(np.float32)), tuple(v.data.shape))
        if not isinstance(v, Val):
            raise LoweringError(f"expected a lowered tensor, got {getattr(node, 'name', node)!r}")
        return v

    def const(self, node: Any) -> np.ndarray | None:
        v = self.values.get(node) if isinstance(node, torch.fx.Node) else None
        return v.data if isinstance(v, Const) else None

    def nchw(self, v: Val) -> Val:
        if not v.nhwc:
            return v
        key = (v.name, False)
        if key not in self._layout_cache:
            self._layout_cache[key] = self.node("Transpose", [v.name], v.shape,
                                                {"perm": np.array(NHWC_TO_NCHW, np.uint32)}, like=v)
        return self._layout_cache[key]

    def nhwc(self, v: Val) -> Val:
        if v.nhwc:
            return v
        if len(v.shape) != 4:
            raise LoweringError(f"an NHWC operand must be 4-D, got shape {list(v.shape)}")
        key = (v.name, True)
        if key not in self._layout_cache:
            out = tuple(v.shape[i] for i in NCHW_TO_NHWC)
            self._layout_cache[key] = self.node("Transpose", [v.name], out,
                                                {"perm": np.array(NCHW_TO_NHWC, np.uint32)}, nhwc=True, like=v)
        return self._layout_cache[key]

    # -- driver ---------------------------------------------------------------------------------------------
    def lower(self, node: torch.fx.Node) -> None:
        if node.target is operator.getitem:
            src = self.values.get(node.args[0])
            if not isinstance(src, tuple) or src[node.args[1]] is None:
                raise LoweringError(f"{node.name}: output {node.args[1]} of {node.args[0].name} is not lowered")
            self.values[node] = src[node.args[1]]
            return
        name = op_name(node.target)
        qmode = self._quantized_output(node, name)
        if qmode is not None:
            self.qmode = qmode
            try:
                self.values[node] = self.quant_lowerings.get(name, self.lowerings[name])(self, node)
            finally:
                self.qmode = None
            return
        fn = self.lowerings.get(name)
        if fn is None:
            raise LoweringError(f"{node.name}: {name} has no QNN lowering; the partitioner should not have "
                                "delegated it (report this as a bug)")
        self.values[node] = fn(self, node)

    def _quantized_output(self, node: torch.fx.Node, name: str) -> tuple[Any, Any] | None:
        """(dtype, QuantParams) when ``node`` runs quantized: it has a quantized form, every tensor it reads is a
        delegated dequantize or a quantized result (or a quantized weight, or a float bias) and its only user is a
        quantize (or a relu / hardtanh before one: fused, both run with that quantize's parameters)."""
        from edgeport_qnn.preprocess.ops.quant import (
            QUANT_OPS,
            quant_of,
            quantizing_user,
        )

        if name not in QUANT_OPS:
            return None
        user = quantizing_user(node)
        if user is None:
            return None
        positions = {"aten.convolution.default": (1, 2), "aten.linear.default": (1, 2),
                     "aten.native_layer_norm.default": (2, 3)}.get(name, ())
        weights = {node.args[i] for i in positions if len(node.args) > i}
        tensors = node.all_input_nodes
        first = self.values.get(tensors[0]) if tensors else None
        if not (isinstance(first, Deq) or (isinstance(first, Val) and first.quant is not None)):
            return None
        for a in tensors:
            v = self.values.get(a)
            quantized_input = (isinstance(v, Deq) or (isinstance(v, Val) and v.quant is not None)
                               or (isinstance(v, QConst) and v.axis is None))
            if not (quantized_input or (a in weights and isinstance(v, Const))):
                return None  # a float operand: run in float
        return quant_of(user)

    def output(self, node: Any, index: int) -> None:
        self.output_value(self.value(node), index)

    def output_value(self, v: Val, index: int) -> None:
        v = self.nchw(v)
        if v.quant is not None:
            raise LoweringError("a partition output is a quantized tensor (the partitioner keeps quantize nodes "
                                "and their dequantizes together; report this as a bug)")
        name = f"output_{index}"
        self.g.add_output(name, v.shape, np.float32)
        self.g.add_node("Reshape", f"copy_{name}", [v.name], [name])
