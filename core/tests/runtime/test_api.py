"""The runtime API on hand-built programs (no torch, no ExecuTorch needed): loading, metadata, inputs,
kernel overrides, delegates, fallbacks."""

from __future__ import annotations

import io
import mmap
import warnings

import numpy as np
import pytest

import edgeport
from edgeport import hookimpl
from edgeport.backend import BackendSpec, CompileSpec, PreprocessResult
from edgeport.errors import BackendNotFoundError, RuntimeExecutionError, UnsupportedOperatorError
from edgeport.registry import register_plugin, unregister_plugin
from edgeport.runtime import FALLBACK_COMPILE_SPEC, Runtime, load

RNG = np.random.default_rng(0)
W = RNG.standard_normal((5, 3)).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)


def expected(x):
    return np.maximum(x @ W.T + B, 0)


@pytest.fixture
def linear_pte(builder, tmp_path):
    path = tmp_path / "linear.pte"
    path.write_bytes(builder.linear_relu(W, B).serialize())
    return path


def test_load_path_bytes_file(linear_pte):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    data = linear_pte.read_bytes()
    for src in (linear_pte, str(linear_pte), data, bytearray(data), memoryview(data), io.BytesIO(data)):
        program = Runtime.get().load_program(src)
        assert program.method_names == {"forward"}
        (y,) = program.load_method("forward").execute([x])
        np.testing.assert_allclose(y, expected(x), rtol=1e-5, atol=1e-6)
    program = Runtime.get().load_program(linear_pte, mmap=False)
    np.testing.assert_allclose(program.load_method().execute([x])[0], expected(x), rtol=1e-5, atol=1e-6)


def test_mmap_constants_are_zero_copy_views(linear_pte):
    program = Runtime.get().load_program(linear_pte)
    assert isinstance(program._source, mmap.mmap)
    method = program.load_method(fold_constants=False)
    consts = [v for v in method._plan.static_template if isinstance(v, np.ndarray)]
    assert len(consts) == 2
    buf = np.frombuffer(program._source, np.uint8)
    for c in consts:
        assert not c.flags.writeable
        assert np.shares_memory(c, buf)
    # by default the weight permute runs once at load: a third (private) constant
    folded = program.load_method()
    assert folded.profile.folded_instructions == 1
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(folded.execute([x])[0], method.execute([x])[0])


