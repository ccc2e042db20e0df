"""Latency of edgeport's runtime vs ExecuTorch's runtime vs eager PyTorch, side by side in one process.

Both runtimes execute the same portable ``.pte`` written by the stock ExecuTorch (``to_edge(...).to_executorch()``,
no delegates); eager is ``torch.no_grad()`` on the same model. Models: MobileNetV2 (224x224), ResNet-18 (224x224),
a 4-layer transformer encoder (d=256, 8 heads, ff=1024, 128 tokens). Prints a markdown table of medians.

    python bench/runtime_latency.py [--reps 5] [--models mobilenet_v2 resnet18 encoder_4layers] [--threads N]

``python bench/runtime_latency.py --peer [args of bench/runtime_peer.py]`` instead measures edgeport's runtime
against executorch-numpy-runtime (ExecuTorch's C++ runtime behind numpy, in its own Python >= 3.12 venv) on the
same XNNPACK-lowered ``.pte`` files: Hugging Face small/medium configs and the CNNs (see bench/runtime_peer.py).

``--threads N`` caps BLAS/OpenMP threads of numpy and torch (set before they are imported). The default is 1:
ExecuTorch's portable kernels are single-threaded, and on a shared machine multi-threaded OpenBLAS/OpenMP spin
and slow down by several times; ``--threads 0`` leaves the libraries' own defaults.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ["mobilenet_v2", "resnet18", "encoder_4layers"]
# ExecuTorch portable latency measured earlier by the team (seconds), for the goal column.
TEAM_ET = {"mobilenet_v2": 1.2, "resnet18": 4.9, "encoder_4layers": 0.36}


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--et-reps", type=int, default=3, help="repetitions for the (slow) ExecuTorch portable runtime")
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads (0: library defaults)")
    ap.add_argument("--no-executorch", action="store_true", help="skip the ExecuTorch runtime column")
    return ap.parse_args()


def _median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    if "--peer" in sys.argv[1:]:
        sys.path.insert(0, str(HERE))
        from runtime_peer import main as peer_main

        sys.exit(peer_main([a for a in sys.argv[1:] if a != "--peer"]))
    args = _parse()
    if args.threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import numpy as np
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = importlib.util.spec_from_file_location("runtime_zoo", HERE.parent / "core/tests/runtime/conftest.py")
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)

    from edgeport.runtime import Runtime

    rows = []
    for name in args.models:
        model, inputs, pte = zoo.cached_executorch_pte(name)
        np_inputs = [t.numpy() for t in inputs]
        t0 = time.perf_counter()
        method = Runtime.get().load_program(pte).load_method("forward")
        load_s = time.perf_counter() - t0
        with torch.no_grad():
            ref = model(*inputs).numpy()
        err = float(np.abs(method.execute(np_inputs)[0] - ref).max())
        ours = _median_time(lambda m=method, x=np_inputs: m.execute(x), args.reps)
        with torch.no_grad():
            eager = _median_time(lambda m=model, x=inputs: m(*x), args.reps)
        et = None
        if not args.no_executorch:
            try:
                from executorch.runtime import Runtime as ETRuntime

                et_method = ETRuntime.get().load_program(pte).load_method("forward")
                et = _median_time(lambda m=et_method, x=list(inputs): m.execute(x), args.et_reps)
            except ImportError:
                et = None
        rows.append((name, ours, et, eager, err, load_s))
        et_txt = "n/a" if et is None else f"{et * 1e3:.1f} ms"
        print(f"# {name}: ours {ours * 1e3:.1f} ms, executorch {et_txt}, eager {eager * 1e3:.1f} ms", file=sys.stderr)

    threads = args.threads or "default"
    print("| model | edgeport runtime | ExecuTorch runtime (portable) | eager PyTorch | edgeport / ExecuTorch "
          "| edgeport / team's ET number | max abs err vs eager | load |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ours, et, eager, err, load_s in rows:
        ratio = f"{ours / et:.3f}x" if et else "n/a"
        team = f"{ours / TEAM_ET[name]:.3f}x" if name in TEAM_ET else "n/a"
        et_txt = f"{et * 1e3:.1f} ms" if et else "n/a"
        print(f"| {name} | {ours * 1e3:.1f} ms | {et_txt} | {eager * 1e3:.1f} ms | {ratio} | {team} | {err:.1e} "
              f"| {load_s * 1e3:.0f} ms |")
    print(f"\nmedians of {args.reps} runs (ExecuTorch: {args.et_reps}); threads: {threads}; goal: edgeport <= 0.2x "
          "of ExecuTorch portable")


if __name__ == "__main__":
    main()
