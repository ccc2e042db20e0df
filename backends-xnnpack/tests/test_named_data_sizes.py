"""Issue 11's size goals for XNNPACK weights in named data: stored once, with no more than alignment overhead.

* an XNNPACK-lowered ResNet-18 ``.pte`` is at most 1% larger than the model's fp32 parameters;
* a program with two methods that share a 4 MB linear stores its weight once (ExecuTorch 1.5.1's XNNPACK delegate
  keys weights by content the same way), and both methods still match eager on both runtimes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import to_edge_transform_and_lower
from edgeport.program import load_pte
from edgeport.runtime import Runtime
from edgeport.testing.vision import resnet18
from edgeport_xnnpack import XnnpackPartitioner


def test_resnet18_program_is_at_most_one_percent_larger_than_its_fp32_weights():
    model, example = resnet18(seed=0, resolution=64)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ep = torch.export.export(model.eval(), example)
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    assert len(pte) <= 1.01 * weight_bytes, f"{len(pte)} bytes for {weight_bytes} bytes of fp32 weights"
    lp = load_pte(pte)
    stored = sum(len(lp.named_data(nd.key)) for nd in lp.program.named_data)
    # batch norms fold into the convolutions: what is stored is the folded weights, never more than the params
    assert 0.95 * weight_bytes <= stored <= weight_bytes
    got = Runtime.get().load_program(pte).load_method("forward").execute([example[0].numpy()])[0]
    with torch.no_grad():
        want = model(*example).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))


class Head(torch.nn.Module):
    """Two heads on one 1024x1024 (4 MB) trunk: the methods differ, the trunk weight is the same tensor."""

    def __init__(self, trunk: torch.nn.Linear, scale: float) -> None:
        super().__init__()
        self.trunk, self.scale = trunk, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.trunk(x)) * self.scale


@pytest.fixture(scope="module")
def two_methods() -> tuple[bytes, dict[str, torch.nn.Module], torch.Tensor]:
    torch.manual_seed(0)
    trunk = torch.nn.Linear(1024, 1024)
    models = {"first": Head(trunk, 1.0).eval(), "second": Head(trunk, -0.5).eval()}
    x = torch.randn(2, 1024)
    eps = {name: torch.export.export(m, (x,)) for name, m in models.items()}
    pte = to_edge_transform_and_lower(eps, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    return pte, models, x


def test_a_linear_shared_by_two_methods_is_stored_once(two_methods):
    pte, _, _ = two_methods
    weight = 1024 * 1024 * 4
    assert weight < len(pte) < 1.1 * weight, f"{len(pte)} bytes: the 4 MB weight is stored more than once"
    lp = load_pte(pte)
    sizes = sorted(len(lp.named_data(nd.key)) for nd in lp.program.named_data)
    assert sizes.count(weight) == 1, sizes
    assert {p.name for p in lp.program.execution_plan} == {"first", "second"}


def test_both_methods_sharing_a_weight_match_eager(two_methods):
    pte, models, x = two_methods
    program = Runtime.get().load_program(pte)
    for name, model in models.items():
        got = program.load_method(name).execute([x.numpy()])[0]
        with torch.no_grad():
            np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.executorch
def test_stock_runtime_runs_both_methods_sharing_a_weight(two_methods):
    from edgeport.testing.conformance.stock_checks import stock_runtime_missing
    from edgeport.testing.stock_runtime import run_cases

    if stock_runtime_missing():
        pytest.skip(stock_runtime_missing())
    pte, models, x = two_methods
    results = run_cases([(name, pte, name, [x]) for name in models])
    for result, (_name, model) in zip(results, models.items()):
        assert result.crash is None and result.outputs is not None, f"{result.describe()}\n{result.log}"
        with torch.no_grad():
            np.testing.assert_allclose(result.outputs[0], model(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.executorch
def test_weights_have_the_keys_executorch_gives_them():
    """Keys are sha256 of the bytes as XNNPACK reads them: ExecuTorch's program for the same MLP has the same keys."""
    pytest.importorskip("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtXnnpack
    from executorch.exir import to_edge_transform_and_lower as et_lower

    from edgeport.testing.models import two_linear

    model, example = two_linear()
    ours = to_edge_transform_and_lower(torch.export.export(model.eval(), example),
                                       partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    theirs = et_lower(torch.export.export(model.eval(), example), partitioner=[EtXnnpack()]).to_executorch().buffer
    keys = [{nd.key for nd in load_pte(pte).program.named_data} for pte in (ours, theirs)]
    assert keys[0] and keys[0] == keys[1]
