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
exact for the same reason, and the tests enumerate them with scripted clocks. (Simulated against
a cost model over many coin seeds: teach/policy_simulation.py.)
"""
import math
from dataclasses import dataclass, field
from itertools import accumulate
from statistics import median

import numpy as np

from .theory import expected_speedups_under_belief, expected_tokens_under_belief, predicted_speedups

HEURISTIC_START = 5        # Hugging Face's num_assistant_tokens default
ALPHA_PRIOR = (1.5, 1.0)   # auto: the Beta(a, b) belief about alpha before any position is examined: mean 0.6,
                           # worth 2.5 positions (a uniform start sizes the first rounds too short at alpha 1)
TIMING_MARGIN = 2.0        # auto: time one plain call unless the plan's best speedup is this or more (a guessed
                           # v would have to be ~2x too low for plain decoding to win after all) ...
CLOCK_AGREEMENT = 1.3      # ... or the drafter's clock agrees with the guess: its seconds per drafted token
                           # over its c_prior give a one-token target call within this factor of the guessed one
EXPLORE_PRICE = 3.0        # auto: draft against the belief only if the optimistic plan gains more than this
                           # many times what the belief expects the round to lose ...
PATIENCE = 3.0             # ... a price divided by 1 + (plain rounds waited) / PATIENCE, so that bad luck
                           # early costs a few plain rounds, never the run (simulated: price 3 and patience 3
                           # trade alpha 0.3 under Haswell against lock-outs at 0.6-0.8; teach/policy_simulation)
STALE_CALLS = 16           # auto: where the plan is within MARGINAL of plain decoding, a one-token call last timed
MARGINAL = 0.4             # this many target calls ago is timed again (one plain round): v(M) is a ratio of two
                           # medians, and a shared machine's speed drifts by 10-40 % within a minute (measured at
                           # 1558M: one-token calls 0.28 s, then 0.39 s, then 0.28 s); a denominator timed in the
                           # slow minute and never again made v(2) look like 1.0 and K = 1 like a 5 % gain at
                           # alpha 0.3 for the rest of the run. Where drafting clearly pays, or clearly does not,
                           # a stale v cannot change the answer, and no round is spent on it
SHAPE_MARGIN = 0.2         # auto: where the target read its cost shape, a one-token call is timed once the plan's best
                           # drafting round is within this of plain decoding: until then the shape's guess stands, and
                           # one reading of a block a size reads up to a fifth low (cost_probe.py, PERFORMANCE.md)
FIRST_ROUND_RISK = 1.0     # auto: the first round drafts at most the K whose round, if its first draft fails,
                           # costs this many one-token calls more than a plain step (K c + v(K + 1) - 1)
PERFECT_DRAFT = 0.2        # auto: the prior weight, beside the Beta belief, of a draft that is never rejected
                           # (alpha = 1: the target drafting for itself, text the draft knows by heart): each
                           # position accepted raises it, the first rejection ends it, so a run at alpha 1 plays
                           # its longest rounds from the second round on (a Beta climbs there in five; in 40
                           # tokens that was a tenth of the run: PERFORMANCE.md, "A draft that is never rejected")
V_PRIOR_JUMP, V_PRIOR_SLOPE = 0.3, 0.08  # auto: v(M) = 1.3 + 0.08 (M - 2) for M >= 2 until measured (a run
                                         # whose target reads its cost curve's shape before it starts uses that)
PROBE_SHARE = 0.01         # auto: the cost shape is read in at most this share of a plain run's time (n_tokens
                           # one-token passes; a run at alpha 1 takes a fifth of that): at 1558M one reading of each
                           # size at 40 tokens, three at 100; at 355M none under 62, at 124M none under 123 (a model
                           # remembers what it read: the next run of the process pays nothing)
READ_PROMPT = False        # auto: read the prompt's overlaps before the first round (5.)? Off: the read makes the
                           # target's prefill a call of its own (about one one-token call more), and with a run that
                           # finds alpha = 1 by itself (6.) that pass is worth more than what the read tells: in
                           # lockstep A/B runs at 1558M it won and lost by turns (PERFORMANCE.md, "The prompt, read
                           # before the first round", "A draft that is never rejected"); the bench's --policy-read
                           # measures it
PROMPT_POSITIONS = 16      # auto: the overlaps beta read at the prompt's last positions before the first round (both
PROMPT_WEIGHT = 0.5        # models' prefill, their logits kept for these rows), each worth this many examined
                           # positions: on the bundled pair a Shakespeare prompt's 16 positions predicted a 100-token
                           # run's alpha with 1.46x (greedy) and 1.35x (T 1) the error of the run's own first 16:
                           # half a position's worth each; on TinyStories prompts, where the run drifts toward the
                           # pair's Shakespeare, as well as those 16 did (python tools/prompt_overlap.py)
SHAPE_WEIGHT = 0.05        # auto: how firmly the probed shape's scale stays 1 (shape_scale): the weight of about
                           # two timed sizes 0.15 above one-row cost, so that one noisy reading cannot tilt it
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
    n_calls: int = 0                               # target calls timed so far
    last_timed: dict = field(default_factory=dict)  # tokens per call -> n_calls when that size was last timed
    owed: int = 0                                  # tokens plain rounds emitted since the last drafting round:
                                                   # what a draft model feeds, in one call, before it drafts again
    tokens_left: int | None = None                 # tokens the run still wants (None: unknown)
    v_shape: dict | None = None                    # M -> v(M) of one block, read before the run (the target's
                                                   # row_cost_shape, model/cost_probe.py), or None
    prompt_overlaps: list = field(default_factory=list)  # beta at the prompt's last positions, read before the
                                                   # run (speculative.read_prompt), each worth PROMPT_WEIGHT

    def add_target_call(self, n_seq, seconds):
        """One timed target call of n_seq tokens (only the latest WINDOW of each size are kept)."""
        keep(self.target_durations.setdefault(n_seq, []), seconds)
        self.n_calls += 1
        self.last_timed[n_seq] = self.n_calls

    def add_draft_cost(self, seconds_per_token):
        """One drafting round's wall seconds per drafted token; draft_cost becomes their median."""
        keep(self.draft_costs, seconds_per_token)
        self.draft_cost = median(self.draft_costs)


