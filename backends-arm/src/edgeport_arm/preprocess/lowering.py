"""Walks one partition's graph and emits its TOSA graph (:class:`Lowering`).

Integer graphs (``TOSA-1.0+INT``) come from torchao's pt2e flow: ``dequantize`` nodes cost nothing (the int8
tensor gets its quantization parameters), each compute op emits integer TOSA operators producing an int8 value
or an int32 accumulator, and the ``quantize`` after it becomes one RESCALE (plus a CLAMP for a fused
activation). Float graphs (``TOSA-1.0+FP``) map op for op. 4-D tensors go to NHWC when an operator needs it and
stay there; transposes back to NCHW are emitted only where an NCHW consumer or a graph output needs them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import op_name
from edgeport.aot.graph_utils import placeholder_tensor
from edgeport.errors import LoweringError
from edgeport_arm.options import TosaSpecification
from edgeport_arm.preprocess.constants import evaluate
from edgeport_arm.preprocess.graph import DType, TosaGraph
from edgeport_arm.preprocess.values import NCHW_TO_NHWC, NHWC_TO_NCHW, Const, QParams, Value

Lowered = Value | Const | tuple[Value | Const | None, ...]
LoweringFn = Callable[["Lowering", torch.fx.Node], Lowered]

_TORCH_TO_TOSA = {torch.int8: DType.INT8, torch.int32: DType.INT32, torch.float32: DType.FP32,
                  torch.int16: DType.INT16, torch.bool: DType.BOOL}
INT8_MIN, INT8_MAX = -128, 127


def fake(node: Any) -> torch.Tensor:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        val = val[0]
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"{node.name}: no tensor metadata (meta['val'])")
    return val


def static_shape(node: Any) -> tuple[int, ...]:
    shape = fake(node).shape
    if any(not isinstance(d, int) for d in shape):
        raise LoweringError(f"{node.name}: dynamic shape {tuple(shape)}; TOSA graphs for Ethos-U are static")
    return tuple(int(d) for d in shape)


class Lowering:
    """State of one partition's lowering; op lowerings call its helpers."""

    def __init__(self, ep: ExportedProgram, spec: TosaSpecification, lowerings: dict[str, LoweringFn]) -> None:
        self.ep = ep
        self.spec = spec
        self.integer = spec.is_int and not spec.is_fp
        self.int16 = self.integer and "int16" in spec.extensions
        self.g = TosaGraph(spec.major, spec.minor)
        self.lowerings = lowerings
        self.values: dict[torch.fx.Node, Lowered] = {}
        self._layout_cache: dict[tuple[str, bool], Value] = {}
        self.input_names: list[str] = []

    # -- driver ---------------------------------------------------------------------------------------------
    def run(self) -> bytes:
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self.values[node] = self._placeholder(node)
            elif node.op == "call_function" and node.target is operator.getitem:
                src = self.values[node.args[0]]
                if not isinstance(src, tuple) or src[node.args[1]] is None:
                    raise LoweringError(f"{node.name}: output {node.args[1]} of {node.args[0].name} is not lowered")
                self.values[node] = src[node.args[1]]
            elif node.op == "call_function":
                folded = None if self.integer else evaluate(node, self.values)
                if folded is not None:  # computed from constants only: a TOSA constant (float graphs)
                    self.values[node] = folded
                    continue
                name = op_name(node.target)
                fn = self.lowerings.get(name)
                if fn is None:
                    raise LoweringError(f"{node.name}: {name} has no TOSA lowering; the partitioner should not "
                                        "have delegated it (report this as a bug)")
                try:
                    self.values[node] = fn(self, node)
                except LoweringError as exc:
                    raise LoweringError(f"{node.name} ({name}): {exc}") from exc
            elif node.op == "output":
                for out in node.args[0]:
                    self._output(out)
        return self.g.serialize()

    def _placeholder(self, node: torch.fx.Node) -> Value | Const:
        tensor = placeholder_tensor(self.ep, node)
        if tensor is not None:
            return Const(tensor.detach().contiguous().numpy().copy())
        val = fake(node)
        dtype = _TORCH_TO_TOSA.get(val.dtype)
        allowed = ((DType.INT8, DType.INT16) if self.int16 else (DType.INT8,)) if self.integer else (DType.FP32,)
        if dtype not in allowed:
            raise LoweringError(f"input {node.name} is {val.dtype}; {self.spec} takes "
                                f"{'int8 (quantized)' if self.integer else 'float32'} inputs")
        shape = static_shape(node)
        # graph inputs get positional names, so that identical partitions give byte-identical TOSA graphs
        name = f"input_{len(self.input_names)}"
        self.input_names.append(node.name)
        return Value(self.g.input(name, shape, dtype), shape, dtype)

    def _output(self, node: torch.fx.Node) -> None:
        v = self.settle(self.value(node))
        v = self.nchw(v)
        if self.integer and v.dtype not in ((DType.INT8, DType.INT16) if self.int16 else (DType.INT8,)):
            raise LoweringError(f"partition output {node.name} is not int8: an integer partition must end in a "
                                "quantize node (quantize the whole model, e.g. with TOSAQuantizer)")
        self.g.output(v.name, v.shape, v.dtype)

    # -- values ---------------------------------------------------------------------------------------------
    def value(self, node: Any) -> Value:
        """The tensor a node produced (constants are materialized as TOSA constants)."""
        if not isinstance(node, torch.fx.Node):
            raise LoweringError(f"expected a tensor argument, got {node!r}")
        v = self.values.get(node)
        if isinstance(v, Const):
            return self.materialize(v)
        if not isinstance(v, Value):
            raise LoweringError(f"{node.name} has no lowered tensor")
        return v

    def const(self, node: Any) -> Const | None:
        return self.values.get(node) if isinstance(node, torch.fx.Node) and isinstance(
            self.values.get(node), Const) else None

    def materialize(self, c: Const) -> Value:
        if self.integer:
            if not c.quantized or c.axis is not None:
                raise LoweringError("a float or per-channel constant cannot be an operand of an integer graph")
            data = c.data.astype(np.int8)
            q = QParams(float(np.asarray(c.scales).reshape(-1)[0]), int(np.asarray(c.zero_points).reshape(-1)[0]))
            return Value(self.g.const(data, DType.INT8, "constant"), data.shape, DType.INT8, q=q)
        data = c.real()
        return Value(self.g.const(data, DType.FP32, "constant"), data.shape, DType.FP32)

    # -- layout ---------------------------------------------------------------------------------------------
    def nchw(self, v: Value) -> Value:
        if not v.nhwc:
            return v
        key = (v.name, False)
        if key not in self._layout_cache:
            name = self.g.transpose(v.name, v.shape, NHWC_TO_NCHW, v.dtype)
            self._layout_cache[key] = v.with_(name=name, shape=v.logical_shape, nhwc=False)
        return self._layout_cache[key]

    def nhwc(self, v: Value) -> Value:
        if v.nhwc:
            return v
        if len(v.shape) != 4:
            raise LoweringError(f"NHWC layout needs a 4-D tensor, got shape {v.shape}")
        key = (v.name, True)
        if key not in self._layout_cache:
            name = self.g.transpose(v.name, v.shape, NCHW_TO_NHWC, v.dtype)
            self._layout_cache[key] = v.with_(name=name, shape=tuple(v.shape[i] for i in NCHW_TO_NHWC), nhwc=True)
        return self._layout_cache[key]

    # -- integer arithmetic -----------------------------------------------------------------------------------
    def to_int32(self, v: Value) -> Value:
        """An int8 value as int32 with its zero point removed (real = v * scale)."""
        v = self.settle(v)
        if v.dtype == DType.INT32:
            return v
        if v.q is None:
            raise LoweringError(f"{v.dtype} tensor {v.name} has no quantization parameters (no dequantize before it)")
        name = self.g.rescale(v.name, v.shape, v.dtype, DType.INT32, [1.0], in_zp=v.q.zero_point)
        return v.with_(name=name, dtype=DType.INT32, q=None, acc_scale=np.asarray(v.q.scale, np.float64))

    def requantize(self, v: Value, q: QParams, qmin: int | None = None, qmax: int | None = None) -> Value:
        """``v`` as int8 (int16 when ``q.bits == 16``) with parameters ``q``, its pending activation bounds
        applied."""
        out_dtype = DType.INT16 if q.bits == 16 else DType.INT8
        if q.bits == 16 and not self.int16:
            raise LoweringError(f"int16 quantization needs the int16 extension ({self.spec} has none)")
        if v.q is None and v.dtype in (DType.INT32, DType.INT48):
            if v.acc_scale is None:
                raise LoweringError(f"{v.dtype} tensor {v.name} has no accumulator scale")
            scales = np.broadcast_to(np.asarray(v.acc_scale, np.float64), (v.shape[-1],)) \
                if np.ndim(v.acc_scale) else [float(v.acc_scale)]
            ratio = [s / q.scale for s in scales]
            name = self.g.rescale(v.name, v.shape, v.dtype, out_dtype, ratio, out_zp=q.zero_point)
        elif v.dtype in (DType.INT8, DType.INT16) and v.q is not None:
            if v.q == q:
                name = v.name
            else:
                name = self.g.rescale(v.name, v.shape, v.dtype, out_dtype, [v.q.scale / q.scale],
                                      in_zp=v.q.zero_point, out_zp=q.zero_point)
        else:
            raise LoweringError(f"cannot requantize {v.name} ({v.dtype}) without its quantization parameters")
        full_lo, full_hi = q.range
        lo = full_lo if qmin is None else max(full_lo, qmin)
        hi = full_hi if qmax is None else min(full_hi, qmax)
        if v.bounds is not None:
            if v.bounds[0] is not None:
                lo = max(lo, int(np.clip(round(v.bounds[0] / q.scale) + q.zero_point, full_lo, full_hi)))
            if v.bounds[1] is not None:
                hi = min(hi, int(np.clip(round(v.bounds[1] / q.scale) + q.zero_point, full_lo, full_hi)))
        if lo > full_lo or hi < full_hi:
            name = self.g.clamp(name, v.shape, out_dtype, lo, hi)
        return v.with_(name=name, dtype=out_dtype, q=q, acc_scale=None, bounds=None)

    def settle(self, v: Value) -> Value:
        """Apply a pending activation of an int8 value (at its own quantization parameters)."""
        if v.bounds is None:
            return v
        if v.dtype in (DType.INT8, DType.INT16) and v.q is not None:
            return self.requantize(v, v.q)
        raise LoweringError(f"activation on int32 tensor {v.name} is not followed by a quantize node")

    def same_q(self, values: Sequence[Value], q: QParams) -> list[Value]:
        return [self.requantize(self.settle(v), q) for v in values]
