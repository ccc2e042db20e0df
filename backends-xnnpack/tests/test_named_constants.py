"""XNNPACK weights live in the program's named data (as ExecuTorch 1.5.1 writes them), not in the blob.

The stock runtime frees a delegate's blob after init (a memory-mapped program is unmapped), and XNNPACK keeps
pointers to static data it does not pack: a blob carrying its own constants made ExecuTorch's runtime crash on
layer norm and on permute + multiply. These tests pin the format and run both runtimes on the result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.program import load_pte
from edgeport.runtime import Runtime
from edgeport.testing.stock_runtime import run_program
from edgeport_xnnpack import XnnpackPartitioner
from edgeport_xnnpack.schema.graph import UINT64_MAX
from edgeport_xnnpack.schema.reader import read_blob, split_blob


class SharedWeight(torch.nn.Module):
    """The same Linear on both sides of an op XNNPACK does not take (cumsum): two partitions, one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cumsum(self.fc(x), dim=1)) * 2.0


class LayerNormOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


class PermuteMul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1, 3) * 2


def _lower(model: torch.nn.Module, x: torch.Tensor) -> bytes:
    ep = torch.export.export(model.eval(), (x,))
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def test_blob_constants_are_named_keys_and_shared_weights_are_stored_once():
    torch.manual_seed(0)
    model, x = SharedWeight(), torch.randn(2, 16)
    pte = _lower(model, x)
    lp = load_pte(pte)
    plan = lp.program.execution_plan[0]
    assert len(plan.delegates) == 2
    keys_per_delegate = []
    for i in range(len(plan.delegates)):
        blob = lp.delegate_data(0, i)
        graph, _ = read_blob(blob)
        assert len(split_blob(blob)[1]) == 0, "the blob's constant region must be empty"
        entries = graph.constant_data[1:]
        assert entries and all(e.offset == UINT64_MAX and e.named_key for e in entries)
        keys_per_delegate.append({e.named_key for e in entries})
        for e in entries:
            assert len(lp.named_data(e.named_key)) == e.size
    shared = keys_per_delegate[0] & keys_per_delegate[1]
    assert shared, "both partitions use fc.weight: the same content key"
    segments = {nd.key: nd.segment_index for nd in lp.program.named_data}
    assert len(set(segments.values())) == len(segments), "one segment per distinct weight"
    with torch.no_grad():
        want = model(x).numpy()
    got = Runtime.get().load_program(pte).load_method("forward").execute([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.executorch
@pytest.mark.parametrize("name, model, shape", [
    ("layer_norm", LayerNormOnly(), (1, 8, 64)),
    ("permute_mul", PermuteMul(), (1, 4, 8, 16)),
    ("shared_weight", SharedWeight(), (2, 16)),
])
def test_stock_runtime_runs_the_programs_that_crashed_it(name, model, shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    pte = _lower(model, x)
    result = run_program(pte, [x], name=name)
    assert result.crash is None, f"{result.describe()}\n{result.log}"
    assert result.outputs is not None, result.describe()
    with torch.no_grad():
        want = model.eval()(x).numpy()
    np.testing.assert_allclose(result.outputs[0], want, rtol=1e-5, atol=1e-5)
    ours = Runtime.get().load_program(pte).load_method("forward").execute([x.numpy()])[0]
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)
