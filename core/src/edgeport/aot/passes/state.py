"""State in the execution program: buffers a method mutates (KV caches, counters, recurrent state).

``torch.export`` turns ``self.cache.index_copy_(...)`` into a functional op whose result is a ``BUFFER_MUTATION``
output. In the execution program the buffer becomes a planned tensor that lives for the whole method (its initial
value in the program's mutable-data segment, as ExecuTorch writes it), and the new value is written back into it
in place, the way ExecuTorch's emitter does:

* an ``index_put`` of the buffer itself (what a KV-cache write decomposes to) whose other readers all run before it
  becomes ``aten::index_put_`` on the buffer: no copy of the cache at all;
* any other new value (a delegate's output, ``slice_scatter``, ``add`` ...) is copied back with ``aten::copy_`` at
  the end of the method.

Both kernels are in ExecuTorch's portable library and in edgeport's.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from edgeport.errors import UnsupportedOperatorError

_INDEX_PUT_OUT = torch.ops.aten.index_put.out
_INDEX_PUT_INPLACE = torch.ops.aten.index_put_.default
_COPY_INPLACE = torch.ops.aten.copy_.default

__all__ = ["is_inplace", "mutated_buffers", "write_back_mutated_buffers"]


def mutated_buffers(ep: ExportedProgram) -> dict[str, str]:
    """Placeholder name -> fully qualified buffer name, for every buffer ``ep`` mutates."""
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    return {s.arg.name: s.target for s in ep.graph_signature.input_specs
            if s.kind == InputKind.BUFFER and s.target in mutated}


def _check_kinds(ep: ExportedProgram, method: str) -> None:
    for spec in ep.graph_signature.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.BUFFER_MUTATION):
            raise UnsupportedOperatorError(
                f"method {method!r}: output {spec.arg.name!r} is a {spec.kind.name}; edgeport programs keep state "
                "only in buffers (register the tensor with register_buffer and mutate it in place)")


def write_back_mutated_buffers(ep: ExportedProgram, method: str = "forward") -> dict[torch.fx.Node, str]:
    """Write every ``BUFFER_MUTATION`` output of ``ep`` (out-variant form) back into its buffer, in place.

    Returns the mutated buffers' placeholder nodes with their fully qualified names; the memory planner keeps them
    for the whole method and the emitter writes their initial values. The graph's outputs are unchanged (the
    emitter returns only the user outputs).
    """
    _check_kinds(ep, method)
    by_name = mutated_buffers(ep)
    if not by_name:
        return {}
    graph = ep.graph
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    output = next(n for n in reversed(nodes) if n.op == "output")
    results = list(output.args[0])
    state: dict[torch.fx.Node, str] = {}
    for spec, value in zip(ep.graph_signature.output_specs, results):
        if spec.kind != OutputKind.BUFFER_MUTATION:
            continue
        buffer = placeholders[spec.arg.name if spec.arg.name in by_name else _placeholder_of(ep, spec.target)]
        state[buffer] = spec.target
        if not isinstance(value, torch.fx.Node):
            raise UnsupportedOperatorError(f"method {method!r}: buffer {spec.target!r} is set to a constant")
        if value is buffer:
            continue  # written back unchanged
        if _reinplace_index_put(value, buffer, order):
            continue
        with graph.inserting_before(output):
            copy = graph.call_function(_COPY_INPLACE, (buffer, value))
        copy.meta["val"] = buffer.meta.get("val")
        for key in ("debug_handle", "stack_trace", "from_node"):
            if key in value.meta:
                copy.meta[key] = value.meta[key]
    graph.lint()
    ep.graph_module.recompile()
    return state


def _placeholder_of(ep: ExportedProgram, fqn: str) -> str:
    for s in ep.graph_signature.input_specs:
        if s.kind == InputKind.BUFFER and s.target == fqn:
            return s.arg.name
    raise UnsupportedOperatorError(f"buffer {fqn!r} is mutated but is not an input of the program")


def _reinplace_index_put(value: torch.fx.Node, buffer: torch.fx.Node, order: dict[torch.fx.Node, int]) -> bool:
    """``index_put.out(buffer, ..., out=alloc)`` -> ``index_put_(buffer, ...)`` when every other reader of the
    buffer's old value runs before it (so overwriting it in place changes nothing they read)."""
    if value.op != "call_function" or value.target is not _INDEX_PUT_OUT or value.args[0] is not buffer:
        return False
    if any(order[u] > order[value] for u in buffer.users if u is not value):
        return False
    out = value.kwargs.get("out")
    if not isinstance(out, torch.fx.Node) or len(out.users) != 1:
        return False
    accumulate = value.args[3] if len(value.args) > 3 else value.kwargs.get("accumulate", False)
    value.target = _INDEX_PUT_INPLACE
    value.args = (buffer, value.args[1], value.args[2], accumulate)
    value.kwargs = {}
    value.graph.erase_node(out)
    return True


def is_inplace(node: torch.fx.Node) -> bool:
    """An in-place op this pass inserts (its result is its first argument's storage)."""
    return node.op == "call_function" and node.target in (_INDEX_PUT_INPLACE, _COPY_INPLACE)