def test_shortcut_load_and_package_root(linear_pte):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    m = load(linear_pte)
    np.testing.assert_allclose(m.forward(x)[0], expected(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m(x)[0], expected(x), rtol=1e-5, atol=1e-6)
    assert "forward" in dir(m) and m.method_names == {"forward"}
    m2 = edgeport.load(str(linear_pte))
    np.testing.assert_allclose(m2["forward"](x)[0], expected(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(AttributeError):
        m2.backward  # noqa: B018


def test_metadata(linear_pte):
    program = Runtime.get().load_program(linear_pte)
    meta = program.load_method().metadata
    assert meta.name == "forward"
    assert meta.input_dtypes == [np.dtype(np.float32)] and meta.input_shapes == [(2, 3)]
    assert meta.output_dtypes == [np.dtype(np.float32)] and meta.output_shapes == [(2, 5)]
    assert meta.num_inputs() == 1 and meta.output_tensor_meta(0).nbytes == 40
    assert meta.memory_planned_buffer_sizes[0] > 0 and meta.backends == ()
    assert "aten::addmm.out" in meta.operators
    assert program.metadata("forward") == meta


def test_input_errors(linear_pte):
    method = Runtime.get().load_program(linear_pte).load_method()
    with pytest.raises(RuntimeExecutionError, match="expected 1 inputs"):
        method.execute([])
    with pytest.raises(RuntimeExecutionError, match="dtype float32, got float64"):
        method.execute([np.zeros((2, 3))])
    with pytest.raises(RuntimeExecutionError, match=r"shape \[2, 3\], got \[3, 3\]"):
        method.execute([np.zeros((3, 3), np.float32)])
    with pytest.raises(Exception, match="no method named"):
        Runtime.get().load_program(linear_pte).load_method("missing")


def test_outputs_are_fresh_copies(linear_pte):
    method = Runtime.get().load_program(linear_pte).load_method()
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (y1,) = method.execute([x])
    keep = y1.copy()
    method.execute([x * 2])
    np.testing.assert_array_equal(y1, keep)


# ------------------------------------------------------------------------------------------ kernel libraries
class _ReluPlusOne:
    """A kernel library plugin overriding the portable relu."""

    @hookimpl
    def edgeport_register_kernels(self, registry):
        def relu_plus_one(self, out):
            np.maximum(self, 0, out=out)
            out += 1
            return out

        registry.add("aten::relu.out", relu_plus_one, library="test-lib")


def test_kernel_library_overrides_portable(linear_pte):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    plugin = _ReluPlusOne()
    register_plugin(plugin, name="test-relu-lib")
    try:
        method = Runtime.get().load_program(linear_pte).load_method()
        np.testing.assert_allclose(method.execute([x])[0], expected(x) + 1, rtol=1e-5, atol=1e-6)
        assert method.profile.kernel_libraries["aten::relu.out"] == "test-lib"
        assert method.profile.overridden_kernels["aten::relu.out"] == "portable"
        assert method.profile.kernel_libraries["aten::addmm.out"] == "portable"
    finally:
        unregister_plugin(plugin)
    method = Runtime.get().load_program(linear_pte).load_method()
    np.testing.assert_allclose(method.execute([x])[0], expected(x), rtol=1e-5, atol=1e-6)


def test_missing_kernel_fails_at_load(builder):
    pb = builder.ProgramBuilder()
    x, y = pb.tensor((3,)), pb.tensor((3,))
    pb.op("aten::frobnicate", "out", [x, y, y])
    pb.inputs, pb.outputs = [x], [y]
    program = Runtime.get().load_program(pb.serialize())
    with pytest.raises(UnsupportedOperatorError, match=r"aten::frobnicate\.out"):
        program.load_method()


# ------------------------------------------------------------------------------------------ delegates
class _Doubler:
    """Executor of the test backend: multiplies every input by the factor stored in its blob."""

    calls: list = []

    def is_available(self):
        return True, ""

    def init(self, processed, compile_specs):
        assert isinstance(processed, memoryview)
        _Doubler.calls.append("init")
        return {"factor": float(bytes(processed).decode())}

    def execute(self, handle, inputs):
        _Doubler.calls.append("execute")
        return [np.asarray(i) * handle["factor"] for i in inputs]

    def destroy(self, handle):
        _Doubler.calls.append("destroy")


class _DoublerPlugin:
    def __init__(self, available=True):
        self.available = available

    @hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec("TestScaleBackend", "0.1", preprocess=lambda *a: PreprocessResult(b""),
                                 executor=_Doubler, is_available=lambda: (self.available, "no test hardware")))


def _delegate_program(builder, fallback=False):
    pb = builder.ProgramBuilder()
    x, d, y = pb.tensor((4,)), pb.tensor((4,)), pb.tensor((4,))
    specs = [CompileSpec(FALLBACK_COMPILE_SPEC, b"scale_fallback")] if fallback else []
    pb.delegate("TestScaleBackend", b"3.0", [x, d], specs)
    pb.op("aten::relu", "out", [d, y, y])
    pb.inputs, pb.outputs = [x], [y]
    extra = []
    if fallback:
        fb = builder.ProgramBuilder("scale_fallback")
        a, o = fb.tensor((4,)), fb.tensor((4,))
        fb.op("aten::mul", "Scalar_out", [a, fb.double(3.0), o, o])
        fb.inputs, fb.outputs = [a], [o]
        extra = [fb]
    return pb.serialize(extra)


def test_delegate_init_once_execute_per_call_destroy_on_release(builder):
    plugin = _DoublerPlugin()
    register_plugin(plugin, name="test-scale-backend")
    _Doubler.calls.clear()
    try:
        method = Runtime.get().load_program(_delegate_program(builder)).load_method()
        assert _Doubler.calls == ["init"]
        x = np.array([-1, 0, 1, 2], np.float32)
        for _ in range(3):
            np.testing.assert_allclose(method.execute([x])[0], np.maximum(3 * x, 0))
        assert _Doubler.calls == ["init"] + ["execute"] * 3
        assert method.metadata.backends == ("TestScaleBackend",)
        assert [d.status for d in method.profile.delegates] == ["backend"]
        method.release()
        assert _Doubler.calls[-1] == "destroy"
        method.release()
        assert _Doubler.calls.count("destroy") == 1
    finally:
        unregister_plugin(plugin)


def test_missing_backend_fails_at_load_naming_it(builder):
    program = Runtime.get().load_program(_delegate_program(builder))
    with pytest.raises(BackendNotFoundError, match="TestScaleBackend.*not installed"):
        program.load_method()


def test_unavailable_backend_and_fallback(builder):
    plugin = _DoublerPlugin(available=False)
    register_plugin(plugin, name="test-scale-backend-off")
    try:
        with pytest.raises(BackendNotFoundError, match="unavailable: no test hardware"):
            Runtime.get().load_program(_delegate_program(builder)).load_method()
        # a fallback exists but was not allowed: the error says how to use it
        program = Runtime.get().load_program(_delegate_program(builder, fallback=True))
        with pytest.raises(BackendNotFoundError, match="allow_fallback=True"):
            program.load_method()
        # allowed but the program carries none
        with pytest.raises(BackendNotFoundError, match="no portable fallback"):
            Runtime.get().load_program(_delegate_program(builder)).load_method(allow_fallback=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            method = program.load_method(allow_fallback=True)
        assert any("portable fallback" in str(w.message) for w in caught)
        x = np.array([-1, 0, 1, 2], np.float32)
        np.testing.assert_allclose(method.execute([x])[0], np.maximum(3 * x, 0))
        (fb,) = method.profile.fallbacks
        assert fb.backend_id == "TestScaleBackend" and fb.fallback_method == "scale_fallback"
        assert "no test hardware" in fb.reason
    finally:
        unregister_plugin(plugin)


def test_missing_backend_message_names_package(builder):
    pb = builder.ProgramBuilder()
    x, y = pb.tensor((2,)), pb.tensor((2,))
    pb.delegate("XnnpackBackend", b"", [x, y])
    pb.inputs, pb.outputs = [x], [y]
    program = Runtime.get().load_program(pb.serialize())
    try:
        edgeport.get_backend("XnnpackBackend")
        pytest.skip("edgeport-xnnpack is installed here")
    except BackendNotFoundError:
        pass
    with pytest.raises(BackendNotFoundError, match="pip install edgeport-xnnpack"):
        program.load_method()


def test_optional_outputs_computed_only_when_read(builder):
    """max_pool2d_with_indices: indices are skipped when unused, computed when they are a method output."""
    x_np = np.random.default_rng(2).standard_normal((1, 2, 6, 6)).astype(np.float32)
    for return_indices in (False, True):
        pb = builder.ProgramBuilder()
        x, o, ix = pb.tensor((1, 2, 6, 6)), pb.tensor((1, 2, 3, 3)), pb.tensor((1, 2, 3, 3), np.int64)
        ret = pb.add(__import__("edgeport.program.schema", fromlist=["TensorList"]).TensorList([o, ix]))
        pb.op("aten::max_pool2d_with_indices", "out",
              [x, pb.int_list([2, 2]), pb.int_list([2, 2]), pb.int_list([0, 0]), pb.int_list([1, 1]),
               pb.add(__import__("edgeport.program.schema", fromlist=["Bool"]).Bool(False)), o, ix, ret])
        pb.inputs, pb.outputs = [x], [o, ix] if return_indices else [o]
        method = Runtime.get().load_program(pb.serialize()).load_method()
        outs = method.execute([x_np])
        np.testing.assert_array_equal(outs[0], x_np.reshape(1, 2, 3, 2, 3, 2).max(axis=(3, 5)))
        if return_indices:
            flat = x_np.reshape(1, 2, 36)
            np.testing.assert_array_equal(np.take_along_axis(flat, outs[1].reshape(1, 2, 9), -1).reshape(1, 2, 3, 3),
                                          outs[0])


def test_op_timing(linear_pte):
    method = Runtime.get().load_program(linear_pte).load_method()
    method.time_ops = True
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    method.execute([x])
    method.execute([x])
    prof = method.profile
    assert set(prof.op_calls) == {"aten::addmm.out", "aten::relu.out"}  # the permute was folded at load
    assert prof.op_calls["aten::relu.out"] == 2 and prof.op_seconds["aten::relu.out"] > 0
    assert prof.runs == 2 and prof.last_run_seconds > 0


class _NamedScaler(_Doubler):
    """Takes its factor from the program's named data (as ExecuTorch-style blobs keep their weights)."""

    def init(self, processed, compile_specs, *, named_data=None):
        return {"factor": float(bytes(named_data(bytes(processed).decode())).decode())}


class _NamedPlugin:
    @hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec("TestNamedBackend", "0.1", preprocess=lambda *a: PreprocessResult(b""),
                                 executor=_NamedScaler))


def test_executor_receives_named_data(builder):
    from edgeport.program.pte import serialize_pte

    pb = builder.ProgramBuilder()
    x, y = pb.tensor((4,)), pb.tensor((4,))
    pb.delegate("TestNamedBackend", b"scale-key", [x, y])
    pb.inputs, pb.outputs = [x], [y]
    data = serialize_pte(pb.program(), named_data={"scale-key": b"2.5"})
    plugin = _NamedPlugin()
    register_plugin(plugin, name="test-named-backend")
    try:
        method = Runtime.get().load_program(data).load_method()
        x_np = np.arange(4, dtype=np.float32)
        np.testing.assert_allclose(method.execute([x_np])[0], 2.5 * x_np)
    finally:
        unregister_plugin(plugin)
