"""Deliberately broken variants of batched speculative decoding: negative controls for the exact tests.

In a batch each sequence must verify with its own coins and roll back its own caches
(decoding/batched_speculative.py). Each variant below breaks one of the two, the way a vectorised
batch verifier does, and still runs and emits plausible text; tests/decoding/test_batched_speculative.py
shows the exact enumeration of a 2-sequence batch rejects each one (the total variation distance
from the target's law is printed).

Use them through speculative_generate_batch's injection points:

    speculative_generate_batch(target, draft, prompts, n, K, rng=rngs, **BROKEN_BATCH_VARIANTS["shared_uniform"])

Note what is NOT a bug of the law: two sequences drawing from ONE generator (each draw is still a fresh,
independent one; that is how the exact test itself runs both sequences on one scripted rng). It only
makes a sequence's draws depend on the others', so it can no longer be reproduced alone: the batch
functions refuse it (batched.check_own_generators).

>>> sorted(BROKEN_BATCH_VARIANTS)
['copied_decision', 'next_sequence_length', 'shared_uniform']
"""
import numpy as np

from ..decoding.sampling import sample
from ..decoding.speculative_kernel import RoundResult, residual_distribution, target_token, verify_round


def acceptance(drafts, q, p, j):
    """min(1, p_j(x_j) / q_j(x_j)): the probability the kernel accepts draft j (Step 3)."""
    p_x, q_x = p[j][drafts[j]], q[j][drafts[j]]
    return 1.0 if p_x >= q_x else p_x / q_x


def finish(drafts, q, p, n, rng):  # -> RoundResult after n accepted drafts (Step 4, as verify_round)
    if n < len(drafts):
        return RoundResult(n, target_token(residual_distribution(p[n], q[n]), rng, False), "resample")
    return RoundResult(n, target_token(p[n], rng, False), "bonus")


def one_uniform(a, rng):  # {i: a_i} -> the set of i with u < a_i, u ~ U[0, 1) drawn once for all
    """One uniform u for every sequence, drawn through sample() as the interval of [0, 1] it falls in
    (the cuts are the a_i), so exact.ScriptedRng can enumerate it."""
    cuts = np.unique([0.0, 1.0, *a.values()])     # [m + 1] sorted
    upper = cuts[1 + sample(np.diff(cuts), rng)]  # u lies below `upper`, at or above the cut before it
    return {i for i, a_i in a.items() if a_i >= upper}


def shared_uniform_verify(rounds, rngs):  # [(drafts, q, p, greedy)] -> [RoundResult]
    """BUG: one uniform per draft position for the whole batch (a vectorised verifier's
    `r = rng.random(K)` broadcast over the sequences), drawn from the first sequence's rng. Each
    sequence's coin is still U[0, 1), so each sequence alone is exact: only the JOINT law is wrong
    (the sequences accept together more often than independent coins would)."""
    if any(greedy for *_, greedy in rounds):
        return [verify_round(d, q, p, rng, greedy=g) for (d, q, p, g), rng in zip(rounds, rngs)]
    n_accepted = [None] * len(rounds)  # None: no rejection yet
    for j in range(max(len(d) for d, *_ in rounds)):
        testing = {i: acceptance(d, q, p, j) for i, (d, q, p, _) in enumerate(rounds)
                   if n_accepted[i] is None and j < len(d)}
        accepted = one_uniform(testing, rngs[0]) if testing else set()
        for i in set(testing) - accepted:
            n_accepted[i] = j
    return [finish(d, q, p, len(d) if n is None else n, rng)
            for (d, q, p, _), n, rng in zip(rounds, n_accepted, rngs)]


def copied_decision_verify(rounds, rngs):  # [(drafts, q, p, greedy)] -> [RoundResult]
    """BUG: every sequence takes the first sequence's accept / reject decision at each position it
    shares with it (an index that should run over the batch stuck at 0); positions the first one
    never tested draw their own coins. Wrong for the other sequences even alone."""
    first = verify_round(*rounds[0][:3], rngs[0], greedy=rounds[0][3])
    results = [first]
    for (drafts, q, p, greedy), rng in zip(rounds[1:], rngs[1:]):
        results.append(verify_round(drafts, q, p, rng, greedy) if greedy else copied(drafts, q, p, first, rng))
    return results


def copied(drafts, q, p, first, rng):  # -> RoundResult: the first's decisions, then its own coins
    tested = min(len(drafts), first.n_accepted + (first.kind == "resample"))  # positions the first decided
    n = min(first.n_accepted, len(drafts))
    if n < tested:  # the first rejected there: so does this one
        return finish(drafts, q, p, n, rng)
    rest = verify_round(drafts[n:], q[n:], p[n:], rng)  # its own coins after the copied acceptances
    return RoundResult(n + rest.n_accepted, rest.next_token, rest.kind)


def next_sequence_length_roll_back(pairs):  # [(cache, n_keep)]
    """BUG: each cache is rolled back to the NEXT sequence's accepted length (an off-by-one over the
    batch), at most its own length. A cache kept longer than its own context[:-1] still holds a
    rejected draft, and the next round feeds after it: the target scores the wrong context (or, with
    nothing left to feed, the model refuses the call)."""
    n_keeps = [n for _, n in pairs]
    for i, (cache, _) in enumerate(pairs):
        cache.truncate(min(n_keeps[(i + 1) % len(pairs)], len(cache)))


BROKEN_BATCH_VARIANTS = {
    "shared_uniform": dict(verify=shared_uniform_verify),
    "copied_decision": dict(verify=copied_decision_verify),
    "next_sequence_length": dict(roll_back=next_sequence_length_roll_back),
}
