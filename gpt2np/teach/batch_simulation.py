"""K for a batch (decoding/batch_policy.BatchAutoK) against scripted costs: many coin seeds in seconds.

A batch of B sequences, each a prompt of prompt_len tokens and n_tokens to decode, run the way
decoding/batched_speculative.py runs them, but with lengths for caches and a clock for models:

  * every sequence keeps its context length, its target cache's and its draft cache's; a draft
    step feeds each drafting sequence what its draft cache lacks (its whole prompt and every token
    since, the first time), and the target round feeds each sequence its new token and its drafts;
  * coins: sequence i's draft at a position is accepted with probability alpha (one generator per
    seed), so a round accepts each sequence's drafts up to its first failed coin; the policy sees
    each examined position's overlap as 1 or 0 (accepted or not), as the bench's greedy forced
    drafts give it (a belief learned from coins, not from alpha itself);
  * costs, in seconds: a target round over M rows in all takes target_seconds(M), a draft call
    over M rows c x target_seconds(M); the policy sees them, times a timing noise (a shared
    machine's readings: log-normal, or --noise spiky, the one-sided spikes measured at 1558M, SPIKES),
    and the run counts them without it.

The policy is told what the real loop tells it (the round's B, the rows the draft caches lack,
the tokens still wanted), so a run here replays its decisions exactly. Plain decoding's seconds:
a prefill round over the prompts, then n_tokens - 1 rounds of B rows.

>>> costs = row_costs(v2=1.25, v16=2.3)
>>> seconds, Ks = simulate(FixedBatchK(0), B=4, prompt_len=8, n_tokens=5, alpha=0.8, target_seconds=costs, c=0.3)
>>> Ks, round(seconds / plain_seconds(4, 8, 5, costs), 6)  # K = 0 every round is plain decoding
([0, 0, 0, 0, 0], 1.0)

`python -m gpt2np.teach.batch_simulation` prints BatchAutoK against the best fixed K (plain
decoding included) for a 124M draft of a 355M target (c 0.35) and of a 1558M target (c 0.09),
on cost curves shaped like the Xeon's under SkylakeX and under Haswell, for the 1558M target on
the Zen 4 EPYC's measured curve in panels (EPYC_PANELS: past 16 rows it jumps, which a line from
v(2) to v(16) and a tenth of a row after it misses: a prompt's round that also drafts costs there
what the lines call cheap) and on an Intel Xeon's (XEON_PANELS: 2 rows cost what 1 does, then a step every
two rows, where a line through the timed sizes prices an untimed 2 rows too high), and for the bundled pair
on a flat curve (FLAT: a target whose weights are all small, which BatchAutoK is told, few_rows=None),
B 1-8, alpha 0.5 / 0.8, 32 tokens after 16 (--tokens N: N): the median and the 10th percentile over the
seeds of auto's seconds over the best fixed K's median seconds (above 1: auto is faster); --noise spiky gives the
readings the one-sided spikes measured (SPIKES) in place of log-normal noise. With --bound, for one
sequence, what the Bayes-optimal policy for a prior over alpha gets (expected_seconds): what any policy
that must learn alpha in a run of that length can hope for (solved a level of tokens left at a time: the
whole --bound --tokens 100 table in about 15 seconds, where the recursion, expected_seconds_reference,
took over 15 minutes for its first six rows; the table grows as tokens^3 x (prompt + tokens), so --bound
takes at most MAX_BOUND_TOKENS = 200 tokens: some ten times the 100 tokens' work).
"""
import argparse
import math
from functools import lru_cache

import numpy as np

from ..decoding.batch_policy import FEW_ROWS, BatchAutoK
from ..model.fast.matmul import PANEL_PADDED_ROWS
from ..report import OneLineErrorParser

