"""``edgeport validate MODEL.pte --reference pkg.module:factory``: the command behind ``cmd_validate``.

The factory (a callable taking no arguments, named ``module:attribute`` or ``path/file.py:attribute``) returns

* ``(model, example_inputs)``: the whole-program row (MODEL.pte on edgeport's runtime vs ``model(*inputs)``);
* ``(model, example_inputs, partitioners)``: the model is exported and lowered again with the partitioners, and
  each of its partitions is validated too (the whole-program row still runs MODEL.pte);
* ``(edge_program_manager, example_inputs)``: the lowered program itself; per-partition rows as above.

Exit status: 0 within the thresholds, 1 outside them, 2 on bad input (with a one-line message).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BadInput", "load_factory", "run"]


class BadInput(Exception):
    """What the user gave cannot be used; the message says what and what to do."""


def load_factory(path: str) -> Callable[[], Any]:
    """The callable named by ``module:attribute`` or ``file.py:attribute``; :class:`BadInput` if there is none."""
    module_name, sep, attr = path.rpartition(":")
    if not sep or not module_name or not attr:
        raise BadInput(f"--reference must look like pkg.module:factory or path/file.py:factory, got {path!r}")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise BadInput(f"--reference: no file {module_name!r}")
            spec = importlib.util.spec_from_file_location(f"_edgeport_reference_{file.stem}", file)
            if spec is None or spec.loader is None:
                raise BadInput(f"--reference: cannot import {module_name!r}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # as `python -m` would: modules beside the user are importable
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's reference, reported in one line
        raise BadInput(f"--reference: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BadInput(f"--reference: {module_name!r} has no callable {attr!r}")
    return factory


def _inputs_from_npz(path: str) -> tuple[Any, ...]:
    import numpy as np
    import torch

    try:
        with np.load(path, allow_pickle=False) as data:
            return tuple(torch.from_numpy(np.array(data[k])) for k in data.files)
    except OSError as exc:
        raise BadInput(f"--inputs: cannot read {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # noqa: BLE001
        raise BadInput(f"--inputs: {path} is not a .npz file of arrays: {type(exc).__name__}: {exc}") from exc


def _partition_note(pte: str, em: Any, method: str) -> str | None:
    """A note when the lowered program's delegates differ from MODEL.pte's (per-partition rows describe the
    lowered program, the whole-program row MODEL.pte)."""
    from edgeport.devtools.validate import eager_delegate_backends
    from edgeport.program.reader import load_pte

    loaded = load_pte(Path(pte).read_bytes())
    plans = [p for p in loaded.program.execution_plan if p.name == method]
    in_pte = sorted(d.id for d in plans[0].delegates) if plans else []
    in_em = sorted(eager_delegate_backends(em.exported_program(method)))
    if in_pte != in_em:
        return (f"the lowered reference has delegates {in_em}, {pte} has {in_pte}: the partition rows describe "
                "the reference's lowering, not necessarily the file's")
    return None


def run(args: argparse.Namespace) -> int:
    """Run ``edgeport validate``; prints the report (text or JSON) and returns the exit status."""
    from edgeport.errors import EdgeportError
    from edgeport.runtime import Runtime

    try:
        try:
            Runtime.get().load_program(args.program)
        except OSError as exc:
            raise BadInput(f"cannot read {args.program}: {exc.strerror or exc}") from exc
        except EdgeportError as exc:
            raise BadInput(f"{args.program} is not a valid program: {exc}") from exc
        factory = load_factory(args.reference)
        try:
            made = factory()
        except Exception as exc:  # noqa: BLE001 - the user's code failed: one line, not a traceback
            raise BadInput(f"--reference {args.reference}: the factory raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(made, tuple) or len(made) not in (2, 3):
            raise BadInput(f"--reference {args.reference} must return (model, example_inputs[, partitioners]) or "
                           f"(edge_manager, example_inputs), got {type(made).__name__}")
        inputs = _inputs_from_npz(args.inputs) if args.inputs else made[1]
        report = _report(args, made, inputs)
    except (BadInput, ValueError, TypeError, EdgeportError) as exc:
        print(f"edgeport validate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    return 0 if report.passed else 1


def _report(args: argparse.Namespace, made: tuple[Any, ...], inputs: Any) -> Any:
    import torch

    import edgeport
    from edgeport.devtools.validate import as_samples, validate, validate_program
    from edgeport.devtools.validate_report import DEFAULT_SQNR_THRESHOLD_DB

    sqnr_db = DEFAULT_SQNR_THRESHOLD_DB if args.sqnr_db is None else args.sqnr_db
    thresholds = {"atol": args.atol, "rtol": args.rtol, "sqnr_threshold_db": sqnr_db}
    model = made[0]
    em = None
    if hasattr(model, "exported_program") and hasattr(model, "to_executorch"):
        em = model
    elif len(made) == 3:
        sample = as_samples(inputs)[0]
        try:
            exported = torch.export.export(model, sample)
        except Exception as exc:  # noqa: BLE001
            raise BadInput(f"--reference {args.reference}: torch.export failed: {type(exc).__name__}: {exc}") from exc
        em = edgeport.to_edge_transform_and_lower(exported, partitioner=list(made[2] or []))
    if em is None:
        if not callable(model):
            raise BadInput(f"--reference {args.reference}: the model is a {type(model).__name__}, not callable")
        return validate_program(args.program, model, inputs, method=args.method, **thresholds)
    report = validate(em, inputs, method=args.method, pte=args.program, **thresholds)
    note = _partition_note(args.program, em, args.method)
    if note:
        report.notes.append(note)
    return report
