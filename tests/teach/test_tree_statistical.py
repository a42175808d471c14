"""Token trees on the bundled pair, statistically: the loop's samples at temperature 0.8 pass a
chi-square test against the target's exact distribution, and the same test rejects a broken tree
kernel (issue 28). Method, bins and false-alarm rate are test_distribution_statistical.py's:
the first N tokens' sequences binned by the target's own exact prefix probabilities (each bin
expected >= GPT2_MIN_EXPECTED = 5 times, the textbook's pooling), Pearson's chi-square; a correct
sampler passes when p >= ALPHA = 1e-3 (it would fail about one run in 1000 were the seed random, at
most 1.7 with bins this small (chi_square.py); fixed here, so the suite is deterministic), a broken
one must reach p < REJECT_BELOW = 1e-6.

The negative control: any_child_passes (teach/broken_tree_kernels.py) with four children at the
root, N = 2, at the prompt "HAMLET:\\nWhat a piece of work is a man", where draft and target agree
least of the prompts tried (beta = sum min(p, q) = 0.54 at the first position, temperature 0.8).
Its effect is ~0.1 chi-square per sample (600 samples, seeds 0-3: statistics 90-113 on df 32),
so 1000 samples put it far past the threshold (measured, seeds 0-2: statistics 151-153 on df 39,
p ~ 3e-15). The positive test, seed 0: statistic 46.5 on df 48, p = 0.53.
"""
from collections import Counter

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.decoding.tree_kernel import verify_tree
from gpt2np.teach.broken_tree_kernels import BROKEN_TREE_KERNELS
from gpt2np.teach.chi_square import chi_square_test
from test_distribution_statistical import (ALPHA, GPT2_MIN_EXPECTED, REJECT_BELOW, exact_prefix_bins, label_of,
                                           one_blas_thread)

TEMPERATURE = 0.8
PROMPT = "HAMLET:\nWhat a piece of work is a man"


@pytest.fixture(scope="module")
def bundled_pair():
    with one_blas_thread():
        yield gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def tree_chi_square(target, draft, n_tokens, tree, n_samples, tree_kernel=verify_tree, seed=0):
    """n_samples seeded speculative runs with tree=`tree`, binned by the target's exact prefix
    probabilities, against those probabilities: a ChiSquareResult."""
    prompt, options = target.tokenizer.encode(PROMPT), dict(temperature=TEMPERATURE)
    bins = exact_prefix_bins(target, prompt, n_tokens, options, min_prob=GPT2_MIN_EXPECTED / n_samples)
    rng = np.random.default_rng(seed)
    counts = Counter(label_of(speculative_generate(target, draft, prompt, n_tokens, rng=rng, tree=tree,
                                                   tree_kernel=tree_kernel, **options).tokens, bins)
                     for _ in range(n_samples))
    return chi_square_test(counts, bins, min_expected=GPT2_MIN_EXPECTED)


def test_tree_samples_pass_chi_square_against_the_exact_target_on_the_bundled_pair(bundled_pair):
    """(3, 2) trees, N = 3: the first round drafts both levels. About 5 s."""
    result = tree_chi_square(*bundled_pair, 3, (3, 2), 600)
    assert result.df >= 20, "too few bins: the test would have no power"
    assert result.p_value >= ALPHA, f"chi-square {result.statistic:.1f}, df {result.df}"


def test_same_chi_square_rejects_a_broken_tree_kernel_on_the_bundled_pair(bundled_pair):
    """About 7 s."""
    result = tree_chi_square(*bundled_pair, 2, (4,), 1000, BROKEN_TREE_KERNELS["any_child_passes"])
    assert result.p_value < REJECT_BELOW, f"any_child_passes passed: chi-square {result.statistic:.1f}"


def test_the_trees_really_branch_and_get_rejected_here(bundled_pair):
    """Otherwise the control could not show the bug: siblings after a rejection are tried."""
    target, draft = bundled_pair
    result = speculative_generate(target, draft, target.tokenizer.encode(PROMPT), 40, tree=(4,),
                                  temperature=TEMPERATURE, rng=np.random.default_rng(0))
    ranks = result.stats.by_rank[0]  # depth 1: (tried, accepted) per sibling rank
    assert len(ranks) >= 2 and ranks[1][0] > 0 and result.stats.rejections > 0
