"""Inputs whose shape differs from the blob's declared dims only by size-1 dimensions are views, and accepted.

ExecuTorch's runtime hands a lifted scalar constant to the delegate as a 0-d tensor where the blob declares [1]
(GPT-2, T5 and Llama programs written by ExecuTorch); its XNNPACK delegate accepts that, and so must ours. Any
other difference is refused with the expected shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.errors import RuntimeExecutionError
from edgeport.program import load_pte
from edgeport_xnnpack import XnnpackPartitioner
from edgeport_xnnpack.runtime import XnnpackExecutor


#: the program's constant argument: the added 1.0 (a static operand XNNPACK does not pack is a trailing delegate
#: argument, as in ExecuTorch's programs)
ONE = np.array([1.0], np.float32)


class ScaleBy(torch.nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * s + 1.0


@pytest.fixture(scope="module")
def delegate():
    x, s = torch.randn(2, 3), torch.tensor([0.5])
    pte = to_edge_transform_and_lower(torch.export.export(ScaleBy(), (x, s)),
                                      partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    lp = load_pte(pte)
    assert len(lp.program.execution_plan[0].delegates) == 1
    ex = XnnpackExecutor(num_threads=1)
    handle = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)
    yield ex, handle
    ex.destroy(handle)


def test_zero_d_scalar_for_a_declared_1_element_input(delegate):
    ex, handle = delegate
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for s in (np.array(0.25, np.float32), np.array([0.25], np.float32), np.array([[0.25]], np.float32)):
        (got,) = ex.execute(handle, [x, s, ONE])
        np.testing.assert_allclose(got, x * 0.25 + 1.0, rtol=1e-6)


@pytest.mark.parametrize("shape", [(3, 2), (6,), (2,), (1, 2, 3, 2)])
def test_other_shapes_are_refused_with_the_expected_one(delegate, shape):
    ex, handle = delegate
    x = np.zeros(shape, np.float32)
    with pytest.raises(RuntimeExecutionError, match=r"input 0 must be float32 of shape \[2, 3\]"):
        ex.execute(handle, [x, np.array([1.0], np.float32), ONE])
