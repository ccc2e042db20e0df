"""The direct call's chain (``_glue.Chain``, ``_step.h``): a delegate called with the same arrays runs its steps as one
C call of bound steps -- native runtimes (``Binding.plan``), small products (``_gemm.bmm_plan``), copies
(``_kernels.copy_plan`` / ``copy_runs_plan``) and GELU (``_kernels.gelu_plan``).

Checked: each bound step computes what its Python call computes, bit for bit (and the products what numpy's
matmul does, to float32 rounding); the chain refuses io arrays whose layout changed before any step runs, refuses
overlapping calls, runs Python entries in order and passes their errors on; a closed binding's step raises the
binding's own error; Hugging Face models (transformers classes from small configs) give the bits of the path
without the chain on every call, and eager PyTorch's values."""

from __future__ import annotations

import numpy as np
import pytest
from xnn_helpers import needs_xnnpack, rel_err

from edgeport_xnnpack import _direct

glue = pytest.importorskip("edgeport_xnnpack._glue")
kernels = pytest.importorskip("edgeport_xnnpack._kernels")
gemm = pytest.importorskip("edgeport_xnnpack._gemm")
pytestmark = pytest.mark.skipif(_direct._Chain is None, reason="the C glue is not built")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _run(*steps, io=(), n_in=0) -> None:
    glue.Chain(io, n_in, list(steps))()


@pytest.mark.parametrize("case", ["keys_transposed", "values", "broadcast_batch", "scaled_array", "clamped"])
def test_a_bound_product_equals_bmm(case):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 5, 16), dtype=np.float32)
    k = rng.standard_normal((2, 4, 7, 16), dtype=np.float32)
    v = rng.standard_normal((1, 4, 7, 16), dtype=np.float32)
    args: tuple = ()
    if case == "keys_transposed":
        a, b = q, np.swapaxes(k, -1, -2)
    elif case == "values":
        a, b = rng.standard_normal((2, 4, 5, 7), dtype=np.float32), k
    elif case == "broadcast_batch":
        a, b = rng.standard_normal((2, 4, 5, 7), dtype=np.float32), v
    else:
        a, b = q, np.swapaxes(k, -1, -2)
        args = (-1.0, 1.0) if case == "clamped" else (-np.inf, np.inf)
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    got, want = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    scale = np.array([0.25], np.float32)
    if case == "scaled_array":
        step = gemm.bmm_plan(a, b, got, *args, scale)
        for value in (0.25, 0.5):  # the scale is read on every run
            scale[0] = value
            _run(step)
            assert gemm.bmm(a, b, want, *args, value)
            np.testing.assert_array_equal(_bits(got), _bits(want))
        np.testing.assert_allclose(got, a @ (b * np.float32(0.5)), rtol=1e-5, atol=1e-5)
        return
    step = gemm.bmm_plan(a, b, got, *args)
    assert step is not None
    _run(step)
    assert gemm.bmm(a, b, want, *args)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    ref = np.matmul(a, b)
    if args:
        ref = np.clip(ref, *args)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_a_product_bmm_refuses_gets_no_step():
    a = np.ones((2, 3, 4), np.float32)
    out = np.empty((2, 3, 3), np.float32)
    assert gemm.bmm_plan(a, np.ones((2, 4, 3), np.float64), out) is None  # not float32
    assert gemm.bmm_plan(a, np.ones((2, 5, 3), np.float32), out) is None  # inner sizes differ
    shared = np.ones((2, 3, 4), np.float32)
    assert gemm.bmm_plan(shared, np.ones((2, 4, 4), np.float32), shared[:, :, :4].reshape(2, 3, 4)) is None
    assert gemm.bmm_plan(a, np.ones((2, 4, 3), np.float32), out, 0.0, 1.0, np.ones(2, np.float32)) is None  # 2 scales
    with pytest.raises(ValueError, match="bad output range"):
        gemm.bmm_plan(a, np.ones((2, 4, 3), np.float32), out, 1.0, 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (3, 1, 0, 2), (0, 1, 2, 3)])
def test_a_bound_copy_equals_numpys_assignment(dtype, perm):
    src_base = (np.arange(2 * 3 * 4 * 5) * 7 % 251).astype(dtype).reshape(2, 3, 4, 5)
    src = src_base.transpose(perm)[..., ::1]
    got = np.zeros(src.shape, dtype)
    want = np.zeros(src.shape, dtype)
    _run(kernels.copy_plan(src, got))
    want[...] = src
    np.testing.assert_array_equal(got, want)
    strided = src_base[:, ::2, 1:, ::3]
    got2 = np.zeros(strided.shape, dtype)
    _run(kernels.copy_plan(strided, got2))
    np.testing.assert_array_equal(got2, strided)


