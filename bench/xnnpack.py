"""XNNPACK latency: eager PyTorch vs ExecuTorch 1.5.1 + XNNPACK vs edgeport + XNNPACK, interleaved in one process.

Every model is exported once with ``torch.export.export`` and lowered twice:

- ExecuTorch: ``executorch.exir.to_edge_transform_and_lower(ep, partitioner=[executorch's XnnpackPartitioner()])
  .to_executorch().buffer``, run with ``executorch.runtime.Runtime`` (its XNNPACK threadpool set to ``--threads``);
- edgeport: ``edgeport.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(XnnpackCompileOptions(
  num_threads=N))]).to_executorch().buffer``, run with ``edgeport.runtime.Runtime`` (executor pool of N threads);
- eager: ``model(*inputs)`` under ``torch.no_grad()`` with ``torch.set_num_threads(N)``.

Timing: after a warm-up, each repetition visits every contender once, in an order rotated per repetition: a sleep
(``--gap-ms``, 50 ms) so that the worker threads of the previous contender are parked and do not steal a core
(libgomp spins ~10 ms after a parallel region, the 2021 pthreadpool that edgeport's libXNNPACK uses ~30 ms; the
table "worker threads spinning after a call" measures it), then two calls in a row: the first is the *cold*
sample (first call after idling), the second the *warm* one (steady state, as in a loop). The tables give the
median and the minimum of the repetitions, warm first. The outputs are checked first (max abs error divided by the
max abs eager output), so the timings are of correct programs. ``edgeport, 1 thread`` is a diagnostic contender.

Where edgeport's time goes (separate, instrumented passes after the timed one, on the same loaded method): the
input binders, the XNNPACK executor's ``execute``, each native step's ``Runtime.run_list``, each operator step's
``run`` (the channel-shuffle transposes) -- or, for a delegate whose steps all run through the C glue in one
direct call, that call -- and each numpy host segment are wrapped with ``time.perf_counter``; portable kernels
outside the delegates are timed by ``method.time_ops``. Inside XNNPACK = the library calls ``xnn_setup_runtime`` /
``xnn_invoke_runtime`` of the runtimes and ``xnn_setup_channel_shuffle_nc_x32`` / ``xnn_run_operator`` of the
operator steps (the executor runs NCHW <-> NHWC transposes on XNNPACK's operator API; those count as XNNPACK time,
numpy host segments never do). With the C glue (``edgeport_xnnpack._glue``, the default when it is built) the
glue itself sums the wall time inside each library call (``clock_gettime`` around it, in C); the bench reads
those counters before and after each run, outside the timed region. Without it, the ctypes functions are
wrapped in Python timers (their own cost then counts as outside XNNPACK, so the share errs high). "Outside
XNNPACK" = ``method.execute`` wall time minus the time inside those calls, from a lean pass with no other
wrappers; the share under the full probe is shown too. A third estimate interleaves ``method.execute`` with a
bare loop of the same ``xnn_invoke_runtime`` / ``xnn_run_operator`` calls through ctypes on the buffers the
executor last set up (in a steady loop the executor re-runs setup only when a bound pointer changes): 1 - the
ratio of the medians. Candidate fixes are measured, never applied to the package: the NCHW -> NHWC input
transpose as the library's channel-shuffle operator, and (when the executor gives each delegate its own pool)
the same program loaded with one shared pool.

    python bench/xnnpack.py [--quick] [--write-report] [--reps 100] [--models mlp mobilenet_v2 ...] [--threads 2]
        [--quiet-wait 300]        # wait (up to 300 s per model) for the machine to be idle before timing
    python bench/xnnpack.py --render-only [--write-report]   # re-render the last run's saved measurements

Models: ``mlp`` (Linear 512-1024-1024-1000 with ReLUs, batch 16), ``mobilenet_v2`` (faithful torchvision layout,
224x224, from backends-xnnpack/tests/xnn_zoo.py), ``mobilenet_v2_int8`` (the same, PT2E int8: ExecuTorch's
``XNNPACKQuantizer`` per-channel symmetric config vs edgeport's ``edgeport_xnnpack.quantizer.XnnpackQuantizer``,
when that exists), ``resnet18`` (faithful, 224x224), ``encoder`` (the team's ``encoder_4layers`` of
bench/runtime_latency.py: ``nn.TransformerEncoder`` of 4 ``TransformerEncoderLayer(d_model=256, nhead=8,
dim_feedforward=1024, dropout=0, batch_first=True)``, input 1x128x256).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import importlib.util
import inspect
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPORT = HERE / "REPORT.md"
SECTION = "## XNNPACK latency"
MODELS = ["mlp", "mobilenet_v2", "mobilenet_v2_int8", "resnet18", "encoder"]
CNNS = {"mobilenet_v2", "mobilenet_v2_int8", "resnet18"}
# ExecuTorch + XNNPACK latency measured earlier by the team on this machine (ms); eager for the encoder
TEAM_ET_MS = {"mobilenet_v2": 2.65, "mobilenet_v2_int8": 3.8, "resnet18": 25.0, "encoder": 9.9}
TEAM_EAGER_MS = {"encoder": 6.3}
CACHE = Path(os.environ.get("EDGEPORT_BENCH_CACHE", "/tmp/edgeport-bench-cache"))


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="few repetitions (a smoke run; numbers are noisy)")
    ap.add_argument("--write-report", action="store_true", help=f"rewrite the '{SECTION}' section of bench/REPORT.md")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per contender (default 100, quick 10)")
    ap.add_argument("--prof-reps", type=int, default=None, help="instrumented repetitions (default 40, quick 5)")
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gap-ms", type=float, default=50.0,
                    help="sleep before each timed call (ms), longer than any contender's post-run spinning")
    ap.add_argument("--diag-threads", type=int, default=1,
                    help="also time edgeport with this many executor threads, as a diagnostic column (0: off)")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each model's timed loop, wait up to this many seconds for other processes to use "
                         "less than --quiet-cores cores (sampled over 2 s)")
    ap.add_argument("--quiet-cores", type=float, default=0.3)
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="stop a model's timed loop after this many seconds (at least 20 repetitions)")
    ap.add_argument("--no-candidates", action="store_true",
                    help="skip the candidate-fix diagnostics (one shared thread pool, channel-shuffle transpose)")
    ap.add_argument("--render-only", action="store_true", help="re-render the last run's saved measurements")
    ap.add_argument("--no-cache", action="store_true", help="re-lower with ExecuTorch instead of reusing the cache")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 10 if args.quick else 100
    if args.prof_reps is None:
        args.prof_reps = 5 if args.quick else 40
    return args


# --------------------------------------------------------------------------------------------- machine state
def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _nproc() -> str:
    try:
        return subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(os.cpu_count())


class CpuMeter:
    """Cores kept busy by *other* processes while a block ran: machine busy time from /proc/stat minus this
    process's CPU time, divided by the wall time."""

    def __enter__(self) -> CpuMeter:
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()
        return self

    def __exit__(self, *exc: Any) -> None:
        wall = time.perf_counter() - self.t0
        busy, own = self._busy() - self.busy0, self._own() - self.own0
        self.others = max(0.0, (busy - own) / wall) if wall > 0 and busy >= 0 else float("nan")
        self.own = own / wall if wall > 0 else float("nan")

    @staticmethod
    def _busy() -> float:
        try:
            f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return -1e9
        idle = f[3] + (f[4] if len(f) > 4 else 0)
        return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system


