"""K for a batch (speculative_generate_batch(..., K="auto")): draft only where the batch's rows pay.

A lone sequence's verification rows are nearly free on a CPU (v(K+1) of 1.3-1.7 for K + 1 = 2-8
rows): the weights are read once whatever the rows. In a batch of B sequences plain decoding already
fills B rows per pass, so K drafts per sequence cost B(K + 1) rows, priced at the margin of the
batch's own pass, not at v(K+1). SmartSpec (Liu et al. 2024, "Optimizing Speculative Decoding for
Serving LLMs Using Goodput") chooses K by the goodput, tokens per second of the whole batch:

    goodput(K) = B E(alpha, K) / (K d(B) + T(B (K + 1)))          goodput(0) = B / T(B)

with E(alpha, K) = 1 + alpha + ... + alpha^K tokens per sequence-round (Leviathan et al.), T(M) the
seconds of a round's target side over M rows in all (the pass, and each sequence's verification,
sampling and roll-back, which on a small model cost what the pass does), and d(B) the seconds of one
draft step over B rows.
Here T and d are measured in this run (every packed call's seconds by its rows: policies.v_curve
draws a line through them, its prior where nothing was timed), so the same rule needs no profiling
tables: as B grows, T(B (K + 1)) leaves the flat part of the curve and the best K falls to 0. Before
a size is timed, rows past FEW_ROWS are priced at full cost, so a full batch does not pay to learn it.

As AutoK (policies.py): alpha is a Beta belief from every examined position of every sequence;
drafting at all is decided at an optimistic alpha (mean + sqrt(ln(t + 1)) standard deviations in
round t), so bad luck never locks it out; K at the belief's average; a plain round first times the
batch's plain pass when nothing else would. One K for every running sequence of a round (their
rows share the pass), each clamped to what it still wants. K is a function of the past only, so
every sequence stays exact (tests/decoding/test_batched_speculative.py enumerates it).

>>> [BatchAutoK(K_max=4, c_prior=0.1).choose(B) for B in (1, 2, 4, 8, 64)]  # before any timing: the prior's v
[4, 3, 2, 1, 0]
"""
from statistics import median

from .policies import ALPHA_PRIOR, TIMING_MARGIN, keep, optimistic_alpha, t1_estimate, v_curve
from .theory import expected_tokens_per_round, expected_tokens_under_belief

FEW_ROWS = 16  # the rows a pass takes nearly free (model/fast/matmul.py's few-row methods go to 16); past them,
               # rows never timed are priced as if each cost its share of a 16-row pass (measured: a packed 124M
               # pass of 4 sequences, 77 ms at 16 rows, 140 ms at 20), until this run times them


def goodputs(tokens, B, d, T):  # tokens[K]: per sequence-round; d: draft step seconds; T(M) -> seconds
    """Tokens per second of the batch for K = 0..len(tokens) - 1 (K = 0: plain batched decoding)."""
    return [B * tokens[K] / (K * d + T(B * (K + 1))) for K in range(len(tokens))]


class BatchAutoK:
    """K = argmax goodput(K) for the round's B running sequences (module docstring)."""

    def __init__(self, K_max=8, c_prior=0.5):
        self.K_max, self.c_prior, self.name = K_max, c_prior, "batch auto"
        self.reset()

    def reset(self):
        self.t, self.overlaps, self.target_durations, self.draft_steps = 0, [], {}, {}

    def costs(self, B):  # -> (d: draft step seconds over B rows, T: rows -> target pass seconds), in t1 units if untimed
        v = v_curve(self.target_durations, B * (self.K_max + 1))
        for M in (M for M in v if M > FEW_ROWS and M not in self.target_durations):
            v[M] = max(v[M], v[FEW_ROWS] * M / FEW_ROWS)  # past the few-row path, untimed rows at full price
        t1 = t1_estimate(self.target_durations, v) or 1.0
        steps = self.draft_steps.get(B) or [s for n, ss in self.draft_steps.items() if n >= B for s in ss]
        d = median(steps) if steps else self.c_prior * t1 * v[B]  # the draft's rows priced like the target's
        return d, lambda M: t1 * v[M]

    def choose(self, B):
        self.t += 1
        seen = sum(self.overlaps)
        a, b = ALPHA_PRIOR[0] + seen, ALPHA_PRIOR[1] + len(self.overlaps) - seen
        d, T = self.costs(B)
        planned = goodputs(expected_tokens_under_belief(a, b, self.K_max), B, d, T)
        if self.target_durations and B not in self.target_durations and max(planned) < TIMING_MARGIN * planned[0]:
            return 0                                                   # time the plain pass of these B rows
        alpha = optimistic_alpha(a, b, self.t)
        hopeful = goodputs([expected_tokens_per_round(alpha, K) for K in range(self.K_max + 1)], B, d, T)
        if max(hopeful[1:]) <= hopeful[0]:
            return 0                                                   # plain wins even so
        return max(range(1, self.K_max + 1), key=planned.__getitem__)

    def update(self, overlaps, rows, target_seconds, B, K, propose_seconds, first_round):
        """After a round: its examined positions' overlaps, its target pass (rows in all, seconds) and
        its draft steps (K steps over B rows in propose_seconds); the first round's calls carry the
        prompts and are not timed."""
        self.overlaps += overlaps
        if first_round:
            return
        keep(self.target_durations.setdefault(rows, []), target_seconds)
        if K:
            keep(self.draft_steps.setdefault(B, []), propose_seconds / K)
