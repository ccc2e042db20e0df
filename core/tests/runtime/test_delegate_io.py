"""How delegate calls get their memory (hand-built programs, torch-free): method inputs read only by delegates
are bound as the caller's arrays (no copy), every other input is copied; executors whose ``execute`` takes
``out=`` get the planned arrays of the outputs to write into, or ``None`` where that is not safe; an executor's
optional ``direct_execute(handle)`` run takes such calls instead of ``execute`` unless it declines."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from edgeport import hookimpl
from edgeport.backend import BackendSpec, PreprocessResult
from edgeport.errors import RuntimeExecutionError
from edgeport.program import schema as S
from edgeport.registry import register_plugin, unregister_plugin
from edgeport.runtime import Runtime

BACKEND = "TestDelegateIOBackend"


class _Affine:
    """Output k = inputs[k % n] * 3 + k. Records what every call got. ``mode`` picks the ``out=`` behaviour:
    ``"write"`` writes into the given arrays and returns them, ``"ignore"`` returns fresh arrays, ``"bad"``
    returns a wrongly shaped array for a given destination."""

    mode = "write"
    calls: list[tuple[list, list | None]] = []

    def is_available(self):
        return True, ""

    def init(self, processed, compile_specs):
        return int(bytes(processed).decode())  # the number of outputs

    def num_outputs(self, handle):
        return handle

    @staticmethod
    def compute(inputs, n_out):
        return [np.asarray(inputs[k % len(inputs)], np.float32) * 3 + k for k in range(n_out)]

    def execute(self, handle, inputs, out=None):
        _Affine.calls.append((list(inputs), None if out is None else list(out)))
        res = self.compute(inputs, handle)
        if out is None or self.mode == "ignore":
            return res
        if self.mode == "bad":
            return [r.reshape(-1, 1) for r in res]
        if self.mode in ("same_list", "replace"):  # hand the out list itself back, written or with other arrays
            for k, o in enumerate(out):
                if o is None or self.mode == "replace":
                    out[k] = res[k]
                else:
                    o[...] = res[k]
            return out
        for k, o in enumerate(out):
            if o is not None:
                o[...] = res[k]
                res[k] = o
        return res

    def destroy(self, handle):
        pass


class _NoOut(_Affine):
    """The classic contract: ``execute(handle, inputs)`` only."""

    def execute(self, handle, inputs):
        _Affine.calls.append((list(inputs), None))
        return self.compute(inputs, handle)


class _KwargsOnly(_Affine):
    """A bare ``**kwargs`` is not an opt-in to ``out=``."""

    def execute(self, handle, inputs, **kwargs):
        assert "out" not in kwargs
        _Affine.calls.append((list(inputs), None))
        return self.compute(inputs, handle)


class _Plugin:
    def __init__(self, executor):
        self.executor = executor

    @hookimpl
    def edgeport_register_backends(self, registry):
        registry.add(BackendSpec(BACKEND, "0.1", preprocess=lambda *a: PreprocessResult(b""),
                                 executor=self.executor))


@pytest.fixture(params=[_Affine], ids=["out"])
def backend(request):
    plugin = _Plugin(request.param)
    register_plugin(plugin, name="test-delegate-io")
    _Affine.calls.clear()
    _Affine.mode = "write"
    yield
    unregister_plugin(plugin)


def _load(pb):
    return Runtime.get().load_program(pb.serialize()).load_method()


def _tensor_at(pb, shape, offset, dtype=np.float32, mem_id=1, dynamic=False):
    """A planned tensor at a chosen offset (the builder's own ``tensor`` never overlaps)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pb.arena = max(pb.arena, offset + (nbytes + 15) // 16 * 16)
    return pb.add(S.Tensor(scalar_type=S.scalar_type_from_numpy(dtype), sizes=list(shape),
                           dim_order=list(range(len(shape))), allocation_info=S.AllocationDetails.at(mem_id, offset),
                           shape_dynamism=S.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else 0))


def _unplanned(pb, shape, dtype=np.float32):
    return pb.add(S.Tensor(scalar_type=S.scalar_type_from_numpy(dtype), sizes=list(shape),
                           dim_order=list(range(len(shape)))))


# ------------------------------------------------------------------------------------------ zero-copy inputs
def _delegate_then_relu(builder, also_kernel=False, also_output=False):
    """d = delegate(x); y = relu(d) [+ x]; outputs y [, x]."""
    pb = builder.ProgramBuilder()
    x, d, y = pb.tensor((2, 4)), pb.tensor((2, 4)), pb.tensor((2, 4))
    pb.delegate(BACKEND, b"1", [x, d])
    pb.op("aten::relu", "out", [d, y, y])
    outputs = [y]
    if also_kernel:
        z = pb.tensor((2, 4))
        pb.op("aten::add", "out", [y, x, pb.double(1.0), z, z])
        outputs = [z]
    if also_output:
        outputs.append(x)
    pb.inputs, pb.outputs = [x], outputs
    return pb


def _expected(x, also_kernel=False):
    y = np.maximum(x * 3, 0)
    return y + x if also_kernel else y


def test_input_read_only_by_a_delegate_is_not_copied(builder, backend):
    method = _load(_delegate_then_relu(builder))
    x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
    (y,) = method.execute([x])
    np.testing.assert_array_equal(y, _expected(x))
    (got, _), = _Affine.calls
    assert got[0] is x  # bound as given: no copy into planned memory
    # caller arrays that are read-only or not contiguous are fine (executors treat inputs as read-only)
    wide = np.arange(16, dtype=np.float32).reshape(2, 8)
    ro = np.frombuffer(np.arange(8, dtype=np.float32).tobytes(), np.float32).reshape(2, 4)
    for arr in (wide[:, ::2], ro):
        np.testing.assert_array_equal(method.execute([arr])[0], _expected(arr))
        assert _Affine.calls[-1][0][0] is arr


def test_borrowed_input_is_released_and_later_mutation_changes_nothing(builder, backend):
    method = _load(_delegate_then_relu(builder))
    x = np.ones((2, 4), np.float32)
    (y,) = method.execute([x])
    x[...] = -7  # the caller reuses its buffer: the result it already has stays
    np.testing.assert_array_equal(y, np.full((2, 4), 3, np.float32))
    ref = weakref.ref(x)
    _Affine.calls.clear()  # the test executor's own record of it
    del x
    gc.collect()
    assert ref() is None  # the runtime keeps no reference to the caller's array between runs
    np.testing.assert_array_equal(method.execute([np.full((2, 4), 2, np.float32)])[0], np.full((2, 4), 6))


@pytest.mark.parametrize("also_kernel,also_output", [(True, False), (False, True), (True, True)])
def test_input_also_read_by_a_kernel_or_returned_is_copied(builder, backend, also_kernel, also_output):
    method = _load(_delegate_then_relu(builder, also_kernel, also_output))
    for seed in range(2):
        x = np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)
        keep = x.copy()
        outs = method.execute([x])
        got = _Affine.calls[-1][0][0]
        assert got is not x and not np.shares_memory(got, x)
        np.testing.assert_array_equal(got, keep)
        np.testing.assert_allclose(outs[0], _expected(keep, also_kernel), rtol=1e-6)
        if also_output:
            np.testing.assert_array_equal(outs[1], keep)
            assert not np.shares_memory(outs[1], x)
        x[...] = 100  # mutating the caller's array afterwards changes none of the results
        np.testing.assert_allclose(outs[0], _expected(keep, also_kernel), rtol=1e-6)


