"""The ``edgeport`` command: ``edgeport backends`` and ``edgeport doctor``."""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
from collections.abc import Sequence

from edgeport import registry


def _availability(spec: registry.BackendSpec) -> str:
    try:
        ok, reason = spec.is_available()
    except Exception as exc:  # noqa: BLE001 - report, never crash the listing
        return f"unavailable (is_available raised {type(exc).__name__}: {exc})"
    return "available" if ok else f"unavailable: {reason}"


def _op_count(spec: registry.BackendSpec) -> str:
    if spec.capabilities is None:
        return "-"
    try:
        return str(len(spec.capabilities().ops))
    except Exception as exc:  # noqa: BLE001
        return f"? ({type(exc).__name__})"


def cmd_backends(args: argparse.Namespace) -> int:
    specs = registry.list_backends()
    if not specs:
        print("no backends installed (pip install edgeport-example, edgeport-xnnpack, ...)")
    for spec in specs:
        print(f"{spec.backend_id}  version {spec.version}  distribution {spec.distribution or '(script)'}  "
              f"ops {_op_count(spec)}  {_availability(spec)}")
    failures = registry.plugin_errors()
    for failure in failures:
        print(f"BROKEN {failure}")
    return 1 if failures else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    problems = 0
    print(f"python {platform.python_version()} on {platform.platform()}")
    if importlib.util.find_spec("torch") is None:
        print("torch: not installed (needed to export and lower; the runtime works without it). "
              "Fix: pip install torch==2.13.0")
    else:
        import torch

        ok = torch.__version__.split("+")[0] == "2.13.0"
        print(f"torch: {torch.__version__}" + ("" if ok else "  (edgeport is built for 2.13.0: pip install torch==2.13.0)"))
        problems += not ok
    for failure in registry.plugin_errors():
        problems += 1
        print(f"plugin error: {failure}. Fix: reinstall or uninstall {failure.distribution or failure.plugin}")
    for spec in registry.list_backends():
        status = _availability(spec)
        print(f"backend {spec.backend_id}: {status}")
    print("ok" if not problems else f"{problems} problem(s) found")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgeport", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list installed backends and broken plugins").set_defaults(func=cmd_backends)
    sub.add_parser("doctor", help="check the installation and say how to fix problems").set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
