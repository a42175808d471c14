"""What speculative decoding should gain, in closed form (Leviathan et al. 2023, sections 3.3-3.4).

Notation as in the paper: p is the target's distribution, q the draft's, K draft tokens per round
(the paper's gamma), c = cost of one draft call / cost of one target call. We add
v = cost of one target call over K+1 tokens / cost of one target call over 1 token. The paper
assumes v = 1 (on a GPU, verifying K+1 tokens costs about as much as decoding one); on a CPU in
plain NumPy it is 3-4 at GPT-2's sizes, and 1.4-1.9 with gpt2np's few-row products, depending on
the BLAS kernel (PERFORMANCE.md, notebook 07). Every speedup formula of the package is here;
policies.py and run_stats.py call these. The scalar formulas check their inputs (alpha in [0, 1],
K an integer >= 0, c >= 0, v > 0, all finite): a one-line ValueError, not a speedup of 9.4.

>>> a = alpha(np.array([0.7, 0.3]), np.array([0.5, 0.5]))
>>> round(a, 3), round(expected_tokens_per_round(a, K=4), 3)
(0.8, 3.362)
"""
import math
import numbers

import numpy as np

ROUNDING = 1e-9  # sum(min(p, q)) can exceed 1 by an ulp or two when p == q: clipped, not refused


def checked_alpha(alpha):
    """alpha as a float in [0, 1], or a one-line ValueError (nan and inf fail too).

    >>> checked_alpha(1.5)
    Traceback (most recent call last):
    ValueError: alpha must be a number in [0, 1] (an acceptance probability), got 1.5
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not -ROUNDING <= alpha <= 1 + ROUNDING:
        raise ValueError(f"alpha must be a number in [0, 1] (an acceptance probability), got {alpha!r}")
    return min(max(float(alpha), 0.0), 1.0)


def checked_K(K):
    """K as an int >= 0 (draft tokens per round), or a one-line ValueError."""
    if isinstance(K, bool) or not isinstance(K, numbers.Integral) or K < 0:
        raise ValueError(f"K must be an integer >= 0 (draft tokens per round), got {K!r}")
    return int(K)


def checked_cost(name, value, zero_allowed):
    """A cost ratio (c >= 0, v > 0) as a finite float, or a one-line ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not zero_allowed):
        raise ValueError(f"{name} must be a finite number {'>=' if zero_allowed else '>'} 0 (a cost ratio), "
                         f"got {value!r}")
    return float(value)


def alpha(p, q):  # [..., n_vocab], [..., n_vocab] -> [...]
    """Acceptance probability of one draft token: beta = sum_x min(p(x), q(x)) (Thm 3.5).

    Leviathan's alpha is the expectation of this beta over contexts. It is 1 when p == q and 0
    when p and q have disjoint supports; 1 - beta is the total variation distance between them.

    >>> alpha(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    0.0
    """
    beta = np.minimum(p, q).sum(axis=-1)
    return float(beta) if np.ndim(beta) == 0 else beta


def expected_tokens_per_round(alpha, K):
    """Mean tokens a round emits: (1 - alpha^(K+1)) / (1 - alpha), which is K + 1 when alpha = 1.

    Each draft token is accepted with probability alpha, independently (the paper's i.i.d.
    assumption); a round emits the accepted drafts plus one target token. We sum the geometric
    series 1 + alpha + ... + alpha^K directly: same number, no 0/0 at alpha = 1.

    >>> expected_tokens_per_round(1.0, K=4), expected_tokens_per_round(0.0, K=4)
    (5.0, 1.0)
    """
    alpha, K = checked_alpha(alpha), checked_K(K)
    return float(sum(alpha**i for i in range(K + 1)))


def predicted_speedup(alpha, K, c, v=1.0):
    """Expected wall-time speedup over target-only decoding: tokens per round / cost per round.

    A round costs K draft calls (K * c target-call units) plus one (K+1)-token target call (v).
    With v = 1 this is Leviathan's Thm 3.8: (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1));
    with measured v: (1 - alpha^(K+1)) / ((1 - alpha)(K c + v)).

    >>> round(predicted_speedup(0.8, K=4, c=0.05), 2), round(predicted_speedup(0.8, K=4, c=0.05, v=3.5), 2)
    (2.8, 0.91)
    """
    c, v = checked_cost("c", c, zero_allowed=True), checked_cost("v", v, zero_allowed=False)
    return expected_tokens_per_round(alpha, K) / (K * c + v)