def test_input_checks_still_apply_to_borrowed_inputs(builder, backend):
    method = _load(_delegate_then_relu(builder))
    with pytest.raises(RuntimeExecutionError, match="dtype"):
        method.execute([np.zeros((2, 4), np.float64)])
    with pytest.raises(RuntimeExecutionError, match="shape"):
        method.execute([np.zeros((4, 2), np.float32)])


def test_input_feeding_two_delegates_and_concurrent_runs(builder, backend):
    pb = builder.ProgramBuilder()
    x, d1, d2, y = pb.tensor((8,)), pb.tensor((8,)), pb.tensor((8,)), pb.tensor((8,))
    pb.delegate(BACKEND, b"1", [x, d1])
    pb.delegate(BACKEND, b"1", [x, d2])
    pb.op("aten::add", "out", [d1, d2, pb.double(1.0), y, y])
    pb.inputs, pb.outputs = [x], [y]
    method = _load(pb)
    results = {}

    def work(seed):
        xs = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
        for _ in range(20):
            results[seed] = (xs, method.execute([xs])[0])

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for xs, y in results.values():
        np.testing.assert_allclose(y, 6 * xs, rtol=1e-6)


# ------------------------------------------------------------------------------------------ out= destinations
def test_out_gets_planned_arrays_and_results_are_not_copied(builder, backend):
    pb = builder.ProgramBuilder()
    x, a, b, y = pb.tensor((3, 5)), pb.tensor((3, 5)), pb.tensor((3, 5)), pb.tensor((3, 5))
    pb.delegate(BACKEND, b"2", [x, a, b])
    pb.op("aten::add", "out", [a, b, pb.double(1.0), y, y])
    pb.inputs, pb.outputs = [x], [y]
    method = _load(pb)
    x_np = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(method.execute([x_np])[0], 6 * x_np + 1, rtol=1e-6)
        _, out = _Affine.calls[-1]
        assert out is not None and len(out) == 2
        for o in out:
            assert isinstance(o, np.ndarray) and o.shape == (3, 5) and o.dtype == np.float32
            assert o.flags.writeable and o.flags.c_contiguous
        assert not np.shares_memory(out[0], out[1])
    # the same context reuses the same planned arrays
    assert all(p is q for p, q in zip(_Affine.calls[-1][1], _Affine.calls[-2][1]))


