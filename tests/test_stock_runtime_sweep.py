"""Nothing edgeport writes crashes the stock ExecuTorch runtime: every op with sample inputs and every zoo model,
lowered to a portable program (and every zoo model to XNNPACK), runs on ExecuTorch 1.5.1's runtime in child
processes and matches eager PyTorch. (XNNPACK's per-op sweep is its conformance suite's
``test_stock_runtime_matches_eager``.)"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from edgeport import to_edge, to_edge_transform_and_lower
from edgeport.backend import CapabilityTable, OpCapability
from edgeport.testing.conformance.cases import Case, op_cases
from edgeport.testing.conformance.harness import DEFAULT_MODEL_TOLERANCES, DEFAULT_TOLERANCES
from edgeport.testing.conformance.runtime_checks import compare_outputs
from edgeport.testing.conformance.samples import SAMPLES
from edgeport.testing.conformance.stock_checks import stock_runtime_missing
from edgeport.testing.models import MODELS
from edgeport.testing.stock_runtime import run_cases

pytestmark = pytest.mark.executorch
if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)

# float32 with two samples per op (shapes and broadcasting vary), int32 and bool with one: ~300 programs.
_SWEEP = {"float32": 2, "int32": 1, "bool": 1}
OP_CASES = {
    c.id: c
    for dtype, samples in _SWEEP.items()
    for c in op_cases(CapabilityTable(tuple(OpCapability(op, (dtype,)) for op in sorted(SAMPLES))),
                      max_samples=samples)[0]
    if c.error is None
}

# Where the stock runtime's kernels differ from PyTorch on programs edgeport writes exactly as ExecuTorch 1.5.1
# writes them (its own program for the same model behaves the same way): strict, so a fix upstream shows up.
STOCK_KERNEL_GAPS = {
    "aten.add.Scalar-bool-*": "ExecuTorch 1.5.1's add.Scalar_out refuses a bool input with an int64 result "
                              "(error 0x12); ExecuTorch's own program for it is refused the same way",
    "aten.pow.Tensor_Tensor-int32-*": "ExecuTorch 1.5.1's integer pow goes through floating point: 0 ** -1 gives "
                                      "INT_MIN where PyTorch gives 0 (ExecuTorch's own program does the same)",
}


def _gap(case_id: str):
    from fnmatch import fnmatchcase

    reasons = [r for pattern, r in STOCK_KERNEL_GAPS.items() if fnmatchcase(case_id, pattern)]
    return [pytest.mark.xfail(reason=reasons[0], strict=True)] if reasons else []


def _flatten(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _portable_op_case(case: Case):
    """``(pte, inputs, expected)``, or ``None`` when eager PyTorch itself refuses the sample (not a case)."""
    module, inputs = case.build()
    try:
        with torch.no_grad():
            expected = _flatten(module(*copy.deepcopy(inputs)))
    except Exception:  # noqa: BLE001 - the sample is invalid for this dtype in eager PyTorch too
        return None
    pte = to_edge(torch.export.export(module, inputs)).to_executorch().buffer
    return pte, inputs, expected


def _model_case(name: str, backend: str):
    module, inputs = MODELS[name](seed=0)
    with torch.no_grad():
        expected = _flatten(module(*copy.deepcopy(inputs)))
    ep = torch.export.export(module, inputs)
    if backend == "portable":
        pte = to_edge(ep).to_executorch().buffer
    else:
        from edgeport_xnnpack import XnnpackPartitioner

        pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    return pte, inputs, expected


MODEL_CASES = [(f"{name}-{backend}", name, backend) for name in sorted(MODELS) for backend in ("portable", "xnnpack")]


@functools.cache
def _op_results():
    built = {cid: _portable_op_case(case) for cid, case in OP_CASES.items()}
    batch = [(cid, b[0], "forward", [t.detach() for t in b[1]]) for cid, b in built.items() if b is not None]
    return built, {r.name: r for r in run_cases(batch)}


@functools.cache
def _model_results():
    built = {cid: _model_case(name, backend) for cid, name, backend in MODEL_CASES}
    batch = [(cid, b[0], "forward", [t.detach() for t in b[1]]) for cid, b in built.items()]
    return built, {r.name: r for r in run_cases(batch)}


def _check(result, expected, tolerances, where):
    assert result.crash is None, f"{result.describe()}\n--- child stderr (tail) ---\n{result.log}"
    assert result.outputs is not None, result.describe()
    compare_outputs(result.outputs, expected, tolerances, where)


@pytest.mark.parametrize("case_id", [pytest.param(c, marks=_gap(c)) for c in sorted(OP_CASES)])
def test_portable_op_runs_on_stock_runtime(case_id):
    built, results = _op_results()
    if built[case_id] is None:
        pytest.skip(f"{case_id}: eager PyTorch refuses this sample")
    _check(results.get(case_id), built[case_id][2], DEFAULT_TOLERANCES, f"{case_id} (portable, stock runtime)")


@pytest.mark.parametrize("case_id", [c[0] for c in MODEL_CASES])
def test_zoo_model_runs_on_stock_runtime(case_id):
    built, results = _model_results()
    _check(results.get(case_id), built[case_id][2], DEFAULT_MODEL_TOLERANCES, f"{case_id} (stock runtime)")
