"""The 8da4w decode step's dynamically quantized products (``qd8 x qb4w``, int4 weights in groups of 32) on
edgeport's ``_qd8`` host kernel against ExecuTorch's XNNPACK (its ``qd8-f32-qb4w`` GEMM microkernels), same
shapes, same process, one thread, interleaved.

For each shape a module of ``copies`` ``Linear(k, n, bias=False)`` reading the same input (as many as a decode step
of ``bench/llm.py``'s ``medium`` decoder has: hidden 512 x 4 layers, 8 / 2 heads, FFN 1536, vocab 4096) is
quantized with torchao's ``Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32))``, lowered with ExecuTorch's
``XnnpackPartitioner`` and run through ``executorch.runtime`` (one delegate call per ``execute``). edgeport runs
``_qd8.fc4`` once per Linear on the same int4 values and bf16-rounded scales (what the blob stores), packed once as
the executor does at load. Row ``step`` holds all 29 products of a decode step in one program. Times are per
``execute`` / per set of calls, each call timed alone in ``--rounds`` interleaved blocks: medians and 10th
percentiles of the wall time, and medians of the thread's CPU time (which leaves out time preempted by other
processes on a shared machine); "call" is ExecuTorch's cost of one ``execute`` of a one-product 32 -> 16 program
(Python binding, tensor wrapping), so the small shapes can be read with and without it. Outputs are compared (relative max difference; the two differ only in float32 order).

Usage: ``python bench/qd8_products.py [--rows 1 32] [--rounds 15] [--calls 50]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from llm import _flags  # noqa: E402
from xnnpack_bench.machine import cpu_model, loadavg  # noqa: E402

#: name -> [(k, n, copies)] products reading one input each (the medium decoder's decode step)
SHAPES: dict[str, list[tuple[int, int, int]]] = {
    "q/o 512->512": [(512, 512, 8)],
    "k/v 512->128": [(512, 128, 8)],
    "gate/up 512->1536": [(512, 1536, 8)],
    "down 1536->512": [(1536, 512, 4)],
    "head 512->4096": [(512, 4096, 1)],
    "step (all 29)": [(512, 512, 8), (512, 128, 8), (512, 1536, 8), (1536, 512, 4), (512, 4096, 1)],
}
GROUP = 32
_KEEP: list[bytes] = []


class Products:
    """``copies`` bias-free linears per (k, n) entry, each reading the entry's input; outputs in order."""

    def __init__(self, spec: list[tuple[int, int, int]], seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.spec = spec
        self.module = _Module(spec)

    def inputs(self, rows: int, seed: int) -> list[Any]:
        import torch

        g = torch.Generator().manual_seed(seed)
        return [torch.randn(rows, k, generator=g) * 2 + 0.3 for k, _, _ in self.spec]


def _Module(spec: list[tuple[int, int, int]]) -> Any:
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.ModuleList(torch.nn.Linear(k, n, bias=False) for _ in range(c))
                                            for k, n, c in spec)

        def forward(self, *xs: Any) -> Any:
            return tuple(lin(x) for x, lins in zip(xs, self.lins, strict=True) for lin in lins)

    return M().eval()


def quantize(module: Any) -> None:
    import torch
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(GROUP)))


def et_method(module: Any, example: list[Any]) -> Any:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    ep = torch.export.export(module, tuple(example))
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    _KEEP.append(pte)  # the loaded program reads the buffer in place
    return Runtime.get().load_program(pte).load_method("forward")


def edgeport_calls(module: Any, rows: int) -> list[Any]:
    """One closure per linear (in output order): ``_qd8.fc4`` on the packed filter, output preallocated."""
    import torch

    from edgeport_xnnpack import _qd8
    from edgeport_xnnpack._dynamic_quant import Qd8Weights
    from edgeport_xnnpack._host_qd8 import packed_filter
    from edgeport_xnnpack.preprocess.affine_quantized import pack_int4

    calls = []
    for i, lins in enumerate(module.lins):
        for lin in lins:
            w = lin.weight
            q = w.qdata.numpy().astype(np.int8)
            n, k = q.shape
            scales = w.scale.to(torch.bfloat16).float().numpy().reshape(n, k // GROUP).astype(np.float32)
            qw = Qd8Weights(pack_int4(q), np.ascontiguousarray(scales), None, 4, GROUP, k, n)
            packed, out = packed_filter(qw), np.empty((rows, n), np.float32)
            calls.append((i, out, lambda x, p=packed, o=out, k=k, n=n: _qd8.fc4(
                x, p, None, o, rows, k, n, GROUP, -np.inf, np.inf)))
    return calls


def _block(fn: Any, calls: int, wall: list[float], cpu: list[float]) -> None:
    """``calls`` calls of ``fn``, each timed alone: wall time and this thread's CPU time (us)."""
    for _ in range(calls):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c) * 1e6)
        wall.append((time.perf_counter() - t) * 1e6)


