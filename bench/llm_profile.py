"""Where a decode step of edgeport's LLM program goes on edgeport's runtime, and what the runtime's load-time
rewrites of kernel calls buy, side by side in one process.

For each scheme (fp32, 8da4w), the ``medium`` Llama-style decoder of ``bench/llm.py`` is exported once with
edgeport (``--pte-dir`` keeps / reuses the ``.pte`` files, one per commit). Then:

* **A/B, interleaved**: the same program loaded twice, with the runtime's rewrites (common calls reused,
  ``runtime._cse``; the masked-row guard fused, ``runtime._fuse``; reshape-only delegate calls as views,
  ``runtime._views``; the KV caches' expands kept across steps, ``runtime._kvexpand``; the one-position
  ``index_put_`` slice) and
  without them; decode ms per token, medians of ``--rounds`` blocks of ``--new`` greedy steps each;
* **profile** of a decode step on the rewritten load (``method.time_ops``): delegate calls vs portable kernel
  calls vs the rest (input binding, output copy, dispatch), per kernel and per delegate;
* **inside the delegates** (the XNNPACK executor's step tracer): native XNNPACK runtimes vs numpy host steps.

CPU model, flags and load average are printed; one XNNPACK thread. Usage: ``python bench/llm_profile.py``.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from xnnpack_bench.machine import cpu_model  # noqa: E402


def _commit() -> str:
    """The checkout's commit: cached programs are per commit, so a lowering change never reuses a stale one."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "nogit"


def build(scheme: str, pte_dir: Path) -> Path:
    path = pte_dir / f"medium-{scheme}-edgeport-{_commit()}.pte"
    if not path.exists():
        from edgeport.llm import export_decoder
        from edgeport.testing.decoders import DECODERS

        model = DECODERS["llama"](seed=0, size="medium")
        lowered = export_decoder(model, max_seq_len=32, max_context_len=128,
                                 quantize=None if scheme == "fp32" else scheme)
        path.write_bytes(lowered.manager.buffer)
    return path


def load(path: Path, rewrites: bool) -> Any:
    """The method, loaded with or without the runtime's load-time rewrites of kernel calls."""
    import edgeport.runtime._method as method_module
    from edgeport.runtime import Runtime
    from edgeport.runtime.portable import shape

    saved = (method_module.common_calls, method_module.masked_row_guards, method_module.reshape_delegates,
             method_module.persistent_expands, shape._one_position)
    if not rewrites:
        method_module.common_calls = lambda *a, **k: {}
        method_module.masked_row_guards = lambda *a, **k: ({}, set())
        method_module.reshape_delegates = lambda *a, **k: {}
        method_module.persistent_expands = lambda *a, **k: {}
    try:
        method = Runtime.get().load_program(str(path)).load_method(
            backend_options={"XnnpackBackend": {"num_threads": 1}})
    finally:
        (method_module.common_calls, method_module.masked_row_guards, method_module.reshape_delegates,
         method_module.persistent_expands, _) = saved
    return method


def decode_ms(method: Any, prompt: np.ndarray, new: int, rewrites: bool) -> float:
    from edgeport.runtime.portable import shape

    saved = shape._one_position
    if not rewrites:
        shape._one_position = lambda *a: None
    try:
        n = prompt.size
        method.execute([prompt.reshape(1, -1), np.arange(n, dtype=np.int64)])
        token = 5
        t = time.perf_counter()
        for i in range(new):
            logits = method.execute([np.array([[token]], dtype=np.int64), np.array([n + i], dtype=np.int64)])[0]
            token = int(np.argmax(logits.reshape(-1)))
        return (time.perf_counter() - t) / new * 1e3
    finally:
        shape._one_position = saved


