"""Portable kernels run with numpy's floating-point warnings off (division by zero, overflow, NaN are values in
a model, as in PyTorch), and the caller's error state is the same after a run, also after a failing one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import edgeport  # noqa: E402
from edgeport.errors import RuntimeExecutionError  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402


class Risky(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return (x / y + torch.log(y) + torch.exp(x * 1e3))[idx]


def test_kernels_run_quietly_and_leave_the_callers_error_state():
    x, y, idx = torch.tensor([1.0, -1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 0.0, 1.0]), torch.tensor([0, 3])
    pte = edgeport.to_edge(torch.export.export(Risky(), (x, y, idx))).to_executorch().buffer
    method = Runtime.get().load_program(pte).load_method()
    with np.errstate(divide="raise", over="warn", invalid="ignore", under="ignore"):
        before = np.geterr()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (got,) = method.execute([x.numpy(), y.numpy(), idx.numpy()])
        np.testing.assert_array_equal(got, Risky()(x, y, idx).numpy())
        assert np.geterr() == before
        with pytest.raises(RuntimeExecutionError):  # an index out of range fails inside a kernel
            method.execute([x.numpy(), y.numpy(), np.array([0, 9])])
        assert np.geterr() == before
