"""Small models whose graphs hold what ExecuTorch's ``to_edge`` accepts beyond plain core ATen: assertion nodes
(``_assert_scalar`` on a data-dependent length, ``one_hot``'s ``_assert_async`` data checks), ops it decomposes
(``linalg_vector_norm``), and symbolic sizes used as tensor or scalar arguments under a dynamic dim.

Each is lowered by edgeport and run on edgeport's runtime and on the stock ExecuTorch runtime (child processes,
one batch for the module), and ExecuTorch's own program runs on edgeport's runtime; all against eager PyTorch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from edgeport import to_edge
from edgeport.runtime import Runtime
from edgeport.testing.conformance.stock_checks import stock_runtime_missing
from edgeport.testing.stock_runtime import run_cases

pytestmark = pytest.mark.executorch
if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)

_GEN = torch.Generator().manual_seed(0)
SEQ = torch.export.Dim("n", min=2, max=8)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_GEN)


class Nonzero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)


class MeanOfNonzero(torch.nn.Module):
    def forward(self, x):
        nz = torch.nonzero(x > 0)
        torch._check(nz.shape[0] >= 1)
        return nz.sum(0) / nz.shape[0]


class OneHot(torch.nn.Module):
    def forward(self, i):
        return torch.nn.functional.one_hot(i, 6)


class Norms(torch.nn.Module):
    def forward(self, x):
        return (torch.nn.functional.normalize(x, dim=-1), x.norm(dim=0, keepdim=True),
                torch.linalg.vector_norm(x, ord=float("inf")), torch.linalg.vector_norm(x, ord=1, dim=1))


class SizesAsArguments(torch.nn.Module):
    """A dynamic size as a divisor, a ``where`` branch and ``rsub``/``pow`` operands."""

    def forward(self, x):
        n = x.shape[1]
        return x.sum(1) / n, torch.where(x > 0, x, n), torch.rsub(x, n), torch.pow(x, n)


class FloatSizes(torch.nn.Module):
    """A dynamic size made a float (``torch.sym_float``): ExecuTorch 1.5.1's to_edge refuses it, edgeport runs it."""

    def forward(self, x):
        n = x.shape[1]
        return torch.clamp(x, max=n * 0.1), x * (n * 0.5)


@dataclass
class Model:
    module: torch.nn.Module
    probes: list[torch.Tensor]  # first one exports
    dynamic: Any = None
    executorch_lowers: bool = True


MODELS = {
    "nonzero": Model(Nonzero(), [_randn(3, 4), torch.ones(3, 4), -torch.ones(3, 4)]),
    "mean_of_nonzero": Model(MeanOfNonzero(), [_randn(3, 4), torch.eye(3, 4)]),
    "one_hot": Model(OneHot(), [torch.tensor([1, 5, 0]), torch.tensor([2, 2, 3])]),
    "norms": Model(Norms(), [_randn(4, 6)]),
    "sizes_as_arguments": Model(SizesAsArguments(), [_randn(2, 5), _randn(2, 2), _randn(2, 8)],
                                {"x": {1: SEQ}}),
    "float_sizes": Model(FloatSizes(), [_randn(2, 5), _randn(2, 2), _randn(2, 8)], {"x": {1: SEQ}},
                         executorch_lowers=False),
}


@functools.cache
def _ours(name: str) -> bytes:
    m = MODELS[name]
    return to_edge(torch.export.export(m.module, (m.probes[0],), dynamic_shapes=m.dynamic)).to_executorch().buffer


@functools.cache
def _theirs(name: str) -> bytes:
    from executorch.exir import to_edge as et_to_edge

    m = MODELS[name]  # a fresh export: ExecuTorch's to_edge alters the exported program's shape environment
    return et_to_edge(torch.export.export(m.module, (m.probes[0],), dynamic_shapes=m.dynamic)).to_executorch().buffer


def _eager(name: str, probe: torch.Tensor) -> list[np.ndarray]:
    out = MODELS[name].module(probe)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _check(got: list[Any], want: list[np.ndarray], where: str) -> None:
    assert len(got) == len(want), f"{where}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, f"{where}, output {k}: {g.dtype}{list(g.shape)}, " \
                                                          f"expected {w.dtype}{list(w.shape)}"
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{where}, output {k}")


@functools.cache
def _stock() -> dict:
    cases = [(f"{name}-{k}", _ours(name), "forward", [p]) for name, m in MODELS.items()
             for k, p in enumerate(m.probes)]
    return {r.name: r for r in run_cases(cases)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgeport_program_on_edgeport_runtime(name):
    method = Runtime.get().load_program(_ours(name)).load_method("forward")
    for k, probe in enumerate(MODELS[name].probes):
        _check(method.execute([probe.numpy()]), _eager(name, probe), f"{name} probe {k}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_edgeport_program_on_stock_runtime(name):
    for k, probe in enumerate(MODELS[name].probes):
        result = _stock()[f"{name}-{k}"]
        assert result.ok, f"{result.describe()}\n{result.log}"
        _check(result.outputs, _eager(name, probe), f"{name} probe {k}, stock runtime")


@pytest.mark.parametrize("name", sorted(n for n, m in MODELS.items() if m.executorch_lowers))
def test_executorch_program_on_edgeport_runtime(name):
    method = Runtime.get().load_program(_theirs(name)).load_method("forward")
    for k, probe in enumerate(MODELS[name].probes):
        _check(method.execute([probe.numpy()]), _eager(name, probe), f"{name} probe {k} (ExecuTorch's program)")