def _q(v: list[float], f: float) -> float:
    return sorted(v)[int(f * (len(v) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    args = ap.parse_args()

    import torch
    from executorch.extension.pybindings import portable_lib

    from edgeport_xnnpack import _qd8

    if hasattr(portable_lib, "_unsafe_reset_threadpool"):
        portable_lib._unsafe_reset_threadpool(1)
    torch.set_num_threads(1)
    print(f"CPU: {cpu_model()}; flags: {_flags()}; _qd8 loop: {_qd8.simd()}; 1 thread; load before: {loadavg()}")
    tiny = Products([(32, 16, 1)], seed=9)
    quantize(tiny.module)
    tiny_in = tiny.inputs(1, seed=1)
    tiny_m = et_method(tiny.module, tiny_in)
    print(f"{'':<24} {'ExecuTorch (us per execute)':^32} {'edgeport (us per set)':^24} {'edgeport / ET':^20}")
    print(f"{'shape':<20} {'M':>3} {'median':>8} {'p10':>7} {'cpu':>8} {'call':>7} {'median':>8} {'p10':>7} "
          f"{'cpu':>8} {'wall':>6} {'cpu':>6} {'cpu-c':>6} {'rel diff':>9}")
    for name in args.shapes:
        prod = Products(SHAPES[name], seed=0)
        quantize(prod.module)
        for rows in args.rows:
            xs = prod.inputs(rows, seed=rows)
            method = et_method(prod.module, xs)
            calls = edgeport_calls(prod.module, rows)
            xs_np = [x.numpy() for x in xs]

            def run_ours(calls: list[Any] = calls, xs_np: list[np.ndarray] = xs_np) -> None:
                for i, _, fn in calls:
                    fn(xs_np[i])

            def run_et(method: Any = method, xs: list[Any] = xs) -> Any:
                return method.execute(xs)

            theirs = run_et()
            run_ours()
            diff = max(float(np.abs(o - t.numpy()).max() / max(np.abs(t.numpy()).max(), 1e-30))
                       for (_, o, _), t in zip(calls, theirs, strict=True))
            t: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in ("et", "ours", "call")}
            for r in range(args.rounds):
                order = (("et", run_et), ("ours", run_ours)) if r % 2 == 0 else (("ours", run_ours), ("et", run_et))
                for c, fn in order:
                    _block(fn, args.calls, *t[c])
                _block(lambda: tiny_m.execute(tiny_in), args.calls, *t["call"])
            et, ours, call = (statistics.median(t[c][0]) for c in ("et", "ours", "call"))
            et_c, ours_c, call_c = (statistics.median(t[c][1]) for c in ("et", "ours", "call"))
            print(f"{name:<20} {rows:>3} {et:>8.1f} {_q(t['et'][0], 0.1):>7.1f} {et_c:>8.1f} {call_c:>7.1f} "
                  f"{ours:>8.1f} {_q(t['ours'][0], 0.1):>7.1f} {ours_c:>8.1f} {ours / et:>6.2f} "
                  f"{ours_c / et_c:>6.2f} {ours_c / max(et_c - call_c, 1e-9):>6.2f} {diff:>9.2e}", flush=True)
    print(f"load after: {loadavg()}. Per-call samples ({args.rounds} interleaved rounds x {args.calls} calls): median and "
          f"10th percentile of the wall time, median of this thread's CPU time (not counting time preempted by other "
          f"processes); 'call': ExecuTorch's CPU time for one execute of a 32 -> 16 program; ratios < 1: edgeport "
          f"faster; 'cpu-c': against ExecuTorch's CPU time less one call")


if __name__ == "__main__":
    main()
