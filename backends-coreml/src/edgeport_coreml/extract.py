"""``python -m edgeport_coreml.extract PROGRAM.pte -o DIR``: write each Core ML delegate of a program as a model
directory (``DIR/<method>_<index>/lowered_module/{model.mlpackage, metadata.json, ...}``), ready to open in Xcode
or load with ``coremltools.models.MLModel``.

The same command is ``edgeport coreml extract`` (:mod:`edgeport_coreml.cli`). Every blob is checked before anything is
written; a damaged one fails with exit status 2 and the reason.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from edgeport.errors import ProgramError
from edgeport_coreml.options import COREML_BACKEND_ID
from edgeport_coreml.schema.flat_directory import FlatDirectoryError, read_flat_directory, unflatten_to

__all__ = ["ExtractedDelegate", "extract", "main"]


@dataclass
class ExtractedDelegate:
    method: str
    index: int
    path: Path


def extract(program: bytes | str | Path, out_dir: str | Path) -> list[ExtractedDelegate]:
    """Unflatten every ``CoreMLBackend`` delegate of ``program`` under ``out_dir``; returns what was written.

    Raises ``ProgramError`` for a program that is not readable, has no Core ML delegate, or holds a damaged blob.
    """
    from edgeport.program.reader import load_pte

    data = Path(program).read_bytes() if isinstance(program, (str, Path)) else bytes(program)
    lp = load_pte(data)
    found = []
    for plan_index, plan in enumerate(lp.program.execution_plan):
        for index, d in enumerate(plan.delegates):
            if d.id != COREML_BACKEND_ID:
                continue
            blob = bytes(lp.delegate_data(plan_index, index))
            if blob[:4] == b"CMJR":
                raise ProgramError(f"method {plan.name!r} delegate {index}: a reference to a shared multifunction "
                                   "model (ExecuTorch's weight sharing), which extract does not resolve yet")
            try:
                flat = read_flat_directory(blob)
            except FlatDirectoryError as exc:
                raise ProgramError(f"method {plan.name!r} delegate {index}: not a valid {COREML_BACKEND_ID} blob: "
                                   f"{exc}") from None
            found.append((plan.name, index, flat))
    if not found:
        raise ProgramError(f"the program has no {COREML_BACKEND_ID} delegate")
    out = Path(out_dir)
    written = []
    for method, index, flat in found:
        target = out / f"{method}_{index}"
        target.mkdir(parents=True, exist_ok=True)
        written.append(ExtractedDelegate(method, index, unflatten_to(flat, target)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeport_coreml.extract",
                                     description="Write the Core ML models of a .pte program to a directory.")
    parser.add_argument("program", help="the .pte file")
    parser.add_argument("-o", "--output", required=True, help="directory to write the models into")
    args = parser.parse_args(argv)
    from edgeport_coreml.cli import _extract

    return _extract(args.program, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
