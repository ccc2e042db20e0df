"""Files written by ExecuTorch 1.5.1: our reader against ExecuTorch's own deserialization, field by field; and
ExecuTorch's emitted programs re-serialized by us, executed by the ExecuTorch runtime against torch eager."""

from __future__ import annotations

import pytest

from edgeport.program import DataLocation, load_pte, serialize_pte, verify_program
from edgeport.program import schema as S

pytestmark = pytest.mark.executorch
torch = pytest.importorskip("torch")
pytest.importorskip("executorch")


class AddMulSin(torch.nn.Module):
    def forward(self, x, y):
        return torch.sin(x + y) * y - 0.5


class ConvRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y.reshape(1, -1).sum(dim=1, keepdim=True), torch.cat([x, x], 1)


class WithConstants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 5))
        self.register_buffer("b", torch.arange(5, dtype=torch.float32))
        self.register_buffer("idx", torch.tensor([2, 0, 1], dtype=torch.int64))

    def forward(self, x):
        return (x @ self.w + self.b).index_select(0, self.idx), torch.full((2,), 3, dtype=torch.int32)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.sin(self.l(x))


class MmAddSin(torch.nn.Module):
    def forward(self, a, x, b):
        return torch.sin(torch.mm(a, x) + b)


class NamedDataUser(torch.nn.Module):
    def forward(self, x):
        y = torch.cos(x + x)
        return torch.sin(y + y) - y


# name -> (model class, inputs, how to lower: None | "xnnpack" | ExecuTorch demo partitioner name)
_CASES = {
    "add_mul_sin": (AddMulSin, lambda: (torch.randn(3, 4), torch.randn(3, 4)), None),
    "conv_relu": (ConvRelu, lambda: (torch.randn(1, 2, 4, 4),), None),
    "constants": (WithConstants, lambda: (torch.randn(3, 4),), None),
    # ExecuTorch's demo backends (not runnable in the runtime): a delegate segment, and named data
    "demo_delegate": (MmAddSin, lambda: (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2)), "demo"),
    "demo_named_data": (NamedDataUser, lambda: (torch.randn(1, 2),), "ndm"),
    # the real XNNPACK delegate: runnable, but lowering takes ~10 s
    "xnnpack_linear": (Linear, lambda: (torch.randn(2, 8),), "xnnpack"),
}
_RUNNABLE = [n for n, case in _CASES.items() if case[2] in (None, "xnnpack")]
_CACHE: dict[str, tuple] = {}


def _params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if _CASES[n][2] == "xnnpack" else n for n in names]


def _build(name: str):
    """(model, example inputs, ExecutorchProgramManager), built once per session."""
    if name not in _CACHE:
        from executorch.exir import to_edge, to_edge_transform_and_lower

        cls, make_inputs, lowering = _CASES[name]
        torch.manual_seed(0)
        model = cls().eval()
        inputs = make_inputs()
        ep = torch.export.export(model, inputs)
        if lowering == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            pm = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
        elif lowering == "demo":
            from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo

            pm = to_edge(ep).to_backend(AddMulPartitionerDemo()).to_executorch()
        elif lowering == "ndm":
            from executorch.exir.backend.test.backend_with_named_data_map import BackendWithNDMPartitioner

            pm = to_edge(ep).to_backend(BackendWithNDMPartitioner()).to_executorch()
        else:
            pm = to_edge(ep).to_executorch()
        _CACHE[name] = (model, inputs, pm)
    return _CACHE[name]


def _outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


@pytest.mark.parametrize("name", _params(_CASES))
def test_reader_matches_executorch_deserialization(et, name):
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _extract_delegate_payload, deserialize_pte_binary

    _, _, pm = _build(name)
    data = pm.buffer
    lp = load_pte(data)
    verify_program(lp.program)
    # the flatbuffer, table by table (values, instructions, operators, delegates, segments, ...)
    theirs = _flatbuffer_to_program(data[:lp.program_size])
    et.assert_same(lp.program, theirs)
    # constant data: ExecuTorch's restore gives each constant with its padding
    restored = deserialize_pte_binary(data)
    n_tensors = 0
    for pi, plan in enumerate(lp.program.execution_plan):
        for vi, v in enumerate(plan.values):
            t = v.val
            if isinstance(t, S.Tensor) and t.data_buffer_idx and t.allocation_info is None:
                got = lp.tensor_data(t, where=f"values[{vi}]")
                want = restored.program.constant_buffer[t.data_buffer_idx].storage
                assert bytes(got) == want[:len(got)]
                n_tensors += 1
        for di, d in enumerate(plan.delegates):
            blob = bytes(lp.delegate_data(pi, di))
            assert d.processed.location == (DataLocation.SEGMENT if blob else DataLocation.INLINE)
            assert blob == (_extract_delegate_payload(data, d.id, di) or b"")
    if name in ("conv_relu", "constants"):
        assert n_tensors >= 2
    if _CASES[name][2] is not None:
        assert any(plan.delegates for plan in lp.program.execution_plan)
    # named data (XNNPACK stores its weights there)
    store = restored.named_data
    if name == "demo_named_data":
        assert len(lp.program.named_data) == 3
    for entry in lp.program.named_data or []:
        assert bytes(lp.named_data(entry.key)) == bytes(store.buffers[store.pte_data[entry.key].buffer_index])


@pytest.mark.parametrize("name", _params(_RUNNABLE))
def test_executorch_runtime_runs_our_serialization_of_its_program(et, name):
    """ExecuTorch's emitted Program (before serialization) -> our serializer -> ExecuTorch runtime == eager."""
    from executorch.runtime import Runtime

    model, inputs, pm = _build(name)
    program = et.from_executorch(pm.executorch_program)
    named = getattr(pm, "_named_data", None)
    named_data = {k: (bytes(named.buffers[e.buffer_index]), e.alignment) for k, e in named.pte_data.items()} \
        if named is not None and named.pte_data else None
    data = serialize_pte(program, named_data=named_data)
    method = Runtime.get().load_program(data).load_method("forward")
    got = method.execute(list(inputs))
    want = _outputs(model(*inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