def best_K(alpha, c, v=1.0, K_max=32):
    """The K in 1..K_max with the largest predicted speedup (the smallest such K on ties), or 0 when
    none beats plain decoding: 0 means "do not speculate", whose speedup is 1 by definition.

    A costlier verification (larger v) makes each round dearer, so longer rounds pay off. With
    alpha = 1 and v > c the speedup (K + 1) / (K c + v) grows with K forever: the answer is K_max.
    With v = 1 no K pays once alpha <= c (Leviathan et al., Cor. 3.9: K = 1 gives (1 + alpha) / (1 + c)).

    >>> best_K(0.8, c=0.05), best_K(0.8, c=0.05, v=3.5), best_K(0.3, c=0.5)
    (8, 12, 0)
    """
    speedups = [predicted_speedup(alpha, K, c, v) for K in range(1, checked_K(K_max) + 1)]
    if not speedups or max(speedups) <= 1.0:
        return 0  # plain decoding wins, or ties (then the smallest K, as above)
    return 1 + int(np.argmax(speedups))  # np.argmax returns the first maximum


def predicted_speedups(alpha_hat, c, v, K_max):  # v: v[M] for M = 1..K_max + 1
    """predicted_speedup for K = 0..K_max at once (K = 0: plain decoding, exactly 1 when v[1] = 1), with
    v(K+1) per K: E(alpha, K) = 1 + alpha + ... + alpha^K summed as K grows, so the curve costs one
    pass (auto K asks every round, and one predicted_speedup per K took ~10x as long)."""
    tokens, speedups = 0.0, []
    for K in range(K_max + 1):
        tokens += alpha_hat ** K
        speedups.append(tokens / (K * c + v[K + 1]))
    return speedups


def expected_speedups_under_belief(a, b, c, v, K_max):  # v: v[M] for M = 1..K_max + 1
    """predicted_speedups for K = 0..K_max, averaged over a Beta(a, b) belief about alpha.

    A round's tokens 1 + alpha + ... + alpha^K are linear in the moments of alpha, and a Beta's
    are E[alpha^i] = prod_{j < i} (a + j) / (a + b + j): the average costs no more than one curve.
    Little evidence (small a + b) makes long rounds look better than at the mean alpha (E[alpha^i]
    >= E[alpha]^i), and much evidence gives predicted_speedups at the mean.

    >>> [round(s, 3) for s in expected_speedups_under_belief(1, 1, 0.0, {1: 1, 2: 1, 3: 1}, 2)]  # uniform
    [1.0, 1.5, 1.833]
    """
    return [tokens / (K * c + v[K + 1]) for K, tokens in enumerate(expected_tokens_under_belief(a, b, K_max))]


def expected_tokens_under_belief(a, b, K_max):  # -> [K_max + 1]: E[1 + alpha + ... + alpha^K] for K = 0..K_max
    """A round's tokens averaged over a Beta(a, b) belief about alpha, for every K at once.

    >>> expected_tokens_under_belief(1, 1, 2)        # uniform: 1, 1 + 1/2, 1 + 1/2 + 1/3
    [1.0, 1.5, 1.8333333333333333]
    """
    tokens, moment, out = 0.0, 1.0, []
    for K in range(K_max + 1):
        tokens += moment                                    # + E[alpha^K]
        out.append(tokens)
        moment *= (a + K) / (a + b + K)                     # E[alpha^(K+1)]
    return out


def beta_binomial(n, a, b):  # -> [n + 1]: P(s of n examined positions accepted), s = 0..n, under Beta(a, b)
    """What n more examined positions would show, predicted by a Beta(a, b) belief about alpha (each
    accepted with probability alpha): the Beta-binomial, C(n, s) B(a + s, b + n - s) / B(a, b).

    >>> [round(p, 3) for p in beta_binomial(2, 1.0, 1.0)]       # uniform belief: every count alike
    [0.333, 0.333, 0.333]
    >>> [round(p, 3) for p in beta_binomial(2, 500.0, 500.0)]   # alpha known to be 0.5: the binomial
    [0.25, 0.5, 0.25]
    """
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) - math.lgamma(a + b + n)
    return [math.exp(math.lgamma(n + 1) - math.lgamma(s + 1) - math.lgamma(n - s + 1) + math.lgamma(a + s)
                     + math.lgamma(b + n - s) + log_norm) for s in range(n + 1)]


def predicted_speedup_mixed(alpha_hat, K_counts, c, v_of_K):
    """sum_r E(alpha, K_r) / sum_r (K_r c + v(K_r + 1)): theory's speedup for a run of varying K."""
    if any(v_of_K(K) is None for K in K_counts):
        return None
    if len(K_counts) == 1:  # one K: exactly theory.predicted_speedup
        (K,) = K_counts
        return predicted_speedup(alpha_hat, K, c, v_of_K(K))
    tokens = sum(n * expected_tokens_per_round(alpha_hat, K) for K, n in K_counts.items())
    return tokens / sum(n * (K * c + v_of_K(K)) for K, n in K_counts.items())
