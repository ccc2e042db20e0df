"""``preprocess`` of ``VulkanBackend``: one edge sub-program -> a ``VH00`` blob (``VkGraph`` + constant bytes).

Operators are written as ExecuTorch's Vulkan delegate writes them: the overload name (``"aten.linear.default"``)
and the value ids of *every* schema argument in order (defaults filled in; ``None`` as a ``Null`` value),
followed by the id of the output tensor (a ``ValueList`` of tensors for multi-output ops). Constants (weights)
go to the blob's data section, 16-byte aligned. Integer tensors are declared INT32 (``int64`` downcast, as
ExecuTorch does: constants are range-checked and written as int32), bool tensors BOOL (constants one byte each).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram

from edgeport.aot.capability_partitioner import op_name
from edgeport.aot.graph_utils import placeholder_tensor
from edgeport.backend import CompileSpec, PreprocessResult
from edgeport.errors import LoweringError
from edgeport_vulkan.options import VulkanCompileOptions
from edgeport_vulkan.schema import (
    Bool,
    BoolList,
    Double,
    DoubleList,
    Int,
    IntList,
    Null,
    OperatorCall,
    String,
    ValueList,
    VkBytes,
    VkDataType,
    VkGraph,
    VkTensor,
    VkValue,
    serialize_blob,
)

__all__ = ["build_vk_graph", "preprocess"]


_WORD_DTYPES = (torch.int64, torch.int32, torch.bool)  # int32 words on the device


def _fake(node: Any) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"{node.name}: no tensor metadata (meta['val'])")
    return val


def _dims(t: torch.Tensor, where: str) -> list[int]:
    if any(not isinstance(d, int) for d in t.shape):
        raise LoweringError(f"{where}: dynamic shape {tuple(t.shape)}; VulkanBackend graphs are static")
    return [int(d) for d in t.shape]


class _Builder:
    def __init__(self, fp16: bool = False) -> None:
        self.fp16 = fp16
        self.graph = VkGraph(version="0")
        self.data = bytearray()
        self.ids: dict[torch.fx.Node, int] = {}

    def add(self, value: Any) -> int:
        self.graph.values.append(VkValue(value))
        return len(self.graph.values) - 1

    def tensor(self, t: torch.Tensor, where: str, constant: np.ndarray | None = None) -> int:
        if t.dtype in _WORD_DTYPES:
            return self._word_tensor(t, where, constant)
        if t.dtype != torch.float32:
            raise LoweringError(f"{where}: dtype {t.dtype}; VulkanBackend takes float32, int32 / int64 and bool "
                                "tensors")
        cid = -1
        storage = VkDataType.FLOAT16 if self.fp16 else VkDataType.FLOAT32
        if constant is not None:
            arr = np.ascontiguousarray(constant, dtype=np.float32)
            if self.fp16:
                with np.errstate(over="ignore"):
                    arr = arr.astype("<f2")
            raw = arr.tobytes()
            cid = len(self.graph.constants)
            self.graph.constants.append(VkBytes(offset=len(self.data), length=len(raw)))
            self.data += raw + b"\x00" * (-len(raw) % 16)
        # as ExecuTorch writes them: force_fp16 makes every float tensor FLOAT16 (weights stored as fp16); graph
        # inputs and outputs still stage as FLOAT32
        return self.add(VkTensor(datatype=storage, dims=_dims(t, where), constant_id=cid, mem_obj_id=-1,
                                 staging_datatype=storage if constant is not None else VkDataType.FLOAT32))

    def _word_tensor(self, t: torch.Tensor, where: str, constant: np.ndarray | None) -> int:
        if self.fp16:
            raise LoweringError(f"{where}: {t.dtype} tensor in a force_fp16 graph (float tensors only)")
        datatype = VkDataType.BOOL if t.dtype == torch.bool else VkDataType.INT32
        cid = -1
        if constant is not None:
            if datatype == VkDataType.BOOL:
                raw = np.ascontiguousarray(constant, dtype=np.bool_).tobytes()
            else:
                arr = np.asarray(constant)
                if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
                    raise LoweringError(f"{where}: constant values outside int32, which the Vulkan delegate "
                                        "computes integers in")
                raw = np.ascontiguousarray(arr, dtype="<i4").tobytes()
            cid = len(self.graph.constants)
            self.graph.constants.append(VkBytes(offset=len(self.data), length=len(raw)))
            self.data += raw + b"\x00" * (-len(raw) % 16)
        return self.add(VkTensor(datatype=datatype, dims=_dims(t, where), constant_id=cid, mem_obj_id=-1,
                                 staging_datatype=datatype))

    def scalar_arg(self, v: Any, where: str) -> int:
        if v is None:
            return self.add(Null())
        if isinstance(v, torch.fx.Node):
            if v not in self.ids:
                raise LoweringError(f"{where}: argument {v.name} was not lowered")
            return self.ids[v]
        if isinstance(v, bool):
            return self.add(Bool(v))
        if isinstance(v, int):
            return self.add(Int(v))
        if isinstance(v, float):
            return self.add(Double(v))
        if isinstance(v, str):
            return self.add(String(v))
        if isinstance(v, torch.dtype | torch.memory_format | torch.layout | torch.device):
            return self.add(Null())  # tensor options: the executor works in float32 contiguous buffers
        if isinstance(v, (list, tuple)):
            if not v:
                return self.add(IntList([]))
            if all(isinstance(x, torch.fx.Node) or x is None for x in v):  # tensors, or optional tensors
                return self.add(ValueList([self.scalar_arg(x, where) for x in v]))
            if all(isinstance(x, bool) for x in v):
                return self.add(BoolList([bool(x) for x in v]))
            if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                return self.add(IntList([int(x) for x in v]))
            if all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
                return self.add(DoubleList([float(x) for x in v]))
        raise LoweringError(f"{where}: cannot encode argument {v!r} ({type(v).__name__})")


def _schema(target: Any) -> Any:
    for obj in (target, getattr(target, "_op", None)):
        schema = getattr(obj, "_schema", None)
        if schema is not None:
            return schema
    raise LoweringError(f"{target}: no operator schema")


def build_vk_graph(ep: ExportedProgram, fp16: bool = False,
                   debug_handles: dict[int, tuple[int, ...]] | None = None) -> tuple[VkGraph, bytes]:
    """The ``VkGraph`` of one partition and its constant bytes (``fp16``: FLOAT16 tensors, as ``force_fp16``).
    ``debug_handles`` (filled when given): each operator call's ``node_id`` -> its edge node's debug handle."""
    b = _Builder(fp16)
    outputs: list[int] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            tensor = placeholder_tensor(ep, node)
            if tensor is not None:
                if tensor.is_floating_point():
                    const = tensor.detach().to(torch.float32).contiguous().numpy()
                elif tensor.dtype in _WORD_DTYPES:
                    const = tensor.detach().contiguous().numpy()
                else:
                    raise LoweringError(f"constant {node.name} is {tensor.dtype}; VulkanBackend takes float32, int "
                                        "and bool constants")
                b.ids[node] = b.tensor(tensor, node.name, const)
            else:
                b.ids[node] = b.tensor(_fake(node), node.name)
                b.graph.input_ids.append(b.ids[node])
        elif node.op == "call_function" and node.target is operator.getitem:
            src = b.graph.values[b.ids[node.args[0]]].value
            if not isinstance(src, ValueList) or not 0 <= node.args[1] < len(src.items):
                raise LoweringError(f"{node.name}: getitem of {node.args[0].name} is not a tensor of its outputs")
            b.ids[node] = src.items[node.args[1]]
        elif node.op == "call_function":
            name = op_name(node.target)
            schema = _schema(node.target)
            args = []
            for i, a in enumerate(schema.arguments):
                if i < len(node.args):
                    v = node.args[i]
                elif a.name in node.kwargs:
                    v = node.kwargs[a.name]
                elif a.has_default_value():
                    v = a.default_value
                else:
                    raise LoweringError(f"{node.name} ({name}): missing argument {a.name}")
                args.append(b.scalar_arg(v, f"{node.name} ({name}) argument {a.name}"))
            val = node.meta.get("val")
            if isinstance(val, (tuple, list)):
                outs = []
                for i, t in enumerate(val):
                    if t.dtype != torch.float32 and (b.fp16 or t.dtype not in _WORD_DTYPES):
                        # e.g. max_pool2d's indices: declared, never computed
                        outs.append(b.add(VkTensor(datatype=VkDataType.INT32 if t.dtype in (torch.int64, torch.int32)
                                                   else VkDataType.UNSET, dims=_dims(t, node.name),
                                                   constant_id=-1, mem_obj_id=-1)))
                    else:
                        outs.append(b.tensor(t, f"{node.name} output {i}"))
                b.ids[node] = b.add(ValueList(outs))
            else:
                b.ids[node] = b.tensor(_fake(node), node.name)
            args.append(b.ids[node])
            handle = node.meta.get("debug_handle")
            if debug_handles is not None and isinstance(handle, int):
                debug_handles[len(b.graph.chain)] = (handle,)
            b.graph.chain.append(OperatorCall(node_id=len(b.graph.chain), name=name, args=args))
        elif node.op == "output":
            for out in node.args[0]:
                if not isinstance(out, torch.fx.Node) or out not in b.ids:
                    raise LoweringError(f"partition output {out!r} is not a lowered tensor")
                if out.op == "placeholder":
                    raise LoweringError(f"partition output {out.name} is an input or constant, not computed")
                outputs.append(b.ids[out])
    b.graph.output_ids = outputs
    return b.graph, bytes(b.data)


def preprocess(edge_program: ExportedProgram, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
    options = VulkanCompileOptions.from_compile_specs(compile_specs)
    handles: dict[int, tuple[int, ...]] = {}
    graph, data = build_vk_graph(edge_program, fp16=options.force_fp16, debug_handles=handles)
    # ExecuTorch's delegate map: an operator call's node_id (the id its timing events carry) -> edge node
    return PreprocessResult(processed_bytes=serialize_blob(graph, data), debug_handle_map=handles or None)
