"""One round of speculative sampling's verification: accept drafts, then one token from the target.

Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1 (SpeculativeDecodingStep); Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling", Algorithm 2. The two groups found the same algorithm
independently, "modified rejection sampling"; it is ONE algorithm, implemented here once, in
Leviathan's notation:

    p     the TARGET model's distribution (the one we must sample from)     Chen et al. call it q
    q     the DRAFT model's distribution (cheap, proposes tokens)           Chen et al. call it p
    K     draft tokens per round                                            Leviathan calls it gamma

Both distributions are taken AFTER the same temperature / top-k / top-p transform (sampling.py);
the guarantee is that the emitted tokens follow the transformed p exactly.

Algorithm 1's four commented phases, numbered here Step 1-4 (speculative.py does steps 1-2, this
file steps 3-4):
    Step 1  draft x_1..x_K autoregressively, x_i ~ q_i = Mq(prefix + x_1..x_{i-1})
    Step 2  run the target once on prefix + x_1..x_K: p_1..p_{K+1}
    Step 3  accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); n = index of first rejection
    Step 4  if a draft was rejected: t ~ norm(max(0, p_{n+1} - q_{n+1}))   ("resample")
            else (all K accepted):   t ~ p_{K+1}                           ("bonus")
            emit x_1..x_n, t

Chen et al.'s Algorithm 2, paraphrased line by line in Leviathan's letters (swap p and q to
read it in theirs):
    for t = 1..K: sample the draft x~_t ~ q(. | x_1..x_n, x~_1..x~_{t-1})          Step 1
    in parallel, compute the target's K+1 distributions p(. | x_1..x_n, x~_1..x~_t)  Step 2
    for t = 1..K: r ~ U[0, 1]; if r < min(1, p(x~_t) / q(x~_t)): accept x~_t, n += 1 Step 3
        else: sample x_{n+t} ~ (p - q)_+ and exit the loop                         Step 4, resample
    if all K drafts were accepted: sample one extra token from p                  Step 4, bonus
where Chen's (f)_+ = max(0, f) / sum_x max(0, f(x)) is Leviathan's norm(max(0, f)). (Chen's outer
loop runs while fewer than T tokens exist, so it can overshoot T by up to K; speculative.py
clamps K instead, and returns exactly N tokens.)

Leviathan draws all K uniforms r_1..r_K up front and takes n = min{i-1 : r_i > p_i/q_i}; we draw
them one at a time and stop at the first rejection, as Chen does. Same distribution: the coins
after the first rejection are never looked at. (Vectorised code that forgets to stop at the first
rejection is a classic bug: see broken_kernels.py.)

Why it is exact, at one position (Leviathan et al., Appendix A.1). A draft x ~ q is accepted
with probability sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)) (their Thm 3.5), so
P(emit x) = min(p, q)(x) + (1 - sum_y min(p(y), q(y))) norm(max(0, p - q))(x)
          = min(p, q)(x) + max(0, p - q)(x) = p(x),
because the rejection mass 1 - sum min(p, q) equals sum max(0, p - q). `output_distribution`
writes this sum out; the tests check it, and the real kernel by enumeration, against p.

NOTE: the papers index positions from 1, Python from 0: drafts[i] is the paper's x_{i+1}.

>>> p = np.array([[0.6, 0.4], [0.9, 0.1]])  # target at positions 1 and 2 (K = 1)
>>> verify_round([1], p[:1], p, rng=None, greedy=True)  # x_1 = 1 is not argmax p_1 = 0
RoundResult(n_accepted=0, next_token=0, kind='resample')
>>> verify_round([1], p[:1], p, np.random.default_rng(0)).n_accepted  # q == p: always accepted
1
"""
from dataclasses import dataclass

import numpy as np

from .sampling import sample


@dataclass(frozen=True)
class RoundResult:
    n_accepted: int  # n: how many of the K drafts were accepted (a prefix x_1..x_n)
    next_token: int  # t: the token the target adds after them
    kind: str        # "resample" (t after a rejection) or "bonus" (all K accepted, t ~ p_{K+1})


def accept_draft(p_x, q_x, rng):
    """Step 3 for one draft token x: accept with probability min(1, p(x) / q(x)).

    The decision is drawn through sample() as a coin [reject, accept] = [1 - a, a], so exact
    tests can enumerate it. q(x) > 0 always: x was drawn from q.
    """
    assert q_x > 0, "a drafted token must have positive draft probability"
    a = 1.0 if p_x >= q_x else p_x / q_x  # min(1, p/q), without overflow when q(x) is tiny
    return sample(np.array([1.0 - a, a]), rng) == 1


def residual_distribution(p_i, q_i):  # [n_vocab], [n_vocab] -> [n_vocab]
    """Step 4 after a rejection: norm(max(0, p - q)), the part of p that q under-proposes.

    If max(0, p - q) sums to 0 then p == q, and a rejection had probability
    sum_x max(0, q - p) = sum_x max(0, p - q) = 0: it can only happen through rounding.
    We then return p (the residual's limit as q -> p) instead of dividing by zero.

    >>> residual_distribution(np.array([0.6, 0.4]), np.array([0.2, 0.8])).tolist()
    [1.0, 0.0]
    """
    residual = np.maximum(0.0, p_i - q_i)
    total = residual.sum()
    return residual / total if total > 0 else p_i


def target_token(p_i, rng, greedy):
    """Step 4's draw t ~ p_i (or argmax p_i when greedy: no randomness consumed)."""
    return int(np.argmax(p_i)) if greedy else sample(p_i, rng)


def verify_round(drafts, q, p, rng, greedy=False):
    """Steps 3-4 of Algorithm 1: how many drafts to keep, and the target's next token.

    Shapes: drafts [K] ints (x_1..x_K); q [K, n_vocab] (q_1..q_K); p [K+1, n_vocab] (p_1..p_{K+1}).
    greedy=True is temperature 0: accept x_i iff it is argmax p_i, and on the first mismatch emit
    argmax p_i. That is "the target's greedy token", reached without any randomness.
    """
    K = len(drafts)
    for i, x in enumerate(drafts):                       # Step 3, one draft at a time
        accepted = x == np.argmax(p[i]) if greedy else accept_draft(p[i][x], q[i][x], rng)
        if not accepted:                                 # first rejection: n = i
            adjusted = p[i] if greedy else residual_distribution(p[i], q[i])  # Step 4: p'
            return RoundResult(i, target_token(adjusted, rng, greedy), "resample")
    return RoundResult(K, target_token(p[K], rng, greedy), "bonus")  # Step 4: all K accepted


def output_distribution(p_i, q_i):  # [n_vocab], [n_vocab] -> [n_vocab]
    """The analytic distribution of the token one verification step emits when x ~ q_i.

    P(x) = q(x) min(1, p(x)/q(x))  +  P(reject) norm(max(0, p - q))(x),  P(reject) = 1 - sum min(p, q).
    Equals p_i (see the module docstring); tests check that numerically for random p, q.

    >>> output_distribution(np.array([0.7, 0.3]), np.array([0.1, 0.9])).round(12).tolist()
    [0.7, 0.3]
    """
    accept = np.minimum(q_i, p_i)  # = q(x) min(1, p(x)/q(x)), and 0 where q(x) = 0 (never drafted)
    p_reject = 1.0 - np.minimum(p_i, q_i).sum()
    return accept + p_reject * residual_distribution(p_i, q_i)
