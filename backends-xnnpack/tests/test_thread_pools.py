"""Delegates share one thread pool per thread count; the pool is destroyed with its last user."""

from __future__ import annotations

import pytest

from edgeport_xnnpack import native

pytestmark = pytest.mark.skipif(not native.is_available()[0], reason="libXNNPACK not installed")


def test_shared_pool_is_reference_counted():
    pools = native.SharedPools()
    a = pools.acquire(2)
    b = pools.acquire(2)
    assert a is b and a.handle and pools.users(2) == 2
    pools.release(a)
    assert a.handle and pools.users(2) == 1
    pools.release(b)
    assert a.handle is None and pools.users(2) == 0
    c = pools.acquire(2)
    assert c is not a and c.handle
    pools.release(c)


def test_executors_of_one_program_share_the_pool():
    import torch

    from edgeport import to_edge_transform_and_lower
    from edgeport.runtime import Runtime
    from edgeport_xnnpack import XnnpackCompileOptions, XnnpackPartitioner

    class TwoDelegates(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x @ x.T)
            z = torch.cumsum(y, dim=1)  # not delegated: splits the graph into two partitions
            return torch.sigmoid(z @ z.T)

    x = torch.randn(8, 8)
    ep = torch.export.export(TwoDelegates(), (x,))
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(XnnpackCompileOptions(num_threads=3))])
    from edgeport.aot.delegate_op import CALL_DELEGATE

    delegates = sum(n.target is CALL_DELEGATE for n in edge.exported_program().graph.nodes)
    assert delegates == 2
    program = Runtime.get().load_program(edge.to_executorch().buffer)
    before = native.shared_pools.users(3)
    method = program.load_method("forward")
    assert native.shared_pools.users(3) - before == delegates  # two users of one pool
    (out,) = method.execute([x.numpy()])
    torch.testing.assert_close(torch.from_numpy(out), TwoDelegates()(x), rtol=1e-4, atol=1e-4)
    method.release()
    assert native.shared_pools.users(3) == before
