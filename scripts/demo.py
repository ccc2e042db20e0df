"""The main job: export a model, lower it to a backend, save the .pte, run it, print the delegation summary and
the latency against eager PyTorch.

Usage: python scripts/demo.py [--model mobilenet_v2] [--backend XnnpackBackend] [--out out/] [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

import edgeport
from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport.testing.models import MODELS
from edgeport.testing.vision import LARGE_MODELS

ALL_MODELS = {**MODELS, **LARGE_MODELS}


def _median_ms(fn, runs: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mobilenet_v2", choices=sorted(ALL_MODELS))
    parser.add_argument("--backend", default="XnnpackBackend")
    parser.add_argument("--out", default="out")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()

    spec = edgeport.get_backend(args.backend)
    available, why = spec.is_available()
    if not available:
        print(f"backend {args.backend} is not available: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model, inputs = ALL_MODELS[args.model]()
    print(f"model {args.model}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"input {tuple(inputs[0].shape)}")
    ep = torch.export.export(model, inputs)

    start = time.perf_counter()
    program = to_edge_transform_and_lower(ep, partitioner=[spec.partitioner()]).to_executorch()
    data = program.buffer
    lower_s = time.perf_counter() - start

    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.model}_{args.backend}.pte"
    program.save(str(path))
    print(f"lowered to {args.backend} in {lower_s:.2f} s; wrote {path} ({len(data):,} bytes)")
    print(program.delegation_summary())

    method = Runtime.get().load_program(str(path)).load_method("forward")
    np_inputs = [t.numpy() for t in inputs]
    outputs = method.execute(np_inputs)
    with torch.no_grad():
        expected = model(*inputs).numpy()
    scale = float(np.max(np.abs(expected))) or 1.0
    error = float(np.max(np.abs(outputs[0] - expected))) / scale
    print(f"ran {path.name} on edgeport's runtime: output {outputs[0].shape}, "
          f"max |edgeport - eager| / max |eager| = {error:.1e}")

    with torch.no_grad():
        eager_ms = _median_ms(lambda: model(*inputs), args.runs)
    edgeport_ms = _median_ms(lambda: method.execute(np_inputs), args.runs)
    print(f"latency (median of {args.runs}, {args.threads} threads): edgeport {edgeport_ms:.2f} ms, "
          f"eager PyTorch {eager_ms:.2f} ms, ratio {edgeport_ms / eager_ms:.2f}x")
    if error > 1e-4:
        print("FAILED: output differs from eager PyTorch", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
