"""Statistical, end to end: speculative_generate's samples pass a chi-square test against the
target's exact distribution, and the SAME test rejects every broken sampler (issue 3, item 4c).

How to read these tests. One test = run the real speculative_generate n times with a seeded rng,
count the outcomes (the first N tokens), and compare the counts with n times the target's EXACT
probabilities by Pearson's chi-square test (gpt2np/teach/chi_square.py: outcomes with expected count < 5
pooled, p-value from the chi-square tail). The exact probabilities never come from the sampler:
  * toy models: every random path of the target-only `generate` is enumerated (exact.py);
  * tiny GPT-2 fixtures: a tree of the target's own next-token distributions, expanded wherever a
    prefix is likely enough to be counted, the rest pooled (`exact_prefix_bins` below).

False-alarm rate. A correct sampler passes when p >= ALPHA = 1e-3. Were the seeds random, a
correct sampler would fail each such test with probability 0.001 (the test's false-alarm rate,
by the definition of a p-value); with the fixed seeds used here every run is identical, so the
suite is deterministic: a failure means the code changed, not bad luck. If you change a seed, a
failure has probability 0.001 per test of being a false alarm: rerun with another seed, and
suspect the code if it fails again.

Negative controls. The very same function must reject each broken sampler (broken_kernels.py and
gpt2np.teach.classroom): a kernel whose residual is softmaxed, one whose residual is not normalised, a
draft that samples greedily but accepts with softmax probabilities, and a kernel that ignores
rejections after the first position. The settings are chosen where each bug has a large effect
(on the toy models the exact distributions differ by a chi-square distance of at least 1.4 per
sample, see test_negative_control_settings_give_every_bug_a_large_effect; for GPT-2 see the
comments there), so we demand p < 1e-6: a broken sampler passing would need more than a
million-to-one accident.

The first block checks the instrument itself, chi_square.py, against scipy (a development dependency).
"""
import contextlib
import math
from collections import Counter
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import scipy.special
import scipy.stats

from gpt2np.teach.classroom import NEGATIVE_CONTROLS, PROMPT, exact_target_distribution, recovery_experiment, toy_pair
from gpt2np.model.config import GPT2Config
from gpt2np.teach.exact import exact_distribution
from gpt2np.model.forward import GPT2
from gpt2np.decoding.sampling import sampling_distribution
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.teach.chi_square import chi_square_sf, chi_square_test, pool_small_bins, regularized_gamma_q
from gpt2np.teach.toy_models import random_toy_model
from gpt2np.checkpoints.weights import load_params

ALPHA = 1e-3         # false-alarm rate of each positive test (see the module docstring)
REJECT_BELOW = 1e-6  # what a negative control must reach


# --- the instrument: chi_square.py against scipy -------------------------------------------------

@pytest.mark.parametrize("df", [1, 2, 3, 7, 26, 100, 1000, 20000])
def test_chi_square_sf_matches_scipy_from_the_bulk_to_the_far_tail(df):
    for tail in [1 - 1e-9, 0.99, 0.5, 0.05, 1e-3, 1e-6, 1e-20, 1e-100, 1e-300]:
        x = scipy.stats.chi2.isf(tail, df)
        assert chi_square_sf(x, df) == pytest.approx(scipy.stats.chi2.sf(x, df), rel=1e-9)


@hypothesis.settings(deadline=None, max_examples=300)
@hypothesis.given(st.floats(0.05, 500), st.floats(0, 3000))
def test_regularized_gamma_q_matches_scipy_gammaincc(a, x):
    expected = scipy.special.gammaincc(a, x)
    assert regularized_gamma_q(a, x) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_chi_square_sf_edges():
    assert chi_square_sf(0.0, 3) == 1.0 and chi_square_sf(math.inf, 3) == 0.0
    assert chi_square_sf(1e6, 3) == 0.0  # below the smallest float: a clean 0, not an error
    with pytest.raises(ValueError, match="df >= 1"):
        chi_square_sf(1.0, 0)


@hypothesis.settings(deadline=None, max_examples=100)
@hypothesis.given(st.integers(2, 30), st.integers(1, 3000), st.integers(0, 2**32 - 1))
def test_chi_square_test_matches_scipy_chisquare_on_the_pooled_bins(n_outcomes, n, seed):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(n_outcomes, 0.5))
    counts = rng.multinomial(n, probs)
    result = chi_square_test(dict(enumerate(counts)), dict(enumerate(probs)))
    observed = [o for _, o, _ in result.bins]
    expected = [e for _, _, e in result.bins]
    assert sum(observed) == n and sum(expected) == pytest.approx(n)
    assert min(expected) >= 5 or len(result.bins) == 1  # the pooling rule's promise
    if result.df >= 1:
        reference = scipy.stats.chisquare(observed, expected)
        assert result.statistic == pytest.approx(reference.statistic, rel=1e-9, abs=1e-12)
        assert result.p_value == pytest.approx(reference.pvalue, rel=1e-8, abs=1e-300)


