"""The statistics of one speculative run: acceptance, costs c and v, and theory's predictions.

Leviathan et al. 2023, sections 3.3-3.4 (alpha, Thm 3.5; speedup, Thm 3.8), with v added: the
cost of a (K+1)-token verification call in one-token calls (theory.py). summarise() turns the
round records and the stopwatches of one run into a SpeculativeStats.
"""
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..model.rows import tree_depths
from .stopwatch import seconds_per_call
from .policies import v_curve
from .theory import predicted_speedup_mixed

CALIBRATION_CALLS = 5  # one-token target calls timed, on request, after a run that made fewer (for c and v)


@dataclass(frozen=True)
class SpeculativeStats:
    """Counts, acceptance rates, timings and the predictions of theory.py for one run.

    Two acceptance rates, because "acceptance rate" means different things in different places:
    alpha_hat is Leviathan's alpha, the expected acceptance probability of a draft token, estimated
    as the mean of beta = sum_x min(p, q) over the positions the kernel examined (it uses the full
    distributions, so it is less noisy); alpha_empirical = accepted / (accepted + rejections) is
    the fraction of examined drafts this run actually kept. Both estimate the same alpha.

    c and v are measured in this run: c = drafter seconds per drafted token (a model drafter: its
    median one-token call) / target seconds per one-token call, v = target seconds per (K+1)-token
    call / per one-token call, each a median over the run's calls of that size. A run has
    one-token target calls only in rounds without drafts. Measuring is the caller's choice: with
    calibrate=True and fewer than CALIBRATION_CALLS of them, that many extra target calls are timed
    after the run (calibration_seconds, excluded from target_calls and target_seconds); without it,
    the run makes no call its rounds do not need. Ratios are None where the run made no call of the
    size needed (no one-token target call without calibration; no one-token draft call when K = 1).

    by_position says how often the i-th draft of a round was accepted: of the rounds that proposed
    an i-th draft, how many examined it (every earlier draft was accepted) and how many accepted it.
    accepted / proposed falls like alpha^i; accepted / examined estimates alpha at depth i.

    All of these count the kernel's decisions, not the tokens kept: a round cut short by a stop token
    (an accepted draft that is eot_id or one of stop_tokens) still counts the drafts the kernel accepted
    after it, which the output drops, since they estimate the drafter's alpha. What the output holds is
    the result's tokens and provenance ("draft" per accepted draft kept).

    Token trees (speculative.py, tree=). An examined position is a node whose children were tried
    (the root, then each accepted node that is not a leaf); "accepted" there means one of its
    children was. So alpha_empirical and by_position are the tree's acceptance per depth, which
    its siblings raise above the drafter's alpha, while alpha_hat stays the drafter's: beta =
    sum_x min(p, q) with q the law the node's FIRST child was drawn from, the chance that child
    alone is accepted, what a chain through that node would get. K is the nodes a round drafted
    (the most frequent count; K_counts: how often each), v the target call of K + 1 rows over a
    one-token call. Theory's predictions are for chains: None for a run whose rounds branched.
    by_rank: per depth, per sibling rank (the 1st, 2nd, ... child tried), (tried, accepted).

    A chain round's K is the K its policy asked for clamped to the tokens still wanted minus one
    (speculative.py's k: K=50 with 7 tokens to go drafts 6), so K_counts and the predictions describe
    the rounds that ran (a drafter may still propose fewer: prompt lookup; `drafted` counts those).
    With a K policy other than "fixed", K is the K used most often, K_counts says how often each
    was used, and the predictions average over rounds: sum of E(alpha, K_r) / sum of round costs,
    with v(K+1) from policies.v_curve's line through the measured calls for a K whose call size
    was only timed in the first round (whose call also carries the prompt).
    """
    K: int                                   # drafts asked for per round, clamped (the most used one)
    rounds: int                              # target verification calls
    drafted: int                             # draft tokens proposed
    accepted: int                            # draft tokens accepted
    rejections: int                          # rounds that ended with a rejected draft
    alpha_hat: float | None                  # mean beta over examined positions (Thm 3.5)
    alpha_empirical: float | None            # accepted / (accepted + rejections)
    tokens_per_target_call: float            # tokens emitted / target calls (plain decoding: 1)
    draft_calls: int
    draft_seconds: float
    target_calls: int
    target_seconds: float
    draft_timings: dict                      # tokens fed per call (or "lookup") -> (calls, seconds)
    target_timings: dict
    calibration_seconds: float               # the extra one-token target calls (0.0 if not needed)
    c: float | None                          # drafter / target seconds per token
    v: float | None                          # target seconds per (K+1)-token / one-token call
    predicted_speedup: float | None          # Thm 3.8 with alpha_hat and c (assumes v = 1)
    predicted_speedup_refined: float | None  # the same with the measured v
    drafter: str = "model"                   # the drafter's name
    policy: str = "fixed"                    # the K policy: fixed / heuristic / auto
    K_counts: dict = None                    # K asked for, clamped to the tokens left -> rounds
    by_position: tuple = ()                  # per draft position i = 1, 2, ...: (proposed, examined, accepted)
    by_rank: tuple = ()                      # per depth, per sibling rank j = 1, 2, ...: (tried, accepted)
    probe_seconds: float = 0.0               # reading the target's cost shape before the run (auto only;
                                             # policies.AutoK, 4.), inside the run's wall time
    prompt_overlap: float | None = None      # mean beta at the prompt's last positions, read before the run
                                             # (auto with a draft model: policies.AutoK, 5.), else None
    prompt_positions: int = 0                # how many positions that read
    prompt_seconds: float = 0.0              # both models' prefill with those positions' rows kept, inside the
                                             # run's wall time, outside target_seconds and draft_seconds
    tree: bool = False                       # the run drafted token trees (a tree drafter: tree=...): K and
                                             # K_counts then count the nodes a round drafted


