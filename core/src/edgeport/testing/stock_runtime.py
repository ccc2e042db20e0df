"""Run programs on the stock ExecuTorch runtime in a child interpreter, so that a crash fails a case, not the run.

The stock runtime trusts what it is given: a field written differently from what it expects can make it read freed
or unmapped memory and die with SIGSEGV. :func:`run_cases` hands a batch of ``(name, pte, method, inputs)`` cases to
one child process (``executorch.runtime``, loaded from a file, i.e. memory-mapped as on a device), which runs them in
order and reports each result as it goes; when the child dies, the case it was running is reported as crashed
(with the signal and the tail of its stderr) and a new child goes on with the rest.

Neither this module nor anything else in edgeport imports ``executorch`` (a test-only oracle): the child is
``python -m edgeport_stockcheck.child``, from the test-only distribution ``testing/edgeport-stockcheck`` that the
README's install step installs beside ``executorch``. Inputs and outputs are numpy arrays (or Python scalars for
non-tensor values).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the child's module (test-only distribution ``testing/edgeport-stockcheck``): it imports ``executorch.runtime``
CHILD_MODULE = "edgeport_stockcheck.child"


@dataclass
class StockResult:
    """What the stock runtime did with one case: ``outputs`` when it ran, else ``error`` (a Python exception the
    runtime raised) or ``crash`` (the child died: signal or exit code, and the tail of its stderr)."""

    name: str
    outputs: list[Any] | None = None
    error: str | None = None
    crash: str | None = None
    log: str = field(default="", repr=False)
    etdump: bytes | None = field(default=None, repr=False)  # the run's ETDump, when the case asked for profiling

    @property
    def ok(self) -> bool:
        return self.outputs is not None

    def describe(self) -> str:
        if self.crash is not None:
            return f"{self.name}: the stock ExecuTorch runtime CRASHED ({self.crash})"
        if self.error is not None:
            return f"{self.name}: the stock ExecuTorch runtime refused it: {self.error}"
        return f"{self.name}: ran"


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _read_report(path: Path) -> list[tuple[Any, ...]]:
    records = []
    data = path.read_bytes() if path.exists() else b""
    pos = 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos:pos + 8], "little")
        if pos + 8 + size > len(data):
            break  # the child died while writing: the case stays "started"
        records.append(pickle.loads(data[pos + 8:pos + 8 + size]))
        pos += 8 + size
    return records


def run_cases(cases: Sequence[tuple[Any, ...]], *, timeout: float = 600.0,
              python: str | None = None) -> list[StockResult]:
    """Run each ``(name, pte_bytes, method, inputs)`` case on the stock ExecuTorch runtime, in child processes.

    A case may carry a fifth element: the bytes of the ``.ptd`` data file the program needs (the stock Python
    runtime takes one), passed as ``load_program(pte, data_path=...)``, a sixth: ``True`` when ``inputs`` is
    a list of steps (input lists) to execute in order on one loaded method (state carries between them); its
    outputs are then one list per step, and a seventh: ``True`` to profile the run (``enable_etdump=True``; the
    result's ``etdump`` holds the ETDump the runtime wrote).

    Returns one :class:`StockResult` per case, in order. A child that dies takes only its current case with it;
    the rest run in a fresh child. ``python`` is the interpreter to use (default: this one).
    """
    results: list[StockResult | None] = [None] * len(cases)
    with tempfile.TemporaryDirectory(prefix="edgeport-stock-") as tmp:
        work = Path(tmp)
        listed = []
        for i, case in enumerate(cases):
            name, pte, method, inputs = case[:4]
            path = work / f"case{i}.pte"
            path.write_bytes(bytes(pte))
            data_path = None
            if len(case) > 4 and case[4] is not None:
                data_path = work / f"case{i}.ptd"
                data_path.write_bytes(bytes(case[4]))
            steps = bool(len(case) > 5 and case[5])
            etdump = str(work / f"case{i}.etdp") if len(case) > 6 and case[6] else None
            listed.append((name, str(path), method, [list(s) for s in inputs] if steps else list(inputs),
                           None if data_path is None else str(data_path), steps, etdump))
        (work / "cases.pkl").write_bytes(pickle.dumps(listed))
        start = 0
        while start < len(cases):
            report = work / "report.bin"
            report.unlink(missing_ok=True)
            env = dict(os.environ, PYTHONFAULTHANDLER="1")
            try:
                proc = subprocess.run([python or sys.executable, "-m", CHILD_MODULE, str(work), str(start)],
                                      capture_output=True, text=True, timeout=timeout, env=env, check=False)
                code, stderr = proc.returncode, proc.stderr
            except subprocess.TimeoutExpired as exc:
                code, stderr = None, (exc.stderr or b"").decode(errors="replace") if isinstance(
                    exc.stderr, bytes) else (exc.stderr or "")
            running = None
            for record in _read_report(report):
                if record[0] == "start":
                    running = record[1]
                else:
                    _, index, outputs, error = record
                    dump = listed[index][6]
                    results[index] = StockResult(listed[index][0], outputs=outputs, error=error, etdump=(
                        Path(dump).read_bytes() if dump is not None and Path(dump).exists() else None))
                    running = None
            if running is None:
                if all(r is not None for r in results[start:]):
                    break
                # The child died before starting a case (e.g. executorch failed to import): every case left fails.
                reason = "timed out" if code is None else _exit_reason(code)
                for i in range(start, len(cases)):
                    if results[i] is None:
                        results[i] = StockResult(listed[i][0], crash=f"child failed before the case: {reason}",
                                                 log=stderr[-4000:])
                break
            reason = f"timed out after {timeout:.0f} s" if code is None else _exit_reason(code)
            results[running] = StockResult(listed[running][0], crash=reason, log=stderr[-4000:])
            start = running + 1
    return [r for r in results if r is not None]


def run_program(pte: bytes, inputs: Sequence[Any], method: str = "forward", *, name: str = "program",
                timeout: float = 600.0, data: bytes | None = None) -> StockResult:
    """Run one program (with its ``.ptd`` bytes ``data``, if any) on the stock ExecuTorch runtime in a child
    process (see :func:`run_cases`)."""
    return run_cases([(name, pte, method, inputs, data)], timeout=timeout)[0]


def run_steps(pte: bytes, steps: Sequence[Sequence[Any]], method: str = "forward", *, name: str = "program",
              timeout: float = 600.0, data: bytes | None = None) -> StockResult:
    """Execute one loaded method of a (stateful) program once per step, in order, on the stock ExecuTorch runtime
    in a child process; ``outputs`` is one output list per step."""
    return run_cases([(name, pte, method, [list(s) for s in steps], data, True)], timeout=timeout)[0]


def profile_program(pte: bytes, steps: Sequence[Sequence[Any]], method: str = "forward", *,
                    name: str = "program", timeout: float = 600.0, data: bytes | None = None) -> StockResult:
    """Execute one loaded method once per step (input list) on the stock ExecuTorch runtime with profiling on
    (in a child process); ``etdump`` is the ETDump it wrote (one ``Execute`` block per step), ``outputs`` one
    output list per step."""
    return run_cases([(name, pte, method, [list(s) for s in steps], data, True, True)], timeout=timeout)[0]
