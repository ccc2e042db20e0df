"""Architecture suite on Arm (Ethos-U int8, TOSA FP): edgeport vs ExecuTorch 1.5.1's Arm partitioners on the same exports.

For every architecture of ``edgeport.testing.architectures.ARCHITECTURES`` (small configs, random weights):

* Ethos-U int8 (``--target``, default ethos-u55-128): the model is exported once; edgeport quantizes it with its
  ``EthosUQuantizer`` (pt2e: 4 random calibration batches, then the example) and lowers the converted model with
  ``EthosUPartitioner(spec, cpu_fallback=True)`` (Vela in its isolated worker), runs it on edgeport's runtime
  (Arm's TOSA reference model executes the delegates), and reports its SQNR against fp32 eager next to the
  pt2e-converted model's own SQNR against eager (done-when: within 1 dB) and against the pt2e model. ExecuTorch
  quantizes the same export with its ``EthosUQuantizer`` (symmetric config, same calibration batches) and lowers
  with its ``EthosUPartitioner`` (Vela too; lowering only: its Ethos-U runtime needs an FVP).
* TOSA FP (``TOSA-1.0+FP``): edgeport's ``TOSAPartitioner`` on the float export, run on the reference model, error
  = max |out - eager| / max(1, max |eager|) (done-when: <= 1e-3); ExecuTorch's ``TOSAPartitioner`` lowering only.

Share = compute ops (``call_function`` nodes other than ``getitem`` and the quantize / dequantize nodes) inside
delegates / all compute ops, counted on each framework's own edge program after lowering.

Usage::

    python bench/arm_architectures.py                 # markdown on stdout
    python bench/arm_architectures.py --write-report  # also its section of REPORT.md
    python bench/arm_architectures.py --executorch-cache /tmp/et_arm.json  # ExecuTorch's results cached

ExecuTorch is a benchmark-only dependency here (never imported by edgeport itself).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import write_section  # noqa: E402  (bench/ is not a package)
from lowering import loadavg  # noqa: E402
from xnnpack_bench.machine import cpu_model  # noqa: E402

from edgeport.testing.int8_suite import calibration_inputs, delegated_ops, sqnr_db  # noqa: E402

SECTION_TITLE = "## Architecture suite: Arm Ethos-U"
def _error(exc: BaseException) -> str:
    return f"no: {type(exc).__name__}: {' '.join(str(exc).split())[:140]}"


def _run(buffer: bytes, inputs: tuple[Any, ...]) -> Any:
    import numpy as np

    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    return np.asarray(method.execute([t.numpy() for t in inputs])[0])


def ours_int8(arch: Any, target: str) -> dict[str, Any]:
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from edgeport import to_edge_transform_and_lower
    from edgeport.testing.architectures import eager_outputs
    from edgeport_arm import EthosUCompileSpec, EthosUPartitioner, EthosUQuantizer

    row: dict[str, Any] = {}
    inputs = tuple(arch.example_inputs)
    eager = eager_outputs(arch)
    spec = EthosUCompileSpec(target)
    try:
        prepared = prepare_pt2e(torch.export.export(arch.model, inputs).module(), EthosUQuantizer(spec))
        for batch in calibration_inputs(arch):
            prepared(*batch)
        converted = convert_pt2e(prepared)
        with torch.no_grad():
            oracle = converted(*inputs).numpy()
        row["pt2e_sqnr"] = sqnr_db(oracle, eager)
        partitioner = EthosUPartitioner(spec, cpu_fallback=True)
        t0 = time.perf_counter()
        edge = to_edge_transform_and_lower(torch.export.export(converted, inputs), partitioner=[partitioner])
        inside, total = delegated_ops(edge)
        outside = total - inside
        buffer = edge.to_executorch().buffer
        row["seconds"] = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - a failed lowering is a result of the benchmark
        row["lowered"] = _error(exc)
        return row
    row.update(lowered="yes", share=inside / max(1, inside + outside), ops=(inside, outside),
               refusals=len(partitioner.refusals))
    try:
        got = _run(buffer, inputs)
        row.update(ran="yes", sqnr=sqnr_db(got, eager), vs_pt2e=sqnr_db(got, oracle))
    except Exception as exc:  # noqa: BLE001
        row["ran"] = _error(exc)
    return row


def ours_fp(arch: Any) -> dict[str, Any]:
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport.testing.architectures import eager_outputs, scale_error
    from edgeport_arm import TosaCompileSpec, TOSAPartitioner

    row: dict[str, Any] = {}
    inputs = tuple(arch.example_inputs)
    try:
        edge = to_edge_transform_and_lower(torch.export.export(arch.model, inputs),
                                           partitioner=[TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))])
        inside, total = delegated_ops(edge)
        outside = total - inside
        buffer = edge.to_executorch().buffer
    except Exception as exc:  # noqa: BLE001
        row["lowered"] = _error(exc)
        return row
    row.update(lowered="yes", share=inside / max(1, inside + outside), ops=(inside, outside))
    try:
        row.update(ran="yes", error=scale_error(_run(buffer, inputs), eager_outputs(arch)))
    except Exception as exc:  # noqa: BLE001
        row["ran"] = _error(exc)
    return row


def theirs(arch: Any, what: str, target: str) -> dict[str, Any]:
    """ExecuTorch's Arm flow on the same export: ``what`` = "int8" (Ethos-U ``target``) or "fp" (TOSA FP)."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    inputs = tuple(arch.example_inputs)
    try:
        ep = torch.export.export(arch.model, inputs)
        if what == "int8":
            from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
            from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

            spec = EthosUCompileSpec(target)
            quantizer = EthosUQuantizer(spec)
            quantizer.set_global(get_symmetric_quantization_config())
            prepared = prepare_pt2e(ep.module(check_guards=False), quantizer)
            for batch in calibration_inputs(arch):
                prepared(*batch)
            ep = torch.export.export(convert_pt2e(prepared), inputs)
            partitioner = EthosUPartitioner(spec)
        else:
            from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
            from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

            partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))
        program = to_edge_transform_and_lower(ep, partitioner=[partitioner]).exported_program()
    except Exception as exc:  # noqa: BLE001
        return {"lowered": _error(exc)}
    inside, total = delegated_ops(program)
    outside = total - inside
    return {"lowered": "yes", "share": inside / max(1, inside + outside), "ops": (inside, outside)}