def wait_quiet(max_s: float, cores: float) -> float:
    """Sleep in 2 s samples until other processes use fewer than ``cores`` cores, at most ``max_s`` seconds."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        with CpuMeter() as cm:
            time.sleep(2.0)
        if cm.others < cores:
            break
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------------- models
def _load_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _xnn_zoo() -> Any:
    return _load_module("bench_xnnpack_zoo", ROOT / "backends-xnnpack/tests/xnn_zoo.py")


def build_model(name: str) -> tuple[Any, tuple[Any, ...]]:
    """(eval model, example inputs); ``mobilenet_v2_int8`` returns the float model (quantized per lowering)."""
    import torch
    from torch import nn

    if name == "mlp":
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1000))
        return model.eval(), (torch.randn(16, 512),)
    if name in ("mobilenet_v2", "mobilenet_v2_int8"):
        return _xnn_zoo().mobilenet_v2(224)
    if name == "resnet18":
        return _xnn_zoo().resnet18(224)
    if name == "encoder":
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        return model.eval(), (torch.randn(1, 128, 256),)
    raise ValueError(name)


def _calibrate(prepared: Any, inputs: tuple[Any, ...]) -> None:
    import torch

    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        prepared(*inputs)
        for _ in range(4):
            prepared(*(torch.randn(x.shape, generator=g) for x in inputs))


def quantize_int8(model: Any, inputs: tuple[Any, ...], quantizer: Any) -> Any:
    """PT2E post-training int8: export, prepare with ``quantizer``, calibrate on 5 batches, convert."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = torch.export.export(model, inputs).module()
    prepared = prepare_pt2e(gm, quantizer)
    _calibrate(prepared, inputs)
    return convert_pt2e(prepared)


def _et_quantizer() -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def edgeport_quantizer() -> Any:
    """edgeport's int8 XNNPACK quantizer, per-channel weights (ImportError while it does not exist yet)."""
    from edgeport_xnnpack.quantizer import XnnpackQuantizer  # type: ignore[import-not-found]

    return XnnpackQuantizer()


def _cache_key(name: str) -> str:
    from importlib.metadata import version

    h = hashlib.sha256()
    for part in (name, version("torch"), version("executorch"), (ROOT / "backends-xnnpack/tests/xnn_zoo.py").read_bytes(),
                 inspect.getsource(build_model), inspect.getsource(quantize_int8), inspect.getsource(_calibrate),
                 inspect.getsource(_et_quantizer), "v1"):
        h.update(part if isinstance(part, bytes) else part.encode())
    return h.hexdigest()[:16]


def lower_executorch(name: str, model: Any, inputs: tuple[Any, ...], use_cache: bool) -> bytes:
    path = CACHE / f"et-xnnpack-{name}-{_cache_key(name)}.pte"
    if use_cache and path.exists():
        return path.read_bytes()
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackPartitioner as EtXnnpackPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower as et_lower

    if name.endswith("_int8"):
        model = quantize_int8(model, inputs, _et_quantizer())
    ep = torch.export.export(model, inputs)
    data = et_lower(ep, partitioner=[EtXnnpackPartitioner()]).to_executorch().buffer
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


def lower_edgeport(name: str, model: Any, inputs: tuple[Any, ...], threads: int) -> bytes:
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner

    if name.endswith("_int8"):
        model = quantize_int8(model, inputs, edgeport_quantizer())
    ep = torch.export.export(model, inputs)
    part = XnnpackPartitioner(XnnpackCompileOptions(num_threads=threads))
    return to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch().buffer


