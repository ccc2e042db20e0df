"""Partition quality, lowering time and latency on real architectures: edgeport + XNNPACK vs ExecuTorch + XNNPACK.

For every architecture of ``edgeport.testing.architectures.ARCHITECTURES`` (Hugging Face ``transformers`` models
from small configs, random weights) the model is exported once, then lowered by both frameworks with their XNNPACK
partitioners, side by side in one run:

* partitions: delegate calls, and the kernel calls left outside any delegate (by operator), read from each
  framework's ``.pte`` with edgeport's reader (the same count for both);
* lowering time: ``to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer``
  on a fresh deep copy of the exported program, export excluded; median of ``--lower-reps``, interleaved;
* latency: edgeport's program on edgeport's runtime vs ExecuTorch's program on ExecuTorch's runtime (its Python
  bindings, in this process) vs eager PyTorch; median of ``--reps`` calls, timed in blocks of 10 consecutive calls
  of one framework, the blocks rotated, with 0.1 s of rest and 3 warm-up calls before each block (call-by-call
  interleaving measures the other framework's spinning thread pool, not this one: 1.6 ms instead of 0.02 ms for
  the small ResNet).

Usage::

    python bench/architectures.py                 # markdown on stdout
    python bench/architectures.py --write-report  # also rewrite the "## Architectures" section of REPORT.md

ExecuTorch is a benchmark-only dependency here (never imported by edgeport itself).
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime as _dt
import os
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from lowering import loadavg  # noqa: E402  (bench/ is not a package)
from xnnpack_bench.machine import cpu_model  # noqa: E402

SECTION_TITLE = "## Architectures"
BLOCK = 10  # consecutive timed calls of one framework


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return " ".join(f for f in flags if f.startswith(("avx", "fma", "f16c", "amx", "sse4")))
    except OSError:
        pass
    return "unknown"


def program_stats(pte: bytes) -> tuple[int, int, str]:
    """``(delegate calls, kernel calls outside delegates, the kernels by operator)`` of a program's forward."""
    from edgeport.program import load_pte
    from edgeport.program import schema as S

    plan = next(p for p in load_pte(pte).program.execution_plan if p.name == "forward")
    delegates, kernels = 0, collections.Counter[str]()
    for chain in plan.chains:
        for ins in chain.instructions:
            args = ins.instr_args
            if isinstance(args, S.DelegateCall):
                delegates += 1
            elif isinstance(args, S.KernelCall):
                kernels[plan.operators[args.op_index].name.removeprefix("aten::")] += 1
    top = ", ".join(f"{k} {n}" for k, n in kernels.most_common(4))
    return delegates, sum(kernels.values()), top


