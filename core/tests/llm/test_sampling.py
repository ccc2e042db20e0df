"""The runner's sampler against its definition: argmax at temperature 0, softmax(logits / T) frequencies, top-p
keeping the smallest set reaching p, and a seed that fixes the draws."""

from __future__ import annotations

import numpy as np
import pytest

from edgeport.llm import Sampler, SamplingConfig

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03]))


def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    for _ in range(20):
        row = rng.standard_normal(50).astype(np.float32)
        assert Sampler()(row) == int(np.argmax(row))


def test_temperature_frequencies_follow_softmax():
    sampler = Sampler(SamplingConfig(temperature=2.0, seed=1))
    draws = np.bincount([sampler(LOGITS) for _ in range(20000)], minlength=5) / 20000
    scaled = np.exp(LOGITS / 2.0)
    np.testing.assert_allclose(draws, scaled / scaled.sum(), atol=0.015)


def test_top_p_keeps_the_smallest_set_reaching_p():
    sampler = Sampler(SamplingConfig(temperature=1.0, top_p=0.7, seed=2))
    draws = np.bincount([sampler(LOGITS) for _ in range(6000)], minlength=5) / 6000
    assert draws[2:].sum() == 0  # 0.5 + 0.25 >= 0.7: only the first two
    np.testing.assert_allclose(draws[:2], [0.5 / 0.75, 0.25 / 0.75], atol=0.03)


def test_seed_fixes_the_draws():
    a = [Sampler(SamplingConfig(temperature=1.0, seed=7))(LOGITS) for _ in range(1)]
    s1, s2 = Sampler(SamplingConfig(temperature=1.0, seed=7)), Sampler(SamplingConfig(temperature=1.0, seed=7))
    assert [s1(LOGITS) for _ in range(50)] == [s2(LOGITS) for _ in range(50)]
    assert a[0] in range(5)


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}])
def test_bad_config(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_non_finite_logits_are_an_error():
    with pytest.raises(ValueError, match="non-finite"):
        Sampler()(np.array([0.0, np.nan]))
