"""The C glue (``edgeport_xnnpack._glue``) against the pure-Python path it replaces: same results (numpy oracle),
same refusals with the same messages, setup only when a pointer changes; and the executor's direct call of a
delegate whose steps all run in XNNPACK (a small CNN, against eager PyTorch)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from xnn_helpers import eager, lower_edgeport, needs_xnnpack, rel_err

from edgeport.errors import RuntimeExecutionError
from edgeport_xnnpack import native
from edgeport_xnnpack._native_run import glue_status

pytestmark = needs_xnnpack
GLUE_BUILT = glue_status()[0] == "c"
needs_glue = pytest.mark.skipif(not GLUE_BUILT, reason=glue_status()[1])


def test_the_glue_is_built_unless_the_python_path_is_forced():
    if os.environ.get("EDGEPORT_XNNPACK_GLUE", "").lower() == "python":
        assert glue_status() == ("python", "EDGEPORT_XNNPACK_GLUE=python")
    else:  # pip install compiles it (setup.py); a missing compiler shows here, not as a slow executor
        assert glue_status() == ("c", ""), glue_status()[1]


def _fc_runtime(path: str) -> tuple[native.Runtime, np.ndarray, np.ndarray]:
    sg = native.Subgraph(2)
    x = sg.define_tensor(1, [2, 4], external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    b = np.linspace(-1, 1, 3, dtype=np.float32)
    wi, bi = sg.define_tensor(1, [3, 4], w), sg.define_tensor(1, [3], b)
    y = sg.define_tensor(1, [2, 3], external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
    sg.define("fully_connected", -math.inf, math.inf, x, wi, bi, y, 0, inputs=[x, wi, bi], outputs=[y])
    try:
        rt = native.Runtime(sg, None)
    finally:
        sg.close()
    if path == "python":
        rt.glue = None
    elif rt.glue is None:
        pytest.skip(glue_status()[1])
    return rt, w, b


def _page_end_view(nbytes: int) -> np.ndarray:
    page = np.zeros(3 * 4096, np.uint8)
    base = (-page.ctypes.data) % 4096
    return page[base + 4096 - nbytes: base + 4096]


PATHS = ["c", "python"]


@pytest.mark.parametrize("path", PATHS)
def test_runtime_results_and_setup_caching(path):
    rt, w, b = _fc_runtime(path)
    rng = np.random.default_rng(3)
    base = rng.standard_normal((3, 2, 4), dtype=np.float32)
    staged = _page_end_view(32).view(np.float32).reshape(2, 4)  # XNNPACK may read 16 bytes past it: staged
    staged[:] = rng.standard_normal((2, 4), dtype=np.float32)
    outs = [np.empty((2, 3), np.float32), np.zeros((4, 2, 3), np.float32)[1]]
    calls = [(base[0], outs[0]), (base[0], outs[0]), (base[1], outs[1]), (staged, outs[0]), (staged, outs[0])]
    setups = []
    for x, out in calls:
        out[...] = np.nan
        rt.run_list([x, out])
        np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-6, atol=1e-6)
        setups.append(rt.setups)
    assert setups == [1, 1, 2, 3, 3]  # set up again only when an address changed (the staging buffer stays)
    assert list(rt._scratch) == [0]
    staged[:] += 1  # the same staged view with new contents: copied again
    rt.run_list([staged, outs[0]])
    np.testing.assert_allclose(outs[0], staged @ w.T + b, rtol=1e-6, atol=1e-6)
    rt.close()
    with pytest.raises(native.XnnpackError, match="deleted"):
        rt.run_list([base[0], outs[0]])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("args, message", [
    (lambda: [np.zeros((2, 4), np.float32)], "expected 2"),
    (lambda: [np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)], "C-contiguous array of 32 bytes"),
    (lambda: [np.zeros((4, 2), np.float32).T, np.zeros((2, 3), np.float32)], "C-contiguous"),
    (lambda: [[0.0] * 8, np.zeros((2, 3), np.float32)], "C-contiguous"),
    (lambda: [np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32)[::-1]], "C-contiguous"),
])
def test_runtime_refuses_bad_buffers_with_the_same_message(path, args, message):
    rt, _, _ = _fc_runtime(path)
    with pytest.raises(native.XnnpackError, match=message):
        rt.run_list(args())
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(native.XnnpackError, match="external output 1 is read-only"):
        rt.run_list([np.zeros((2, 4), np.float32), ro])
    x, out = np.ones((2, 4), np.float32), np.empty((2, 3), np.float32)
    rt.run_list([x, out])  # a refused call leaves the runtime usable
    np.testing.assert_allclose(out, np.ones((2, 4)) @ _fc_runtime("python")[1].T + _fc_runtime("python")[2],
                               rtol=1e-6)
    rt.close()


@pytest.mark.parametrize("path", PATHS)
def test_channel_shuffle_paths_agree(path):
    op = native.ChannelShuffle(2, 3, 5)
    if path == "python":
        op.glue = None
    elif op.glue is None:
        pytest.skip(glue_status()[1])
    x = np.random.default_rng(4).standard_normal((2, 3, 5), dtype=np.float32)
    out = np.empty((2, 5, 3), np.float32)
    op.run(x, out)
    np.testing.assert_array_equal(out, x.transpose(0, 2, 1))
    op.run(x, out)
    assert op.setups == 1
    for src, dst, message in [(x.astype(np.float64)[..., :2].copy(), out, "32-bit|bytes"),
                              (x, x, "overlap"), (x, out.astype(np.int16), "bytes|32-bit")]:
        with pytest.raises(native.XnnpackError, match=message):
            op.run(src, dst)
    op.run(x + 1, out)
    np.testing.assert_array_equal(out, (x + 1).transpose(0, 2, 1))
    op.close()


@needs_glue
def test_binding_constructor_refuses_bad_arguments():
    from edgeport_xnnpack import _glue

    def check(call: str, status: int) -> None:
        raise native.XnnpackError(f"{call}: {status}")

    good = dict(kind=0, handle=1, setup=1, run=1, ids=[0, 1], nbytes=[4, 4], outputs=[False, True], extra=16,
                page=4096, check=check)
    for bad in [dict(kind=7), dict(handle=0), dict(setup=None), dict(ids=[0]), dict(nbytes=[4, -1]),
                dict(ids=[0, 2**33]), dict(kind=1, ids=[0, 1, 2], nbytes=[4] * 3, outputs=[0, 1, 1]),
                dict(check=3), dict(page=0)]:
        with pytest.raises((ValueError, TypeError, OverflowError)):
            _glue.Binding(**{**good, **bad})
    b = _glue.Binding(**good)
    with pytest.raises(ValueError):
        b.expect(5, "f", [1])
    with pytest.raises(ValueError):
        b.expect(0, "ff", [1])
    b.close()
    with pytest.raises(RuntimeError, match="deleted"):  # never calls through a closed handle
        b.run([np.zeros(1, np.float32), np.zeros(1, np.float32)])


class SmallCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = SmallCnn().eval()
    x = torch.randn(1, 3, 12, 12)
    _, pte, _ = lower_edgeport(model, (x,))
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method("forward")
    (delegate,) = [d for d in method._plan._delegates.items if d.kind == "backend"]
    return model, x, method, delegate


@needs_glue
def test_cnn_runs_on_the_direct_path_and_matches_eager(cnn):
    model, x, method, delegate = cnn
    handle = delegate.handle
    assert handle.direct is not None
    # the channel shuffle; the classifier stays inside the native runtime (a static delegate: static_shapes)
    assert handle.summary["host_steps"] == 0 and handle.summary["operator_steps"] == 1
    calls = []
    direct = handle.direct
    handle.direct = lambda ins, out: (calls.append(1), direct(ins, out))[1]
    try:
        for seed in range(3):
            xs = torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(seed))
            assert rel_err(method.execute([xs.numpy()])[0], eager(model, (xs,))) < 1e-5
    finally:
        handle.direct = direct
    assert len(calls) == 3


@pytest.mark.parametrize("bad, message", [
    (lambda x: x.astype(np.float64), "float32 of shape"),
    (lambda x: x.view(np.int32), "float32 of shape"),                 # same bytes, wrong dtype
    (lambda x: x.reshape(1, 12, 12, 3).copy(), "float32 of shape"),   # same bytes, wrong dims
])
def test_direct_path_refuses_what_the_general_path_refuses(cnn, bad, message):
    _, x, _, delegate = cnn
    ex, handle = delegate.executor, delegate.handle
    out = np.empty((1, 5), np.float32)
    with pytest.raises(RuntimeExecutionError, match=message):
        ex.execute(handle, [bad(x.numpy())], out=[out])


def test_direct_path_falls_back_to_conversions(cnn):
    model, x, _, delegate = cnn
    ex, handle = delegate.executor, delegate.handle
    want = eager(model, (x,))
    wide = np.zeros((1, 3, 12, 24), np.float32)
    wide[..., ::2] = x.numpy()
    strided = wide[..., ::2]  # not C-contiguous: the general path copies it
    for inputs, out in [([strided], [np.empty((1, 5), np.float32)]), ([np.asfortranarray(x.numpy())], None),
                        ([x.numpy()], [None]), ([x.numpy()], [np.empty((1, 5), np.float32)])]:
        res = ex.execute(handle, inputs, out=out)
        assert rel_err(res[0], want) < 1e-5
        if out is not None and out[0] is not None:
            assert res[0] is out[0]
    ro = np.empty((1, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(RuntimeExecutionError, match="out"):
        ex.execute(handle, [x.numpy()], out=[ro])


@needs_glue
def test_glue_counts_time_inside_the_library(cnn):
    _, x, method, delegate = cnn
    bindings = [s.glue()[0] for s in delegate.handle.steps]
    before = [(b.setup_ns, b.run_ns) for b in bindings]
    method.execute([x.numpy()])
    after = [(b.setup_ns, b.run_ns) for b in bindings]
    assert all(a[1] > b[1] for a, b in zip(after, before))  # every step ran inside the library once more


def test_python_path_refuses_overlapping_calls_and_close_during_a_call():
    """ctypes releases the GIL inside the library calls: the Python path guards them as the C glue does."""
    import threading

    rt, w, b = _fc_runtime("python")
    x, out = np.ones((2, 4), np.float32), np.empty((2, 3), np.float32)
    started, release = threading.Event(), threading.Event()

    class SlowArray(list):  # binding the arrays runs this, while the call holds the runtime
        def __iter__(self):
            started.set()
            release.wait(5)
            return super().__iter__()

    errors: list[Exception] = []
    t = threading.Thread(target=lambda: rt.run_list(SlowArray([x, out])))
    t.start()
    started.wait(5)
    for call in (lambda: rt.run_list([x, out]), rt.close):
        try:
            call()
        except native.XnnpackError as exc:
            errors.append(exc)
    release.set()
    t.join(5)
    assert [str(e) for e in errors] == ["this XNNPACK runtime is already running (calls must not overlap)",
                                        "cannot close an XNNPACK runtime while it runs"]
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-6)  # the first call finished on a live runtime
    rt.close()
    with pytest.raises(native.XnnpackError, match="deleted"):
        rt.run_list([x, out])


@pytest.mark.parametrize("path", PATHS)
def test_runtime_refuses_an_output_that_overlaps_another_external_value(path):
    """An output aliasing an input would be read after XNNPACK overwrote it: refused before setup."""
    sg = native.Subgraph(2)
    x = sg.define_tensor(1, [8], external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
    y = sg.define_tensor(1, [8], external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
    sg.define("clamp", 0.0, 6.0, x, y, 0, inputs=[x], outputs=[y])
    rt = native.Runtime(sg, None)
    sg.close()
    if path == "python":
        rt.glue = None
    elif rt.glue is None:
        pytest.skip(glue_status()[1])
    base = np.linspace(-3, 9, 24, dtype=np.float32)
    for a, b in [(base[:8], base[:8]), (base[:8], base[4:12])]:
        with pytest.raises(native.XnnpackError, match="external values 1 and 0 overlap"):
            rt.run_list([a, b])
    out = np.empty(8, np.float32)
    rt.run_list([base[:8], out])  # apart: runs
    np.testing.assert_array_equal(out, np.clip(base[:8], 0, 6))
    rt.run_list([base[:8], base[8:16]])  # adjacent, not overlapping
    np.testing.assert_array_equal(base[8:16], np.clip(base[:8], 0, 6))
    rt.close()


def test_backend_says_when_the_python_path_runs(monkeypatch):
    """Available either way; without the C glue ``edgeport backends`` / ``doctor`` show why calls are slower."""
    from edgeport_xnnpack import _native_run, plugin

    if GLUE_BUILT:
        assert plugin._is_available() == (True, "")
    monkeypatch.setattr(_native_run, "_glue", None)
    monkeypatch.setattr(_native_run, "_GLUE_WHY", "the C extension edgeport_xnnpack._glue is not built (test)")
    ok, note = plugin._is_available()
    assert ok and note == "per-call work in Python, slower: the C extension edgeport_xnnpack._glue is not built (test)"


def test_direct_path_refuses_what_the_general_path_refuses_in_out(cnn):
    """``out`` of the wrong length or type is refused by the executor's checks, never used as scratch memory."""
    model, x, _, delegate = cnn
    ex, handle = delegate.executor, delegate.handle
    internal = next(iter(handle.buffers.values()))
    y = np.empty((1, 5), np.float32)
    bad_outs = [[], [y, np.empty_like(internal)], [np.ma.masked_array(np.empty((1, 5), np.float32))],
                [memoryview(np.empty((1, 5), np.float32))]]
    for out in bad_outs:
        with pytest.raises(RuntimeExecutionError, match="out"):
            ex.execute(handle, [x.numpy()], out=out)
    res = ex.execute(handle, [x.numpy()], out=[None])  # None: a fresh array, through the general path
    assert rel_err(res[0], eager(model, (x,))) < 1e-5