# ------------------------------------------------------------------------------------------------------ timing
def interleaved(fns: dict[str, Callable[[], Any]], reps: int, gap_s: float, warmup: int = 5,
                budget_s: float = 0.0, min_reps: int = 20, calls: int = 2) -> dict[str, list[list[float]]]:
    """Seconds per call: ``times[name][j]`` lists the ``j``-th of ``calls`` back-to-back calls of each repetition.

    Every repetition visits each function once, in an order rotated per repetition: sleep ``gap_s``, then call it
    ``calls`` times in a row. Call 0 is the first call after the idle gap ("cold": the worker threads have
    parked); call 1 follows it at once ("warm": steady state, as in a loop). With ``budget_s``, stops after
    ``min_reps`` repetitions once the loop has run that long."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times: dict[str, list[list[float]]] = {n: [[] for _ in range(calls)] for n in names}
    clock = time.perf_counter
    start = clock()
    for r in range(reps):
        if budget_s and r >= min_reps and clock() - start > budget_s:
            break
        k = r % len(names)
        for n in names[k:] + names[:k]:
            if gap_s:
                time.sleep(gap_s)
            fn, out = fns[n], times[n]
            for j in range(calls):
                t = clock()
                fn()
                out[j].append(clock() - t)
    return times


def spin_after(fn: Callable[[], Any], window_s: float = 0.1, tries: int = 5) -> float:
    """CPU ms this process burns while its main thread sleeps ``window_s`` right after ``fn()`` returns: worker
    threads spinning after the run (median of ``tries``)."""
    res = []
    for _ in range(tries):
        fn()
        c0 = time.process_time()
        time.sleep(window_s)
        res.append(time.process_time() - c0)
    return statistics.median(res) * 1e3


def rel_err(a: Any, ref: Any) -> float:
    import numpy as np

    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    if a.shape != ref.shape:
        return float("inf")
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(a - ref).max()) / scale


# ------------------------------------------------------------------------------- edgeport instrumentation
class Probe:
    """Wraps the XNNPACK delegates of a loaded edgeport method with timers (see the module docstring)."""

    def __init__(self, method: Any, lean: bool = False) -> None:
        """``lean``: time only the XNNPACK library calls (for the outside-XNNPACK share: the other wrappers
        cost time outside XNNPACK themselves)."""
        from edgeport_xnnpack import native
        from edgeport_xnnpack.runtime import XnnpackHandle, _Host, _Native, _Shuffle

        self.method = method
        plan = method._plan
        self.delegates = [d for d in plan._delegates.items if d.kind == "backend"
                          and isinstance(d.handle, XnnpackHandle)]
        self.acc: dict[str, float] = {}
        self.host: dict[str, float] = {}
        self._undo: list[Callable[[], None]] = []
        self.lib = native.library()
        self.natives = []
        self.host_labels: list[str] = []
        clock = time.perf_counter
        acc, host = self.acc, self.host

        def add(key: str, dt: float) -> None:
            acc[key] = acc.get(key, 0.0) + dt

        xnn = self.lib.xnn
        # inside XNNPACK: the runtime calls and, for channel-shuffle operator steps, the operator calls. With
        # the C glue the library is called from C, which sums the time inside each call itself (two
        # clock_gettime calls; nothing in Python): read before and after each run by `begin` / `end`.
        self.glue = [s.glue()[0] for d in self.delegates for s in d.handle.steps
                     if isinstance(s, (_Native, _Shuffle)) and s.glue() is not None]
        timed = {"xnn_setup_runtime": "xnn_setup", "xnn_invoke_runtime": "xnn_invoke",
                 "xnn_setup_channel_shuffle_nc_x32": "xnn_setup", "xnn_run_operator": "xnn_invoke"}
        originals = {name: getattr(xnn, name) for name in timed if hasattr(xnn, name)}

        def timer(f: Any, key: str) -> Callable[..., Any]:
            def call(*a: Any) -> Any:  # kept lean: what it adds besides f counts as outside XNNPACK
                t = clock()
                r = f(*a)
                acc[key] = acc.get(key, 0.0) + (clock() - t)
                return r
            return call

        for name, f in originals.items():
            if not self.glue:
                setattr(xnn, name, timer(f, timed[name]))
        self._undo.append(lambda: [setattr(xnn, n, f) for n, f in originals.items()])
        self.setup0, self.invoke0 = originals["xnn_setup_runtime"], originals["xnn_invoke_runtime"]
        self.originals = originals
        self.operators: list[Any] = []
        if lean:
            return
        binders0 = list(plan.binders)

        def wrap_binder(b: Callable[..., Any]) -> Callable[..., Any]:
            def bind(vals: Any, x: Any) -> Any:
                t = clock()
                r = b(vals, x)
                add("bind inputs", clock() - t)
                return r
            return bind

        plan.binders[:] = [wrap_binder(b) for b in binders0]
        self._undo.append(lambda: plan.binders.__setitem__(slice(None), binders0))
        for d in self.delegates:
            ex = d.executor
            ex_exec0 = ex.execute

            def ex_exec(handle: Any, inputs: Any, out: Any = None, _f: Any = ex_exec0) -> Any:
                t = clock()
                r = _f(handle, inputs) if out is None else _f(handle, inputs, out=out)
                add("executor.execute", clock() - t)
                return r

            ex.execute = ex_exec
            self._undo.append(lambda ex=ex: ex.__dict__.pop("execute", None))
            direct0 = d.handle.direct
            if direct0 is not None:  # all steps through the C glue in one call: its time is "Runtime.run"
                def direct(ins: Any, out: Any, _f: Any = direct0) -> Any:
                    t = clock()
                    r = _f(ins, out)
                    add("Runtime.run", clock() - t)
                    return r

                d.handle.direct = direct
                self._undo.append(lambda h=d.handle, f=direct0: setattr(h, "direct", f))
            for step in d.handle.steps:
                if isinstance(step, (_Native, _Shuffle)):
                    obj, name = (step.runtime, "run_list") if isinstance(step, _Native) else (step.op, "run")
                    if isinstance(step, _Native):
                        self.natives.append(step.runtime)
                    else:
                        self.operators.append(step.op)
                    run0 = getattr(obj, name)

                    def run(*a: Any, _f: Any = run0) -> Any:
                        t = clock()
                        r = _f(*a)
                        add("Runtime.run", clock() - t)
                        return r

                    setattr(obj, name, run)
                    self._undo.append(lambda obj=obj, name=name: obj.__dict__.pop(name, None))
                elif isinstance(step, _Host):
                    label = step.label
                    self.host_labels.append(label)
                    seg = step.segment
                    fn0 = seg.run

                    def fn(env: Any, _f: Any = fn0, _label: str = label) -> Any:
                        t = clock()
                        r = _f(env)
                        dt = clock() - t
                        host[_label] = host.get(_label, 0.0) + dt
                        add("host steps", dt)
                        return r

                    seg.run = fn
                    self._undo.append(lambda seg=seg: seg.__dict__.pop("run", None))

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def _glue_ns(self) -> tuple[int, int]:
        return sum(b.setup_ns for b in self.glue), sum(b.run_ns for b in self.glue)

    def begin(self) -> None:
        """Before a timed run (outside its timed region): snapshot the C glue's counters."""
        if self.glue:
            self._ns0 = self._glue_ns()

    def end(self) -> None:
        """After a timed run: add the time the C glue spent inside the library calls during it."""
        if self.glue:
            (s0, r0), (s1, r1) = self._ns0, self._glue_ns()
            self.acc["xnn_setup"] = self.acc.get("xnn_setup", 0.0) + (s1 - s0) * 1e-9
            self.acc["xnn_invoke"] = self.acc.get("xnn_invoke", 0.0) + (r1 - r0) * 1e-9

    def bare_setup(self) -> None:
        """The bare loop's calls: ``xnn_invoke_runtime`` of every native runtime and ``xnn_run_operator`` of every
        operator step, on the buffers the executor last set them up with (the executor re-runs setup only when a
        pointer changes, so in a steady loop it only invokes; the buffers stay referenced by the executor)."""
        self._bare = [(self.invoke0, (rt.handle,)) for rt in self.natives]
        run_op = self.originals.get("xnn_run_operator")
        for op in self.operators:
            self._bare.append((run_op, (op.handle, op.pool.handle if op.pool else None)))

    def bare_xnnpack(self) -> None:
        """What the executor's steps spend inside XNNPACK in a steady loop, nothing else."""
        for fn, args in self._bare:
            fn(*args)

    def summary(self) -> dict[str, Any]:
        steps = {"delegates": len(self.delegates), "native": 0, "host": 0, "operator": 0}
        from edgeport_xnnpack.runtime import _Native, _Shuffle

        for d in self.delegates:
            for s in d.handle.steps:
                steps["native" if isinstance(s, _Native) else "operator" if isinstance(s, _Shuffle) else "host"] += 1
        return steps


def profile_edgeport(method: Any, x_np: list[Any], reps: int, gap_s: float = 0.05) -> dict[str, Any]:
    """Instrumented runs: medians per run of each component (ms), host steps and portable ops (ms/run)."""
    probe = Probe(method)
    prof = method.profile
    prof.op_seconds.clear()
    prof.op_calls.clear()
    runs: list[dict[str, float]] = []
    lean_runs: list[dict[str, float]] = []
    try:
        method.time_ops = True
        for _ in range(3):
            method.execute(x_np)
        probe.acc.clear()
        probe.host.clear()
        prof.op_seconds.clear()
        prof.op_calls.clear()
        for _ in range(reps):
            probe.acc.clear()
            probe.begin()
            t = time.perf_counter()
            method.execute(x_np)
            total = time.perf_counter() - t
            probe.end()
            row = {"total": total, **probe.acc}
            runs.append(row)
        method.time_ops = False
        op_ms = {k: v / reps * 1e3 for k, v in prof.op_seconds.items()}
        host_ms = {k: v / reps * 1e3 for k, v in probe.host.items()}
        # uninstrumented estimate: method.execute vs the bare XNNPACK calls, interleaved
        probe.close()
        probe.bare_setup()
        bare = {k: v[-1] for k, v in interleaved(
            {"execute": lambda: method.execute(x_np), "xnnpack": probe.bare_xnnpack}, max(reps, 20), gap_s,
            warmup=2).items()}
        # the share outside XNNPACK, from a lean pass: only the library calls are timed, no op timing
        lean = Probe(method, lean=True)
        try:
            for _ in range(reps):
                lean.acc.clear()
                lean.begin()
                t = time.perf_counter()
                method.execute(x_np)
                total = time.perf_counter() - t
                lean.end()
                lean_runs.append({"total": total, **lean.acc})
        finally:
            lean.close()
    finally:
        method.time_ops = False
        probe.close()

    def med(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in runs) * 1e3

    share = [(r["total"] - r.get("xnn_setup", 0.0) - r.get("xnn_invoke", 0.0)) / r["total"] for r in lean_runs]
    share_full = [(r["total"] - r.get("xnn_setup", 0.0) - r.get("xnn_invoke", 0.0)) / r["total"] for r in runs]
    share_host = [(r["total"] - r.get("xnn_setup", 0.0) - r.get("xnn_invoke", 0.0) - r.get("host steps", 0.0))
                  / r["total"] for r in runs]
    comps = {k: med(k) for k in ("total", "bind inputs", "executor.execute", "Runtime.run", "xnn_setup", "xnn_invoke",
                                 "host steps")}
    comps["portable ops"] = sum(v for k, v in op_ms.items() if not k.startswith("delegate"))
    return {
        "steps": probe.summary(),
        "glue": "c" if probe.glue else "python",
        "components_ms": comps,
        "outside_share": statistics.median(share),
        "outside_share_min": min(share),
        "outside_share_full_probe": statistics.median(share_full),
        "outside_share_excl_host": statistics.median(share_host),
        "bare_ms": statistics.median(bare["xnnpack"]) * 1e3,
        "bare_execute_ms": statistics.median(bare["execute"]) * 1e3,
        "host_ms": dict(sorted(host_ms.items(), key=lambda kv: -kv[1])),
        "op_ms": dict(sorted(op_ms.items(), key=lambda kv: -kv[1])),
    }


