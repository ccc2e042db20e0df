"""The text runner prepares the one-token decode step at load (``Method.prepare``): the XNNPACK delegates
specialize for it there, so no decode step plans anything, and the tokens are still eager PyTorch's.

The specializations are counted at ``edgeport_xnnpack._planner.Planner.plan`` (one call per delegate and new
shape); the oracle of the tokens is eager greedy generation of the same module (``greedy_reference``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("edgeport_xnnpack")

from edgeport_xnnpack import _planner  # noqa: E402

from edgeport.llm import GenerationConfig, TextRunner, export_decoder  # noqa: E402
from edgeport.testing.decoders import DECODERS, greedy_reference  # noqa: E402

PROMPT = [1, 17, 42, 9, 100, 5, 77]
NEW = 24
CONTEXT = 48
XNN = {"XnnpackBackend": {"num_threads": 1}}


@pytest.fixture(scope="module")
def llama():
    reference = greedy_reference(DECODERS["llama"](), PROMPT, NEW, CONTEXT)
    return export_decoder(DECODERS["llama"](), max_seq_len=16, max_context_len=CONTEXT).manager.buffer, reference


@pytest.fixture
def plans(monkeypatch):
    """The number of delegate specializations so far (a list holding one count)."""
    count = [0]
    plan = _planner.Planner.plan

    def counting(self, *args, **kwargs):
        count[0] += 1
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(_planner.Planner, "plan", counting)
    return count


@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "not_prepared"])
def test_decode_steps_plan_nothing_once_prepared(llama, plans, prepare):
    pte, reference = llama
    runner = TextRunner(pte, backend_options=XNN, prepare_decode=prepare)
    at_load = plans[0]  # static-shape delegates plan at load anyway; the preparation adds the one-token shape
    assert (runner.prepare_s > 0) == prepare
    decode_plans: list[int] = []

    def on_token(_: int) -> None:  # called after prefill's token, then after each decode step
        decode_plans.append(plans[0])

    result = runner.generate(PROMPT, GenerationConfig(max_new_tokens=NEW, stop_on_eos=False), on_token=on_token)
    assert result.tokens == reference
    prefill_plans = decode_plans[0] - at_load
    assert prefill_plans > 0  # the 7-token prompt is a shape of its own
    first_step = decode_plans[1] - decode_plans[0]
    assert (first_step == 0) == prepare  # prepared: planned at load; else the first decode step plans
    assert decode_plans[-1] == decode_plans[1]  # and never again
    assert runner._method.profile.runs == 1 + NEW - 1  # the preparation is not counted as a run
