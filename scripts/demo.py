"""The main job: export a model, lower it to a backend, save the .pte, run it, print the delegation summary.

Usage: python scripts/demo.py [--model transformer_encoder_layer] [--backend ExampleBackend] [--out out/]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np
import torch

import edgeport
from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport.testing.models import MODELS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="transformer_encoder_layer", choices=sorted(MODELS))
    parser.add_argument("--backend", default="ExampleBackend")
    parser.add_argument("--out", default="out")
    args = parser.parse_args()

    spec = edgeport.get_backend(args.backend)
    model, inputs = MODELS[args.model]()
    print(f"model {args.model}: {sum(p.numel() for p in model.parameters())} parameters")
    ep = torch.export.export(model, inputs)

    start = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=[spec.partitioner()])
    program = edge.to_executorch()
    data = program.buffer
    lower_s = time.perf_counter() - start

    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.model}_{args.backend}.pte"
    program.save(str(path))
    print(f"lowered in {lower_s:.3f} s; wrote {path} ({len(data)} bytes)")
    print(program.delegation_summary())

    method = Runtime.get().load_program(str(path)).load_method("forward")
    np_inputs = [t.numpy() for t in inputs]
    outputs = method.execute(np_inputs)
    with torch.no_grad():
        expected = model(*inputs).numpy()
    error = float(np.max(np.abs(outputs[0] - expected)))
    print(f"ran {path.name} on edgeport's runtime: output {outputs[0].shape}, max |edgeport - eager| = {error:.2e}")
    if error > 1e-4:
        print("FAILED: output differs from eager PyTorch", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
