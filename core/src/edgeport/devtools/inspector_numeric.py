"""``Inspector.calculate_numeric_gap``: the runtime's intermediate outputs against the edge program run eagerly.

The reference runs the ETRecord's edge program (the graph the partitioners saw, debug handles on its nodes) node
by node in torch and keeps every node's output by handle. A kernel instruction is compared with the output of
its node; a delegate call with the outputs of its partition: the partition's nodes (its handles) whose values
are used outside it, in graph order, one per delegate output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_EPS = 1e-30


def _as_numpy(value: Any) -> list[np.ndarray]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value.detach().cpu().numpy()]
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _as_numpy(v)]
    return []


def _distance(kind: str, ref: np.ndarray, got: np.ndarray) -> float:
    ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
    diff = got64 - ref64
    if kind == "MSE":
        return float(np.mean(diff * diff)) if diff.size else 0.0
    if kind == "L1":
        return float(np.sum(np.abs(diff)))
    signal = float(np.mean(ref64 * ref64)) if ref64.size else 0.0
    noise = float(np.mean(diff * diff)) if diff.size else 0.0
    return float("inf") if noise == 0.0 else 10.0 * np.log10(max(signal, _EPS) / noise)


def _reference_outputs(program: Any, inputs: Sequence[Any]) -> tuple[dict[int, Any], dict[int, Any]]:
    """Run ``program`` (an ExportedProgram) on ``inputs``: each node's output and the node, by debug handle."""
    import torch
    from torch.export.graph_signature import InputKind

    user = [torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x for x in inputs]
    args: list[Any] = []
    it = iter(user)
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(it))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            args.append(program.state_dict[spec.target] if spec.target in program.state_dict
                        else program.constants[spec.target])
        else:
            args.append(program.constants[spec.target])
    outputs: dict[int, Any] = {}
    nodes: dict[int, Any] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            handle = n.meta.get("debug_handle")
            if n.op == "call_function" and isinstance(handle, int):
                outputs[handle], nodes[handle] = result, n
            return result

    with torch.no_grad():
        Capture(program.graph_module).run(*args)
    return outputs, nodes


def _partition_outputs(handles: Sequence[int], nodes: dict[int, Any]) -> list[int]:
    inside = {nodes[h] for h in handles if h in nodes}
    out = []
    for h in handles:
        n = nodes.get(h)
        if n is not None and (not n.users or any(u not in inside for u in n.users)):
            out.append(h)
    order = {n: i for i, n in enumerate(next(iter(inside)).graph.nodes)} if inside else {}
    return sorted(out, key=lambda h: order[nodes[h]])


def numeric_gap(inspector: Any, distance: str, inputs: Sequence[Any] | None) -> list[dict[str, Any]]:
    kind = distance.strip().upper()
    if kind not in ("MSE", "L1", "SNR"):
        raise ValueError(f"distance {distance!r}: use 'MSE', 'L1' or 'SNR'")
    record = inspector._etrecord
    program = record.edge_programs().get("forward")
    if program is None:
        raise ValueError("the ETRecord holds no edge program for 'forward'")
    if inputs is None:
        rep = record._representative_inputs
        if not rep:
            raise ValueError("no inputs: pass inputs=[...] or record the ETRecord from a BundledProgram (its test "
                             "inputs become the representative inputs)")
        inputs = rep[0]
    ref, nodes = _reference_outputs(program, inputs)
    rows = []
    for block in inspector.event_blocks:
        for event in block.events:
            if not event.debug_data or event.is_delegated_op or not event.debug_handles:
                continue
            runtime = [a for a in _as_numpy(event.debug_data[0])]
            handles = list(event.debug_handles)
            chosen = handles if event.name != "DELEGATE_CALL" else _partition_outputs(handles, nodes)
            if event.name != "DELEGATE_CALL":
                chosen = [h for h in chosen if h in ref][-1:]
            aot = [a for h in chosen for a in _as_numpy(ref.get(h))]
            if len(aot) != len(runtime):
                continue  # a value edgeport's graph has no counterpart for (e.g. an in-place out-variant)
            for k, (want, got) in enumerate(zip(aot, runtime, strict=True)):
                if want.shape != got.shape:
                    continue
                rows.append({"event_name": event.name, "instruction_id": event.instruction_id, "output": k,
                             "aot_ops": [nodes[h].name for h in chosen if h in nodes],
                             "runtime_ops": list(event.op_types), "debug_handles": handles,
                             "gap": _distance(kind, want, got), "distance": kind,
                             "max_abs": float(np.max(np.abs(want.astype(np.float64) - got))) if got.size else 0.0})
    return rows