def alpha_belief(past):
    """The Beta(a, b) belief about alpha: ALPHA_PRIOR, plus every examined position's beta (a + beta, b + 1 - beta),
    plus the prompt's positions read before the run at PROMPT_WEIGHT each.

    >>> past = Measurements(overlaps=[1.0, 0.0, 1.0], prompt_overlaps=[1.0, 1.0, 0.5, 0.5])
    >>> alpha_belief(past)  # 1.5 + 2 + 0.5 * 3, 1.0 + 1 + 0.5 * 1
    (5.0, 2.5)
    """
    seen, prompt = sum(past.overlaps), sum(past.prompt_overlaps)
    return (ALPHA_PRIOR[0] + seen + PROMPT_WEIGHT * prompt,
            ALPHA_PRIOR[1] + len(past.overlaps) - seen + PROMPT_WEIGHT * (len(past.prompt_overlaps) - prompt))


def perfect_draft_weight(past):
    """The belief's weight on a draft that is never rejected (alpha = 1) beside the Beta's alphas:
    PERFECT_DRAFT before any position is seen; 0 once a position examined or read had beta < 1;
    otherwise, after n positions each accepted (the prompt's at PROMPT_WEIGHT each), Bayes' rule with
    likelihood 1 under alpha = 1 and the Beta prior's marginal B(a0 + n, b0) / B(a0, b0) under the rest.

    >>> [round(perfect_draft_weight(Measurements(overlaps=[1.0] * n)), 3) for n in (0, 4, 16)]
    [0.2, 0.478, 0.745]
    >>> perfect_draft_weight(Measurements(overlaps=[1.0, 1.0, 0.0, 1.0]))
    0.0
    """
    seen = list(past.overlaps) + list(past.prompt_overlaps)
    if any(beta < 1.0 - 1e-6 for beta in seen):
        return 0.0
    n, (a0, b0) = len(past.overlaps) + PROMPT_WEIGHT * len(past.prompt_overlaps), ALPHA_PRIOR
    marginal = math.exp(math.lgamma(a0 + n) - math.lgamma(a0) + math.lgamma(a0 + b0) - math.lgamma(a0 + b0 + n))
    return PERFECT_DRAFT / (PERFECT_DRAFT + (1.0 - PERFECT_DRAFT) * marginal)


