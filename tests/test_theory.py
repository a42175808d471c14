"""theory.py: the formulas, checked by hand, against the real kernel (exactly), and by simulation."""
import hypothesis
import hypothesis.strategies as st
import numpy as np

from gpt2np.exact import exact_distribution
from gpt2np.sampling import sample
from gpt2np.speculative import speculative_generate
from gpt2np.speculative_kernel import verify_round
from gpt2np.theory import alpha, best_K, expected_tokens_per_round, predicted_speedup
from gpt2np.toy_models import ToyModel


def test_alpha_is_the_overlap_of_p_and_q():
    assert alpha(np.array([0.7, 0.3, 0.0]), np.array([0.2, 0.5, 0.3])) == 0.2 + 0.3
    assert alpha(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == 1.0
    assert alpha(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 0.0
    np.testing.assert_allclose(alpha(np.eye(3), np.full((3, 3), 1 / 3)), [1 / 3] * 3)  # row by row


@hypothesis.given(a=st.floats(0, 1 - 1e-6), K=st.integers(1, 12))
def test_expected_tokens_per_round_is_the_closed_form(a, K):
    closed_form = (1 - a ** (K + 1)) / (1 - a)
    assert abs(expected_tokens_per_round(a, K) - closed_form) <= 1e-9 * closed_form


def test_expected_tokens_per_round_at_alpha_one_is_K_plus_one():
    assert [expected_tokens_per_round(1.0, K) for K in (1, 4, 8)] == [2.0, 5.0, 9.0]


def test_expected_tokens_per_round_equals_the_real_kernel_exactly():
    # context-free p and q (the paper's i.i.d. assumption holds exactly): enumerate one round of
    # the real kernel with K drafts x_i ~ q and take the mean number of emitted tokens.
    p, q, K = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6]), 3

    def tokens_in_one_round(rng):
        drafts = [sample(q, rng) for _ in range(K)]
        return verify_round(drafts, np.tile(q, (K, 1)), np.tile(p, (K + 1, 1)), rng).n_accepted + 1

    mean = sum(n * prob for n, prob in exact_distribution(tokens_in_one_round).items())
    assert abs(mean - expected_tokens_per_round(alpha(p, q), K)) <= 1e-12


def test_predicted_speedup_is_theorem_3_8_and_its_refinement_with_v():
    a, K, c = 0.8, 4, 0.05
    thm_3_8 = (1 - a ** (K + 1)) / ((1 - a) * (K * c + 1))
    assert abs(predicted_speedup(a, K, c) - thm_3_8) <= 1e-12
    refined = (1 - a ** (K + 1)) / ((1 - a) * (K * c + 3.5))
    assert abs(predicted_speedup(a, K, c, v=3.5) - refined) <= 1e-12


@hypothesis.given(a=st.floats(0, 1), c=st.floats(0.001, 2), v=st.floats(1, 6))
def test_best_K_maximises_the_predicted_speedup(a, c, v):
    K = best_K(a, c, v, K_max=20)
    speedups = [predicted_speedup(a, k, c, v) for k in range(1, 21)]
    assert speedups[K - 1] == max(speedups) and 1 <= K <= 20


def test_best_K_runs_to_K_max_when_every_draft_is_accepted_and_cheaper_than_verification():
    assert best_K(1.0, c=0.1, v=1.0, K_max=16) == 16


def test_simulated_runs_agree_with_the_theory():
    # Unigram toy models: p and q are the same at every position, so every beta is alpha(p, q).
    p, q, K = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.25, 0.25, 0.25, 0.25]), 3
    result = speculative_generate(ToyModel(p, n_ctx=4000), ToyModel(q, n_ctx=4000), [0], 3000, K,
                                  rng=np.random.default_rng(0), trace=True)
    assert abs(result.stats.alpha_hat - alpha(p, q)) <= 1e-12
    full_rounds = [len(r.emitted) for r in result.trace if len(r.drafts) == K]
    mean, standard_error = np.mean(full_rounds), np.std(full_rounds) / np.sqrt(len(full_rounds))
    assert abs(mean - expected_tokens_per_round(alpha(p, q), K)) < 4 * standard_error  # seeded
    assert abs(result.stats.alpha_empirical - alpha(p, q)) < 0.03  # about 4 standard errors
