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
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # bench/ is not a package: the parts live in bench/xnnpack_bench/
    sys.path.insert(0, str(HERE))

from xnnpack_bench.busy import render_busy, start_spinner  # noqa: E402
from xnnpack_bench.candidates import transpose_candidate  # noqa: E402
from xnnpack_bench.machine import cpu_flags, cpu_model, git_head, libxnnpack_version, loadavg, nproc  # noqa: E402
from xnnpack_bench.measure import bench_model  # noqa: E402
from xnnpack_bench.report import render, write_report  # noqa: E402
from xnnpack_bench.settings import BUSY_SECTION, CACHE, CNNS, MODELS, REPORT, SECTION  # noqa: E402


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
    ap.add_argument("--busy-core", action="store_true",
                    help="another process spins on one core for the whole run; adds the contender 'edgeport, system "
                         f"pthreadpool' and writes '{BUSY_SECTION}' (no profile or candidate passes)")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 10 if args.quick else 100
    if args.prof_reps is None:
        args.prof_reps = 5 if args.quick else 40
    return args


def _print_row(r: dict) -> None:
    if "times" in r:
        print(f"#   {r['name']} warm: " + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f} ms" for k, v in r["times"].items())
              + "; cold: " + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in r["times_cold"].items())
              + f"; other load {r['others_cores']:.2f} cores; err ep {r.get('err_ep', float('nan')):.1e}"
              f" et {r['err_et']:.1e}" + (f"; pool {r['pool_stats']}" if r.get("pool_stats") else "")
              + (f"; {r['note']}" if r.get("note") else ""), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Measure the models (or re-render the saved run), print the report section, optionally write it."""
    args = _parse(argv)
    saved_name = "xnnpack-busy-last-run.json" if args.busy_core else "xnnpack-last-run.json"
    section = BUSY_SECTION if args.busy_core else SECTION
    if args.render_only:  # re-render the last run's measurements (after editing the report text)
        saved = json.loads((CACHE / saved_name).read_text())
        for k in ("quick", "reps", "prof_reps", "threads", "gap_ms", "budget_s", "diag_threads"):
            setattr(args, k, saved["args"][k])
        body = (render_busy(saved["results"], saved["meta"], args) if args.busy_core
                else render(saved["results"], saved["meta"], args, saved["candidate"]))
        print(body)
        if args.write_report:
            write_report(body, section)
        return
    n = str(args.threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "EDGEPORT_XNNPACK_THREADS"):
        os.environ[var] = n
    wall0 = time.perf_counter()
    load_start = loadavg()
    commit = git_head()
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from importlib.metadata import version

    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() != args.threads:
        portable_lib._unsafe_reset_threadpool(args.threads)
    results = []
    spinner = start_spinner() if args.busy_core else None
    try:
        for name in args.models:
            print(f"# {name} ...", file=sys.stderr, flush=True)
            try:
                r = bench_model(name, args)
            except Exception as exc:  # noqa: BLE001 - report and go on with the other models
                traceback.print_exc()
                r = {"name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            results.append(r)
            _print_row(r)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    candidate = {}
    if CNNS & set(args.models) and not args.busy_core:

        try:
            candidate = transpose_candidate(50 if args.quick else 300)
        except Exception as exc:  # noqa: BLE001 - a diagnostic only
            print(f"# transpose candidate failed: {exc}", file=sys.stderr)
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": nproc(), "cpu": cpu_model(), "python": platform.python_version(), "torch": torch.__version__,
        "executorch": version("executorch"), "numpy": np.__version__, "libxnnpack": libxnnpack_version(),
        "platform": platform.platform(), "et_threads": str(portable_lib._threadpool_get_thread_count()),
        "load_start": load_start, "load_end": loadavg(), "wall": f"{time.perf_counter() - wall0:.0f} s",
        "commit": commit, "flags": cpu_flags(), "pool": _pool_text(),
    }
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / saved_name).write_text(json.dumps(
            {"results": results, "meta": meta, "candidate": candidate, "args": vars(args)}, default=str))
    except OSError:
        pass
    body = render_busy(results, meta, args) if args.busy_core else render(results, meta, args, candidate)
    print(body)
    if args.write_report:
        write_report(body, section)
        print(f"# wrote the '{section}' section of {REPORT}", file=sys.stderr)


def _pool_text() -> str:
    from edgeport_xnnpack import native

    kind, reason = native.pool_status()
    return ("edgeport's own (`edgeport_xnnpack._pool`)" if kind == "edgeport"
            else f"the system libpthreadpool ({reason})")


if __name__ == "__main__":
    main()
