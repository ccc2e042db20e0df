"""ExamplePartitioner and the capability table."""

from __future__ import annotations

import pytest
import torch

from edgeport.aot.partitioner import DELEGATION_TAG
from edgeport.backend import CompileSpec, DelegationSpec
from edgeport_example import CAPABILITIES, ExampleCompileOptions, ExamplePartitioner

EXPECTED_OPS = {
    "aten.add.Tensor",
    "aten.mul.Tensor",
    "aten.sub.Tensor",
    "aten.sin.default",
    "aten.mm.default",
    "aten.addmm.default",
    "aten.permute_copy.default",
    "aten.linear.default",
    "aten.relu.default",
}


def tags(ep) -> dict[str, str]:
    return {n.name: n.meta[DELEGATION_TAG] for n in ep.graph.nodes if DELEGATION_TAG in n.meta}


def test_capability_table():
    assert set(CAPABILITIES.op_names) == EXPECTED_OPS
    assert all(cap.dtypes == ("float32",) for cap in CAPABILITIES.ops)
    for name in EXPECTED_OPS:  # every name is a real overload, spelled as str() prints it
        ns, op, overload = name.split(".")
        assert str(getattr(getattr(getattr(torch.ops, ns), op), overload)) == name


def test_ops_to_not_decompose(edge_program):
    ep = edge_program(torch.nn.Linear(3, 2), torch.randn(1, 3))
    ops, node_filter = ExamplePartitioner().ops_to_not_decompose(ep)
    assert ops == [torch.ops.aten.linear.default] and node_filter is None


def test_tutorial_graph(edge_program):
    class F(torch.nn.Module):
        def forward(self, a, x, b):
            y = torch.mm(a, x)
            z = y + b
            a = z - a
            y = torch.mm(a, x)
            z = y + b
            return z

    ep = edge_program(F(), torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))
    specs = [CompileSpec("max_value", bytes([4]))]
    result = ExamplePartitioner(specs).partition(ep)
    # sub is supported too, so ExampleBackend takes the whole graph
    assert result.partition_tags == {"tag0": DelegationSpec("ExampleBackend", specs)}
    assert set(tags(ep)) == {"mm", "add", "sub", "mm_1", "add_1"}

    p = ExamplePartitioner(ExampleCompileOptions(max_value=4), node_filter=lambda n: n.name != "sub")
    result = p.partition(ep)
    assert result.partition_tags == {
        "tag0": DelegationSpec("ExampleBackend", specs),
        "tag1": DelegationSpec("ExampleBackend", specs),
    }
    assert tags(ep) == {"mm": "tag0", "add": "tag0", "mm_1": "tag1", "add_1": "tag1"}


def test_linear_kept_whole_with_its_weights(edge_program):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    ep = edge_program(model, torch.randn(3, 4), keep_linear=True)
    p = ExamplePartitioner()
    assert list(p.partition(ep).partition_tags) == ["tag0"]
    assert set(tags(ep)) == {"p_0_weight", "p_0_bias", "p_2_weight", "p_2_bias", "linear", "relu", "linear_1"}
    assert p.rejections == {}


def test_rejections(edge_program):
    class M(torch.nn.Module):
        def forward(self, x, d):
            return torch.cos(x).permute(2, 0, 1) + 1.0, d * 2.0

    ep = edge_program(M(), torch.randn(2, 3, 4), torch.randn(3, dtype=torch.float64))
    p = ExamplePartitioner()
    p.partition(ep)
    assert set(tags(ep)) == {"add"}  # x.permute(...) + 1.0: the add itself is fine
    assert "not in the ExampleBackend capability table" in p.rejections["cos"]
    assert "2-D" in p.rejections["permute"]
    assert "float64" in p.rejections["mul"]


def test_bad_compile_specs_fail_early():
    with pytest.raises(ValueError, match="unknown compile spec 'speed'"):
        ExamplePartitioner([CompileSpec("speed", b"1")])


def test_compile_options_round_trip():
    opts = ExampleCompileOptions(max_value=4)
    assert opts.to_compile_specs() == [CompileSpec("max_value", bytes([4]))]
    assert ExampleCompileOptions.from_compile_specs(opts.to_compile_specs()) == opts
    assert ExampleCompileOptions().to_compile_specs() == []
    for bad in (-1, 256, 1.5, True):
        with pytest.raises(ValueError):
            ExampleCompileOptions(max_value=bad)