CURVES = {  # (v(2), v(16)) of a target round's seconds over M rows against one row, shaped like the Xeon's
    "SkylakeX": (1.25, 2.3),  # 355M / 1558M under SkylakeX: v(2) 1.23-1.25, v(16) 2.2-2.5
    "Haswell": (1.5, 3.3),    # under Haswell: v(2) 1.48-1.52, v(16) 3.3-3.9 (13-16 rows padded)
}
PAIRS = {"124M -> 355M": 0.35, "124M -> 1558M": 0.09}  # the draft's cost c, its share of a target call
EPYC_PANELS = {1: 1.0, 2: 1.05, 5: 1.05, 8: 1.14, 12: 1.32, 16: 1.61, 17: 2.14, 20: 3.09, 21: 3.35, 24: 3.41, 32: 4.09,
               48: 5.38, 64: 6.80}  # v(M) of random 1558M in panels under SkylakeX (the Zen 4 EPYC, 8 cached positions,
               # 5 alternated passes a size, session 48): flat to 8 rows, then past 16 each panel an sgemm over every
               # row, a jump the lines above do not have (17 rows 0.53 one-row passes over 16, 21 rows 1.74)
XEON_PANELS = {1: 1.0, 2: 1.0, 3: 1.2, 4: 1.2, 5: 1.33, 6: 1.33, 8: 1.44, 12: 1.66, 16: 1.89, 17: 2.31, 20: 2.55,
               24: 2.61, 32: 2.75, 40: 3.07}  # v(M) of random 1558M in panels under SkylakeX on an Intel Xeon
               # (family 6, model 207, session 71; 64 cached positions, 4-5 alternated passes a size, two runs read
               # together): 2 rows cost what 1 does (panels run 1 row as 2), then a step every two rows (3-4:
               # 1.14-1.26, 5-6: 1.20-1.35; one layer's products alone 1.19 and 1.39), which the lines above and
               # EPYC_PANELS (flat to 8 rows) do not have
FLAT = {"v2": 1.1, "v16": 1.5, "tail": 0.03}  # row_costs' for a target whose weights are all small, as the bundled
                     # 2.6M: rows nearly free past 16 too (measured, rounds of 8 sequences: T(16), T(24), T(40) =
                     # 1.09, 1.23, 1.46 T(8); this curve's 1.18, 1.37, 1.75, a little steeper). few_rows=None
SMALL_PAIRS = {"260K -> 2.6M": 0.14}  # the bundled pair (c 0.14-0.16 in main.py's statistics)
SPIKES = {"core": 0.035, "spikes": ((0.25, 0.08), (0.03, 0.45))}  # one reading's log over its round's median, as
    # measured (462 rounds of 4 sequences, K = 1 and 2, 124M -> 1558M, the Zen 4 EPYC, session 51): a core of
    # N(0, 0.035), and with probability 0.25 a slow spike of Exp(mean 0.08), with 0.03 a heavy one of Exp(0.45).
    # Measured quantiles of the log: 1 %: -0.13, 10 %: -0.05, 90 %: +0.12, 95 %: +0.19, 99 %: +0.57 (this model:
    # -0.08, -0.04, +0.10, +0.18, +0.54). One-sided: a reading is late far more often than early.


def row_costs(v2, v16, t1=0.28, tail=0.12):  # -> M -> seconds of a target round over M rows
    """v(1) = 1, v(M) on the line from v(2) to v(16), then `tail` one-row rounds for every row past 16."""
    def target_seconds(M):
        v = 1.0 if M == 1 else v2 + (min(M, FEW_ROWS) - 2) * (v16 - v2) / (FEW_ROWS - 2)
        return t1 * (v + tail * max(M - FEW_ROWS, 0))
    return target_seconds


