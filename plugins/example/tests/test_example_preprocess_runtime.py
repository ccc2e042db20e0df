"""preprocess -> blob -> ExampleExecutor, checked against eager PyTorch; the blob format; bad blobs."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeport.backend import CompileSpec
from edgeport.errors import EdgeportError, LoweringError, ProgramError, RuntimeExecutionError
from edgeport_example import __version__
from edgeport_example import format as fmt
from edgeport_example.preprocess import preprocess
from edgeport_example.runtime import ExampleExecutor


def run_blob(blob: bytes, inputs, specs=()):
    ex = ExampleExecutor()
    handle = ex.init(memoryview(blob), list(specs))
    try:
        return ex.execute(handle, [np.asarray(t.detach().numpy()) for t in inputs])
    finally:
        ex.destroy(handle)


def check_against_eager(ep, module, args, atol=1e-6, rtol=1e-6):
    blob = preprocess(ep, []).processed_bytes
    got = run_blob(blob, args)
    with torch.no_grad():
        want = module(*args)
    want = (want,) if isinstance(want, torch.Tensor) else tuple(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w.numpy(), rtol=rtol, atol=atol)
    return blob


def split_blob(blob: bytes):
    magic, version, n = struct.unpack_from("<4sII", blob, 0)
    doc = json.loads(blob[12 : 12 + n])
    return magic, version, doc, fmt.data_start(n)


# --- modules -------------------------------------------------------------------------------------------


class Elementwise(torch.nn.Module):
    def forward(self, x, y):
        a = (x + y) * x - y
        b = torch.add(a, y, alpha=2.0)
        c = torch.sub(b, x, alpha=0.5)
        return torch.relu(torch.sin(c)) * c


class Broadcast(torch.nn.Module):
    def forward(self, x, y):
        return x * y + y - x


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)


class AddMM(torch.nn.Module):
    def forward(self, bias, a, b):
        return torch.addmm(bias, a, b, beta=0.5, alpha=2.0), torch.addmm(bias, a, b)


class MLP(torch.nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 5, bias=bias)
        self.l2 = torch.nn.Linear(5, 3, bias=bias)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class WithConstants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("persistent", torch.randn(4))
        self.register_buffer("transient", torch.randn(4), persistent=False)
        self.lifted = torch.randn(4)  # plain tensor attribute -> CONSTANT_TENSOR

    def forward(self, x):
        return (x * self.w + self.persistent - self.transient) * self.lifted, x


CASES = {
    "elementwise": (Elementwise, lambda: (torch.randn(3, 4), torch.randn(3, 4)), False),
    "broadcast": (Broadcast, lambda: (torch.randn(3, 4), torch.randn(4)), False),
    "mm": (MatMul, lambda: (torch.randn(3, 5), torch.randn(5, 2)), False),
    "addmm": (AddMM, lambda: (torch.randn(2), torch.randn(3, 4), torch.randn(4, 2)), False),
    "mlp_decomposed": (MLP, lambda: (torch.randn(2, 6),), False),
    "mlp_linear_kept": (MLP, lambda: (torch.randn(2, 6),), True),
    "mlp_no_bias": (lambda: MLP(bias=False), lambda: (torch.randn(2, 6),), True),
    "constants": (WithConstants, lambda: (torch.randn(4),), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_eager(case, edge_program):
    torch.manual_seed(0)
    factory, make_args, keep_linear = CASES[case]
    module = factory()
    args = make_args()
    ep = edge_program(module, *args, keep_linear=keep_linear)
    blob = check_against_eager(ep, module, args)
    _, _, doc, _ = split_blob(blob)
    ops = {n["op"] for n in doc["nodes"]}
    if case == "mlp_linear_kept":
        assert ops == {"aten.linear.default", "aten.relu.default"}
    if case == "mlp_decomposed":
        assert ops == {"aten.addmm.default", "aten.permute_copy.default", "aten.relu.default"}


def test_linear_on_3d_input(edge_program):
    module = torch.nn.Linear(4, 3)
    args = (torch.randn(2, 5, 4),)
    check_against_eager(edge_program(module, *args, keep_linear=True), module, args)


def test_dynamic_batch(edge_program):
    batch = torch.export.Dim("batch", min=1, max=16)
    module = Broadcast()
    ep = edge_program(module, torch.randn(3, 4), torch.randn(4), dynamic_shapes={"x": {0: batch}, "y": None})
    blob = preprocess(ep, []).processed_bytes
    _, _, doc, _ = split_blob(blob)
    assert doc["input_specs"][0] == {"dtype": "float32", "shape": [None, 4]}
    for n in (1, 7):
        args = (torch.randn(n, 4), torch.randn(4))
        np.testing.assert_allclose(run_blob(blob, args)[0], module(*args).numpy(), rtol=1e-6, atol=1e-6)


def test_blob_layout(edge_program):
    torch.manual_seed(0)
    module = WithConstants()
    ep = edge_program(module, torch.randn(4))
    blob = preprocess(ep, [CompileSpec("max_value", bytes([4]))]).processed_bytes
    magic, version, doc, start = split_blob(blob)
    assert magic == b"EPEX" and version == fmt.FORMAT_VERSION == 1
    assert start % 16 == 0
    assert doc["backend_id"] == "ExampleBackend"
    assert doc["plugin_version"] == __version__
    assert doc["compile_specs"] == {"max_value": 4}
    assert doc["inputs"] == ["x"]
    assert doc["outputs"] == ["mul_1", "x"]
    assert doc["nodes"][0] == {
        "op": "aten.mul.Tensor",
        "args": [{"value": "x"}, {"value": "p_w"}],
        "output": "mul",
    }
    assert doc["nodes"][1]["op"] == "aten.add.Tensor" and doc["nodes"][1]["args"][2] == 1  # alpha filled in
    by_name = {c["name"]: c for c in doc["constants"]}
    expected = {
        "p_w": module.w,
        "b_persistent": module.persistent,
        "b_transient": module.transient,
        "c_lifted": module.lifted,
    }
    assert set(by_name) == set(expected)
    for name, tensor in expected.items():
        c = by_name[name]
        assert c["offset"] % 16 == 0 and c["dtype"] == "float32" and c["shape"] == [4] and c["nbytes"] == 16
        raw = blob[start + c["offset"] : start + c["offset"] + c["nbytes"]]
        assert raw == tensor.detach().numpy().astype("<f4").tobytes()
    # the document is readable text
    assert blob[12:14] == b"{\n"


def test_constants_are_zero_copy_views(edge_program):
    module = MLP()
    ep = edge_program(module, torch.randn(2, 6))
    blob = bytearray(preprocess(ep, []).processed_bytes)
    ex = ExampleExecutor()
    handle = ex.init(memoryview(blob), [])
    backing = np.frombuffer(blob, dtype=np.uint8)
    assert handle.constants
    for array in handle.constants.values():
        assert np.shares_memory(array, backing)
    out = ex.execute(handle, [np.ones((2, 6), np.float32)])[0]
    assert not np.shares_memory(out, backing)
    ex.destroy(handle)
    with pytest.raises(RuntimeExecutionError, match="destroyed"):
        ex.execute(handle, [np.ones((2, 6), np.float32)])


def test_outputs_do_not_alias_inputs(edge_program):
    ep = edge_program(WithConstants(), torch.randn(4))
    blob = preprocess(ep, []).processed_bytes
    x = np.ones(4, np.float32)
    ex = ExampleExecutor()
    outs = ex.execute(ex.init(memoryview(blob), []), [x])
    assert not np.shares_memory(outs[1], x)
    np.testing.assert_array_equal(outs[1], x)


def test_execute_checks_inputs(edge_program):
    ep = edge_program(MatMul(), torch.randn(3, 5), torch.randn(5, 2))
    ex = ExampleExecutor()
    h = ex.init(memoryview(preprocess(ep, []).processed_bytes), [])
    a, b = np.ones((3, 5), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(RuntimeExecutionError, match="expected 2 inputs"):
        ex.execute(h, [a])
    with pytest.raises(RuntimeExecutionError, match="float32"):
        ex.execute(h, [a.astype(np.float64), b])
    with pytest.raises(RuntimeExecutionError, match="shape"):
        ex.execute(h, [a, np.ones((4, 2), np.float32)])
    assert ex.is_available() == (True, "")


# --- preprocess errors -----------------------------------------------------------------------------------


def test_unsupported_op_names_the_node(edge_program):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cos(torch.sin(x))

    ep = edge_program(M(), torch.randn(3))
    with pytest.raises(LoweringError, match=r"node 'cos'.*aten\.cos\.default"):
        preprocess(ep, [])


def test_float64_is_rejected(edge_program):
    ep = edge_program(
        Broadcast(), torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    )
    with pytest.raises(LoweringError, match="float64"):
        preprocess(ep, [])


def test_3d_permute_is_rejected(edge_program):
    class M(torch.nn.Module):
        def forward(self, x):
            return x.permute(2, 0, 1) + 1.0

    ep = edge_program(M(), torch.randn(2, 3, 4))
    with pytest.raises(LoweringError, match="2-D"):
        preprocess(ep, [])


def test_mutated_buffer_is_rejected(edge_program):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("acc", torch.zeros(3))

        def forward(self, x):
            self.acc.add_(x)
            return self.acc * 2.0

    ep = edge_program(M(), torch.randn(3))
    with pytest.raises(LoweringError, match="mutates state"):
        preprocess(ep, [])


def test_compile_specs(edge_program):
    ep = edge_program(MatMul(), torch.randn(3, 5), torch.randn(5, 2))
    with pytest.raises(LoweringError, match=r"unknown compile spec 'speed'.*max_value"):
        preprocess(ep, [CompileSpec("speed", b"fast")])
    with pytest.raises(LoweringError, match="one byte"):
        preprocess(ep, [CompileSpec("max_value", b"\x01\x02")])
    blob = preprocess(ep, [CompileSpec("max_value", bytes([4]))]).processed_bytes
    assert split_blob(blob)[2]["compile_specs"] == {"max_value": 4}
    ex = ExampleExecutor()
    ex.init(memoryview(blob), [CompileSpec("max_value", bytes([4]))])
    with pytest.raises(ProgramError, match="unknown compile spec"):
        ex.init(memoryview(blob), [CompileSpec("speed", b"fast")])


# --- bad blobs -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_blob():
    torch.manual_seed(0)
    module = MLP()
    ep = torch.export.export(module, (torch.randn(2, 6),)).run_decompositions()
    for node in ep.graph.nodes:
        if node.target is torch.ops.aten.permute.default:
            node.target = torch.ops.aten.permute_copy.default
    return preprocess(ep, []).processed_bytes


def rebuild(doc: dict, data: bytes, version: int = 1) -> bytes:
    raw = json.dumps(doc).encode()
    return (
        struct.pack("<4sII", b"EPEX", version, len(raw))
        + raw
        + bytes(fmt.data_start(len(raw)) - 12 - len(raw))
        + data
    )


def mutate(blob: bytes, change) -> bytes:
    _, _, doc, start = split_blob(blob)
    change(doc)
    return rebuild(doc, blob[start:])


def expect_program_error(blob, match):
    with pytest.raises(ProgramError, match=match):
        ExampleExecutor().init(memoryview(blob), [])


def test_good_blob_loads(good_blob):
    ExampleExecutor().init(memoryview(good_blob), [])
    _, _, doc, start = split_blob(good_blob)
    ExampleExecutor().init(memoryview(rebuild(doc, good_blob[start:])), [])  # the re-encoding helper is sound


@pytest.mark.parametrize("length", [0, 3, 11])
def test_truncated_header(good_blob, length):
    expect_program_error(good_blob[:length], "truncated")


def test_truncated_json(good_blob):
    expect_program_error(good_blob[:40], "truncated")


def test_truncated_data(good_blob):
    expect_program_error(good_blob[:-8], "outside")


def test_bad_magic(good_blob):
    expect_program_error(b"XXXX" + good_blob[4:], "bad magic")


def test_version_mismatch(good_blob):
    blob = good_blob[:4] + struct.pack("<I", 2) + good_blob[8:]
    expect_program_error(blob, "format version 2 is not supported")


def test_corrupt_json(good_blob):
    blob = bytearray(good_blob)
    blob[12] = ord("x")
    expect_program_error(bytes(blob), "JSON document is corrupt")
    blob = bytearray(good_blob)
    blob[20] = 0xFF
    expect_program_error(bytes(blob), "corrupt")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d.pop("nodes"), "no 'nodes'"),
        (lambda d: d.update(backend_id="Other"), "not 'ExampleBackend'"),
        (lambda d: d["nodes"][0].update(op="aten.cos.default"), "not an ExampleBackend op"),
        (lambda d: d["nodes"][1]["args"].__setitem__(1, {"value": "nope"}), "before it is defined"),
        (lambda d: d["nodes"][1]["args"].pop(), "expected a list of 5 args"),
        (lambda d: d["nodes"][1].update(output=d["nodes"][0]["output"]), "already defined"),
        (lambda d: d["outputs"].append("ghost"), "output 'ghost' is not defined"),
        (lambda d: d["constants"][0].update(offset=1 << 40), "outside"),
        (lambda d: d["constants"][0].update(offset=8), "not aligned"),
        (lambda d: d["constants"][0].update(nbytes=7), "does not match shape"),
        (lambda d: d["constants"][0].update(shape=[-1, 4]), "bad shape"),
        (lambda d: d["constants"][0].update(dtype="complex1024"), "unknown dtype"),
        (lambda d: d["input_specs"].clear(), "input_specs"),
        (lambda d: d.update(inputs="x"), "'inputs' must be a list"),
    ],
)
def test_malformed_document(good_blob, change, match):
    expect_program_error(mutate(good_blob, change), match)


def test_json_not_an_object(good_blob):
    expect_program_error(rebuild([1, 2], b""), "must be an object")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_blobs_fail_cleanly(good_blob, data):
    blob = bytearray(good_blob)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    ex = ExampleExecutor()
    try:
        handle = ex.init(memoryview(bytes(blob)), [])
    except ProgramError:
        return
    try:
        outs = ex.execute(handle, [np.ones((2, 6), np.float32)])
    except EdgeportError:
        return
    assert all(isinstance(o, np.ndarray) for o in outs)
