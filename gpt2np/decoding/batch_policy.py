"""K for a batch (speculative_generate_batch(..., K="auto")): draft only where the batch's rows pay.

A lone sequence's verification rows are nearly free on a CPU (v(K+1) of 1.3-1.7 for K + 1 = 2-8
rows): the weights are read once whatever the rows. In a batch of B sequences plain decoding already
fills B rows per pass, so K drafts per sequence cost B(K + 1) rows, priced at the margin of the
batch's own pass, not at v(K+1). SmartSpec (Liu et al. 2024, "Optimizing Speculative Decoding for
Serving LLMs Using Goodput") chooses K by the goodput, tokens per second of the whole batch:

    goodput(K) = B E(alpha, K) / (K d(B) + r + T(B (K + 1)) + C min(1, B E(alpha, K) / N))
    goodput(0) = B / T(B)

with E(alpha, K) = 1 + alpha + ... + alpha^K tokens per sequence-round (Leviathan et al.), T(M) the
seconds of a round's target side over M rows in all (the pass, and each sequence's verification,
sampling and roll-back, which on a small model cost what the pass does), d(B) the seconds of one
draft step over B rows, and r and C the draft's catch-up. A draft step feeds each sequence what
its draft cache lacks: one token when it drafted last round (two if all its drafts were accepted),
but its whole prompt and every token since when it has not drafted yet (measured: a 124M pass over
128 rows for 8 sequences of 16 tokens, 171-186 ms, ~2 plain 355M rounds of 8 rows). With D(M) the
seconds of a draft call over M rows and lag the rows owed beyond one per sequence, d(B) = D(B) and
the first step's D(B + lag) splits into what recurs every drafting round, r = D(B + min(lag, B)) - d,
and the rest, C, paid once: it is spread over the rounds that the N tokens the batch still wants
would take at K (at least one round), so a short run, or a batch late in its run, does not start
drafting for a gain it cannot recover. A catch-up of more than a row per sequence is never paid on
the prior alone: until a target round is timed (the first carries the prompts and is not) the batch
decodes plainly, which costs a round or two of drafting's gain where drafting pays, and saves the
catch-up where it does not.

T and D are measured in this run (every packed call's seconds by its rows: policies.v_curve draws a
line through the target's, and a size read fewer than SETTLED times costs no more than a larger timed
one, whose rows it could be padded to (padded_price), and a size never timed whose products run as a timed size's
rows (weights in panels pad 1 row to 2 and 5 to 6) costs what that size reads (twin_price), once a larger size is
timed; the draft's are joined size to size and carried past them by T's shape;
before the draft is timed, D(M) = c_prior T(M)), so the same rule needs no profiling tables: as B
grows, T(B (K + 1)) leaves the flat part of the curve and the best K falls to 0. Where the target's
products take matmul's few-row methods (large weights, streamed from memory: every GPT-2 release),
rows past FEW_ROWS and past every timed size are priced at full cost (each its share of a FEW_ROWS
call: past the few-row methods plain sgemm packs), so a full batch does not pay to learn them, unless
its weights are row-major (not in panels, whose products may jump there) and what reading such a size could save
over the rounds left is worth the round it may lose (price_try: its price lies between the line and full price).
A target whose weights are all small (in the core's cache, plain x @ w past a few rows: the
bundled models, whose passes are mostly per-call work) has no such edge (few_rows=None): its
untimed sizes follow the line through the timed ones, as below FEW_ROWS, and past the curve too (a
catch-up's rows). Priced at full cost, a batch of 8 such sequences never drafted at all (teach/
batch_simulation.py's flat curve, the bundled pair's shape, alpha 0.8: auto 0.768 of the best fixed
K, K = 2; priced by the line 0.915).

As AutoK (policies.py): alpha is a Beta belief from every examined position of every sequence;
drafting at all is decided at an optimistic alpha (mean + sqrt(ln(t + 1)) standard deviations in
round t), so bad luck never locks it out where the belief says drafting pays (the catch-up owed
grows with the rounds waited, but spread over the tokens left it stays a fraction of what a drafted
token saves until the run is nearly over). Where the belief says drafting loses, a try must promise
more than its price (explore_price): the larger of EXPLORE_PRICE times the loss the belief expects
and what a try that finds nothing loses, its whole catch-up paid in one round; the price falls with
every plain round waited (PATIENCE). That rule makes the batch's first try. Once the batch has
drafted, a retry where the belief says drafting loses must be worth what it could teach (retry,
try_value: the best plan after about TRY_ROUNDS rounds' positions, over the rounds the tokens left
would take, against what one try round loses), so a belief that has seen enough, or a run near its
end, stops paying catch-ups for nothing, and a wide belief after a bad start still retries. K at the
belief's average. The plain pass of the batch's B rows is timed by a plain round when nothing else
would time it, read a second time where the plan is within ONE_READING of plain decoding, and read
again STALE_CALLS rounds later where it is within
MARGINAL (the machine's speed drifts), each only while the run wants enough rounds after it to use the
reading (worth_timing). Where the batch's size has changed (a sequence finished) and
the plan clearly pays (by ONE_READING or more), the new size is not timed by a plain round if the
draft's clock vouches for the curve's guess, as AutoK's does for its one-token call: the draft's
B-row calls over c_prior give a B-row target round within CLOCK_AGREEMENT of it (simulated, teach/
batch_simulation.py, 100 seeds: 124M -> 1558M at B = 2-4, alpha 0.8, 0.943-0.954 -> 0.953-0.967
of the best fixed K, the bundled pair's shape at B = 2-8 +0.008-0.021, no cell lower by more than
0.001, with c_prior the true c or off by x0.75 or x1.3; measured, a batch of four falling to one,
124M -> 1558M, alpha 0.8: 1.03x the rule before under either kernel). One K for every running
sequence of a round (their rows share the pass), each clamped to what it still wants. Beside the B sequences it
chooses for, a batch may hold sequences whose K is their own (fixed, or a server's plain requests riding along
with K = 0; continuous_speculative.AutoKForSome tells it their K): their F_rows rows share every pass and their
F_tok tokens count whatever K is, so both goodputs add them, (B E(alpha, K) + F_tok) / (... T(B (K + 1) + F_rows)
...). Counted as B + F drafting sequences (before), their rows were priced as drafts and their tokens as a gain,
which drafts where drafting does not pay (simulated, a closed loop of 1-6 "auto" clients beside 1-6 plain ones,
each finished request replaced, 32 tokens, alpha 0.5-0.95, 124M -> 355M and 1558M curves, 30 seeds, 54 cells:
auto's goodput over the best fixed K's 0.867-1.000, mean 0.981, told nothing; 0.950-1.010, mean 0.996, told).
K is a function of the past only, so every sequence stays exact (tests/decoding/test_batched_speculative.py enumerates
it; tests/decoding/test_batch_policy.py runs the rule against scripted costs).

>>> [BatchAutoK(K_max=4, c_prior=0.1).choose(B) for B in (1, 2, 4, 8, 64)]  # before any timing: the prior's v
[4, 3, 2, 1, 0]
>>> fresh = lambda c: BatchAutoK(K_max=4, c_prior=c)  # nothing timed yet
>>> fresh(0.1).choose(8), fresh(0.1).choose(8, lag=8 * 15, horizon=8 * 32)  # caught up / owing 16-token prompts: wait
(1, 0)
>>> [fresh(0.35).choose(B) for B in (1, 2, 8)]  # a 124M draft for a 355M target: the belief says 8 rows lose
[2, 1, 0]
"""
from functools import cache
from statistics import median

