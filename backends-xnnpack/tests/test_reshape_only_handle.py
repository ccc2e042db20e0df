"""``XnnpackHandle.reshape_only()``: the answer the executor's ``reshape_only(handle)`` hook gives the runtime (which
may then run such a delegate call as a view, ``edgeport.runtime._views``). Checked on the delegates of a Hugging
Face GQA decoder: exactly the lone static-reshape delegates of the KV caches say yes, and their call writes the
input's elements in C order into the output."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")


def test_only_the_lone_reshape_delegates_are_reshape_only():
    from edgeport.llm import export_decoder
    from edgeport.runtime import Runtime
    from edgeport.testing.decoders import DECODERS

    pte = export_decoder(DECODERS["llama"](size="small"), max_seq_len=8, max_context_len=32).manager.buffer
    method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
    handles = [d.handle for d in method._plan._delegates.items]
    yes = [h for h in handles if h.reshape_only()]
    assert len(yes) == 4  # K and V of 2 layers: [1, 2, 32, 8] -> [1, 2, 1, 32, 8] before expand_copy
    for h in handles:
        labels = [s.label for s in h.steps]
        assert h.reshape_only() == (labels == ["host[1 nodes: StaticReshape]"] and len(h.inputs) == 1)
    executor = method._plan._delegates.items[0].executor
    for h in yes:
        (_, dims), (_, out_dims) = h.inputs[0], h.outputs[0]
        x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
        out = executor.execute(h, [x])[0]
        assert out.shape == out_dims
        np.testing.assert_array_equal(out.reshape(-1), x.reshape(-1))