def measured_costs(points, t1=0.28):  # {M: v(M)} -> M -> seconds of a target round over M rows
    """v(M) joined point to point between the measured sizes, carried past the last two by their slope.

    >>> v = measured_costs({1: 1.0, 16: 1.6, 32: 4.0}, t1=1.0)
    >>> [round(v(M), 3) for M in (1, 6, 16, 24, 48)]
    [1.0, 1.2, 1.6, 2.8, 6.4]
    """
    sizes = sorted(points)
    lo, hi = sizes[-2:]  # past the last size: these two sizes' slope

    def target_seconds(M):
        if M <= hi:
            return t1 * float(np.interp(M, sizes, [points[m] for m in sizes]))
        return t1 * (points[hi] + (points[hi] - points[lo]) * (M - hi) / (hi - lo))
    return target_seconds


def spiky(rng):  # -> one reading's log factor over its true seconds
    """A reading as SPIKES measures them: the core's normal, plus at most one slow spike."""
    u, log = rng.random(), rng.normal(0.0, SPIKES["core"])
    for p, mean in SPIKES["spikes"]:
        if u < p:
            return log + rng.exponential(mean)
        u -= p
    return log


def log_noise(noise):  # a log-standard deviation or "spiky" -> rng -> a reading's log factor (None: no noise)
    if noise == "spiky":
        return spiky
    return (lambda rng: rng.normal(0.0, noise)) if noise else None


class FixedBatchK:
    """The same K every round (0: plain decoding)."""

    def __init__(self, K):
        self.K = K

    def choose(self, B, lag=0, horizon=None):
        return self.K

    def update(self, *measured, first_round):
        pass


class Batch:
    """B sequences' lengths as batched_speculative keeps them: context, target cache, draft cache."""

    def __init__(self, B, prompt_len, n_tokens):
        self.ctx, self.tc, self.dc = [prompt_len] * B, [0] * B, [0] * B
        self.left = [n_tokens] * B

    def running(self):
        return [i for i, n in enumerate(self.left) if n > 0]

    def debt(self):  # batched_speculative.draft_debt's numbers: (rows the draft lacks, tokens still wanted)
        run = self.running()
        return (sum(self.ctx[i] - self.dc[i] - 1 for i in run if self.left[i] >= 2),
                sum(self.left[i] for i in run))


def simulate(policy, B, prompt_len, n_tokens, alpha, target_seconds, c, seed=0, noise=0.0):
    """One run: (seconds, [the round's largest k]). noise: the timing noise's log-standard deviation, or
    "spiky" (SPIKES: one-sided, as measured)."""
    batch, coins = Batch(B, prompt_len, n_tokens), np.random.default_rng(seed)
    readings, log = np.random.default_rng([seed, 1]), log_noise(noise)
    seen = (lambda s: s * math.exp(log(readings))) if log else (lambda s: s)
    seconds, Ks = 0.0, []
    while batch.running():
        run = batch.running()
        K = policy.choose(len(run), *batch.debt())
        ks = {i: min(K, batch.left[i] - 1) for i in run}
        calls = []
        for j in range(max(ks.values())):  # draft steps: the first feeds what each draft cache lacks
            rows = sum(batch.ctx[i] - batch.dc[i] if j == 0 else 1 for i in run if ks[i] > j)
            calls.append((rows, c * target_seconds(rows)))
        rows = sum(batch.ctx[i] - batch.tc[i] + ks[i] for i in run)
        overlaps = []
        for i in run:
            accepted = next((n for n in range(ks[i]) if coins.random() >= alpha), ks[i])
            overlaps += [1.0] * accepted + [0.0] * (accepted < ks[i])  # greedy: 1 where the draft passed
            if ks[i]:
                batch.dc[i] = batch.ctx[i] + ks[i] - 1
            batch.ctx[i] += accepted + 1
            batch.left[i] -= accepted + 1
            batch.tc[i], batch.dc[i] = batch.ctx[i] - 1, min(batch.dc[i], batch.ctx[i] - 1)
        policy.update(overlaps, rows, seen(target_seconds(rows)), [(m, seen(s)) for m, s in calls],
                      first_round=not Ks)
        seconds += target_seconds(rows) + sum(s for _, s in calls)
        Ks.append(max(ks.values()))
    return seconds, Ks


