"""torchao ``quantize_`` schemes LLMs ship with (8da4w, 8da8w; weight-only embeddings) on XnnpackBackend.

Oracles: the torchao-quantized eager model (SQNR, top-1), the stock ExecuTorch 1.5.1 runtime (in a child process)
running edgeport's program and ExecuTorch's own lowering of the same exported model, and torch / torchao for the
weight encoding (bfloat16 rounding, int4 dequantization).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from torch import nn
from xnn_helpers import (
    blob_nodes,
    delegate_count,
    lower_edgeport,
    lower_executorch,
    needs_xnnpack,
    rel_err,
    run_edgeport,
    sqnr,
)

from edgeport_xnnpack import native
from edgeport_xnnpack._dynamic_quant import bf16_to_f32, dequantize_blockwise
from edgeport_xnnpack.preprocess.affine_quantized import bf16_round, pack_int4
from edgeport_xnnpack.schema.graph import FP32, QBINT4, QCINT8, QDINT8, PerChannelGroupQuant
from edgeport_xnnpack.schema.reader import read_blob

pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Int8DynamicActivationIntxWeightConfig,
    IntxWeightOnlyConfig,
    MappingType,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: E402

AGREE = 1e-5  # edgeport's runtime vs the stock runtime's qd8 kernels, relative to the output's scale


class Mlp(nn.Module):
    def __init__(self, vocab: int = 0) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 64) if vocab else None
        self.a, self.b, self.c = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.emb is not None:
            x = self.emb(x)
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _8da(weight_dtype: torch.dtype, granularity, **kw) -> Int8DynamicActivationIntxWeightConfig:
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=weight_dtype, weight_granularity=granularity, **kw)


def _stock(cases: list[tuple[str, bytes, list[np.ndarray]]]) -> list[np.ndarray]:
    from edgeport.testing.conformance.stock_checks import stock_runtime_missing
    from edgeport.testing.stock_runtime import run_cases

    if stock_runtime_missing():
        pytest.skip(stock_runtime_missing())
    results = run_cases([(name, pte, "forward", inputs) for name, pte, inputs in cases])
    for r in results:
        assert r.ok, r.describe()
    return [r.outputs[0] for r in results]


def _blob_values(edge) -> list:
    values = []
    for name, module in edge.exported_program().graph_module.named_children():
        if name.startswith("lowered_module"):
            graph, _ = read_blob(module.processed_bytes)
            values.extend(graph.values)
    return values


# -- the weight encoding ----------------------------------------------------------------------------------------
def test_bf16_rounding_matches_torch():
    x = torch.cat([torch.rand(4096) * 10.0 ** torch.randint(-8, 3, (4096,)), torch.tensor([1 + 2**-8, 1 + 3 * 2**-8])])
    ours = bf16_round(x.numpy())
    ref = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, ref)
    assert np.array_equal(bf16_to_f32(ours), x.to(torch.bfloat16).float().numpy())


def test_int4_packing_round_trips_through_the_executor_dequantization():
    from torchao.quantization.quant_primitives import dequantize_affine

    g = torch.Generator().manual_seed(0)
    w = torch.randint(-8, 8, (6, 64), generator=g, dtype=torch.int8)
    scales = torch.rand(6, 2, generator=g) + 0.01
    packed = pack_int4(w.numpy())
    assert packed.shape == (6, 32) and packed[0, 0] == ((int(w[0, 0]) + 8) | ((int(w[0, 1]) + 8) << 4))
    s16 = scales.to(torch.bfloat16).float()
    ours = dequantize_blockwise(packed, bf16_to_f32(bf16_round(scales.numpy())), (6, 64), 32)
    ref = dequantize_affine(w, [1, 32], s16, torch.zeros(6, 2, dtype=torch.int8), torch.int8, -8, 7)
    assert np.array_equal(ours, ref.numpy())  # exact: int4 x bfloat16 fits float32
    with pytest.raises(ValueError, match="scales"):
        dequantize_blockwise(packed, np.ones(3, np.float32), (6, 64), 32)


# -- lowering and both runtimes ---------------------------------------------------------------------------------
SCHEMES = {
    "8da4w-g32": (_8da(torch.int4, PerGroup(32)), QBINT4, 32.0),
    "8da4w-g64": (_8da(torch.int4, PerGroup(64)), QBINT4, 32.0),
    "8da4w-per-channel": (_8da(torch.int4, PerAxis(0)), QBINT4, 32.0),
    "8da8w-per-channel": (_8da(torch.int8, PerAxis(0)), QCINT8, 80.0),
}
WITH_EXECUTORCH = ("8da4w-g32", "8da8w-per-channel")  # also lowered by ExecuTorch (seconds each)
EMBEDDINGS = {"emb-int4-g32": (torch.int4, PerGroup(32)), "emb-int8-per-row": (torch.int8, PerAxis(0))}


@dataclass
class Case:
    model: nn.Module
    edge: object
    pte: bytes
    rejections: dict
    inputs: list[torch.Tensor]
    et_pte: bytes | None = None
    stock: list[np.ndarray] = field(default_factory=list)      # the stock runtime on edgeport's program
    stock_et: list[np.ndarray] = field(default_factory=list)   # ... on ExecuTorch's


def _mlp_case(scheme: str) -> Case:
    torch.manual_seed(0)
    m = Mlp().eval()
    quantize_(m, SCHEMES[scheme][0])
    edge, pte, partitioner = lower_edgeport(m, (torch.randn(3, 64),))
    xs = [torch.randn(3, 64, generator=torch.Generator().manual_seed(s)) * 2 for s in range(3)]
    et_pte = lower_executorch(m, (xs[0],)) if scheme in WITH_EXECUTORCH else None
    return Case(m, edge, pte, dict(partitioner.rejections), xs, et_pte)


def _embedding_case(name: str) -> Case:
    weight_dtype, granularity = EMBEDDINGS[name]
    torch.manual_seed(1)
    m = Mlp(vocab=50).eval()
    quantize_(m, IntxWeightOnlyConfig(weight_dtype=weight_dtype, granularity=granularity),
              lambda mod, fqn: isinstance(mod, nn.Embedding))
    quantize_(m, _8da(torch.int4, PerGroup(32)))
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    edge, pte, partitioner = lower_edgeport(m, (ids,))
    return Case(m, edge, pte, dict(partitioner.rejections), [ids])


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    """Every program of this module's stock-runtime checks, run by one child process (starting one costs
    seconds)."""
    if not native.is_available()[0]:
        pytest.skip(native.is_available()[1])
    pytest.importorskip("executorch")
    built = {name: _mlp_case(name) for name in SCHEMES}
    built.update({name: _embedding_case(name) for name in EMBEDDINGS})
    built["llama-8da4w-g32"] = _llama_case(_8da(torch.int4, PerGroup(32)))
    _run_stock(built)
    return built


def _run_stock(built: dict[str, Case]) -> None:
    runs = []
    for name, c in built.items():
        for i, x in enumerate(c.inputs):
            runs.append((f"{name}/{i}", c.pte, [x.numpy()]))
            if c.et_pte is not None:
                runs.append((f"{name}/{i}/executorch", c.et_pte, [x.numpy()]))
    out = iter(_stock(runs))
    for c in built.values():
        for _ in c.inputs:
            c.stock.append(next(out))
            if c.et_pte is not None:
                c.stock_et.append(next(out))


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_mlp_lowered_like_executorch_and_runs_on_both_runtimes(cases, scheme):
    c = cases[scheme]
    _, filter_type, min_sqnr = SCHEMES[scheme]
    assert delegate_count(c.edge) == 1 and not c.rejections
    kinds = blob_nodes(c.edge)
    assert kinds[("XNNConvert", QDINT8)] == 3 and kinds[("XNNFullyConnected", FP32)] == 3
    filters = [v for v in _blob_values(c.edge) if v.datatype == filter_type]
    assert [v.dims for v in filters] == [[128, 64], [128, 128], [32, 128]]
    if filter_type == QBINT4:
        for v in filters:
            assert isinstance(v.quant, PerChannelGroupQuant) and v.quant.scale_buffer_idx and not v.quant.scale
            g = v.dims[1] if scheme.endswith("channel") else int(scheme.rsplit("g", 1)[1])
            assert v.quant.group_size == g and v.quant.num_scales == v.dims[0] * v.dims[1] // g
    for i, x in enumerate(c.inputs):
        with torch.no_grad():
            ref = c.model(x).numpy()
        ours = run_edgeport(c.pte, (x,))
        assert sqnr(ref, ours) >= min_sqnr, f"edgeport runtime vs torchao eager: {sqnr(ref, ours):.1f} dB"
        assert rel_err(ours, c.stock[i]) <= AGREE, "edgeport's runtime differs from XNNPACK's qd8 kernels"
        if c.et_pte is not None:
            assert rel_err(c.stock[i], c.stock_et[i]) <= 1e-6, "the stock runtime gives edgeport's and " \
                                                               "ExecuTorch's programs different results"
            assert rel_err(run_edgeport(c.et_pte, (x,)), c.stock_et[i]) <= AGREE  # ExecuTorch's blob on edgeport


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.parametrize("name", list(EMBEDDINGS))
def test_weight_only_embedding_stays_on_portable_kernels(cases, name):
    c = cases[name]
    delegates = [n for n in c.edge.exported_program().graph.nodes if "call_delegate" in str(n.target)]
    assert len(delegates) == 1 and blob_nodes(c.edge)[("XNNFullyConnected", FP32)] == 3
    # its dequantize leads to no linear: decomposed before partitioning (not kept whole), it and the gather run as
    # portable kernels
    graph = c.edge.exported_program().graph
    assert "dequantize_affine" not in c.rejections
    assert any(n.target is torch.ops.aten.embedding.default or "embedding" in str(n.target) for n in graph.nodes
               if n.op == "call_function" and "call_delegate" not in str(n.target))
    with torch.no_grad():
        ref = c.model(*c.inputs).numpy()
    ours = run_edgeport(c.pte, tuple(c.inputs))
    assert sqnr(ref, ours) >= 32.0
    assert rel_err(c.stock[0], ours) <= AGREE


@pytest.mark.parametrize("config,reason", [
    (_8da(torch.int8, PerGroup(32)), "no blockwise int8 filter"),
    (_8da(torch.int4, PerGroup(32), weight_mapping_type=MappingType.ASYMMETRIC), "asymmetric weights"),
    (_8da(torch.int2, PerGroup(32)), "weight range [-2, 1]"),
    (IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)), "only Int8DynamicActivationIntx"),
])
def test_unsupported_schemes_are_left_out_with_the_reason(config, reason):
    torch.manual_seed(2)
    m = Mlp().eval()
    quantize_(m, config)
    import edgeport
    from edgeport_xnnpack import XnnpackPartitioner

    partitioner = XnnpackPartitioner()
    edge = edgeport.to_edge_transform_and_lower(torch.export.export(m, (torch.randn(3, 64),)),
                                                partitioner=[partitioner])
    assert not any(v.datatype in (QDINT8, QBINT4) for v in _blob_values(edge))
    for linear in ("linear", "linear_1", "linear_2"):
        assert reason in partitioner.rejections[linear], partitioner.rejections[linear]


@needs_xnnpack
def test_bad_block_scales_are_a_program_error():
    from edgeport.errors import ProgramError
    from edgeport.program import load_pte
    from edgeport_xnnpack.runtime import XnnpackExecutor
    from edgeport_xnnpack.schema.writer import serialize

    torch.manual_seed(3)
    m = Mlp().eval()
    quantize_(m, _8da(torch.int4, PerGroup(32)))
    edge, pte, _ = lower_edgeport(m, (torch.randn(1, 64),))
    blob = next(mod.processed_bytes for name, mod in edge.exported_program().graph_module.named_children()
                if name.startswith("lowered_module"))
    named = load_pte(pte).named_data
    executor = XnnpackExecutor(num_threads=1)
    executor.destroy(executor.init(memoryview(blob), [], named_data=named))  # the blob as written loads
    graph, _ = read_blob(blob)
    q = next(v.quant for v in graph.values if v.datatype == QBINT4)
    q.num_scales -= 1
    with pytest.raises(ProgramError, match="block scales"):
        executor.init(memoryview(serialize(graph, b"")), [], named_data=named)


# -- a tiny Llama -----------------------------------------------------------------------------------------------
class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).logits


def _tiny_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return _Logits(transformers.LlamaForCausalLM(cfg).eval()).eval()


def _llama_case(config) -> Case:
    m = _tiny_llama()
    quantize_(m, config)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(5))
    edge, pte, partitioner = lower_edgeport(m, (ids,))
    return Case(m, edge, pte, dict(partitioner.rejections), [ids])


def _check_llama(c: Case, min_sqnr: float) -> None:
    kinds = blob_nodes(c.edge)
    # q, k, v, o, gate, up, down, lm_head, and the means of the three RMSNorms (a constant 1/D filter)
    assert kinds[("XNNFullyConnected", FP32)] == 8 + 3
    assert kinds[("XNNConvert", QDINT8)] == 8
    with torch.no_grad():
        ref = c.model(*c.inputs).numpy()
    ours = run_edgeport(c.pte, tuple(c.inputs))
    assert sqnr(ref, ours) >= min_sqnr, f"{sqnr(ref, ours):.1f} dB"
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
    assert rel_err(c.stock[0], ours) <= AGREE


@needs_xnnpack
@pytest.mark.executorch
def test_tiny_llama_8da4w(cases):
    _check_llama(cases["llama-8da4w-g32"], 30.0)


@needs_xnnpack
@pytest.mark.executorch
@pytest.mark.slow
def test_tiny_llama_8da8w():
    c = _llama_case(_8da(torch.int8, PerAxis(0)))
    _run_stock({"llama-8da8w": c})
    _check_llama(c, 80.0)
