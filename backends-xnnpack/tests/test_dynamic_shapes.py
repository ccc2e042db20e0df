"""Bounded dynamic sequence lengths on XNNPACK: every path at several lengths below the bound and at it.

Models exported with ``torch.export.Dim("seq", max=N)``: small single-op models (linear, attention-like matmul +
softmax, layer norm, reshape / permute of [1, seq, heads, dim], slice + concatenate, a transpose of a tensor with
two dynamic dims) and a BERT and a GPT-2 from small ``transformers`` configs. Paths, each compared with eager
PyTorch (error <= 1e-4 of the output's scale):

* edgeport + XnnpackPartitioner on edgeport's runtime (the executor specializes per input shape) and on the
  stock ExecuTorch runtime (child processes, one batch; its XNNPACK reshapes the runtime per call);
* ExecuTorch 1.5.1's own dynamic XNNPACK programs on edgeport's runtime.

Also: what the blobs declare (upper bounds, ExecuTorch's encoding of dynamic dims), out-of-bound inputs and shapes
no node can follow give clear errors, and the specialization cache evicts without changing results.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import needs_xnnpack

from edgeport import to_edge_transform_and_lower
from edgeport.errors import RuntimeExecutionError
from edgeport.program import load_pte
from edgeport.runtime import Runtime
from edgeport.testing.architectures import assert_close_to_scale
from edgeport.testing.conformance.stock_checks import stock_runtime_missing
from edgeport.testing.stock_runtime import run_cases
from edgeport_xnnpack import XnnpackPartitioner
from edgeport_xnnpack.runtime import XnnpackExecutor
from edgeport_xnnpack.schema.reader import read_blob

pytestmark = [needs_xnnpack, pytest.mark.executorch]
if stock_runtime_missing():
    pytest.skip(stock_runtime_missing(), allow_module_level=True)

BOUND = 16
LENGTHS = (2, 3, 9, BOUND)


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Attention(nn.Module):
    """softmax(q k^T / sqrt(d)) v on [1, seq, 32]: the scores have two dynamic dims."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 32 ** 0.5
        return torch.softmax(scores, -1) @ self.v(x)


class LayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class Heads(nn.Module):
    """[1, seq, 32] -> [1, seq, 4, 8] -> [1, 4, seq, 8] and back: reshapes that infer the dynamic dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = x.view(b, s, 4, 8).permute(0, 2, 1, 3) * 2.0
        return h.permute(0, 2, 1, 3).reshape(b, s, 32) + 1.0


class SliceCat(nn.Module):
    """Slices of the static feature dim of [1, seq, 48] (the dynamic dim kept whole) and a concatenation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([x[:, :, :16] * 2.0, x[:, :, 16:] - 1.0], dim=-1)
        return y[:, :, 8:40] + x[:, :, 16:]


