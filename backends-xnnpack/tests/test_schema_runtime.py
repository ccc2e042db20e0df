"""Blob format (writer/reader round trip, header layout) and XnnpackExecutor behaviour on good and bad blobs."""

from __future__ import annotations

import math
import struct
import subprocess
import sys

import numpy as np
import pytest
from xnn_helpers import corrupted_blobs, needs_xnnpack

from edgeport.errors import ProgramError, RuntimeExecutionError
from edgeport_xnnpack.runtime import XnnpackExecutor
from edgeport_xnnpack.schema import ConstantDataOffset, Graph, TensorValue, XNode, read_blob, serialize
from edgeport_xnnpack.schema.graph import INVALID_ID
from edgeport_xnnpack.schema.writer import HEADER, HEADER_MAGIC


def conv_relu_graph() -> tuple[Graph, bytes, np.ndarray, np.ndarray]:
    """NCHW input -> transpose -> conv3x3 + relu -> transpose -> NCHW output, constants in the blob."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 2), dtype=np.float32)  # OHWI
    bias = rng.standard_normal(4, dtype=np.float32)
    data = w.tobytes() + bias.tobytes()
    g = Graph(constant_data=[ConstantDataOffset(), ConstantDataOffset(0, w.nbytes),
                             ConstantDataOffset(w.nbytes, bias.nbytes)])
    g.values = [
        TensorValue(1, [1, 2, 5, 5], 0, external_id=0, flags=1),
        TensorValue(1, [1, 5, 5, 2], 1),
        TensorValue(1, [4, 3, 3, 2], 2, constant_buffer_idx=1),
        TensorValue(1, [4], 3, constant_buffer_idx=2),
        TensorValue(1, [1, 5, 5, 4], 4),
        TensorValue(1, [1, 4, 5, 5], 5, external_id=1, flags=2),
    ]
    g.nodes = [
        XNode("XNNStaticTranspose", dict(num_dims=4, perm=[0, 2, 3, 1], input_id=0, output_id=1)),
        XNode("XNNConv2d", dict(padding_top=1, padding_bottom=1, padding_left=1, padding_right=1, kernel_height=3,
                                kernel_width=3, subsampling_height=1, subsampling_width=1, dilation_height=1,
                                dilation_width=1, group_input_channels=2, group_output_channels=4, groups=1,
                                input1_id=1, filter_id=2, bias_id=3, output_id=4), 7, (0.0, math.inf)),
        XNode("XNNStaticTranspose", dict(num_dims=4, perm=[0, 3, 1, 2], input_id=4, output_id=5)),
    ]
    g.num_externs, g.input_ids, g.output_ids = 2, [0], [5]
    return g, serialize(g, data), w, bias


def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    xp = np.pad(x.transpose(0, 2, 3, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((1, 5, 5, 4), np.float32)
    for i in range(5):
        for j in range(5):
            out[0, i, j] = np.tensordot(xp[0, i:i + 3, j:j + 3], w, axes=([0, 1, 2], [1, 2, 3])) + bias
    return np.maximum(out, 0).transpose(0, 3, 1, 2)


def test_round_trip_and_header_layout():
    g, blob, _, _ = conv_relu_graph()
    zero, magic, length, fb_off, fb_size, c_off, c_size = HEADER.unpack_from(blob, 0)
    assert (zero, magic, length, fb_off) == (b"\0\0\0\0", HEADER_MAGIC, 30, 32)
    assert blob[fb_off + 4:fb_off + 8] == b"XN01"
    assert c_off % 16 == 0 and c_off >= fb_off + fb_size and c_size == 4 * (4 * 3 * 3 * 2 + 4)
    back, constants = read_blob(blob)
    assert back.values == g.values and back.num_externs == 2 and len(constants) == c_size
    assert [n.kind for n in back.nodes] == [n.kind for n in g.nodes]
    assert back.nodes[1].output_min_max == (0.0, math.inf) and back.nodes[1].debug_handle == 7
    assert back.constant_data[1].named_key is None  # offsets, never named keys: the blob is self-contained


def test_schema_text_matches_the_executorch_wire_layout():
    """Our .fbs declares the same tables, fields (in slot order) and union members as ExecuTorch's."""
    et = pytest.importorskip("executorch")
    from importlib import resources
    from pathlib import Path

    ours = (resources.files("edgeport_xnnpack") / "schema" / "xnnpack.fbs").read_text()
    theirs = (Path(list(et.__path__)[0]) / "backends/xnnpack/serialization/schema.fbs").read_text()

    def decls(text: str) -> list[tuple[str, str]]:
        import re

        text = re.sub(r"//[^\n]*", "", text)
        out = []
        for kind, name, body in re.findall(r"(table|union|enum)\s+(\w+)[^{]*\{([^}]*)\}", text):
            fields = [f.split(":")[0].split("=")[0].strip() for f in re.split(r"[;,]", body) if f.strip()]
            out.append((f"{kind} {name}", " ".join(fields)))
        return sorted(out)

    # our XNNTensorValue also declares the trailing dq_datatype the runtime's schema variant reads
    runtime = (Path(list(et.__path__)[0]) / "backends/xnnpack/serialization/runtime_schema.fbs").read_text()
    assert "id_out dq_datatype" in dict(decls(runtime))["table XNNTensorValue"]
    ours_decls = [(k, v.replace(" dq_datatype", "")) for k, v in decls(ours)]
    assert ours_decls == decls(theirs)