def with_perfect_draft(w, speedups_otherwise, speedups_if_perfect):  # [K_max + 1], [K_max + 1] -> [K_max + 1]
    """The plan's speedup for K = 0..K_max when a draft that is never rejected has weight w: what a run
    costs adds up over the two hypotheses, so the speedups mix harmonically, 1 / (w / s_perfect + (1 - w) / s).

    >>> [round(s, 3) for s in with_perfect_draft(0.5, [1.0, 1.5, 2.0], [1.0, 2.0, 4.0])]
    [1.0, 1.714, 2.667]
    """
    return [1.0 / (w / perfect + (1.0 - w) / otherwise)
            for otherwise, perfect in zip(speedups_otherwise, speedups_if_perfect)]


def perfect_draft_speedups(c, v, K_max, tokens_left=None):  # -> [K_max + 1]
    """Speedup over plain decoding for K = 0..K_max if every draft is accepted: rounds of K + 1 tokens at
    K c + v(K + 1). With tokens_left known, the run's end counts: the rounds that finish it, the last one
    clamped to the tokens left (as the loop clamps it): 40 tokens may prefer 5 rounds of 8 to 4 of 9 and a
    round of 4 where a round of 9 costs a little less a token.

    >>> v = {1: 1.0, 2: 1.2, 3: 1.23, 4: 1.26, 5: 1.29, 6: 1.32, 7: 1.35, 8: 1.38, 9: 1.5}  # a step at 9 rows
    >>> [round(s, 2) for s in perfect_draft_speedups(0.1, v, 8)][7:]  # K = 7, 8: rounds of 8 and 9 tokens
    [3.85, 3.91]
    >>> [round(s, 2) for s in perfect_draft_speedups(0.1, v, 8, tokens_left=40)][7:]  # 5 x 8, or 4 x 9 and 4
    [3.85, 3.72]
    """
    if not tokens_left:
        return predicted_speedups(1.0, c, v, K_max)
    def cost(K):  # one-token calls to finish tokens_left tokens, K drafts a round, the last round clamped
        full, last = divmod(tokens_left, K + 1)
        return full * (K * c + v[K + 1]) + (last and (last - 1) * c + v[last])
    return [tokens_left / cost(K) for K in range(K_max + 1)]


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


def v_curve(target_durations, M_max, shape=None):
    """v(M) = seconds of an M-token target call / a one-token call, for M = 1..M_max.

    A size that was timed gets its own median over t1; t1 is the median one-token call, or, before
    one is timed, the smallest timed size through the guess. Without a shape, a size never timed
    gets a line through the timed sizes of 2 or more tokens (least squares over their medians if
    there are two or more, else the prior slope through the one), or the prior (prior_v_curve) if
    none was timed. The line leaves out M = 1 on purpose: the jump from 1 to 2 tokens is not on it.
    With a shape (v_shape(M), M = 1..M_max: one block's cost curve, read before the run), a size
    never timed gets 1 + s (v_shape(M) - 1), s fitted to the timed sizes (shape_scale): the curve's
    steps and flats where they are, at the height the pass's own calls read.
    Returns {M: v(M)}; v(1) = 1, and v >= 1 throughout.

    >>> shape = {1: 1.0, 2: 1.1, 3: 1.1, 4: 1.2, 5: 1.6}        # flat from 2 to 3 rows, a step at 5
    >>> round(v_curve({1: [1.0], 2: [1.2], 3: [1.2]}, 5, shape)[5], 2)  # a line through 2 and 3: 1.2
    1.77
    """
    guess = prior_v_curve(M_max) if shape is None else {M: shape[M] for M in range(1, M_max + 1)}
    medians = {m: median(d) for m, d in target_durations.items() if d and m <= M_max}
    if not medians:
        return {M: max(1.0, float(x)) for M, x in guess.items()}
    t1 = medians[1] if 1 in medians else medians[min(medians)] / guess[min(medians)]
    measured = {m: t / t1 for m, t in medians.items()}
    multi = sorted(m for m in measured if m >= 2)
    if shape is not None:
        scale = shape_scale(measured, shape)
        line = lambda M: 1 + scale * (shape[M] - 1)  # noqa: E731
    elif len(multi) >= 2:
        vs = [measured[m] for m in multi]
        slope = max(least_squares_slope(multi, vs), 0.0)  # a call never gets cheaper with more tokens
        line = lambda M: sum(vs) / len(vs) + slope * (M - sum(multi) / len(multi))  # noqa: E731
    elif multi:
        line = lambda M: measured[multi[0]] + V_PRIOR_SLOPE * (M - multi[0])  # noqa: E731
    else:
        line = lambda M: guess[M]  # noqa: E731
    return {M: 1.0 if M == 1 else max(1.0, float(measured[M] if M in measured else line(M)))
            for M in range(1, M_max + 1)}


