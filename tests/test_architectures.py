"""Real architectures on the portable paths (Hugging Face ``transformers`` models from small configs, random
weights; :mod:`edgeport.testing.architectures`).

Paths, each compared with eager PyTorch within 1e-4 of the output's scale (:func:`assert_close_to_scale`):

* ``portable``: edgeport's program (``edgeport.to_edge(ep).to_executorch()``) on edgeport's runtime and on the
  stock ExecuTorch runtime (in child processes: a crash fails the case, naming it);
* ``et_portable``: ExecuTorch 1.5.1's own program (``executorch.exir.to_edge``) on edgeport's runtime;
* text models exported with a bounded dynamic sequence length, run at several lengths below the bound and at it,
  on both runtimes (edgeport's program) and on edgeport's runtime (ExecuTorch's program).

The XNNPACK paths of the same architectures are in ``tests/test_architectures_xnnpack.py``. Each architecture is
exported and lowered once per module (``_lowered``); every stock-runtime case of the module runs in one batch
(``_stock``). ``size="medium"`` configs run in the slow tests.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from edgeport import to_edge
from edgeport.errors import EdgeportError
from edgeport.runtime import Runtime
from edgeport.testing.architectures import (
    ARCHITECTURES,
    TEXT_ARCHITECTURES,
    Architecture,
    assert_close_to_scale,
    eager_outputs,
)
from edgeport.testing.conformance.stock_checks import stock_runtime_missing
from edgeport.testing.stock_runtime import run_cases

pytest.importorskip("transformers")
pytestmark = pytest.mark.executorch
if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)

NAMES = sorted(ARCHITECTURES)
PATHS = ("portable", "et_portable")


def _lower(ep: torch.export.ExportedProgram, path: str) -> bytes:
    if path == "portable":
        return to_edge(ep).to_executorch().buffer
    from executorch.exir import to_edge as et_to_edge

    return et_to_edge(ep).to_executorch().buffer


@functools.cache
def _arch(name: str, size: str = "small") -> Architecture:
    return ARCHITECTURES[name](seed=0, size=size)


@functools.cache
def _lowered(name: str, path: str, dynamic: bool, size: str = "small") -> bytes:
    arch = _arch(name, size)
    # a fresh export per path: ExecuTorch's to_edge alters the exported program's shape environment
    ep = torch.export.export(arch.model, arch.example_inputs, dynamic_shapes=arch.dynamic_shapes if dynamic else None)
    return _lower(ep, path)


def _inputs(name: str, dynamic: bool, size: str = "small") -> list[tuple[int | None, tuple[torch.Tensor, ...]]]:
    arch = _arch(name, size)
    if not dynamic:
        return [(None, arch.example_inputs)]
    return [(n, arch.inputs_for(n)) for n in arch.seq_lengths]


def _run_ours(pte: bytes, inputs_list) -> list[np.ndarray]:
    method = Runtime.get().load_program(pte).load_method("forward")
    return [method.execute([t.numpy() for t in inputs])[0] for _, inputs in inputs_list]


def _case(name: str, dynamic: bool, n: int | None, size: str = "small") -> str:
    return f"{name}-{size}-{'seq' + str(n) if dynamic else 'static'}"


def _stock_batch(size: str) -> dict:
    cases = []
    for name in NAMES:
        for dynamic in (False, True) if name in TEXT_ARCHITECTURES else (False,):
            pte = _lowered(name, "portable", dynamic, size)
            for n, inputs in _inputs(name, dynamic, size):
                cases.append((_case(name, dynamic, n, size), pte, "forward", [t.detach() for t in inputs]))
    return {r.name: r for r in run_cases(cases)}


@pytest.fixture(scope="module")
def stock() -> dict:
    """Every small edgeport program of this module on the stock runtime, one batch: case name -> StockResult."""
    return _stock_batch("small")


def _check_stock(result, want: np.ndarray, where: str) -> None:
    assert result.crash is None, f"{result.describe()}\n{result.log}"
    assert result.outputs is not None, result.describe()
    assert_close_to_scale(result.outputs[0], want, where)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_static_shapes_on_edgeport_runtime(name, path):
    (got,) = _run_ours(_lowered(name, path, False), _inputs(name, False))
    assert_close_to_scale(got, eager_outputs(_arch(name)), f"{name} {path} on edgeport's runtime")


@pytest.mark.parametrize("name", NAMES)
def test_static_shapes_on_stock_runtime(name, stock):
    _check_stock(stock[_case(name, False, None)], eager_outputs(_arch(name)), f"{name} on the stock runtime")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", TEXT_ARCHITECTURES)
def test_dynamic_sequence_on_edgeport_runtime(name, path):
    arch = _arch(name)
    runs = _inputs(name, True)
    for (n, inputs), out in zip(runs, _run_ours(_lowered(name, path, True), runs)):
        assert_close_to_scale(out, eager_outputs(arch, inputs), f"{name} {path}, sequence {n}, edgeport's runtime")


@pytest.mark.parametrize("name", TEXT_ARCHITECTURES)
def test_dynamic_sequence_on_stock_runtime(name, stock):
    arch = _arch(name)
    for n, inputs in _inputs(name, True):
        _check_stock(stock[_case(name, True, n)], eager_outputs(arch, inputs), f"{name}, sequence {n}, stock runtime")


def test_sequence_lengths_cover_the_bound_and_below():
    for name in TEXT_ARCHITECTURES:
        arch = _arch(name)
        bound = arch.dynamic_shapes["x"][1].max
        assert max(arch.seq_lengths) == bound and sum(n < bound for n in arch.seq_lengths) >= 3, name


def test_a_length_past_the_bound_is_refused_clearly():
    arch = _arch("bert")
    method = Runtime.get().load_program(_lowered("bert", "portable", True)).load_method("forward")
    too_long = arch.inputs_for(max(arch.seq_lengths) + 1)[0].numpy()
    with pytest.raises(EdgeportError, match=r"input 0.*exceeds the upper bound"):
        method.execute([too_long])
    (got,) = method.execute([arch.example_inputs[0].numpy()])  # the method still runs after the refusal
    assert_close_to_scale(got, eager_outputs(arch), "bert after a refused input")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_medium_configs_on_both_runtimes(name):
    arch = _arch(name, "medium")
    dynamic = name in TEXT_ARCHITECTURES
    runs = _inputs(name, dynamic, "medium")
    pte = _lowered(name, "portable", dynamic, "medium")
    results = run_cases([(_case(name, dynamic, n, "medium"), pte, "forward", [t.detach() for t in inputs])
                         for n, inputs in runs])
    for (n, inputs), got, result in zip(runs, _run_ours(pte, runs), results):
        want = eager_outputs(arch, inputs)
        assert_close_to_scale(got, want, f"{name} medium, sequence {n}, edgeport's runtime")
        _check_stock(result, want, f"{name} medium, sequence {n}, stock runtime")
    (theirs,) = _run_ours(_lowered(name, "et_portable", False, "medium"), _inputs(name, False, "medium"))
    assert_close_to_scale(theirs, eager_outputs(arch), f"{name} medium, ExecuTorch's program, edgeport's runtime")
