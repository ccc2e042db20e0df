"""Profiles: operator resolution -- how many ETDump events an Inspector names the operator of (issue 26, item 4).

Per model (HF Swin from a small config: windowed attention; HF ResNet: a CNN; HF BERT), from one export:

* edgeport's XNNPACK program (``edgeport.to_edge_transform_and_lower``, ETRecord recorded) and ExecuTorch 1.5.1's
  own (``executorch.exir.to_edge_transform_and_lower`` + its ``XnnpackPartitioner``, ETRecord recorded);
* each program profiled (ETDump) by the stock ExecuTorch runtime (child process,
  :func:`edgeport.testing.stock_runtime.profile_program`) and by edgeport's runtime;
* each ETDump resolved by ExecuTorch's ``Inspector`` and by edgeport's, with the ETRecord of the flow that made
  the program: events whose ``op_types`` is not empty / all events (every block; an event is one signature over
  the runs), and the same for the delegates' sub-events (the per-operator or per-step events inside a call).

No timing: the numbers are counts, the same on any machine running the same XNNPACK (ExecuTorch's runtime
names its XNNPACK operators by micro-kernel; dynamically quantized ones differ between x86 with and without VNNI).

    python bench/profile_resolution.py [--models swin,resnet,bert] [--runs 2] [--write-report]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from architectures import write_section  # noqa: E402  (bench/ is not a package)
from xnnpack_bench.machine import cpu_model  # noqa: E402

SECTION_TITLE = "## Profiles: operator resolution"
MODELS = ("swin", "resnet", "bert")


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The model (eval mode) and its example inputs."""
    from edgeport.testing.architectures import ARCHITECTURES, swin

    if name == "swin":
        return swin()
    arch = ARCHITECTURES[name](seed=0, size="small")
    return arch.model, tuple(arch.example_inputs)


def lower(name: str, work: Path) -> dict[str, dict[str, Any]]:
    """Both flows' programs and saved ETRecords: ``{"edgeport": {...}, "executorch": {...}}``."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import to_edge_transform_and_lower as et_lower

    import edgeport
    from edgeport_xnnpack import XnnpackPartitioner

    model, args = build(name)
    out: dict[str, dict[str, Any]] = {}
    for flow in ("edgeport", "executorch"):
        ep = torch.export.export(model, args)  # a fresh export per flow
        if flow == "edgeport":
            et = edgeport.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                                      generate_etrecord=True).to_executorch()
        else:
            et = et_lower(ep, partitioner=[EtXnnpack()], generate_etrecord=True).to_executorch()
        record = work / f"{name}.{flow}.etrecord"
        et.get_etrecord().save(str(record))
        out[flow] = {"pte": bytes(et.buffer), "etrecord": record, "args": [a.numpy() for a in args]}
    return out


def profile(flows: dict[str, dict[str, Any]], name: str, work: Path, runs: int) -> None:
    """ETDumps of each program on the stock runtime (child process) and on edgeport's runtime."""
    from edgeport.runtime import Runtime
    from edgeport.testing.stock_runtime import profile_program

    for flow, d in flows.items():
        stock = profile_program(d["pte"], [d["args"]] * runs, name=f"{name} ({flow})")
        if stock.etdump is None:
            raise RuntimeError(stock.describe() + "\n" + stock.log)
        d["stock"] = work / f"{name}.{flow}.stock.etdp"
        d["stock"].write_bytes(stock.etdump)
        program = Runtime.get().load_program(d["pte"], enable_etdump=True)
        method = program.load_method("forward")
        for _ in range(runs):
            method.execute(d["args"])
        d["edgeport"] = work / f"{name}.{flow}.edgeport.etdp"
        program.write_etdump_result_to_file(d["edgeport"])


def count(events: list[Any]) -> dict[str, int]:
    """Named / total events and named / total delegate sub-events of an Inspector's events."""
    sub = [e for e in events if e.delegate_debug_identifier is not None]
    return {"named": sum(1 for e in events if e.op_types), "total": len(events),
            "sub_named": sum(1 for e in sub if e.op_types), "sub_total": len(sub)}