from .policies import (ALPHA_PRIOR, CLOCK_AGREEMENT, EXPLORE_PRICE, MARGINAL, PATIENCE, STALE_CALLS, TIMING_MARGIN,
                       keep, optimistic_alpha, t1_estimate, v_curve)
from .theory import beta_binomial, expected_tokens_per_round, expected_tokens_under_belief

FEW_ROWS = 16  # the rows a pass takes nearly free (model/fast/matmul.py's few-row methods go to 16); past them,
               # rows never timed are priced as if each cost its share of a 16-row pass (measured: a packed 124M
               # pass of 4 sequences, 77 ms at 16 rows, 140 ms at 20), until this run times them


SETTLED = 3  # readings after which a size's own median prices it even above a larger size's (padded_price): a
             # median of three is out of one slow reading's reach
ONE_READING = 0.2  # where the plan's best drafting round is within this of plain decoding, the plain pass is timed a
                   # second time before the plan is trusted: one reading on a shared machine is off by this much
                   # (355M plain rounds of one hour: 41-62 ms around a median of 53)
TRY_ROUNDS = 3  # a retry is judged by what about this many rounds of it would show (try_value): the positions
               # they examine. Simulated (teach/batch_simulation.py's 48 cells, 40 seeds; PERFORMANCE.md, session 70)
               # against the rule before (an optimistic alpha and a price that decays with the rounds waited):
               # at 100 tokens the cells' medians' mean 0.9763 -> 0.978, the lowest 0.945 -> 0.963 (the cells
               # where plain decoding is best: B = 1, alpha 0.5, +0.02); the 32-token table unchanged