@pytest.mark.parametrize("mode", ["write", "same_list", "replace", "ignore"])
def test_outputs_that_are_method_outputs_are_fresh_copies(builder, backend, mode):
    _Affine.mode = mode  # the method is one delegate call (run directly); every way of returning results works
    pb = builder.ProgramBuilder()
    x, d = pb.tensor((4,)), pb.tensor((4,))
    pb.delegate(BACKEND, b"1", [x, d])
    pb.inputs, pb.outputs = [x], [d]
    method = _load(pb)
    y1 = method.execute([np.ones(4, np.float32)])[0]
    y2 = method.execute([np.zeros(4, np.float32)])[0]
    np.testing.assert_array_equal(y1, np.full(4, 3.0))
    np.testing.assert_array_equal(y2, np.zeros(4))
    assert not np.shares_memory(y1, _Affine.calls[-1][1][0])


def test_out_is_none_for_dynamic_unplanned_and_aliasing_outputs(builder, backend):
    pb = builder.ProgramBuilder()
    x = pb.tensor((4,))
    h = _tensor_at(pb, (4,), 64)  # relu(x)
    pb.op("aten::relu", "out", [x, h, h])
    alias = _tensor_at(pb, (4,), 64)  # planned over the delegate's own input: never handed out
    dyn = _tensor_at(pb, (4,), 128, dynamic=True)
    free = _unplanned(pb, (4,))
    ok = _tensor_at(pb, (4,), 192)
    pb.delegate(BACKEND, b"4", [h, alias, dyn, free, ok])
    s1, s2, s3 = pb.tensor((4,)), pb.tensor((4,)), pb.tensor((4,))
    pb.op("aten::add", "out", [alias, dyn, pb.double(1.0), s1, s1])
    pb.op("aten::add", "out", [free, ok, pb.double(1.0), s2, s2])
    pb.op("aten::add", "out", [s1, s2, pb.double(1.0), s3, s3])
    pb.inputs, pb.outputs = [x], [s3]
    method = _load(pb)
    x_np = np.array([-1, 0, 2, 5], np.float32)
    (y,) = method.execute([x_np])
    np.testing.assert_allclose(y, 4 * (3 * np.maximum(x_np, 0)) + 6)
    out = _Affine.calls[-1][1]
    assert [o is None for o in out] == [True, True, True, False]