def shape_scale(measured, shape):
    """s such that v(M) - 1 = s (v_shape(M) - 1) at the timed sizes of 2 or more tokens: least squares
    through the origin, pulled toward 1 by SHAPE_WEIGHT (the probe's own word), within [0.5, 2].

    One block is not the whole pass (the head, the embedding, Python), so the pass's curve may rise
    more or less steeply than the block's; its shape, where it is flat and where it steps, is the
    same (PERFORMANCE.md, "The cost curve's shape, read before the run").

    >>> shape = {1: 1.0, 2: 1.2, 3: 1.4}
    >>> shape_scale({}, shape), round(shape_scale({2: 1.4, 3: 1.8}, shape), 3)
    (1.0, 1.8)
    """
    pairs = [(measured[m] - 1, shape[m] - 1) for m in measured if m >= 2 and m in shape]
    fit = (sum(x * y for x, y in pairs) + SHAPE_WEIGHT) / (sum(y * y for _, y in pairs) + SHAPE_WEIGHT)
    return min(2.0, max(0.5, fit))


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
    """Each round, K in 0..K_max from a belief about alpha and the measured costs (a Bayes-UCB rule).

    Belief: alpha ~ Beta(a, b), with a = a0 + sum(beta) and b = b0 + sum(1 - beta) over every
    position examined so far (beta = sum_x min(p, q), the position's chance of acceptance;
    ALPHA_PRIOR = (a0, b0)), and the prompt's last positions read before the run (5.: alpha_belief).
    Costs: c = the drafter's wall seconds per drafted token (median of the latest WINDOW drafting
    rounds; its c_prior until it has drafted) / a one-token target call;
    v = each timed call size's median over a one-token call (v_curve; the prior for sizes never timed).

    1. Draft or not: draft if some K >= 1 beats plain decoding at an optimistic alpha, the belief's
       mean + sqrt(ln(t + 1)) standard deviations in round t, and what it gains there is more than
       EXPLORE_PRICE times what the belief expects it to lose (nothing, where the belief itself
       says drafting pays), a price that falls with every plain round waited (PATIENCE). Plain
       rounds examine no position, so they leave the belief as it is while t grows and the price
       falls: after bad luck the policy tries once more within a few rounds. It
       never locks drafting out; the cheaper the draft, the lower the alpha at which drafting
       pays, and the sooner (and more cheaply) it tries. Where a try costs much against what it
       could find (alpha 0.3 under a steep v), the price keeps it from probing round after round.
       Every drafting round's cost includes its share of the draft model's catch-up (past.owed: the
       tokens of the plain rounds since it last drafted, which its first call feeds; catch_up_cost,
       spread over past.tokens_left by with_catch_up, as BatchAutoK does for a batch): with a costly
       draft (124M for 355M, c 0.35) a try after 20-30 plain rounds costs about a plain round more.
    2. How many: the K >= 1 with the best speedup averaged over the whole belief
       (theory.expected_speedups_under_belief), not at the optimistic alpha: explore with short
       rounds, exploit with long ones. The first round, blind, drafts at most the K whose failure
       at its first draft costs FIRST_ROUND_RISK one-token calls (4 drafts at c 0.09 on the prior's
       curve, 8 at c 0).
    3. Timing: until a plain target call is timed, v is relative to a guess (the first timed size
       through the prior). Where the plan's best predicted speedup is below TIMING_MARGIN that
       guess could decide 1, so one round is plain (one call, one token) to measure it, unless the
       drafter's own clock vouches for the guess: a model drafter's c_prior is its share of a
       target call (the ratio of parameters), so its measured seconds per token over c_prior are
       a one-token target call, and where they agree with the guess to CLOCK_AGREEMENT, the
       guess holds (a kernel without a few-row path, v twice the prior, disagrees by 2x). Where
       the target read its cost shape (4.), the guess is the shape's, and a plain round times it
       once the best drafting round is planned within SHAPE_MARGIN of plain decoding. Later,
       where the best drafting round is planned within MARGINAL of plain decoding, a one-token
       call last timed STALE_CALLS calls ago is timed again: the machine's speed drifts.
    4. The curve's shape: a size never timed is priced from a line through the timed ones, unless
       the target read the shape of its curve before the run (past.v_shape, asked for by
       cost_sizes: the loop calls the target's row_cost_shape(cost_sizes, passes) where it has one,
       granting PROBE_SHARE of the run's plain passes: a quarter of a pass at 1558M and 40 tokens,
       0.9 at 100; a model remembers the shape it read). Then it follows that shape, scaled to the
       sizes timed (v_curve): a curve flat from 2 to 6 rows and stepping at 7 and 9 is priced so
       before K = 5 is ever played, where a line through the 3 and 4 rows a run reads prices 6 rows
       11 % high.
    5. The prompt (where READ_PROMPT is set; off by default): before the first round, where the drafter
       offers its distributions over the prompt
       (prompt_distributions: a draft model's, from its own prefill), the loop keeps both models' logits
       at the prompt's last PROMPT_POSITIONS positions and gives beta there (past.prompt_overlaps, asked for
       by prompt_positions: speculative.read_prompt). Each counts PROMPT_WEIGHT of a position examined in
       the run (a prompt is not the text the target writes), so the first round is no longer blind: with
       any such positions read it is not capped (2.), and at alpha 0.3 auto need not draft to find out.
    6. A draft that is never rejected: beside the Beta, the belief gives alpha = 1 a weight
       (perfect_draft_weight: PERFECT_DRAFT at first, rising with each position accepted, 0 after the
       first rejection), and the plan (2.) and the optimistic alpha's (1.) mix the speedups of the two
       (with_perfect_draft: the costs add up), a perfect draft's counting the rounds that finish the run
       (perfect_draft_speedups). A Beta's mean after 5 accepted positions is 0.87 and plans 5-6 drafts;
       alpha = 1 then weighs 0.52 and the plan is the longest round that pays. The target drafting for
       itself, or a draft that knows the text, is found in a round; a single rejection leaves the Beta
       as before. (The Bayes-optimal policy over a prior on alpha, the simulator's bound, meets issue
       26's 40-token goals only with weight on alpha = 1 or information before the first round.)

    Deterministic: K is a function of the past alone (the round count and the plain rounds waited
    included), as exactness needs.
    """

    def __init__(self, K_max=8):
        self.K_max, self.name = K_max, "auto"
        self.cost_sizes = K_max + 1  # 4. the call sizes whose cost shape it plans with (1..K_max + 1 tokens)
        self.prompt_positions = PROMPT_POSITIONS if READ_PROMPT else 0  # 5. the prompt positions it asks for
        self.reset()

    def reset(self):
        self.t, self.waited = 0, 0  # rounds so far; plain rounds since the last that drafted

    def estimates(self, past):
        """((a, b), c, v): the Beta belief about alpha, and the costs the policy plans with now."""
        belief = alpha_belief(past)
        v = v_curve(past.target_durations, self.K_max + 1, past.v_shape)
        t1 = t1_estimate(past.target_durations, v)
        c = past.c_prior if past.draft_cost is None or not t1 else past.draft_cost / t1
        return belief, c, v

    def choose(self, past):
        self.t += 1
        (a, b), c, v = self.estimates(past)
        w = perfect_draft_weight(past)                                   # 6. alpha = 1's weight
        debt = catch_up_cost(c, v, past.owed)                            # 0 while the draft is caught up
        v_planned = with_catch_up(v, debt, expected_tokens_under_belief(a, b, self.K_max), past.tokens_left) \
            if debt else v
        planned = with_perfect_draft(w, expected_speedups_under_belief(a, b, c, v_planned, self.K_max),
                                     perfect_draft_speedups(c, v_planned, self.K_max, past.tokens_left))
        best_drafting = max(planned[1:])
        if needs_timing(past, c, max(planned), best_drafting) or stale_one_token_call(past, best_drafting):
            return 0                                                     # 3. time one plain call
        alpha = optimistic_alpha(a, b, self.t)
        v_hoped = with_catch_up(v, debt, list(accumulate(alpha ** K for K in range(self.K_max + 1))),
                                past.tokens_left) if debt else v
        optimistic = max(with_perfect_draft(w, predicted_speedups(alpha, c, v_hoped, self.K_max),
                                            perfect_draft_speedups(c, v_hoped, self.K_max, past.tokens_left))[1:])
        price = EXPLORE_PRICE * (1.0 - max(planned[1:])) / (1 + self.waited / PATIENCE)
        if optimistic - 1.0 <= max(0.0, price):
            self.waited += 1
            return 0                                                     # 1. plain wins, or a try costs too much
        self.waited = 0
        longest = self.K_max if past.overlaps or past.prompt_overlaps else first_round_cap(c, v, self.K_max)
        return max(range(1, longest + 1), key=planned.__getitem__)      # 2. the first maximum: fewest drafts

    def update(self, event):
        pass