def test_destroy_waits_for_a_running_call_and_later_calls_fail_cleanly():
    import threading

    from edgeport_xnnpack.runtime import XnnpackExecutor

    torch.manual_seed(1)
    model, x = SmallCnn().eval(), torch.randn(1, 3, 12, 12)
    _, pte, _ = lower_edgeport(model, (x,))
    from edgeport.program import load_pte

    ex = XnnpackExecutor(num_threads=2)
    lp = load_pte(pte)  # the weights live in the program's named data
    handle = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)
    want = eager(model, (x,))
    results: list[object] = []

    def loop() -> None:
        for _ in range(200):
            try:
                out = ex.execute(handle, [x.numpy()], out=[np.empty((1, 5), np.float32)])
                results.append(rel_err(out[0], want))
            except RuntimeExecutionError as exc:
                results.append(str(exc))

    t = threading.Thread(target=loop)
    t.start()
    ex.destroy(handle)  # takes the executor's lock: never closes a step under a running call
    t.join(30)
    assert not handle.alive and handle.pool is None and handle.steps == [] and handle.direct is None
    assert results and all(r < 1e-5 if isinstance(r, float) else "live handle" in r for r in results)
    with pytest.raises(RuntimeExecutionError, match="live handle"):
        ex.execute(handle, [x.numpy()])


