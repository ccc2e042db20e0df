"""XnnpackBackend's runtime option ``num_threads`` (``load_method(..., backend_options=...)``).

The thread count is read back from pthreadpool itself (``pthreadpool_get_threads_count`` on the pool the
delegates run with), not from our own bookkeeping.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgeport import BackendOptionsError, to_edge_transform_and_lower
from edgeport.runtime import Runtime, backends
from edgeport.testing.models import two_linear
from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner, XnnpackRuntimeOptions, native


def _program(num_threads: int | None = None) -> tuple[bytes, torch.nn.Module, tuple[torch.Tensor, ...]]:
    model, example = two_linear()
    specs = XnnpackCompileOptions(num_threads=num_threads).to_compile_specs()
    ep = torch.export.export(model.eval(), example)
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(compile_specs=specs)]).to_executorch()
    return pte.buffer, model, example


def _pool_threads(method) -> list[int]:
    """Threads of each delegate's pool as pthreadpool reports them (1 when a delegate runs without a pool)."""
    lib = native.library()
    counts = []
    for delegate in method._plan._delegates.items:  # the runtime's delegate handles (test-only access)
        pool = delegate.handle.pool
        counts.append(1 if pool is None or not pool.handle else int(lib.pool.pthreadpool_get_threads_count(pool.handle)))
    return counts


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_num_threads_sets_the_pool_the_delegates_run_with(threads):
    pte, model, example = _program()
    method = Runtime.get().load_program(pte).load_method(
        "forward", backend_options={"XnnpackBackend": {"num_threads": threads}})
    assert _pool_threads(method) == [threads] * len(method.profile.delegates)
    assert all(d.runtime_options == XnnpackRuntimeOptions(num_threads=threads) for d in method.profile.delegates)
    with torch.no_grad():
        want = model(*example).numpy()
    np.testing.assert_allclose(method.execute([example[0].numpy()])[0], want, rtol=1e-5, atol=1e-5)


def test_runtime_option_overrides_the_compile_option():
    pte, _, _ = _program(num_threads=1)
    program = Runtime.get().load_program(pte)
    assert set(_pool_threads(program.load_method("forward"))) == {1}
    method = program.load_method("forward", backend_options={"XnnpackBackend": {"num_threads": 2}})
    assert set(_pool_threads(method)) == {2}
    zero = program.load_method("forward", backend_options={"XnnpackBackend": {"num_threads": 0}})
    assert set(_pool_threads(zero)) == {1}, "0 keeps the compile option"


@pytest.mark.parametrize("value, message", [
    ("2", r"'num_threads' must be int, got str"),
    (True, r"'num_threads' must be int, got bool"),
    (-1, r"num_threads must be an int in 0\.\.1024, got -1"),
])
def test_bad_num_threads_is_refused_at_load(value, message):
    pte, _, _ = _program()
    with pytest.raises(BackendOptionsError, match=message):
        Runtime.get().load_program(pte).load_method("forward", backend_options={"XnnpackBackend": {"num_threads": value}})


def test_backends_lists_the_option():
    (xnnpack,) = [b for b in backends() if b.backend_id == "XnnpackBackend"]
    assert xnnpack.runtime_options == ("num_threads", "fully_connected")