def transpose_candidate(reps: int = 300) -> dict[str, tuple[float, float]]:
    """The NCHW -> NHWC input transpose of a 1x3x224x224 image, as edgeport's host step does it (numpy) and as
    the 2022 libXNNPACK can do it natively: ``channel_shuffle_nc_x32`` with groups = C, group_channels = H*W is
    exactly that transpose (its zip micro-kernels). Single thread; (median, min) ms."""
    import ctypes
    from ctypes import POINTER, c_int, c_size_t, c_uint32, c_void_p

    import numpy as np

    from edgeport_xnnpack import native

    xnn = native.library().xnn
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    out = np.empty((1, 224, 224, 3), np.float32)
    perm = (0, 2, 3, 1)

    def timeit(fn: Callable[[], Any]) -> tuple[float, float]:
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3, min(ts) * 1e3

    res = {"numpy copyto(out, x.transpose(0, 2, 3, 1)) (host step)": timeit(lambda: np.copyto(out, x.transpose(perm)))}
    create = xnn.xnn_create_channel_shuffle_nc_x32
    create.restype, create.argtypes = c_int, [c_size_t, c_size_t, c_size_t, c_size_t, c_uint32, POINTER(c_void_p)]
    setup = xnn.xnn_setup_channel_shuffle_nc_x32
    setup.restype, setup.argtypes = c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p]
    run, delete = xnn.xnn_run_operator, xnn.xnn_delete_operator
    run.restype, run.argtypes = c_int, [c_void_p, c_void_p]
    delete.restype, delete.argtypes = c_int, [c_void_p]
    op = c_void_p()
    hw = 224 * 224
    if create(3, hw, 3 * hw, 3 * hw, 0, ctypes.byref(op)) != 0:
        return res
    try:
        if setup(op, 1, x.ctypes.data, out.ctypes.data, None) != 0:
            return res
        out[...] = 0
        run(op, None)
        if np.array_equal(out, x.transpose(perm)):
            res["xnn channel_shuffle_nc_x32 (groups 3, group_channels 50176)"] = timeit(lambda: run(op, None))
    finally:
        delete(op)
    return res


def load_with_shared_pool(pte: bytes) -> tuple[Any, Any]:
    """Load ``pte`` with edgeport's runtime such that all its XNNPACK delegates share one pthreadpool (a candidate
    fix: the executor makes one pool per delegate). Only this bench process is patched, only while loading."""
    from edgeport.runtime import Runtime
    from edgeport_xnnpack import native

    real = native.ThreadPool
    pools: dict[Any, Any] = {}

    class _Shared:  # what the executor sees: the pool's handle and size; closing it is left to the bench
        def __init__(self, pool: Any) -> None:
            self.pool, self.handle, self.num_threads = pool, pool.handle, pool.num_threads

        def close(self) -> None:
            pass

    def shared_pool(num_threads: int | None = None) -> Any:
        if num_threads not in pools:
            pools[num_threads] = _Shared(real(num_threads))
        return pools[num_threads]

    native.ThreadPool = shared_pool  # type: ignore[assignment,misc]
    try:
        method = Runtime.get().load_program(pte).load_method("forward")
    finally:
        native.ThreadPool = real  # type: ignore[misc]
    if len(pools) != 1:
        raise RuntimeError(f"expected the delegates to ask for one pool size, got {sorted(map(str, pools))}")
    return method, next(iter(pools.values())).pool