def lowerers() -> dict[str, Callable[[Any], bytes]]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import to_edge_transform_and_lower as et_lower

    from edgeport import to_edge_transform_and_lower
    from edgeport_xnnpack import XnnpackPartitioner

    return {
        "edgeport": lambda ep: to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer,
        "executorch": lambda ep: et_lower(ep, partitioner=[EtXnnpack()]).to_executorch().buffer,
    }


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name: str, builder: Callable[..., Any], lower_reps: int, reps: int, size: str) -> dict[str, Any]:
    import numpy as np
    import torch
    from executorch.runtime import Runtime as EtRuntime

    from edgeport.runtime import Runtime

    arch = builder(seed=0, size=size)
    model, inputs = arch.model, tuple(arch.example_inputs)
    ep = torch.export.export(model, inputs)
    low = lowerers()
    ptes: dict[str, bytes] = {}
    lower_times: dict[str, list[float]] = {k: [] for k in low}
    for rep in range(lower_reps):
        order = list(low) if rep % 2 == 0 else list(reversed(low))
        for key in order:
            work = copy.deepcopy(ep)
            t0 = time.perf_counter()
            ptes[key] = low[key](work)
            lower_times[key].append(time.perf_counter() - t0)
    np_inputs = [t.numpy() for t in inputs]
    ours = Runtime.get().load_program(ptes["edgeport"]).load_method("forward")
    theirs = EtRuntime.get().load_program(ptes["executorch"]).load_method("forward")
    with torch.no_grad():
        want = model(*inputs).numpy()
    got_ours, got_theirs = ours.execute(np_inputs)[0], theirs.execute(list(inputs))[0].numpy()
    scale = max(1.0, float(np.abs(want).max()))
    runs: dict[str, Callable[[], Any]] = {
        "edgeport": lambda: ours.execute(np_inputs),
        "executorch": lambda: theirs.execute(list(inputs)),
        "eager": lambda: model(*inputs),
    }
    lat: dict[str, list[float]] = {k: [] for k in runs}
    with torch.no_grad():
        for block in range(max(1, reps // BLOCK)):
            keys = list(runs)[block % 3:] + list(runs)[:block % 3]
            for key in keys:
                # The other framework's thread pool spins for a while after its last call (XNNPACK's pthreadpool
                # ~30 ms): let it go idle, warm up, then time a block of calls of this one.
                time.sleep(0.1)
                for _ in range(3):
                    runs[key]()
                lat[key] += [timed(runs[key]) for _ in range(BLOCK)]
    return {
        "name": f"{name} ({size})",
        "stats": {k: program_stats(v) for k, v in ptes.items()},
        "lower": {k: statistics.median(v) for k, v in lower_times.items()},
        "lat": {k: statistics.median(v) * 1e3 for k, v in lat.items()},
        "err": {"edgeport": float(np.abs(got_ours - want).max()) / scale,
                "executorch": float(np.abs(got_theirs - want).max()) / scale},
    }


def render(rows: list[dict[str, Any]], info: dict[str, str], names_note: str) -> str:
    out = [SECTION_TITLE, "",
           f"Measured by `bench/architectures.py` on {info['date']}: {info['cpu']} ({info['nproc']} CPUs; flags: "
           f"{info['flags']}); Python {info['python']}, torch {info['torch']}, executorch {info['executorch']}. "
           f"Load average at start {info['load_start']}, at end {info['load_end']} (shared machine: wall times "
           "carry noise). Both frameworks lower the same exported program with their own XNNPACK partitioner; "
           "latency is edgeport's program on edgeport's runtime vs ExecuTorch's program on ExecuTorch's runtime "
           "(its Python bindings) vs eager PyTorch: medians of blocks of 10 consecutive calls, blocks rotated, 0.1 s rest "
           "and 3 warm-up calls before each block. Error = max |out - eager| / max(1, "
           f"max |eager|). {names_note}", "",
           "### Partitions", "",
           "| model | edgeport delegates | edgeport kernels outside | ExecuTorch delegates | ExecuTorch kernels "
           "outside | edgeport's kernels outside (top) | ExecuTorch's (top) |",
           "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        e, x = r["stats"]["edgeport"], r["stats"]["executorch"]
        out.append(f"| {r['name']} | {e[0]} | {e[1]} | {x[0]} | {x[1]} | {e[2]} | {x[2]} |")
    out += ["", "### Lowering time and latency", "",
            "| model | lower edgeport s | lower ExecuTorch s | ratio | edgeport ms | ExecuTorch ms | eager ms | "
            "vs ExecuTorch | vs eager | error edgeport | error ExecuTorch |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lo, la = r["lower"], r["lat"]
        out.append(f"| {r['name']} | {lo['edgeport']:.2f} | {lo['executorch']:.2f} | "
                   f"{lo['edgeport'] / lo['executorch']:.2f}x | {la['edgeport']:.3f} | {la['executorch']:.3f} | "
                   f"{la['eager']:.3f} | {la['edgeport'] / la['executorch']:.2f}x | "
                   f"{la['edgeport'] / la['eager']:.2f}x | {r['err']['edgeport']:.1e} | "
                   f"{r['err']['executorch']:.1e} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", help="architecture names (default: all)")
    parser.add_argument("--reps", type=int, default=50, help="latency repetitions per model")
    parser.add_argument("--lower-reps", type=int, default=3, help="lowering repetitions per model")
    parser.add_argument("--sizes", nargs="*", default=["small", "medium"],
                        help="config sizes (edgeport.testing.architectures.SIZES)")
    parser.add_argument("--write-report", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import executorch  # noqa: F401
    import torch

    from edgeport.testing.architectures import ARCHITECTURES

    torch.set_num_threads(2)
    from importlib.metadata import version

    info = {"date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu_model(),
            "flags": cpu_flags(), "nproc": str(len(os.sched_getaffinity(0))),
            "python": platform.python_version(), "torch": torch.__version__, "executorch": version("executorch"),
            "load_start": loadavg()}
    names = args.models or list(ARCHITECTURES)
    rows = []
    for size in args.sizes:
        for name in names:
            rows.append(measure(name, ARCHITECTURES[name], args.lower_reps, args.reps, size))
            print(f"{name} ({size}): done", file=sys.stderr)
    info["load_end"] = loadavg()
    from edgeport.testing.architectures import SIZES

    sizes = "; ".join(f"{k}: {', '.join(f'{a} {b}' for a, b in SIZES[k].items())}" for k in args.sizes)
    section = render(rows, info, f"Config sizes ({sizes}).")
    print(section)
    if args.write_report:
        write_section(section, BENCH_DIR / "REPORT.md")
    return 0


def write_section(section: str, path: Path, title: str = SECTION_TITLE) -> None:
    """Replace one benchmark's section (``title``) of ``path`` (or append it), leaving every other section alone."""
    text = path.read_text() if path.exists() else "# edgeport benchmarks\n"
    pattern = re.compile(rf"^{re.escape(title)}[ \t]*\n.*?(?=^## (?!#)|\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section.rstrip("\n") + "\n\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
