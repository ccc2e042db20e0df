"""Lowering time of edgeport against ExecuTorch 1.5.1, side by side in one run.

For every model of ``edgeport.testing.models.MODELS`` and a deep MLP of N x (Linear(64, 64), ReLU) the model is
exported once; lowering (export excluded) is then timed, interleaved, over several repetitions, and the medians
are reported:

* ``edgeport portable``: ``edgeport.to_edge(ep).to_executorch().buffer``
* ``ExecuTorch portable``: ``executorch.exir.to_edge(ep).to_executorch().buffer``
* ``edgeport + ExamplePartitioner`` (only if ``edgeport_example`` is importable):
  ``edgeport.to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner()]).to_executorch().buffer``
* ``ExecuTorch + XnnpackPartitioner``:
  ``executorch.exir.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer``

Each repetition lowers a fresh ``copy.deepcopy`` of the exported program (made outside the timed region), so
neither framework sees a program the other (or an earlier repetition) has touched. The order of the columns is
rotated from one repetition to the next. The edgeport lowering of the largest MLP is also profiled (cProfile).

Usage::

    python bench/lowering.py                 # full run, markdown table on stdout
    python bench/lowering.py --quick         # fewer repetitions, N up to 200
    python bench/lowering.py --write-report  # also rewrite the "## Lowering time" section of bench/REPORT.md

ExecuTorch is a benchmark-only dependency here (never imported by edgeport itself).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import datetime as _dt
import gc
import math
import os
import platform
import pstats
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
REPORT_PATH = BENCH_DIR / "REPORT.md"
SECTION_TITLE = "## Lowering time"
DEFAULT_REPS = [5]  # repetitions per cell of this run (set from the command line)

# Columns, in table order. The "ep_*" columns are edgeport, the "et_*" ones ExecuTorch.
EP_PORTABLE, ET_PORTABLE, EP_PART, ET_XNN = "ep_portable", "et_portable", "ep_example", "et_xnnpack"
COLUMNS = (EP_PORTABLE, ET_PORTABLE, EP_PART, ET_XNN)
LABELS = {
    EP_PORTABLE: "edgeport portable",
    ET_PORTABLE: "ExecuTorch portable",
    EP_PART: "edgeport + Example",
    ET_XNN: "ExecuTorch + XNNPACK",
}


def _quiet() -> None:
    """deepcopy of an ExportedProgram and ExecuTorch's imports are noisy; keep the benchmark output readable."""
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)


# --------------------------------------------------------------------------------------------------------------
# Lowering functions


def _load_example_partitioner() -> tuple[Any | None, str]:
    """``ExamplePartitioner`` class, or ``None`` and the reason it is not usable."""
    try:
        from edgeport_example.partitioner import ExamplePartitioner
    except Exception as exc:  # not installed yet, or half-written
        return None, f"edgeport_example not importable ({type(exc).__name__}: {exc})"
    return ExamplePartitioner, ""


