"""Conversion checked at partition time: a partition coremltools cannot convert is refused, never a failed lowering.

:func:`lower_to_blob` is the whole of ``preprocess`` (convert, compress, write and flatten the delegate directory);
it runs in an ``edgeport.isolation`` worker (:mod:`edgeport_coreml.isolated`; ``EDGEPORT_COREML_IN_PROCESS=1``
converts in the calling process), and its results -- the blob, or coremltools' error -- are cached by the partition's content (:func:`program_key`:
graph, input shapes and dtypes, constant bytes, compile specs), so the partitioner's trial conversion and the
later ``preprocess`` of the same partition convert once.

:func:`refuse_unconvertible` converts each tagged partition; when coremltools fails, it looks for the node that
makes it fail (a node the message names, else the shortest failing prefix of the partition in graph order, found
by bisection: a prefix of a topological order is convex, so it is a valid sub-program) and returns it with
coremltools' words, for the partitioner to reject before tagging again.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from edgeport.aot.partitioner import DELEGATION_TAG
from edgeport.aot.to_backend import extract_subprogram
from edgeport.errors import LoweringError
from edgeport.isolation import WorkerCrashed
from edgeport_coreml.options import COREML_BACKEND_ID, CoreMLCompileSpec, UnconvertiblePartition

__all__ = ["WORKER", "clear_conversion_cache", "lower_in_process", "lower_to_blob", "program_key",
           "refuse_unconvertible"]

_CACHE: OrderedDict[str, tuple[bytes, dict[str, tuple[int, ...]] | None] | LoweringError] = OrderedDict()
_CACHE_SIZE = 32
WORKER = "coremltools"  #: the ``edgeport.isolation`` worker key


def clear_conversion_cache() -> None:
    """Forget every cached conversion (for tests that change coremltools' converters in the process)."""
    _CACHE.clear()


def _tensor_bytes(t: Any) -> bytes:
    if not isinstance(t, torch.Tensor):
        return repr(t).encode()
    t = t.detach().cpu().contiguous()
    return f"{t.dtype}{tuple(t.shape)}".encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()


def program_key(program: Any, options: CoreMLCompileSpec) -> str:
    """A digest of what the conversion of ``program`` depends on."""
    h = hashlib.sha256(str(program.graph).encode())
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            h.update(f"{node.name}:{val.dtype}:{tuple(val.shape)};".encode())
    for store in (program.state_dict, program.constants):
        for name in sorted(store):
            h.update(name.encode() + b"\0" + _tensor_bytes(store[name]))
    for spec in options.to_compile_specs():
        h.update(spec.key.encode() + b"\0" + bytes(spec.value))
    return h.hexdigest()


def _in_worker(program: Any, options: CoreMLCompileSpec, whole: bool) -> Any:
    """Run the conversion in the ``coremltools`` worker; ``NotPackable`` when the partition cannot travel."""
    from edgeport.isolation import get_worker
    from edgeport_coreml.isolated import lower_packed, pack

    data = pack(program)
    specs = [(s.key, bytes(s.value)) for s in options.to_compile_specs()]
    return get_worker(WORKER).call(lower_packed, data, specs, whole)


def _isolated(program: Any, options: CoreMLCompileSpec, whole: bool, local: Callable[[], Any]) -> Any:
    from edgeport_coreml.isolated import NotPackable

    if os.environ.get("EDGEPORT_COREML_IN_PROCESS") == "1":
        return local()
    try:
        return _in_worker(program, options, whole)
    except NotPackable:
        return local()


def _lower(program: Any, options: CoreMLCompileSpec) -> tuple[bytes, dict[str, tuple[int, ...]] | None]:
    return _isolated(program, options, True, lambda: lower_in_process(program, options))


def lower_in_process(program: Any, options: CoreMLCompileSpec) -> tuple[bytes, dict[str, tuple[int, ...]] | None]:
    """Convert, compress, write and flatten in this process."""
    import shutil
    import tempfile
    from pathlib import Path

    from edgeport_coreml.preprocess import convert_partition, write_delegate_directory
    from edgeport_coreml.preprocess.compress import compress_weights
    from edgeport_coreml.schema.flat_directory import flatten_directory

    mlmodel = compress_weights(convert_partition(program, options), options)
    tmp = Path(tempfile.mkdtemp(prefix="edgeport_coreml_"))
    try:
        model_dir, debug = write_delegate_directory(mlmodel, tmp, options.model_type)
        blob = flatten_directory(model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    handle_map = {k: tuple(v) for k, v in debug["debugSymbolToHandles"].items()} if debug else None
    return blob, handle_map


def lower_to_blob(program: Any, options: CoreMLCompileSpec) -> tuple[bytes, dict[str, tuple[int, ...]] | None]:
    """The delegate blob of ``program`` and its debug-handle map (cached); :class:`UnconvertiblePartition` when
    coremltools cannot make a model of it (a crashed worker included), another ``LoweringError`` for a
    configuration error (the same error again for the same partition, without converting twice)."""
    key = program_key(program, options)
    hit = _CACHE.get(key)
    if hit is None:
        try:
            hit = _lower(program, options)
        except WorkerCrashed as exc:  # its detail is the worker's native stack: keep the signal
            hit = UnconvertiblePartition(f"{COREML_BACKEND_ID}: coremltools' conversion crashed its worker process "
                                         f"({_how(exc)})")
        except LoweringError as exc:
            hit = exc
        _CACHE[key] = hit
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    if isinstance(hit, LoweringError):
        raise hit
    return hit


def _fails(program: Any, options: CoreMLCompileSpec, whole: bool = True) -> str | None:
    """coremltools' error for ``program``, or ``None``; ``whole=False`` only converts (a bisection step: a prefix
    of a partition may lack inputs, which only the finished delegate must have)."""
    try:
        if whole:
            lower_to_blob(program, options)
        else:
            from edgeport_coreml.preprocess import convert_partition

            _isolated(program, options, False, lambda: convert_partition(program, options))
    except WorkerCrashed as exc:
        return f"{COREML_BACKEND_ID}: coremltools' conversion crashed its worker process ({_how(exc)})"
    except UnconvertiblePartition as exc:
        return str(exc)
    except LoweringError:
        return None  # a configuration error (compile specs vs deployment target): preprocess reports it
    return None


def _how(exc: WorkerCrashed) -> str:
    return f"killed by {exc.signal}" if exc.signal else f"exit code {exc.exitcode}"


def _culprit(ep: Any, members: list[torch.fx.Node], compute: list[torch.fx.Node], message: str,
             fails: Callable[[list[torch.fx.Node]], str | None]) -> torch.fx.Node:
    """The node of the partition that makes conversion fail (see the module docstring)."""
    for node in compute:
        if f"'{node.name}'" in message or f'"{node.name}"' in message:
            return node
    constants = [n for n in members if n.op == "placeholder"]
    lo, hi = 1, len(compute)  # compute[:hi] fails; find the shortest failing prefix
    while lo < hi:
        mid = (lo + hi) // 2
        if fails([*constants, *compute[:mid]]) is not None:
            hi = mid
        else:
            lo = mid + 1
    return compute[hi - 1]


def refuse_unconvertible(ep: Any, options: CoreMLCompileSpec, whole_partitions: bool = False) -> dict[str, str]:
    """Convert every tagged partition of ``ep``; for each that fails, one node to refuse -> coremltools' reason
    (``whole_partitions``: every compute node of a failing partition)."""
    groups: dict[str, list[torch.fx.Node]] = {}
    for node in ep.graph.nodes:
        tag = node.meta.get(DELEGATION_TAG)
        if tag is not None:
            groups.setdefault(tag, []).append(node)
    refused: dict[str, str] = {}

    def fails(nodes: list[torch.fx.Node], whole: bool = True) -> str | None:
        used = {a for n in nodes if n.op == "call_function" for a in n.all_input_nodes}
        kept = [n for n in nodes if n.op != "placeholder" or n in used]
        return _fails(extract_subprogram(ep, kept), options, whole)

    for tag, members in groups.items():
        message = fails(members)
        compute = [n for n in members if n.op == "call_function"]
        if message is None or not compute:
            continue
        if whole_partitions:
            for node in compute:
                refused[node.name] = f"coremltools could not convert its partition ({len(compute)} ops): {message}"
            continue
        node = _culprit(ep, members, compute, message, lambda nodes: fails(nodes, whole=False))
        refused[node.name] = (f"coremltools could not convert partition {tag!r} ({len(compute)} ops) with this "
                              f"node: {message}")
    return refused