def test_a_copy_that_does_not_fit_gets_no_step():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert kernels.copy_plan(a.T, np.empty((6, 4), np.float64)) is None  # formats differ
    assert kernels.copy_plan(a.T, np.empty((4, 6), np.float32)) is None  # shapes differ
    assert kernels.copy_plan(a[:, :3], a[:, 3:]) is None  # dst not C-contiguous
    assert kernels.copy_plan(a.reshape(6, 4).T, a.reshape(4, 6)) is None  # the same memory
    ro = np.empty((6, 4), np.float32)
    ro.flags.writeable = False
    assert kernels.copy_plan(a.T, ro) is None


def test_bound_gelu_and_copy_runs_equal_their_calls():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1000, dtype=np.float32) * 4
    got, want = np.empty_like(x), np.empty_like(x)
    _run(kernels.gelu_plan(x, got))
    kernels.gelu(x, want)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert kernels.gelu_plan(x, np.empty(999, np.float32)) is None
    assert kernels.gelu_plan(x.astype(np.float64), np.empty(1000, np.float64)) is None
    # rows (src slot, dst slot, src offset, dst offset, count, len, src step): a transpose of 3 x 4 and a slice
    src = np.arange(12, dtype=np.float32)
    table = np.array([[0, 1, k, 3 * k, 3, 1, 4] for k in range(4)] + [[0, 2, 2, 0, 1, 5, 0]], np.int64)
    outs = [np.zeros(12, np.float32), np.zeros(5, np.float32)]
    want_outs = [np.zeros(12, np.float32), np.zeros(5, np.float32)]
    _run(kernels.copy_runs_plan([src, *outs], 1, table, 4))
    assert kernels.copy_runs([src, *want_outs], 1, table, 4)
    for g, w in zip(outs, want_outs, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(outs[0], src.reshape(3, 4).T.reshape(-1))
    assert kernels.copy_runs_plan([src, src], 1, table[:1], 4) is None  # a destination is a source


def test_the_chain_checks_its_io_arrays_before_any_step():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.zeros((3, 2), np.float32)
    chain = glue.Chain([x, out], 1, [kernels.copy_plan(x.T, out)])
    chain()
    np.testing.assert_array_equal(out, x.T)
    out[...] = -1
    for change, undo in (
            (lambda: setattr(out, "shape", (2, 3)), lambda: setattr(out, "shape", (3, 2))),
            (lambda: setattr(out.flags, "writeable", False), lambda: setattr(out.flags, "writeable", True)),
            (lambda: setattr(x, "dtype", np.int32), lambda: setattr(x, "dtype", np.float32))):
        change()
        with pytest.raises(ValueError, match="delegate value"):
            chain()
        assert (out == -1).all()  # nothing ran
        undo()
    chain()
    np.testing.assert_array_equal(out, x.T)


def test_the_chain_runs_python_entries_in_order_and_passes_errors_on():
    seen: list[int] = []
    a = np.zeros(4, np.float32)
    b = np.ones(4, np.float32)
    chain = glue.Chain([a, b], 1, [lambda: seen.append(1), kernels.copy_plan(a, b), lambda: seen.append(2)])
    chain()
    assert seen == [1, 2] and (b == 0).all()

    def boom() -> None:
        raise KeyError("boom")
    with pytest.raises(KeyError, match="boom"):
        glue.Chain([], 0, [boom, lambda: seen.append(3)])()
    assert seen == [1, 2]  # the entries after a failing one do not run

    holder: list = []

    def again() -> None:
        holder[0]()
    holder.append(glue.Chain([], 0, [again]))
    with pytest.raises(RuntimeError, match="already running"):
        holder[0]()
    with pytest.raises(TypeError, match="neither a bound step nor callable"):
        glue.Chain([], 0, [42])
    with pytest.raises(TypeError, match="takes no arguments"):
        glue.Chain([], 0, [])(1)


@needs_xnnpack
def test_a_native_step_of_a_closed_binding_raises_the_bindings_error():
    from test_executor_plan import D, S, attention_blob

    from edgeport_xnnpack.runtime import XnnpackExecutor

    blob, _ = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    x = np.ones((1, S, D), np.float32)
    outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
    for _ in range(3):
        ex.execute(h, [x], out=outs)
    cells = dict(zip(h.direct.__code__.co_freevars, (c.cell_contents for c in h.direct.__closure__), strict=True))
    chain = cells["state"][0]
    assert chain is not None
    for step in h.steps:
        glue_step = step.glue()
        if glue_step is not None and hasattr(glue_step[0], "close"):
            glue_step[0].close()
    with pytest.raises(RuntimeError, match="deleted"):
        chain()
    ex.destroy(h)


@needs_xnnpack
@pytest.mark.parametrize("name", ["bert", "llama", "t5_encoder", "vit"])
def test_hugging_face_models_give_the_same_bits_with_the_chain(name, monkeypatch):
    pytest.importorskip("transformers")
    import torch

    from edgeport.runtime import Runtime
    from edgeport.testing.architectures import ARCHITECTURES
    from xnn_helpers import lower_edgeport

    arch = ARCHITECTURES[name](seed=0, size="small")
    model, args = arch.model, tuple(arch.example_inputs)
    _, pte, _ = lower_edgeport(model, args)
    chains: list = []
    real = _direct._chained

    def counting(flat, io, n_in):  # noqa: ANN001, ANN202
        chain = real(flat, io, n_in)
        if _direct._Chain is not None:
            chains.append(chain.counts)
        return chain
    monkeypatch.setattr(_direct, "_chained", counting)
    options = {"XnnpackBackend": {"num_threads": 1}}
    with_chain = Runtime.get().load_program(pte).load_method("forward", backend_options=options)
    without = Runtime.get().load_program(pte).load_method("forward", backend_options=options)
    rng = np.random.default_rng(0)
    for call in range(5):  # the chain is made at the second call with the same arrays, run from the third
        xs = [a.numpy() if a.dtype.is_floating_point is False else
              (a.numpy() + rng.standard_normal(a.shape).astype(np.float32) * 0.1 * call) for a in args]
        got = with_chain.execute(xs)
        monkeypatch.setattr(_direct, "_Chain", None)  # this method's calls: the Python loop over the same calls
        ref = without.execute(xs)
        monkeypatch.setattr(_direct, "_Chain", glue.Chain)
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_array_equal(_bits(g), _bits(r))
        with torch.no_grad():
            out = model(*[torch.from_numpy(np.ascontiguousarray(x)) for x in xs])
        want = (out if isinstance(out, torch.Tensor) else out[0]).numpy()
        assert rel_err(got[0], want) < 1e-4
    assert chains and all(bound == entries for entries, bound in chains), chains  # no Python call left


def _at_page_end(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array whose last byte is the last byte of a page (XNNPACK may read past it: the binding stages it)."""
    import mmap

    n, page = int(np.prod(shape)), mmap.PAGESIZE
    raw = np.empty(n + page // 4 + 16, np.float32)
    addr = raw.ctypes.data
    end = ((addr + n * 4) // page + 1) * page
    start = (end - n * 4 - addr) // 4
    a = raw[start:start + n].reshape(shape)
    assert (a.ctypes.data + a.nbytes) % page == 0
    return a


@needs_xnnpack
def test_an_input_at_a_page_end_is_staged_by_the_bound_step():
    from test_executor_plan import D, S, attention_blob, attention_reference

    from edgeport_xnnpack.runtime import XnnpackExecutor

    blob, c = attention_blob()
    ex = XnnpackExecutor(num_threads=1)
    h, fresh = ex.init(memoryview(blob), []), ex.init(memoryview(blob), [])
    rng = np.random.default_rng(5)
    x = _at_page_end((1, S, D))
    outs = [np.empty((S, 1, D), np.float32), np.empty((1, S, S), np.float32)]
    for _ in range(5):
        x[...] = rng.standard_normal((1, S, D))
        got = ex.execute(h, [x], out=outs)
        want = ex.execute(fresh, [x.copy()])  # another handle on other arrays: the per-step path
        for g, w, r in zip(got, want, attention_reference(x, c), strict=True):
            np.testing.assert_array_equal(_bits(g), _bits(w))
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    staged = [s.glue()[0].staged for s in h.steps if s.glue() is not None and hasattr(s.glue()[0], "staged")]
    assert any(staged), staged  # the input was staged by its binding...
    cells = dict(zip(h.direct.__code__.co_freevars, (c.cell_contents for c in h.direct.__closure__), strict=True))
    assert cells["state"][0].counts == (7, 6)  # ...and its step is still bound (the host multiply stays numpy)
    ex.destroy(h)
    ex.destroy(fresh)
