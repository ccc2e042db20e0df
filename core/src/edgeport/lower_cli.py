"""``edgeport lower`` (a model factory to a ``.pte``) and ``edgeport run`` (a ``.pte``: outputs and latency).

``edgeport lower pkg.module:factory --target qualcomm-htp [--quantize --calibration N] [--backend ID ...]
-o model.pte``: the factory returns ``(model, example_inputs)``. Stages are shown on stderr when it is a
terminal (``--progress`` / ``--no-progress`` force it), then the delegation table is printed.
``edgeport run model.pte [--inputs file.npz] [--repeat N]`` prints the outputs and the latency.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["configure_lower_command", "configure_run_command", "run_lower", "run_run"]


class CliError(Exception):
    """A one-line problem with the command's input; printed without a traceback."""


class Progress:
    """Stage display on a terminal: ``[2/5] quantize ... 1.2 s``; silent when ``enabled`` is false."""

    def __init__(self, stream: TextIO, enabled: bool, total: int) -> None:
        self.stream, self.enabled, self.total = stream, enabled, total
        self.count = 0
        self._start = time.perf_counter()
        self._current: str | None = None

    def _close(self) -> None:
        if self._current is not None and self.enabled:
            self.stream.write(f" {time.perf_counter() - self._start:.1f} s\n")
            self.stream.flush()

    def __call__(self, stage: str) -> None:
        self._close()
        self.count += 1
        self._current = stage
        self._start = time.perf_counter()
        if self.enabled:
            self.stream.write(f"[{self.count}/{self.total}] {stage} ...")
            self.stream.flush()

    def done(self) -> None:
        self._close()
        self._current = None


