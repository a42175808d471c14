"""K policies: how many drafts to ask for in the next round, from what the run has measured so far.

    policy.name                       # "fixed" / "heuristic" / "auto", for the statistics
    policy.reset()                    # a new run
    K = policy.choose(past)           # before a round: K >= 0 (0 = a plain target step)
    policy.update(event)              # after it, with its RoundEvent

Why a policy keeps the output exact. Fix everything that happened before a round: the tokens, the
decisions, even the clock readings. The policy's K is then a constant, and for any constant K the
round emits tokens with exactly the target's conditional distribution given that past
(speculative_kernel.py). Averaging over pasts keeps that true, so the whole output has the
target's distribution, however K varies: the K of a round may depend on anything before it.
It must not depend on the round itself (its drafts, its coins): a policy that looked at the
target's p to decide where to cut a model's random drafts would keep exactly the drafts that pass,
and bias the output (broken_kernels.PeekingDrafter is that bug; the exact tests reject it). With
prompt lookup the drafts are a function of the context, so such a cut is a choice made from the
past after all, and the same tests show it stays exact.

`past` is a Measurements: only what earlier rounds produced. Timing-driven policies ("auto") are
exact for the same reason, and the tests enumerate them with scripted clocks.
"""
import math
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from .theory import predicted_speedups

HEURISTIC_START = 5        # Hugging Face's num_assistant_tokens default
ALPHA_PRIOR, ALPHA_PRIOR_WEIGHT = 0.6, 2   # auto: alpha_hat starts as if 2 positions had beta 0.6
OPTIMISM = 1.0             # auto: plans with alpha_hat + 1 standard error (sure of alpha only once seen)
V_PRIOR_JUMP, V_PRIOR_SLOPE = 0.3, 0.08  # auto: v(M) = 1.3 + 0.08 (M - 2) for M >= 2 until measured
FIRST_K_MAX, K_STEP_MAX = 2, 2  # auto: the first drafting round at most 2 drafts, then at most +2 a round
EXPLORE_AFTER = 32         # auto: after this many plain rounds in a row, draft once (then 64, 128 ...): with
                           # a model draft, exploring costs ~1.7 one-token steps at 355M (the draft catches
                           # up on the plain stretch, drafts, then a 2-token check), ~5 % of 32 steps
WINDOW = 32                # timings kept per call size (and per drafting round): the latest ones, so the
                           # plan follows a machine that speeds up or slows down, and choosing costs the
                           # same microseconds at token 10 or 1,000 (on the bundled pair a round is ~1 ms)


@dataclass
class Measurements:
    """What a policy may know before a round: the past only."""
    overlaps: list = field(default_factory=list)   # beta = sum_x min(p, q) at every examined position
    target_durations: dict = field(default_factory=dict)  # tokens per target call -> [seconds], no prefill
    draft_cost: float | None = None                # drafter wall seconds per drafted token (median)
    draft_costs: list = field(default_factory=list)  # the same, one per round that drafted
    c_prior: float = 0.5                           # the drafter's c before anything is measured

    def add_target_call(self, n_seq, seconds):
        """One timed target call of n_seq tokens (only the latest WINDOW of each size are kept)."""
        keep(self.target_durations.setdefault(n_seq, []), seconds)

    def add_draft_cost(self, seconds_per_token):
        """One drafting round's wall seconds per drafted token; draft_cost becomes their median."""
        keep(self.draft_costs, seconds_per_token)
        self.draft_cost = median(self.draft_costs)


def keep(window, value):
    """Append value to a list that holds the latest WINDOW values."""
    window.append(value)
    if len(window) > WINDOW:
        del window[0]


class FixedK:
    """Today's behaviour: K drafts every round."""

    def __init__(self, K):
        self.K, self.name = K, "fixed"

    def reset(self):
        pass

    def choose(self, past):
        return self.K

    def update(self, event):
        pass


class HeuristicK:
    """Hugging Face's "heuristic" schedule: K += 2 after a round whose drafts were all accepted,
    K -= 1 otherwise, within 1..K_max (transformers' AssistedCandidateGenerator)."""

    def __init__(self, K_max=8, start=HEURISTIC_START):
        self.K_max, self.start, self.name = K_max, min(start, K_max), "heuristic"
        self.K = self.start

    def reset(self):
        self.K = self.start

    def choose(self, past):
        return self.K

    def update(self, event):
        all_accepted = event.drafts and all(event.decisions) and len(event.decisions) == len(event.drafts)
        self.K = min(self.K_max, self.K + 2) if all_accepted else max(1, self.K - 1)


def prior_v_curve(M_max):
    """v(M) before any call is timed: 1 for one token, then 1 + V_PRIOR_JUMP + V_PRIOR_SLOPE (M - 2).

    The jump is real: a one-row product is a matrix-vector product that streams the weights at
    the machine's bandwidth, and two or more rows take the small-M product path, ~1.3-1.4 times
    slower here at every size measured (bench: "small-M curve"; 355M: v(2) = 1.41, v(5) = 1.52).
    """
    return {M: 1.0 if M == 1 else 1 + V_PRIOR_JUMP + V_PRIOR_SLOPE * (M - 2) for M in range(1, M_max + 1)}


