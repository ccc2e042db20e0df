"""See a lowered program: a self-contained HTML report, a Chrome-trace memory timeline, a Model Explorer graph.

:class:`GraphReport` is built from a ``.pte`` alone (:meth:`GraphReport.from_pte`, torch-free: kernel and delegate
calls, tensors with shapes, the memory plan) or from the lowering (:meth:`GraphReport.from_manager`: adds node
names, source lines, the operators each partition took and the nodes no partitioner took, with why). Either can
carry run timings (an ETDump, or a method's ``profile`` with ``time_ops``) and per-partition validation results.

* :meth:`GraphReport.write_html` - one HTML file, no network needed to view it (inline CSS, JS and SVG);
* :meth:`GraphReport.write_memory_trace` - live tensors per instruction in the Chrome-trace JSON layout of
  ExecuTorch's memory profiler (open in ``chrome://tracing`` or Perfetto);
* :meth:`GraphReport.write_model_explorer` - the graph in Google Model Explorer's JSON graph format.

``edgeport view MODEL.pte -o report.html`` is :func:`configure_view_command` / :func:`run_view_command`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib import resources
from types import SimpleNamespace
from typing import Any

from edgeport.devtools.graph_view_model import PORTABLE, ProgramGraph, graph_from_plan, layout

__all__ = ["GraphReport", "configure_view_command", "run_view_command"]


def _load(source: Any) -> Any:
    from edgeport.program import load_pte

    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{os.fspath(source)!r}: no such file (give the path of a .pte program)")
        with open(source, "rb") as f:
            return load_pte(f.read())
    if isinstance(source, (bytes, bytearray, memoryview)):
        return load_pte(bytes(source))
    raise TypeError(f"expected a .pte path or its bytes, got {type(source).__name__}")


def _plan_index(lp: Any, method: str) -> int:
    names = [p.name for p in lp.program.execution_plan]
    if method not in names:
        raise ValueError(f"the program has no method {method!r}; its methods: {names}")
    return names.index(method)


def _atomic_write(path: str | os.PathLike, text: str) -> None:
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


class GraphReport:
    """One method of a lowered program, ready to render (see the module docstring)."""

    def __init__(self, graph: ProgramGraph, title: str = "") -> None:
        self.graph = graph
        self.title = title or f"method {graph.method!r}"
        layout(graph)

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def from_pte(cls, source: Any, *, method: str = "forward", etdump: Any = None, profile: Any = None,
                 validation: Any = None, title: str = "") -> GraphReport:
        """Report of ``method`` of the program in ``source`` (path or bytes): ExecuTorch's ``.pte`` files too.

        ``etdump``: an ETDump (path, bytes or :class:`~edgeport.devtools.etdump.ETDump`) recorded running this
        program, for per-instruction times; ``profile``: the method's ``MethodProfile`` after runs with
        ``time_ops``; ``validation``: ``{delegate index: {"max_abs": .., "sqnr_db": ..}}`` or an object with
        ``to_dict()`` returning that.
        """
        lp = _load(source)
        graph = graph_from_plan(lp, _plan_index(lp, method))
        if not title and isinstance(source, (str, os.PathLike)):
            title = f"{os.path.basename(os.fspath(source))} - {method}"
        return cls(_annotate(graph, etdump, profile, validation), title)

    @classmethod
    def from_manager(cls, manager: Any, *, partitioners: Sequence[Any] | None = None,
                     rejections: Mapping[str, str] | None = None, method: str = "forward",
                     executorch_manager: Any = None, etdump: Any = None, profile: Any = None,
                     validation: Any = None, title: str = "") -> GraphReport:
        """Report of a lowered program from its ``EdgeProgramManager`` (``to_edge_transform_and_lower``'s result).

        Adds the lowered graph's node names, source lines and modules, each partition's operators, and the
        nodes left outside any partition with the reason (from ``partitioners``' ``rejections`` or a
        ``rejections`` mapping). ``executorch_manager``: ``manager.to_executorch()`` if already made.
        """
        from edgeport.devtools.graph_view_lowering import annotate_from_lowering

        et = executorch_manager if executorch_manager is not None else manager.to_executorch()
        lp = _load(et.buffer)
        graph = graph_from_plan(lp, _plan_index(lp, method))
        sources: list[Any] = list(partitioners or [])
        if rejections:
            sources.append(SimpleNamespace(rejections=dict(rejections)))
        annotate_from_lowering(graph, manager.exported_program(method), et.exported_program(method), sources)
        return cls(_annotate(graph, etdump, profile, validation), title or f"method {method!r}")

    # -- outputs -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything the page shows, JSON-able."""
        g = self.graph
        data = asdict(g)
        data["values"] = {str(k): v for k, v in g.values.items()}
        data["title"] = self.title
        data["peak_live_bytes"] = g.peak_live_bytes
        data["backends"] = sorted({p.backend for p in g.partitions})
        return data

    def html(self) -> str:
        """The self-contained HTML page."""
        template = resources.files("edgeport.devtools").joinpath("templates", "graph_view.html").read_text(
            encoding="utf-8")
        payload = json.dumps(self.to_dict(), separators=(",", ":"), default=str)
        payload = payload.replace("</", "<\\/").replace("<!--", "<\\!--")
        title = self.title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return template.replace("__TITLE__", title).replace("__GRAPH_DATA__", payload)

    def write_html(self, path: str | os.PathLike) -> None:
        _atomic_write(path, self.html())

    def memory_trace(self, *, enable_memory_offsets: bool = False) -> dict[str, Any]:
        """Chrome-trace JSON of the memory plan in the layout ExecuTorch's ``generate_memory_trace`` writes.

        One trace thread (``tid``) per instruction step that has live tensors; in it one complete (``"X"``) event
        per live planned tensor, ``dur`` = its bytes, ``pid`` = its memory id, ``ts`` = its arena offset
        (``enable_memory_offsets``) or the running total of the step's sizes (stacked).
        """
        g = self.graph
        by_id = {n.id: n for n in g.nodes}
        events: list[dict[str, Any]] = []
        tid = 0
        for step in range(len(g.steps)):
            live = [t for t in g.memory if t.start <= step <= t.end]
            if not live:
                continue
            stacked = 0
            for t in live:
                node = by_id.get(t.producer)
                events.append({
                    "name": _tensor_name(g, t.value, node), "cat": "memory_allocation", "ph": "X",
                    "ts": t.offset if enable_memory_offsets else stacked, "dur": t.nbytes, "pid": t.memory_id,
                    "tid": tid, "args": {
                        "op_name": node.label if node is not None else "input", "Memory ID": t.memory_id,
                        "fqn": node.module if node is not None else "",
                        "source": node.source if node is not None else "", "bytes": t.nbytes}})
                stacked += t.nbytes
            tid += 1
        return {"traceEvents": events}

    def write_memory_trace(self, path: str | os.PathLike, *, enable_memory_offsets: bool = False) -> None:
        _atomic_write(path, json.dumps(self.memory_trace(enable_memory_offsets=enable_memory_offsets), indent=1))

    def model_explorer_graphs(self) -> dict[str, Any]:
        """The graph as Model Explorer's JSON: a graph collection (its ``graph_builder`` field names)."""
        from edgeport.devtools.graph_view_explorer import to_model_explorer

        return to_model_explorer(self.graph, self.title)

    def write_model_explorer(self, path: str | os.PathLike) -> None:
        """Write :meth:`model_explorer_graphs` to ``path`` (a ``.json`` Model Explorer opens)."""
        _atomic_write(path, json.dumps(self.model_explorer_graphs()))


def _tensor_name(g: ProgramGraph, value: int, node: Any) -> str:
    if node is not None and node.name:
        return node.name if len(node.outputs) <= 1 else f"{node.name}[{node.outputs.index(value)}]"
    if node is not None and node.kind == "input":
        return node.label
    return f"value {value}"


# ---------------------------------------------------------------------------------------------- annotation
def _etdump_times(etdump: Any) -> dict[tuple[int, int], list[float]]:
    from edgeport.devtools.etdump import ETDump, load_etdump

    if isinstance(etdump, (str, os.PathLike)):
        with open(etdump, "rb") as f:
            etdump = load_etdump(f.read(), os.fspath(etdump))
    elif isinstance(etdump, (bytes, bytearray, memoryview)):
        etdump = load_etdump(bytes(etdump))
    if not isinstance(etdump, ETDump):
        raise TypeError(f"etdump: expected an ETDump, its path or bytes, got {type(etdump).__name__}")
    times: dict[tuple[int, int], list[float]] = {}
    for run in etdump.run_data:
        if run.name == "Default":  # loading events
            continue
        per_run: dict[tuple[int, int], float] = {}
        for ev in run.events:
            pe = ev.profile_event
            if pe is None or pe.chain_index < 0 or pe.instruction_id < 0:
                continue
            key = (pe.chain_index, pe.instruction_id)
            per_run[key] = max(per_run.get(key, 0.0), (pe.end_time - pe.start_time) / 1000.0)
        for key, us in per_run.items():
            times.setdefault(key, []).append(us)
    return times


def _scalars(value: Any) -> dict[str, Any]:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        return {"result": value}
    return {str(k): v for k, v in value.items() if isinstance(v, (str, int, float, bool))}


def _validation_dict(validation: Any) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Per-partition results and whole-program results from ``{index: {...}}`` or from a report whose
    ``to_dict()`` has ``"partitions": [{"index": .., ...}]`` (and ``"whole_program"``), as
    ``edgeport.devtools.validate`` writes; only scalar fields are kept."""
    if hasattr(validation, "to_dict"):
        validation = validation.to_dict()
    if not isinstance(validation, Mapping):
        raise TypeError("validation: expected {delegate index: {'max_abs': .., 'sqnr_db': ..}} or an object with "
                        f"to_dict() returning that, got {type(validation).__name__}")
    if isinstance(validation.get("partitions"), list):
        rows = validation["partitions"]
        if not all(isinstance(r, Mapping) and "index" in r for r in rows):
            raise ValueError("validation: every entry of 'partitions' needs an 'index' (the delegate call's)")
        per = {int(r["index"]): {k: v for k, v in _scalars(r).items() if k != "index"} for r in rows}
        return per, _scalars(validation.get("whole_program") or {})
    out: dict[int, dict[str, Any]] = {}
    for key, value in validation.items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"validation: key {key!r} is not a partition (delegate) index") from None
        out[index] = _scalars(value)
    return out, {}


def _annotate(graph: ProgramGraph, etdump: Any, profile: Any, validation: Any) -> ProgramGraph:
    if etdump is not None:
        times = _etdump_times(etdump)
        for n in graph.nodes:
            samples = times.get((n.chain, n.instruction)) if n.instruction >= 0 else None
            if samples:
                n.time_us = sum(samples) / len(samples)
        for p in graph.partitions:
            calls = [graph.node(i).time_us for i in p.nodes]
            if calls and all(c is not None for c in calls):
                p.time_us = sum(c for c in calls if c is not None)
        if not times:
            graph.notes.append("the ETDump has no execution events (was the program run with enable_etdump?)")
    if profile is not None:
        secs = dict(getattr(profile, "op_seconds", {}) or {})
        calls = dict(getattr(profile, "op_calls", {}) or {})
        if not secs:
            graph.notes.append("the profile has no op times: set method.time_ops = True before running")
        graph.op_times = {k: {"seconds": v, "calls": float(calls.get(k, 0))} for k, v in sorted(secs.items())}
        for p in graph.partitions:
            key = f"delegate {p.index}: {p.backend}"
            if key in secs and calls.get(key):
                p.calls = int(calls[key])
                if p.time_us is None:
                    p.time_us = secs[key] / calls[key] * 1e6
    if validation is not None:
        results, whole = _validation_dict(validation)
        if whole:
            graph.notes.append("whole program against eager: " + ", ".join(f"{k} {v}" for k, v in whole.items()))
        for index in sorted(results):
            if not 0 <= index < len(graph.partitions):
                raise ValueError(f"validation: partition {index} does not exist; the method has "
                                 f"{len(graph.partitions)} delegate(s)")
            graph.partitions[index].validation = results[index]
    return graph


# ---------------------------------------------------------------------------------------------- command line
def configure_view_command(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``edgeport view``."""
    parser.add_argument("program", help="the .pte file to show")
    parser.add_argument("-o", "--output", required=True, help="the HTML report to write")
    parser.add_argument("--method", default="forward", help="method to show (default: forward)")
    parser.add_argument("--etdump", help="an ETDump (.etdp) recorded running this program: adds timings")
    parser.add_argument("--validation", help="a JSON file {delegate index: {\"max_abs\": .., \"sqnr_db\": ..}}")
    parser.add_argument("--memory-trace", help="also write the memory timeline as Chrome-trace JSON here")
    parser.add_argument("--model-explorer", help="also write the graph as Model Explorer JSON here")


def run_view_command(args: argparse.Namespace) -> int:
    """Write the report (and the optional extras) and say what was written; 0 on success, 2 (with the problem
    on stderr) for a missing or malformed input."""
    import sys

    from edgeport.errors import ProgramError

    try:
        validation = None
        if args.validation:
            with open(args.validation, encoding="utf-8") as f:
                validation = json.load(f)
        report = GraphReport.from_pte(args.program, method=args.method, etdump=args.etdump, validation=validation)
        report.write_html(args.output)
        if args.memory_trace:
            report.write_memory_trace(args.memory_trace)
        if args.model_explorer:
            report.write_model_explorer(args.model_explorer)
    except (OSError, ProgramError, ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        print(f"edgeport view: {exc}", file=sys.stderr)
        return 2
    written = [p for p in (args.output, args.memory_trace, args.model_explorer) if p]
    print(f"wrote {', '.join(written)}: {summary_line(report)}")
    return 0


def summary_line(report: GraphReport) -> str:
    """One line describing what a report shows (for the CLI to print)."""
    g = report.graph
    kernels = sum(n.kind == "kernel" for n in g.nodes)
    return (f"{g.method}: {len(g.steps)} instructions ({kernels} {PORTABLE} kernel calls, "
            f"{len(g.partitions)} delegates), peak live memory {g.peak_live_bytes} bytes")
