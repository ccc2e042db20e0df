"""Ethos-U: Vela's estimates for edgeport's TOSA graphs against ExecuTorch's, and the lowering time of both flows.

For each model and target, both frameworks quantize the same exported model (their own Ethos-U quantizer, the
same calibration batches) and lower it with their own ``EthosUPartitioner``; both compile with the same Vela 5.2.0
and flags (ExecuTorch's defaults per target). Read from each run:

* NPU cycles, total cycles, SRAM and off-chip flash used, MACs (Vela's summary CSV; ExecuTorch's is written to
  its intermediate-artifacts directory, edgeport's is kept in the program's named data), summed over delegates
  (SRAM: the largest);
* CPU fallback: ``call_function`` kernels of the program outside any delegate, other than the quantize /
  dequantize at its inputs and outputs (read from the ``.pte`` with edgeport's reader, the same count for both);
* lowering time: ``to_edge_transform_and_lower(ep, partitioner=[EthosUPartitioner(spec)]).to_executorch()`` on
  the quantized exported program, export and calibration excluded; median of ``--reps``, the two interleaved.

Usage::

    python bench/arm.py                 # markdown on stdout
    python bench/arm.py --write-report  # also rewrite the "## Arm Ethos-U" section of REPORT.md
    python bench/arm.py --isolation [--write-report]  # Vela isolation + trial compilation overhead (own section)

ExecuTorch is a benchmark-only dependency here (never imported by edgeport itself).
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime as _dt
import glob
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import cpu_flags, write_section  # noqa: E402  (bench/ is not a package)
from lowering import loadavg  # noqa: E402
from xnnpack_bench.machine import cpu_model  # noqa: E402

SECTION_TITLE = "## Arm Ethos-U"
ISOLATION_TITLE = "## Arm Ethos-U: isolation overhead"
ISOLATION_MODELS = ("keyword_spotter", "mobilenet_v2_96")
TARGETS = ("ethos-u55-128", "ethos-u85-256")
IO_KERNELS = ("quantize_per_tensor", "dequantize_per_tensor")


def models() -> dict[str, Any]:
    from edgeport.testing.models import keyword_spotter, resnet_stack, transformer_encoder_layer
    from edgeport.testing.vision import mobilenet_v2

    return {
        "mobilenet_v2_96": lambda: mobilenet_v2(resolution=96),
        "mobilenet_v2_224": lambda: mobilenet_v2(resolution=224),
        "resnet_stack_32": lambda: resnet_stack(resolution=32),
        "transformer_encoder": transformer_encoder_layer,
        "hf_vit_tiny": hf_vit_tiny,
        "keyword_spotter": keyword_spotter,
    }


def hf_vit_tiny() -> tuple[Any, tuple[Any, ...]]:
    """A Hugging Face ViT from a tiny config with random weights (no download): hidden 32, 1 layer, 2 heads,
    16x16 image in 8x8 patches (5 tokens)."""
    import torch
    import transformers

    class LastHidden(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any) -> Any:
            return self.model(pixel_values=x).last_hidden_state

    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=8, num_channels=3, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LastHidden(transformers.ViTModel(cfg, add_pooling_layer=False).eval()).eval(), (torch.randn(1, 3, 16, 16),)


def _quantize(model: Any, args: tuple, quantizer: Any, calibration: list[tuple], plain_module: bool) -> Any:
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    ep = torch.export.export(model, args)
    module = ep.module() if plain_module else ep.module(check_guards=False)
    prepared = prepare_pt2e(module, quantizer)
    for batch in calibration:
        prepared(*batch)
    return torch.export.export(convert_pt2e(prepared), args)


def cpu_fallback(pte: bytes) -> dict[str, int]:
    from edgeport.program.reader import load_pte

    lp = load_pte(pte)
    out: dict[str, int] = {}
    for plan in lp.program.execution_plan:
        for chain in plan.chains:
            for ins in chain.instructions:
                op_index = getattr(ins.instr_args, "op_index", None)
                if op_index is None:
                    continue
                name = plan.operators[op_index].name
                if not name.endswith(IO_KERNELS):
                    out[name] = out.get(name, 0) + 1
    return out


def edgeport_side(target: str, model: Any, args: tuple, calibration: list[tuple]) -> dict[str, Any]:
    from edgeport import to_edge_transform_and_lower
    from edgeport.program.reader import load_pte
    from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer
    from edgeport_arm.keys import estimates_key

    spec = EthosUCompileSpec(target)
    qep = _quantize(model, args, EthosUQuantizer(spec), calibration, plain_module=True)

    def lower() -> bytes:
        return to_edge_transform_and_lower(copy.deepcopy(qep), partitioner=[EthosUPartitioner(
            spec, cpu_fallback=True)]).to_executorch().buffer

    pte = lower()
    lp = load_pte(pte)
    estimates = []
    for pi, plan in enumerate(lp.program.execution_plan):
        for di in range(len(plan.delegates)):
            estimates.append(json.loads(bytes(lp.named_data(estimates_key(bytes(lp.delegate_data(pi, di)))))))
    return {"lower": lower, "estimates": estimates, "fallback": cpu_fallback(pte)}


def executorch_side(target: str, model: Any, args: tuple, calibration: list[tuple], tmp: str) -> dict[str, Any]:
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from executorch.exir import to_edge_transform_and_lower

    spec = EthosUCompileSpec(target)
    quantizer = EthosUQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    qep = _quantize(model, args, quantizer, calibration, plain_module=False)

    def lower(dump: str | None = None) -> bytes:
        s = EthosUCompileSpec(target)
        if dump is not None:
            s.dump_intermediate_artifacts_to(dump)
        return to_edge_transform_and_lower(copy.deepcopy(qep), partitioner=[EthosUPartitioner(s)]
                                           ).to_executorch().buffer

    pte = lower(tmp)
    estimates = []
    for path in sorted(glob.glob(os.path.join(tmp, "**", "*_summary_*.csv"), recursive=True)):
        with open(path, newline="") as f:
            row = next(csv.DictReader(f))
        estimates.append({"cycles_npu": float(row["cycles_npu"]), "cycles_total": float(row["cycles_total"]),
                          "sram_used_kib": float(row["sram_memory_used"]),
                          "off_chip_flash_used_kib": float(row["off_chip_flash_memory_used"]),
                          "macs": int(float(row["nn_macs"]))})
    return {"lower": lower, "estimates": estimates, "fallback": cpu_fallback(pte)}


def _sum(estimates: list[dict], key: str) -> float:
    return sum(float(e[key]) for e in estimates)


def measure(reps: int, only: set[str] | None) -> list[dict[str, Any]]:
    import torch

    rows = []
    for name, make in models().items():
        if only and name not in only:
            continue
        model, args = make()
        gen = torch.Generator().manual_seed(1)
        calibration = [tuple(torch.randn(a.shape, generator=gen) for a in args) for _ in range(4)] + [args]
        for target in TARGETS:
            with tempfile.TemporaryDirectory() as tmp:
                ours = edgeport_side(target, model, args, calibration)
                try:
                    theirs = executorch_side(target, model, args, calibration, tmp)
                except Exception as e:  # noqa: BLE001  (reported in the table: ExecuTorch's flow failed)
                    theirs = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            times: dict[str, list[float]] = {"edgeport": [], "executorch": []}
            for r in range(reps):
                order = [("edgeport", ours["lower"])] + ([("executorch", theirs["lower"])] if "lower" in theirs else [])
                for label, fn in (order if r % 2 == 0 else order[::-1]):
                    t0 = time.perf_counter()
                    fn()
                    times[label].append(time.perf_counter() - t0)
            rows.append({"model": name, "target": target, "ours": ours, "theirs": theirs,
                         "t_ours": statistics.median(times["edgeport"]) if times["edgeport"] else None,
                         "t_theirs": statistics.median(times["executorch"]) if times["executorch"] else None})
            print(f"# {name} {target} done", file=sys.stderr)
    return rows


def _fmt_fallback(fb: dict[str, int]) -> str:
    return str(sum(fb.values())) + ("" if not fb else " (" + ", ".join(
        f"{k.split('::')[-1].removesuffix('.out')} {v}" for k, v in sorted(fb.items())) + ")")


def _seconds(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None:  # --reps 0: Vela's estimates only, lowering not timed
        return "- | -"
    return f"{ours:.2f} / {theirs:.2f} | {ours / theirs:.2f}x"


def report(rows: list[dict[str, Any]], started: str, seconds: float, reps: int) -> str:
    from importlib.metadata import version

    import torch

    lines = [SECTION_TITLE, "",
             f"Measured by `bench/arm.py` on {started}: {os.cpu_count()} CPUs, {cpu_model()} (flags: {cpu_flags()}); "
             f"torch {torch.__version__}, executorch {version('executorch')}, ethos-u-vela {version('ethos-u-vela')}, "
             f"tosa-tools {version('tosa-tools')}. Whole run {seconds:.0f} s; load average {loadavg()}.", "",
             "Vela's estimates (same Vela, same flags: ExecuTorch's defaults per target) for the graphs each framework "
             "hands it; cycles ratio = edgeport / ExecuTorch (goal <= 1.0x). CPU fallback = kernels left outside the "
             "delegates besides the I/O quantize/dequantize. Lowering time = `to_edge_transform_and_lower(...)"
             ".to_executorch()` on the quantized program, " + (f"median of {reps}, interleaved (goal <= 0.5x)." if reps
             else "not timed in this run (--reps 0)."), "",
             "| model | target | NPU cycles edgeport | ExecuTorch | ratio | total cycles ratio | SRAM KiB edgeport / "
             "ExecuTorch | flash KiB edgeport / ExecuTorch | CPU fallback edgeport | ExecuTorch | lowering s edgeport / "
             "ExecuTorch | ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    failed = []
    for r in rows:
        if "error" in r["theirs"]:
            failed.append(f"{r['model']} on {r['target']}: {r['theirs']['error']}")
            r["theirs"] = {"estimates": [], "fallback": {}}
            r["t_theirs"] = float("nan")
        o, t = r["ours"]["estimates"], r["theirs"]["estimates"]
        cyc_o, cyc_t = _sum(o, "cycles_npu"), _sum(t, "cycles_npu")
        tot_o, tot_t = _sum(o, "cycles_total"), _sum(t, "cycles_total")
        sram_o = max((e["sram_used_kib"] for e in o), default=0.0)
        sram_t = max((e["sram_used_kib"] for e in t), default=0.0)
        ratio = f"{cyc_o / cyc_t:.2f}x" if cyc_t else "n/a"
        tratio = f"{tot_o / tot_t:.2f}x" if tot_t else "n/a"
        lines.append(
            f"| {r['model']} | {r['target']} | {cyc_o:,.0f} | {cyc_t:,.0f} | {ratio} | {tratio} | {sram_o:.1f} / "
            f"{sram_t:.1f} | {_sum(o, 'off_chip_flash_used_kib'):.1f} / {_sum(t, 'off_chip_flash_used_kib'):.1f} | "
            f"{_fmt_fallback(r['ours']['fallback'])} | {_fmt_fallback(r['theirs']['fallback'])} | "
            f"{_seconds(r['t_ours'], r['t_theirs'])} |")
    if failed:
        lines += ["", "ExecuTorch's flow failed (its columns are empty): " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def isolation_overhead(reps: int, target: str = "ethos-u55-128") -> list[dict[str, Any]]:
    """Lowering time of edgeport's Ethos-U flow three ways, interleaved: Vela in this process without trial
    compilation (the flow before isolation), Vela in the isolated worker without trial compilation, and the
    default (isolated, every partition test-compiled while partitioning). Vela's result cache is cleared before
    every lowering; "cold" times the first isolated lowering after the worker was closed (worker start included)."""
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport.isolation import get_worker
    from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer, vela

    rows = []
    for name in ISOLATION_MODELS:
        model, args = models()[name]()
        gen = torch.Generator().manual_seed(1)
        calibration = [tuple(torch.randn(a.shape, generator=gen) for a in args) for _ in range(4)] + [args]
        spec = EthosUCompileSpec(target)
        qep = _quantize(model, args, EthosUQuantizer(spec), calibration, plain_module=True)

        def lower(in_process: bool, trial: bool, qep: Any = qep, spec: Any = spec) -> float:
            vela._CACHE.clear()
            if in_process:
                os.environ["EDGEPORT_ARM_VELA_IN_PROCESS"] = "1"
            try:
                t0 = time.perf_counter()
                to_edge_transform_and_lower(copy.deepcopy(qep), partitioner=[EthosUPartitioner(
                    spec, cpu_fallback=True, trial_compile=trial)]).to_executorch()
                return time.perf_counter() - t0
            finally:
                os.environ.pop("EDGEPORT_ARM_VELA_IN_PROCESS", None)

        get_worker("vela").close()
        cold = lower(False, False)
        modes = {"in_process": (True, False), "isolated": (False, False), "isolated_trial": (False, True)}
        times: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(reps):
            for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                times[m].append(lower(*modes[m]))
        rows.append({"model": name, "target": target, "cold": cold,
                     **{m: statistics.median(t) for m, t in times.items()}})
        print(f"# isolation {name} done", file=sys.stderr)
    return rows


def isolation_report(rows: list[dict[str, Any]], started: str, seconds: float, reps: int) -> str:
    import torch

    lines = [ISOLATION_TITLE, "",
             f"Measured by `bench/arm.py --isolation` on {started}: {os.cpu_count()} CPUs, {cpu_model()}; torch "
             f"{torch.__version__}. Whole run {seconds:.0f} s; load average {loadavg()}.", "",
             "Lowering time (`to_edge_transform_and_lower(...).to_executorch()` on the quantized program, median of "
             f"{reps}, the three flows interleaved, Vela's result cache cleared before each): Vela in this process "
             "without trial compilation (before issue 25), Vela in the isolated worker, and the default: isolated "
             "plus every partition test-compiled while partitioning (its Vela result is reused by preprocess). "
             "Cold: the first isolated lowering after the worker was closed (worker start and Vela's import "
             "included).", "",
             "| model | target | in process s | isolated s | ratio | isolated + trial s | ratio | cold isolated s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = r["in_process"]
        lines.append(f"| {r['model']} | {r['target']} | {base:.2f} | {r['isolated']:.2f} | "
                     f"{r['isolated'] / base:.2f}x | {r['isolated_trial']:.2f} | {r['isolated_trial'] / base:.2f}x | "
                     f"{r['cold']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="timed lowerings per flow (0: Vela's estimates only)")
    parser.add_argument("--models", nargs="*", help="subset of models")
    parser.add_argument("--write-report", action="store_true")
    parser.add_argument("--isolation", action="store_true", help="measure the overhead of isolating Vela")
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    if a.isolation:
        section = isolation_report(isolation_overhead(a.reps), started, time.perf_counter() - t0, a.reps)
        print(section)
        if a.write_report:
            write_section(section, BENCH_DIR / "REPORT.md", ISOLATION_TITLE)
        return 0
    rows = measure(a.reps, set(a.models) if a.models else None)
    section = report(rows, started, time.perf_counter() - t0, a.reps)
    print(section)
    if a.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