def plain_seconds(B, prompt_len, n_tokens, target_seconds):
    return target_seconds(B * prompt_len) + (n_tokens - 1) * target_seconds(B)


def compare(B, alpha, c, target_seconds, seeds, Ks=(0, 1, 2, 4), prompt_len=16, n_tokens=32, noise=0.12,
            policy=lambda c: BatchAutoK(K_max=4, c_prior=c)):
    """{"best": the fixed K with the least median seconds, "ratios": best's median / auto's, per seed}."""
    def seconds(make, seed):
        return simulate(make(), B, prompt_len, n_tokens, alpha, target_seconds, c, seed, noise)[0]
    fixed = {K: np.median([seconds(lambda: FixedBatchK(K), s) for s in seeds]) for K in Ks}
    best = min(fixed, key=fixed.get)
    return {"best": best, "ratios": sorted(fixed[best] / seconds(lambda: policy(c), s) for s in seeds)}


def posterior_table(alphas, prior, g):  # [A], [A] -> [A, g, g]
    """The posterior over `alphas` after s accepted and f rejected positions, for every s, f < g, in logs
    (a long run's alpha^s would underflow); the prior itself where the coins rule every alpha out."""
    alphas, prior = np.asarray(alphas, dtype=float), np.asarray(prior, dtype=float)
    with np.errstate(divide="ignore"):
        log_a, log_b, log_prior = np.log(alphas), np.log(1 - alphas), np.log(prior)  # [A] each (-inf at 0)
    s, f = np.arange(g)[:, None], np.arange(g)[None, :]                            # [g, 1], [1, g]
    with np.errstate(invalid="ignore"):
        log_w = log_prior[:, None, None] + np.where(s > 0, s * log_a[:, None, None], 0.0) \
            + np.where(f > 0, f * log_b[:, None, None], 0.0)                      # [A, g, g] (0 log 0 = 0)
    top = log_w.max(axis=0)                                                       # [g, g]
    w = np.exp(log_w - np.where(np.isfinite(top), top, 0.0))                      # [A, g, g]
    total = w.sum(axis=0)                                                         # [g, g]
    impossible = total == 0                                                       # every alpha ruled out
    return np.where(impossible, (prior / prior.sum())[:, None, None], w / np.where(impossible, 1.0, total))