def test_pooling_rule_depends_on_expected_counts_only():
    assert pool_small_bins([10.0, 3.0, 1.0, 6.0, 0.0]) == [[0], [3, 1, 2]]   # "other" (4) joins the 6
    assert pool_small_bins([10.0, 3.0, 2.0, 6.0]) == [[0], [3], [1, 2]]      # "other" (5) stands alone
    assert pool_small_bins([1.0, 2.0]) == [[0, 1]]                           # everything small: one bin
    result = chi_square_test({"a": 3, "b": 0}, {"a": 0.5, "b": 0.5})          # n = 3: one pooled bin
    assert (result.df, result.p_value) == (0, 1.0)


def test_an_impossible_outcome_rejects_outright():
    result = chi_square_test({"a": 999, "b": 1}, {"a": 1.0, "b": 0.0})
    assert (result.statistic, result.p_value, result.impossible) == (math.inf, 0.0, 1)


def test_false_alarm_rate_of_the_pooled_test_is_close_to_nominal():
    """Draw 4000 honest multinomial samples from a distribution with a long tail of small
    probabilities (so pooling happens) and count p < 0.05: should be about 5%."""
    rng = np.random.default_rng(0)
    probs = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.05] + [0.1 / 25] * 25)
    p_values = [chi_square_test(dict(enumerate(c)), dict(enumerate(probs))).p_value
                for c in rng.multinomial(300, probs, size=4000)]
    rate = np.mean(np.array(p_values) < 0.05)
    assert 0.04 <= rate <= 0.06, rate  # binomial standard error of a 5% rate over 4000 runs: 0.0034


# --- toy models: the exact target distribution by enumerating generate() -------------------------

TOY_CASES = {  # name -> (target/draft settings, n_tokens, K, sampling options, n_samples)
    "bigram, K=2, N=3": (dict(n_vocab=3, order=2, seed=1), 3, 2, {}, 2000),
    "trigram, K=3, temperature 0.7, top_k 3": (dict(n_vocab=4, order=3, seed=2), 3, 3,
                                               dict(temperature=0.7, top_k=3), 2000),
    "zeros in the tables, K=1, top_p 0.8": (dict(n_vocab=4, order=2, seed=3, zero_fraction=0.3), 3, 1,
                                            dict(top_p=0.8), 2000),
    "end-of-text token stops early, K=3, N=4": (dict(n_vocab=3, order=2, seed=4, eot_id=2), 4, 3, {}, 2000),
}


def toy_models(n_vocab, order, seed, zero_fraction=0.0, eot_id=None):
    rng = np.random.default_rng(seed)
    return tuple(random_toy_model(rng, n_vocab, order, zero_fraction, eot_id=eot_id) for _ in range(2))


def toy_chi_square(target, draft, n_tokens, K, options, n_samples, variant=None, seed=0):
    """THE test of this file, on toy models: n_samples seeded speculative runs vs the exact
    target distribution; returns the stats.ChiSquareResult. variant: a broken sampler or None."""
    return recovery_experiment(target, draft, n_tokens, K, options, n_samples, seed, variant).result


@pytest.mark.parametrize("case", TOY_CASES.values(), ids=TOY_CASES.keys())
def test_speculative_samples_pass_chi_square_against_exact_target_on_toy_models(case):
    settings, n_tokens, K, options, n_samples = case
    result = toy_chi_square(*toy_models(**settings), n_tokens, K, options, n_samples)
    assert result.df >= 5, "too few bins: the test would have no power"
    assert result.p_value >= ALPHA, f"chi-square {result.statistic:.1f}, df {result.df}"


# The classroom's default models: chosen (model seed 16 of 0-39) so that every bug has a large effect.
CONTROL_MODELS = dict(n_vocab=3, order=2, model_seed=16)
CONTROL_N_TOKENS, CONTROL_K, CONTROL_SAMPLES = 3, 2, 600