def make_lowerers() -> tuple[dict[str, Callable[[Any], bytes]], dict[str, str]]:
    """The four lowering functions (ep -> .pte bytes); columns that cannot run map to a note instead."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge as et_to_edge
    from executorch.exir import to_edge_transform_and_lower as et_to_edge_transform_and_lower

    import edgeport

    lowerers: dict[str, Callable[[Any], bytes]] = {
        EP_PORTABLE: lambda ep: edgeport.to_edge(ep).to_executorch().buffer,
        ET_PORTABLE: lambda ep: et_to_edge(ep).to_executorch().buffer,
        ET_XNN: lambda ep: et_to_edge_transform_and_lower(
            ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer,
    }
    notes: dict[str, str] = {}
    example_cls, why = _load_example_partitioner()
    if example_cls is None:
        notes[EP_PART] = why
    else:
        lowerers[EP_PART] = lambda ep: edgeport.to_edge_transform_and_lower(
            ep, partitioner=[example_cls()]).to_executorch().buffer
    return lowerers, notes


# --------------------------------------------------------------------------------------------------------------
# Models


def deep_mlp(n: int, seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """``nn.Sequential`` of ``n`` x (Linear(64, 64), ReLU)."""
    import torch

    torch.manual_seed(seed)
    layers: list[Any] = []
    for _ in range(n):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(1, 64),)


def export(builder: Callable[[], tuple[Any, tuple[Any, ...]]]) -> Any:
    import torch

    model, inputs = builder()
    with torch.no_grad():
        return torch.export.export(model, inputs)


# --------------------------------------------------------------------------------------------------------------
# Timing


@dataclass
class Cell:
    times: list[float] = field(default_factory=list)  # wall-clock seconds
    cpu_times: list[float] = field(default_factory=list)  # process CPU seconds (all threads) of the same runs
    pte_bytes: int | None = None
    note: str = ""  # why there is no time, or how the time was obtained (single run, extrapolated)
    extrapolated: float | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu_times) if self.cpu_times else None

    @property
    def value(self) -> float | None:
        return self.median if self.times else self.extrapolated


@dataclass
class Row:
    name: str
    nodes: int
    cells: dict[str, Cell]
    layers: int | None = None  # deep MLP only


def _time_once(lower: Callable[[Any], bytes], ep: Any) -> tuple[float, float, int]:
    fresh = copy.deepcopy(ep)  # untimed: to_edge may consume or mutate its input
    gc.collect()
    cpu_start = time.process_time()
    start = time.perf_counter()
    buffer = lower(fresh)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    del fresh
    return elapsed, cpu, len(buffer)


def measure(
    name: str,
    ep: Any,
    lowerers: dict[str, Callable[[Any], bytes]],
    notes: dict[str, str],
    reps: int,
    reps_for: dict[str, int] | None = None,
    log: Callable[[str], None] = print,
) -> Row:
    """Time every available column ``reps`` times (per-column overrides in ``reps_for``), interleaved."""
    cells = {c: Cell(note=notes.get(c, "")) for c in COLUMNS}
    wanted = {c: (reps_for or {}).get(c, reps) for c in lowerers}
    columns = [c for c in COLUMNS if c in lowerers and wanted[c] > 0]
    for rep in range(max(wanted.values(), default=0)):
        shift = rep % len(columns) if columns else 0
        for column in columns[shift:] + columns[:shift]:  # rotate the order each repetition
            if len(cells[column].times) >= wanted[column] or (cells[column].note and not cells[column].times
                                                             and rep > 0):
                continue
            try:
                elapsed, cpu, size = _time_once(lowerers[column], ep)
            except Exception as exc:  # one failing framework must not sink the whole benchmark
                cells[column].note = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                log(f"  {name}: {LABELS[column]} {cells[column].note}")
                continue
            cells[column].times.append(elapsed)
            cells[column].cpu_times.append(cpu)
            cells[column].pte_bytes = size
            log(f"  {name}: {LABELS[column]:<22} rep {rep + 1}: {elapsed:8.3f} s wall, {cpu:8.3f} s cpu "
                f"({size} B)")
    nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    return Row(name, nodes, cells)


def _growth_exponent(n1: int, t1: float, n2: int, t2: float) -> float:
    """k in t ~ N^k between two points (1.0 = linear, 2.0 = quadratic)."""
    return math.log(t2 / t1) / math.log(n2 / n1)


# --------------------------------------------------------------------------------------------------------------
# Profile


@dataclass
class Profile:
    n: int
    total: float  # seconds under the profiler
    cumulative: str  # markdown table, top by cumulative time
    own: str  # markdown table, top by own time
    packages: str  # markdown table, own time summed per package
    phases: str  # markdown table, un-profiled phase split


def profile_lowering(ep: Any, n: int, top: int = 15, phase_reps: int = 3) -> Profile:
    """cProfile one edgeport portable lowering, and time its phases (without the profiler)."""
    import edgeport

    fresh = copy.deepcopy(ep)
    gc.collect()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    edgeport.to_edge(fresh).to_executorch().buffer  # noqa: B018 - the property does the serialization
    profiler.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    return Profile(n, total, _format_stats(stats, "cumulative", top), _format_stats(stats, "tottime", top),
                   _by_package(stats), _phases(ep, phase_reps))


def _phases(ep: Any, reps: int) -> str:
    """Median wall / CPU seconds of ``to_edge``, ``to_executorch`` and ``.buffer``, un-profiled."""
    import edgeport

    names = ("edgeport.to_edge(ep)", ".to_executorch()", ".buffer (serialize)")
    wall: list[list[float]] = [[], [], []]
    cpu: list[list[float]] = [[], [], []]
    for _ in range(reps):
        fresh = copy.deepcopy(ep)
        gc.collect()
        marks = [(time.perf_counter(), time.process_time())]
        edge = edgeport.to_edge(fresh)
        marks.append((time.perf_counter(), time.process_time()))
        et = edge.to_executorch()
        marks.append((time.perf_counter(), time.process_time()))
        et.buffer  # noqa: B018
        marks.append((time.perf_counter(), time.process_time()))
        for i in range(3):
            wall[i].append(marks[i + 1][0] - marks[i][0])
            cpu[i].append(marks[i + 1][1] - marks[i][1])
    total_cpu = sum(statistics.median(c) for c in cpu)
    lines = ["| phase | wall s | cpu s | share of cpu |", "|---|---:|---:|---:|"]
    for name, w, c in zip(names, wall, cpu, strict=True):
        lines.append(f"| `{name}` | {statistics.median(w):.3f} | {statistics.median(c):.3f} | "
                     f"{100 * statistics.median(c) / total_cpu:.0f}% |")
    return "\n".join(lines)


_PACKAGE_RE = re.compile(r"(?:site-packages|/src)/([A-Za-z_][A-Za-z0-9_]*)/")


def _package(filename: str) -> str:
    if filename == "~":
        return "(C builtins)"
    if filename.startswith(str(BENCH_DIR)):
        return "bench"
    m = _PACKAGE_RE.search(filename)
    if m:
        return m.group(1)
    if re.search(r"/lib/python3\.\d+/", filename) or filename.startswith("<frozen"):
        return "(python stdlib)"
    return "(other)"


def _by_package(stats: pstats.Stats) -> str:
    """Own time summed per top-level package (C builtins are attributed to no package)."""
    totals: dict[str, float] = {}
    for (filename, _line, _func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = _package(filename)
        totals[key] = totals.get(key, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    lines = ["| package | own s | share |", "|---|---:|---:|"]
    for key, value in sorted(totals.items(), key=lambda kv: kv[1], reverse=True):
        if value < 0.0005:
            continue
        lines.append(f"| {key} | {value:.3f} | {100 * value / whole:.0f}% |")
    return "\n".join(lines)


def _short_path(path: str) -> str:
    if path.startswith(str(REPO_ROOT)):
        return os.path.relpath(path, REPO_ROOT)
    m = re.search(r"(?:site-packages|/src)/(.*)$", path)
    if m:
        return m.group(1)
    m = re.search(r"/lib/python3\.\d+/(.*)$", path)
    if m:
        return m.group(1)
    return path


def _format_stats(stats: pstats.Stats, key: str, top: int) -> str:
    entries = []
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        entries.append((cumtime if key == "cumulative" else tottime, ncalls, tottime, cumtime,
                        f"{_short_path(filename)}:{line}:{func}" if filename != "~" else func))
    entries.sort(key=lambda e: e[0], reverse=True)
    lines = ["| cumulative s | own s | calls | function |", "|---:|---:|---:|---|"]
    for _, ncalls, tottime, cumtime, where in entries[:top]:
        lines.append(f"| {cumtime:.3f} | {tottime:.3f} | {ncalls} | `{where}` |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# Report


def _fmt_s(cell: Cell) -> str:
    if cell.times:
        text = f"{cell.median:.3f}"
        if len(cell.times) == 1:
            text += " (1 run)"
        elif len(cell.times) != DEFAULT_REPS[0]:
            text += f" ({len(cell.times)} runs)"
        return text
    if cell.extrapolated is not None:
        return f"~{cell.extrapolated:.1f} (extrapolated)"
    return "n/a"


def _ratio(a: Cell, b: Cell) -> str:
    """Wall-clock ratio of the medians, then the process-CPU-time ratio."""
    if a.value is None or b.value is None:
        return "n/a"
    if not b.times or not a.times:
        return f"{a.value / b.value:.2f}x (vs extrapolated)"
    return f"{a.value / b.value:.2f}x / {a.cpu_median / b.cpu_median:.2f}x"


def machine_info() -> dict[str, str]:
    import executorch
    import torch

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        et_version = executorch.version.__version__  # type: ignore[attr-defined]
    except AttributeError:
        from importlib.metadata import version

        et_version = version("executorch")
    return {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "executorch": et_version,
        "platform": platform.platform(),
        "load_start": loadavg(),
    }


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def models_table(rows: list[Row]) -> str:
    lines = [
        "| model | ops | edgeport portable s | ExecuTorch portable s | ratio | edgeport + Example s | "
        "ExecuTorch + XNNPACK s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c = r.cells
        lines.append(
            f"| {r.name} | {r.nodes} | {_fmt_s(c[EP_PORTABLE])} | {_fmt_s(c[ET_PORTABLE])} | "
            f"{_ratio(c[EP_PORTABLE], c[ET_PORTABLE])} | {_fmt_s(c[EP_PART])} | {_fmt_s(c[ET_XNN])} | "
            f"{_ratio(c[EP_PART], c[ET_XNN])} |"
        )
    return "\n".join(lines)


def _per_layer(cell: Cell, n: int) -> str:
    return "n/a" if cell.value is None else f"{1000 * cell.value / n:.2f}"


def mlp_table(rows: list[Row]) -> str:
    lines = [
        "| N | ops | edgeport portable s | ms/layer | ExecuTorch portable s | ms/layer | ratio | "
        "edgeport + Example s | ms/layer | ExecuTorch + XNNPACK s | ms/layer | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c, n = r.cells, r.layers or 1
        lines.append(
            f"| {n} | {r.nodes} | {_fmt_s(c[EP_PORTABLE])} | {_per_layer(c[EP_PORTABLE], n)} | "
            f"{_fmt_s(c[ET_PORTABLE])} | {_per_layer(c[ET_PORTABLE], n)} | "
            f"{_ratio(c[EP_PORTABLE], c[ET_PORTABLE])} | "
            f"{_fmt_s(c[EP_PART])} | {_per_layer(c[EP_PART], n)} | "
            f"{_fmt_s(c[ET_XNN])} | {_per_layer(c[ET_XNN], n)} | {_ratio(c[EP_PART], c[ET_XNN])} |"
        )
    return "\n".join(lines)


def mlp_cpu_table(rows: list[Row]) -> str:
    """Process CPU time medians (less sensitive to other processes on a shared machine than wall time)."""
    head = "| N | " + " | ".join(f"{LABELS[c]} cpu s | ms/layer" for c in COLUMNS) + " |"
    lines = [head, "|---:|" + "---:|---:|" * len(COLUMNS)]
    for r in rows:
        n = r.layers or 1
        cells = []
        for c in COLUMNS:
            med = r.cells[c].cpu_median
            cells.append("n/a | n/a" if med is None else f"{med:.3f} | {1000 * med / n:.2f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def growth_lines(rows: list[Row]) -> list[str]:
    """Growth exponent between consecutive N for every column (measured points only), wall and CPU."""
    out = []
    for column in COLUMNS:
        points = [(r.layers, r.cells[column].median, r.cells[column].cpu_median)
                  for r in rows if r.cells[column].times and r.layers]
        if len(points) < 2:
            continue
        parts = [f"N {n1}->{n2}: k = {_growth_exponent(n1, w1, n2, w2):.2f} wall / "
                 f"{_growth_exponent(n1, c1, n2, c2):.2f} cpu"
                 for (n1, w1, c1), (n2, w2, c2) in zip(points, points[1:], strict=False)]
        out.append(f"- {LABELS[column]}: " + "; ".join(parts))
    return out


def notes_lines(rows: list[Row]) -> list[str]:
    seen: dict[str, list[str]] = {}
    for r in rows:
        for column, cell in r.cells.items():
            if cell.note:
                seen.setdefault(f"{LABELS[column]}: {cell.note}", []).append(r.name)
    return [f"- {text} ({', '.join(names)})" for text, names in seen.items()]


def render(
    info: dict[str, str],
    args: argparse.Namespace,
    model_rows: list[Row],
    mlp_rows: list[Row],
    profile: Profile | None,
    wall: float,
) -> str:
    out = [
        SECTION_TITLE,
        "",
        f"Measured by `bench/lowering.py{' --quick' if args.quick else ''}` on {info['date']}: "
        f"{info['nproc']} CPUs (`nproc`), {info['cpu']}; Python {info['python']}, torch {info['torch']}, "
        f"executorch {info['executorch']}; {info['platform']}. Whole run took {wall:.0f} s. Load average "
        f"(1/5/15 min) at start {info['load_start']}, at end {loadavg()}: the machine is shared, so wall "
        "times carry noise from other processes; the process CPU time ratio is given next to the wall one.",
        "",
        "Lowering time only (the `torch.export.export` step is excluded): each repetition lowers a fresh deep "
        "copy of one exported program down to the `.pte` bytes (`...to_executorch().buffer`); the columns are "
        f"interleaved, their order rotated per repetition, and the table gives the median of {args.reps} "
        "repetitions unless marked otherwise. ratio = edgeport / ExecuTorch (goal: <= 0.5x), "
        "as `wall / cpu`: the ratio of the wall-clock medians, then of the process CPU time medians. "
        "ops = call_function nodes of the exported program.",
        "",
        "- portable: `edgeport.to_edge(ep).to_executorch().buffer` vs "
        "`executorch.exir.to_edge(ep).to_executorch().buffer`",
        "- partitioner: `edgeport.to_edge_transform_and_lower(ep, partitioner=[ExamplePartitioner()])` vs "
        "`executorch.exir.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])`, then "
        "`.to_executorch().buffer`. These are different backends doing different amounts of work in "
        "`preprocess`, so that ratio compares pipelines, not like-for-like backends.",
        "",
        "### Reference models (`edgeport.testing.models.MODELS`)",
        "",
        models_table(model_rows),
        "",
        "### Deep MLP: N x (Linear(64, 64), ReLU)",
        "",
        mlp_table(mlp_rows),
        "",
        "Process CPU time medians of the same runs:",
        "",
        mlp_cpu_table(mlp_rows),
        "",
        "Growth exponent k from t ~ N^k between consecutive sizes (1.0 = linear):",
        "",
        *(growth_lines(mlp_rows) or ["- (needs two measured sizes)"]),
    ]
    notes = notes_lines(model_rows + mlp_rows)
    if notes:
        out += ["", "Notes:", "", *notes]
    if profile is not None:
        out += [
            "",
            f"### Where edgeport's time goes: portable lowering of the N = {profile.n} MLP",
            "",
            "Phases, without the profiler (median of 3):",
            "",
            profile.phases,
            "",
            f"cProfile of one `edgeport.to_edge(ep).to_executorch().buffer` ({profile.total:.2f} s wall under "
            "the profiler, which inflates Python-heavy code several-fold), own time per package:",
            "",
            profile.packages,
            "",
            "Top 15 by cumulative time:",
            "",
            profile.cumulative,
            "",
            "Top 15 by own time:",
            "",
            profile.own,
        ]
    return "\n".join(out) + "\n"


def write_section(section: str, path: Path = REPORT_PATH) -> None:
    """Replace the ``## Lowering time`` section of ``path`` (or append it), leaving every other section alone."""
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"^{re.escape(SECTION_TITLE)}[ \t]*\n.*?(?=^## (?!#)|\Z)", re.M | re.S)
    if pattern.search(text):
        new = pattern.sub(lambda _m: section.rstrip("\n") + "\n\n", text, count=1)
        new = new.rstrip("\n") + "\n"
    else:
        if not text.strip():
            text = "# edgeport benchmarks\n"
        new = text.rstrip("\n") + "\n\n" + section
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, deep MLP only up to N = 200")
    parser.add_argument("--write-report", action="store_true",
                        help=f"rewrite the '{SECTION_TITLE}' section of {REPORT_PATH.relative_to(REPO_ROOT)}")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per cell (default 5, --quick 3)")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="deep MLP sizes (default 50 200 800, --quick 50 200)")
    parser.add_argument("--budget", type=float, default=180.0,
                        help="seconds one lowering may be predicted to take before it is measured only once "
                             "(default 180)")
    parser.add_argument("--total-budget", type=float, default=600.0,
                        help="seconds the repetitions of one cell may be predicted to take before they are "
                             "cut to 3 (default 600)")
    parser.add_argument("--max-single", type=float, default=1800.0,
                        help="seconds one lowering may be predicted to take before it is extrapolated instead "
                             "of measured (default 1800)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile of the largest MLP")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every repetition to stderr")
    args = parser.parse_args(argv)
    args.reps = args.reps or (3 if args.quick else 5)
    DEFAULT_REPS[0] = args.reps
    sizes = sorted(args.sizes or ([50, 200] if args.quick else [50, 200, 800]))

    _quiet()
    wall_start = time.perf_counter()

    def log(msg: str) -> None:
        if args.verbose:
            print(msg, file=sys.stderr, flush=True)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from edgeport.testing.models import MODELS

    lowerers, notes = make_lowerers()
    info = machine_info()

    # Warm-up: the first lowering in a process pays one-off import and dispatcher-cache costs in both frameworks.
    warm = export(lambda: MODELS["mlp"]())
    for column, lower in list(lowerers.items()):
        try:
            lower(copy.deepcopy(warm))
        except Exception as exc:
            notes[column] = f"failed on warm-up: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            if column == EP_PART:
                del lowerers[column]
    progress(f"columns: {', '.join(LABELS[c] for c in lowerers)}"
             + (f"; skipped: {'; '.join(f'{LABELS[c]}: {n}' for c, n in notes.items())}" if notes else ""))

    model_rows = []
    for name, builder in MODELS.items():
        progress(f"model {name} ...")
        model_rows.append(measure(name, export(builder), lowerers, notes, args.reps, log=log))

    mlp_rows: list[Row] = []
    last_ep = None
    for n in sizes:
        progress(f"deep MLP N = {n} ...")
        ep = export(lambda n=n: deep_mlp(n))
        reps_for: dict[str, int] = {}
        extrapolate: dict[str, float] = {}
        if len(mlp_rows) >= 1:
            # Predict each column from the measured sizes so far; measure slow ones once or extrapolate them.
            for column in lowerers:
                pts = [(r.layers, r.cells[column].value) for r in mlp_rows if r.cells[column].times]
                if not pts:
                    continue
                k = _growth_exponent(pts[-2][0], pts[-2][1], pts[-1][0], pts[-1][1]) if len(pts) >= 2 else 1.0
                predicted = pts[-1][1] * (n / pts[-1][0]) ** max(k, 1.0)
                if predicted > args.max_single:
                    reps_for[column] = 0
                    extrapolate[column] = predicted
                elif predicted > args.budget:
                    reps_for[column] = 1
                elif predicted * args.reps > args.total_budget:
                    reps_for[column] = min(args.reps, 3)
                progress(f"  {LABELS[column]}: predicted {predicted:.1f} s/run"
                         + (f" -> {reps_for[column]} run(s)" if column in reps_for else ""))
        row = measure(f"deep_mlp_{n}", ep, lowerers, notes, args.reps, reps_for, log=log)
        row.layers = n
        for column, predicted in extrapolate.items():
            cell = row.cells[column]
            cell.extrapolated = predicted
            cell.note = (f"N = {n} not measured: extrapolated from the two smaller sizes as t ~ N^k "
                         f"(predicted {predicted:.0f} s > --max-single {args.max_single:.0f} s)")
        for column, count in reps_for.items():
            if count == 1 and row.cells[column].times:
                row.cells[column].note = (f"measured once (no repetitions) at N = {n}: one run was predicted "
                                          f"to take over --budget {args.budget:.0f} s")
        mlp_rows.append(row)
        last_ep = (n, ep)

    profile = None
    if not args.no_profile and last_ep is not None:
        n, ep = last_ep
        progress(f"profiling edgeport portable lowering, N = {n} ...")
        profile = profile_lowering(ep, n)

    section = render(info, args, model_rows, mlp_rows, profile, time.perf_counter() - wall_start)
    print(section)
    if args.write_report:
        write_section(section)
        progress(f"wrote the '{SECTION_TITLE}' section of {REPORT_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
