"""theory.py: the formulas, checked by hand, against the real kernel (exactly), and by simulation.

The closed forms of Leviathan et al. 2023 (sections 3.3-3.4) must predict what the real kernel
and the real generation loop do. Monte-Carlo comparisons are seeded (every run is identical) and
allow N_SE = 5 standard errors of the simulated mean unless stated: a correct formula fails
such a check with probability about 6e-7.
"""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from gpt2np.teach.exact import exact_distribution, total_variation
from gpt2np.decoding.sampling import sample
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.decoding.speculative_kernel import verify_round
from gpt2np.decoding.theory import alpha, best_K, expected_tokens_per_round, predicted_speedup
from gpt2np.teach.toy_models import ToyModel

N_SE = 5  # tolerance of the Monte-Carlo checks, in standard errors of the simulated mean

# A target p and a draft q on 4 tokens with alpha = sum min(p, q) = 0.1 + 0.2 + 0.1 + 0.2 = 0.6
P = np.array([0.4, 0.3, 0.1, 0.2])
Q = np.array([0.1, 0.2, 0.5, 0.2])
ALPHA_PQ = 0.6


def closed_form_speedup(a, K, c, v=1.0):
    """Leviathan's Thm 3.8, (1 - a^(K+1)) / ((1 - a)(K c + 1)), with v in place of the 1
    (written out here independently of theory.py, which sums the geometric series)."""
    tokens_per_round = K + 1.0 if a == 1 else (1 - a ** (K + 1)) / (1 - a)
    return tokens_per_round / (K * c + v)


def assert_within_standard_errors(samples, predicted, n_se=N_SE):
    samples = np.asarray(samples, dtype=np.float64)
    standard_error = samples.std(ddof=1) / np.sqrt(len(samples))
    assert abs(samples.mean() - predicted) <= n_se * standard_error + 1e-12, \
        f"simulated {samples.mean():.5f}, predicted {predicted:.5f}, standard error {standard_error:.5f}"


def iid_round_lengths(a, K, n_rounds, rng):  # -> [n_rounds] tokens emitted per round
    """The paper's model of a round: each of the K drafts is accepted independently with
    probability a; the round emits the accepted prefix plus one target token."""
    accepted = rng.random((n_rounds, K)) < a                        # [n_rounds, K]
    first_rejection = np.where(accepted.all(axis=1), K, np.argmin(accepted, axis=1))
    return first_rejection + 1


# --- alpha ---------------------------------------------------------------------------------------

