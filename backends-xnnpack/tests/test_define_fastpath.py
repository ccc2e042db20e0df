"""``native.Subgraph.define``'s fast path (a plain in-range int is passed as is; an error message is formatted only
for a refusal), against the fully checked conversion it replaces: the same arguments reach XNNPACK, the small
decoder's outputs are bit-identical, and every argument the checked path refused is still refused."""

from __future__ import annotations

import math
from ctypes import c_float, c_size_t, c_uint32
from typing import Any

import numpy as np
import pytest
from xnn_helpers import eager_greedy_tokens, forget_planning, greedy_decode, small_decoder

from edgeport_xnnpack import _planner, native

PROMPT = [1, 17, 42, 9, 100, 5, 77]


def _checked_args(definer: str, args: tuple, argtypes: tuple) -> list:
    """The conversion before the fast path (the oracle): every argument through ``_u32`` / ``_dims``."""
    converted: list[Any] = []
    for a, t in zip(args, argtypes, strict=True):
        if t is c_uint32:
            converted.append(native._u32(a, f"xnn_define_{definer} argument"))
        elif t is c_size_t:
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= int(a) < 2**62:
                raise native.XnnpackError(f"xnn_define_{definer}: bad size argument {a!r}")
            converted.append(int(a))
        elif t is c_float:
            converted.append(float(a))
        else:
            converted.append(list(native._dims(a, f"xnn_define_{definer} array argument")))
    return converted


class _Recorder:
    """Stands in for one ``xnn_define_*`` function: records the converted arguments, then calls it."""

    def __init__(self, name: str, fn: Any, log: list) -> None:
        self.name, self.fn, self.log, self.argtypes = name, fn, log, fn.argtypes

    def __call__(self, handle: int, *args: Any) -> int:
        self.log.append((self.name, [list(a) if hasattr(a, "_length_") else a for a in args],
                         [type(a) for a in args]))
        return self.fn(handle, *args)


def _decode(pte: bytes, monkeypatch, log: list, checked: bool) -> list[np.ndarray]:
    from edgeport.runtime import Runtime

    lib = native.library()
    real_plan = _planner.Planner.plan

    def plan(self, *args, **kw):
        forget_planning(self)  # every plan defines its subgraphs afresh
        return real_plan(self, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(_planner.Planner, "plan", plan)
        m.setattr(lib, "definers", {k: _Recorder(k, f, log) for k, f in lib.definers.items()})
        if checked:  # the checked conversion, then the call with the arguments as they were before
            real_define = native.Subgraph.define

            def define(self, definer, *args, inputs=(), outputs=()):
                fn = lib.definers[definer]
                oracle = _checked_args(definer, args, fn.argtypes[1:])
                n = len(log)
                real_define(self, definer, *args, inputs=inputs, outputs=outputs)
                assert log[n][1] == oracle  # the fast path passed exactly what the checked one would
            m.setattr(native.Subgraph, "define", define)
        method = Runtime.get().load_program(pte).load_method(backend_options={"XnnpackBackend": {"num_threads": 1}})
        return greedy_decode(method, 5, PROMPT)


def test_fast_define_is_bit_identical_on_the_small_decoder(monkeypatch):
    model, pte = small_decoder("llama", None)
    fast_log: list = []
    fast = _decode(pte, monkeypatch, fast_log, checked=False)
    checked_log: list = []
    checked = _decode(pte, monkeypatch, checked_log, checked=True)
    assert fast_log and fast_log == checked_log  # the same definers, arguments and argument types, in order
    for a, b in zip(fast, checked, strict=True):
        np.testing.assert_array_equal(a, b)
    tokens = [int(np.argmax(o.reshape(-1, o.shape[-1])[-1])) for o in fast]
    assert tokens == eager_greedy_tokens(model, PROMPT, 6)


@pytest.mark.parametrize("bad", [True, -1, 2**32, 1.0, "3", None])
def test_define_still_refuses_what_the_checked_path_refused(bad):
    """A value the fast path must not take (a bool, out of range, not an int) goes to the full check and fails."""
    if not native.is_available():
        pytest.skip("no libXNNPACK")
    sg = native.Subgraph(2)
    try:
        a = sg.define_tensor(1, (2, 3), external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
        b = sg.define_tensor(1, (2, 3), external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
        with pytest.raises(native.XnnpackError, match="xnn_define_clamp argument"):
            sg.define("clamp", -math.inf, math.inf, a, b, bad, inputs=[a], outputs=[b])
        with pytest.raises(native.XnnpackError, match="xnn_define_clamp argument"):
            sg.define("clamp", -math.inf, math.inf, bad, b, 0, inputs=[a], outputs=[b])
        if sg.lib.has("static_reshape") and bad != 2**32:  # 2**32 is a valid size_t
            with pytest.raises(native.XnnpackError, match="bad size argument"):
                sg.define("static_reshape", bad, [2, 3], a, b, 0, inputs=[a], outputs=[b])
        sg.define("clamp", -math.inf, math.inf, np.uint32(a), b, 0, inputs=[a], outputs=[b])  # numpy ints pass
    finally:
        sg.close()


def test_a_failing_definer_names_the_call():
    """A status other than success still raises with the definer's name (formatted only then)."""
    if not native.is_available():
        pytest.skip("no libXNNPACK")
    sg = native.Subgraph(2)
    try:
        a = sg.define_tensor(1, (2, 3), external_id=0, flags=native.FLAG_EXTERNAL_INPUT)
        b = sg.define_tensor(1, (2, 3), external_id=1, flags=native.FLAG_EXTERNAL_OUTPUT)
        if not sg.lib.has("static_reshape"):
            pytest.skip("no xnn_define_static_reshape")
        with pytest.raises(native.XnnpackError, match="xnn_define_static_reshape failed"):
            # more dimensions than XNNPACK allows (checked by it before it reads the array)
            sg.define("static_reshape", 2**32, [2, 3], a, b, 0, inputs=[a], outputs=[b])
    finally:
        sg.close()
