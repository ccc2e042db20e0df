"""GatheredQuantizedEmbedding: the rows torchao's quantized embedding returns, bit for bit (the oracle is torchao's
own module, which dequantizes the whole table), and a clear error for a table it cannot describe."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from edgeport.llm.embedding import GatheredQuantizedEmbedding, gather_quantized_embeddings  # noqa: E402


def _quantized(bits: int, group: int, vocab: int = 50, dim: int = 64) -> torch.nn.Module:
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig

    torch.manual_seed(bits + group)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, dim))
    granularity = PerGroup(group) if group else PerAxis(0)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4 if bits == 4 else torch.int8,
                                          granularity=granularity),
              filter_fn=lambda m, _fqn: isinstance(m, torch.nn.Embedding))
    return model


@pytest.mark.parametrize("bits,group", [(4, 32), (4, 16), (8, 0), (8, 32)])
def test_rows_are_bit_identical_to_torchao(bits, group):
    reference = _quantized(bits, group)
    model = copy.deepcopy(reference)
    assert gather_quantized_embeddings(model) == 1
    assert isinstance(model[0], GatheredQuantizedEmbedding)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))
    # the table stays quantized: no buffer holds it in float
    assert model[0].qdata.dtype == torch.int8
    assert all(b.numel() < 50 * 64 for b in model[0].buffers() if b.is_floating_point())


def test_float_embeddings_are_left_alone():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8))
    assert gather_quantized_embeddings(model) == 0 and isinstance(model[0], torch.nn.Embedding)


def test_a_table_whose_scales_do_not_fit_is_refused():
    with pytest.raises(ValueError, match="expected scales of shape"):
        GatheredQuantizedEmbedding(torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 3), None, 4, torch.float32)
