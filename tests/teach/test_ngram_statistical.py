"""Prompt lookup on the tiny GPT-2 fixtures: chi-square against the target's exact distribution,
with negative controls (issue 10, item 5). The method, bins and false-alarm rate are those of
test_distribution_statistical.py: a correct sampler fails with probability about ALPHA = 1e-3 per
test were the seed random (at most 1.7e-3 with the textbook pooling at 5 these tests use, see
chi_square.py; fixed here, so the suite is deterministic); a broken one must reach p < 1e-6.

The prompt [3, 765, 765, 7845, 3, 765] makes the n-gram drafter propose two tokens from its
first round ("3 765" occurred before, followed by "765 7845"): at temperature 0.03 the target
accepts the first often and rejects the second often, which is what the first-position-only bug
needs to show. As on GPT-2 with a draft model, the unnormalised residual's missing mass goes to
token 50256, pooled in an "other" bin with the mass it was taken from: invisible at this prompt
(the toy-model enumeration in test_drafters_policies.py covers the broken kernels exactly).
"""
import pytest

from gpt2np.decoding.drafters import NgramDrafter
from test_distribution_statistical import ALPHA, REJECT_BELOW, gpt2_chi_square, gpt2_pair  # noqa: F401

NGRAM_PROMPT, SAMPLES = [3, 765, 765, 7845, 3, 765], 150


def test_prompt_lookup_passes_chi_square_against_the_exact_target_on_tiny_gpt2(gpt2_pair):
    target, _ = gpt2_pair
    result = gpt2_chi_square(target, NgramDrafter(n_max=2), NGRAM_PROMPT, SAMPLES)
    assert result.df >= 2, "too few bins: the test would have no power"
    assert result.p_value >= ALPHA, f"chi-square {result.statistic:.1f}, df {result.df}"


@pytest.mark.parametrize("variant", ["first_position_only", "softmax_residual"])
def test_same_chi_square_rejects_broken_kernels_with_prompt_lookup(gpt2_pair, variant):
    target, _ = gpt2_pair
    result = gpt2_chi_square(target, NgramDrafter(n_max=2), NGRAM_PROMPT, SAMPLES, variant)
    assert result.p_value < REJECT_BELOW, f"{variant} passed: chi-square {result.statistic:.1f}"


def test_prompt_lookup_really_drafts_here(gpt2_pair):
    """Otherwise the tests above would test plain decoding."""
    import numpy as np
    from gpt2np.decoding.speculative import speculative_generate
    target, _ = gpt2_pair
    stats = speculative_generate(target, NgramDrafter(n_max=2), NGRAM_PROMPT, 3, 2, temperature=0.03,
                                 rng=np.random.default_rng(0)).stats
    assert stats.drafted >= 2