class ScoresTranspose(nn.Module):
    """Transposes of a [1, seq, seq] tensor: view folding would need a reshape with two dynamic dims, so the
    partition is lowered op by op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(1, 2)
        return torch.softmax(scores.permute(0, 2, 1) * 0.1, -1).permute(0, 2, 1)


SMALL = {"linear": (Linear, 32), "attention": (Attention, 32), "layer_norm": (LayerNorm, 32), "heads": (Heads, 32),
         "slice_cat": (SliceCat, 48), "scores_transpose": (ScoresTranspose, 32)}
ARCHS = ("bert", "gpt2")
NAMES = (*SMALL, *ARCHS)


@functools.cache
def _case(name: str) -> tuple[nn.Module, torch.export.ExportedProgram, dict[int, tuple[torch.Tensor, ...]]]:
    """(model, exported program with a dynamic seq dim, inputs per length)."""
    if name in SMALL:
        cls, width = SMALL[name]
        torch.manual_seed(0)
        model = cls().eval()
        seq = torch.export.Dim("seq", min=2, max=BOUND)
        ep = torch.export.export(model, (torch.randn(1, 8, width),), dynamic_shapes={"x": {1: seq}})
        gen = torch.Generator().manual_seed(1)
        return model, ep, {n: (torch.randn(1, n, width, generator=gen),) for n in LENGTHS}
    pytest.importorskip("transformers")
    from edgeport.testing.architectures import ARCHITECTURES

    arch = ARCHITECTURES[name](seed=0)
    ep = torch.export.export(arch.model, arch.example_inputs, dynamic_shapes=arch.dynamic_shapes)
    return arch.model, ep, {n: arch.inputs_for(n) for n in arch.seq_lengths}


def _eager(name: str, n: int) -> np.ndarray:
    model, _, inputs = _case(name)
    with torch.no_grad():
        return model(*inputs[n]).numpy()


@functools.cache
def _edgeport(name: str) -> tuple[bytes, XnnpackPartitioner]:
    partitioner = XnnpackPartitioner()
    pte = to_edge_transform_and_lower(_case(name)[1], partitioner=[partitioner]).to_executorch().buffer
    return pte, partitioner


@functools.cache
def _executorch(name: str) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtPartitioner
    from executorch.exir import to_edge_transform_and_lower as et_lower

    return et_lower(_case(name)[1], partitioner=[EtPartitioner()]).to_executorch().buffer


def _run_ours(pte: bytes, name: str) -> dict[int, np.ndarray]:
    method = Runtime.get().load_program(pte).load_method("forward")
    return {n: method.execute([t.numpy() for t in inputs])[0] for n, inputs in _case(name)[2].items()}


@functools.cache
def _stock() -> dict[str, object]:
    """Every edgeport program of this module at every length on the stock runtime, one batch."""
    cases = [(f"{name}-seq{n}", _edgeport(name)[0], "forward", [t.numpy() for t in inputs])
             for name in NAMES for n, inputs in _case(name)[2].items()]
    return {r.name: r for r in run_cases(cases)}


def _blobs(pte: bytes) -> list:
    lp = load_pte(pte)
    plan = lp.program.execution_plan[0]
    return [read_blob(lp.delegate_data(0, i))[0] for i in range(len(plan.delegates))]


# -- what edgeport's partitioner and preprocess produce -------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_dynamic_nodes_are_delegated(name):
    pte, partitioner = _edgeport(name)
    blobs = _blobs(pte)
    assert blobs, partitioner.rejections
    if name in SMALL and name != "scores_transpose":  # everything but the symbolic sizes themselves
        assert all("sym_size" in node for node in partitioner.rejections), partitioner.rejections
    kinds = {n.kind for g in blobs for n in g.nodes}
    assert "XNNFullyConnected" in kinds or name in ("heads", "slice_cat", "scores_transpose")
    if name in ARCHS:  # the linears, layer norms and attention matmuls of every layer run in XNNPACK
        plan = load_pte(pte).program.execution_plan[0]
        names = {op.name for op in plan.operators}
        assert not names & {"aten::addmm", "aten::linear", "aten::native_layer_norm", "aten::bmm"}, names


def test_blob_declares_upper_bounds_and_executorch_encoding():
    """The heads model: values at the bound, each reshape infers the one dynamic dim (0 in new_shape), and the
    symbolic size the view reads is a delegate argument without a value (an unused external id); the scalars 2.0
    and 1.0 are arguments too, backed by program constants (see edgeport_xnnpack.preprocess.constant_inputs)."""
    (graph,) = _blobs(_edgeport("heads")[0])
    externals = sorted((v.external_id, v.flags, v.dims) for v in graph.values if v.flags)
    assert externals == [(0, 1, [1, BOUND, 32]), (2, 1, [1]), (3, 1, [1]), (4, 2, [1, BOUND, 32])]
    assert graph.num_externs == 5
    reshapes = [n for n in graph.nodes if n.kind == "XNNStaticReshape"]
    assert reshapes and all(list(n.get("new_shape")).count(0) == 1 for n in reshapes)
    dims = {v.id_out: v.dims for v in graph.values}
    for n in reshapes:
        out = dims[n.get("output_id")]
        assert [d if s == 0 else s for s, d in zip(n.get("new_shape"), out)] == out


def test_slice_keeps_the_dynamic_dim_whole():
    (graph,) = _blobs(_edgeport("slice_cat")[0])
    slices = [n for n in graph.nodes if n.kind == "XNNStaticSlice"]
    assert slices
    for n in slices:
        dims = {v.id_out: v.dims for v in graph.values}[n.get("input_id")]
        seq = dims.index(BOUND)
        assert n.get("sizes")[seq] == 0 and n.get("offsets")[seq] == 0


# -- numerics on both runtimes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_edgeport_program_on_edgeport_runtime(name):
    for n, got in _run_ours(_edgeport(name)[0], name).items():
        assert_close_to_scale(got, _eager(name, n), f"{name}, sequence {n}, edgeport's runtime")


@pytest.mark.parametrize("name", NAMES)
def test_edgeport_program_on_stock_runtime(name):
    for n in _case(name)[2]:
        result = _stock()[f"{name}-seq{n}"]
        assert result.crash is None, f"{result.describe()}\n{result.log}"
        assert result.outputs is not None, result.describe()
        assert_close_to_scale(result.outputs[0], _eager(name, n), f"{name}, sequence {n}, stock runtime")


@pytest.mark.parametrize("name", [*SMALL, *(pytest.param(a, marks=pytest.mark.slow) for a in ARCHS)])
def test_executorch_program_on_edgeport_runtime(name):
    for n, got in _run_ours(_executorch(name), name).items():
        assert_close_to_scale(got, _eager(name, n), f"ExecuTorch's {name} program, sequence {n}, edgeport's runtime")


class Refused(nn.Module):
    """One node of each kind the partitioner refuses with dynamic dims, next to delegated ones."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scores = (x @ x.transpose(1, 2)).unsqueeze(1)   # a reshape to [1, 1, s, s]: two dynamic dims
        return scores * 1.5, y * x.shape[1] + 1.0, x[:, 1:, :] * 2.0, torch.relu(self.conv(img))