@needs_xnnpack
def test_executor_runs_a_hand_built_blob():
    _, blob, w, bias = conv_relu_graph()
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(memoryview(blob), [])
    # the NCHW <-> NHWC transposes run as XNNPACK channel-shuffle operators around one native runtime
    assert h.summary == {"native_steps": 1, "host_steps": 0, "operator_steps": 2, "nodes": 3,
                         "fully_connected": h.summary["fully_connected"]}
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5), dtype=np.float32)
    (out,) = ex.execute(h, [x])
    np.testing.assert_allclose(out, reference(x, w, bias), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeExecutionError, match="float32 of shape"):
        ex.execute(h, [x.astype(np.float64)])
    with pytest.raises(RuntimeExecutionError, match="expected 1 inputs"):
        ex.execute(h, [])
    ex.destroy(h)
    ex.destroy(h)
    with pytest.raises(RuntimeExecutionError, match="live handle"):
        ex.execute(h, [x])


@needs_xnnpack
@pytest.mark.parametrize("mutate, message", [
    (lambda g: g.values[4].dims.__setitem__(1, 3), "output dims"),
    (lambda g: g.values[2].dims.__setitem__(slice(None), [2, 3, 3, 4]), "filter"),
    (lambda g: g.nodes[1].fields.__setitem__("input1_id", 99), "not defined"),
    (lambda g: g.nodes.reverse(), "before any node produces it"),
    (lambda g: setattr(g.values[5], "external_id", 7), "external id"),
    (lambda g: setattr(g.constant_data[1], "offset", 1 << 40), "outside"),
    (lambda g: setattr(g.constant_data[1], "named_key", "weights"), "named data"),
    (lambda g: g.values[1].dims.append(1 << 30) or g.values[1].dims.extend([8, 8]), "limits"),
    (lambda g: setattr(g.nodes[0], "kind", "XNNScaledDotProductAttention"), "not supported"),
])
def test_inconsistent_blobs_are_program_errors(mutate, message):
    g, _, w, bias = conv_relu_graph()
    mutate(g)
    blob = serialize(g, w.tobytes() + bias.tobytes())
    with pytest.raises(ProgramError, match=message):
        XnnpackExecutor(num_threads=1).init(memoryview(blob), [])


@needs_xnnpack
def test_corrupted_bytes_never_crash():
    _, blob, _, _ = conv_relu_graph()
    ex = XnnpackExecutor(num_threads=1)
    outcomes = {"ok": 0, "error": 0}
    for data in corrupted_blobs(blob, count=400, seed=0, max_flips=8):
        try:
            h = ex.init(memoryview(data), [])
        except ProgramError:
            outcomes["error"] += 1
            continue
        ex.execute(h, [np.zeros((1, 2, 5, 5), np.float32)]) if h.inputs == [(0, (1, 2, 5, 5))] else None
        ex.destroy(h)
        outcomes["ok"] += 1
    assert outcomes["error"] > 100


@needs_xnnpack
def test_non_blob_inputs_are_program_errors():
    ex = XnnpackExecutor()
    for bad in (b"", b"\0" * 40, b"XH00" * 10, struct.pack("<4s4sHIIIQ", b"", b"XH00", 30, 32, 10**9, 0, 0)):
        with pytest.raises(ProgramError):
            ex.init(memoryview(bad), [])
    with pytest.raises(ProgramError, match="unknown compile spec"):
        from edgeport.backend import CompileSpec

        ex.init(memoryview(conv_relu_graph()[1]), [CompileSpec("bogus", b"1")])


def test_runtime_side_imports_no_torch():
    code = ("import sys, edgeport_xnnpack.runtime, edgeport_xnnpack.plugin, edgeport.runtime; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_invalid_id_constant():
    assert INVALID_ID == 0xFFFFFFFF


@needs_xnnpack
def test_blob_is_not_retained_after_init():
    _, blob, w, bias = conv_relu_graph()
    storage = bytearray(blob)
    view = memoryview(storage)
    ex = XnnpackExecutor(num_threads=1)
    h = ex.init(view, [])
    view.release()  # raises BufferError if the handle still held a view of the blob
    storage[:] = bytes(len(storage))  # wipe it: XNNPACK packed the weights at init
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 5), dtype=np.float32)
    np.testing.assert_allclose(ex.execute(h, [x])[0], reference(x, w, bias), rtol=1e-5, atol=1e-5)
    ex.destroy(h)


def test_missing_library_is_reported(monkeypatch):
    from edgeport_xnnpack import native

    def fail(names, what):
        raise OSError(f"cannot load {what}")

    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_error", None)
    monkeypatch.setattr(native.Library, "_open", staticmethod(fail))
    ok, why = native.is_available()
    assert not ok and "apt-get install -y libxnnpack0 libpthreadpool0" in why
    ok2, why2 = XnnpackExecutor().is_available()
    assert (ok2, why2) == (ok, why)
    with pytest.raises(RuntimeExecutionError, match="libxnnpack0"):
        XnnpackExecutor().init(memoryview(conv_relu_graph()[1]), [])