def test_alpha_is_the_overlap_of_p_and_q():
    assert alpha(np.array([0.7, 0.3, 0.0]), np.array([0.2, 0.5, 0.3])) == 0.2 + 0.3
    assert alpha(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == 1.0
    assert alpha(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 0.0
    np.testing.assert_allclose(alpha(np.eye(3), np.full((3, 3), 1 / 3)), [1 / 3] * 3)  # row by row
    assert alpha(P, Q) == pytest.approx(ALPHA_PQ, abs=1e-15)


@hypothesis.settings(deadline=None, max_examples=50)
@hypothesis.given(st.integers(2, 8), st.integers(0, 2**32 - 1))
def test_alpha_is_one_minus_total_variation_distance(n_vocab, seed):
    p, q = np.random.default_rng(seed).dirichlet(np.ones(n_vocab), size=2)
    tv = total_variation(dict(enumerate(p)), dict(enumerate(q)))
    assert alpha(p, q) == pytest.approx(1 - tv, abs=1e-12)


def test_alpha_equals_the_kernels_measured_acceptance_rate():
    """K = 1: the kernel accepts x ~ q with probability sum_x q(x) min(1, p(x)/q(x)) = alpha."""
    rng = np.random.default_rng(0)
    drafts = rng.choice(len(Q), size=20_000, p=Q)
    accepted = [verify_round([x], Q[None], np.stack([P, P]), rng).n_accepted for x in drafts]
    assert_within_standard_errors(accepted, ALPHA_PQ)


# --- expected tokens per round -------------------------------------------------------------------

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


@pytest.mark.parametrize("a", [0.0, 0.3, 0.6, 0.9, 1.0])
@pytest.mark.parametrize("K", [1, 4, 8])
def test_expected_tokens_per_round_matches_simulated_iid_acceptances(a, K):
    lengths = iid_round_lengths(a, K, 100_000, np.random.default_rng(K))
    if a in (0.0, 1.0):  # deterministic: every round emits 1, or K + 1, tokens
        assert set(lengths) == {1 if a == 0 else K + 1} and expected_tokens_per_round(a, K) == lengths[0]
    else:
        assert_within_standard_errors(lengths, expected_tokens_per_round(a, K))


@pytest.mark.parametrize("K", [1, 3, 6])
def test_expected_tokens_per_round_matches_the_real_kernel_by_simulation(K):
    """verify_round with the same p and q at every position: acceptances are i.i.d. with
    probability alpha = 0.6, exactly the paper's model (the exact version of this is above)."""
    rng = np.random.default_rng(K)
    drafts = rng.choice(len(Q), size=(6_000, K), p=Q)  # x_i ~ q_i = Q, all drawn up front
    q_rows, p_rows = np.tile(Q, (K, 1)), np.tile(P, (K + 1, 1))
    tokens = [verify_round(list(x), q_rows, p_rows, rng).n_accepted + 1 for x in drafts]
    assert_within_standard_errors(tokens, expected_tokens_per_round(ALPHA_PQ, K))


def test_simulated_runs_agree_with_the_theory():
    # Unigram toy models: p and q are the same at every position, so every beta is alpha(p, q).
    p, q, K = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.25, 0.25, 0.25, 0.25]), 3
    result = speculative_generate(ToyModel(p, n_ctx=4000), ToyModel(q, n_ctx=4000), [0], 3000, K,
                                  rng=np.random.default_rng(0), trace=True)
    assert abs(result.stats.alpha_hat - alpha(p, q)) <= 1e-12
    full_rounds = [len(r.tokens) for r in result.trace if len(r.drafts) == K]
    assert_within_standard_errors(full_rounds, expected_tokens_per_round(alpha(p, q), K), n_se=4)
    assert abs(result.stats.alpha_empirical - alpha(p, q)) < 0.03  # about 4 standard errors


# --- speedup and best K --------------------------------------------------------------------------

def test_predicted_speedup_is_theorem_3_8_and_its_refinement_with_v():
    a, K, c = 0.8, 4, 0.05
    thm_3_8 = (1 - a ** (K + 1)) / ((1 - a) * (K * c + 1))
    assert abs(predicted_speedup(a, K, c) - thm_3_8) <= 1e-12
    refined = (1 - a ** (K + 1)) / ((1 - a) * (K * c + 3.5))
    assert abs(predicted_speedup(a, K, c, v=3.5) - refined) <= 1e-12


@hypothesis.settings(deadline=None, max_examples=200)
@hypothesis.given(st.floats(0, 1), st.integers(1, 32), st.floats(1e-3, 1), st.floats(1, 8))
def test_predicted_speedup_is_the_closed_form_for_any_alpha_K_c_v(a, K, c, v):
    # the closed form's (1 - a^(K+1)) / (1 - a) loses ~1e-16 / (1 - a) of relative precision near a = 1
    rel = 1e-12 + (1e-15 / (1 - a) if a < 1 else 0.0)
    assert predicted_speedup(a, K, c) == pytest.approx(closed_form_speedup(a, K, c), rel=rel)
    assert predicted_speedup(a, K, c, v) == pytest.approx(closed_form_speedup(a, K, c, v), rel=rel)


@pytest.mark.parametrize("a, K, c, v", [(0.8, 4, 0.05, 1.0), (0.8, 4, 0.05, 3.5), (0.5, 2, 0.3, 1.5)])
def test_predicted_speedup_matches_a_simulated_cost_model(a, K, c, v):
    """Simulate rounds with i.i.d. acceptances, each costing K draft calls (c each) plus one
    verification (v), in units of one target call: target-only decoding makes 1 token per unit.
    Speedup = tokens / cost over many rounds, which must converge to the prediction."""
    lengths = iid_round_lengths(a, K, 200_000, np.random.default_rng(7))
    simulated = lengths.sum() / (len(lengths) * (K * c + v))
    standard_error = lengths.std(ddof=1) / np.sqrt(len(lengths)) / (K * c + v)
    assert abs(simulated - predicted_speedup(a, K, c, v)) <= N_SE * standard_error


