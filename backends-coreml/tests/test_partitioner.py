"""CoreMLPartitioner: what it takes, why it leaves nodes out, ExecuTorch's arguments."""

from __future__ import annotations

import pytest
import torch
from coreml_models import build
from torch import nn

from edgeport import get_backend, to_edge, to_edge_transform_and_lower
from edgeport.errors import LoweringError
from edgeport_coreml import CoreMLCompileSpec, CoreMLPartitioner


class AlphaAdd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        z = torch.add(y, x, alpha=2.0)  # Core ML has no scaled add
        return torch.sigmoid(z) * torch.flip(x, [1])  # flip is not in the table


def _partition(model, x, **kw):
    p = CoreMLPartitioner(**kw)
    ep = to_edge(torch.export.export(model, (x,))).exported_program()
    result = p.partition(ep)
    return p, result


def test_rejections_have_reasons():
    p, result = _partition(AlphaAdd(), torch.randn(2, 4))
    assert len(result.partition_tags) >= 1
    reasons = p.rejections
    assert any("alpha != 1" in why for why in reasons.values()), reasons
    assert any("aten.flip.default is not in the CoreMLBackend capability table" in why
               for why in reasons.values()), reasons


def test_skip_ops():
    model, x = build("mlp")
    p, _ = _partition(model, x, skip_ops_for_coreml_delegation=["aten.tanh.default"])
    assert p.rejections == {"tanh": "listed in skip_ops_for_coreml_delegation"} or \
        "skip_ops_for_coreml_delegation" in p.rejections["tanh"]


def test_lower_full_graph_raises_on_the_first_unsupported_node():
    with pytest.raises(LoweringError, match=r"lower_full_graph=True, but add .*alpha != 1"):
        _partition(AlphaAdd(), torch.randn(2, 4), lower_full_graph=True)
    model, x = build("mlp")
    p, result = _partition(model, x, lower_full_graph=True)
    assert len(result.partition_tags) == 1 and not p.rejections


def test_executorch_argument_checks():
    with pytest.raises(ValueError, match="skip_ops_for_coreml_delegation must be empty"):
        CoreMLPartitioner(lower_full_graph=True, skip_ops_for_coreml_delegation=["aten.mm.default"])
    with pytest.raises(ValueError, match="take_over_constant_data=True"):
        CoreMLPartitioner(lower_full_graph=True, take_over_constant_data=False)
    p = CoreMLPartitioner(CoreMLCompileSpec(compute_precision="float32"))
    assert {s.key: s.value for s in p.compile_specs}["model_compute_precision"] == b"float32"


def test_registry_entry():
    spec = get_backend("CoreMLBackend")
    assert spec.distribution == "edgeport-coreml"
    assert "aten.convolution.default" in spec.capabilities().op_names
    ok, why = spec.is_available()
    import sys

    if sys.platform != "darwin":
        assert not ok and "Core ML runs on macOS 13+/iOS 16+" in why
    assert isinstance(spec.partitioner(), CoreMLPartitioner)


@pytest.fixture
def broken_relu(monkeypatch):
    """coremltools' relu converter raises in this process, where conversions then run (conversions cached before
    and after are forgotten)."""
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    from edgeport_coreml.verify import clear_conversion_cache

    def broken(context, node):
        raise ValueError("no converter today")

    clear_conversion_cache()
    monkeypatch.setenv("EDGEPORT_COREML_IN_PROCESS", "1")
    monkeypatch.setitem(_TORCH_OPS_REGISTRY.name_to_func_mapping, "relu", broken)
    yield
    clear_conversion_cache()


def test_a_node_coremltools_cannot_convert_is_refused_with_its_words(broken_relu):
    """The partition shrinks: the failing node stays on the CPU, the reason is coremltools' message, the rest is
    delegated and the lowering succeeds."""
    model, x = build("mlp")
    p = CoreMLPartitioner()
    edge = to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[p])
    assert list(p.rejections) == ["relu"], p.rejections
    assert "could not convert" in p.rejections["relu"] and "no converter today" in p.rejections["relu"]
    left = [n.name for n in edge.exported_program().graph.nodes
            if n.op == "call_function" and "delegate" not in str(n.target) and "getitem" not in str(n.target)]
    assert left == ["relu"]


def test_without_verification_a_conversion_error_is_a_lowering_error(broken_relu):
    model, x = build("mlp")
    with pytest.raises(LoweringError, match="coremltools 9.0 could not convert the partition.*no converter today"):
        to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                    partitioner=[CoreMLPartitioner(verify_conversion=False)])



def test_a_conversion_that_crashes_its_worker_is_refused_not_fatal(monkeypatch):
    """A partition holding relu kills the conversion worker (a planted SIGSEGV); the caller survives, relu is
    refused with the signal named, and the rest converts."""
    import crash_helper

    from edgeport.isolation import get_worker
    from edgeport_coreml import verify

    real = verify._in_worker

    def crashing(program, options, whole):
        if any(n.op == "call_function" and "relu" in str(n.target) for n in program.graph.nodes):
            return get_worker("coreml-crash-test").call(crash_helper.segfault)
        return real(program, options, whole)

    verify.clear_conversion_cache()
    monkeypatch.setattr(verify, "_in_worker", crashing)
    model, x = build("mlp")
    p = CoreMLPartitioner()
    to_edge_transform_and_lower(torch.export.export(model, (x,)), partitioner=[p])
    verify.clear_conversion_cache()
    assert list(p.rejections) == ["relu"], p.rejections
    assert "crashed its worker process (killed by SIGSEGV)" in p.rejections["relu"], p.rejections["relu"]


class PermutedInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.permute(0, 2, 1)) * 2.0


def test_a_partition_fed_by_a_strided_edge_value_converts():
    """``permute_copy`` left on the CPU: its edge value keeps the permute's strides, the program materializes it
    contiguous, and coremltools (which refuses non-contiguous inputs) converts the partition after it."""
    p = CoreMLPartitioner(skip_ops_for_coreml_delegation=["aten.permute_copy.default"])
    edge = to_edge_transform_and_lower(torch.export.export(PermutedInput(), (torch.randn(1, 3, 4),)), partitioner=[p])
    assert list(p.rejections) == ["permute"], p.rejections
    assert any("delegate" in str(n.target) for n in edge.exported_program().graph.nodes)
