"""The ``static_shapes`` compile spec: XnnpackPartitioner marks each partition whose values have no symbolic dim,
and edgeport's executor then keeps float32 fully connected nodes inside the delegate's native XNNPACK runtimes
instead of on operators shared by every input-shape specialization (``edgeport_xnnpack._fc_ops``).

Oracles: eager PyTorch (within ``RTOL`` of the output's scale), the same model lowered without the hint (the
previous path, bit for bit), and the stock ExecuTorch runtime (child process) on the hinted program. The hint
never decides correctness: a delegate hinted static still runs at other shapes, and bad values are refused.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import RTOL, needs_xnnpack, rel_err

import edgeport_xnnpack.partitioner as partitioner_module
from edgeport import to_edge_transform_and_lower
from edgeport.backend import CompileSpec
from edgeport.errors import ProgramError
from edgeport.program import load_pte
from edgeport.runtime import Runtime
from edgeport_xnnpack import XnnpackPartitioner, _fc_ops
from edgeport_xnnpack.options import STATIC_SHAPES, XnnpackCompileOptions
from edgeport_xnnpack.runtime import XnnpackExecutor
from edgeport_xnnpack.schema.reader import read_blob

pytestmark = [needs_xnnpack]
shared_fc = pytest.mark.skipif(not _fc_ops.available(), reason="this libXNNPACK has no float32 fully connected "
                               "operator: every delegate keeps its fully connected nodes inside its runtimes")


class Block(nn.Module):
    """A pre-norm MLP block and a head: layer norm, two linears around a GELU, a residual, a final linear."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up, self.down, self.head = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.down(nn.functional.gelu(self.up(self.norm(x)))))


class TwoBranches(nn.Module):
    """Two unconnected branches: ``x`` (the one a dynamic dim is put on) and ``y`` (always static)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.a(x)), torch.tanh(self.b(y))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Block().eval()


def _lower(model: nn.Module, args: tuple, shapes: object = None, **kwargs: object) -> bytes:
    ep = torch.export.export(model, args, dynamic_shapes=shapes)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(**kwargs)]).to_executorch().buffer


@functools.cache
def _static_pte() -> bytes:
    return _lower(_model(), (torch.randn(2, 5, 32),))


@functools.cache
def _unhinted_pte() -> bytes:
    """The static model lowered as before the hint existed (a program without the key)."""
    saved = partitioner_module._hint_static_shapes
    partitioner_module._hint_static_shapes = lambda result: None
    try:
        return _lower(_model(), (torch.randn(2, 5, 32),))
    finally:
        partitioner_module._hint_static_shapes = saved


@functools.cache
def _dynamic_pte() -> bytes:
    seq = torch.export.Dim("seq", min=1, max=9)
    return _lower(_model(), (torch.randn(2, 5, 32),), {"x": {1: seq}})


def _specs(pte: bytes) -> list[dict[str, bytes]]:
    return [{c.key: bytes(c.value) for c in d.compile_specs} for d in load_pte(pte).program.execution_plan[0].delegates]


def _summaries(pte: bytes) -> list[dict[str, object]]:
    """Each delegate's plan summary and its count of shared fully connected operator steps (``fc_steps``),
    initialized by the executor with the program's own compile specs."""
    lp = load_pte(pte)
    ex, out = XnnpackExecutor(num_threads=1), []
    for i, d in enumerate(lp.program.execution_plan[0].delegates):
        handle = ex.init(lp.delegate_data(0, i), list(d.compile_specs), named_data=lp.named_data)
        try:
            fc_steps = sum(isinstance(s, _fc_ops.FullyConnectedStep) for s in handle.steps)
            out.append({**handle.summary, "fc_steps": fc_steps})
        finally:
            ex.destroy(handle)
    return out


def _fc_nodes(pte: bytes) -> int:
    """The float32 fully connected nodes of the program's one delegate (the layer norm's means are some)."""
    lp = load_pte(pte)
    graph, _ = read_blob(lp.delegate_data(0, 0))
    return sum(n.kind == "XNNFullyConnected" for n in graph.nodes)


def _run(pte: bytes, *xs: np.ndarray) -> list[np.ndarray]:
    method = Runtime.get().load_program(pte).load_method("forward")
    return method.execute(list(xs))