def test_partitioner_refuses_what_no_blob_can_express_and_the_rest_runs():
    torch.manual_seed(0)
    model = Refused().eval()
    seq, h = torch.export.Dim("seq", min=3, max=BOUND), torch.export.Dim("h", min=4, max=BOUND)
    args = (torch.randn(1, 8, 32), torch.randn(4, 32), torch.randn(1, 3, 8, 8))
    ep = torch.export.export(model, args, dynamic_shapes={"x": {1: seq}, "y": None, "img": {2: h}})
    partitioner = XnnpackPartitioner()
    pte = to_edge_transform_and_lower(ep, partitioner=[partitioner]).to_executorch().buffer
    why = dict(r.split(": ", 1) for node, r in partitioner.rejections.items() if "sym_size" not in node)
    mul = next((op for op in why if op.startswith("aten.mul.")), "aten.mul")  # .Tensor, or .Scalar of the size
    assert set(why) == {"aten.unsqueeze_copy.default", mul, "aten.slice_copy.Tensor",
                        "aten.convolution.default"}, partitioner.rejections
    assert "more than one dynamic dim" in why["aten.unsqueeze_copy.default"]
    assert "symbolic argument" in why[mul]
    assert "slice along the dynamic dim 1" in why["aten.slice_copy.Tensor"]
    assert "over dynamic dims" in why["aten.convolution.default"]
    method = Runtime.get().load_program(pte).load_method("forward")
    gen = torch.Generator().manual_seed(2)
    for n, height in ((3, 5), (BOUND, BOUND)):
        inputs = (torch.randn(1, n, 32, generator=gen), torch.randn(4, 32, generator=gen),
                  torch.randn(1, 3, height, 8, generator=gen))
        with torch.no_grad():
            want = model(*inputs)
        for k, (got, ref) in enumerate(zip(method.execute([t.numpy() for t in inputs]), want)):
            assert_close_to_scale(got, ref.numpy(), f"output {k} at sequence {n}, height {height}")


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.c3 = nn.Conv2d(8, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        y = nn.functional.pad(y, (1, 1, 1, 1))
        return nn.functional.avg_pool2d(torch.relu(self.c3(self.c2(y))), 2)


def test_executorch_cnn_with_dynamic_height_and_width_on_edgeport_runtime():
    """ExecuTorch delegates convolutions and poolings over dynamic H and W (edgeport's partitioner does not):
    the executor's shape functions for convolution, depthwise convolution, max / average pooling, pad and the
    NCHW <-> NHWC transposes follow odd sizes too."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtPartitioner
    from executorch.exir import to_edge_transform_and_lower as et_lower

    torch.manual_seed(0)
    model = SmallCnn().eval()
    h, w = torch.export.Dim("h", min=16, max=40), torch.export.Dim("w", min=16, max=40)
    ep = torch.export.export(model, (torch.randn(1, 3, 32, 32),), dynamic_shapes={"x": {2: h, 3: w}})
    pte = et_lower(ep, partitioner=[EtPartitioner()]).to_executorch().buffer
    kinds = {n.kind for g in _blobs(pte) for n in g.nodes}
    assert {"XNNConv2d", "XNNDepthwiseConv2d", "XNNMaxPooling2d", "XNNAvgPooling2d"} <= kinds, kinds
    method = Runtime.get().load_program(pte).load_method("forward")
    gen = torch.Generator().manual_seed(4)
    for height, width in ((16, 16), (17, 23), (33, 40), (40, 40)):
        x = torch.randn(1, 3, height, width, generator=gen)
        with torch.no_grad():
            want = model(x).numpy()
        assert_close_to_scale(method.execute([x.numpy()])[0], want, f"ExecuTorch's CNN at {height}x{width}")


@pytest.mark.slow
def test_executorch_int8_linears_with_dynamic_rows_match_the_stock_runtime():
    """ExecuTorch's static int8 fully connected (qint8 x qcint8), which the executor rewrites into a 1x1
    convolution between two reshapes, follows a dynamic sequence length (the reshapes mark the rows with 0)."""
    pytest.importorskip("torchao")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as EtPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower as et_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8)).eval()
    args, dims = (torch.randn(1, 8, 16),), {"input": {1: torch.export.Dim("seq", min=2, max=BOUND)}}
    prepared = prepare_pt2e(torch.export.export(model, args, dynamic_shapes=dims).module(),
                            XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)))
    prepared(*args)
    ep = torch.export.export(convert_pt2e(prepared), args, dynamic_shapes=dims)
    pte = et_lower(ep, partitioner=[EtPartitioner()]).to_executorch().buffer
    (graph,) = _blobs(pte)
    scale = {v.id_out: v.quant for v in graph.values}[graph.nodes[-1].inputs()[0]].scale  # the int8 output's
    method = Runtime.get().load_program(pte).load_method("forward")
    gen = torch.Generator().manual_seed(5)
    xs = {n: torch.randn(1, n, 16, generator=gen).numpy() for n in LENGTHS}
    stock = run_cases([(f"int8-seq{n}", pte, "forward", [x]) for n, x in xs.items()])
    for (n, x), result in zip(xs.items(), stock):
        assert result.outputs is not None, f"{result.describe()}\n{result.log}"
        got = method.execute([x])[0]
        assert got.shape == (1, n, 8)
        assert np.abs(got - result.outputs[0]).max() <= scale * 1.001, f"sequence {n}"


# -- errors and the specialization cache ----------------------------------------------------------------------------

def _single_delegate(name: str, executor: XnnpackExecutor):
    lp = load_pte(_edgeport(name)[0])
    assert len(lp.program.execution_plan[0].delegates) == 1
    return executor.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)


def test_out_of_bound_input_is_a_clear_error():
    method = Runtime.get().load_program(_edgeport("linear")[0]).load_method("forward")
    with pytest.raises(RuntimeExecutionError, match=r"input 0: shape \[1, 17, 32\] exceeds the upper bound"):
        method.execute([np.zeros((1, BOUND + 1, 32), np.float32)])
    ex = XnnpackExecutor(num_threads=1)
    handle = _single_delegate("linear", ex)
    try:
        for shape in [(1, BOUND + 1, 32), (1, 4, 33), (4, 32), (1, 0, 32)]:
            with pytest.raises(RuntimeExecutionError, match=r"input 0 must be float32 of shape \[1, 16, 32\], or "
                               r"smaller in a dynamic dim .* got float32 " + str(list(shape)).replace("[", r"\[")):
                ex.execute(handle, [np.zeros(shape, np.float32)])
    finally:
        ex.destroy(handle)


def test_shape_no_node_can_follow_is_a_clear_error():
    """A static program's delegate at another size: its reshape marks no dynamic dim, so the executor names it."""
    pte = to_edge_transform_and_lower(torch.export.export(Heads(), (torch.randn(1, 8, 32),)),
                                      partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    lp = load_pte(pte)
    ex = XnnpackExecutor(num_threads=1)
    handle = ex.init(lp.delegate_data(0, 0), [], named_data=lp.named_data)
    scalars = [np.array([2.0], np.float32), np.array([1.0], np.float32)]  # the program's constant arguments
    try:
        with pytest.raises(RuntimeExecutionError, match=r"cannot run input shapes \[\[1, 5, 32\], \[1\], \[1\]\]: "
                           r"xnodes\[\d+\] \(XNNStaticReshape\): static reshape .* marks no dim as dynamic"):
            ex.execute(handle, [np.zeros((1, 5, 32), np.float32), *scalars])
        x = np.random.default_rng(0).standard_normal((1, 8, 32)).astype(np.float32)
        (got,) = ex.execute(handle, [x, *scalars])  # the declared shape still runs
        np.testing.assert_allclose(got, x * 2.0 + 1.0, rtol=1e-6)
    finally:
        ex.destroy(handle)


def test_specialization_off_is_a_clear_error():
    ex = XnnpackExecutor(num_threads=1, max_specializations=0)
    handle = _single_delegate("linear", ex)
    try:
        with pytest.raises(RuntimeExecutionError, match="specialization is off"):
            ex.execute(handle, [np.zeros((1, 3, 32), np.float32)])
        (got,) = ex.execute(handle, [_case("linear")[2][BOUND][0].numpy()])
        assert_close_to_scale(got, _eager("linear", BOUND), "linear at the bound, no specialization")
    finally:
        ex.destroy(handle)


def test_cache_evicts_and_results_stay_right():
    model = _case("linear")[0]
    ex = XnnpackExecutor(num_threads=1, max_specializations=2)
    handle = _single_delegate("linear", ex)
    gen = torch.Generator().manual_seed(3)
    try:
        order = [2, 3, 4, 5, 2, 3, 7, 7, BOUND, 2]
        for n in order:
            x = torch.randn(1, n, 32, generator=gen)
            (got,) = ex.execute(handle, [x.numpy()])
            with torch.no_grad():
                assert_close_to_scale(got, model(x).numpy(), f"linear, sequence {n}, cache of 2")
            assert len(handle.specializer.cache) <= 2
        # 2, 3, 4, 5 made; 2 and 3 evicted by then and made again; 7 once; the bound is the declared plan; 2 again
        assert handle.specializer.built == 8
        assert [k[0][1] for k in handle.specializer.cache] == [7, 2]
    finally:
        ex.destroy(handle)
    assert not handle.specializer.cache


def test_cache_of_two_on_a_model_with_many_delegates(monkeypatch):
    """EDGEPORT_XNNPACK_SPECIALIZATIONS=2 on BERT (several delegates) at 4 lengths, twice over."""
    monkeypatch.setenv("EDGEPORT_XNNPACK_SPECIALIZATIONS", "2")
    name = "bert"
    method = Runtime.get().load_program(_edgeport(name)[0]).load_method("forward")
    for _ in range(2):
        for n, inputs in _case(name)[2].items():
            got = method.execute([t.numpy() for t in inputs])[0]
            assert_close_to_scale(got, _eager(name, n), f"{name}, sequence {n}, cache of 2")


def test_bad_specialization_count_is_refused(monkeypatch):
    monkeypatch.setenv("EDGEPORT_XNNPACK_SPECIALIZATIONS", "many")
    with pytest.raises(RuntimeExecutionError, match="EDGEPORT_XNNPACK_SPECIALIZATIONS='many' is not an integer"):
        _single_delegate("linear", XnnpackExecutor(num_threads=1))
    with pytest.raises(RuntimeExecutionError, match="must be an int in 0..4096"):
        _single_delegate("linear", XnnpackExecutor(num_threads=1, max_specializations=-1))


# -- shape inference per node kind, against numpy's shapes ----------------------------------------------------------

def _infer(kind: str, inputs: list[tuple[int, ...]], declared_out: tuple[int, ...], **fields):
    from edgeport_xnnpack._infer import infer_dims
    from edgeport_xnnpack.schema.graph import XNode

    names = {"XNNBatchMatrixMultiply": ["input1_id", "input2_id"], "XNNAdd": ["input1_id", "input2_id"]}.get(
        kind, [f"input{k + 1}_id" for k in range(len(inputs))] if kind.startswith("XNNConcatenate") else ["input_id"])
    node = XNode(kind, {**dict(zip(names, range(len(inputs)))), "output_id": 9, "flags": 0, **fields})
    declared = {9: declared_out, **{k: s for k, s in enumerate(inputs)}}
    return infer_dims([node], declared, dict(enumerate(inputs)))[9]


@pytest.mark.parametrize("a, b", [((2, 5, 3), (2, 3, 7)), ((1, 4, 5, 8), (4, 8, 6)), ((4, 1, 5, 8), (3, 8, 2))])
def test_infer_batch_matrix_multiply(a, b):
    assert _infer("XNNBatchMatrixMultiply", [a, b], (1,)) == np.matmul(np.zeros(a), np.zeros(b)).shape


def test_infer_broadcast_concatenate_pad_transpose_slice():
    assert _infer("XNNAdd", [(1, 4, 5, 5), (1, 1, 5, 5)], (1,)) == (1, 4, 5, 5)
    assert _infer("XNNConcatenate3", [(1, 3, 8), (1, 3, 2), (1, 3, 1)], (1,), axis=2) == (1, 3, 11)
    assert _infer("XNNStaticConstantPad", [(1, 3, 8)], (1,), pre_paddings=[0, 1, 2], post_paddings=[0, 3, 0]) == \
        np.pad(np.zeros((1, 3, 8)), [(0, 0), (1, 3), (2, 0)]).shape
    assert _infer("XNNStaticTranspose", [(1, 3, 8, 5)], (1,), perm=[0, 2, 3, 1]) == (1, 8, 5, 3)
    assert _infer("XNNStaticSlice", [(1, 7, 48)], (1,), offsets=[0, 0, 16], sizes=[1, 0, 32]) == (1, 7, 32)
    assert _infer("XNNStaticReshape", [(1, 7, 32)], (16, 4, 8), new_shape=[0, 4, 8]) == (7, 4, 8)


def test_infer_refuses_what_cannot_follow():
    from edgeport_xnnpack._infer import ShapeError

    with pytest.raises(ShapeError, match="marks 2 dims to infer"):
        _infer("XNNStaticReshape", [(1, 7, 32)], (1, 16, 32), new_shape=[1, 0, 0])
    with pytest.raises(ShapeError, match="marks no dim as dynamic"):
        _infer("XNNStaticReshape", [(1, 7, 32)], (16, 4, 8), new_shape=[16, 4, 8])
    with pytest.raises(ShapeError, match="do not broadcast"):
        _infer("XNNAdd", [(1, 7, 32), (1, 16, 32)], (1,))
    with pytest.raises(ShapeError, match="no shape rule for XNNArgMaxPooling2d"):
        _infer("XNNArgMaxPooling2d", [(1, 4, 4, 2)], (1,))