class GeluMlp(torch.nn.Module):
    """GELU first (the host segment reads the delegate's input) and between two linear layers (host step inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(torch.nn.functional.gelu(x))))


@needs_glue
def test_delegate_with_host_segments_runs_on_the_direct_path():
    torch.manual_seed(0)
    model = GeluMlp().eval()
    x = torch.randn(4, 16)
    _, pte, _ = lower_edgeport(model, (x,))
    from edgeport.runtime import Runtime

    method = Runtime.get().load_program(pte).load_method("forward")
    (delegate,) = [d for d in method._plan._delegates.items if d.kind == "backend"]
    ex, handle = delegate.executor, delegate.handle
    assert handle.summary["host_steps"] >= 2 and handle.direct is not None
    calls = []
    direct = handle.direct
    handle.direct = lambda ins, out: (calls.append(1), direct(ins, out))[1]
    try:
        for seed in range(3):
            xs = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))
            assert rel_err(method.execute([xs.numpy()])[0], eager(model, (xs,))) < 1e-5
        # what the host segment would read wrongly goes to the general path: converted, or refused
        strided = np.zeros((4, 32), np.float32)
        strided[:, ::2] = x.numpy()
        res = ex.execute(handle, [strided[:, ::2]], out=[np.empty((4, 8), np.float32)])
        assert rel_err(res[0], eager(model, (x,))) < 1e-5
        with pytest.raises(RuntimeExecutionError, match="float32 of shape"):
            ex.execute(handle, [x.numpy().astype(np.float64)], out=[np.empty((4, 8), np.float32)])
    finally:
        handle.direct = direct
    assert len(calls) == 5
