"""``bench/xnnpack.py --busy-core``: another process spinning on one core for the whole run, and two contenders
that the interleaved loop drives call by call over a pipe (the child times its own calls; the pipe is outside the
timing), the same .pte on edgeport's runtime in a child process started with
``EDGEPORT_XNNPACK_POOL=system`` ("edgeport, system pthreadpool": Debian's 2021 libpthreadpool, i.e. edgeport before
its own pool) or with ``EDGEPORT_XNNPACK_LOAD_GAUGE=off`` ("edgeport, no load gauge": its own pool offering every
thread whatever the machine's load, i.e. edgeport before the pool read the load)."""

from __future__ import annotations

import argparse
import pickle
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .report import _fmt_ms, _ratio

_CHILD = r"""
import os, pickle, struct, sys, time
import numpy as np
from edgeport.runtime import Runtime
from edgeport_xnnpack import native
pte, inputs_path = sys.argv[1], sys.argv[2]
x = pickle.loads(open(inputs_path, "rb").read())
method = Runtime.get().load_program(open(pte, "rb").read()).load_method("forward")
out = method.execute(x)[0]
status = native.pool_status()
w = sys.stdout.buffer
def send(obj):
    data = pickle.dumps(obj)
    w.write(struct.pack("<I", len(data)) + data); w.flush()
send({"status": status, "out": np.asarray(out)})
for line in sys.stdin:
    n = int(line)
    ts = []
    for _ in range(n):
        t = time.perf_counter(); method.execute(x); ts.append(time.perf_counter() - t)
    send(ts)
"""


class ChildContender:
    """edgeport's runtime in a child process with extra environment variables (``EDGEPORT_XNNPACK_POOL=system``:
    the system libpthreadpool); ``calls()`` runs it and returns the child's per-call seconds."""

    def __init__(self, pte: bytes, inputs: list[Any], extra_env: dict[str, str]) -> None:
        import os

        self.dir = tempfile.TemporaryDirectory(prefix="ep-child-")
        d = Path(self.dir.name)
        (d / "p.pte").write_bytes(pte)
        (d / "x.pkl").write_bytes(pickle.dumps(inputs))
        env = {**os.environ, **extra_env}
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(d / "p.pte"), str(d / "x.pkl")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=False)
        first = self._read()
        self.status, self.out = first["status"], first["out"]

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        head = self.proc.stdout.read(4)
        if len(head) < 4:
            raise RuntimeError(f"contender child exited ({self.proc.wait()})")
        (n,) = struct.unpack("<I", head)
        return pickle.loads(self.proc.stdout.read(n))

    def calls(self, n: int) -> list[float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{n}\n".encode())
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.dir.cleanup()


def start_spinner() -> subprocess.Popen:
    """Another process keeping one core busy (a Python spin loop) until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def render_busy(results: list[dict[str, Any]], meta: dict[str, str], args: argparse.Namespace) -> str:
    """The compact body of the '## XNNPACK latency, one core busy' section."""
    L = [f"Measured by `bench/xnnpack.py --busy-core{' --quick' if args.quick else ''}` on {meta['date']} (edgeport "
         f"at {meta.get('commit', 'unknown')}): {meta['nproc']} CPUs (`nproc`), {meta['cpu']} (flags: "
         f"{meta.get('flags', '?')}); Python {meta['python']}, torch {meta['torch']}, executorch {meta['executorch']}, "
         f"libXNNPACK {meta['libxnnpack']}. edgeport's thread pool: {meta.get('pool', '?')}. **One core busy**: "
         "another process spins on the CPU for the whole run (a Python `while True: pass`). Threads: "
         f"{args.threads} for every contender (ExecuTorch's threadpool {meta['et_threads']}, edgeport "
         f"`XnnpackCompileOptions(num_threads={args.threads})`, eager `torch.set_num_threads`). Load average at "
         f"start {meta['load_start']}, at end {meta['load_end']}; whole run {meta['wall']}.", ""]
    L.append(f"`median / min` ms over up to {args.reps} interleaved repetitions (order rotated per repetition; sleep "
             f"{args.gap_ms:g} ms before each contender, then a cold and a warm call). `edgeport, system "
             "pthreadpool` = the same .pte on edgeport's runtime in a child process started with "
             "`EDGEPORT_XNNPACK_POOL=system` (Debian's 2021 libpthreadpool: edgeport as it was before its own pool), "
             "driven call by call in the same loop; `edgeport, no load gauge` likewise with "
             "`EDGEPORT_XNNPACK_LOAD_GAUGE=off` (edgeport's pool offering every thread whatever the load: edgeport "
             "before its pool read the machine's load). `other load` = cores other processes kept busy (the spinner "
             "counts: ~1.0 means one core busy, more means other work on the machine too).")
    for key, title in (("times", "Warm (second call in a row)"), ("times_cold", "Cold (first call after the gap)")):
        L += ["", f"{title}:", "",
              "| model | eager | ExecuTorch + XNNPACK | edgeport + XNNPACK | edgeport / ExecuTorch | edgeport, "
              "system pthreadpool | system / ExecuTorch | edgeport, no load gauge | no gauge / ExecuTorch | edgeport, "
              "1 thread | 1 thread / ExecuTorch | err edgeport | reps | other load |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in results:
            if "error" in r:
                L.append(f"| {r['name']} | failed: {r['error']} |||||||||||||")
                continue
            t = r[key]
            et, ep, sy, d1 = t.get("executorch"), t.get("edgeport"), t.get("edgeport_system"), t.get("edgeport_diag")
            ng = t.get("edgeport_nogauge")
            L.append(f"| {r['name']} | {_fmt_ms(t.get('eager'))} | {_fmt_ms(et)} | {_fmt_ms(ep)} | {_ratio(ep, et)} "
                     f"| {_fmt_ms(sy)} | {_ratio(sy, et)} | {_fmt_ms(ng)} | {_ratio(ng, et)} | {_fmt_ms(d1)} "
                     f"| {_ratio(d1, et)} "
                     f"| {r.get('err_ep', float('nan')):.1e} | {r['reps']} | {r['others_cores']:.2f} |")
    stats = [r for r in results if r.get("pool_stats")]
    if stats:
        L += ["", "edgeport's pool counters over the run (`ThreadPool.stats()`): parallel calls with workers / run "
              "on the caller during a contention back-off / waits for a preempted worker that started a back-off:",
              ""]
        L.append("; ".join(f"{r['name']}: {s['parallel']} / {s['solo']} / {s['late']}"
                           for r in stats for s in [r["pool_stats"]]))
    loads = [r for r in results if r.get("load_stats")]
    if loads:
        L += ["", "edgeport's load gauge over the run (`ThreadPool.load_stats()`): calls run on the caller alone "
              "because other programs kept the other CPUs busy / calls on fewer threads than the pool has / "
              "reads of `/proc/stat`; cores other programs kept busy (average) at the end:", ""]
        L.append("; ".join(f"{r['name']}: {s['solo']} / {s['limited']} / {s['reads']}; {s['others']:.2f}"
                           for r in loads for s in [r["load_stats"]]))
    return "\n".join(L) + "\n"
