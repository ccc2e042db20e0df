"""Validation and planning of a ``VkGraph`` (torch-free, no GPU): every operator becomes shader dispatches.

:func:`plan_graph` checks the whole graph -- value kinds, tensor ids, dims, constant ranges, that each tensor is
written exactly once before it is read, operator names, argument kinds and every shape -- and returns a
:class:`Plan` naming buffers by tensor id. Nothing here touches the device; the executor allocates and records
the plan only once it is known to be valid. Every problem is a ``ProgramError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from edgeport.errors import ProgramError

from ._plan_compute import COMPUTE_HANDLERS
from ._plan_context import FLOAT, Dispatch, Plan, PlanContext
from ._plan_typed import TYPED_HANDLERS
from ._plan_views import VIEW_HANDLERS
from .schema import NAMED_DATA_OFFSET, VkDataType, VkGraph, VkTensor

__all__ = ["Dispatch", "HANDLERS", "Plan", "plan_graph"]

HANDLERS: dict[str, Callable[[PlanContext, list[int]], None]] = {**COMPUTE_HANDLERS, **VIEW_HANDLERS,
                                                                 **TYPED_HANDLERS}
#: shaders that store every element as a 32-bit word (int32 / bool tensors, or ``ewise`` / ``gather`` of floats)
WORD_SHADERS = frozenset({"ewise", "gather", "scan", "copy_i32", "permute_i32", "fill_i32"})
_CONSTANT_FORMATS = {VkDataType.FLOAT16: "<f2", VkDataType.FLOAT32: "<f4", VkDataType.INT32: "<i4",
                     VkDataType.BOOL: "u1"}


def plan_graph(graph: VkGraph, constant_bytes: memoryview, named_data: Callable[[str], memoryview] | None,
               where: str = "VulkanBackend") -> Plan:
    """Validates ``graph`` completely and plans its dispatches (see the module docstring)."""
    if not isinstance(graph.values, list) or not isinstance(graph.chain, list):
        raise ProgramError(f"{where}: graph has no values or chain")
    unknown = sorted({op.name for op in graph.chain if op.name not in HANDLERS})
    if unknown:
        raise ProgramError(f"{where}: operators this executor's shader library does not implement: "
                           f"{', '.join(repr(u) for u in unknown)}")
    if graph.shaders:
        raise ProgramError(f"{where}: the graph carries {len(graph.shaders)} custom shaders, which are not supported")
    ctx = PlanContext(graph, lambda *_: np.zeros(0), where)
    # constants
    for vid, v in enumerate(graph.values):
        t = v.value
        if isinstance(t, VkTensor) and t.constant_id >= 0:
            dims, kind = ctx.typed_dims(vid, t)
            if t.constant_id >= len(graph.constants):
                raise ProgramError(f"{where}: tensor {vid} names constant {t.constant_id} of "
                                   f"{len(graph.constants)}")
            c = graph.constants[t.constant_id]
            fmt = np.dtype(_CONSTANT_FORMATS[VkDataType(t.datatype)])
            itemsize = fmt.itemsize  # as ExecuTorch writes them: bools one byte each
            nbytes = math.prod(dims) * itemsize
            if c.length != nbytes:
                raise ProgramError(f"{where}: constant {t.constant_id} has {c.length} bytes, tensor {vid} "
                                   f"{list(dims)} needs {nbytes}")
            if c.offset == NAMED_DATA_OFFSET:
                if named_data is None:
                    raise ProgramError(f"{where}: constant {t.constant_id} is named data {c.named_key!r}, but the "
                                       "runtime gave no named-data lookup")
                try:
                    raw = memoryview(named_data(c.named_key)).cast("B")
                except (KeyError, ProgramError, ValueError) as exc:
                    raise ProgramError(f"{where}: named data {c.named_key!r} of constant {t.constant_id} is not in "
                                       f"the program ({exc})") from None
                if len(raw) < nbytes:
                    raise ProgramError(f"{where}: named data {c.named_key!r} has {len(raw)} bytes, needs {nbytes}")
                raw = raw[:nbytes]
            else:
                if c.offset + c.length > len(constant_bytes):
                    raise ProgramError(f"{where}: constant {t.constant_id} [{c.offset}, {c.offset + c.length}) "
                                       f"exceeds the {len(constant_bytes)}-byte data section")
                raw = constant_bytes[c.offset:c.offset + c.length]
            ctx.plan.constants[vid] = np.frombuffer(bytes(raw), dtype=fmt).astype(
                np.float32 if kind == FLOAT else np.int32)
            ctx.plan.dims[vid] = dims
            ctx.plan.storage[vid] = vid
            ctx.defined.add(vid)
    # inputs
    for vid in graph.input_ids:
        t = ctx.tensor_decl(vid)
        if t.constant_id >= 0 or vid in ctx.defined:
            raise ProgramError(f"{where}: input {vid} is a constant or listed twice")
        ctx.plan.dims[vid] = ctx.typed_dims(vid, t)[0]
        ctx.plan.storage[vid] = vid
        ctx.defined.add(vid)
        ctx.plan.inputs.append(vid)
    # operators
    for op in graph.chain:
        ctx.op = op.name
        ctx.node_id = int(op.node_id or 0)
        args = list(op.args)
        if not args:
            raise ctx.fail("no arguments")
        for a in args:
            ctx.value(a)
        HANDLERS[op.name](ctx, args)
        ctx.plan.op_counts[op.name] = ctx.plan.op_counts.get(op.name, 0) + 1
    ctx.op = ""
    if not graph.output_ids:
        raise ProgramError(f"{where}: the graph has no outputs")
    for vid in graph.output_ids:
        ctx.tensor_decl(vid)
        if vid in ctx.unused:
            raise ProgramError(f"{where}: output {vid} is an auxiliary result (indices / mean / rstd) the shaders "
                               "do not compute")
        if vid not in ctx.defined:
            raise ProgramError(f"{where}: output {vid} is never written")
        if vid in graph.input_ids or vid in ctx.plan.constants:
            raise ProgramError(f"{where}: output {vid} is a graph input or a constant, not a computed tensor")
        ctx.plan.outputs.append(vid)
    for d in ctx.plan.dispatches:
        for vid in d.tensors:
            if vid in ctx.unused:
                raise ProgramError(f"{where}: tensor {vid} (indices / mean / rstd) is read but never computed")
    if not ctx.plan.dispatches and not ctx.plan.outputs:
        raise ProgramError(f"{where}: empty graph")
    ctx.plan.fp16 = ctx.float_type == VkDataType.FLOAT16
    if ctx.plan.fp16:
        words = sorted({d.shader for d in ctx.plan.dispatches if d.shader in WORD_SHADERS})
        if ctx.plan.kinds or words:
            raise ProgramError(f"{where}: a FLOAT16 (force_fp16) graph computes float tensors only; this one has "
                               f"{'int32 / bool tensors' if ctx.plan.kinds else 'word-storage shaders ' + str(words)}")
    return ctx.plan
