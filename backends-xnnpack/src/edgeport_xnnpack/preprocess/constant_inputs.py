"""Static operands XNNPACK does not pack become delegate inputs backed by program constants, as ExecuTorch does.

XNNPACK copies (packs) the filter and bias of a fully connected, convolution or transposed convolution when a
runtime is created; every other static operand -- the constant of a multiply or a division, a layer norm's weight,
a class token concatenated to the patches, a position embedding -- is read through the pointer given at define
time, on every call. ExecuTorch 1.3.1 frees a delegate's named data after ``init`` when it loads a program from a
file, so such a pointer dangles there (NaN or an error; from bytes, and on ExecuTorch 1.5.1 and edgeport's runtime,
the data happens to stay alive). ExecuTorch's partitioner leaves those operands outside the delegate: they reach
it as call arguments read from the program's constant tensors, which every runtime keeps for the program's life.

:func:`externalize_unpacked` does the same on a lowered graph: each such static float32 value becomes an external
input after the partition's own arguments (the outputs' external ids move up), and its tensor is returned for
``PreprocessResult.constant_inputs``. A value that is also a packed weight keeps its static copy for those uses.
Quantized static values are left as they are (an int8 delegate input would need its quantization parameters on
the program's tensor; none of the lowerings emits one outside a packed weight).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from edgeport_xnnpack.schema.graph import CAT_INPUTS, INPUT_FIELDS, Graph, TensorValue, node_layout

#: node kind -> the fields whose static value XNNPACK packs when it creates a runtime
PACKED_FIELDS = {
    "XNNFullyConnected": ("filter_id", "bias_id"),
    "XNNConv2d": ("filter_id", "bias_id"),
    "XNNDepthwiseConv2d": ("filter_id", "bias_id"),
    "XNNConvTranspose2d": ("filter_id", "bias_id"),
}
_FP32 = 1
_EXTERNAL_INPUT = 1


def _input_fields(kind: str) -> list[str]:
    if kind in CAT_INPUTS:
        return [f"input{i + 1}_id" for i in range(CAT_INPUTS[kind])]
    return [f for f, _ in node_layout(kind) if f in INPUT_FIELDS]


def _tensor(graph: Graph, data: bytes | bytearray | memoryview, v: TensorValue) -> torch.Tensor:
    entry = graph.constant_data[v.constant_buffer_idx]
    nbytes = math.prod(v.dims) * 4
    if entry.named_key is not None or entry.size < nbytes or entry.offset + nbytes > len(data):
        raise ValueError(f"static value {v.id_out}: constant_data[{v.constant_buffer_idx}] does not hold its "
                         f"{nbytes} bytes")
    array = np.frombuffer(data, dtype=np.float32, count=math.prod(v.dims), offset=entry.offset)
    return torch.from_numpy(array.reshape(v.dims).copy())


def externalize_unpacked(graph: Graph, data: bytes | bytearray | memoryview) -> list[torch.Tensor]:
    """Turn the static float32 operands XNNPACK keeps pointers to into external inputs; their tensors, in the
    order of the new arguments. ``graph`` is rewritten in place; ``data`` is its constant data region."""
    values = {v.id_out: v for v in graph.values}
    uses: dict[int, list[tuple[int, str]]] = {}
    for n, node in enumerate(graph.nodes):
        for f in _input_fields(node.kind):
            vid = node.get(f)
            v = values.get(vid)
            if v is not None and v.constant_buffer_idx:
                uses.setdefault(vid, []).append((n, f))
    view = memoryview(data).cast("B")
    num_args = graph.num_externs - len(graph.output_ids)
    tensors: list[torch.Tensor] = []
    by_content: dict[tuple[tuple[int, ...], bytes], int] = {}  # equal operands (each layer's epsilon): one argument
    for vid, where in uses.items():
        v = values[vid]
        unpacked = [(n, f) for n, f in where if f not in PACKED_FIELDS.get(graph.nodes[n].kind, ())]
        if not unpacked or v.datatype != _FP32 or v.quant is not None:
            continue
        tensor = _tensor(graph, view, v)
        key = (tuple(v.dims), tensor.numpy().tobytes())
        if key in by_content:
            for n, f in unpacked:
                graph.nodes[n].fields[f] = by_content[key]
            if len(unpacked) == len(where):  # nothing reads it any more: an unused internal value
                v.constant_buffer_idx = 0
            continue
        tensors.append(tensor)
        ext = num_args + len(tensors) - 1
        by_content[key] = vid if len(unpacked) == len(where) else len(graph.values)
        if len(unpacked) == len(where):  # no packed use: the value itself becomes the argument
            v.constant_buffer_idx, v.flags, v.external_id = 0, _EXTERNAL_INPUT, ext
            graph.input_ids.append(vid)
            continue
        new_id = len(graph.values)
        graph.values.append(TensorValue(_FP32, list(v.dims), new_id, external_id=ext, flags=_EXTERNAL_INPUT))
        values[new_id] = graph.values[-1]
        graph.input_ids.append(new_id)
        for n, f in unpacked:
            graph.nodes[n].fields[f] = new_id
    if not tensors:
        return tensors
    for vid in graph.output_ids:
        values[vid].external_id += len(tensors)
    graph.num_externs += len(tensors)
    _drop_unused_constant_data(graph)
    return tensors


def _drop_unused_constant_data(graph: Graph) -> None:
    """Remove the constant data entries no value (nor per-channel scale) refers to any more; renumber the rest."""
    used = {0} | {v.constant_buffer_idx for v in graph.values}
    used |= {getattr(v.quant, "scale_buffer_idx", 0) or 0 for v in graph.values}
    new_index = {old: new for new, old in enumerate(sorted(used))}
    graph.constant_data = [graph.constant_data[old] for old in sorted(used)]
    for v in graph.values:
        v.constant_buffer_idx = new_index[v.constant_buffer_idx]
        if getattr(v.quant, "scale_buffer_idx", 0):
            v.quant = replace(v.quant, scale_buffer_idx=new_index[v.quant.scale_buffer_idx])
