"""coremltools' conversion in a worker process (``edgeport.isolation``): a crash of its native parts (the package
and weight writers) ends the worker, not the caller, and comes back as ``WorkerCrashed`` (a ``LoweringError``).

An edge partition does not survive ``torch.export.save``/``load`` as coremltools needs it (debug handles are dropped
and the reloaded graph fails to convert), and coremltools' MIL program does not pickle, so the partition travels as
plain data (:func:`pack`): per node its kind, name, target, arguments (nodes by name), example value (shape,
strides, dtype) and debug handle, with the signature, constants and verifiers; :func:`unpack` rebuilds the
``ExportedProgram`` in the worker with fake example values. Programs with symbolic shapes or non-tensor
constants are not packed (:class:`NotPackable`): they convert in the calling process.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

__all__ = ["NotPackable", "lower_packed", "pack", "unpack"]


class NotPackable(ValueError):
    """The partition holds something :func:`pack` does not carry (it is converted in the calling process)."""


def _value(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        if any(not isinstance(d, int) for d in (*val.shape, *val.stride())):
            raise NotPackable("symbolic shape")
        return ("tensor", tuple(val.shape), tuple(val.stride()), val.dtype)
    if isinstance(val, (tuple, list)):
        return ("seq", [_value(v) for v in val])
    if val is None or isinstance(val, (bool, int, float)):
        return ("const", val)
    raise NotPackable(f"example value of type {type(val).__name__}")


def _arg(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return ("__node__", a.name)
    if isinstance(a, (tuple, list)):
        return type(a)(_arg(x) for x in a)
    if isinstance(a, dict):
        return {k: _arg(v) for k, v in a.items()}
    return a


def _target(node: torch.fx.Node) -> Any:
    t = node.target
    if node.op != "call_function":
        return t
    if t is operator.getitem:
        return ("getitem",)
    if isinstance(t, torch._ops.OpOverload):
        return ("op", t._schema.name, t._overloadname)
    raise NotPackable(f"target {t!r}")


def pack(ep: Any) -> dict[str, Any]:
    """The partition ``ep`` as picklable data (see the module docstring)."""
    if ep.range_constraints:
        raise NotPackable("range constraints (dynamic shapes)")
    if any(not isinstance(v, torch.Tensor) for v in ep.constants.values()):
        raise NotPackable("non-tensor constants")
    nodes = []
    for n in ep.graph.nodes:
        meta = {"val": _value(n.meta["val"])} if "val" in n.meta else {}
        if isinstance(n.meta.get("debug_handle"), int):
            meta["debug_handle"] = n.meta["debug_handle"]
        nodes.append((n.op, n.name, _target(n), _arg(n.args), _arg(n.kwargs), meta))
    return {"nodes": nodes, "signature": ep.graph_signature, "state_dict": dict(ep.state_dict),
            "constants": dict(ep.constants), "verifiers": list(ep.verifiers)}


def _fake(desc: Any, mode: Any) -> Any:
    kind = desc[0]
    if kind == "tensor":
        _, shape, stride, dtype = desc
        with mode:
            return torch.empty_strided(shape, stride, dtype=dtype)
    if kind == "seq":
        return tuple(_fake(d, mode) for d in desc[1])
    return desc[1]


def _resolve(target: Any) -> Any:
    if isinstance(target, tuple) and target[0] == "getitem":
        return operator.getitem
    if isinstance(target, tuple) and target[0] == "op":
        ns, name = target[1].split("::")
        packet = getattr(getattr(torch.ops, ns), name)
        return getattr(packet, target[2] or "default")
    return target


def unpack(data: dict[str, Any]) -> Any:
    """The ``ExportedProgram`` :func:`pack` described, with fake example values."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export import ExportedProgram
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "__node__":
            return env[a[1]]
        if isinstance(a, (tuple, list)):
            return type(a)(arg(x) for x in a)
        if isinstance(a, dict):
            return {k: arg(v) for k, v in a.items()}
        return a

    inputs, outputs = [], []
    for op, name, target, args, kwargs, meta in data["nodes"]:
        if op == "placeholder":
            node = graph.placeholder(name)
        elif op == "output":
            node = graph.output(arg(args[0]))
        else:
            node = graph.create_node(op, _resolve(target), arg(args), arg(kwargs), name=name)
        if "val" in meta:
            node.meta["val"] = _fake(meta["val"], mode)
        if "debug_handle" in meta:
            node.meta["debug_handle"] = meta["debug_handle"]
        env[name] = node
        if op == "placeholder":
            inputs.append(node)
        elif op == "output":
            outputs = list(node.args[0])
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    sig = data["signature"]
    user = set(sig.user_inputs)
    example = tuple(n.meta.get("val") for n in inputs if n.name in user)
    in_spec = torch.utils._pytree.tree_flatten((example, {}))[1]
    out_spec = torch.utils._pytree.tree_flatten(tuple(o.meta.get("val") for o in outputs))[1]
    call_graph = [ModuleCallEntry("", ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec))]
    return ExportedProgram(root=gm, graph=gm.graph, graph_signature=sig, state_dict=data["state_dict"],
                           range_constraints={}, module_call_graph=call_graph, constants=data["constants"],
                           verifiers=data["verifiers"])


def lower_packed(data: dict[str, Any], compile_specs: list[tuple[str, bytes]], whole: bool = True) -> Any:
    """Worker side: the delegate blob and debug-handle map of a packed partition (``whole=False``: only convert,
    return ``None``). A partition that cannot be rebuilt here raises :class:`NotPackable`."""
    from edgeport.backend import CompileSpec
    from edgeport_coreml.options import CoreMLCompileSpec
    from edgeport_coreml.preprocess import convert_partition
    from edgeport_coreml.verify import lower_in_process

    options = CoreMLCompileSpec.from_compile_specs([CompileSpec(k, v) for k, v in compile_specs])
    try:
        program = unpack(data)
    except Exception as exc:  # noqa: BLE001 - an op this process does not know, a verifier's complaint, ...
        raise NotPackable(f"the partition could not be rebuilt in the worker: {type(exc).__name__}: {exc}") from None
    if not whole:
        convert_partition(program, options)
        return None
    return lower_in_process(program, options)
