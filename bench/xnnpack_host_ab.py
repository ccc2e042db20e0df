"""The XNNPACK executor's C paths for host steps, A/B in one process: the same ``.pte`` loaded twice, once with
the numpy program per host node (the path before: ``plan_copies`` and ``_alias_reshapes`` off at load,
``_transposed_into`` off while it runs) and once as shipped (data-moving host segments as one
``_kernels.copy_runs`` call, buffer-to-buffer reshapes as views, transposed operands on
``_kernels.transpose_scale``). Blocks of calls alternate between the two loads (order
flipped every round); outputs are compared bit for bit first.

Workloads: the decode step of the ``medium`` Llama-style decoder of ``bench/llm.py`` (fp32 and 8da4w, the
``.pte`` files of ``bench/llm_profile.py`` in ``--pte-dir``, made when missing) and the small Hugging Face configs
of ``bench/runtime_peer.py``. CPU model, flags and load average printed; one XNNPACK thread.

    python bench/xnnpack_host_ab.py [--decoders fp32,8da4w] [--small llama,bert,vit,t5_encoder] [--rounds 7]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from xnnpack_bench.machine import cpu_model  # noqa: E402


@contextlib.contextmanager
def numpy_path(on: bool) -> Iterator[None]:
    """While ``on``: host segments built and run as before the C paths (numpy per node)."""
    from edgeport_xnnpack import _host, _planner

    saved = (_host.plan_copies, _host._transposed_into, _planner._alias_reshapes)
    if on:
        _host.plan_copies = lambda *a: None
        _host._transposed_into = lambda *a: False
        _planner._alias_reshapes = lambda steps, *a: steps
    try:
        yield
    finally:
        _host.plan_copies, _host._transposed_into, _planner._alias_reshapes = saved


def load(pte: bytes | str, old: bool, method: str = "forward") -> Any:
    from edgeport.runtime import Runtime

    with numpy_path(old):
        return Runtime.get().load_program(pte).load_method(method, backend_options={"XnnpackBackend":
                                                                                    {"num_threads": 1}})


def ab(runs: dict[bool, Callable[[], float]], rounds: int) -> dict[bool, list[float]]:
    """``runs[old]()`` times one block (seconds per call); blocks interleaved, order flipped each round."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for old in (True, False) if r % 2 == 0 else (False, True):
            with numpy_path(old):
                times[old].append(runs[old]())
    return times


def decoder(scheme: str, pte_dir: Path, rounds: int, new: int) -> str:
    import llm_profile

    path = llm_profile.build(scheme, pte_dir)
    prompt = np.random.default_rng(0).integers(3, 4096, size=32).astype(np.int64)
    methods = {old: load(str(path), old) for old in (True, False)}

    def steps(m: Any, old: bool) -> list[np.ndarray]:
        with numpy_path(old):
            m.execute([prompt.reshape(1, -1), np.arange(prompt.size, dtype=np.int64)])
            return [np.array(m.execute([np.array([[7 + i]], np.int64), np.array([32 + i], np.int64)])[0])
                    for i in range(4)]

    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
               for a, b in zip(steps(methods[True], True), steps(methods[False], False), strict=True))

    def block(m: Any) -> Callable[[], float]:
        def run() -> float:
            m.execute([prompt.reshape(1, -1), np.arange(prompt.size, dtype=np.int64)])
            token, t = 5, time.perf_counter()
            for i in range(new):
                logits = m.execute([np.array([[token]], np.int64), np.array([32 + i], np.int64)])[0]
                token = int(np.argmax(logits.reshape(-1)))
            return (time.perf_counter() - t) / new
        return run

    times = ab({old: block(methods[old]) for old in (True, False)}, rounds)
    return _row(f"medium {scheme} decode step", times, same, "ms", 1e3)


def small(name: str, rounds: int, calls: int) -> str:
    import runtime_peer

    model, inputs = runtime_peer.build(name, "small")
    pte = runtime_peer.lower(model, inputs)
    x = [t.numpy() for t in inputs]
    methods = {old: load(pte, old) for old in (True, False)}
    outs = {}
    for old in (True, False):
        with numpy_path(old):
            outs[old] = [np.array(o) for o in methods[old].execute(x)]
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(outs[True], outs[False],
                                                                                     strict=True))

    def block(m: Any) -> Callable[[], float]:
        def run() -> float:
            for _ in range(5):
                m.execute(x)
            best = float("inf")
            for _ in range(calls):
                t = time.perf_counter()
                m.execute(x)
                best = min(best, time.perf_counter() - t)
            return best
        return run

    times = ab({old: block(methods[old]) for old in (True, False)}, rounds)
    return _row(f"{name} (small) run, min of {calls} per block", times, same, "us", 1e6)


def _row(label: str, times: dict[bool, list[float]], same: bool, unit: str, scale: float) -> str:
    old, new = statistics.median(times[True]) * scale, statistics.median(times[False]) * scale
    return (f"| {label} | {old:.3f} {unit} | {new:.3f} {unit} | {new / old:.2f}x | {'yes' if same else 'NO'} | "
            f"{min(times[True]) * scale:.3f} / {min(times[False]) * scale:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decoders", default="fp32,8da4w")
    ap.add_argument("--small", default="llama,bert,vit,t5_encoder")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--pte-dir", default="/tmp/edgeport-llm-profile")
    args = ap.parse_args()
    pte_dir = Path(args.pte_dir)
    pte_dir.mkdir(parents=True, exist_ok=True)
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    print(f"CPU: {cpu_model()}; flags: {' '.join(x for x in flags if x.startswith(('avx', 'fma', 'amx')))}; "
          f"load average at start {' '.join(f'{v:.2f}' for v in os.getloadavg())}; 1 XNNPACK thread")
    print("| workload | numpy host steps (before) | C host steps (after) | after / before | same bits | "
          "min before / after |")
    print("|---|---:|---:|---:|---|---|")
    for scheme in filter(None, args.decoders.split(",")):
        print(decoder(scheme, pte_dir, args.rounds, args.new), flush=True)
    for name in filter(None, args.small.split(",")):
        print(small(name, args.rounds, args.calls), flush=True)
    print(f"load average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
