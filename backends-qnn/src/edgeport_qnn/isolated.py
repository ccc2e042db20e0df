"""QNN graph finalize and context creation in worker processes (``edgeport.isolation``), torch-free.

Lowering a partition (or checking one node for the partitioner) walks the torch graph in the caller and records the
QNN graph it makes as a :class:`GraphRecipe` (:class:`RecordingBuilder` has ``GraphBuilder``'s building methods).
The recipe is replayed on a real ``GraphBuilder`` in a worker process, which validates every node, finalizes the
graph and returns the context binary. One worker per HTP configuration (:func:`worker_key`: the default device, or
a SoC's device, with fp32 or fp16 graph precision): on Qualcomm's x86 emulator a SoC-configured device makes every
later float32 graph of its process fp16-precise, so float32 and quantized graphs must not share a process. A crash
of QNN's libraries ends the worker, not the caller: it comes back as :class:`QnnWorkerCrash` (a ``LoweringError``).

``EDGEPORT_QNN_IN_PROCESS=1`` replays in the calling process instead (no isolation: for measuring its overhead).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeport.errors import LoweringError
from edgeport_qnn.sdk.tensors import QuantParams, check_name, make_spec

__all__ = ["GraphRecipe", "QnnWorkerCrash", "RecordingBuilder", "finalize_recipe", "in_process", "recipe_digest",
           "run_recipe", "worker_key"]


@dataclass
class GraphRecipe:
    """A QNN graph as the calls that build it: ``("input"|"output", name, shape, dtype, quant)``,
    ``("static", name, array, quant)``, ``("node", op, name, inputs, outputs, params)``."""

    name: str
    fp16: bool = False
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)  #: QNN node name -> the torch node it lowers

    def qnn_ops(self) -> list[str]:
        return [s[1] for s in self.steps if s[0] == "node"]


class RecordingBuilder:
    """``GraphBuilder``'s building calls, recorded into a :class:`GraphRecipe` (names, shapes and dtypes checked
    here as the real builder checks them; QNN's own checks run when the recipe is replayed)."""

    def __init__(self, name: str, *, fp16: bool = False) -> None:
        check_name(name, "graph")
        self.recipe = GraphRecipe(name, fp16)
        self.current = ""  #: the torch node being lowered (for error messages)
        self._names: set[str] = set()

    def _spec(self, name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None) -> Any:
        spec = make_spec(name, shape, dtype, quant)
        if name in self._names:
            raise ValueError(f"graph {self.recipe.name!r} already has a tensor named {name!r}")
        self._names.add(name)
        return spec

    def add_input(self, name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None = None) -> Any:
        spec = self._spec(name, shape, dtype, quant)
        self.recipe.steps.append(("input", name, spec.shape, spec.dtype.str, quant))
        return spec

    def add_output(self, name: str, shape: Sequence[int], dtype: Any, quant: QuantParams | None = None) -> Any:
        spec = self._spec(name, shape, dtype, quant)
        self.recipe.steps.append(("output", name, spec.shape, spec.dtype.str, quant))
        return spec

    def add_static(self, name: str, array: np.ndarray, quant: QuantParams | None = None) -> Any:
        if not isinstance(array, np.ndarray):
            raise ValueError(f"static {name!r}: expected a numpy array, got {type(array).__name__}")
        data = np.array(array.reshape(1) if array.ndim == 0 else array, order="C", copy=True)
        spec = self._spec(name, data.shape, data.dtype, quant)
        self.recipe.steps.append(("static", name, data, quant))
        return spec

    def add_node(self, op_type: str, name: str, inputs: Sequence[str], outputs: Sequence[Any],
                 params: Mapping[str, Any] | None = None) -> None:
        outs = []
        for item in outputs:
            if isinstance(item, tuple):
                spec = self._spec(*item) if len(item) == 4 else self._spec(item[0], item[1], item[2], None)
                outs.append((spec.name, spec.shape, spec.dtype.str, spec.quant))
            else:
                outs.append(item)
        self.recipe.steps.append(("node", op_type, name, list(inputs), outs, dict(params or {})))
        if self.current:
            self.recipe.origins[name] = self.current


@dataclass
class Finalized:
    """What a worker returns for a finalized recipe."""

    binary: bytes  #: the sealed context binary (empty when only checked)
    outputs: list[tuple[int, ...]]
    api_version: tuple[str, str]
    build_id: str


class QnnWorkerCrash(LoweringError):
    """QNN's libraries ended the worker process (a signal or an exit) while it handled a graph."""

    def __init__(self, message: str, signal: str | None, exitcode: int | None) -> None:
        super().__init__(message)
        self.signal, self.exitcode = signal, exitcode

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.signal, self.exitcode))