@hypothesis.given(a=st.floats(0, 1), c=st.floats(0.001, 2), v=st.floats(1, 6))
def test_best_K_maximises_the_predicted_speedup_or_is_0_when_no_K_beats_plain_decoding(a, c, v):
    K = best_K(a, c, v, K_max=20)
    speedups = [predicted_speedup(a, k, c, v) for k in range(1, 21)]
    if K == 0:
        assert max(speedups) <= 1.0  # plain decoding's speedup is 1
    else:
        assert speedups[K - 1] == max(speedups) > 1.0 and 1 <= K <= 20


@hypothesis.settings(deadline=None, max_examples=300)
@hypothesis.given(st.floats(0, 0.999), st.floats(1e-3, 1), st.floats(1, 8), st.integers(1, 40))
def test_best_K_matches_brute_force_search_over_the_closed_form(a, c, v, K_max):
    speedups = [1.0] + [closed_form_speedup(a, K, c, v) for K in range(1, K_max + 1)]  # K = 0: plain, 1
    best = best_K(a, c, v, K_max)
    assert 0 <= best <= K_max
    assert max(1.0, closed_form_speedup(a, best, c, v) if best else 1.0) == pytest.approx(max(speedups), rel=1e-12)


def test_best_K_runs_to_K_max_when_every_draft_is_accepted_and_cheaper_than_verification():
    assert best_K(1.0, c=0.1, v=1.0, K_max=16) == 16


def test_best_K_is_0_when_no_K_beats_plain_decoding():
    """It returned 1 here, whose speedup is below 1: a student reading best_K alone missed that
    speculation loses. With v = 1 some K pays exactly when alpha > c (Leviathan et al., Cor. 3.9)."""
    assert best_K(0.0, c=0.5) == 0         # every draft rejected: drafting is pure waste (K = 1: 0.67)
    assert best_K(0.0, c=0.1) == 0
    assert best_K(0.3, c=0.3) == 0 and best_K(0.31, c=0.3) >= 1
    assert best_K(1.0, c=1.0, v=1.0) == 0  # (K + 1) / (K + 1) = 1 for every K: a tie, plain decoding wins
    assert best_K(0.9, c=0.05, v=9.0) == 0 and best_K(0.9, c=0.05, v=4.0) > 0  # a costly verification


@pytest.mark.parametrize("call, message", [
    (lambda: predicted_speedup(1.5, 4, 0.1), "alpha must be a number in [0, 1]"),       # was 9.42
    (lambda: expected_tokens_per_round(-0.2, 4), "alpha must be a number in [0, 1]"),   # was 0.834
    (lambda: best_K(float("nan"), 0.1), "alpha must be a number in [0, 1]"),            # was 1
    (lambda: expected_tokens_per_round(0.5, -1), "K must be an integer >= 0"),          # was 0.0
    (lambda: expected_tokens_per_round(0.5, 2.5), "K must be an integer >= 0"),
    (lambda: expected_tokens_per_round(0.5, True), "K must be an integer >= 0"),
    (lambda: predicted_speedup(0.5, 2, -0.1), "c must be a finite number >= 0"),
    (lambda: predicted_speedup(0.5, 2, float("inf")), "c must be a finite number >= 0"),
    (lambda: predicted_speedup(0.5, 2, 0.1, v=0.0), "v must be a finite number > 0"),
    (lambda: predicted_speedup(0.5, 2, 0.1, v=float("nan")), "v must be a finite number > 0"),
    (lambda: best_K(0.5, 0.1, K_max=-1), "K must be an integer >= 0"),
])
def test_bad_inputs_are_one_line_value_errors(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        call()
    assert "\n" not in str(info.value)


def test_inputs_from_measurement_and_numpy_are_accepted():
    """alpha = sum min(p, q) can exceed 1 by an ulp when p == q (clipped to 1); numpy numbers are numbers."""
    assert expected_tokens_per_round(1.0 + 2e-16, 3) == 4.0
    numpy_numbers = predicted_speedup(np.float64(0.8), np.int64(4), np.float32(0.05))
    assert numpy_numbers == pytest.approx(predicted_speedup(0.8, 4, 0.05))
    assert predicted_speedup(0.5, 0, 0.0) == 1.0  # K = 0 and c = 0 are allowed
