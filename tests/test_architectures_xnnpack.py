"""Real architectures on the XNNPACK paths (Hugging Face ``transformers`` models from small configs, random
weights; :mod:`edgeport.testing.architectures`).

Paths, each compared with eager PyTorch within 1e-4 of the output's scale (:func:`assert_close_to_scale`):

* ``xnnpack``: edgeport's program (``to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])``) on
  edgeport's runtime and on the stock ExecuTorch runtime (in child processes: a crash fails the case, naming it);
* ``et_xnnpack``: ExecuTorch 1.5.1's own XNNPACK program on edgeport's runtime;
* text models exported with a bounded dynamic sequence length, run at several lengths below the bound and at it,
  on both runtimes (edgeport's program) and on edgeport's runtime (ExecuTorch's program: its delegate encodes
  upper-bound shapes, which edgeport's executor re-specializes per length).

The portable paths are in ``tests/test_architectures.py``. ExecuTorch's XNNPACK lowering takes 5-15 s per model:
its dynamic programs run for two architectures in the default run and for all in the slow run, as do the
``size="medium"`` configs.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
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
pytest.importorskip("edgeport_xnnpack")
pytestmark = pytest.mark.executorch
if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)

NAMES = sorted(ARCHITECTURES)
PATHS = ("xnnpack", "et_xnnpack")
# ExecuTorch's dynamic XNNPACK programs in the default run (one encoder with absolute positions, one decoder with
# rotary positions and grouped-query attention); the others in the slow run
DEFAULT_ET_DYNAMIC = ("bert", "llama")


def _lower(ep: torch.export.ExportedProgram, path: str) -> bytes:
    if path == "xnnpack":
        from edgeport_xnnpack import XnnpackPartitioner

        return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import to_edge_transform_and_lower as et_lower

    return et_lower(ep, partitioner=[EtXnnpack()]).to_executorch().buffer


@functools.cache
def _arch(name: str, size: str = "small") -> Architecture:
    return ARCHITECTURES[name](seed=0, size=size)


@functools.cache
def _lowered(name: str, path: str, dynamic: bool, size: str = "small") -> bytes:
    arch = _arch(name, size)
    # a fresh export per path: ExecuTorch's lowering alters the exported program's shape environment
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


@pytest.fixture(scope="module")
def stock() -> dict:
    """Every small edgeport XNNPACK program of this module on the stock runtime, one batch: case -> StockResult."""
    cases = []
    for name in NAMES:
        for dynamic in (False, True) if name in TEXT_ARCHITECTURES else (False,):
            pte = _lowered(name, "xnnpack", dynamic)
            for n, inputs in _inputs(name, dynamic):
                cases.append((_case(name, dynamic, n), pte, "forward", [t.detach() for t in inputs]))
    return {r.name: r for r in run_cases(cases)}


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
    _check_stock(stock[_case(name, False, None)], eager_outputs(_arch(name)), f"{name} xnnpack on the stock runtime")


def _dynamic_params():
    params = []
    for name in TEXT_ARCHITECTURES:
        for path in PATHS:
            slow = path == "et_xnnpack" and name not in DEFAULT_ET_DYNAMIC
            params.append(pytest.param(name, path, marks=[pytest.mark.slow] if slow else [], id=f"{name}-{path}"))
    return params


@pytest.mark.parametrize("name, path", _dynamic_params())
def test_dynamic_sequence_on_edgeport_runtime(name, path):
    arch = _arch(name)
    runs = _inputs(name, True)
    for (n, inputs), out in zip(runs, _run_ours(_lowered(name, path, True), runs)):
        assert_close_to_scale(out, eager_outputs(arch, inputs), f"{name} {path}, sequence {n}, edgeport's runtime")


@pytest.mark.parametrize("name", TEXT_ARCHITECTURES)
def test_dynamic_sequence_on_stock_runtime(name, stock):
    arch = _arch(name)
    for n, inputs in _inputs(name, True):
        _check_stock(stock[_case(name, True, n)], eager_outputs(arch, inputs),
                     f"{name} xnnpack, sequence {n}, stock runtime")


def _kernels_outside_delegates(pte: bytes) -> int:
    from edgeport.program import load_pte
    from edgeport.program import schema as S

    plan = next(p for p in load_pte(pte).program.execution_plan if p.name == "forward")
    return sum(isinstance(ins.instr_args, S.KernelCall) for chain in plan.chains for ins in chain.instructions)


@pytest.mark.parametrize("name", NAMES)
def test_no_more_left_outside_xnnpack_than_executorch_leaves(name):
    """edgeport's partitioner leaves at most as many portable kernel calls as ExecuTorch's on the same export."""
    ours = _kernels_outside_delegates(_lowered(name, "xnnpack", False))
    theirs = _kernels_outside_delegates(_lowered(name, "et_xnnpack", False))
    assert ours <= theirs, f"{name}: edgeport leaves {ours} kernel calls outside XNNPACK, ExecuTorch {theirs}"


def test_a_length_past_the_bound_is_refused_clearly():
    arch = _arch("bert")
    method = Runtime.get().load_program(_lowered("bert", "xnnpack", True)).load_method("forward")
    too_long = arch.inputs_for(max(arch.seq_lengths) + 1)[0].numpy()
    with pytest.raises(EdgeportError, match=r"input 0.*exceeds the upper bound"):
        method.execute([too_long])
    (got,) = method.execute([arch.example_inputs[0].numpy()])  # the method still runs after the refusal
    assert_close_to_scale(got, eager_outputs(arch), "bert xnnpack after a refused input")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_medium_configs_on_both_runtimes(name):
    arch = _arch(name, "medium")
    dynamic = name in TEXT_ARCHITECTURES
    runs = _inputs(name, dynamic, "medium")
    pte = _lowered(name, "xnnpack", dynamic, "medium")
    results = run_cases([(_case(name, dynamic, n, "medium"), pte, "forward", [t.detach() for t in inputs])
                         for n, inputs in runs])
    for (n, inputs), got, result in zip(runs, _run_ours(pte, runs), results):
        want = eager_outputs(arch, inputs)
        assert_close_to_scale(got, want, f"{name} medium xnnpack, sequence {n}, edgeport's runtime")
        _check_stock(result, want, f"{name} medium xnnpack, sequence {n}, stock runtime")
    (theirs,) = _run_ours(_lowered(name, "et_xnnpack", False, "medium"), _inputs(name, False, "medium"))
    assert_close_to_scale(theirs, eager_outputs(arch), f"{name} medium, ExecuTorch's XNNPACK program, edgeport's runtime")
