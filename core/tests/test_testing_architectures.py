"""edgeport.testing.architectures: deterministic small transformers models, plain-tensor outputs, the dynamic
sequence spec, a clear error without transformers, and the scale-relative comparison."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from edgeport.testing import ARCHITECTURES, Architecture, assert_close_to_scale  # noqa: E402
from edgeport.testing.architectures import TEXT_ARCHITECTURES, eager_outputs, scale_error  # noqa: E402


def _weights(arch: Architecture) -> list[torch.Tensor]:
    return [p.detach().clone() for p in arch.model.parameters()]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_architecture_is_seeded_in_eval_mode_and_returns_one_tensor(name):
    before = torch.random.get_rng_state()
    a, b, c = ARCHITECTURES[name](seed=0), ARCHITECTURES[name](seed=0), ARCHITECTURES[name](seed=1)
    assert torch.equal(torch.random.get_rng_state(), before), "building must not move the caller's global RNG"
    assert isinstance(a, Architecture) and a.name == name and not a.model.training
    assert all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(c), strict=True))
    with torch.no_grad():
        out = a.model(*a.example_inputs)
    assert type(out) is torch.Tensor and torch.isfinite(out).all()
    np.testing.assert_array_equal(eager_outputs(b), out.numpy())


@pytest.mark.parametrize("name", TEXT_ARCHITECTURES)
def test_text_architectures_have_a_bounded_sequence_dim_and_lengths_up_to_it(name):
    arch = ARCHITECTURES[name]()
    seq = arch.dynamic_shapes["x"][1]
    assert isinstance(seq, torch.export.Dim) and seq.max == max(arch.seq_lengths)
    assert sum(n < seq.max for n in arch.seq_lengths) >= 3
    for n in arch.seq_lengths:
        (ids,) = arch.inputs_for(n)
        assert ids.shape == (1, n) and ids.dtype == torch.int64 and int(ids.max()) < arch.vocab


def test_vision_architectures_have_no_sequence_length():
    arch = ARCHITECTURES["resnet"]()
    assert arch.dynamic_shapes is None and arch.seq_lengths == ()
    with pytest.raises(ValueError, match="vision model"):
        arch.inputs_for(4)


def test_the_llama_entry_uses_grouped_query_attention():
    config = ARCHITECTURES["llama"]().model.inner.config
    assert config.num_key_value_heads < config.num_attention_heads and not config.use_cache


def test_an_unknown_size_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown size 'huge'; sizes: \['medium', 'small'\]"):
        ARCHITECTURES["bert"](size="huge")


def test_without_transformers_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    with pytest.raises(ImportError, match="pip install transformers"):
        ARCHITECTURES["bert"]()


def test_the_comparison_is_relative_to_the_output_scale():
    want = np.array([1000.0, -2.0, 0.5])
    assert scale_error(want + 0.05, want) == pytest.approx(0.05 / 1000)
    assert_close_to_scale(want + 0.05, want, "large outputs")  # 5e-5 of the scale
    small = np.array([0.01, -0.02])
    assert scale_error(small + 2e-4, small) == pytest.approx(2e-4)  # max(1, |want|): absolute below 1
    with pytest.raises(AssertionError, match=r"small outputs: error 2.00e-04 .* exceeds 0.0001"):
        assert_close_to_scale(small + 2e-4, small, "small outputs")
    with pytest.raises(AssertionError, match=r"shape \[2\], expected \[3\]"):
        scale_error(small, want)