def expected_seconds(alphas, prior, c, target_seconds, prompt_len, n_tokens, K=None, K_max=4):
    """expected_seconds_reference's expected seconds [len(alphas)], its programme solved a level of tokens
    left at a time, every state of a level as one array.

    After the first round (the prompt's, at n_tokens left) every round feeds the target one row beyond its
    drafts. With N tokens and n left, the positions seen satisfy s + f <= N - n (a rejection ends a round, a
    round emits one token more than it accepts), and the draft's lag is at most prompt_len + N - n - 1 (every
    plain round adds one; a drafting round leaves 0, or 1 where all its drafts passed). So level n's table
    is [A, g, g, L] with g = N - n + 1 and L = prompt_len + N - n. A drafting round's cost depends on the lag
    only through its first draft call and its later seconds not at all (lag 0 or 1 after it), so each K's
    total is that call plus an [A, g, g] table; only plain rounds read the whole of level n - 1, whose
    table holds theirs ([A, g + 1, g + 1, L + 1]). 100 tokens take seconds where the recursion takes minutes.

    >>> costs = row_costs(v2=1.25, v16=2.3)
    >>> fast, slow = (solve([0.3, 0.8, 1.0], [1, 1, 1], 0.35, costs, 4, 14) for solve in (expected_seconds,
    ...                                                                                 expected_seconds_reference))
    >>> float(abs(fast / slow - 1).max()) < 1e-12
    True
    """
    alphas, prior = np.array(alphas, dtype=float), np.array(prior, dtype=float)  # [A], [A]
    A, N, P, T = len(alphas), n_tokens, prompt_len, target_seconds
    a = alphas[:, None, None]                                                     # [A, 1, 1]
    prior_belief = prior / prior.sum()


    def choices(n):
        return [min(K, n - 1)] if K is not None else range(min(K_max, n - 1) + 1)

    def drafted(k, n, g, fed=1):  # -> [A, g, g]: a round of k drafts' seconds after its first draft call
        total = np.full((A, g, g), (k - 1) * c * T(1) + T(fed + k))              # later draft steps, the target
        for j in range(k + 1):  # j drafts accepted: probability alpha^j (1 - alpha), or alpha^k for all
            rejected = j < k
            nxt = later[n - j - 1]                                                # [A, g', g', 2]: lag 0 and 1
            total = total + a ** j * ((1 - a) if rejected else 1) * \
                nxt[:, j:j + g, int(rejected):int(rejected) + g, 0 if rejected else 1]
        return total

    level = np.zeros((A, N + 1, N + 1, P + N + 1))  # the level below, whole (what a plain round reads)
    later = {0: level[..., :2]}                     # level -> its table at lag 0 and 1 (what drafting rounds read)
    first = np.array([c * T(lag + 1) for lag in range(P + N)])                    # [P + N]: a try's first draft call
    for n in range(1, N):                          # every state but the first round's
        g, L = N - n + 1, P + N - n
        w = posterior_table(alphas, prior, g)                                     # [A, g, g]
        plain = T(1) + level[:, :g, :g, 1:L + 1]                                  # [A, g, g, L]: lag + 1 below
        best, best_mean = None, None
        for k in choices(n):
            if k == 0:
                total = plain
                mean = np.einsum("asf,asfl->sfl", w, plain)                        # [g, g, L]
            else:
                rest = drafted(k, n, g)                                           # [A, g, g]
                total = rest[..., None] + first[:L]                               # [A, g, g, L]
                mean = np.einsum("asf,asf->sf", w, rest)[..., None] + first[:L]   # [g, g, L] (w sums to 1)
            if best is None:
                best, best_mean = total, mean
                continue
            better = mean < best_mean - 1e-12                                     # the first minimum: fewest drafts
            best, best_mean = np.where(better, total, best), np.where(better, mean, best_mean)
        level = best                                                              # [A, g, g, L]
        later[n] = level[..., :2].copy()  # a copy: a view would keep every level's whole table alive
    # the first round: n_tokens left, nothing seen, the prompt to feed (P rows) and the draft owing P - 1
    best, best_mean = None, None
    for k in choices(N):
        if k == 0:
            total = T(P) + level[:, 0, 0, P]
        else:
            total = c * T(P) + drafted(k, N, 1, fed=P)[:, 0, 0]
        mean = prior_belief @ total
        if best is None or mean < best_mean - 1e-12:
            best, best_mean = total, mean
    return best


