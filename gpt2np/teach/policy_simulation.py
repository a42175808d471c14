"""A K policy against a cost model: many coin seeds in a second, no model, no clock.

The policies (decoding/policies.py) see only `past`: the overlaps beta of the positions examined,
the timed target calls by size, and the drafter's cost per drafted token. Here those come from a
model of the run instead of a real one:

  * coins: position i of the output is accepted when coins[i] < alpha, one coin per position,
    drawn once per seed, the same for every K (as bench's forced-acceptance drafter: its q is the
    target's greedy token with probability alpha, so beta is 1 or 0);
  * costs, in one-token target calls: a drafted token costs c, a target call over M tokens v(M).

A round with K drafts then accepts the drafts up to the first failed coin and emits one more
token; its cost is K c + v(K + 1). Plain decoding costs 1 a token. The same arithmetic is
theory.predicted_speedup's, so a policy that always chose the best K would score the refined
prediction; what a policy loses to it is what it pays for learning alpha, c and v.

>>> v = {M: 1.0 if M == 1 else 1.3 + 0.08 * (M - 2) for M in range(1, 10)}
>>> run = simulate_policy(make_policy(4), alpha=1.0, c=0.1, v=v, n_tokens=50, seed=0)
>>> run["K_counts"], round(run["speedup"], 3)  # 10 rounds of 5 tokens at 0.4 + 1.54 each
({4: 10}, 2.577)
"""
import numpy as np

from ..decoding.policies import AutoK, Measurements, make_policy
from ..decoding.theory import expected_speedups_under_belief


def forced_coins(n_tokens, alpha, seed):
    """accepted[i]: whether a draft for output position i would be accepted (one coin per position)."""
    return np.random.default_rng(seed).random(n_tokens) < alpha  # [n_tokens]


def simulate_policy(policy, alpha, c, v, n_tokens, seed):
    """Run `policy` for n_tokens: {"speedup" over plain decoding, "K_counts", "rounds"}.

    v: {M: cost of an M-token target call in one-token calls}, M = 1..K_max + 1. As in the real
    loop (speculative.observe), the first round's target call carries the prompt and is not shown
    to the policy; every later call is, with the drafter's cost once it has drafted.
    """
    accepted, past, policy = forced_coins(n_tokens, alpha, seed), Measurements(c_prior=c), policy
    policy.reset()
    emitted, cost, K_counts = 0, 0.0, {}
    while emitted < n_tokens:
        K = min(policy.choose(past), n_tokens - emitted - 1)  # clamped: never past n_tokens
        n_ok = first_failure(accepted[emitted:emitted + K])
        past.overlaps += [1.0] * n_ok + [0.0] * (n_ok < K)    # the positions the round examined
        if K_counts:                                          # not the first round (the prompt's)
            past.add_target_call(K + 1, v[K + 1])
            if K:
                past.add_draft_cost(c)
        K_counts[K] = K_counts.get(K, 0) + 1
        emitted, cost = emitted + n_ok + 1, cost + K * c + v[K + 1]
    return {"speedup": n_tokens / cost, "K_counts": dict(sorted(K_counts.items())),
            "rounds": sum(K_counts.values())}


def first_failure(coins):
    """How many leading coins are True: the accepted drafts of a round."""
    failed = np.flatnonzero(~coins)
    return int(failed[0]) if failed.size else len(coins)


def compare_policies(alpha, c, v, n_tokens, seeds, K_max=8, policies=("auto", "heuristic")):
    """For each seed: every fixed K 1..K_max and the named policies, as speedups over plain decoding.

    Returns {"fixed": {K: [speedup per seed]}, name: [speedup per seed], "best_fixed": [...]}:
    best_fixed is, per seed, the best fixed K's speedup (an oracle that knew the seed's coins).
    """
    out = {"fixed": {K: [simulate_policy(make_policy(K), alpha, c, v, n_tokens, s)["speedup"] for s in seeds]
                     for K in range(1, K_max + 1)}}
    for name in policies:
        out[name] = [simulate_policy(make_policy(name, K_max), alpha, c, v, n_tokens, s)["speedup"] for s in seeds]
    out["best_fixed"] = [max(out["fixed"][K][i] for K in out["fixed"]) for i in range(len(seeds))]
    return out


class GreedyAutoK(AutoK):
    """The negative control: auto's plan at the belief's mean, without optimism (K = 0 included).

    Plain rounds examine no position, so once its belief says plain it never learns otherwise:
    after an unlucky start it stops drafting for the rest of the run. auto's optimism is the fix.
    """

    def choose(self, past):
        (a, b), c, v = self.estimates(past)
        planned = expected_speedups_under_belief(a, b, c, v, self.K_max)
        return max(range(self.K_max + 1), key=planned.__getitem__)
