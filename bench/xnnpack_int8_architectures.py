"""Architecture suite in int8 on XNNPACK: per architecture, edgeport's flow against ExecuTorch's on the same export.

For every architecture of ``edgeport.testing.architectures.ARCHITECTURES`` (small configs, random weights):

* edgeport: ``XnnpackQuantizer`` (pt2e, calibrated by :func:`edgeport.testing.int8_suite.pt2e_convert`: 4 random
  batches and the example), exported again, ``XnnpackPartitioner``; run on edgeport's runtime and on the stock
  ExecuTorch runtime (a child process). SQNR in dB against fp32 eager, next to the SQNR of the pt2e model itself
  (the done-when: within 1 dB of it) and against the pt2e model.
* ExecuTorch 1.5.1: its ``XNNPACKQuantizer`` (symmetric, per-channel) with the same calibration, its
  ``XnnpackPartitioner``, its runtime; SQNR against eager.

Share = compute ops inside delegates / all compute ops of each framework's lowered edge program (quantize /
dequantize nodes not counted).

Usage::

    python bench/xnnpack_int8_architectures.py                 # markdown on stdout
    python bench/xnnpack_int8_architectures.py --write-report  # also its section of REPORT.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import write_section  # noqa: E402  (bench/ is not a package)
from xnnpack_bench.machine import cpu_model  # noqa: E402

SECTION_TITLE = "## Architecture suite: XNNPACK int8"


def _error(exc: BaseException) -> str:
    return f"no: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def ours(arch: Any, eager: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport.runtime import Runtime
    from edgeport.testing.int8_suite import delegated_ops, pt2e_convert, sqnr_db
    from edgeport.testing.stock_runtime import run_program
    from edgeport_xnnpack import XnnpackPartitioner, XnnpackQuantizer

    inputs = tuple(arch.example_inputs)
    converted = pt2e_convert(arch, XnnpackQuantizer())
    with torch.no_grad():
        oracle = converted(*inputs).numpy()
    row: dict[str, Any] = {"pt2e": sqnr_db(oracle, eager)}
    t0 = time.perf_counter()
    try:
        edge = to_edge_transform_and_lower(torch.export.export(converted, inputs), partitioner=[XnnpackPartitioner()])
        buffer = edge.to_executorch().buffer
    except Exception as exc:  # noqa: BLE001 - a failed cell is a row, not the end of the run
        return {**row, "lowered": _error(exc)}
    row.update(lowered="yes", seconds=time.perf_counter() - t0, ops=delegated_ops(edge))
    got = np.asarray(Runtime.get().load_program(buffer).load_method("forward").execute(
        [t.numpy() for t in inputs])[0])
    row.update(ran="yes", sqnr=sqnr_db(got, eager), vs_pt2e=sqnr_db(got, oracle))
    stock = run_program(buffer, list(inputs))
    row["stock"] = sqnr_db(np.asarray(stock.outputs[0]), eager) if stock.ok else f"no: {stock.error or stock.crash}"
    return row


def theirs(arch: Any, eager: Any) -> dict[str, Any]:
    import numpy as np
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from edgeport.testing.int8_suite import delegated_ops, pt2e_convert, sqnr_db

    inputs = tuple(arch.example_inputs)
    t0 = time.perf_counter()
    try:
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        converted = pt2e_convert(arch, quantizer)
        edge = to_edge_transform_and_lower(torch.export.export(converted, inputs), partitioner=[XnnpackPartitioner()])
        buffer = edge.to_executorch().buffer
    except Exception as exc:  # noqa: BLE001
        return {"lowered": _error(exc)}
    row: dict[str, Any] = {"lowered": "yes", "seconds": time.perf_counter() - t0, "ops": delegated_ops(edge)}
    try:
        method = Runtime.get().load_program(buffer).load_method("forward")
        row["sqnr"] = sqnr_db(np.asarray(method.execute(list(inputs))[0]), eager)
    except Exception as exc:  # noqa: BLE001
        row["sqnr"] = _error(exc)
    return row


def _pct(row: dict[str, Any]) -> str:
    if "ops" not in row:
        return "-"
    inside, total = row["ops"]
    return f"{inside / max(1, total):.1%} ({inside}/{total})"


def _db(v: Any) -> str:
    return v if isinstance(v, str) else "-" if v is None else "exact" if v == float("inf") else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-report", action="store_true")
    ap.add_argument("--only", nargs="*", help="architecture names")
    ap.add_argument("--no-executorch", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    from edgeport.testing.architectures import ARCHITECTURES, eager_outputs

    torch.set_num_threads(1)
    load0, t0 = os.getloadavg(), time.perf_counter()
    lines = []
    for name in args.only or sorted(ARCHITECTURES):
        arch = ARCHITECTURES[name]()
        eager = eager_outputs(arch)
        q = ours(arch, eager)
        et = {} if args.no_executorch else theirs(arch, eager)
        within = "-" if not isinstance(q.get("sqnr"), float) else "yes" if q["sqnr"] >= q["pt2e"] - 1.0 else "**no**"
        lines.append(f"| {name} | {q.get('lowered', '-')} | {q.get('ran', '-')} | {_db(q.get('sqnr'))} | "
                     f"{_db(q.get('pt2e'))} | {within} | {_db(q.get('vs_pt2e'))} | {_db(q.get('stock'))} | {_pct(q)} | "
                     f"{et.get('lowered', '-')} | {_db(et.get('sqnr'))} | {_pct(et)} |")
        print(lines[-1], flush=True)
    from importlib.metadata import version

    when = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"{SECTION_TITLE}\n\nMeasured by `bench/xnnpack_int8_architectures.py` on {when}: {os.cpu_count()} CPUs, "
        f"{cpu_model()}; torch {torch.__version__}, torchao {version('torchao')}, executorch {version('executorch')}. "
        f"Whole run {time.perf_counter() - t0:.0f} s; load average {' '.join(f'{x:.2f}' for x in load0)} at the "
        f"start, {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end. Small configs, random weights "
        "(`edgeport.testing.architectures.ARCHITECTURES`), pt2e calibrated on 4 random batches and the example "
        "(`edgeport.testing.int8_suite`). SQNR in dB against fp32 eager: edgeport's program on edgeport's runtime, "
        "its pt2e model (what XNNPACK must reproduce; done-when: within 1 dB), edgeport against its pt2e model, "
        "edgeport's program on the stock ExecuTorch runtime; ExecuTorch: its quantizer (symmetric, per-channel), "
        "partitioner and runtime on the same export. Share = compute ops inside delegates / all compute ops "
        "(quantize / dequantize not counted), on each framework's lowered edge program.\n\n"
        "| model | lowered | ran | SQNR | pt2e SQNR | within 1 dB | vs pt2e | stock runtime SQNR | share delegated | "
        "ExecuTorch lowered | ExecuTorch SQNR | ExecuTorch share |\n"
        "|---|---|---|---:|---:|---|---:|---:|---:|---|---:|---:|\n" + "\n".join(lines) + "\n")
    print(section)
    if args.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
