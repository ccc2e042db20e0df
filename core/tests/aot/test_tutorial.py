"""The seed tutorial's scenarios (export → edge → transform → to_backend → to_executorch), on torch 2.13."""

from __future__ import annotations

import io

import pytest
import torch
from torch.export import Dim, export

import edgeport
from edgeport import EdgeCompileConfig, ExecutorchBackendConfig, ExportPass, to_backend, to_edge
from edgeport.aot.delegate_op import CALL_DELEGATE


class SimpleConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv(x))


def targets(ep) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def test_t1_export_and_t5_to_edge(seeded):
    ep = export(SimpleConv(), (torch.randn(1, 3, 32, 32),))
    edge = to_edge(ep)
    assert edge.methods == {"forward"}
    assert targets(edge.exported_program()) == ["aten.convolution.default", "aten.relu.default"]
    params = [s for s in edge.exported_program().graph_signature.input_specs if s.kind.name == "PARAMETER"]
    assert len(params) == 2
    out = edge.exported_program().module()(torch.randn(1, 3, 32, 32))
    assert out.shape == (1, 16, 32, 32)


def test_t6_multiple_methods(seeded):
    # The tutorial draws the weights with randn inside forward; randn has no portable kernel, so the
    # weights are drawn once here and kept as constants.
    class Encode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.randn(5, 10)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.w)

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.randn(10, 5)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.w)

    edge = to_edge({"encode": export(Encode(), (torch.randn(1, 10),)),
                    "decode": export(Decode(), (torch.randn(1, 5),))})
    assert edge.methods == {"encode", "decode"}
    assert "aten.permute_copy.default" in targets(edge.exported_program("encode"))
    prog = edge.to_executorch()
    assert prog.methods == {"encode", "decode"}
    assert sorted(p.name for p in prog.executorch_program.execution_plan) == ["decode", "encode"]


class ConvertReluToSigmoid(ExportPass):
    def call_operator(self, op, args, kwargs, meta):
        if op == torch.ops.aten.relu.default:
            op = torch.ops.aten.sigmoid.default
        return super().call_operator(op, args, kwargs, meta)


def test_t7_transform_returns_new_manager(seeded):
    edge = to_edge(export(SimpleConv(), (torch.randn(1, 3, 8, 8),)))
    transformed = edge.transform([ConvertReluToSigmoid()])
    assert "aten.sigmoid.default" in targets(transformed.exported_program())
    assert "aten.relu.default" not in targets(transformed.exported_program())
    assert "aten.relu.default" in targets(edge.exported_program())  # original untouched
    x = torch.randn(1, 3, 8, 8)
    model = SimpleConv()
    model.load_state_dict({k.replace("conv.", "conv."): v for k, v in edge.exported_program().state_dict.items()})
    torch.testing.assert_close(transformed.exported_program().module()(x), torch.sigmoid(model.conv(x)))


class LowerableModule(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x)


def test_t8_lower_whole_module(demo_backend):
    edge = to_edge(export(LowerableModule(), (torch.ones(1),)))
    lowered = to_backend(demo_backend, edge.exported_program(), [])
    assert isinstance(lowered, edgeport.LoweredBackendModule)
    assert lowered.backend_id == demo_backend
    assert lowered.processed_bytes == b"1#op:demo::aten.sin.default, numel:1, dtype:torch.float32#"
    assert targets(lowered.original_module) == ["aten.sin.default"]
    data = lowered.buffer()
    assert data[4:8] == b"ET12"
    # Eagerly, a lowered module runs its original program.
    torch.testing.assert_close(lowered(torch.tensor([0.5])), torch.sin(torch.tensor([0.5])))


def test_t9_composed_lowered_module(demo_backend):
    edge = to_edge(export(LowerableModule(), (torch.ones(1),)))
    lowered = to_backend(demo_backend, edge.exported_program(), [])

    class NotLowerable(torch.nn.Module):
        def __init__(self, bias):
            super().__init__()
            self.bias = bias

        def forward(self, a, b):
            return torch.add(torch.add(a, b), self.bias)

    class Composed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.non_lowerable = NotLowerable(torch.ones(1) * 0.3)
            self.lowered = lowered

        def forward(self, x):
            a = self.lowered(x)
            b = self.lowered(a)
            return a, b, self.non_lowerable(a, b)

    composed = to_edge(export(Composed(), (torch.ones(1),)))
    ep = composed.exported_program()
    calls = [n for n in ep.graph.nodes if n.target is CALL_DELEGATE]
    assert len(calls) == 2
    assert targets(ep).count("aten.add.Tensor") == 2
    assert len(ep.graph_signature.user_outputs) == 3
    assert ep.graph_module.lowered_module_0.backend_id == demo_backend
    assert ep.graph_module.lowered_module_0.processed_bytes == lowered.processed_bytes
    x = torch.tensor([0.7])
    a = torch.sin(x)
    b = torch.sin(a)
    for got, want in zip(ep.module()(x), (a, b, a + b + 0.3)):
        torch.testing.assert_close(got, want)
    program = composed.to_executorch().executorch_program
    plan = program.execution_plan[0]
    assert len(plan.delegates) == 1  # one blob, called twice
    assert sum(type(i.instr_args).__name__ == "DelegateCall" for i in plan.chains[0].instructions) == 2