def catch_up_cost(c, v, owed):
    """What a drafting round now owes beyond its usual first draft call, in one-token target calls: the
    draft model's first call feeds the `owed` tokens of the plain rounds since it last drafted, plus
    one, at c a one-row call and the target's curve for more rows (past it, the prior's slope: a
    catch-up of 30 rows costs a 124M draft ~3.5 one-row calls under SkylakeX). A drafter without a
    model (prompt lookup: c ~ 0) owes ~nothing.

    >>> v = prior_v_curve(9)
    >>> catch_up_cost(0.3, v, 0), round(catch_up_cost(0.3, v, 4), 3), round(catch_up_cost(0.3, v, 29), 3)
    (0.0, 0.162, 0.762)
    """
    if owed <= 0:
        return 0.0
    rows, top = owed + 1, max(v)
    return c * ((v[rows] if rows in v else v[top] + V_PRIOR_SLOPE * (rows - top)) - 1.0)


def with_catch_up(v, debt, tokens, tokens_left):  # -> {M: v(M)} with each drafting round's share of the debt
    """v(K + 1) plus the share of a catch-up (`debt` one-token calls, paid once) that a round of K drafts
    bears: the debt spread over the rounds that tokens_left tokens take at tokens[K] a round (all of it
    on one round where tokens_left is None, or fewer tokens are left than a round emits), as BatchAutoK
    spreads a batch's. So a long run starts drafting for a gain it will recover, a run nearly over
    does not, and a try after a stretch of plain rounds is priced at what it costs. v(1), plain, owes nothing.

    >>> with_catch_up({1: 1.0, 2: 1.3}, 0.6, [1.0, 1.5], 15)
    {1: 1.0, 2: 1.36}
    """
    def share(K):
        return debt * min(1.0, tokens[K] / tokens_left) if tokens_left else debt
    return {M: x if M == 1 else x + share(M - 1) for M, x in v.items()}


