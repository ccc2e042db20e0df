"""Architecture suite on QNN (HTP emulator): per architecture, fp32 and 8a8w, lowered / ran / error or SQNR / share.

For every architecture of ``edgeport.testing.architectures.ARCHITECTURES`` (small configs, random weights):

* fp32: ``edgeport.lower(model, inputs, backends=["QnnBackend"])``, run on edgeport's runtime (Qualcomm's HTP
  emulator); error = max |out - eager| / max(1, max |eager|) (the suite's done-when: <= 1e-3).
* 8a8w: ``QnnQuantizer`` (pt2e, calibrated on 4 random batches and the example, as
  ``backends-qnn/tests/test_soc_architectures.py`` does), ``convert_pt2e``, exported again and lowered with
  ``QnnPartitioner``; SQNR of QNN's output against eager next to the SQNR the converted (pt2e) model itself reaches
  against eager (the done-when: QNN within 1 dB of it), and QNN against the pt2e model.

All fp32 cells run before any 8a8w program is executed: running a quantized program creates a SoC-configured HTP
device in this process, after which the emulator prepares float32 graphs at fp16-like precision
(docs/backends/qnn.md, "Devices and precision"). ExecuTorch 1.5.1's ``QnnPartitioner`` cannot lower here: it needs
Qualcomm's QAIRT SDK (``QNN_SDK_ROOT``; without it, it tries to download QAIRT 2.37 and libc++ and fails), so
there is no ExecuTorch column.

Usage::

    python bench/qnn_architectures.py                  # markdown on stdout
    python bench/qnn_architectures.py --write-report   # also its section of REPORT.md
    python bench/qnn_architectures.py --only mobilenet_v2_seg resnet
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

from edgeport.testing.int8_suite import sqnr_db  # noqa: E402

SECTION_TITLE = "## Architecture suite: QNN"


def _fail(exc: BaseException) -> str:
    return f"no: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


def _run(buffer: bytes, inputs: Any) -> Any:
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    return method.execute([t.numpy() for t in inputs])[0]


def fp32(arch: Any) -> dict[str, Any]:
    import edgeport
    from edgeport.testing.architectures import eager_outputs, scale_error

    row: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        manager = edgeport.lower(arch.model, arch.example_inputs, backends=["QnnBackend"])
    except Exception as exc:  # noqa: BLE001 - a failed lowering is a result of the benchmark
        return {"lowered": _fail(exc)}
    report = manager.lowering_report
    inside, outside = sum(o for b, o in report.delegates if b == "QnnBackend"), len(report.portable_ops)
    row.update(lowered="yes", seconds=time.perf_counter() - start, ops=(inside, outside),
               delegates=len(report.delegates), cpu_ops=sorted({op for _, op, _ in report.portable_ops}))
    try:
        row["error"] = scale_error(_run(manager.buffer, arch.example_inputs), eager_outputs(arch))
        row["ran"] = "yes"
    except Exception as exc:  # noqa: BLE001
        row["ran"] = _fail(exc)
    return row


def int8(arch: Any) -> dict[str, Any]:
    import torch

    import edgeport
    from edgeport.aot.delegate_op import is_call_delegate, lookup_lowered_module
    from edgeport.testing.architectures import eager_outputs
    from edgeport.testing.int8_suite import pt2e_convert
    from edgeport_qnn import QnnPartitioner
    from edgeport_qnn.quantizer import QnnQuantizer

    inputs = arch.example_inputs
    converted = pt2e_convert(arch, QnnQuantizer())
    eager = eager_outputs(arch)
    with torch.no_grad():
        oracle = converted(*inputs).numpy()
    row: dict[str, Any] = {"pt2e": sqnr_db(oracle, eager)}
    start = time.perf_counter()
    try:
        edge = edgeport.to_edge_transform_and_lower(torch.export.export(converted, inputs),
                                                    partitioner=[QnnPartitioner()])
        program = edge.exported_program()
        buffer = edge.to_executorch().buffer
    except Exception as exc:  # noqa: BLE001
        row["lowered"] = _fail(exc)
        return row
    inside = outside = delegates = 0
    for n in program.graph.nodes:
        if n.op != "call_function" or "getitem" in str(n.target):
            continue
        if is_call_delegate(n):
            delegates += 1
            inside += sum(1 for m in lookup_lowered_module(n.args[0]).original_module.graph.nodes
                          if m.op == "call_function" and "getitem" not in str(m.target))
        else:
            outside += 1
    row.update(lowered="yes", seconds=time.perf_counter() - start, ops=(inside, outside), delegates=delegates)
    try:
        got = _run(buffer, inputs)
        row.update(ran="yes", sqnr=sqnr_db(got, eager), vs_pt2e=sqnr_db(got, oracle))
    except Exception as exc:  # noqa: BLE001
        row["ran"] = _fail(exc)
    return row


def _share(row: dict[str, Any]) -> str:
    if "ops" not in row:
        return "-"
    inside, outside = row["ops"]
    return f"{inside / max(1, inside + outside):.1%} ({inside}/{inside + outside})"


def _int8_verdict(row: dict[str, Any]) -> str:
    if "sqnr" not in row:
        return "-"
    if row["pt2e"] < 0:
        return "pt2e < 0 dB vs eager (see text)"
    return "yes" if row["sqnr"] >= row["pt2e"] - 1.0 else f"no ({row['sqnr'] - row['pt2e']:+.1f} dB)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-report", action="store_true")
    ap.add_argument("--only", nargs="*", help="architecture names")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)
    import torch

    from edgeport.testing.architectures import ARCHITECTURES

    names = [n for n in ARCHITECTURES if not args.only or n in args.only]
    start, t0, load0 = _dt.datetime.now(_dt.UTC), time.perf_counter(), os.getloadavg()
    archs = {n: ARCHITECTURES[n](seed=0, size="small") for n in names}
    f_rows, q_rows = {}, {}
    for name in names:  # every fp32 cell first (see the module docstring)
        f_rows[name] = fp32(archs[name])
        print(name, "fp32", f_rows[name], file=sys.stderr, flush=True)
    for name in names:
        q_rows[name] = int8(archs[name])
        print(name, "8a8w", q_rows[name], file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    lines = [SECTION_TITLE, "",
             f"Measured by `bench/qnn_architectures.py` on {start:%Y-%m-%d %H:%M} UTC: {os.cpu_count()} CPUs, "
             f"{cpu_model()}; torch {torch.__version__}, onnxruntime-qnn 2.7.0's QAIRT 2.51 libraries (HTP emulator, "
             f"float32 on its default device, 8a8w on SM8650's). Whole run {time.perf_counter() - t0:.0f} s; load "
             f"average {' '.join(f'{v:.1f}' for v in load0)} at the start, "
             f"{' '.join(f'{v:.1f}' for v in load1)} at the end. Small configs, random weights "
             "(`edgeport.testing.architectures.ARCHITECTURES`). Share = compute ops inside QNN delegates / all "
             "compute ops of the lowered edge program (8a8w: quantize / dequantize nodes included). Error = max "
             "|out - eager| / max(1, max |eager|) on edgeport's runtime. SQNR in dB against eager; pt2e = the "
             "converted model QNN must reproduce. Lowering seconds include the partitioner's per-op checks in the "
             "QNN worker (the emulator; say nothing about a phone).", "",
             "ExecuTorch 1.5.1's `QnnPartitioner` cannot lower here: it needs Qualcomm's QAIRT SDK "
             "(`QNN_SDK_ROOT`; without it, it tries to download QAIRT 2.37 and libc++ and fails with \"Failed to "
             "set up QNN SDK\"), so the table has no ExecuTorch column.", "",
             "| model | fp32 lowered | ran | error | share delegated | lowering s | 8a8w lowered | ran | SQNR QNN "
             "| SQNR pt2e | QNN vs pt2e | within 1 dB | share delegated | lowering s |",
             "|---|---|---|---:|---:|---:|---|---|---:|---:|---:|---|---:|---:|"]
    for name in names:
        f, q = f_rows[name], q_rows[name]
        err = f"{f['error']:.1e}" if "error" in f else "-"
        db = {k: f"{q[k]:.1f}" if k in q else "-" for k in ("sqnr", "pt2e", "vs_pt2e")}
        lines.append(f"| {name} | {f['lowered']} | {f.get('ran', '-')} | {err} | {_share(f)} | "
                     f"{f.get('seconds', 0):.1f} | {q.get('lowered', '-')} | {q.get('ran', '-')} | {db['sqnr']} | "
                     f"{db['pt2e']} | {db['vs_pt2e']} | {_int8_verdict(q)} | {_share(q)} | "
                     f"{q.get('seconds', 0):.1f} |")
    left = {n: f["cpu_ops"] for n, f in f_rows.items() if f.get("cpu_ops")}
    if left:
        lines += ["", "fp32 ops left on the CPU: " + "; ".join(f"{n}: {', '.join(ops)}" for n, ops in left.items())]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