PRICE_POINTS = 9  # price_try: an untimed size's seconds read at this many even points from the line to full price
TIMING_ROUNDS = 3  # a plain round is spent timing a size only while the running sequences want more than this many
                   # rounds at the belief's longest (worth_timing): a batch that falls to one sequence with 8 tokens
                   # left timed its new size and then finished in one or two rounds (simulated, 100 seeds, 12 %
                   # noise, teach/batch_simulation.py's cells and this EPYC's 1558M panels curve: mean 0.9555 ->
                   # 0.9577 of the best fixed K, cells +0.020 .. -0.003)


def goodputs(tokens, B, d, T, catch_up=0.0, horizon=None, behind=0.0, fixed=(0, 0.0)):  # tokens[K]: a sequence-round's
    """Tokens per second of the batch for K = 0..len(tokens) - 1 (K = 0: plain batched decoding).
    d: a draft step's seconds; behind (r above): what the first step adds every drafting round (a sequence
    whose drafts were all accepted feeds 2 tokens); catch_up: what it owes once, spread over the
    rounds that `horizon` tokens would take at K (at least one round; None: all on this round).
    fixed: (rows, tokens) a round of the sequences beside the B whose K is chosen (a fixed K of their own, or
    plain ones riding along: a server's): their rows share the pass whatever K is, their tokens count too."""
    rows, extra = fixed

    def owed(K):  # the catch-up's share of one round
        return catch_up * min(1.0, B * tokens[K] / horizon) if horizon else catch_up
    return [(B * tokens[0] + extra) / T(B + rows)] + [
        (B * tokens[K] + extra) / (K * d + behind + T(B * (K + 1) + rows) + owed(K)) for K in range(1, len(tokens))]


def at_full_price(seconds, M, top, few_rows=FEW_ROWS):  # seconds(M), past few_rows and `top` (the largest timed)
    """seconds(M), but never under M rows' share of a few_rows-row call where M is past few_rows and past
    `top`; few_rows None: seconds(M) (a target without few-row methods: BatchAutoK's docstring)."""
    if few_rows is None or M <= max(few_rows, top):
        return seconds(M)
    return max(seconds(M), seconds(few_rows) * M / few_rows)


def padding_caps(durations):  # {rows: [seconds]} -> [(M, least median of the sizes of M rows or more)], M falling
    """For padded_price(): each timed size with the least median over it and every larger timed size.

    >>> padding_caps({2: [1.0], 6: [3.0, 2.8], 8: [1.4]})
    [(8, 1.4), (6, 1.4), (2, 1.0)]
    """
    caps, least = [], float("inf")
    for M in sorted((m for m, s in durations.items() if s), reverse=True):
        least = min(least, median(durations[M]))
        caps.append((M, least))
    return caps


