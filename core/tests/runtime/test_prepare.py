"""``Method.prepare``: one run on example inputs for the one-time work of their shapes, results discarded.

Oracle: the eager module called with the same inputs in the same order -- a method prepared before, between or
after its runs must return exactly what eager returns, i.e. the preparation left the state (a KV cache written in
place, a counter) untouched. Also: no ETDump event and no ``profile.runs`` count for it, and the errors ``execute``
gives for inputs the method cannot take.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgeport
from edgeport.errors import RuntimeExecutionError
from edgeport.runtime import Runtime

SLOTS = 6


class KVCache(torch.nn.Module):
    """A cache written with ``index_copy_`` at the given positions, a counter, attention over the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.arange(SLOTS * 4, dtype=torch.float32).reshape(1, SLOTS, 4) / 10)
        self.register_buffer("steps", torch.zeros(1))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(1, pos, self.proj(x))
        self.steps.add_(1)
        weights = torch.softmax(self.cache @ x.transpose(1, 2), dim=1)
        return (weights * self.cache).sum(1) + self.steps


def _steps(n: int = 5) -> list[list[np.ndarray]]:
    gen = torch.Generator().manual_seed(0)
    return [[torch.randn(1, 1, 4, generator=gen).numpy(), np.array([i % SLOTS], np.int64)] for i in range(n)]


def _eager(steps: list[list[np.ndarray]]) -> list[np.ndarray]:
    torch.manual_seed(0)
    model = KVCache().eval()
    with torch.no_grad():
        return [model(*(torch.from_numpy(a) for a in s)).numpy() for s in steps]


@pytest.fixture(scope="module")
def pte() -> bytes:
    torch.manual_seed(0)
    ep = torch.export.export(KVCache().eval(), tuple(torch.from_numpy(a) for a in _steps(1)[0]))
    return edgeport.to_edge(ep).to_executorch().buffer


# values that differ from every real step, written where the real steps write (position 0 and 3)
EXAMPLE = [np.full((1, 1, 4), 9.0, np.float32), np.array([0], np.int64)]
OTHER_EXAMPLE = [np.full((1, 1, 4), -5.0, np.float32), np.array([3], np.int64)]


@pytest.mark.parametrize("prepare_at", [0, 2, 5], ids=["before_any_run", "between_runs", "after_the_runs"])
def test_prepare_leaves_the_state_as_it_was(pte, prepare_at):
    steps = _steps()
    want = _eager(steps + steps[:1])
    method = Runtime.get().load_program(pte).load_method("forward")
    got = []
    for i, s in enumerate(steps + steps[:1]):
        if i == prepare_at:
            method.prepare(EXAMPLE)
            method.prepare(OTHER_EXAMPLE)
        got.append(method.execute(s)[0])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert method.profile.runs == len(steps) + 1


def test_prepare_runs_the_method(pte):
    """A prepared run executes every instruction: an input it cannot take fails in it as in ``execute``."""
    method = Runtime.get().load_program(pte).load_method("forward")
    with pytest.raises(RuntimeExecutionError, match="expected 2 inputs, got 1"):
        method.prepare([EXAMPLE[0]])
    with pytest.raises(RuntimeExecutionError) as prepared:
        method.prepare([EXAMPLE[0], np.array([SLOTS + 3], np.int64)])  # a position past the cache
    with pytest.raises(RuntimeExecutionError) as executed:
        method.execute([EXAMPLE[0], np.array([SLOTS + 3], np.int64)])
    assert str(prepared.value) == str(executed.value)
    # a failed preparation leaves the state as well: the steps still match eager from the initial values
    method = Runtime.get().load_program(pte).load_method("forward")
    with pytest.raises(RuntimeExecutionError):
        method.prepare([EXAMPLE[0], np.array([SLOTS + 3], np.int64)])
    for g, w in zip((method.execute(s)[0] for s in _steps()), _eager(_steps())):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_prepare_is_not_recorded(pte, tmp_path):
    from edgeport.devtools.etdump import load_etdump

    def dump(prepare: bool) -> list[list[str]]:
        program = Runtime.get().load_program(pte, enable_etdump=True)
        method = program.load_method("forward")
        if prepare:
            method.prepare(EXAMPLE)
        method.execute(_steps(1)[0])
        assert method.profile.runs == 1
        program.write_etdump_result_to_file(tmp_path / "run.etdp")
        etdump = load_etdump((tmp_path / "run.etdp").read_bytes())
        return [[e.profile_event.name for e in block.events if e.profile_event] for block in etdump.run_data]

    plain, prepared = dump(False), dump(True)
    assert len(plain) == 2 and len(plain[1]) > 1  # the loading block and the execution's block
    assert prepared == plain


def test_prepare_of_a_method_without_state():
    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 3 + 1

    x = torch.randn(2, 5)
    pte = edgeport.to_edge(torch.export.export(Affine(), (x,))).to_executorch().buffer
    method = Runtime.get().load_program(pte).load_method("forward")
    method.prepare(np.zeros((2, 5), np.float32))  # a lone array is the one input
    np.testing.assert_allclose(method.execute([x.numpy()])[0], (x * 3 + 1).numpy(), rtol=1e-6)
    assert method.profile.runs == 1


def test_prepare_ends_with_a_full_garbage_collection(pte):
    """The collector's first full pass over what loading created happens in ``prepare``, not in the next call:
    a generation-2 collection runs during it, after the prepared run (the garbage it left is gone)."""
    import gc
    import weakref

    method = Runtime.get().load_program(pte).load_method("forward")

    class Cycle:  # garbage only a full collection frees: a reference cycle made before the prepared run
        pass

    cycle = Cycle()
    cycle.me = cycle  # type: ignore[attr-defined]
    gone = weakref.ref(cycle)
    del cycle
    full: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(info["collected"])

    gc.callbacks.append(seen)
    try:
        method.prepare(EXAMPLE)
    finally:
        gc.callbacks.remove(seen)
    assert full and gone() is None