@pytest.mark.parametrize("variant", sorted(NEGATIVE_CONTROLS))
def test_same_chi_square_test_rejects_broken_sampler_on_toy_models(variant):
    result = toy_chi_square(*toy_pair(**CONTROL_MODELS), CONTROL_N_TOKENS, CONTROL_K, {},
                            CONTROL_SAMPLES, variant)
    assert result.p_value < REJECT_BELOW, f"{variant} passed: chi-square {result.statistic:.1f}"


def test_same_chi_square_test_passes_the_real_sampler_on_the_negative_control_models():
    result = toy_chi_square(*toy_pair(**CONTROL_MODELS), CONTROL_N_TOKENS, CONTROL_K, {}, CONTROL_SAMPLES)
    assert result.p_value >= ALPHA


@pytest.mark.parametrize("variant", sorted(NEGATIVE_CONTROLS))
def test_negative_control_settings_give_every_bug_a_large_effect(variant):
    """Exactly, by enumeration: the broken sampler's distribution B is far from the target's P,
    sum (B - P)^2 / P >= 1.4 (the test's expected statistic per sample before pooling). Measured
    at n = 600 after pooling: statistics 413 to 1520 on 8 degrees of freedom, p < 1e-80: the
    rejections above come from the bugs, not from lucky seeds."""
    target, draft = toy_pair(**CONTROL_MODELS)
    exact = exact_target_distribution(target, PROMPT, CONTROL_N_TOKENS)
    broken = exact_distribution(lambda rng: tuple(speculative_generate(
        target, draft, [0], CONTROL_N_TOKENS, CONTROL_K, rng=rng, **NEGATIVE_CONTROLS[variant]).tokens))
    distance = sum((broken.get(x, 0.0) - p) ** 2 / p for x, p in exact.items())
    assert distance >= 1.4 and set(broken) <= set(exact)


# --- tiny GPT-2 fixtures: target = gpt2-tiny-a, draft = gpt2-tiny-b ---------------------------------

def load_fixture(tiny_fixture_dir, name):
    folder = Path(tiny_fixture_dir(name))
    config = GPT2Config.from_hparams_json(folder / "hparams.json")
    return GPT2(config, load_params(folder, config))