# --------------------------------------------------------------------------------------------------- per model
def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from executorch.runtime import Runtime as EtRuntime

    from edgeport.runtime import Runtime

    res: dict[str, Any] = {"name": name}
    model, inputs = build_model(name)
    note = []
    t0 = time.perf_counter()
    et_pte = lower_executorch(name, model, inputs, not args.no_cache)
    res["et_lower_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        ep_pte = lower_edgeport(name, model, inputs, args.threads)
    except (ImportError, AttributeError) as exc:
        if not name.endswith("_int8"):
            raise
        ep_pte = None
        note.append(f"edgeport int8 pending: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - an int8 quantizer in progress may fail in many ways
        if not name.endswith("_int8"):
            raise
        ep_pte = None
        note.append(f"edgeport int8 pending: lowering failed: {type(exc).__name__}: {str(exc)[:200]}")
    res["ep_lower_s"] = time.perf_counter() - t0
    diag_pte = None
    if ep_pte is not None and args.diag_threads and args.diag_threads != args.threads:
        diag_pte = lower_edgeport(name, model, inputs, args.diag_threads)

    x_np = [t.numpy().copy() for t in inputs]
    x_t = list(inputs)
    with torch.no_grad():
        ref = model(*inputs).numpy()
    et_method = EtRuntime.get().load_program(et_pte).load_method("forward")
    et_out = et_method.execute(x_t)[0].numpy()
    res["err_et"] = rel_err(et_out, ref)
    fns: dict[str, Callable[[], Any]] = {}

    def eager() -> Any:
        with torch.no_grad():
            return model(*inputs)

    fns["eager"] = eager
    fns["executorch"] = lambda: et_method.execute(x_t)
    method = None
    if ep_pte is not None:
        method = Runtime.get().load_program(ep_pte).load_method("forward")
        ep_out = method.execute(x_np)[0]
        res["err_ep"] = rel_err(ep_out, ref)
        res["err_ep_et"] = rel_err(ep_out, et_out)
        fns["edgeport"] = lambda: method.execute(x_np)
        delegates = [d for d in method._plan._delegates.items if d.kind == "backend"]
        res["delegates"] = [d.backend_id for d in delegates]
        res["pools_distinct"] = len({id(d.handle.pool) for d in delegates if getattr(d.handle, "pool", None)})
        res["portable_ops"] = sorted(method.profile.kernel_libraries)
    if diag_pte is not None:
        diag = Runtime.get().load_program(diag_pte).load_method("forward")
        res["err_diag"] = rel_err(diag.execute(x_np)[0], ref)
        fns["edgeport_diag"] = lambda: diag.execute(x_np)
    shared = None
    if method is not None and res.get("pools_distinct", 0) > 1 and not args.no_candidates:
        shared, shared_pool = load_with_shared_pool(ep_pte)
        res["err_shared"] = rel_err(shared.execute(x_np)[0], ref)
        fns["edgeport_shared"] = lambda: shared.execute(x_np)
    if name.endswith("_int8") and ep_pte is not None:
        note.append("edgeport side quantized with `edgeport_xnnpack.quantizer.XnnpackQuantizer()` "
                    f"({_git_state('backends-xnnpack/src/edgeport_xnnpack/quantizer.py')}), ExecuTorch side with "
                    "its `XNNPACKQuantizer` + `get_symmetric_quantization_config(is_per_channel=True)`; both "
                    "calibrated on the same 5 batches")
    res["waited_s"] = wait_quiet(args.quiet_wait, args.quiet_cores) if args.quiet_wait else 0.0
    with CpuMeter() as cm:
        la0 = _loadavg()
        times = interleaved(fns, args.reps, args.gap_ms / 1e3, budget_s=args.budget_s,
                            min_reps=min(args.reps, 20))
    res["loadavg"] = la0
    res["spin_ms"] = {k: spin_after(f) for k, f in fns.items()}
    res["others_cores"] = cm.others
    res["times"] = {k: (statistics.median(v[1]) * 1e3, min(v[1]) * 1e3) for k, v in times.items()}
    res["times_cold"] = {k: (statistics.median(v[0]) * 1e3, min(v[0]) * 1e3) for k, v in times.items()}
    res["reps"] = len(times["eager"][0])
    if method is not None:
        res["prof"] = profile_edgeport(method, x_np, args.prof_reps, args.gap_ms / 1e3)
        method.release()
    if shared is not None:
        res["prof_shared"] = profile_edgeport(shared, x_np, args.prof_reps, args.gap_ms / 1e3)
        shared.release()
        shared_pool.close()
    res["note"] = "; ".join(note)
    return res


def _fmt_ms(t: tuple[float, float] | None) -> str:
    return "n/a" if t is None else f"{t[0]:.2f} / {t[1]:.2f}"


def _ratio(a: tuple[float, float] | None, b: tuple[float, float] | None) -> str:
    if a is None or b is None:
        return "n/a"
    return f"{a[0] / b[0]:.2f}x / {a[1] / b[1]:.2f}x"


def _latency_table(results: list[dict[str, Any]], key: str, dt: int | None) -> list[str]:
    L: list[str] = []
    diag_h = f" edgeport, {dt} thread{'s' if dt != 1 else ''} (diagnostic) |" if dt else ""
    L.append("| model | eager PyTorch | ExecuTorch + XNNPACK | edgeport + XNNPACK | edgeport / ExecuTorch "
             f"| edgeport / eager | goal | team's ET (eager) | err edgeport / ET / edgeport vs ET | XNNPACK steps |{diag_h} "
             "reps | other load |")
    L.append("|---|---:|---:|---:|---:|---:|---|---:|---:|---|" + ("---:|" if dt else "") + "---:|---:|")
    for r in results:
        if "error" in r:
            L.append(f"| {r['name']} | failed: {r['error']} ||||||||||||")
            continue
        t = r[key]
        ep, et, eg = t.get("edgeport"), t.get("executorch"), t.get("eager")
        goal_txt, ref, bound = "-", None, None
        if r["name"] in CNNS:
            goal_txt, ref, bound = "<= 1.25x ET", et, 1.25
        elif r["name"] == "encoder":
            goal_txt, ref, bound = "<= 1.0x eager", eg, 1.0
        goal = goal_txt
        if ep is None and ref is not None:
            goal = f"{goal_txt}: pending"
        elif ref is not None:
            met_med, met_min = ep[0] / ref[0] <= bound, ep[1] / ref[1] <= bound
            verdict = ("met" if met_med and met_min else "**missed**" if not (met_med or met_min)
                       else f"met by the {'median' if met_med else 'min'}, **missed** by the "
                            f"{'min' if met_med else 'median'}")
            goal = f"{goal_txt}: {verdict}"
        team = f"{TEAM_ET_MS[r['name']]:g}" if r["name"] in TEAM_ET_MS else "-"
        if r["name"] in TEAM_EAGER_MS:
            team += f" ({TEAM_EAGER_MS[r['name']]:g})"
        err = (f"{r.get('err_ep', float('nan')):.1e} / {r['err_et']:.1e} / {r.get('err_ep_et', float('nan')):.1e}"
               if ep is not None else f"- / {r['err_et']:.1e} / -")
        steps = "-"
        if "prof" in r:
            s = r["prof"]["steps"]
            steps = (f"{s['delegates']} delegate(s): {s['native']} native, {s.get('operator', 0)} operator (channel "
                     f"shuffle), {s['host']} host")
            if r.get("portable_ops"):
                steps += f"; {len(r['portable_ops'])} portable op kinds"
        L.append(f"| {r['name']} | {_fmt_ms(eg)} | {_fmt_ms(et)} | {_fmt_ms(ep) if ep else 'pending'} "
                 f"| {_ratio(ep, et)} | {_ratio(ep, eg)} | {goal} | {team} | {err} | {steps} "
                 + (f"| {_fmt_ms(t['edgeport_diag'])} ({_ratio(t['edgeport_diag'], et)} ET) " if dt and "edgeport_diag" in t
                    else ("| - " if dt else ""))
                 + f"| {r['reps']} | {r['others_cores']:.2f} |")
    return L


def render(results: list[dict[str, Any]], meta: dict[str, str], args: argparse.Namespace,
           candidate: dict[str, tuple[float, float]] | None = None) -> str:
    L: list[str] = []
    L.append(f"Measured by `bench/xnnpack.py{' --quick' if args.quick else ''}` on {meta['date']} (edgeport at "
             f"{meta.get('commit', 'unknown')}): "
             f"{meta['nproc']} CPUs (`nproc`), {meta['cpu']}; Python {meta['python']}, torch {meta['torch']}, "
             f"executorch {meta['executorch']}, numpy {meta['numpy']}, libXNNPACK {meta['libxnnpack']}; "
             f"{meta['platform']}. Threads: {args.threads} for every contender (eager `torch.set_num_threads`, "
             f"ExecuTorch's threadpool: {meta['et_threads']}, edgeport's executor pool: `XnnpackCompileOptions("
             f"num_threads={args.threads})`). Load average (1/5/15 min) at start {meta['load_start']}, at end "
             f"{meta['load_end']}; whole run {meta['wall']}.")
    L.append("")
    L.append(f"Each cell is `median / min` ms over up to {args.reps} interleaved repetitions (column reps; a model's "
             f"loop stops after {args.budget_s:g} s). A repetition visits every contender once, in an order rotated "
             f"per repetition: sleep {args.gap_ms:g} ms (so the previous contender's spinning worker threads park), "
             "call it once (the *cold* sample: first call after idling), and call it again at once (the *warm* "
             "sample: steady state, as in a loop). The first table is warm, the second cold. Ratios are median / "
             "median and min / min. err = max |out - eager| / max |eager| (the int8 row is compared with the float "
             "eager model, so it includes the quantization error); the third err is edgeport against ExecuTorch's "
             "output. `other load` = cores kept busy by other processes during the timed loop (from /proc/stat "
             "minus this process). The goals are judged against the ExecuTorch and eager numbers of this run, by the "
             "median and by the min; the team's earlier references are shown for orientation only.")
    L.append("")
    dt = args.diag_threads if args.diag_threads and args.diag_threads != args.threads else None
    L += _latency_table(results, "times", dt)
    L.append("")
    L.append("Cold (the first call after the idle gap), same repetitions:")
    L.append("")
    L += _latency_table(results, "times_cold", dt)
    notes = [f"- {r['name']}: {r['note']}" for r in results if r.get("note")]
    if notes:
        L.append("")
        L.extend(notes)
    L.append("")
    L.append("### Where edgeport's time goes")
    L.append("")
    glue_kind = {p.get("glue", "python") for r in results for p in (r.get("prof"), r.get("prof_shared")) if p}
    L.append("Instrumented pass on edgeport's 2-thread method (timers wrapped around the input binders, the "
             "executor's `execute`, each native runtime's `run_list` and channel-shuffle operator's `run` -- or the "
             "one direct call of a delegate whose steps all run through the C glue --, and each numpy host segment; "
             "the time inside the library calls "
             + ("summed in C by the C glue `edgeport_xnnpack._glue`, which makes them"
                if glue_kind == {"c"} else "from Python timers around the ctypes functions")
             + "; `method.time_ops` for portable kernels), "
             f"medians of {args.prof_reps} runs in ms. Core runtime = `method.execute` outside the executor (input "
             "binding, portable kernels, the rest: interpreter loop, delegate output copies, output "
             "copies); executor glue = `execute` outside the native, operator and host steps; `Runtime.run` binding = "
             "the glue (C or Python/ctypes) around the library calls. xnn_setup / xnn_invoke = time inside XNNPACK's setup and run "
             "calls of runtimes and operators (the NCHW <-> NHWC channel shuffles run on XNNPACK's operator API and "
             "count as XNNPACK). outside XNNPACK = (execute - setup - invoke) / execute, median (min) of the per-run "
             "shares, from a lean pass that times only the library calls (no other wrapper); `full probe` = the same "
             "share under all the wrappers above. `bare` = median of a loop of only the invoke / run-operator calls "
             "on the buffers the executor last set up (it re-runs setup only when a pointer changes), interleaved "
             "with `method.execute`: outside (bare) = 1 - bare / execute.")
    L.append("")
    L.append("| model | method.execute | core: bind inputs | core: portable ops | core: rest | executor glue "
             "| host steps | Runtime.run binding | xnn_setup | xnn_invoke | outside XNNPACK | full probe "
             "| excl. host steps | bare XNNPACK / execute | outside (bare) |")
    L.append("|---|" + "---:|" * 14)
    profs = []
    for r in results:
        if r.get("prof"):
            profs.append((r["name"], r["prof"]))
        if r.get("prof_shared"):
            profs.append((f"{r['name']}, one shared pool (candidate fix)", r["prof_shared"]))
    for label, p in profs:
        c = p["components_ms"]
        core_rest = c["total"] - c["executor.execute"] - c["bind inputs"] - c["portable ops"]
        glue = c["executor.execute"] - c["Runtime.run"] - c["host steps"]
        binding = c["Runtime.run"] - c["xnn_setup"] - c["xnn_invoke"]
        L.append(f"| {label} | {c['total']:.3f} | {c['bind inputs']:.3f} | {c['portable ops']:.3f} "
                 f"| {core_rest:.3f} | {glue:.3f} | {c['host steps']:.3f} | {binding:.3f} "
                 f"| {c['xnn_setup']:.3f} | {c['xnn_invoke']:.3f} "
                 f"| {p['outside_share'] * 100:.1f}% ({p['outside_share_min'] * 100:.1f}%) "
                 f"| {p.get('outside_share_full_probe', float('nan')) * 100:.1f}% "
                 f"| {p['outside_share_excl_host'] * 100:.1f}% | {p['bare_ms']:.3f} / {p['bare_execute_ms']:.3f} "
                 f"| {(1 - p['bare_ms'] / p['bare_execute_ms']) * 100:.1f}% |")
    L.append("")
    for label, p in profs:
        items = [f"host {k}: {v:.3f}" for k, v in list(p["host_ms"].items())[:8]]
        if len(p["host_ms"]) > 8:
            items.append(f"{len(p['host_ms']) - 8} more host step shapes: {sum(list(p['host_ms'].values())[8:]):.3f}")
        ops = [(k, v) for k, v in p["op_ms"].items() if not k.startswith("delegate")]
        items += [f"portable {k}: {v:.3f}" for k, v in ops[:8]]
        if items:
            L.append(f"- {label} (ms per run): " + "; ".join(items))
    cands = [r for r in results if "edgeport_shared" in r.get("times", {})]
    if cands:
        L.append("")
        L.append("Candidate fix measured in the same interleaved loop: the executor creates one pthreadpool per "
                 "delegate (`XnnpackHandle.pool`); here the same program is loaded with every delegate sharing one "
                 "2-thread pool (bench-only patch of `edgeport_xnnpack.native.ThreadPool` while loading), median / "
                 "min ms:")
        L.append("")
        L.append("| model | delegates | edgeport as shipped (a pool per delegate), warm "
                 "| edgeport, one shared pool, warm | shared / ExecuTorch (warm) | shared / eager (warm) "
                 "| err (shared) |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        for r in cands:
            t, c = r["times"], r["times_cold"]
            L.append(f"| {r['name']} | {len(r['delegates'])} | {_fmt_ms(t['edgeport'])} (cold {_fmt_ms(c['edgeport'])}) "
                     f"| {_fmt_ms(t['edgeport_shared'])} (cold {_fmt_ms(c['edgeport_shared'])}) "
                     f"| {_ratio(t['edgeport_shared'], t['executorch'])} "
                     f"| {_ratio(t['edgeport_shared'], t['eager'])} | {r.get('err_shared', float('nan')):.1e} |")
    spins = [r for r in results if r.get("spin_ms")]
    if spins:
        L.append("")
        L.append("Worker threads spinning after a call returns: CPU ms this process burns while its main thread "
                 "sleeps for the 100 ms right after one call (median of 5; ~0 means the pool parks at once):")
        L.append("")
        cols = [("eager", "eager"), ("executorch", "ExecuTorch"), ("edgeport", "edgeport"),
                ("edgeport_diag", f"edgeport, {dt} thread" if dt else ""),
                ("edgeport_shared", "edgeport, one shared pool")]
        cols = [(k, h) for k, h in cols if any(k in r["spin_ms"] for r in spins)]
        L.append("| model | " + " | ".join(h for _, h in cols) + " |")
        L.append("|---|" + "---:|" * len(cols))
        for r in spins:
            L.append(f"| {r['name']} | " + " | ".join(
                f"{r['spin_ms'][k]:.1f}" if k in r["spin_ms"] else "-" for k, _ in cols) + " |")
    if candidate:
        L.append("")
        L.append("Candidate fix for the CNNs' one host step (the NCHW -> NHWC input transpose, 1x3x224x224), single "
                 "thread, median / min ms: " + "; ".join(f"{k}: {v[0]:.3f} / {v[1]:.3f}" for k, v in candidate.items()))
    L += hot_spots(results, candidate or {}, args)
    return "\n".join(L) + "\n"


def hot_spots(results: list[dict[str, Any]], candidate: dict[str, tuple[float, float]],
              args: argparse.Namespace) -> list[str]:
    """The findings of this run, with its numbers, and the fixes they point to."""
    by = {r["name"]: r for r in results if "times" in r}
    L = ["", "### Hot spots (numbers from this run) and the fixes they point to", ""]

    def t(name: str, who: str) -> tuple[float, float] | None:
        return by.get(name, {}).get("times", {}).get(who)

    # 1. the thread pools
    enc = by.get("encoder", {})
    ep_e, sh_e, d1_e = t("encoder", "edgeport"), t("encoder", "edgeport_shared"), t("encoder", "edgeport_diag")
    spin = [f"{n} {r['spin_ms']['edgeport']:.0f} ms" for n, r in by.items() if "edgeport" in r.get("spin_ms", {})]
    per_delegate = ep_e and sh_e
    spin_txt = ("this pthreadpool's threads spin-wait up to 1M iterations after every parallel operator before "
                "they sleep, so the worker keeps a core busy for ~30 ms after `execute` returns (CPU burnt in the "
                "100 ms after a call: " + (", ".join(spin) or "n/a") + "; ExecuTorch's newer pthreadpool parks at "
                "once).")
    if per_delegate:
        txt = ("1. **Thread pools: one per delegate, each spinning (Debian's pthreadpool of 2021-05).** The "
               "executor creates a pthreadpool per delegate, and " + spin_txt)
        s_ = enc.get("delegates", [])
        txt += (f" With {len(s_)} delegates in the encoder, the still-spinning workers of the previous delegates "
                f"take the cores the next delegate's pool needs, and every operator waits for a descheduled "
                f"worker: {ep_e[0]:.2f} ms median on 2 threads"
                + (f" against {d1_e[0]:.2f} ms on 1 thread" if d1_e else "")
                + f"; the same program with all delegates sharing one pool runs in {sh_e[0]:.2f} ms "
                f"(min {sh_e[1]:.2f}).")
    else:
        n_del = len(enc.get("delegates", []))
        txt = ("1. **Thread pool (Debian's pthreadpool of 2021-05).** The executor shares one pool per thread "
               + (f"count across delegates (all {n_del} encoder delegates use one pool), but " if n_del > 1
                  else "count across delegates, but ") + spin_txt)
    loaded = [f"{n} {t(n, 'edgeport')[0]:.1f} ms median vs {t(n, 'edgeport')[1]:.1f} ms min with "
              f"{r['others_cores']:.2f} cores taken" for n, r in by.items()
              if t(n, "edgeport") and r["others_cores"] > 0.3]
    txt += (" When another process holds a core, a spinning pool waits for its descheduled worker at every "
            "operator, so the medians explode while the minimums stay low"
            + (": " + "; ".join(loaded) if loaded else " (this run had no such model, see `other load`; an "
               "earlier run of this bench with ~1 core taken measured MobileNetV2 at ~0.4 s median)") + ". "
            "Fixes: an ABI-compatible newer libpthreadpool (bounded spin, no waiting for workers that were never "
            "woken) loaded ahead of libXNNPACK" + ("" if not per_delegate else ", and one process-wide pool per "
            "thread count in the executor (what ExecuTorch does)") + "; meanwhile `num_threads=1` when the "
            "cores are known to be shared.")
    cold = []
    for n, r in by.items():
        w, c = r["times"].get("edgeport"), r.get("times_cold", {}).get("edgeport")
        we, ce = r["times"].get("executorch"), r.get("times_cold", {}).get("executorch")
        if w and c and c[0] > 1.3 * w[0]:
            cold.append(f"{n} {c[0]:.2f} ms cold vs {w[0]:.2f} ms warm (ExecuTorch {ce[0]:.2f} vs {we[0]:.2f})")
    if cold:
        txt += (" The first call after idling is slow too, likely because the old pool waits for every worker "
                "at every operator and a parked worker (or vCPU) wakes slowly: " + "; ".join(cold) + ".")
    L.append(txt)
    # int8 kernels
    r8 = by.get("mobilenet_v2_int8", {})
    p8, et8 = r8.get("prof"), t("mobilenet_v2_int8", "executorch")
    if p8 and et8:
        c8 = p8["components_ms"]
        L.append(f"1. **int8 kernels.** edgeport's int8 MobileNetV2 spends {c8['xnn_invoke']:.2f} ms (median) inside "
                 f"`xnn_invoke_runtime`, while ExecuTorch's whole run takes {et8[1]:.2f} ms at best (median "
                 f"{et8[0]:.2f} ms). The 2022 library has no AVX512-VNNI int8 GEMM kernels (objdump: no `vpdpbusd` in "
                 "Debian's libXNNPACK.so.0, ~1000 in ExecuTorch's libexecutorch_backend_xnnpack.so; this CPU has "
                 "avx512_vnni), so against ExecuTorch's best runs edgeport's int8 cannot keep up; the goal holds by the "
                 "median only because ExecuTorch's own runs spread so widely. Fix: a newer "
                 "libXNNPACK (the executor's binding is the subgraph API, stable enough to follow), nothing in "
                 "edgeport's Python.")
    # 2. the NCHW <-> NHWC transposes of the CNNs
    cnn = []
    for name in ("mobilenet_v2", "mobilenet_v2_int8", "resnet18"):
        p = by.get(name, {}).get("prof")
        if p:
            c, st = p["components_ms"], p["steps"]
            where = (f"{st.get('operator', 0)} channel-shuffle operator step(s)" if st.get("operator")
                     else f"{st['host']} numpy host step(s), {c['host steps']:.3f} ms")
            cnn.append(f"{name}: {where}")
    if cnn:
        np_t = next((v for k, v in candidate.items() if k.startswith("numpy")), None)
        xs_t = next((v for k, v in candidate.items() if k.startswith("xnn")), None)
        alone = (f" (alone, single thread, warm caches: numpy {np_t[0]:.3f} ms, channel shuffle {xs_t[0]:.3f} ms; "
                 "inside a run the image is no longer in cache and the shuffle takes longer)" if np_t and xs_t else "")
        L.append("2. **The CNNs' NCHW -> NHWC input transpose** (the 2022 library has no transpose node): the executor "
                 "runs 2-D transposes of 32-bit elements on XNNPACK's `channel_shuffle_nc_x32` operator "
                 "(groups = C, group_channels = H*W), created once per delegate, set up again only when a pointer "
                 "changes; its time counts as XNNPACK time" + alone + ". " + "; ".join(cnn) + ".")
    # 3. the outside-XNNPACK share of MobileNetV2
    p = by.get("mobilenet_v2", {}).get("prof")
    if p:
        c = p["components_ms"]
        glue = c["executor.execute"] - c["Runtime.run"] - c["host steps"]
        binding = c["Runtime.run"] - c["xnn_setup"] - c["xnn_invoke"]
        core_rest = c["total"] - c["executor.execute"] - c["bind inputs"] - c["portable ops"]
        L.append(f"3. **MobileNetV2 outside XNNPACK: {p['outside_share'] * 100:.1f}%** of `method.execute` "
                 f"(median of the lean pass's runs; lowest run {p['outside_share_min'] * 100:.1f}%; goal < 3%; "
                 f"{p.get('outside_share_full_probe', float('nan')) * 100:.1f}% under the full probe; "
                 f"bare-loop estimate {(1 - p['bare_ms'] / p['bare_execute_ms']) * 100:.1f}%). Per run (full probe): "
                 f"input binding {c['bind inputs']:.3f} ms, the rest of the core runtime {core_rest:.3f} ms, "
                 f"executor glue {glue:.3f} ms, "
                 + ("the C glue" if p.get("glue") == "c" else "Python/ctypes")
                 + f" around the library calls {binding:.3f} ms, "
                 f"`xnn_setup_runtime` {c['xnn_setup']:.3f} ms (run only when a bound pointer changes). "
                 + ("The executor binds and invokes through the C glue `edgeport_xnnpack._glue` (one C call per "
                    "step, and no per-step Python for a delegate whose steps all run in XNNPACK); what remains "
                    if p.get("glue") == "c" else "What remains ")
                 + "is Python around the delegate call, which runs with cold caches after ~4 ms of XNNPACK work (and "
                 "next to the pool's spinning worker), so it costs several times what it costs in a warm loop.")
    # 4. the encoder
    r = by.get("encoder")
    if r and r.get("prof"):
        p = r.get("prof_shared") or r["prof"]
        which = "with one shared pool, the candidate pool fix" if r.get("prof_shared") else "as shipped"
        c = p["components_ms"]
        s = p["steps"]
        ln = p["op_ms"].get("aten::native_layer_norm.out", 0.0)
        portable = sum(v for k, v in p["op_ms"].items() if not k.startswith("delegate"))
        eg, ep1 = t("encoder", "eager"), t("encoder", "edgeport_diag")
        L.append(f"4. **Transformer encoder** (profiled {which}): {s['delegates']} delegates, {s['native']} "
                 f"native XNNPACK runtimes and {s['host']} numpy host segments per run (the 2022 library has no "
                 "batch matmul, transpose or slice node; the executor schedules each delegate's nodes so that they "
                 "cluster, runs reshapes, transposes and slices as numpy views and materializes only values that "
                 "leave a segment, the batch matmuls writing straight into them on one OpenBLAS thread). Per run: "
                 f"host segments {c['host steps']:.3f} ms, portable kernels outside the delegates {portable:.3f} ms"
                 + (f" (layer norm {ln:.3f} ms)" if ln else "")
                 + f", `xnn_setup_runtime` {c['xnn_setup']:.3f} ms, Python/ctypes around {s['native']} runtimes "
                 f"{c['Runtime.run'] - c['xnn_setup'] - c['xnn_invoke']:.3f} ms, XNNPACK compute "
                 f"{c['xnn_invoke']:.3f} ms"
                 + (f"; eager takes {eg[0]:.2f} ms (min {eg[1]:.2f}) for everything" if eg else "")
                 + (f", edgeport on 1 thread {ep1[0]:.2f} ms" if ep1 else "") + ". Left outside XNNPACK "
                 f"({c['total'] - c['xnn_invoke'] - c['xnn_setup']:.2f} ms of {c['total']:.2f} ms): the attention's "
                 "all-masked-row check on portable kernels (the 2022 library has no comparison node) and the "
                 "numpy batch matmuls (a newer libXNNPACK has batch matmul and transpose nodes).")
    L.append("")
    n = 0
    for i, line in enumerate(L):  # number the items that were written
        m = re.match(r"^\d\. ", line)
        if m:
            n += 1
            L[i] = f"{n}. " + line[m.end():]
    return L


def write_report(body: str) -> None:
    text = REPORT.read_text() if REPORT.exists() else "# edgeport benchmarks\n"
    section = f"{SECTION}\n\n{body}"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == SECTION), None)
    if start is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
        tail = "".join(lines[end:])
        text = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    REPORT.write_text(text)


def _git_state(path: str) -> str:
    """'committed', 'uncommitted changes' or 'not yet committed' for a path of this repository."""
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=ROOT, capture_output=True)
        if tracked.returncode != 0:
            return "the working tree's file, not yet committed"
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=ROOT, capture_output=True)
        return "as committed" if diff.returncode == 0 else "the working tree's file, with uncommitted changes"
    except OSError:
        return "git state unknown"


