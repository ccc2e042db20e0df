"""The conformance suite's check on the stock ExecuTorch runtime: every case's program, run in child processes.

All cases of a suite class go to the stock runtime in one batch (:func:`edgeport.testing.stock_runtime.run_cases`:
one child interpreter, restarted after a crash), so the check costs one interpreter start, not one per case; each
case's test then reads its own result: a crash or a refusal fails that case, naming it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping

from edgeport.testing.conformance.harness import Case, LoweredCase
from edgeport.testing.conformance.runtime_checks import compare_outputs
from edgeport.testing.stock_runtime import StockResult, run_cases


def stock_runtime_missing() -> str | None:
    """Why the stock ExecuTorch runtime cannot be used here, or ``None``."""
    if importlib.util.find_spec("executorch") is None:
        return "the stock ExecuTorch runtime is not installed (test-only oracle: pip install executorch==1.5.1)"
    if importlib.util.find_spec("edgeport_stockcheck") is None:
        return ("the stock-runtime child is not installed (test-only: pip install ./testing/edgeport-stockcheck from "
                "the edgeport repository)")
    return None


def run_all_on_stock(cases: Iterable[Case], lower: Callable[[Case], LoweredCase]) -> dict[str, StockResult]:
    """Lower every buildable case and run those that produced a program on the stock runtime, in one batch."""
    batch = []
    for case in cases:
        if case.error is not None:
            continue
        lc = lower(case)
        if lc.pte is None:
            continue
        inputs = [t.detach() for t in lc.inputs]
        batch.append((case.id, lc.pte, "forward", inputs))
    return {r.name: r for r in run_cases(batch)}


def check_stock_result(result: StockResult | None, lowered: LoweredCase,
                       tolerances: Mapping[str, tuple[float, float]]) -> None:
    """Assert the stock runtime ran the case's program and matched eager PyTorch."""
    where = f"{lowered.case.id} on the stock ExecuTorch runtime"
    assert result is not None, f"{where}: the case was not run (no program)"
    if result.crash is not None:
        raise AssertionError(f"{result.describe()}\n--- child stderr (tail) ---\n{result.log}")
    assert result.outputs is not None, result.describe()
    compare_outputs(result.outputs, lowered.expected, tolerances, where)