def time_one_token_calls(target, context, n_calls):
    """Seconds of n_calls target calls over a single token: the unit c and v are measured in.

    Made only when the run itself had fewer than n_calls one-token target calls (one timing is
    too noisy to divide by; the median of five resists a slow call). Each feeds the newest token
    (the call plain decoding would make next) and rolls it back, so the output is unaffected; the
    time is reported as calibration_seconds, not hidden in target_seconds.
    """
    seconds = []
    for _ in range(n_calls):
        start = time.perf_counter()
        target.model.forward(np.asarray(context[-1:]), target.cache, 1)
        seconds.append(time.perf_counter() - start)
        target.roll_back(len(context) - 1)
    return seconds


def is_branching(parents):  # -> True if a node has two or more children (else the tree is a chain)
    return len(set(parents[1:])) < len(parents) - 1


def drafted_depth(record):  # -> the deepest draft of a round: k for a chain, the tree's depth for a tree
    parents = getattr(record, "parents", ())
    return int(tree_depths(parents).max()) if is_branching(parents) else len(record.drafts)


def depths_and_ranks(parents):  # -> each node's depth and its index among its parent's children
    if not is_branching(parents):
        return range(len(parents)), [0] * len(parents)  # a chain: node i at depth i, an only child
    seen, ranks = {}, [0]
    for parent in parents[1:]:
        ranks.append(seen.get(parent, 0))
        seen[parent] = ranks[-1] + 1
    return tree_depths(parents), ranks


def acceptance_by_position(records):  # -> ((proposed, examined, accepted) per draft position, or depth)
    """How often the 1st, 2nd, ... draft of a round (a tree: depth) was proposed, examined and accepted.

    >>> from types import SimpleNamespace as Round
    >>> acceptance_by_position([Round(drafts=[5, 6], decisions=[True, False]), Round(drafts=[7, 8], decisions=[False])])
    ((2, 2, 1), (2, 1, 0))
    """
    depths = [drafted_depth(r) for r in records]
    return tuple((sum(d > i for d in depths), sum(len(r.decisions) > i for r in records),
                  sum(r.decisions[i] for r in records if len(r.decisions) > i)) for i in range(max(depths, default=0)))


