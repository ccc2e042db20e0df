"""VulkanBackend latency and overhead on this machine's Vulkan device (lavapipe here: a CPU pretending to be a GPU).

For each model: edgeport + VulkanBackend on edgeport's runtime, against edgeport's portable runtime and eager
PyTorch on the same 2 cores; medians of ``--reps`` calls, the three interleaved in blocks of 5. Also: load time
(``load_program`` + ``load_method``: blob validation, buffer planning, weight upload, command recording), dispatches
per delegate call and submits per inference, and the per-run time spent outside the recorded command buffer's
submit-and-wait (input/output copies, the runtime's own work) as a share of the run -- the part that is real on any
device (goal < 5% of a MobileNetV2 run). Absolute numbers on lavapipe say nothing about a GPU.

Usage::

    python bench/vulkan_latency.py                 # markdown on stdout
    python bench/vulkan_latency.py --write-report  # also rewrite the "## Vulkan" section of REPORT.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import cpu_flags, write_section  # noqa: E402  (bench/ is not a package)
from lowering import loadavg  # noqa: E402
from xnnpack_bench.machine import cpu_model  # noqa: E402

SECTION_TITLE = "## Vulkan"
BLOCK = 5


def models() -> dict[str, Any]:
    from edgeport.testing.models import mlp, transformer_encoder_layer
    from edgeport.testing.vision import mobilenet_v2

    return {"mlp": mlp, "transformer_encoder_layer": transformer_encoder_layer,
            "mobilenet_v2_96": lambda: mobilenet_v2(resolution=96)}


class _SubmitTimer:
    """Bench-only: time spent inside ``Recording.run`` (submit + wait of the recorded command buffer)."""

    def __init__(self) -> None:
        from edgeport_vulkan import device

        self.cls = getattr(device, "Recording", None)
        self.seconds = 0.0
        self.calls = 0
        if self.cls is not None:
            original = self.cls.run

            def run(rec: Any, *a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return original(rec, *a, **k)
                finally:
                    self.seconds += time.perf_counter() - t0
                    self.calls += 1

            self.cls.run = run  # type: ignore[method-assign]


def measure(name: str, make: Any, reps: int, timer: _SubmitTimer) -> dict[str, Any]:
    import numpy as np
    import torch

    from edgeport import to_edge, to_edge_transform_and_lower
    from edgeport.runtime import Runtime
    from edgeport_vulkan import VulkanPartitioner

    model, args = make()
    ep = torch.export.export(model, args)
    vk = to_edge_transform_and_lower(ep, partitioner=[VulkanPartitioner()]).to_executorch()
    portable = to_edge(ep).to_executorch()
    inputs = [a.numpy() for a in args]
    t0 = time.perf_counter()
    vk_method = Runtime.get().load_program(vk.buffer).load_method("forward")
    load_s = time.perf_counter() - t0
    port_method = Runtime.get().load_program(portable.buffer).load_method("forward")
    delegates = vk_method.profile.delegates
    dispatches = [int(d.execution.split(" dispatches")[0].rsplit(" ", 1)[-1]) for d in delegates
                  if "dispatches" in d.execution]
    got, want = vk_method.execute(inputs)[0], model(*args).detach().numpy()
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-12))
    runs = {"vulkan": [], "portable": [], "eager": []}
    fns = {"vulkan": lambda: vk_method.execute(inputs), "portable": lambda: port_method.execute(inputs),
           "eager": lambda: model(*args)}
    inside = []
    with torch.no_grad():
        for r in range(max(1, reps // BLOCK)):
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]
            for label in order:
                fns[label]()  # warm-up
                for _ in range(BLOCK):
                    s0 = timer.seconds
                    t = time.perf_counter()
                    fns[label]()
                    runs[label].append(time.perf_counter() - t)
                    if label == "vulkan":
                        inside.append(timer.seconds - s0)
    med = {k: statistics.median(v) for k, v in runs.items()}
    overhead = statistics.median(r - i for r, i in zip(runs["vulkan"], inside, strict=True))
    summary = vk.delegation_summary()
    portable_kernels = sum(int(line.rsplit(": ", 1)[-1]) for line in summary.splitlines()
                           if line.strip().startswith("portable"))
    return {"model": name, "load_s": load_s, "dispatches": sum(dispatches), "delegates": len(delegates),
            "portable_kernels": portable_kernels, "err": err, "med": med, "overhead_s": overhead}


def report(rows: list[dict[str, Any]], started: str, seconds: float, device: str, reps: int) -> str:
    import torch

    lines = [SECTION_TITLE, "",
             f"Measured by `bench/vulkan_latency.py` on {started}: {os.cpu_count()} CPUs, {cpu_model()} (flags: {cpu_flags()}); "
             f"Vulkan device: {device}; torch {torch.__version__}. Whole run {seconds:.0f} s; load average "
             f"{loadavg()}.", "",
             "lavapipe runs the shaders on the same 2 CPU cores, so the latency ratios compare a CPU pretending to be "
             "a GPU with real CPU code: they say nothing about a GPU. What carries over to any device is the per-run "
             "work outside the submit-and-wait of the recorded command buffer (input / output copies, the runtime): "
             f"its share of the run is the last column. Medians of {reps} calls, the three interleaved in blocks of "
             f"{BLOCK}; error = max |edgeport Vulkan - eager| / max |eager|.", "",
             "| model | delegates | dispatches | submits / run | kernels outside | load ms | Vulkan ms | portable ms | "
             "eager ms | Vulkan / eager | Vulkan / portable | outside submit ms | share | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m = r["med"]
        lines.append(
            f"| {r['model']} | {r['delegates']} | {r['dispatches']} | {r['delegates']} | {r['portable_kernels']} | "
            f"{r['load_s'] * 1e3:.1f} | {m['vulkan'] * 1e3:.2f} | {m['portable'] * 1e3:.2f} | {m['eager'] * 1e3:.2f} | "
            f"{m['vulkan'] / m['eager']:.2f}x | {m['vulkan'] / m['portable']:.2f}x | {r['overhead_s'] * 1e3:.3f} | "
            f"{r['overhead_s'] / m['vulkan'] * 100:.1f}% | {r['err']:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--write-report", action="store_true")
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    from edgeport_vulkan.device import VulkanDevice

    info = VulkanDevice.get().info
    timer = _SubmitTimer()
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    rows = [measure(name, make, a.reps, timer) for name, make in models().items()]
    section = report(rows, started, time.perf_counter() - t0, f"{info.name} ({info.device_type})", a.reps)
    print(section)
    if a.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