def needs_timing(past, c, best_planned, best_drafting):
    """Whether a plain round must time a one-token call before the plan can be trusted (AutoK, 3.):
    calls were timed but none of one token, and
    - where the target read its cost shape (past.v_shape), the guess is that shape's (v_curve), and the
      plan's best drafting round is within SHAPE_MARGIN of plain decoding: one reading of one block a
      size can be a fifth low, and that could decide (a 3-row call timed at 0.42 s over a shape's v(3)
      of 1.30 guessed a one-token call at 0.32 s against the true 0.27, and auto drafted K = 2 at
      alpha 0.3 under Haswell for 18 rounds);
    - otherwise, the guess is the prior's, the plan's best is under TIMING_MARGIN, and the drafter's
      clock does not vouch for the guessed one-token call (c / c_prior off by more than
      CLOCK_AGREEMENT; c here is the drafter's seconds per token over the guessed call).

    >>> shaped = Measurements(target_durations={3: [0.42]}, v_shape={1: 1.0, 2: 1.2, 3: 1.3})
    >>> needs_timing(shaped, 0.09, 1.1, 1.1), needs_timing(shaped, 0.09, 1.5, 1.5)
    (True, False)
    """
    if not past.target_durations or 1 in past.target_durations:
        return False
    if past.v_shape is not None:
        return abs(best_drafting - 1.0) <= SHAPE_MARGIN
    if best_planned >= TIMING_MARGIN:
        return False
    vouched = past.c_prior > 0 and past.draft_cost is not None and \
        1 / CLOCK_AGREEMENT <= c / past.c_prior <= CLOCK_AGREEMENT
    return not vouched


