"""``edgeport coreml ...``: the Core ML backend's subcommands of the ``edgeport`` command line.

``edgeport coreml extract PROGRAM.pte -o DIR`` writes every Core ML delegate of a program as a model directory
(see :mod:`edgeport_coreml.extract`). Registered by :mod:`edgeport_coreml.plugin` through
``edgeport_register_commands``; nothing heavy is imported until a subcommand runs.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``coreml`` subcommands (``extract``) to ``parser``."""
    sub = parser.add_subparsers(dest="coreml_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser("extract", help="write each Core ML delegate of a .pte program as a model directory",
                       description="Write the Core ML models of a .pte program to DIR/<method>_<index>/lowered_module "
                                   "(model.mlpackage, metadata.json), ready for Xcode or coremltools.")
    p.add_argument("program", help="the .pte file")
    p.add_argument("-o", "--output", required=True, help="directory to write the models into")


def run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; exit status 0 on success, 2 with the reason on stderr otherwise."""
    if args.coreml_command == "extract":
        return _extract(args.program, args.output)
    sys.stderr.write(f"edgeport coreml: unknown subcommand {args.coreml_command!r}\n")
    return 2


def _extract(program: str, output: str) -> int:
    from edgeport.errors import ProgramError
    from edgeport_coreml.extract import extract

    try:
        written = extract(program, output)
    except (OSError, ProgramError) as exc:
        sys.stderr.write(f"edgeport coreml extract: error: {exc}\n")
        return 2
    for item in written:
        sys.stdout.write(f"{item.method} delegate {item.index}: {item.path}\n")
    return 0
