"""Deliberately broken variants of speculative sampling: negative controls for tests and classes.

Each one is a bug found in public speculative-decoding code. Each still runs, emits
plausible text and accepts a plausible share of drafts; only a distribution test can tell it is
wrong. tests/decoding/test_speculative_exact.py shows that the exact check rejects all three.

Use them through speculative_generate's injection points:

    speculative_generate(target, draft, ids, n, K, rng=rng, **BROKEN_VARIANTS["softmax_residual"])

>>> sorted(BROKEN_VARIANTS)
['first_position_only', 'greedy_draft', 'softmax_residual']
"""
import numpy as np

from ..decoding.sampling import softmax
from ..decoding.speculative_kernel import RoundResult, accept_draft, residual_distribution, target_token


def softmax_residual_kernel(drafts, q, p, rng, greedy=False):
    """BUG: after a rejection, the residual max(0, p - q) is "normalised" with softmax (as if it
    were logits) instead of being divided by its sum, so tokens with p <= q, even p = 0, get mass."""
    for i, x in enumerate(drafts):
        if not accept_draft(p[i][x], q[i][x], rng):
            softmaxed = softmax(np.maximum(0.0, p[i] - q[i]))  # should be: residual / residual.sum()
            return RoundResult(i, target_token(softmaxed, rng, greedy), "resample")
    return RoundResult(len(drafts), target_token(p[len(drafts)], rng, greedy), "bonus")


def first_position_only_kernel(drafts, q, p, rng, greedy=False):
    """BUG: only x_1 gets the accept test; once it passes, x_2..x_K are waved through (what a
    vectorised "find the first rejection" does when it only looks at position 0). Invisible at K = 1."""
    if len(drafts) > 0 and not accept_draft(p[0][drafts[0]], q[0][drafts[0]], rng):
        return RoundResult(0, target_token(residual_distribution(p[0], q[0]), rng, greedy), "resample")
    return RoundResult(len(drafts), target_token(p[len(drafts)], rng, greedy), "bonus")


def greedy_draft_sampler(q_i, rng):
    """BUG: the draft proposes its argmax token, but the kernel's ratio p(x)/q(x) still uses the
    full softmax q. Leviathan's proof needs x ~ q; with x = argmax q the output is not p.
    (Pass as draft_sampler=: the kernel itself is correct.)"""
    return int(np.argmax(q_i))


class PeekingDrafter:
    """BUG: K chosen by looking at the round itself. Wraps a drafter, and before the target's call
    cuts its drafts just before the first one the target would probably reject (p(x) < q(x)), as
    an "oracle" K policy would. Each kept draft is then accepted for sure, and the target's token
    comes from p where the proposal distribution was q restricted to {p < q}: biased.
    (Pass as the draft: speculative_generate(target, PeekingDrafter(draft, target), ...).)"""

    def __init__(self, drafter, target):
        from ..decoding.drafters import as_drafter
        self.inner, self.target = as_drafter(drafter), target
        self.name, self.check, self.roll_back = "peeking " + self.inner.name, self.inner.check, self.inner.roll_back
        self.cost_per_token = self.inner.cost_per_token

    def reset(self, target):
        self.inner.reset(target)
        self.c_prior = self.inner.c_prior

    def propose(self, context, k, options, rng):
        from ..decoding.sampling import sampling_distribution
        drafts, q = self.inner.propose(context, k, options, rng)
        logits = self.target.forward(np.asarray(context + drafts), self.target.new_cache(), len(drafts) + 1)
        p = sampling_distribution(logits, **options)  # [k+1, n_vocab]: the round's own p, peeked at
        keep = next((i for i, x in enumerate(drafts) if p[i, x] < q[i, x]), len(drafts))
        return drafts[:keep], q[:keep]

    calls = property(lambda self: self.inner.calls)
    seconds = property(lambda self: self.inner.seconds)
    timings = property(lambda self: self.inner.timings)


BROKEN_VARIANTS = {  # name -> keyword arguments for speculative_generate
    "softmax_residual": {"kernel": softmax_residual_kernel},
    "first_position_only": {"kernel": first_position_only_kernel},
    "greedy_draft": {"draft_sampler": greedy_draft_sampler},
}


def unnormalised_residual_kernel(drafts, q, p, rng, greedy=False):
    """BUG: after a rejection, the residual max(0, p - q) is sampled WITHOUT dividing by its sum.

    rng.choice refuses such a vector, but a hand-written inverse-CDF sampler,
    `min(searchsorted(cumsum(residual), u), n_vocab - 1)` with u ~ U[0, 1), does not: it emits
    token x with probability residual(x), and whenever u lands beyond the residual's total it runs
    off the end and is clipped to the last token, which so receives the missing mass
    1 - sum(residual). We draw from exactly that distribution (through sample(), so exact.py can
    enumerate it). The closer the draft is to the target, the smaller the residual, the worse.
    """
    for i, x in enumerate(drafts):
        if not accept_draft(p[i][x], q[i][x], rng):
            residual = np.maximum(0.0, p[i] - q[i])
            residual[-1] += 1.0 - residual.sum()  # the clipped tail of the inverse CDF
            return RoundResult(i, target_token(residual, rng, greedy), "resample")
    return RoundResult(len(drafts), target_token(p[len(drafts)], rng, greedy), "bonus")
