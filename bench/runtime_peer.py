"""edgeport's runtime against a native peer, executorch-numpy-runtime, on the same XNNPACK ``.pte`` files.

executorch-numpy-runtime (pip, Python >= 3.12) is ExecuTorch's C++ runtime 1.3.1 with a current XNNPACK behind a
numpy API. This bench makes a venv for it (``--peer-python``, else the first Python >= 3.12 found on PATH or under
``~/.pyenv/versions``; venv in ``~/.cache/edgeport-bench/``), and runs it as a child process
(bench/runtime_peer_child.py) that loads the very ``.pte`` bytes edgeport's runtime runs in this process. When no
such interpreter exists the peer column is skipped and the reason printed.

Programs: every model is exported once (static shapes) and lowered by edgeport with its XNNPACK partitioner
(``edgeport.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])``). Both runtimes use one
XNNPACK thread: edgeport through ``load_method(..., backend_options={"XnnpackBackend": {"num_threads": 1}})``,
the peer by resetting its ExecuTorch thread pool to 1 thread before loading (the wheel exports
``ThreadPool::_unsafe_reset_threadpool``); eager PyTorch runs with ``torch.set_num_threads(1)``.

Loading: both runtimes load the ``.pte`` from bytes for the timed runs; the peer also loads the same file by its
path (as on a device), and that run's error is reported in its own column, with whether its output equals the
from-bytes output bit for bit. ExecuTorch 1.3.1 (the peer's runtime) releases a delegate's named data after
``init`` when it loads a file; edgeport's XNNPACK delegates keep only packed weights there and pass the static
operands XNNPACK reads by pointer as delegate arguments backed by program constants, as ExecuTorch's partitioner
does (before 71f0fd0 they were named data too, and the file-loaded programs computed NaN).

Timing: outputs checked first (error = max |out - eager| / max(1, max |eager|)), then blocks of ``BLOCK``
consecutive calls of one contender (3 untimed warm-up calls before each), the order of the contenders rotated per
round, ``--gap-ms`` of rest before each block; medians of every timed call. The peer's calls are timed inside the
child (``time.perf_counter`` around ``method(inputs)``, numpy in and fresh numpy out), edgeport's around
``method.execute(inputs)``.

    python bench/runtime_peer.py [--models bert vit llama t5_encoder mobilenet_v2 resnet18] [--sizes small medium]
        [--reps 100] [--write-report] [--profile] [--no-breakdown]
    python bench/runtime_peer.py --render-only [--write-report]   # the last run's measurements again
    python bench/runtime_latency.py --peer ...   # the same
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import cpu_flags, write_section  # noqa: E402  (bench/ is not a package)
from xnnpack_bench.machine import cpu_model, loadavg  # noqa: E402

SECTION_TITLE = "## Runtime against executorch-numpy-runtime"
PEER = "executorch-numpy-runtime==1.4.0"
VENV_ROOT = Path(os.environ.get("EDGEPORT_BENCH_HOME", Path.home() / ".cache" / "edgeport-bench"))
HF_MODELS = ["bert", "vit", "llama", "t5_encoder"]
CNNS = ["mobilenet_v2", "resnet18"]
BLOCK = 10
LAST = VENV_ROOT / "runtime_peer_last.json"  # the last run's measurements (--render-only)


# --- the peer's interpreter and venv ----------------------------------------------------------------------------

def _python_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def find_python(explicit: str | None) -> tuple[str | None, str]:
    """``(interpreter >= 3.12, how it was found)`` or ``(None, why not)``."""
    if explicit:
        v = _python_version(explicit)
        if v is None or v < (3, 12):
            return None, f"--peer-python {explicit} is not a Python >= 3.12 (version {v})"
        return explicit, f"--peer-python {explicit}"
    candidates = [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python3"))
    for exe in filter(None, candidates):
        v = _python_version(exe)
        if v is not None and v >= (3, 12):
            return exe, f"{exe} (Python {v[0]}.{v[1]})"
    return None, "no Python >= 3.12 on PATH (python3.12..3.15) or under ~/.pyenv/versions"


def peer_venv(python: str) -> Path:
    """The venv with the peer installed (made and pip-installed on first use); its interpreter."""
    venv = VENV_ROOT / f"peer-{PEER.replace('==', '-')}"
    exe = venv / "bin" / "python"
    ready = venv / ".installed"
    if not ready.exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(exe), "-m", "pip", "install", "-q", PEER], check=True)
        ready.write_text(PEER + "\n")
    return exe


class Peer:
    """The child process running executorch-numpy-runtime; one JSON request / answer per line."""

    def __init__(self, exe: Path, threads: int) -> None:
        self.proc = subprocess.Popen([str(exe), str(BENCH_DIR / "runtime_peer_child.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.info = self.ask({"op": "info", "threads": threads})
        if self.info["threads"] != threads:
            raise RuntimeError(f"the peer's XNNPACK pool has {self.info['threads']} threads, wanted {threads}")

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer exited (code {self.proc.poll()}) on {req['op']}")
        ans = json.loads(line)
        if "error" in ans:
            raise RuntimeError(f"peer {req['op']} {req.get('name', '')}: {ans['error']}")
        return ans

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


# --- programs ---------------------------------------------------------------------------------------------------

def build(name: str, size: str) -> tuple[Any, tuple[Any, ...]]:
    if name in CNNS:
        from edgeport.testing import vision

        return getattr(vision, name)(seed=0, resolution=224)
    from edgeport.testing.architectures import ARCHITECTURES

    arch = ARCHITECTURES[name](seed=0, size=size)
    return arch.model, tuple(arch.example_inputs)


def lower(model: Any, inputs: tuple[Any, ...]) -> bytes:
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport_xnnpack import XnnpackPartitioner

    ep = torch.export.export(model, inputs)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def scale_error(got: Any, want: Any) -> float:
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))


# --- measuring --------------------------------------------------------------------------------------------------

def _timed_block(fn: Callable[[], Any]) -> list[float]:
    for _ in range(3):
        fn()
    times = []
    for _ in range(BLOCK):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def measure(name: str, size: str, peer: Peer | None, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    from edgeport.runtime import Runtime

    label = name if name in CNNS else f"{name} ({size})"
    key = label.replace(" ", "_").replace("(", "").replace(")", "")
    model, inputs = build(name, size)
    with torch.no_grad():
        want = model(*inputs).numpy()
    pte = lower(model, inputs)
    np_inputs = [t.numpy() for t in inputs]
    opts = {"XnnpackBackend": {"num_threads": args.threads}}
    method = Runtime.get().load_program(pte).load_method("forward", backend_options=opts)
    row: dict[str, Any] = {"name": label, "err": {"edgeport": scale_error(method.execute(np_inputs)[0], want)}}
    runs: dict[str, Callable[[], Any]] = {"edgeport": lambda: method.execute(np_inputs)}
    with torch.no_grad():
        runs["eager"] = lambda: model(*inputs)
    if peer is not None:
        (tmp / f"{key}.pte").write_bytes(pte)
        paths = []
        for i, x in enumerate(np_inputs):
            paths.append(str(tmp / f"{key}.in{i}.npy"))
            np.save(paths[-1], x)
        outs = peer.ask({"op": "load", "name": key, "pte": str(tmp / f"{key}.pte"), "inputs": paths,
                         "outputs": str(tmp)})["outputs"]
        peer_out = np.load(outs[0])
        row["err"]["peer"] = scale_error(peer_out, want)
        if args.check_file_load:
            try:
                outs = peer.ask({"op": "load", "name": key + "_file", "pte": str(tmp / f"{key}.pte"),
                                 "inputs": paths, "outputs": str(tmp), "from_path": True})["outputs"]
                row["err"]["peer_file"] = scale_error(np.load(outs[0]), want)
                row["file_equals_bytes"] = bool(np.array_equal(np.load(outs[0]), peer_out))
            except RuntimeError as exc:  # the peer's runtime may also fail outright on the freed constants
                row["err"]["peer_file"] = str(exc).rsplit(": ", 2)[-2] if ": " in str(exc) else str(exc)
            peer.ask({"op": "drop", "name": key + "_file"})

        def peer_block() -> list[float]:
            return peer.ask({"op": "time", "name": key, "n": BLOCK, "warmup": 3})["times"]
    lat: dict[str, list[float]] = {k: [] for k in [*runs, *(["peer"] if peer else [])]}
    order = list(lat)
    with torch.no_grad():
        for block in range(max(1, args.reps // BLOCK)):
            for who in order[block % len(order):] + order[:block % len(order)]:
                time.sleep(args.gap_ms / 1e3)
                lat[who] += peer_block() if who == "peer" else _timed_block(runs[who])
    if peer is not None:
        peer.ask({"op": "drop", "name": key})
    row["lat"] = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
    row["min"] = {k: min(v) * 1e3 for k, v in lat.items()}
    if args.profile:
        row["profile"] = profile(method, np_inputs)
    if args.breakdown:
        row["breakdown"] = breakdown(method, np_inputs, max(10, min(100, int(1e3 / row["lat"]["edgeport"]))))
    return row


def breakdown(method: Any, np_inputs: list[Any], reps: int = 100) -> dict[str, Any]:
    """Where a run's time goes: each compiled op of the method timed alone (minimum over ``reps`` runs of the
    op list, inputs re-bound before each), summed per kind -- portable kernel calls and delegate calls. Reads
    the runtime's internals (bench only)."""
    import collections

    import numpy as np

    runner = method._runner
    plan = runner.plan
    ctx = runner._pool[-1]
    vals = ctx.vals
    per_op: list[tuple[float, str]] = []
    with np.errstate(all="ignore"):
        for ops, _jump, labels in plan.chains:
            best = [float("inf")] * len(ops)
            for _ in range(reps):
                for bind, x in zip(plan.binders, np_inputs):
                    bind(vals, x)
                for i, (fn, get, post) in enumerate(ops):
                    t0 = time.perf_counter()
                    r = fn(*get(vals))
                    if post is not None:
                        post(vals, r)
                    best[i] = min(best[i], time.perf_counter() - t0)
            per_op += list(zip(best, labels))
    for i in plan.borrowed:
        vals[i] = None
    kernels: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    delegate_s, delegates = 0.0, 0
    for t, label in per_op:
        if "(delegate " in label:
            delegate_s += t
            delegates += 1
        else:
            name = label[label.find("(") + 1:-1].split("::")[-1] if "(" in label else "other"
            kernels[name] += t
            calls[name] += 1
    top = ", ".join(f"{k} {calls[k]}x {v * 1e6:.0f}" for k, v in kernels.most_common(3))
    return {"kernels": sum(calls.values()), "kernel_us": sum(kernels.values()) * 1e6, "delegates": delegates,
            "delegate_us": delegate_s * 1e6, "top": top, "folded": method.profile.folded_instructions,
            "instructions": method.profile.num_instructions}


