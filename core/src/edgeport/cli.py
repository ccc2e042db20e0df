"""The ``edgeport`` command.

    edgeport backends [--json]                      installed backends, and plugins that failed to load
    edgeport doctor                                 check the installation; every problem comes with its fix
    edgeport new-backend NAME [--dir PATH]          create a backend package from edgeport's template
    edgeport op-table BACKEND_ID [--update FILE]    the op-support table of a backend, from its capability table
    edgeport inspect PROGRAM.pte                    what a program holds: methods, instructions, delegates, data
    edgeport validate PROGRAM.pte --reference F     numerical errors per partition against eager PyTorch
    edgeport view PROGRAM.pte -o report.html        the graph as an HTML page: partitions, timings, memory
    edgeport export-llm CHECKPOINT_DIR -o M.pte     a Hugging Face decoder with its KV cache (optionally 8da4w)
    edgeport generate M.pte --tokenizer T --prompt  generate text on edgeport's runtime, streamed, with stats
    edgeport <plugin command> ...                   subcommands backends add (edgeport_register_commands)

Environment switches (read when plugins are first loaded):

    EDGEPORT_DISABLE_PLUGIN_AUTOLOAD=1   load no entry-point plugins (built-ins and register_plugin() still work)
    EDGEPORT_PLUGINS=a,b                 load only the entry points named a and b
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeport import registry

# -- plugin facts -------------------------------------------------------------------------------------------


def _availability(spec: registry.BackendSpec) -> tuple[bool, str]:
    try:
        ok, reason = spec.is_available()
    except Exception as exc:  # noqa: BLE001 - report, never crash the listing
        return False, f"is_available raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason or "")


def _status_text(ok: bool, reason: str) -> str:
    """``available`` (with the backend's note, if it gave one) or ``unavailable: <reason>``."""
    if ok:
        return f"available ({reason})" if reason else "available"
    return f"unavailable: {reason or 'no reason given'}"


def _op_count(spec: registry.BackendSpec) -> int | str:
    if spec.capabilities is None:
        return "-"
    try:
        return len(spec.capabilities().ops)
    except Exception as exc:  # noqa: BLE001
        return f"? ({type(exc).__name__}: {exc})"


@dataclass(frozen=True)
class EntryPointInfo:
    name: str
    value: str
    distribution: str | None
    version: str | None
    loaded: bool
    why_not: str  # why an installed entry point was not loaded (environment switches)


def _entry_points() -> list[EntryPointInfo]:
    import importlib_metadata

    disabled = os.environ.get("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0")
    only = {p.strip() for p in os.environ.get("EDGEPORT_PLUGINS", "").split(",") if p.strip()}
    found: dict[tuple[str, str], EntryPointInfo] = {}
    for ep in importlib_metadata.entry_points(group=registry.ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        why = ""
        if disabled:
            why = "EDGEPORT_DISABLE_PLUGIN_AUTOLOAD is set"
        elif only and ep.name not in only:
            why = f"EDGEPORT_PLUGINS={','.join(sorted(only))} does not include it"
        found.setdefault((ep.name, ep.value), EntryPointInfo(ep.name, ep.value, dist, version, not why, why))
    return sorted(found.values(), key=lambda e: e.name)


def _plugin_names(spec: registry.BackendSpec, eps: list[EntryPointInfo]) -> str:
    if spec.distribution is None:
        return "(script)"
    if spec.distribution == "edgeport":
        return "(built-in)"
    names = [e.name for e in eps if e.distribution == spec.distribution]
    return ",".join(names) or "?"


def _backend_rows() -> tuple[list[dict[str, Any]], list[registry.PluginFailure], list[EntryPointInfo]]:
    eps = _entry_points()
    rows = []
    for spec in registry.list_backends():
        ok, reason = _availability(spec)
        rows.append({
            "backend_id": spec.backend_id,
            "version": spec.version,
            "distribution": spec.distribution,
            "plugin": _plugin_names(spec, eps),
            "ops": _op_count(spec),
            "available": ok,
            "reason": reason,
            "description": spec.description,
        })
    return rows, registry.plugin_errors(), [e for e in eps if not e.loaded]


# -- commands -----------------------------------------------------------------------------------------------


def cmd_backends(args: argparse.Namespace) -> int:
    rows, failures, skipped = _backend_rows()
    if args.json:
        print(json.dumps({
            "backends": rows,
            "broken": [{"plugin": f.plugin, "distribution": f.distribution, "stage": f.stage, "error": f.error}
                       for f in failures],
            "not_loaded": [{"plugin": e.name, "distribution": e.distribution, "reason": e.why_not} for e in skipped],
        }, indent=2, default=str))
        return 1 if failures else 0
    if not rows:
        print("no backends installed (pip install edgeport-example, edgeport-xnnpack, ...)")
    for r in rows:
        status = _status_text(r["available"], r["reason"])
        print(f"{r['backend_id']}  version {r['version']}  distribution {r['distribution'] or '(script)'}  "
              f"plugin {r['plugin']}  ops {r['ops']}  {status}")
    for e in skipped:
        print(f"NOT LOADED plugin {e.name!r} (distribution {e.distribution}): {e.why_not}")
    for failure in failures:
        print(f"BROKEN {failure}")
    return 1 if failures else 0


@dataclass(frozen=True)
class SystemLibrary:
    name: str  # what ctypes.util.find_library looks for
    what: str
    apt: str
    needed_by: str  # distribution that needs it


SYSTEM_LIBRARIES = (
    SystemLibrary("XNNPACK", "XNNPACK (CPU kernels)", "libxnnpack0 (headers: libxnnpack-dev)", "edgeport-xnnpack"),
    SystemLibrary("pthreadpool", "pthreadpool (XNNPACK's thread pool)", "libpthreadpool0", "edgeport-xnnpack"),
    SystemLibrary("cpuinfo", "cpuinfo (XNNPACK's CPU detection)", "libcpuinfo0", "edgeport-xnnpack"),
    SystemLibrary("vulkan", "the Vulkan loader", "libvulkan1", "edgeport-vulkan"),
)
LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd*.json"


def _installed(distribution: str) -> bool:
    import importlib_metadata

    try:
        importlib_metadata.distribution(distribution)
    except importlib_metadata.PackageNotFoundError:
        return False
    return True


def cmd_doctor(args: argparse.Namespace) -> int:
    problems = 0

    def problem(text: str) -> None:
        nonlocal problems
        problems += 1
        print(f"PROBLEM {text}")

    import edgeport

    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"edgeport {edgeport.__version__} at {os.path.dirname(edgeport.__file__)}")
    if importlib.util.find_spec("torch") is None:
        print("torch: not installed (needed to export and lower; the runtime works without it). "
              "Fix: pip install torch==2.13.0")
    else:
        import torch

        ok = torch.__version__.split("+")[0] == "2.13.0"
        print(f"torch: {torch.__version__}" + ("" if ok else "  (edgeport is built for 2.13.0)"))
        if not ok:
            problem(f"torch {torch.__version__} is not the supported version. Fix: pip install torch==2.13.0")

    # environment switches
    for var in ("EDGEPORT_DISABLE_PLUGIN_AUTOLOAD", "EDGEPORT_PLUGINS"):
        if os.environ.get(var):
            print(f"environment: {var}={os.environ[var]} (limits which plugins load; unset it to load all)")
    eps = _entry_points()
    only = {p.strip() for p in os.environ.get("EDGEPORT_PLUGINS", "").split(",") if p.strip()}
    unknown = sorted(only - {e.name for e in eps})
    if unknown:
        problem(f"EDGEPORT_PLUGINS names {unknown}, which no installed distribution provides "
                f"(installed plugins: {[e.name for e in eps]}). Fix: correct the names or install the packages")

    # system libraries
    for lib in SYSTEM_LIBRARIES:
        path = ctypes.util.find_library(lib.name)
        if path:
            print(f"library {lib.name}: found ({path})")
        elif _installed(lib.needed_by):
            problem(f"library {lib.name} ({lib.what}) not found; {lib.needed_by} needs it. "
                    f"Fix: apt-get install {lib.apt}")
        else:
            print(f"library {lib.name}: not found (only {lib.needed_by} needs it; apt package {lib.apt})")
    icds = glob.glob(LAVAPIPE_ICDS)
    if icds:
        print(f"vulkan CPU driver (lavapipe): found ({icds[0]})")
    elif _installed("edgeport-vulkan"):
        problem("no Vulkan driver for the CPU (lavapipe); edgeport-vulkan needs a Vulkan device. "
                "Fix: apt-get install mesa-vulkan-drivers")
    else:
        print("vulkan CPU driver (lavapipe): not found (only edgeport-vulkan needs it; apt package mesa-vulkan-drivers)")

    # plugins
    for failure in registry.plugin_errors():
        dist = failure.distribution or failure.plugin
        problem(f"plugin error: {failure}. Fix: read the error above; reinstall ({'pip install --force-reinstall ' + dist}) "
                f"or uninstall it (pip uninstall {dist}) so the other plugins load cleanly")
    for e in eps:
        if not e.loaded:
            print(f"plugin {e.name} ({e.distribution}): installed but not loaded: {e.why_not}")
    for spec in registry.list_backends():
        ok, reason = _availability(spec)
        if ok:
            print(f"backend {spec.backend_id}: {_status_text(ok, reason)}")
        elif spec.execution_platforms and sys.platform not in spec.execution_platforms:
            print(f"backend {spec.backend_id}: lowering only on this platform ({sys.platform}); it executes on "
                  f"{', '.join(spec.execution_platforms)}: {reason}")
        else:
            problem(f"backend {spec.backend_id} ({spec.distribution or 'script'}) is unavailable: "
                    f"{reason or 'no reason given'}")
    print("ok" if not problems else f"{problems} problem(s) found")
    return 1 if problems else 0


def cmd_new_backend(args: argparse.Namespace) -> int:
    from edgeport import scaffold

    dest = args.dir or f"edgeport-{args.name.replace('_', '-')}"
    try:
        names = scaffold.new_backend(args.name, dest, backend_id=args.backend_id, force=args.force)
    except scaffold.ScaffoldError as exc:
        print(f"edgeport new-backend: {exc}", file=sys.stderr)
        return 2
    where = os.path.abspath(dest)
    print(f"created {names.distribution} in {where}")
    print(f"  backend id   {names.backend_id}")
    print(f"  import name  {names.package}")
    print(f'  entry point  [project.entry-points."edgeport.backends"] {names.ident} = "{names.package}.plugin"')
    print("next:")
    print(f"  pip install -e {where}    # or -e '{where}[aot,test]' for torch and pytest")
    print(f"  edgeport backends    # lists {names.backend_id} (plugin {names.ident})")
    print(f"  pytest {where}    # runs the conformance suite")
    return 0


def cmd_op_table(args: argparse.Namespace) -> int:
    from edgeport import scaffold

    try:
        spec = registry.get_backend(args.backend_id)
    except registry.BackendNotFoundError as exc:
        print(f"edgeport op-table: {exc}", file=sys.stderr)
        return 2
    if spec.capabilities is None:
        print(f"edgeport op-table: {args.backend_id} registers no capability table", file=sys.stderr)
        return 2
    table = spec.capabilities()
    target = args.update or args.check
    if not target:
        print(scaffold.generated_block(spec.backend_id, table))
        return 0
    try:
        with open(target, encoding="utf-8") as f:
            text = f.read()
        fresh = scaffold.update_generated_block(text, spec.backend_id, table)
    except (OSError, scaffold.ScaffoldError) as exc:
        print(f"edgeport op-table: {target}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if fresh != text:
            print(f"{target}: the op-support table is stale; run edgeport op-table {args.backend_id} --update {target}")
            return 1
        print(f"{target}: up to date")
        return 0
    if fresh != text:
        with open(target, "w", encoding="utf-8") as f:
            f.write(fresh)
        print(f"{target}: op-support table updated ({len(table.ops)} operators)")
    else:
        print(f"{target}: up to date")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from edgeport.errors import EdgeportError
    from edgeport.inspection import format_inspection, inspect_program

    try:
        info = inspect_program(args.program, describe=not args.no_describe)
    except OSError as exc:
        print(f"edgeport inspect: cannot read {args.program}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except EdgeportError as exc:
        print(f"edgeport inspect: {args.program} is not a valid program: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2, default=str) if args.json else format_inspection(info))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from edgeport.devtools.validate_cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgeport", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("backends", help="list installed backends and broken plugins")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_backends)
    sub.add_parser("doctor", help="check the installation and say how to fix problems").set_defaults(func=cmd_doctor)
    p = sub.add_parser("new-backend", help="create a backend package from edgeport's template")
    p.add_argument("name", help="short backend name: lowercase letters/digits, '-' or '_' (e.g. acmenpu)")
    p.add_argument("--dir", help="directory to create the package in (default: ./edgeport-NAME); must be empty")
    p.add_argument("--backend-id", help="backend id (default: the capitalized name + 'Backend')")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory, overwriting files")
    p.set_defaults(func=cmd_new_backend)
    p = sub.add_parser("inspect", help="show what a .pte holds: methods, instructions, delegates, named data, sizes")
    p.add_argument("program", help="path of a .pte (edgeport's or ExecuTorch's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-describe", action="store_true", help="do not ask backends to describe their blobs")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("op-table", help="print (or update in a markdown file) a backend's op-support table")
    p.add_argument("backend_id")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--update", metavar="FILE", help="rewrite the generated block of FILE")
    group.add_argument("--check", metavar="FILE", help="exit 1 when the generated block of FILE is stale")
    p.set_defaults(func=cmd_op_table)
    p = sub.add_parser("validate", help="compare a .pte run on edgeport's runtime with its model in eager PyTorch, "
                       "as a whole and per partition (docs/devtools-validate.md)")
    p.add_argument("program", help="path of the .pte to check")
    p.add_argument("--reference", required=True, metavar="MODULE:FACTORY",
                   help="a callable returning (model, example_inputs[, partitioners]) or (edge_manager, "
                        "example_inputs); MODULE is a dotted module name or a .py file")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs to use instead of the factory's example inputs "
                   "(the arrays in the order they were saved)")
    p.add_argument("--method", default="forward", help="method to run (default: forward)")
    p.add_argument("--atol", type=float, help="largest max abs error allowed (default: not checked)")
    p.add_argument("--rtol", type=float, help="largest max rel error allowed (default: not checked)")
    p.add_argument("--sqnr-db", type=float, help="smallest SQNR allowed, in dB (default: 25)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_validate)
    from edgeport.devtools.graph_view import configure_view_command, run_view_command

    p = sub.add_parser("view", help="write a self-contained HTML report of a program's graph: partitions per backend, "
                       "timings, errors, memory over time (docs/devtools-graph-view.md)")
    configure_view_command(p)
    p.set_defaults(func=run_view_command)
    from edgeport.lower_cli import configure_lower_command, configure_run_command

    configure_lower_command(sub.add_parser("lower", help="export, quantize and lower a model for a target profile "
                                           "(several backends in one program) to a .pte (docs/multi-backend.md)"))
    configure_run_command(sub.add_parser("run", help="run a .pte on edgeport's runtime: outputs and latency"))
    from edgeport.llm.cli import configure_export_llm_command, configure_generate_command

    configure_export_llm_command(sub.add_parser("export-llm", help="export a Hugging Face decoder checkpoint "
                                                "(KV cache as state, optional 8da4w) to a .pte"))
    configure_generate_command(sub.add_parser("generate", help="generate text with a .pte from export-llm, "
                                              "streaming it, with time-to-first-token and tokens/s"))
    _add_plugin_commands(sub)
    return parser


def _add_plugin_commands(sub: Any) -> None:
    """Subcommands from ``edgeport_register_commands`` hooks. One whose ``configure`` raises stays listed, and running
    it says what went wrong and in which plugin, so a broken plugin never breaks the built-in commands."""
    for spec in registry.plugin_commands():
        origin = f" (from {spec.distribution})" if spec.distribution else ""
        p = sub.add_parser(spec.name, help=spec.help + origin)
        try:
            spec.configure(p)
        except Exception as exc:  # noqa: BLE001 - report, never crash the whole command line
            problem = f"{type(exc).__name__}: {exc}"

            def broken(_args: argparse.Namespace, name: str = spec.name, why: str = problem,
                       source: str = origin) -> int:
                print(f"edgeport {name}: the plugin{source} could not set this command up: {why}", file=sys.stderr)
                return 2

            p.set_defaults(func=broken)
            continue
        p.set_defaults(func=spec.run)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