def _eager(model: nn.Module, *xs: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*(torch.from_numpy(x) for x in xs))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _x(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_static_model_is_hinted_and_keeps_its_fully_connected_nodes_inside_the_runtimes():
    pte = _static_pte()
    assert _specs(pte) == [{STATIC_SHAPES: b"true"}]
    (summary,) = _summaries(pte)
    assert summary["fc_steps"] == 0 and summary["native_steps"] >= 1
    x = _x(2, 5, 32)
    got = _run(pte, x)[0]
    assert rel_err(got, _eager(_model(), x)[0]) < RTOL
    np.testing.assert_array_equal(got, _run(_unhinted_pte(), x)[0])  # the shared-operator path, same bits


@shared_fc
def test_a_program_without_the_key_keeps_the_shared_operators():
    pte = _unhinted_pte()
    assert _specs(pte) == [{}]
    (summary,) = _summaries(pte)
    assert summary["fc_steps"] == _fc_nodes(pte) > 3  # up, down, head, the norm's means
    x = _x(2, 5, 32, seed=1)
    assert rel_err(_run(pte, x)[0], _eager(_model(), x)[0]) < RTOL


@shared_fc
def test_a_dynamic_model_keeps_the_shared_operators_and_runs_at_two_lengths():
    pte = _dynamic_pte()
    assert _specs(pte) == [{STATIC_SHAPES: b"false"}]
    (summary,) = _summaries(pte)
    assert summary["fc_steps"] == _fc_nodes(pte) > 3
    method = Runtime.get().load_program(pte).load_method("forward")
    for n in (9, 3, 1):
        x = _x(2, n, 32, seed=n)
        got = method.execute([x])[0]
        assert got.shape == (2, n, 24)
        assert rel_err(got, _eager(_model(), x)[0]) < RTOL


def test_each_partition_gets_its_own_hint():
    torch.manual_seed(1)
    model = TwoBranches().eval()
    batch = torch.export.Dim("batch", min=1, max=6)
    pte = _lower(model, (torch.randn(4, 16), torch.randn(3, 16)), {"x": {0: batch}, "y": None})
    assert sorted(s[STATIC_SHAPES] for s in _specs(pte)) == [b"false", b"true"]
    method = Runtime.get().load_program(pte).load_method("forward")
    for n in (6, 2):
        xs = (_x(n, 16, seed=n), _x(3, 16, seed=10 + n))
        for got, want in zip(method.execute(list(xs)), _eager(model, *xs), strict=True):
            assert rel_err(got, want) < RTOL


def test_a_delegate_hinted_static_still_runs_at_other_shapes():
    """The user fixes the hint (``static_shapes=True``) on a dynamic model: its fully connected nodes stay inside
    the native runtimes, each specialization packs its own, and every length still computes the eager result."""
    seq = torch.export.Dim("seq", min=1, max=9)
    pte = _lower(_model(), (torch.randn(2, 5, 32),), {"x": {1: seq}},
                 compile_specs=XnnpackCompileOptions(static_shapes=True))
    assert _specs(pte) == [{STATIC_SHAPES: b"true"}]
    assert _summaries(pte)[0]["fc_steps"] == 0
    method = Runtime.get().load_program(pte).load_method("forward")
    reference = Runtime.get().load_program(_dynamic_pte()).load_method("forward")
    for n in (9, 4, 1, 4):
        x = _x(2, n, 32, seed=20 + n)
        got = method.execute([x])[0]
        assert rel_err(got, _eager(_model(), x)[0]) < RTOL
        np.testing.assert_array_equal(got, reference.execute([x])[0])


def test_a_user_given_hint_is_written_once_for_every_partition():
    pte = _lower(_model(), (torch.randn(2, 5, 32),), compile_specs=XnnpackCompileOptions(num_threads=1,
                                                                                        static_shapes=False))
    assert _specs(pte) == [{"num_threads": b"1", STATIC_SHAPES: b"false"}]
    assert _summaries(pte)[0]["fc_steps"] == (_fc_nodes(pte) if _fc_ops.available() else 0)


@pytest.mark.parametrize("value", [b"1", b"\"true\"", b"null", b"yes", b"\xff"])
def test_a_bad_value_is_a_program_error(value):
    lp = load_pte(_static_pte())
    with pytest.raises(ProgramError, match="static_shapes"):
        XnnpackExecutor(num_threads=1).init(lp.delegate_data(0, 0), [CompileSpec(STATIC_SHAPES, value)],
                                            named_data=lp.named_data)


def test_a_repeated_key_is_a_program_error():
    lp = load_pte(_static_pte())
    specs = [CompileSpec(STATIC_SHAPES, b"true"), CompileSpec(STATIC_SHAPES, b"false")]
    with pytest.raises(ProgramError, match="given twice"):
        XnnpackExecutor(num_threads=1).init(lp.delegate_data(0, 0), specs, named_data=lp.named_data)


def test_bad_options_are_refused_when_written():
    with pytest.raises(ValueError, match="static_shapes must be true or false"):
        XnnpackCompileOptions(static_shapes=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="static_shapes"):
        XnnpackPartitioner([CompileSpec(STATIC_SHAPES, b"maybe")])
    assert XnnpackCompileOptions.from_compile_specs([CompileSpec(STATIC_SHAPES, b"true")]).static_shapes is True
    assert XnnpackCompileOptions(static_shapes=False).to_compile_specs() == [CompileSpec(STATIC_SHAPES, b"false")]


@pytest.mark.executorch
def test_the_stock_runtime_runs_the_hinted_programs():
    from edgeport.testing.stock_runtime import run_cases

    x = _x(2, 5, 32, seed=3)
    cases = [("static", _static_pte(), "forward", [torch.from_numpy(x)]),
             ("dynamic", _dynamic_pte(), "forward", [torch.from_numpy(x)]),
             ("unhinted", _unhinted_pte(), "forward", [torch.from_numpy(x)])]
    stock = run_cases(cases)
    assert all(r.ok for r in stock), "\n".join(f"{r.describe()}\n{r.log}" for r in stock)
    want = _eager(_model(), x)[0]
    for result in stock:
        assert rel_err(np.asarray(result.outputs[0]), want) < RTOL
    np.testing.assert_array_equal(np.asarray(stock[0].outputs[0]), np.asarray(stock[2].outputs[0]))


def test_a_value_without_its_shape_makes_the_partition_dynamic():
    """No ``meta["val"]`` means unknown shapes: the partition keeps the shared operators (``false``)."""
    ep = torch.export.export(_model(), (torch.randn(2, 5, 32),))
    result = XnnpackPartitioner().partition(ep)
    assert [s.compile_specs for s in result.partition_tags.values()] == [[CompileSpec(STATIC_SHAPES, b"true")]]
    for node in result.tagged_exported_program.graph.nodes:
        if node.meta.get("delegation_tag") and node.op == "call_function":
            del node.meta["val"]
            break
    for tag, spec in result.partition_tags.items():
        result.partition_tags[tag] = spec._replace(compile_specs=[])
    partitioner_module._hint_static_shapes(result)
    assert [s.compile_specs for s in result.partition_tags.values()] == [[CompileSpec(STATIC_SHAPES, b"false")]]