def padded_price(seconds, M, caps):  # seconds of M rows as the curve prices them -> at most any larger timed size's
    """A size not yet SETTLED is priced at most a larger timed size's median: its rows could be padded to that
    size (model/fast/matmul.py's `padded` does so for 13-15 rows under Haswell), so a price above it is more
    likely a reading taken in a slow second (a 6-row round of 1558M read 428 ms twice beside 43 readings of 8
    rows at 262 ms) or a line pulled up by one (4 rows, never timed, priced 290 ms where 5 read 214 ms) than
    the curve falling. Either made the cheaper K look dear, so it was never played, never timed, and never
    corrected (PERFORMANCE.md, "An AMD EPYC of family 26"). A settled size's own median stands: the loop does
    not pad, and some sizes are dearer than larger ones (3 rows of 1558M in panels, 212 ms over 25 readings
    against 4 rows' 192 ms over 26). caps: padding_caps' (M, least seconds at M or more), M falling.

    >>> caps = padding_caps({2: [1.0], 6: [3.0, 2.8], 8: [1.4]})
    >>> [padded_price(s, M, caps) for M, s in ((4, 2.0), (6, 2.9), (7, 1.3), (8, 1.4), (9, 1.6))]
    [1.4, 1.4, 1.3, 1.4, 1.6]
    """
    return min([seconds] + [least for m, least in caps if m > M][-1:])


def twin_price(M, durations, runs_as):  # -> seconds of a timed size whose products run over M's rows, or None
    """Where the target's products pad some sizes to others (runs_as: {rows: the rows they run as}, weights in
    panels: model/fast/matmul.py's PANEL_PADDED_ROWS, 1 row as 2 and 5 as 6), a size never timed costs what a
    timed size run as the same rows reads: the same products, no guess. The line through the timed sizes
    (v_curve) leaves out 1 row and carries its slope down to 2, which a curve that steps prices too high: under
    SkylakeX on an Intel Xeon (family 6, model 207), 1558M in panels, 2 rows cost what 1 does and 3-4 rows
    1.15-1.25 of it, the line priced 2 rows at 1.16-1.22, K = 3 looked the better plan, and K = 1, never played,
    was never timed, so never corrected (PERFORMANCE.md, "A Xeon whose few-row curve steps"). Only once a size
    larger than the twins is timed: before, the sizes above them are the prior curve's (v_curve), dearer than a
    twin's reading, and the first drafting round would try K = 1 where the prior tries more (the batch
    simulator's stepped curve, alpha 0.8, 32 tokens, 200 seeds: 0.961 -> 0.936 of the best fixed K).

    >>> pads = {1: 2, 5: 6}
    >>> twin_price(2, {1: [0.40, 0.38, 0.39], 3: [0.47]}, pads), twin_price(5, {6: [0.53], 8: [0.6]}, pads)
    (0.39, 0.53)
    >>> twin_price(3, {1: [0.39], 4: [0.47]}, pads), twin_price(2, {1: [0.39]}, pads)  # no twin; nothing larger
    (None, None)
    """
    if M in durations or not any(s and runs_as.get(m, m) > runs_as.get(M, M) for m, s in durations.items()):
        return None                                                    # (before a larger size is timed: the prior's)
    twins = [m for m, s in durations.items() if s and runs_as.get(m, m) == runs_as.get(M, M)]
    return median(durations[twins[0]]) if twins else None


def draft_seconds(durations, T, c_prior):  # {rows: [seconds]}, target rows -> seconds -> (rows -> seconds)
    """D(M), the seconds of a draft call over M rows: a timed size's median; between two timed sizes
    the line joining them; past them the target's shape T through the nearest timed size (so past
    FEW_ROWS and every timed size, full price); below the timed sizes, if none is of FEW_ROWS rows or
    fewer (a catch-up alone says little of a step over B rows: full price overstates a big call),
    c_prior T(M), scaled up if the draft's smallest call cost more than that prior said."""
    medians = {m: median(s) for m, s in durations.items() if s}
    sizes = sorted(medians)

    def seconds(M):
        if M in medians:
            return medians[M]
        below, above = [m for m in sizes if m < M], [m for m in sizes if m > M]
        if below and above:
            lo, hi = below[-1], above[0]
            return medians[lo] + (medians[hi] - medians[lo]) * (M - lo) / (hi - lo)
        if below:
            return medians[below[-1]] * T(M) / T(below[-1])
        if above and above[0] <= FEW_ROWS:
            return medians[above[0]] * T(M) / T(above[0])
        return c_prior * T(M) * max([1.0] + [medians[m] / (c_prior * T(m)) for m in above[:1]])  # never under it
    return seconds