def _git_head() -> str:
    """Short HEAD commit, and whether the measured packages (core/, backends-xnnpack/) had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "core", "backends-xnnpack"], cwd=ROOT,
                               capture_output=True)
        return head.stdout.strip() + (" with uncommitted changes in core/ or backends-xnnpack/"
                                      if dirty.returncode else "")
    except OSError:
        return "unknown"


def _libxnnpack_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libxnnpack0"], capture_output=True, text=True)
        return out.stdout.strip() or "n/a"
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.render_only:  # re-render the last run's measurements (after editing the report text)
        saved = json.loads((CACHE / "xnnpack-last-run.json").read_text())
        for k in ("quick", "reps", "prof_reps", "threads", "gap_ms", "budget_s", "diag_threads"):
            setattr(args, k, saved["args"][k])
        body = render(saved["results"], saved["meta"], args, saved["candidate"])
        print(body)
        if args.write_report:
            write_report(body)
        return
    n = str(args.threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "EDGEPORT_XNNPACK_THREADS"):
        os.environ[var] = n
    wall0 = time.perf_counter()
    load_start = _loadavg()
    commit = _git_head()
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from importlib.metadata import version

    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() != args.threads:
        portable_lib._unsafe_reset_threadpool(args.threads)
    results = []
    for name in args.models:
        print(f"# {name} ...", file=sys.stderr, flush=True)
        try:
            r = bench_model(name, args)
        except Exception as exc:  # noqa: BLE001 - report and go on with the other models
            traceback.print_exc()
            r = {"name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        results.append(r)
        if "times" in r:
            print(f"#   {name} warm: " + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f} ms" for k, v in r["times"].items())
                  + "; cold: " + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in r["times_cold"].items())
                  + f"; other load {r['others_cores']:.2f} cores; err ep {r.get('err_ep', float('nan')):.1e}"
                  f" et {r['err_et']:.1e}" + (f"; {r['note']}" if r.get("note") else ""), file=sys.stderr, flush=True)
    candidate = {}
    if CNNS & set(args.models):
        try:
            candidate = transpose_candidate(50 if args.quick else 300)
        except Exception as exc:  # noqa: BLE001 - a diagnostic only
            print(f"# transpose candidate failed: {exc}", file=sys.stderr)
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": _nproc(), "cpu": _cpu_model(), "python": platform.python_version(), "torch": torch.__version__,
        "executorch": version("executorch"), "numpy": np.__version__, "libxnnpack": _libxnnpack_version(),
        "platform": platform.platform(), "et_threads": str(portable_lib._threadpool_get_thread_count()),
        "load_start": load_start, "load_end": _loadavg(), "wall": f"{time.perf_counter() - wall0:.0f} s",
        "commit": commit,
    }
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "xnnpack-last-run.json").write_text(json.dumps(
            {"results": results, "meta": meta, "candidate": candidate, "args": vars(args)}, default=str))
    except OSError:
        pass
    body = render(results, meta, args, candidate)
    print(body)
    if args.write_report:
        write_report(body)
        print(f"# wrote the '{SECTION}' section of {REPORT}", file=sys.stderr)


if __name__ == "__main__":
    main()