def expected_seconds_reference(alphas, prior, c, target_seconds, prompt_len, n_tokens, K=None, K_max=4):
    """Expected seconds of one sequence (B = 1) at each alpha, run as simulate() runs it (the draft's
    catch-up included) with no timing noise, under a fixed K (K=None: the Bayes-optimal policy for a
    prior over `alphas` only, which knows c, the cost curve and the run's length). [len(alphas)]

    The Bayes-optimal policy is a bound no causal policy beats on average over that prior (dynamic
    programming over the tokens left, the accepted and rejected positions seen, and the rows the
    draft's cache lacks beyond one: every plain round adds one, and a try pays them all in its first
    draft call). Against a fixed K it says what learning alpha must cost in a short run.

    expected_seconds solves the same programme a level of tokens left at a time; this recursion is its
    slow reference (memoised state by state: 100 tokens take minutes).

    >>> costs = row_costs(v2=1.25, v16=2.3)  # v(3) = 1.325: a free draft, alpha 1, K = 2, a one-token prompt:
    >>> [round(float(x / costs(1)), 3) for x in expected_seconds_reference([1.0], [1.0], 0.0, costs, 1, 6, K=2)]
    [2.65]
    """
    alphas, prior = np.array(alphas, dtype=float), np.array(prior, dtype=float)  # [A], [A]
    T = target_seconds

    @lru_cache(maxsize=None)
    def seconds(n, s, f, lag, fed):  # n tokens left, s / f positions accepted / rejected, lag, fed: target rows
        if n == 0:                   # owed beyond the drafts (the prompt in the first round, then 1) -> [A]
            return np.zeros(len(alphas))
        belief = prior * alphas ** s * (1 - alphas) ** f
        belief = belief / belief.sum() if belief.sum() > 0 else prior  # [A] (any, where the coins were impossible)
        best = None
        for k in ([min(K, n - 1)] if K is not None else range(min(K_max, n - 1) + 1)):
            if k == 0:
                total = T(fed) + seconds(n - 1, s, f, lag + 1, 1)
            else:
                total = np.full(len(alphas), c * T(lag + 1) + (k - 1) * c * T(1) + T(fed - 1 + k + 1))
                for j in range(k + 1):  # j drafts accepted: probability alpha^j (1 - alpha), or alpha^k for all
                    p = alphas ** j * ((1 - alphas) if j < k else 1)  # [A]
                    total = total + p * seconds(n - j - 1, s + j, f + (j < k), 1 if j == k else 0, 1)
            if best is None or belief @ total < belief @ best - 1e-12:
                best = total
        return best

    return seconds(n_tokens, 0, 0, prompt_len - 1, prompt_len)


def print_bound(seeds, noise, alphas=(0.3, 0.5, 0.65, 0.8, 1.0), prompt_len=16, n_tokens=32):
    """For one sequence (B = 1) on each curve and pair of the table: the Bayes-optimal policy's expected
    seconds (a uniform prior over `alphas`) and BatchAutoK's mean over the seeds, each against the
    best fixed K's expected seconds (plain decoding included), at alpha 0.5 and 0.8; auto's readings
    carry the timing noise (log-standard deviation `noise`, or "spiky"), the bound's none."""
    print(f"One sequence, {n_tokens} tokens after {prompt_len}: the best fixed K's expected seconds over the "
          f"Bayes-optimal policy's (a uniform prior over alpha in {', '.join(map(str, alphas))}) and over auto's")
    print(f"{'curve':<9} {'pair':<14} {'alpha':>5} {'best':>5} {'Bayes':>6} {'auto':>6}")
    for curve, (v2, v16) in CURVES.items():
        costs = row_costs(v2, v16)
        for pair, c in PAIRS.items():
            optimal = expected_seconds(alphas, [1.0] * len(alphas), c, costs, prompt_len, n_tokens)  # [A]
            for alpha in (0.5, 0.8):
                i = alphas.index(alpha)
                fixed = {K: expected_seconds([alpha], [1.0], c, costs, prompt_len, n_tokens, K=K)[0]
                         for K in (0, 1, 2, 4)}
                best = min(fixed, key=fixed.get)
                auto = np.mean([simulate(BatchAutoK(K_max=4, c_prior=c), 1, prompt_len, n_tokens, alpha, costs, c,
                                         seed, noise)[0] for seed in seeds])
                print(f"{curve:<9} {pair:<14} {alpha:>5} {'K=' + str(best):>5} {fixed[best] / optimal[i]:>6.3f} "
                      f"{fixed[best] / auto:>6.3f}")


MAX_BOUND_TOKENS = 200  # --bound's table: ~N^3 (16 + N) entries a level, about ten times 100 tokens' seconds at 200


MAX_TOKENS = 1000  # --tokens of every simulation: a GPT-2 run's, within its 1024-token context (99999999999 hung)
MAX_NOISE = 3.0  # a log-standard deviation of 3 puts a reading off by 20x either way: above it, noise is all there is