def acceptance_by_rank(records):  # -> per depth, per sibling rank: (tried, accepted)
    """From each round's `tried`: how often the j-th child tried at depth d was tried and accepted.

    >>> from types import SimpleNamespace as Round
    >>> acceptance_by_rank([Round(parents=(-1, 0, 0, 1), tried=((1, False), (2, True))),
    ...                     Round(parents=(-1, 0, 0, 1), tried=((1, True), (3, False)))])
    (((2, 1), (1, 1)), ((1, 0),))
    """
    counts = {}  # (depth, rank) -> [tried, accepted]
    for r in records:
        if not r.tried:
            continue
        depths, ranks = depths_and_ranks(r.parents)
        for node, ok in r.tried:
            count = counts.setdefault((int(depths[node]), ranks[node]), [0, 0])
            count[0], count[1] = count[0] + 1, count[1] + ok
    return tuple(tuple(tuple(counts.get((d, j), (0, 0))) for j in range(1 + max(j for dd, j in counts if dd == d)))
                 for d in range(1, 1 + max((d for d, _ in counts), default=0)))


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def summarise(records, Ks, target, drafter, policy_name, n_tokens, calibration, probe_seconds=0.0, prompt_overlaps=(),
              prompt_seconds=0.0):
    """SpeculativeStats from the round records, each round's K (clamped) and the stopwatches."""
    decisions = [d for r in records for d in r.decisions]
    overlaps = [b for r in records for b in r.overlaps]
    accepted, rejections = decisions.count(True), decisions.count(False)
    alpha_hat = float(np.mean(overlaps)) if overlaps else None
    t1 = seconds_per_call({1: target.durations.get(1, []) + calibration}, 1)
    counts = dict(sorted(Counter(Ks).items()))
    K = max(counts, key=lambda k: (counts[k], k)) if counts else 0
    c = ratio(drafter.cost_per_token(), t1)
    measured_v = lambda k: 1.0 if k == 0 else ratio(seconds_per_call(target.durations, k + 1), t1)  # noqa: E731
    fitted = v_curve(target.durations, max(counts, default=0) + 1)  # for a K whose call was never timed
    v_of_K = lambda k: fitted[k + 1] if measured_v(k) is None and len(counts) > 1 else measured_v(k)  # noqa: E731
    known = alpha_hat is not None and c is not None and not any(is_branching(r.parents) for r in records)
    return SpeculativeStats(
        K=K, rounds=len(records), drafted=sum(len(r.drafts) for r in records), accepted=accepted,
        rejections=rejections, alpha_hat=alpha_hat, alpha_empirical=ratio(accepted, accepted + rejections),
        tokens_per_target_call=n_tokens / target.calls, draft_calls=drafter.calls,
        draft_seconds=drafter.seconds, target_calls=target.calls, target_seconds=target.seconds,
        draft_timings=drafter.timings, target_timings=target.timings,
        calibration_seconds=sum(calibration), c=c, v=measured_v(K) if K else None,
        predicted_speedup=predicted_speedup_mixed(alpha_hat, counts, c, lambda k: 1.0) if known else None,
        predicted_speedup_refined=predicted_speedup_mixed(alpha_hat, counts, c, v_of_K) if known else None,
        drafter=drafter.name, policy=policy_name, K_counts=counts, by_position=acceptance_by_position(records),
        by_rank=acceptance_by_rank(records), probe_seconds=probe_seconds,
        tree=getattr(drafter, "depth", None) is not None,  # tree drafters have a depth (speculative.py's test too)
        prompt_overlap=float(np.mean(prompt_overlaps)) if len(prompt_overlaps) else None,
        prompt_positions=len(prompt_overlaps), prompt_seconds=prompt_seconds)
