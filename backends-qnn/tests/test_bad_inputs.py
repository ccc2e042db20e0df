"""Malformed requests are refused in Python (ValueError) or reported by QNN (QnnError), never crash."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from edgeport_qnn.sdk import QnnBackend, QnnError, QuantParams


@pytest.fixture
def relu(context):
    g = context.graph_builder("relu")
    g.add_input("x", (2, 4), np.float32)
    g.add_output("y", (2, 4), np.float32)
    g.add_node("Relu", "relu0", ["x"], ["y"])
    return g.finalize()


@pytest.mark.parametrize("bad, match", [
    ([np.zeros((2, 4), np.float64)], "dtype"),
    ([np.zeros((2, 4), np.int32)], "dtype"),
    ([np.zeros((4, 2), np.float32)], "shape"),
    ([np.zeros((2, 4, 1), np.float32)], "shape"),
    ([np.zeros((4, 4), np.float32)[::2]], "contiguous"),
    ([np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 4))], "contiguous"),
    ([np.zeros((2, 4), np.float32).astype(">f4")], "dtype"),
    ([], "takes 1 inputs"),
    ([np.zeros((2, 4), np.float32)] * 2, "takes 1 inputs"),
    ([[[0.0] * 4] * 2], "numpy array"),
    (np.zeros((2, 4), np.float32), "list of numpy arrays"),
])
def test_execute_rejects_bad_inputs_before_calling_qnn(relu, bad, match):
    with pytest.raises(ValueError, match=match):
        relu.execute(bad)
    np.testing.assert_array_equal(relu.execute([np.full((2, 4), -1, np.float32)])[0], 0)  # still usable


def test_unaligned_input_is_rejected(relu):
    raw = np.zeros(2 * 4 * 4 + 1, np.uint8)[1:]
    unaligned = raw.view(np.float32).reshape(2, 4)
    assert not unaligned.flags.aligned
    with pytest.raises(ValueError, match="aligned"):
        relu.execute([unaligned])


def test_unknown_op_type_raises_qnn_error_with_code_and_name(context):
    g = context.graph_builder("bad_op")
    g.add_input("x", (1, 4), np.float32)
    g.add_output("y", (1, 4), np.float32)
    with pytest.raises(QnnError) as info:
        g.add_node("NoSuchOp", "n0", ["x"], ["y"])
    err = info.value
    assert err.op == "NoSuchOp" and err.code == 4005 and err.name == "QNN_BACKEND_ERROR_OP_PACKAGE_NOT_FOUND"
    assert "NoSuchOp" in str(err) and "4005" in str(err)
    g.add_node("Relu", "n0", ["x"], ["y"])  # the failed node left nothing behind
    np.testing.assert_array_equal(g.finalize().execute([np.ones((1, 4), np.float32)])[0], 1)


def test_invalid_node_configs_raise_qnn_error(context):
    g = context.graph_builder("bad_configs")
    g.add_input("x", (1, 4, 4, 2), np.float32)
    g.add_static("w", np.ones((3, 3, 2, 5), np.float32))
    g.add_output("y", (1, 2, 2, 5), np.float32)
    with pytest.raises(QnnError) as info:  # wrong output shape for a padding-free 3x3 conv
        g.add_node("Conv2d", "c0", ["x", "w"], [("z", (1, 9, 9, 5), np.float32)],
                   {"stride": np.array([1, 1], np.uint32), "pad_amount": np.zeros((2, 2), np.uint32)})
    assert info.value.op == "Conv2d" and info.value.code is not None
    with pytest.raises(QnnError):  # unknown parameter name
        g.add_node("Relu", "r0", ["x"], [("r", (1, 4, 4, 2), np.float32)], {"no_such_param": 3})
    with pytest.raises(QnnError):  # too many inputs
        g.add_node("Relu", "r1", ["x", "w"], [("r1o", (1, 4, 4, 2), np.float32)])


def test_malformed_requests_raise_value_error(context):
    g = context.graph_builder("malformed")
    g.add_input("x", (1, 4), np.float32)
    for args in [("", (1, 4), np.float32), ("x", (1, 4), np.float32), ("n\0ul", (1, 4), np.float32),
                 ("z", (0, 4), np.float32), ("z", (), np.float32), ("z", (1, 4), np.complex64),
                 ("z", (1, 4), np.float32, QuantParams(0.1, 0)), ("z", (2**16, 2**16, 2), np.float32)]:
        with pytest.raises(ValueError):
            g.add_output(*args)
    with pytest.raises(ValueError):
        QuantParams(0.0, 0)
    with pytest.raises(ValueError):
        QuantParams(float("nan"), 0)
    with pytest.raises(ValueError):
        QuantParams((0.1, 0.2), (0, 0))  # several scales without an axis
    with pytest.raises(ValueError, match="unknown input"):
        g.add_node("Relu", "r", ["nope"], [("o", (1, 4), np.float32)])
    with pytest.raises(ValueError, match="not a declared graph output"):
        g.add_node("Relu", "r", ["x"], ["undeclared"])
    with pytest.raises(ValueError, match="sequences of names"):
        g.add_node("Relu", "r", "x", [("o", (1, 4), np.float32)])
    with pytest.raises(ValueError, match="does not fit"):
        g.add_node("Relu", "r", ["x"], [("o", (1, 4), np.float32)], {"p": 2**40})
    with pytest.raises(ValueError, match="unsupported value"):
        g.add_node("Relu", "r", ["x"], [("o", (1, 4), np.float32)], {"p": "text"})
    with pytest.raises(QnnError, match="not produced"):  # finalize checks outputs are produced
        g.add_output("y", (1, 4), np.float32)
        g.finalize()
    with pytest.raises(ValueError, match="already exists"):
        context.graph_builder("malformed")


def test_input_used_before_it_is_produced(context):
    g = context.graph_builder("order")
    g.add_input("x", (1, 4), np.float32)
    g.add_output("y", (1, 4), np.float32)
    g.add_output("z", (1, 4), np.float32)
    with pytest.raises(ValueError, match="not produced yet"):
        g.add_node("Relu", "r0", ["z"], ["y"])
    g.add_node("Relu", "r0", ["x"], ["y"])
    with pytest.raises(ValueError, match="already produced"):
        g.add_node("Relu", "r1", ["x"], ["y"])
    g.add_node("Relu", "r1", ["y"], ["z"])
    graph = g.finalize()
    with pytest.raises(QnnError, match="finalized"):
        g.add_node("Relu", "r2", ["x"], [("w", (1, 4), np.float32)])
    assert len(graph.execute([np.ones((1, 4), np.float32)])) == 2


def test_unfinalized_context_cannot_be_serialized(context):
    g = context.graph_builder("open")
    g.add_input("x", (1, 4), np.float32)
    with pytest.raises(QnnError, match="not finalized"):
        context.context_binary()
    with pytest.raises(QnnError, match="not finalized"):
        g.execute([np.ones((1, 4), np.float32)])


def test_close_is_deterministic_idempotent_and_use_after_close_raises(requires_qnn):
    backend = QnnBackend.load("htp")
    context = backend.create_context()
    g = context.graph_builder("g")
    g.add_input("x", (1, 4), np.float32)
    g.add_output("y", (1, 4), np.float32)
    g.add_node("Relu", "r", ["x"], ["y"])
    graph = g.finalize()
    second = backend.create_context()
    context.close()
    context.close()
    assert context.closed and not backend.closed and not second.closed
    with pytest.raises(QnnError, match="context is closed"):
        graph.execute([np.ones((1, 4), np.float32)])
    backend.close()  # frees the still-open second context first
    assert second.closed and backend.closed
    backend.close()
    with pytest.raises(QnnError, match="backend is closed"):
        backend.create_context()
    with pytest.raises(QnnError, match="closed"):
        second.context_binary()


def test_garbage_collection_frees_without_close(requires_qnn):
    backend = QnnBackend.load("htp")
    ctx = backend.create_context()
    state = ctx._h
    del ctx
    gc.collect()
    assert state.context is None
    handles = backend._h
    del backend
    gc.collect()
    assert handles.backend is None and handles.device is None and handles.log is None