def resolve(etdump: Path, etrecord: Path, inspector: str) -> dict[str, int] | str:
    """The counts one Inspector reaches on one ETDump, or why it could not read them."""
    try:
        if inspector == "executorch":
            import logging

            from executorch.devtools import Inspector as EtInspector

            logging.getLogger().setLevel(logging.ERROR)  # "No delegate mapping found" per unmapped event
            found = EtInspector(etdump_path=str(etdump), etrecord=str(etrecord))
        else:
            from edgeport.devtools import Inspector

            found = Inspector(etdump, etrecord=etrecord)
    except Exception as exc:  # noqa: BLE001 - a failure to read is a result of the benchmark
        if "edge_dialect" in str(exc):
            return "edgeport cannot read ExecuTorch's edge-dialect ETRecord"
        return f"{type(exc).__name__}: {str(exc)[:80]}"
    return count([e for block in found.event_blocks for e in block.events])


def measure(name: str, runs: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgeport-resolution-") as tmp:
        work = Path(tmp)
        flows = lower(name, work)
        profile(flows, name, work, runs)
        for flow, d in flows.items():
            for runtime in ("stock", "edgeport"):
                for inspector in ("executorch", "edgeport"):
                    rows.append({"model": name, "program": flow, "runtime": runtime, "inspector": inspector,
                                 "result": resolve(d[runtime], d["etrecord"], inspector)})
    return rows


def _cell(result: dict[str, int] | str, sub: bool = False) -> str:
    if isinstance(result, str):
        return f"n/a ({result})"
    named, total = (result["sub_named"], result["sub_total"]) if sub else (result["named"], result["total"])
    return f"{named} / {total} ({100 * named / total:.0f}%)" if total else "0 / 0"


def render(rows: list[dict[str, Any]], runs: int) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        SECTION_TITLE, "",
        f"`python bench/profile_resolution.py --write-report` ({cpu_model()}; load average {load}; {runs} runs per "
        "ETDump; ExecuTorch 1.5.1). Counts, not times: per model, the programs of edgeport's XNNPACK flow and of "
        "ExecuTorch's own (`to_edge_transform_and_lower` + `XnnpackPartitioner`, each with its ETRecord), each "
        "profiled by the stock ExecuTorch runtime (child process) and by edgeport's runtime, each ETDump read by "
        "ExecuTorch's `Inspector` and by edgeport's with the ETRecord of the flow that made the program. "
        "*Events*: events with an operator name (`op_types` not empty) / all events of every block; *delegate "
        "sub-events*: the same for the events inside delegate calls (the stock runtime: one per XNNPACK operator; "
        "edgeport's runtime: one per step of its plan).", "",
        "| model | program | runtime | Inspector | events named | delegate sub-events named |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['program']} | {r['runtime']} | {r['inspector']} | {_cell(r['result'])} "
                     f"| {_cell(r['result'], sub=True)} |")
    lines += ["", HOW_TO_READ]
    return "\n".join(lines) + "\n"


HOW_TO_READ = """How to read it: the *stock / ExecuTorch Inspector* rows are the issue's measure. ExecuTorch's own flow leaves
its XNNPACK delegate map empty, so its Inspector names the kernel and `DELEGATE_CALL` events and none of the
per-operator events inside the calls; edgeport's delegate map has a key for every event ExecuTorch's XNNPACK
delegate reports (`"<XNNPACK operator> #k"`, predicted from the blob: `edgeport_xnnpack.schema.operator_names`),
so the same Inspector names those too. The events left unnamed on the stock runtime are `Program::load_method`,
`Method::init` and `Method::execute`, which no ETRecord maps. On edgeport's runtime a sub-event is a step of
its plan: edgeport's Inspector names every step from the debug handles in the event's metadata; ExecuTorch's
Inspector names a step that runs one blob node (it carries that node's stock event id) and not a step that runs
several in one native XNNPACK runtime (no key of a fixed map can name an arbitrary group; those steps are
named in edgeport's Inspector). ExecuTorch's program on edgeport's runtime: the same steps, and an empty map.
edgeport's Inspector does not read ExecuTorch's ETRecords (their edge programs hold edge-dialect operators that
torch alone cannot load), hence the n/a rows."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--write-report", action="store_true", help="replace the section in bench/REPORT.md")
    opts = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = []
    for name in opts.models.split(","):
        rows += measure(name.strip(), opts.runs)
    section = render(rows, opts.runs)
    print(section)
    if opts.write_report:
        write_section(section, BENCH_DIR / "REPORT.md", SECTION_TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