def load_factory(spec: str) -> Callable[[], Any]:
    """``"pkg.module:factory"`` or ``"path/to/file.py:factory"`` -> the callable; :class:`CliError` otherwise."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{spec!r} is not MODULE:FACTORY (e.g. mypkg.models:build or models.py:build)")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise CliError(f"module file {module_name!r} does not exist")
            mspec = importlib.util.spec_from_file_location(path.stem, path)
            if mspec is None or mspec.loader is None:
                raise CliError(f"cannot load {module_name!r} as a Python module")
            module = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except CliError:
        raise
    except Exception as exc:
        raise CliError(f"module {module_name!r} does not import ({type(exc).__name__}: {exc}); check the name and "
                       "that it is on PYTHONPATH (or give a .py file)") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise CliError(f"module {module_name!r} has no callable {attr!r}; give the function that returns "
                       "(model, example_inputs)")
    return factory


def build_model(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """Call the factory and check that it returns ``(model, example_inputs)``."""
    import torch

    factory = load_factory(spec)
    try:
        result = factory()
    except Exception as exc:
        raise CliError(f"factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, (tuple, list)) and len(result) >= 2 and isinstance(result[0], torch.nn.Module)):
        raise CliError(f"factory {spec!r} returned {type(result).__name__}, not (model, example_inputs); make it "
                       "return a torch.nn.Module and a tuple of example input tensors")
    model, inputs = result[0], result[1]
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise CliError(f"factory {spec!r}: example_inputs must be tensors, got {[type(t).__name__ for t in inputs]}")
    return model, inputs


def configure_lower_command(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", help="MODULE:FACTORY returning (model, example_inputs); MODULE is a dotted name or .py")
    p.add_argument("--target", default="cpu", help="profile: cpu, arm-ethos-u55, arm-ethos-u55+cpu, qualcomm-htp, "
                   "apple, vulkan (default: cpu)")
    p.add_argument("--backend", action="append", metavar="ID", help="backend id, in priority order (repeat); "
                   "overrides the profile's list")
    p.add_argument("--quantize", action="store_true", help="quantize each node with its owner backend's quantizer")
    p.add_argument("--calibration", type=int, default=0, metavar="N", help="calibrate on N random batches shaped "
                   "like the example inputs, plus the example inputs (default: the example inputs only)")
    p.add_argument("--require-full-delegation", action="store_true", help="fail if any op would run on the CPU")
    p.add_argument("--allow-portable-op", action="append", metavar="OP", help="op allowed on the CPU in strict "
                   "mode, e.g. aten.sin (repeat)")
    p.add_argument("--portable-fallbacks", action="store_true", help="carry portable versions of the delegates")
    p.add_argument("-o", "--output", required=True, help="path of the .pte to write")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="show the stages even when stderr is not a terminal")
    group.add_argument("--no-progress", dest="progress", action="store_false", help="never show the stages")
    p.set_defaults(func=run_lower)


def run_lower(args: argparse.Namespace) -> int:
    from edgeport.errors import EdgeportError
    from edgeport.targets import lower

    show = sys.stderr.isatty() if args.progress is None else args.progress
    progress = Progress(sys.stderr, show, 6 if args.quantize else 5)
    try:
        model, inputs = build_model(args.factory)
        calibration = None
        if args.quantize and args.calibration > 0:
            import torch

            gen = torch.Generator().manual_seed(0)
            calibration = [tuple(torch.randn(t.shape, generator=gen).to(t.dtype) for t in inputs)
                           for _ in range(args.calibration)] + [inputs]
        manager = lower(model, inputs, target=args.target, quantize=args.quantize, calibration=calibration,
                        backends=args.backend, require_full_delegation=args.require_full_delegation,
                        allowed_portable_ops=args.allow_portable_op, portable_fallbacks=args.portable_fallbacks,
                        progress=progress)
        progress("write " + args.output)
        Path(args.output).write_bytes(manager.buffer)
        progress.done()
    except (CliError, EdgeportError, ValueError) as exc:
        progress.done()
        first, *rest = str(exc).splitlines() or [""]
        print(f"edgeport lower: {first}", file=sys.stderr)
        for line in rest:
            print(line, file=sys.stderr)
        return 2
    report = manager.lowering_report
    print(f"wrote {args.output} ({len(manager.buffer)} bytes), target {report.target}")
    print(report.table())
    return 0


def configure_run_command(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="path of a .pte")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs, in the order they were saved (default: random, "
                   "seed 0, shaped from the program)")
    p.add_argument("--method", default="forward")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run N times and report the latency")
    p.add_argument("--on-backend-unavailable", choices=["error", "portable"], default="error",
                   help="'portable': run a delegate whose backend is unavailable on its portable fallback")
    p.set_defaults(func=run_run)


def _inputs(args: argparse.Namespace, method: Any) -> list[Any]:
    import numpy as np

    if args.inputs:
        try:
            with np.load(args.inputs) as data:
                return [data[k] for k in data.files]
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read inputs {args.inputs!r}: {exc}; give an .npz written by numpy.savez") from exc
    meta = method.metadata
    rng = np.random.default_rng(0)
    arrays = []
    for shape, dtype in zip(meta.input_shapes, meta.input_dtypes, strict=True):
        if shape is None or dtype is None:
            raise CliError("the program has a non-tensor input; pass --inputs FILE.npz")
        arrays.append(rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f"
                      else np.zeros(shape, dtype))
    return arrays


def run_run(args: argparse.Namespace) -> int:
    import numpy as np

    from edgeport.errors import EdgeportError
    from edgeport.runtime import Runtime

    if args.repeat < 1:
        print("edgeport run: --repeat must be >= 1", file=sys.stderr)
        return 2
    try:
        program = Runtime.get().load_program(args.program)
        method = program.load_method(args.method, on_backend_unavailable=args.on_backend_unavailable)
        inputs = _inputs(args, method)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            outputs = method.execute(inputs)
            times.append(time.perf_counter() - start)
    except (CliError, EdgeportError, OSError) as exc:
        print(f"edgeport run: {exc}", file=sys.stderr)
        return 2
    with np.printoptions(precision=5, threshold=20, edgeitems=3):
        for i, out in enumerate(outputs):
            arr = np.asarray(out)
            print(f"output {i}: {arr.dtype}{list(arr.shape)} {arr.reshape(-1)[:8]}")
    ms = sorted(t * 1e3 for t in times)
    print(f"latency over {len(ms)} run(s): min {ms[0]:.3f} ms, median {ms[len(ms) // 2]:.3f} ms, "
          f"mean {sum(ms) / len(ms):.3f} ms")
    for d in method.profile.fallbacks:
        print(f"fallback: delegate {d.index} ({d.backend_id}) ran on {d.fallback_method}: {d.reason}")
    return 0