def v_curve(target_durations, M_max):
    """v(M) = seconds of an M-token target call / a one-token call, for M = 1..M_max.

    A size that was timed gets its own median over t1; t1 is the median one-token call, or, before
    one is timed, the smallest timed size through the prior. A size never timed gets a line
    through the timed sizes of 2 or more tokens (least squares over their medians if there are two
    or more, else the prior slope through the one), or the prior (prior_v_curve) if none was
    timed. The line leaves out M = 1 on purpose: the jump from 1 to 2 tokens is not on it.
    Returns {M: v(M)}; v(1) = 1, and v >= 1 throughout.
    """
    prior = prior_v_curve(M_max)
    medians = {m: median(d) for m, d in target_durations.items() if d and m <= M_max}
    if not medians:
        return prior
    t1 = medians[1] if 1 in medians else medians[min(medians)] / prior[min(medians)]
    measured = {m: t / t1 for m, t in medians.items()}
    multi = sorted(m for m in measured if m >= 2)
    if len(multi) >= 2:
        vs = [measured[m] for m in multi]
        slope = max(least_squares_slope(multi, vs), 0.0)  # a call never gets cheaper with more tokens
        line = lambda M: sum(vs) / len(vs) + slope * (M - sum(multi) / len(multi))  # noqa: E731
    elif multi:
        line = lambda M: measured[multi[0]] + V_PRIOR_SLOPE * (M - multi[0])  # noqa: E731
    else:
        line = lambda M: prior[M]  # noqa: E731
    return {M: 1.0 if M == 1 else max(1.0, float(measured[M] if M in measured else line(M)))
            for M in range(1, M_max + 1)}


def least_squares_slope(xs, ys):
    """The slope of the least-squares line through the points (xs[i], ys[i]) (two or more xs)."""
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys))
            / sum((x - x_mean) ** 2 for x in xs))


def t1_estimate(target_durations, v):
    """Seconds of a one-token target call, from every measured call size through the v curve."""
    estimates = [median(d) / v[m] for m, d in target_durations.items() if d and m in v]
    return median(estimates) if estimates else None


class AutoK:
    """Each round, the K in 0..K_max that maximises the refined prediction from running estimates:

        K* = argmax_K  (1 - a^(K+1)) / ((1 - a) (K c + v(K+1))),      K* = 0 means plain decoding

    a = alpha_hat over every examined position so far, with a prior of ALPHA_PRIOR worth
    ALPHA_PRIOR_WEIGHT positions, plus OPTIMISM standard errors sqrt(a (1 - a) / n) (n = positions
    + prior weight): optimism while little is known, so the first rounds draft and one unlucky
    round does not stop it, fading as positions are examined. c = the drafter's wall seconds per
    drafted token (its forward calls, sampling and Python: on tiny models the last two are not
    negligible; the median of the latest WINDOW drafting rounds) / target seconds per one-token
    call (the drafter's c_prior until it has drafted). v = the target calls measured so far, each
    size the median of its latest WINDOW calls (v_curve; the prior for sizes never timed). Two guards bound what an early guess can cost: the first drafting round asks
    for at most FIRST_K_MAX drafts and each later one at most K_STEP_MAX more than the last
    (an HF-style ramp), and plain rounds, which tell nothing about alpha, are interrupted after
    EXPLORE_AFTER of them in a row by one round of K = 1, the wait doubling each time.
    """

    def __init__(self, K_max=8):
        self.K_max, self.name = K_max, "auto"
        self.reset()

    def reset(self):
        self.plain_streak, self.explore_after, self.last_drafted_K = 0, EXPLORE_AFTER, FIRST_K_MAX - K_STEP_MAX

    def estimates(self, past):
        """(alpha, c, v) as the policy plans with them now (alpha with its optimism added)."""
        overlaps = past.overlaps
        n = ALPHA_PRIOR_WEIGHT + len(overlaps)
        a = (ALPHA_PRIOR * ALPHA_PRIOR_WEIGHT + sum(overlaps)) / n
        a = min(1.0, a + OPTIMISM * math.sqrt(max(a * (1 - a), 0.01) / n))
        v = v_curve(past.target_durations, self.K_max + 1)
        t1 = t1_estimate(past.target_durations, v)
        c = past.c_prior if past.draft_cost is None or not t1 else past.draft_cost / t1
        return a, c, v

    def choose(self, past):
        a, c, v = self.estimates(past)
        speedups = predicted_speedups(a, c, v, self.K_max)
        K = max(range(self.K_max + 1), key=speedups.__getitem__)  # the first maximum: fewest drafts
        if K == 0 and self.plain_streak >= self.explore_after:
            K, self.plain_streak, self.explore_after = 1, 0, 2 * self.explore_after
        self.plain_streak = self.plain_streak + 1 if K == 0 else 0
        if K > 0:
            K = self.last_drafted_K = min(K, self.last_drafted_K + K_STEP_MAX)
        return K

    def update(self, event):
        pass


POLICIES = ("fixed", "heuristic", "auto")


def make_policy(K, K_max=8):
    """K: an int >= 1 (fixed), "heuristic" or "auto"; K_max bounds the last two. One-line errors."""
    if isinstance(K_max, bool) or not isinstance(K_max, (int, np.integer)) or K_max < 1:
        raise ValueError(f"K_max must be an integer >= 1, got {K_max!r}")
    if K == "heuristic":
        return HeuristicK(int(K_max))
    if K == "auto":
        return AutoK(int(K_max))
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K (draft tokens per round) must be an integer >= 1, 'heuristic' or 'auto', got {K!r}")
    return FixedK(int(K))