def finalize_recipe(recipe: GraphRecipe, soc_model: int | None, want_binary: bool) -> Finalized:
    """Replay ``recipe`` on the process's HTP backend (a new context on the device of ``soc_model``, ``None``: the
    default device), finalize it and return its context binary. Runs in the worker; raises ``QnnError``."""
    from edgeport_qnn.runtime import shared_backend
    from edgeport_qnn.sdk import QnnError

    backend = shared_backend()
    with backend.create_context(soc_model) as context:
        g = context.graph_builder(recipe.name, fp16=recipe.fp16)
        for step in recipe.steps:
            kind = step[0]
            if kind == "input":
                g.add_input(step[1], step[2], np.dtype(step[3]), step[4])
            elif kind == "output":
                g.add_output(step[1], step[2], np.dtype(step[3]), step[4])
            elif kind == "static":
                g.add_static(step[1], step[2], step[3])
            else:
                _, op, name, inputs, outs, params = step
                outs = [(o[0], o[1], np.dtype(o[2]), o[3]) if isinstance(o, tuple) else o for o in outs]
                try:
                    g.add_node(op, name, inputs, outs, params)
                except QnnError as exc:
                    exc.qnn_node = name  # type: ignore[attr-defined]
                    raise
        graph = g.finalize()
        outputs = [tuple(s.shape) for s in graph.outputs]
        binary = context.context_binary() if want_binary else b""
    return Finalized(binary, outputs, backend.api_version, backend.build_id)


def _feed(h: Any, item: Any) -> None:
    """Hash ``item`` exactly: arrays by their bytes (never a summarized repr), containers and dataclasses by
    their parts."""
    import dataclasses

    if isinstance(item, np.ndarray):
        h.update(f"a{item.dtype.str}{item.shape}".encode())
        h.update(np.ascontiguousarray(item).tobytes())
    elif isinstance(item, dict):
        h.update(b"{")
        for k in sorted(item, key=repr):
            _feed(h, k)
            _feed(h, item[k])
        h.update(b"}")
    elif isinstance(item, (list, tuple)):
        h.update(b"(")
        for x in item:
            _feed(h, x)
        h.update(b")")
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        h.update(type(item).__name__.encode())
        _feed(h, [getattr(item, f.name) for f in dataclasses.fields(item)])
    else:
        h.update(f"{type(item).__name__}:{item!r};".encode())


def recipe_digest(recipe: GraphRecipe) -> str:
    """A SHA-256 of everything that makes the graph (steps, static data, parameters, precision): equal digests
    finalize to the same graph."""
    import hashlib

    h = hashlib.sha256()
    _feed(h, (recipe.name, recipe.fp16, recipe.steps))
    return h.hexdigest()


def worker_key(soc_model: int | None, fp16: bool) -> str:
    """The worker of an HTP configuration: ``edgeport-qnn:default`` (float32 graphs on the default device) or
    ``edgeport-qnn:soc<id>[:fp16]``."""
    return "edgeport-qnn:" + ("default" if soc_model is None else f"soc{soc_model}") + (":fp16" if fp16 else "")


def in_process() -> bool:
    """``EDGEPORT_QNN_IN_PROCESS=1``: graphs are finalized in the calling process (no worker)."""
    return os.environ.get("EDGEPORT_QNN_IN_PROCESS", "") == "1"


_ENTRY = finalize_recipe  # what the worker runs (tests plant a crashing function here)


def run_recipe(recipe: GraphRecipe, soc_model: int | None, *, want_binary: bool, what: str) -> Finalized:
    """Finalize ``recipe`` in the worker of its HTP configuration. ``QnnError`` from QNN comes back as raised
    there; a dead worker raises :class:`QnnWorkerCrash` naming ``what`` (the partition), its QNN ops and the
    signal. The next call starts a fresh worker."""
    if in_process():
        return _ENTRY(recipe, soc_model, want_binary)
    from edgeport.isolation import WorkerCrashed, get_worker

    worker = get_worker(worker_key(soc_model, recipe.fp16))
    try:
        return worker.call(_ENTRY, recipe, soc_model, want_binary)
    except WorkerCrashed as exc:
        how = f"killed by {exc.signal}" if exc.signal else f"exited with code {exc.exitcode}"
        ops: dict[str, int] = {}
        for op in recipe.qnn_ops():
            ops[op] = ops.get(op, 0) + 1
        listed = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(ops.items()))
        detail = exc.detail.strip().splitlines()[:6]
        raise QnnWorkerCrash(
            f"QnnBackend: Qualcomm's QNN library crashed ({how}) in worker {worker.name!r} while finalizing {what} "
            f"(QNN ops: {listed or 'none'}); the caller is unaffected, the next call starts a new worker"
            + ("\n  " + "\n  ".join(detail) if detail else ""), exc.signal, exc.exitcode) from None
