"""Delegate calls that only reshape run as views (``edgeport.runtime._views``): checked on a Hugging Face GQA
decoder lowered to XNNPACK (its KV caches pass through lone static-reshape delegates before ``expand_copy``)
against the same program loaded without the rewrite (bit-identical logits over prefill and decode steps) and
against eager PyTorch (greedy tokens), with the XNNPACK executor's own ``reshape_only``."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
xnn_runtime = pytest.importorskip("edgeport_xnnpack.runtime")

import edgeport.runtime._method as method_module  # noqa: E402
from edgeport.runtime import Runtime  # noqa: E402


@pytest.fixture(scope="module")
def decoder():
    from edgeport.llm import export_decoder
    from edgeport.testing.decoders import DECODERS

    model = DECODERS["llama"](seed=0, size="small")  # 4 heads over 2 KV heads
    return model, export_decoder(model, max_seq_len=8, max_context_len=32).manager.buffer


def _load(pte: bytes, views: bool, monkeypatch):
    assert callable(getattr(xnn_runtime.XnnpackExecutor, "reshape_only", None))
    if views:
        return Runtime.get().load_program(pte).load_method("forward")
    with monkeypatch.context() as m:
        m.setattr(method_module, "reshape_delegates", lambda *a, **k: {})
        return Runtime.get().load_program(pte).load_method("forward")


def _generate(method, prompt: list[int], new: int) -> tuple[list[int], list[np.ndarray]]:
    logits = method.execute([np.array([prompt], dtype=np.int64), np.arange(len(prompt), dtype=np.int64)])[0]
    tokens, seen = [], [logits]
    for i in range(new):
        tokens.append(int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1])))
        logits = method.execute([np.array([[tokens[-1]]], dtype=np.int64),
                                 np.array([len(prompt) + i], dtype=np.int64)])[0]
        seen.append(logits)
    return tokens, seen


def test_reshape_delegates_run_as_views_bit_identical_and_as_eager(decoder, monkeypatch):
    from edgeport.testing.decoders import greedy_reference

    model, pte = decoder
    viewed, plain = _load(pte, True, monkeypatch), _load(pte, False, monkeypatch)
    assert viewed.profile.viewed_delegates >= 2  # K and V of every layer
    assert plain.profile.viewed_delegates == 0
    delegate_ops = [sum("(delegate" in label for label in chain[2]) for chain in (viewed._plan.chains[0],
                                                                                    plain._plan.chains[0])]
    assert delegate_ops[0] == delegate_ops[1] - viewed.profile.viewed_delegates
    prompt = [5, 17, 3, 99, 42]
    got, got_logits = _generate(viewed, prompt, 12)
    ref, ref_logits = _generate(plain, prompt, 12)
    for a, b in zip(got_logits, ref_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    assert got == ref == greedy_reference(model, prompt, 12, max_context_len=32)
    # a second generation on the same loaded methods (state carried over, then rewritten by the prefill)
    assert _generate(viewed, prompt[:3], 6)[0] == _generate(plain, prompt[:3], 6)[0]


def test_only_single_input_calls_whose_input_stays_unwritten_become_views(decoder, monkeypatch):
    """Every delegate of the program claiming to reshape: only calls with one tensor input and one output, whose
    input nothing writes between the call and the last read of its output, become views -- the same calls as the
    XNNPACK executor's own answers give (the attention and projection delegates take several inputs)."""
    from edgeport.program import schema as S
    from edgeport.runtime._views import reshape_delegates

    _, pte = decoder
    method = _load(pte, True, monkeypatch)
    plan = method._plan

    class Claims:
        kind = "backend"

        def __init__(self, d) -> None:
            self.executor, self.handle, self._d = self, d.handle, d

        def reshape_only(self, handle) -> bool:
            return True

        def num_outputs(self, handle) -> int:
            return self._d.executor.num_outputs(handle)

    from edgeport.program.reader import load_pte
    from edgeport.registry import kernel_registry
    from edgeport.runtime._instructions import analyze_instructions
    from edgeport.runtime._values import MethodValues

    lp = load_pte(pte)
    ep = lp.program.execution_plan[[p.name for p in lp.program.execution_plan].index("forward")]
    mv = MethodValues(ep, lp, "forward")
    analysis = analyze_instructions(mv, ep, kernel_registry())
    found = reshape_delegates(mv, ep, analysis, [Claims(d) for d in plan._delegates.items])
    own = reshape_delegates(mv, ep, analysis, plan._delegates.items)
    assert found == own and len(found) == plan.profile.viewed_delegates
    instrs = ep.chains[0].instructions
    for (_, ii), (src, out) in found.items():
        a = instrs[ii].instr_args
        assert type(a) is S.DelegateCall and a.args[-1] == out
        assert [i for i in a.args[:-1] if mv.kinds[i] is S.Tensor] == [src]
        last = max(j for j, ins in enumerate(instrs) if j > ii and out in getattr(ins.instr_args, "args", ()))
        for j in range(ii + 1, last + 1):
            call = analysis.chains[0][j]
            if call is not None:
                assert src not in [call.params[p] for p in call.outs + call.mut]