def one_blas_thread():
    """Hundreds of tiny matrix products: BLAS threads only add overhead (3-4x slower on a busy
    2-core machine). threadpoolctl is a development dependency; without it, change nothing."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


@pytest.fixture(scope="module")
def gpt2_pair(tiny_fixture_dir):
    with one_blas_thread():
        yield load_fixture(tiny_fixture_dir, "gpt2-tiny-a"), load_fixture(tiny_fixture_dir, "gpt2-tiny-b")


OTHER = "other"  # stands for "any token not listed" in a bin label


def next_token_probs(model, ids, options):  # -> [n_vocab], the target's own p(. | ids)
    return sampling_distribution(model.forward(np.asarray(ids), model.new_cache())[-1], **options)


def exact_prefix_bins(model, prompt, n_tokens, options, min_prob):
    """{bin label: exact probability} for the first n_tokens tokens, from the model's own p.

    A tree over prefixes: a prefix with probability >= min_prob is expanded (one forward pass),
    its children with probability >= min_prob are kept, and the rest of its mass goes to the
    label prefix + (OTHER,). Leaves are complete n_tokens sequences. label_of() maps a sample.
    The bins depend on the target only, never on the samples or the sampler under test.
    """
    bins, frontier = {}, [((), 1.0)]
    while frontier:
        prefix, prob = frontier.pop()
        if len(prefix) == n_tokens:
            bins[prefix] = prob
            continue
        p = next_token_probs(model, list(prompt) + list(prefix), options)
        kept = prob * p >= min_prob
        frontier.extend((prefix + (int(t),), prob * p[t]) for t in np.flatnonzero(kept))
        bins[prefix + (OTHER,)] = prob * p[~kept].sum()  # exactly 0 if nothing else is possible
    return bins


def label_of(tokens, bins):
    """The bin of a sampled token sequence: itself if listed, else (longest expanded prefix, OTHER)."""
    tokens = tuple(tokens)
    for depth in range(len(tokens)):
        child = tokens[:depth + 1]
        if child in bins:                 # a complete sequence with its own bin
            return child
        if child + (OTHER,) not in bins:  # child was not expanded: it is in its parent's OTHER
            return tokens[:depth] + (OTHER,)
    raise AssertionError(f"{tokens} is shorter than the bins' sequences")


GPT2_OPTIONS = dict(temperature=0.03)  # peaked: 2-5 tokens carry most of each distribution


def gpt2_chi_square(target, draft, prompt, n_samples, variant=None, seed=0, n_tokens=3, K=2,
                    options=GPT2_OPTIONS):
    """THE test of this file, on GPT-2: n_samples seeded speculative runs, binned by
    exact_prefix_bins (expected count >= 5 per kept prefix), chi-square against the target."""
    bins = exact_prefix_bins(target, prompt, n_tokens, options, min_prob=5 / n_samples)
    rng, broken = np.random.default_rng(seed), NEGATIVE_CONTROLS[variant] if variant else {}
    counts = Counter(label_of(speculative_generate(target, draft, prompt, n_tokens, K, rng=rng,
                                                   **options, **broken).tokens, bins)
                     for _ in range(n_samples))
    return chi_square_test(counts, bins)


def test_prefix_bins_are_exact_and_label_every_sequence():
    """On a toy model the bins must agree with enumerating generate(): each bin's probability
    is the total probability of the sequences label_of() puts in it."""
    target, _ = toy_models(n_vocab=4, order=2, seed=5)
    bins = exact_prefix_bins(target, [0], 3, {}, min_prob=0.05)
    from_generate = Counter()
    for sequence, prob in exact_target_distribution(target, PROMPT, 3).items():
        from_generate[label_of(sequence, bins)] += prob
    assert set(from_generate) <= set(bins) and any(label[-1] == OTHER for label in bins)
    for label, prob in bins.items():
        assert from_generate[label] == pytest.approx(prob, abs=1e-12)


# Prompts found by scanning all 50257 one-token prompts at temperature 0.03 for ones where the
# two random fixtures are both peaked (a few tokens carry most of the mass, so a few hundred
# samples suffice) and overlap, so that drafts are accepted AND rejected often. Each model tends
# to repeat the prompt token, which is where they agree.
#   [7845]: alpha = sum min(p, q) = 0.63 at position 1, 0.11 at position 2 after 7845 again;
#   [765]:  alpha = 0.57 at position 1, 0.73 at position 2 after 765 again.
# K = 2 and N = 3, so the first round drafts positions 1 AND 2 (first_position_only needs that).
GPT2_PROMPT, GPT2_SAMPLES = [7845], 150  # about 3 s per test with one BLAS thread


def test_speculative_samples_pass_chi_square_against_exact_target_on_tiny_gpt2(gpt2_pair):
    result = gpt2_chi_square(*gpt2_pair, GPT2_PROMPT, GPT2_SAMPLES)
    assert result.df >= 5, "too few bins: the test would have no power"
    assert result.p_value >= ALPHA, f"chi-square {result.statistic:.1f}, df {result.df}"


# At [7845] and 150 samples these three reach p < 1e-9. The unnormalised residual does not: its
# missing mass goes to token 50256, which sits in the pooled "other" bin together with the
# low-probability tokens that mass was taken from, so at this prompt the bug barely moves any
# bin. Bins come from the target alone, never from the bug; the toy models above, where every
# token has its own bin, and the slow test below catch it.
@pytest.mark.parametrize("variant", ["first_position_only", "greedy_draft", "softmax_residual"])
def test_same_chi_square_test_rejects_broken_sampler_on_tiny_gpt2(gpt2_pair, variant):
    result = gpt2_chi_square(*gpt2_pair, GPT2_PROMPT, GPT2_SAMPLES, variant)
    assert result.p_value < REJECT_BELOW, f"{variant} passed: chi-square {result.statistic:.1f}"


@pytest.mark.slow
@pytest.mark.parametrize("variant", [None] + sorted(NEGATIVE_CONTROLS))
def test_heavier_tiny_gpt2_run_passes_the_real_sampler_and_rejects_every_broken_one(gpt2_pair, variant):
    """300 samples at prompt [765], about 4 s each: all four bugs, including the unnormalised residual.

    Seed 0 at 300 samples: the real sampler p = 0.17 (df 5); the bugs p = 4e-13 (first_position_only,
    the weakest), 7e-30 (unnormalised_residual), 5e-46 (greedy_draft), 6e-79 (softmax_residual), each
    millions of times past REJECT_BELOW (600 samples took twice as long to say the same: 9e-38 at worst)."""
    result = gpt2_chi_square(*gpt2_pair, [765], 300, variant)
    assert result.df >= 5
    if variant is None:
        assert result.p_value >= ALPHA, f"chi-square {result.statistic:.1f}, df {result.df}"
    else:
        assert result.p_value < REJECT_BELOW, f"{variant} passed: chi-square {result.statistic:.1f}"
