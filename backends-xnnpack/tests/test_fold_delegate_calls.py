"""The runtime folds XNNPACK delegate calls whose inputs are all constants (``XnnpackExecutor.pure``): a Llama-style
model's rotary-embedding tables (inverse frequencies x constant positions) are computed once at load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.runtime import Runtime
from edgeport.testing.architectures import ARCHITECTURES, assert_close_to_scale, eager_outputs
from edgeport_xnnpack import XnnpackPartitioner


def _delegate_ops(method) -> int:
    return sum(1 for _ops, _jump, labels in method._plan.chains for label in labels if "(delegate " in label)


@pytest.fixture(scope="module")
def llama():
    arch = ARCHITECTURES["llama"](seed=0, size="small")
    ep = torch.export.export(arch.model, tuple(arch.example_inputs))
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    return arch, pte


def test_delegate_calls_on_constants_run_once_at_load(llama):
    arch, pte = llama
    folded = Runtime.get().load_program(pte).load_method("forward")
    plain = Runtime.get().load_program(pte).load_method("forward", fold_constants=False)
    assert _delegate_ops(folded) < _delegate_ops(plain)  # the rotary tables' delegate left the run
    x = [t.numpy() for t in arch.example_inputs]
    got, ref = folded.execute(x)[0], plain.execute(x)[0]
    np.testing.assert_array_equal(got, ref)  # the same XNNPACK computation, once at load or per run
    assert_close_to_scale(got, eager_outputs(arch), "llama small")
    np.testing.assert_array_equal(folded.execute(x)[0], got)  # the folded tables stay as they were