def profile(method: Any, np_inputs: list[Any], calls: int = 50) -> str:
    """cProfile of ``calls`` executions: the top functions by own time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        method.execute(np_inputs)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue()


# --- report -----------------------------------------------------------------------------------------------------

def _err(e: float | str) -> str:
    return e if isinstance(e, str) else f"{e:.1e}"


def _same(row: dict[str, Any]) -> str:
    same = row.get("file_equals_bytes")
    return "" if same is None else (" (= bytes)" if same else " (differs from bytes)")


def render(rows: list[dict[str, Any]], info: dict[str, str]) -> str:
    has_peer = "peer_skip" not in info
    out = [SECTION_TITLE, "",
           f"Measured by `bench/runtime_peer.py` (`bench/runtime_latency.py --peer`) on {info['date']}: {info['cpu']} "
           f"({info['nproc']} CPUs; flags: {info['flags']}); edgeport at {info['git']}, Python {info['python']}, "
           f"torch {info['torch']}; peer: {info['peer']}. Load average at start {info['load_start']}, at end "
           f"{info['load_end']} (shared machine). **One XNNPACK thread on both runtimes** (edgeport: "
           "`backend_options={'XnnpackBackend': {'num_threads': 1}}`; the peer: its ExecuTorch thread pool reset to 1 "
           "thread before loading), eager PyTorch with 1 thread. The same edgeport-lowered `.pte` bytes on both "
           "runtimes, loaded from bytes (see the last column and the note below); medians of "
           f"blocks of {BLOCK} consecutive calls, contenders rotated per block, {info['gap_ms']} ms rest and 3 warm-up "
           f"calls before each block, {info['reps']} calls per contender. Error = max |out - eager| / max(1, "
           "max |eager|).", ""]
    if not has_peer:
        out += [f"**executorch-numpy-runtime skipped**: {info['peer_skip']}", ""]
    out += ["How to read it: the peer runs the whole program in C++ (ExecuTorch's interpreter, its portable/optimized "
            "kernels, XNNPACK of 2025 with batch matrix multiply, transpose, slice and concatenate nodes); edgeport "
            "dispatches every instruction from Python and runs what its 2022 libXNNPACK lacks as numpy host steps "
            "inside the delegates. Where the model's work is large (medium configs, the CNNs) the two are at par; "
            "on the small configs (hidden 32, 8 tokens: 0.05-0.1 ms of work) the fixed cost per instruction "
            "(~1-7 us per portable kernel, ~5-30 us per delegate call) decides, see the second table. The last "
            "column: the peer loading the same `.pte` *from its file* (ExecuTorch 1.3.1 frees a delegate's named "
            "data after `init` then; edgeport keeps only the weights XNNPACK packs there and passes the other static "
            "operands as delegate arguments backed by program constants), and whether that output equals the "
            "from-bytes output bit for bit. The timed runs load from bytes.", ""]
    out += ["| model | edgeport ms | executorch-numpy-runtime ms | edgeport / peer | eager ms | edgeport min | "
            "peer min | error edgeport | error peer | error peer, loaded from the file |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        la, mi, er = r["lat"], r["min"], r["err"]
        peer = la.get("peer")
        peer_ms = "n/a" if peer is None else f"{peer:.3f}"
        ratio = "n/a" if peer is None else f"**{la['edgeport'] / peer:.2f}x**"
        out.append(f"| {r['name']} | {la['edgeport']:.3f} | {peer_ms} | {ratio} | {la['eager']:.3f} | "
                   f"{mi['edgeport']:.3f} | {mi.get('peer', float('nan')):.3f} | {er['edgeport']:.1e} | "
                   f"{er.get('peer', float('nan')):.1e} | {_err(er.get('peer_file', float('nan')))}{_same(r)} |")
    if any("breakdown" in r for r in rows):
        out += ["", "### Where edgeport's time goes", "",
                "Each compiled op of the method timed alone (minimum over 10-100 runs of the op list), summed: the "
                "portable kernel calls left outside the delegates and the delegate calls (XNNPACK runtimes, and the "
                "host steps edgeport's 2022 libXNNPACK lacks: batch matrix multiplies, transposes, slices, "
                "concatenations). Rest: the fastest whole run minus those sums, the fixed cost of a call (input binding, "
                "output copy, the dispatch loop). Instructions: in the program / folded at load (constant folding, delegate calls "
                "on constants included).", "",
                "| model | instructions / folded | kernel calls | kernels us | delegate calls | delegates us | "
                "rest: edgeport min - ops us | edgeport median us | peer median us | top kernels (calls, us) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            b = r.get("breakdown")
            if b is None:
                continue
            peer = r["lat"].get("peer")
            out.append(f"| {r['name']} | {b['instructions']} / {b['folded']} | {b['kernels']} | "
                       f"{b['kernel_us']:.0f} | {b['delegates']} | {b['delegate_us']:.0f} | "
                       f"{r['min']['edgeport'] * 1e3 - b['kernel_us'] - b['delegate_us']:.0f} | "
                       f"{r['lat']['edgeport'] * 1e3:.0f} | {'n/a' if peer is None else f'{peer * 1e3:.0f}'} | "
                       f"{b['top']} |")
    return "\n".join(out) + "\n"


def _git_state() -> str:
    """HEAD, with ``+ uncommitted changes`` when the runtime's or the XNNPACK backend's sources differ from it."""
    git = ["git", "-C", str(BENCH_DIR.parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", "core/src", "backends-xnnpack/src"]).returncode
    return (head or "?") + (" + uncommitted changes" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=HF_MODELS + CNNS)
    ap.add_argument("--sizes", nargs="*", default=["small", "medium"], help="HF config sizes (CNNs: 224x224 once)")
    ap.add_argument("--reps", type=int, default=100, help="timed calls per contender and model")
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=1, help="XNNPACK / torch threads")
    ap.add_argument("--peer-python", help="a Python >= 3.12 interpreter for the peer's venv")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-check-file-load", dest="check_file_load", action="store_false",
                    help="skip the peer's error when it loads the .pte from its file instead of from bytes")
    ap.add_argument("--profile", action="store_true", help="print cProfile of edgeport's execute per model")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="skip the per-op breakdown of edgeport's run (table 'Where edgeport's time goes')")
    ap.add_argument("--write-report", action="store_true")
    ap.add_argument("--render-only", action="store_true", help="re-render the last run's measurements")
    args = ap.parse_args(argv)
    if args.render_only:
        last = json.loads(LAST.read_text())
        section = render(last["rows"], last["info"])
        print(section)
        if args.write_report:
            write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
        return 0
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    info = {"date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu_model(),
            "flags": cpu_flags(), "nproc": str(len(os.sched_getaffinity(0))), "python": platform.python_version(),
            "torch": torch.__version__, "load_start": loadavg(), "gap_ms": f"{args.gap_ms:g}", "reps": str(args.reps),
            "git": _git_state()}
    peer = None
    if args.no_peer:
        info["peer_skip"] = "--no-peer"
    else:
        python, how = find_python(args.peer_python)
        if python is None:
            info["peer_skip"] = how
        else:
            peer = Peer(peer_venv(python), args.threads)
            pi = peer.info
            info["peer"] = (f"{PEER} (ExecuTorch {pi['et_version']}) in a venv of {how}, numpy {pi['numpy']}, "
                            f"XNNPACK pool {pi['threads_before']} -> {pi['threads']} threads")
    info.setdefault("peer", "skipped")
    if "peer_skip" in info:
        print(f"executorch-numpy-runtime skipped: {info['peer_skip']}", file=sys.stderr)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="edgeport-peer-") as tmp:
            for name in args.models:
                for size in (["-"] if name in CNNS else args.sizes):
                    row = measure(name, size, peer, Path(tmp), args)
                    rows.append(row)
                    print(f"# {row['name']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row["lat"].items())
                          + f"; errors {row['err']}; load {loadavg()}", file=sys.stderr)
                    if args.profile:
                        print(row["profile"], file=sys.stderr)
    finally:
        if peer is not None:
            peer.close()
    info["load_end"] = loadavg()
    LAST.parent.mkdir(parents=True, exist_ok=True)
    LAST.write_text(json.dumps({"rows": [{k: v for k, v in r.items() if k != "profile"} for r in rows],
                                "info": info}))
    section = render(rows, info)
    print(section)
    if args.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