def try_value(a, b, n, plan_gain, points=17):  # Beta(a, b), n positions, (a, b) -> the plan's goodput over plain's
    """What a try is worth to every round after it, as a share of a plain round's seconds: the best plan's
    saving, max(0, 1 - 1 / plan_gain), averaged over what the try's n examined positions could show
    (beta_binomial; each count's chance given to the nearest of `points` counts spread over 0..n, where plan_gain
    is read). A knowledge gradient (Frazier, Powell and Dayanik 2008): the plan made after the try, less the
    plan made now, which saves nothing where the belief says drafting loses. Where the belief is wide a try may
    reveal an alpha that pays; where many positions have shown a low alpha, it cannot.

    >>> pays_above = lambda cut: (lambda a, b: 1.5 if a / (a + b) > cut else 0.8)  # drafting pays past `cut`
    >>> round(try_value(2, 2, 4, pays_above(0.6)), 3), round(try_value(20, 20, 4, pays_above(0.6)), 3)
    (0.124, 0.0)
    """
    mass = [0.0] * min(points, n + 1)
    for s, p in enumerate(beta_binomial(n, a, b)):
        mass[round(s * (len(mass) - 1) / n)] += p
    counts = [round(j * n / (len(mass) - 1)) for j in range(len(mass))]
    return sum(p * max(0.0, 1.0 - 1.0 / plan_gain(a + s, b + n - s)) for s, p in zip(counts, mass) if p > 1e-9)


def worth_timing(horizon, B, tokens):
    """Whether a plain round spent timing can still pay for itself: its reading changes only the rounds after
    it, so the running sequences must want more than TIMING_ROUNDS rounds of B sequences at the belief's
    longest (tokens[K]: a sequence-round's tokens; horizon None, unknown: yes).

    >>> worth_timing(None, 1, [1.0, 1.8]), worth_timing(7, 1, [1.0, 1.8, 2.4]), worth_timing(64, 2, [1.0, 1.8, 2.4])
    (True, False, True)
    """
    return horizon is None or horizon > TIMING_ROUNDS * B * max(tokens)


def explore_price(gain, trial, waited):
    """What an optimistic plan must gain over plain decoding (a fraction) for a round to draft, where the
    belief's plan gains `gain` x plain decoding's goodput and `trial` x with the whole catch-up paid in
    this round: nothing where the belief says drafting pays; else the larger of EXPLORE_PRICE x the
    loss the belief expects and a one-round try's loss, divided by 1 + waited / PATIENCE.
    Simulated (`python -m gpt2np.teach.batch_simulation`: 40 seeds, 12 % noise on every reading, B 1-8,
    alpha 0.5 / 0.8, 124M -> 355M and 1558M costs on both kernels' curve shapes), the rule without a
    price left auto at 0.899 of plain decoding at B = 4, alpha 0.5 (a try there owes four prompts'
    catch-up, ~2.6 plain rounds), with it 1.000; the lowest of the 32 cells' medians 0.881 -> 0.934.

    >>> explore_price(1.02, 0.5, 0), explore_price(0.9, 0.5, 0), round(explore_price(0.9, 0.95, 3), 3)
    (0.0, 0.5, 0.15)
    """
    return 0.0 if gain >= 1.0 else max(EXPLORE_PRICE * (1.0 - gain), 1.0 - trial) / (1 + waited / PATIENCE)