def noise_arg(text):  # --noise: "spiky" or a log-standard deviation from 0 to MAX_NOISE
    if text == "spiky":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_NOISE:  # 1e308 overflowed a reading, 100 made one 0 (ZeroDivisionError)
        raise argparse.ArgumentTypeError(f"must be 'spiky' or a log-standard deviation from 0 to {MAX_NOISE:g} "
                                         f"({MAX_NOISE:g}: readings off by {math.exp(MAX_NOISE):.0f}x either way), "
                                         f"got {text!r}")
    return value


def main(argv=None):
    p = OneLineErrorParser(prog="python -m gpt2np.teach.batch_simulation", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=40, help="coin seeds per cell (default: 40)")
    p.add_argument("--noise", type=noise_arg, default=0.12, help="timing noise: a log-standard deviation (default: "
                   "0.12), or 'spiky' for one-sided spikes as measured at 1558M (SPIKES)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens a sequence (default: 32, the bench's "
                   f"--batch-tokens; a longer run spends a smaller share of itself learning alpha; at most "
                   f"{MAX_TOKENS}, {MAX_BOUND_TOKENS} with --bound)")
    p.add_argument("--bound", action="store_true",
                   help="one sequence: the Bayes-optimal policy and auto against the best fixed K (expected_seconds)")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.tokens < 2:
        p.error(f"--seeds must be at least 1 and --tokens at least 2, got {args.seeds} and {args.tokens}")
    if args.bound and args.tokens > MAX_BOUND_TOKENS:
        p.error(f"--tokens {args.tokens} is too many for --bound: at most {MAX_BOUND_TOKENS} (its table grows as "
                f"tokens^3 x (16 + tokens): {MAX_BOUND_TOKENS} already takes some ten times 100 tokens' seconds)")
    if args.tokens > MAX_TOKENS:
        p.error(f"--tokens {args.tokens} is too many: at most {MAX_TOKENS} (a GPT-2 run's, within its context)")
    seeds = range(args.seeds)
    if args.bound:
        return print_bound(seeds, args.noise, n_tokens=args.tokens)
    print(f"BatchAutoK against the best fixed K (plain decoding is K = 0): the best's median seconds over auto's,"
          f" {args.seeds} seeds, timing noise {args.noise}, {args.tokens} tokens after 16")
    print(f"{'curve':<9} {'pair':<14} {'B':>2} {'alpha':>5} {'best':>5} {'median':>6} {'p10':>6}")
    scenarios = [(kernel, row_costs(v2, v16), PAIRS, FEW_ROWS, None) for kernel, (v2, v16) in CURVES.items()]
    for curve, points in (("panels", EPYC_PANELS), ("xeon", XEON_PANELS)):  # panels pad 1 row to 2, 5 to 6
        scenarios.append((curve, measured_costs(points), {"124M -> 1558M": PAIRS["124M -> 1558M"]}, FEW_ROWS,
                          PANEL_PADDED_ROWS))
    scenarios.append(("flat", row_costs(**FLAT), SMALL_PAIRS, None, None))
    for curve, target_seconds, pairs, few_rows, runs_as in scenarios:
        for pair, c in pairs.items():
            for B in (1, 2, 4, 8):
                for alpha in (0.5, 0.8):
                    r = compare(B, alpha, c, target_seconds, seeds, n_tokens=args.tokens, noise=args.noise,
                                policy=lambda c: BatchAutoK(K_max=4, c_prior=c, few_rows=few_rows, runs_as=runs_as))
                    ratios = r["ratios"]
                    print(f"{curve:<9} {pair:<14} {B:>2} {alpha:>5} {'K=' + str(r['best']):>5} "
                          f"{np.median(ratios):>6.3f} {ratios[len(ratios) // 10]:>6.3f}")


if __name__ == "__main__":
    main()
