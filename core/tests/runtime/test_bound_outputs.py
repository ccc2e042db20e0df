"""Dynamically planned delegate outputs bound as the executor's own arrays (``runtime._views.bindable_outputs``):
hand-built programs (torch-free) whose results are checked against the numbers the executor computes, and the
same programs loaded without the binding; bound only where no other name reads the planned memory, the delegate
is called once, and the executor's array owns its memory and fits the planned bound."""

from __future__ import annotations

import numpy as np
import pytest

import edgeport.runtime._compile as compile_module
from edgeport import hookimpl
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport.program import schema as S
from edgeport.registry import register_plugin, unregister_plugin
from edgeport.runtime import Runtime

BACKEND = "TestBoundOutputsBackend"


class _Times3:
    """Output k = inputs[0] * 3 + k, as fresh arrays (``mode = "view"``: views of one fresh array, owning none)."""

    mode = "fresh"
    returned: list[list[np.ndarray]] = []

    def is_available(self):
        return True, ""

    def init(self, processed, compile_specs):
        return int(bytes(processed).decode())

    def num_outputs(self, handle):
        return handle

    def execute(self, handle, inputs):
        x = np.asarray(inputs[0], np.float32)
        if self.mode == "view":
            base = np.stack([x * 3 + k for k in range(handle)])
            res = [base[k] for k in range(handle)]
        else:
            res = [x * 3 + k for k in range(handle)]
        _Times3.returned.append(res)
        return res

    def destroy(self, handle):
        pass


class _Plugin:
    @hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(BACKEND, "0.1", preprocess=lambda *a: PreprocessResult(b""), executor=_Times3))


@pytest.fixture
def backend():
    plugin = _Plugin()
    register_plugin(plugin, name="test-bound-outputs")
    _Times3.mode = "fresh"
    _Times3.returned.clear()
    yield
    unregister_plugin(plugin)


def _tensor_at(pb, shape, offset, dynamic=False):
    nbytes = int(np.prod(shape)) * 4
    pb.arena = max(pb.arena, offset + (nbytes + 15) // 16 * 16)
    return pb.add(S.Tensor(scalar_type=S.scalar_type_from_numpy(np.float32), sizes=list(shape),
                           dim_order=list(range(len(shape))), allocation_info=S.AllocationDetails.at(1, offset),
                           shape_dynamism=S.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else 0))


def _load(pb, bind: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not bind:
            m.setattr(compile_module, "bindable_outputs", lambda *a, **k: set())
        return Runtime.get().load_program(pb.serialize()).load_method()


def _program(builder, *, alias: bool = False, twice: bool = False):
    """d = delegate(x) (dynamic, planned at 128); y = d; [a: static at 128 that nothing writes; z = y + a];
    [then the same delegate again on the result]."""
    pb = builder.ProgramBuilder()
    x = _tensor_at(pb, (4,), 0)
    d = _tensor_at(pb, (4,), 128, dynamic=True)
    pb.delegate(BACKEND, b"1", [x, d])
    y = _tensor_at(pb, (4,), 256)
    pb.op("aten::add", "out", [d, d, pb.double(0.0), y, y])  # y = d + 0 * d = d
    out = y
    if alias:
        a = _tensor_at(pb, (4,), 128)  # an elided view: reads d's planned bytes
        z = _tensor_at(pb, (4,), 384)
        pb.op("aten::add", "out", [y, a, pb.double(1.0), z, z])
        out = z
    if twice:
        d2 = _tensor_at(pb, (4,), 512, dynamic=True)
        pb.instructions.append(S.Instruction(S.DelegateCall(0, [out, d2])))  # delegate 0 again
        out = d2
    pb.inputs, pb.outputs = [x], [out]
    return pb, d


@pytest.mark.parametrize("mode", ["fresh", "view"])
def test_dynamic_output_bound_as_the_executors_array(builder, backend, monkeypatch, mode):
    _Times3.mode = mode
    pb, d = _program(builder)
    bound, plain = _load(pb, True, monkeypatch), _load(pb, False, monkeypatch)
    for k in range(3):
        x = np.arange(4, dtype=np.float32) - k
        got = bound.execute([x])[0]
        held = bound._runner._pool[0].vals[d]
        assert (held is _Times3.returned[-1][0]) == (mode == "fresh")  # a non-owning view is copied
        np.testing.assert_array_equal(got, plain.execute([x])[0])
        np.testing.assert_array_equal(got, x * 3)


def test_not_bound_where_an_elided_view_reads_the_planned_memory(builder, backend, monkeypatch):
    pb, d = _program(builder, alias=True)
    method = _load(pb, True, monkeypatch)
    x = np.array([1, 2, 3, 4], np.float32)
    np.testing.assert_array_equal(method.execute([x])[0], 2 * (x * 3))
    assert method._runner._pool[0].vals[d] is not _Times3.returned[-1][0]


def test_not_bound_for_a_delegate_called_twice(builder, backend, monkeypatch):
    pb, d = _program(builder, twice=True)
    method = _load(pb, True, monkeypatch)
    x = np.array([1, 2, 3, 4], np.float32)
    np.testing.assert_array_equal(method.execute([x])[0], 9 * x)
    first_call = _Times3.returned[-2][0]
    np.testing.assert_array_equal(first_call, 3 * x)
    assert method._runner._pool[0].vals[d] is not first_call