class BatchAutoK:
    """K = argmax goodput(K) for the round's B running sequences (module docstring)."""

    def __init__(self, K_max=8, c_prior=0.5, few_rows=FEW_ROWS, runs_as=None):
        """few_rows: the rows up to which the target's products take few-row methods (FEW_ROWS), or
        None for a target whose products have none; runs_as: {rows: the rows the target's products run them as}
        where they pad some sizes (twin_price; batched_speculative.batch_auto_K)."""
        self.K_max, self.c_prior, self.few_rows, self.name = K_max, c_prior, few_rows, "batch auto"
        self.runs_as = dict(runs_as or {})
        self.reset()

    def reset(self):
        self.t, self.waited, self.overlaps, self.target_durations, self.draft_durations = 0, 0, [], {}, {}
        self.n_calls, self.last_timed = 0, {}  # target rounds timed; rows -> n_calls when that size was last timed

    def costs(self, B, rows=0, line=False):  # -> (D: rows -> draft seconds, T: rows -> target round seconds)
        """Seconds, t1 units if untimed. line: every untimed size on the line through the timed ones, never at full
        price (price_try's other end)."""
        last = max(FEW_ROWS, B * (self.K_max + 1) + rows)  # rows: the fixed sequences' (choose)
        v = v_curve(self.target_durations, last)
        t1 = t1_estimate(self.target_durations, v) or 1.0
        top = max(self.target_durations, default=0)
        few_rows = None if line else self.few_rows

        def v_past(m):  # past the curve (a catch-up's rows): its line carried on, or each row a FEW_ROWS call's share
            if few_rows is None:  # never falling (as v_curve's line): `last` may be a timed size, read low
                return v[last] + max(0.0, v[last] - v[last - 1]) * (m - last)
            return v[FEW_ROWS] * m / FEW_ROWS

        def T(M):  # past the curve: past few_rows too, at full price; unless settled, never above a larger size's;
            twin = twin_price(M, self.target_durations, self.runs_as)  # never timed: a twin's reading, if any
            if twin is not None:
                return twin
            seconds = at_full_price(lambda m: t1 * (v[m] if m in v else v_past(m)), M, top, few_rows)
            return seconds if M in settled else padded_price(seconds, M, caps)
        caps = padding_caps(self.target_durations)
        settled = {m for m, s in self.target_durations.items() if len(s) >= SETTLED}
        timed = self.draft_durations if self.target_durations else {}  # seconds only beside seconds (not t1 units)
        return draft_seconds(timed, T, self.c_prior), T

    def choose(self, B, lag=0, horizon=None, fixed=()):
        """K for a round of B sequences; lag: rows the draft lacks beyond one per sequence that could
        draft, horizon: tokens those sequences still want (None: unknown, the catch-up on this round);
        fixed: the K of each running sequence beside them whose K is not chosen here (0: a plain one)."""
        self.t += 1
        seen = sum(self.overlaps)
        a, b = ALPHA_PRIOR[0] + seen, ALPHA_PRIOR[1] + len(self.overlaps) - seen
        if lag > B and not self.target_durations:
            return 0                                                   # no catch-up paid on the prior alone
        expected = expected_tokens_under_belief(a, b, max([self.K_max, *fixed]))
        beside = (sum(k + 1 for k in fixed), sum(expected[k] for k in fixed))  # their rows and tokens a round
        D, T = self.costs(B, beside[0])
        d, first = D(B), D(B + min(lag, B))  # a drafting batch's first step: up to one more row a sequence
        catch_up, behind = (D(B + lag) - first if lag > B else 0.0), first - d
        believed = expected[:self.K_max + 1]
        planned = goodputs(believed, B, d, T, catch_up, horizon, behind, beside)
        gain = max(planned[1:]) / planned[0]                           # the belief's best drafting over plain
        if self.target_durations and self.times_plain(B + beside[0], gain) and worth_timing(horizon, B, believed):
            return 0                                                   # time the plain pass of these rows
        if gain < 1.0 and self.overlaps and horizon is not None:        # a retry: worth what it could teach
            return self.retry(a, b, B, d, T, catch_up, horizon, behind, beside, believed, fixed)
        alpha = optimistic_alpha(a, b, self.t)
        hopeful = goodputs([expected_tokens_per_round(alpha, K) for K in range(self.K_max + 1)], B, d, T,
                           catch_up, horizon, behind, beside)
        trial = goodputs(believed, B, d, T, catch_up, None, behind, beside)  # the whole catch-up on this round
        if max(hopeful[1:]) / hopeful[0] - 1.0 <= explore_price(gain, max(trial[1:]) / trial[0], self.waited):
            self.waited += 1
            return 0                                                   # plain wins even so, or a try costs too much
        self.waited = 0
        K = max(range(1, self.K_max + 1), key=planned.__getitem__)
        return self.price_try(K, planned, B, d, T, catch_up, horizon, behind, beside, believed)

    def price_try(self, K, planned, B, d, T, catch_up, horizon, behind, beside, believed):  # -> K, or a K to price
        """Where the plan drafts K: a K whose rows no round has timed and full price charges (past few_rows and
        past every timed size: at_full_price) is played once instead where reading its price is worth more than
        the round it may lose. Its seconds lie between the line through the timed sizes (costs(line=True)) and
        full price; taken as even over PRICE_POINTS points of that range, the try is worth what its K would save
        over the plan in the plan's rounds left where the price falls low (a knowledge gradient, as try_value is
        for alpha), less what it loses this round on average. Full price alone is a prior no round corrects:
        under forced Haswell a row-major 1558M target's 24 rows read 1.11 s where full price said 1.35 (16 rows:
        0.86), so a batch of 8 at alpha 0.8 played K = 1, never K = 2: 0.927 of K = 2; trying it, 0.981
        (PERFORMANCE.md, "Issue 29's 1558M table under forced Haswell after sessions 70-71"). Not for a target in
        panels (told runs_as): its products jump past 16 rows above full price (EPYC_PANELS in teach/
        batch_simulation.py), where a try loses (simulated, B = 8, alpha 0.8, 32 tokens: 0.993 -> 0.954)."""
        if self.few_rows is None or self.runs_as or horizon is None or not self.target_durations:
            return K
        _, line = self.costs(B, beside[0], line=True)
        edge, rounds = max(self.few_rows, *self.target_durations), horizon / (B * believed[K])  # the plan's rounds
        best, choice = 0.0, K
        for k in range(1, self.K_max + 1):
            M = B * (k + 1) + beside[0]
            if M <= edge:
                continue
            gains, lo, hi = [], line(M), T(M)
            for j in range(PRICE_POINTS):                             # M's seconds from the line to full price
                price = lo + (hi - lo) * j / (PRICE_POINTS - 1)
                at = goodputs(believed, B, d, lambda m: price if m == M else T(m), catch_up, horizon, behind, beside)
                gains.append(at[k] / planned[K] - 1.0)
            saved, lost = sum(max(0.0, g) for g in gains), max(0.0, -sum(gains))  # over PRICE_POINTS prices
            value = ((rounds - 1.0) * saved - lost) / PRICE_POINTS
            if value > best:
                best, choice = value, k
        return choice

    def retry(self, a, b, B, d, T, catch_up, horizon, behind, beside, believed, fixed):  # -> K: 0, or a try's
        """Where the batch has drafted and the belief says drafting loses: try the K whose round, its whole
        catch-up paid in it, loses least, if what about TRY_ROUNDS such rounds could teach (try_value), over
        the plain rounds the tokens left would take, is worth more than the plain rounds that one loses. The
        rule of a first try (an optimistic alpha, explore_price) retried however little the try could change:
        its price decays with the rounds waited and its optimism grows with the rounds played, so where
        drafting clearly loses it paid a catch-up and a losing round every so often (the Haswell kernels, 355M,
        B = 1 - 4, alpha 0.5: auto 0.94-0.955 of plain decoding, PERFORMANCE.md); here a belief that has seen
        enough, or a run near its end, stops trying."""
        K_max = max([self.K_max, *fixed])
        T = cache(T)  # plan_gain reads the same sizes for every count a try could show

        def plan_gain(a, b):  # the belief's best plan over plain decoding at this round's costs
            g = goodputs(expected_tokens_under_belief(a, b, K_max)[:self.K_max + 1], B, d, T, catch_up, horizon,
                         behind, beside)
            return max(g[1:]) / g[0]
        trial = goodputs(believed, B, d, T, catch_up, None, behind, beside)  # the whole catch-up on this round
        K = max(range(1, self.K_max + 1), key=trial.__getitem__)
        lost = believed[K] * (trial[0] / trial[K] - 1.0)            # plain rounds of seconds the try round loses
        n = max(1, round(TRY_ROUNDS * B * believed[K - 1]))        # positions examined: up to the first rejection
        if (horizon / B - 1.0) * try_value(a, b, n, plan_gain) <= lost:
            self.waited += 1
            return 0
        self.waited = 0
        return K

    def snapshot(self):  # -> what restore puts back (a round undone: ContinuousSpeculativeBatch.step)
        """The state a round changes: overlaps only grow (their count), the timing windows are short (copied)."""
        return (self.t, self.waited, len(self.overlaps), {m: list(s) for m, s in self.target_durations.items()},
                {m: list(s) for m, s in self.draft_durations.items()}, self.n_calls, dict(self.last_timed))

    def restore(self, state):
        """As it was at snapshot(): the undone round never happened, to the policy either."""
        self.t, self.waited, n_overlaps, self.target_durations, self.draft_durations, self.n_calls, \
            self.last_timed = state
        del self.overlaps[n_overlaps:]

    def update(self, overlaps, rows, target_seconds, draft_calls, first_round):
        """After a round: its examined positions' overlaps (a list, or {sequence: list}: batch_round's), its
        target side (rows in all, seconds) and each draft call's (rows, seconds). The first round's target call
        carries the prompts and is not timed; a draft call is priced by its rows whatever they catch up on."""
        self.overlaps += [b for bs in overlaps.values() for b in bs] if isinstance(overlaps, dict) else overlaps
        for M, seconds in draft_calls:
            keep(self.draft_durations.setdefault(M, []), seconds)
        if not first_round:
            keep(self.target_durations.setdefault(rows, []), target_seconds)
            self.n_calls += 1
            self.last_timed[rows] = self.n_calls

    def vouched(self, B):
        """Whether the draft's clock vouches for the curve's guess of an untimed B-row target round: the
        median of its own B-row calls over c_prior within CLOCK_AGREEMENT of it (AutoK's needs_timing)."""
        if B not in self.draft_durations or not self.target_durations or self.c_prior <= 0:
            return False
        _, T = self.costs(B)
        return 1 / CLOCK_AGREEMENT <= median(self.draft_durations[B]) / (self.c_prior * T(B)) <= CLOCK_AGREEMENT

    def times_plain(self, B, drafting):
        """Whether this round is plain to time the B-row pass that plain decoding's goodput rests on
        (drafting: the plan's best drafting goodput over plain decoding's): never timed, while drafting
        is under TIMING_MARGIN, unless it is ONE_READING or more over 1 and the draft's clock vouches
        for the guess (vouched); timed once, while it is within ONE_READING of 1 (one reading taken in a
        slow second of a shared machine, never taken again, made K = 1 at alpha 0.5 look like a gain
        for a whole run: 19 drafting rounds of 22); last timed STALE_CALLS target rounds ago, while it
        is within MARGINAL of 1 (AutoK's stale one-token call: the machine's speed drifts)."""
        if B not in self.target_durations:
            return drafting < TIMING_MARGIN and not (drafting >= 1.0 + ONE_READING and self.vouched(B))
        once = len(self.target_durations[B]) < 2 and abs(drafting - 1.0) <= ONE_READING
        return once or (self.n_calls - self.last_timed[B] >= STALE_CALLS and abs(drafting - 1.0) <= MARGINAL)