def test_out_is_none_when_an_input_view_shares_the_output_memory(builder, backend):
    """An input made by a kernel as a view (et_view, unplanned) over memory planned for the output."""
    pb = builder.ProgramBuilder()
    x = pb.tensor((2, 2))
    h = _tensor_at(pb, (2, 2), 0)
    pb.op("aten::relu", "out", [x, h, h])
    v = _unplanned(pb, (4,))
    pb.op("executorch_prim::et_view", "default", [h, pb.int_list([4]), v])
    d = _tensor_at(pb, (4,), 0)  # the same bytes as h, which v views
    pb.delegate(BACKEND, b"1", [v, d])
    pb.inputs, pb.outputs = [x], [d]
    method = _load(pb)
    x_np = np.array([[-1, 1], [2, 3]], np.float32)
    np.testing.assert_array_equal(method.execute([x_np])[0], 3 * np.maximum(x_np, 0).reshape(-1))
    (view,), (entry,) = _Affine.calls[-1]
    assert entry is None  # d's planned bytes are the ones the view reads


@pytest.mark.parametrize("mode", ["ignore", "bad", "same_list", "replace"])
def test_executor_returning_other_arrays(builder, backend, mode):
    _Affine.mode = mode
    method = _load(_delegate_then_relu(builder))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    if mode != "bad":  # fresh results are copied into planned memory as before
        np.testing.assert_array_equal(method.execute([x])[0], _expected(x))
    else:
        with pytest.raises(RuntimeExecutionError, match="output shape .* differs from the planned"):
            method.execute([x])


@pytest.mark.parametrize("executor", [_NoOut, _KwargsOnly])
def test_executors_without_out_keep_working(builder, executor):
    plugin = _Plugin(executor)
    register_plugin(plugin, name="test-delegate-io-classic")
    _Affine.calls.clear()
    try:
        method = _load(_delegate_then_relu(builder))
        x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
        for _ in range(2):
            np.testing.assert_array_equal(method.execute([x])[0], _expected(x))
        assert all(out is None for _, out in _Affine.calls)
        assert _Affine.calls[-1][0][0] is x
    finally:
        unregister_plugin(plugin)


# ------------------------------------------------------- the optional direct_execute(handle) hook
class _Direct(_Affine):
    """``direct_execute`` gives a run that writes ``x * 3 + k`` into the outputs, except while ``refuse`` is set
    (it then returns ``False`` having written nothing). ``runs`` records each run's inputs."""

    refuse = False
    offer = True
    runs: list[list] = []

    def direct_execute(self, handle):
        if not _Direct.offer:
            return None

        def run(inputs, outs):
            if _Direct.refuse:
                return False
            _Direct.runs.append(list(inputs))
            for o, r in zip(outs, self.compute(inputs, handle), strict=True):
                o[...] = r
            return True
        return run


@pytest.fixture
def direct():
    plugin = _Plugin(_Direct)
    register_plugin(plugin, name="test-delegate-direct")
    _Affine.calls.clear()
    _Affine.mode = "write"
    _Direct.runs.clear()
    _Direct.refuse, _Direct.offer = False, True
    yield
    unregister_plugin(plugin)


def test_the_runtime_calls_the_direct_run_instead_of_execute(builder, direct):
    method = _load(_delegate_then_relu(builder))
    for k in range(3):
        x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4) * (k + 1)
        np.testing.assert_array_equal(method.execute([x])[0], _expected(x))
        assert _Direct.runs[-1][0] is x  # the inputs as execute would get them
    assert len(_Direct.runs) == 3 and not _Affine.calls  # execute never ran


def test_a_refused_direct_run_falls_back_to_execute(builder, direct):
    method = _load(_delegate_then_relu(builder))
    _Direct.refuse = True
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(method.execute([x])[0], _expected(x))
    assert not _Direct.runs and len(_Affine.calls) == 1
    _Direct.refuse = False
    np.testing.assert_array_equal(method.execute([x + 1])[0], _expected(x + 1))
    assert len(_Direct.runs) == 1 and len(_Affine.calls) == 1


def test_no_direct_run_offered_means_execute(builder, direct):
    _Direct.offer = False
    method = _load(_delegate_then_relu(builder))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(method.execute([x])[0], _expected(x))
    assert not _Direct.runs and len(_Affine.calls) == 1