class TwoMM(torch.nn.Module):
    def forward(self, a, x, b):
        y = torch.mm(a, x)
        z = y + b
        a = z - a
        y = torch.mm(a, x)
        z = y + b
        return z


def _inputs():
    return (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))


def test_t10_partitioner_function_yields_two_delegates(demo_backend, demo_partitioner, seeded):
    edge = to_edge(export(TwoMM(), _inputs()))
    delegated = to_backend(edge.exported_program(), demo_partitioner())
    calls = [n for n in delegated.graph.nodes if n.target is CALL_DELEGATE]
    assert len(calls) == 2
    assert targets(delegated).count("aten.sub.Tensor") == 1
    first = delegated.graph_module.lowered_module_0.original_module
    assert sorted(targets(first)) == ["aten.add.Tensor", "aten.mm.default"]
    second = delegated.graph_module.lowered_module_1.original_module
    assert len(second.graph_signature.user_inputs) == 3
    inputs = _inputs()
    torch.testing.assert_close(delegated.module()(*inputs), TwoMM()(*inputs))


def test_t11_partition_via_manager_and_t12_memory_planning(demo_backend, demo_partitioner, seeded):
    edge = to_edge(export(TwoMM(), _inputs()))
    delegated = edge.to_backend(demo_partitioner())
    ep = delegated.exported_program()
    assert len([n for n in ep.graph.nodes if n.target is CALL_DELEGATE]) == 2
    # T12: the undelegated manager to_executorch gives alloc + out-variant nodes.
    prog = edge.to_executorch(ExecutorchBackendConfig(passes=[]))
    exe = prog.exported_program()
    names = [str(n.target) for n in exe.graph.nodes if n.op == "call_function"]
    allocs = [n for n in exe.graph.nodes if n.op == "call_function" and n.target.__name__ == "alloc"]
    assert len(allocs) == 5
    assert [n for n in names if n.startswith("aten.")] == [
        "aten.mm.out", "aten.add.out", "aten.sub.out", "aten.mm.out", "aten.add.out"]
    report = prog.memory_reports[0]
    assert report.arena_bytes < report.naive_bytes  # lifetimes let tensors share memory


def test_t3_dynamic_shapes_upper_bound():
    class Add(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    d = Dim("d", min=1, max=10)
    ep = export(Add(), (torch.randn(3, 3), torch.randn(3, 3)), dynamic_shapes={"x": {1: d}, "y": {1: d}})
    prog = to_edge(ep).to_executorch()
    plan = prog.executorch_program.execution_plan[0]
    tensors = [plan.values[i].val for i in plan.inputs]
    assert all(t.sizes == [3, 10] for t in tensors)
    assert all(int(t.shape_dynamism) == 1 for t in tensors)  # DYNAMIC_BOUND
    assert plan.non_const_buffer_sizes[1] >= 3 * 3 * 10 * 4


def test_dynamic_dim_without_upper_bound_is_a_clear_error():
    class Add(torch.nn.Module):
        def forward(self, x):
            return x + 1

    ep = export(Add(), (torch.randn(3, 3),), dynamic_shapes={"x": {0: Dim("n")}})
    with pytest.raises(edgeport.UnsupportedOperatorError, match="upper bound"):
        to_edge(ep).to_executorch()


def test_t13_end_to_end_save(tmp_path, seeded):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.param = torch.nn.Parameter(torch.rand(3, 4))
            self.linear = torch.nn.Linear(4, 5)

        def forward(self, x):
            return self.linear(x + self.param).clamp(min=0.0, max=1.0)

    prog = to_edge(export(M(), (torch.randn(3, 4),))).to_executorch(ExecutorchBackendConfig(passes=[]))
    buf = prog.buffer
    assert len(buf) > 0 and buf[4:8] == b"ET12"
    path = tmp_path / "model.pte"
    prog.save(str(path))
    assert path.read_bytes() == buf
    stream = io.BytesIO()
    prog.write_to_file(stream)
    assert stream.getvalue() == buf
    assert not [p for p in tmp_path.iterdir() if p.name != "model.pte"]  # no temporary left behind


def test_constant_methods_and_config_methods():
    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2

    edge = to_edge(export(M(), (torch.randn(2),)), constant_methods={"get_version": 7, "get_scale": 0.5})
    assert edge.config_methods == {"get_version", "get_scale"}
    prog = edge.to_executorch()
    names = [p.name for p in prog.executorch_program.execution_plan]
    assert set(names) == {"forward", "get_version", "get_scale"}


def test_to_edge_rejects_config_passed_positionally():
    class M(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with pytest.raises(TypeError, match="compile_config"):
        to_edge(export(M(), (torch.randn(2),)), EdgeCompileConfig())