def _pct(row: dict[str, Any]) -> str:
    if "share" not in row:
        return "-"
    inside, outside = row["ops"]
    return f"{row['share']:.1%} ({inside}/{inside + outside})"


def _db(v: float | None) -> str:
    return "-" if v is None else ("exact" if v == float("inf") else f"{v:.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-report", action="store_true")
    ap.add_argument("--target", default="ethos-u55-128")
    ap.add_argument("--no-executorch", action="store_true", help="do not lower with ExecuTorch (cached results are "
                    "still shown)")
    ap.add_argument("--no-fp", action="store_true", help="skip TOSA FP")
    ap.add_argument("--no-int8", action="store_true", help="skip Ethos-U int8 (e.g. to run the FP table in another "
                    "process)")
    ap.add_argument("--only", nargs="*", help="architecture names")
    ap.add_argument("--executorch-cache", type=Path, help="JSON file of ExecuTorch's results, read and extended (its "
                    "lowering does not depend on edgeport's code)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)
    from edgeport.testing.architectures import ARCHITECTURES

    cache: dict[str, Any] = {}
    if args.executorch_cache and args.executorch_cache.exists():
        cache = json.loads(args.executorch_cache.read_text())

    def executorch(arch: Any, name: str, what: str) -> dict[str, Any]:
        key = f"{name}/{what}/{args.target if what == 'int8' else 'TOSA-1.0+FP'}"
        if args.no_executorch:
            return cache.get(key, {})
        if key not in cache:
            cache[key] = theirs(arch, what, args.target)
            if args.executorch_cache:
                args.executorch_cache.write_text(json.dumps(cache, indent=1))
        return cache[key]

    names = [n for n in ARCHITECTURES if not args.only or n in args.only]
    start = _dt.datetime.now(_dt.UTC)
    t0 = time.perf_counter()
    q_rows, fp_rows = [], []
    for name in names:
        arch = ARCHITECTURES[name]()
        try:
            q = {"lowered": "-"} if args.no_int8 else ours_int8(arch, args.target)
            et_q = {} if args.no_int8 else executorch(arch, name, "int8")
            fp = {} if args.no_fp else ours_fp(arch)
            et_fp = {} if args.no_fp else executorch(arch, name, "fp")
        except Exception:  # noqa: BLE001 - keep going, show the failure
            traceback.print_exc()
            continue
        within = "-" if "sqnr" not in q else ("yes" if q["sqnr"] >= q["pt2e_sqnr"] - 1.0 else "**no**")
        if not args.no_int8:
            q_rows.append(f"| {name} | {q['lowered']} | {q.get('ran', '-')} | {_db(q.get('sqnr'))} | "
                          f"{_db(q.get('pt2e_sqnr'))} | {within} | {_db(q.get('vs_pt2e'))} | {_pct(q)} | "
                          f"{et_q.get('lowered', '-')} | {_pct(et_q)} |")
            print(q_rows[-1], file=sys.stderr, flush=True)
        if not args.no_fp:
            err = f"{fp['error']:.1e}" if "error" in fp else "-"
            fp_rows.append(f"| {name} | {fp['lowered']} | {fp.get('ran', '-')} | {err} | {_pct(fp)} | "
                           f"{et_fp.get('lowered', '-')} | {_pct(et_fp)} |")
            print(fp_rows[-1], file=sys.stderr, flush=True)
    from importlib.metadata import version

    import torch

    lines = [SECTION_TITLE, "",
             f"Measured by `bench/arm_architectures.py` on {start:%Y-%m-%d %H:%M} UTC: {os.cpu_count()} CPUs, "
             f"{cpu_model()}; torch {torch.__version__}, ethos-u-vela {version('ethos-u-vela')}, tosa-tools "
             f"{version('tosa-tools')}, executorch {version('executorch')}. Whole run {time.perf_counter() - t0:.0f} s; "
             f"load average {loadavg()}. `edgeport.testing.architectures.ARCHITECTURES`, small configs (hidden 32, "
             "2 layers), random weights. Share = compute ops inside delegates / all compute ops (quantize / "
             "dequantize nodes not counted), on each framework's own lowered edge program (inside/all). ExecuTorch: "
             "its own quantizer and partitioner on the same export, lowering only.", "",
             f"### Ethos-U int8 ({args.target})", "",
             "SQNR in dB against fp32 eager on the example input: edgeport's program on its runtime (delegates on Arm's "
             "TOSA reference model), the pt2e-converted model (edgeport's quantizer, 4 random calibration batches "
             "and the example), whether edgeport is within 1 dB of it, and edgeport against the pt2e model.", "",
             "| model | lowered | ran | SQNR | pt2e SQNR | within 1 dB | vs pt2e | share delegated | ExecuTorch lowered "
             "| ExecuTorch share |",
             "|---|---|---|---:|---:|---|---:|---:|---|---:|", *q_rows, ""]
    if not args.no_fp:
        lines += ["### TOSA FP (TOSA-1.0+FP)", "",
                  "Error = max |out - eager| / max(1, max |eager|) on edgeport's runtime (Arm's TOSA reference model).",
                  "", "| model | lowered | ran | error | share delegated | ExecuTorch lowered | ExecuTorch share |",
                  "|---|---|---|---:|---:|---|---:|", *fp_rows, ""]
    section = "\n".join(lines)
    print(section)
    if args.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