def stale_one_token_call(past, best_drafting):
    """Whether the one-token call that every v(M) is measured against was last timed STALE_CALLS or
    more target calls ago while the plan's best drafting round is within MARGINAL of plain decoding
    (AutoK, 3.): there a drift of the machine's speed since then could decide.

    >>> past = Measurements()
    >>> past.add_target_call(1, 1.0)
    >>> for _ in range(STALE_CALLS): past.add_target_call(2, 1.2)
    >>> stale_one_token_call(past, 1.05), stale_one_token_call(past, 1.5)
    (True, False)
    """
    if 1 not in past.last_timed or past.n_calls - past.last_timed[1] < STALE_CALLS:
        return False
    return abs(best_drafting - 1.0) <= MARGINAL


def first_round_cap(c, v, K_max):
    """The most drafts of a first round: the largest K with K c + v(K + 1) - 1 <= FIRST_ROUND_RISK
    (what the round costs beyond a plain step if its first draft fails), at least 1.

    >>> v = prior_v_curve(9)
    >>> first_round_cap(0.09, v, 8), first_round_cap(0.0, v, 8), first_round_cap(0.3, v, 8)
    (4, 8, 2)
    """
    return max([1] + [K for K in range(1, K_max + 1) if K * c + v[K + 1] - 1 <= FIRST_ROUND_RISK])


def beta_mean_var(a, b):  # -> (mean, variance)
    """The Beta(a, b) belief's mean and variance (optimistic_alpha's, tree_policy.scaled_up's).

    >>> beta_mean_var(3.0, 1.0)
    (0.75, 0.0375)
    """
    return a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))


def optimistic_alpha(a, b, t):
    """The Beta(a, b) belief's mean plus sqrt(ln(t + 1)) standard deviations, at most 1.

    >>> round(optimistic_alpha(1.5, 1.0, 1), 3), round(optimistic_alpha(30.0, 70.0, 1), 3)
    (0.818, 0.338)
    """
    mean, var = beta_mean_var(a, b)
    return min(1.0, mean + math.sqrt(math.log(t + 1) * var))


POLICIES = ("fixed", "heuristic", "auto")


K_MAX_LIMIT = 32  # the most any K policy may draft a round: past it a round's drafts pay nothing (alpha 0.95
                  # leaves 0.95^32 = 19 % for the 33rd), and AutoK's prior curve and tree="auto"'s shapes are
                  # built per K up to K_max (a K_max of 10^12 hung the first, and ran the second out of memory)


def checked_K_max(K_max):  # -> int(K_max)
    """K_max as an int, or the one-line error every policy that takes one gives (make_policy, tree="auto",
    the batches'): 2.5, "8", None or True would otherwise fail deep in a policy, or count as 1.

    >>> checked_K_max(8), checked_K_max(K_MAX_LIMIT)
    (8, 32)
    """
    if isinstance(K_max, bool) or not isinstance(K_max, (int, np.integer)) or not 1 <= K_max <= K_MAX_LIMIT:
        raise ValueError(f"K_max must be an integer from 1 to {K_MAX_LIMIT}, got {K_max!r}")
    return int(K_max)


def make_policy(K, K_max=8):
    """K: an int >= 1 (fixed), "heuristic" or "auto"; K_max bounds the last two. One-line errors."""
    K_max = checked_K_max(K_max)
    if K == "heuristic":
        return HeuristicK(int(K_max))
    if K == "auto":
        return AutoK(int(K_max))
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K (draft tokens per round) must be an integer >= 1, 'heuristic' or 'auto', got {K!r}")
    return FixedK(int(K))