def profile(method: Any, prompt: np.ndarray, steps: int) -> dict[str, Any]:
    plan, prof = method._plan, method._plan.profile
    method.execute([prompt.reshape(1, -1), np.arange(prompt.size, dtype=np.int64)])
    inside: dict[str, float] = collections.defaultdict(float)

    class Tracer:
        def now_ns(self) -> int:
            return time.perf_counter_ns()

        def log_profiling_delegate(self, label: str, _id: Any, start: int, end: int, **_: Any) -> None:
            inside["native XNNPACK" if label.startswith("xnnpack") else "host steps"] += (end - start) / 1e3

    tracer = Tracer()
    method.time_ops = True
    prof.op_seconds.clear()
    prof.op_calls.clear()
    total = 0.0
    for i in range(steps):
        t = time.perf_counter()
        method.execute([np.array([[7]], dtype=np.int64), np.array([prompt.size + i], dtype=np.int64)])
        total += time.perf_counter() - t
    method.time_ops = False
    ops = {k: v / steps * 1e6 for k, v in prof.op_seconds.items()}
    calls = {k: c // steps for k, c in prof.op_calls.items()}
    for d in plan._delegates.items:  # a second pass, step tracer on (it runs each delegate step by step)
        d.executor.set_event_tracer(d.handle, tracer)
    for i in range(steps):
        method.execute([np.array([[7]], dtype=np.int64), np.array([prompt.size + i], dtype=np.int64)])
    for d in plan._delegates.items:
        d.executor.set_event_tracer(d.handle, None)
    return {"step_us": total / steps * 1e6, "ops": ops, "calls": calls,
            "inside": {k: v / steps for k, v in inside.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default="fp32,8da4w")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=40)
    ap.add_argument("--pte-dir", default="/tmp/edgeport-llm-profile")
    args = ap.parse_args()
    pte_dir = Path(args.pte_dir)
    pte_dir.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()}; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          "1 XNNPACK thread")
    prompt = np.random.default_rng(0).integers(3, 4096, size=32).astype(np.int64)
    for scheme in args.schemes.split(","):
        path = build(scheme, pte_dir)
        methods = {True: load(path, True), False: load(path, False)}
        p = methods[True].profile
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for rw in (True, False) if r % 2 == 0 else (False, True):
                times[rw].append(decode_ms(methods[rw], prompt, args.new, rw))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"\n## {scheme}: {p.num_instructions} instructions, {p.folded_instructions} folded, "
              f"{p.reused_calls} reused, {p.fused_calls} fused into {p.fused_calls // 5} ops, "
              f"{p.persistent_expands} expands kept across steps")
        print(f"decode ms/token: rewrites on {on:.2f}, off {off:.2f} (off / on = {off / on:.2f}x); "
              f"rounds on {[round(x, 2) for x in times[True]]}, off {[round(x, 2) for x in times[False]]}")
        for label, m in (("on", methods[True]), ("off", methods[False])):
            res = profile(m, prompt, args.new)
            ops = res["ops"]
            dsum = sum(v for k, v in ops.items() if k.startswith("delegate"))
            ksum = sum(v for k, v in ops.items() if not k.startswith("delegate"))
            kcalls = sum(c for k, c in res["calls"].items() if not k.startswith("delegate"))
            dcalls = sum(c for k, c in res["calls"].items() if k.startswith("delegate"))
            print(f"profile ({label}): step {res['step_us']:.0f} us = delegates {dsum:.0f} us ({dcalls} calls) "
                  f"+ kernels {ksum:.0f} us ({kcalls} calls) + rest {res['step_us'] - dsum - ksum:.0f} us; "
                  "inside the delegates: " + ", ".join(f"{k} {v:.0f} us" for k, v in res["inside"].items()))
            if label == "on":
                top = sorted(((v, k) for k, v in ops.items() if not k.startswith("delegate")), reverse=True)[:8]
                print("  top kernels: " + ", ".join(f"{k} {res['calls'][k]}x {v:.0f} us" for v, k in top))
                topd = sorted(((v, k) for k, v in ops.items() if k.startswith("delegate")), reverse=True)[:5]
                print("  top delegates: " + ", ".join(f"{k.split(':')[0]} {v:.0f} us" for v, k in topd))
    print(f"\nload average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
