"""tree="auto": each round's tree shape from the run's own acceptance and this machine's costs.

The K-policy interface (policies.py), for a tree drafter: choose(past) returns the depth of the
shape it picked (0: a plain round) and `widths` holds the shape, which the drafter grows
(ModelTreeDrafter(shape=policy.current)). Three steps, in turn:

  1. Draft at all, and how deep: AutoK's answer (policies.py), the chain policy with its exactness
     proofs and its measured record: its belief about alpha (first children), its price on exploring,
     its first-round cap, its one plain timing round only where the plan needs one.
  2. Branch or not (tree_shape.best_shape): the shape with the best predicted speedup at the belief's
     mean rates replaces AutoK's chain of K only where it beats that chain by TREE_MARGIN:

     rates    a_{d,r} for every depth d and sibling rank r: a Beta belief per (d, r) from the run's
              counts (tried, accepted), with a prior from the same rank pooled over every depth
              (ranks behave alike at every depth until the counts say otherwise; a later sibling
              starts at SIBLING_PRIOR, the draft's second choice, mean 1/3);
     c        the draft's seconds per draft call (one per level) / a one-token target call;
     v(M)     the target's measured call times (policies.v_curve), for sizes never timed the cost
              shape the target read before the run (AutoK's 4.: up to a whole tree's rows or K_max + 1,
              the longest chain step 3 prices, whichever is more; or in a
              run too short for that, its chains' K_max + 1 carried on along their slope: at 1558M
              and 48 tokens 16 sizes do not fit PROBE_SHARE, and without a shape AutoK spends a
              round timing a one-token call and plans with its prior's line; simulated, alpha 0.8
              0.95 -> 1.00 of the best chain, measured in lockstep over 20 seeds level, 1.00 of
              the rule before on average), else its prior;
     o        the rest of a drafting round: its wall time less its draft calls and its target call
              as c and v predict them (median of the latest rounds), in one-token calls, against a
              plain round's 1 + o_plain (its wall time over a one-token call). Tiny models pay
              mostly this: on the bundled pair a round's Python costs about a target call.

  3. Not on a belief that is low by bad luck: the tree must also beat every chain were alpha
     TREE_CONFIDENCE standard deviations above the belief's mean (every rate scaled up by as much:
     holds_if_higher). Where unlucky early positions put the belief low, a tree wins at the mean
     (siblings make up for a first child that often fails) while a longer chain would have done
     better at the true alpha: a tree spends its rows on width, a chain loses little by being long.
     Replayed in teach/tree_simulation.py on the trees section's own coins and costs (124M -> 1558M,
     48 tokens, seeds 0-5), alpha 0.8 went 0.916 -> 1.000 of the best chain; over 200 seeds on the
     EPYC's panels curve 0.945 -> 0.966 at alpha 0.8, and 1.062 / 1.076 / 1.064 -> 1.045 / 1.043 /
     1.032 at alpha 0.3 / 0.5 / 0.6 (where trees pay, a little less often). Measured in lockstep
     (6 seeds, the rule before and now as two sides): alpha 0.8 0.891 -> 0.927 of the best chain
     (now / before per seed 0.99-1.13, median 1.034), alpha 0.5 1.072 -> 1.032 (0.86-1.04, median 0.96).

Why a tree must win by a margin at the mean rather than at an optimistic point: the first version
explored wide shapes optimistically (a rank never tried looked promising until tried) and timed
three plain rounds first; on 124M -> 1558M (bench section trees, forced rates) that cost 4-21 % of
the best chain's speed, and no fixed tree beat the best chain there or on the bundled pair. Siblings
are still learnt from every tree round that is played. (hopeful_rates: the optimistic point, for
teaching: how much more a tree could give if every later sibling were as good as it might be.)

Deterministic given the past, so the loop stays exact (policies.py says why).
"""
import math
from statistics import median

from .drafters import ModelDrafter
from .policies import (ALPHA_PRIOR, PROMPT_WEIGHT, AutoK, alpha_belief, beta_mean_var, checked_K_max, keep,
                       optimistic_alpha, t1_estimate, v_curve)
from .run_stats import depths_and_ranks
from .tree_drafters import ModelTreeDrafter
from .tree_shape import best_shape, candidate_shapes, tree_speedup

MAX_WIDTH, MAX_NODES = 4, 15  # the shapes tried: up to 4 children a node, 15 drafted nodes (16 target rows)
SIBLING_PRIOR = (1.0, 2.0)    # a later sibling's chance before any is tried: mean 1/3 (the draft's second choice)
PRIOR_WEIGHT = 2.0            # a (depth, rank) belief starts as this many positions of its rank's pooled mean
TREE_MARGIN = 1.05            # a tree replaces AutoK's chain only where it is predicted this much faster ...
TREE_CONFIDENCE = 1.0         # ... and beats every chain were alpha this many standard deviations above the belief's mean


def scaled_up(rates, belief, z=TREE_CONFIDENCE):  # rates[d][r], Beta (a, b) -> rates[d][r]
    """Every rate scaled by (mean + z sd) / mean of the Beta belief about alpha, at most 1: the rates were
    alpha z standard deviations higher than believed.

    >>> [[round(x, 3) for x in row] for row in scaled_up([[0.5, 0.25]], (3.0, 3.0))]  # mean 0.5, sd 0.189
    [[0.689, 0.344]]
    """
    a, b = belief
    mean, var = beta_mean_var(a, b)
    return [[min(1.0, rate * (mean + z * math.sqrt(var)) / mean) for rate in row] for row in rates]


def holds_if_higher(shape, rates, belief, c, v, o, plain, K_max):
    """Whether `shape` still beats every chain of 1..K_max drafts at scaled_up(rates, belief) (point 3 above)."""
    hopeful = scaled_up(rates, belief, TREE_CONFIDENCE)
    chains = max(tree_speedup((1,) * K, hopeful, c, v, o, plain) for K in range(1, K_max + 1))
    return tree_speedup(shape, hopeful, c, v, o, plain) >= chains


class AutoTree:
    """AutoK's depth, widened where the run's counts predict a tree beats that chain (module docstring)."""

    def __init__(self, K_max=8, max_width=MAX_WIDTH, max_nodes=MAX_NODES):
        self.K_max, self.name = K_max, "auto tree"
        self.shapes = candidate_shapes(K_max, max_width, max_nodes)
        self.max_width, self.M_max = max_width, max_nodes + 1
        # the target's cost shape up to a whole tree's rows or its longest chain's, K_max + 1 (AutoK plays chains
        # of up to K_max and holds_if_higher prices them all: v must cover both; policies.AutoK, 4.) ...
        self.cost_sizes = max(self.M_max, K_max + 1)
        self.fewest_cost_sizes = K_max + 1  # or, where a short run's budget reads no more, its chains' (read_cost_shape)
        self.chain = AutoK(K_max)
        self.prompt_positions = self.chain.prompt_positions  # the prompt's overlaps, as AutoK reads them (5.)
        self.reset()

    def reset(self):
        self.t, self.counts, self.level_seconds, self.rounds, self.widths = 0, {}, [], [], (1,)
        self.prompt = (0.0, 0.0)  # (tried, accepted): what the prompt's read positions count for a first child
        self.plain_seconds = []
        self.chain.reset()

    def current(self):  # -> the shape chosen last
        return self.widths

    def beliefs(self):  # -> [d][r] Beta (a, b) for d < K_max, r < max_width: a_{d+1,r}'s belief
        """Each (depth, rank)'s counts over a prior of PRIOR_WEIGHT positions at its rank's pooled mean (a first
        child's pooled over the prompt's read positions too, at PROMPT_WEIGHT each: what a chain's draft met)."""
        pooled = {0: list(self.prompt)}
        for (d, r), (tried, accepted) in self.counts.items():
            total = pooled.setdefault(r, [0, 0])
            total[0], total[1] = total[0] + tried, total[1] + accepted
        priors = []
        for r in range(self.max_width):
            a0, b0 = ALPHA_PRIOR if r == 0 else SIBLING_PRIOR
            tried, accepted = pooled.get(r, (0, 0))
            priors.append((a0 + accepted) / (a0 + b0 + tried))
        beliefs = []
        for d in range(self.K_max):
            row = []
            for r, mean in enumerate(priors):
                tried, accepted = self.counts.get((d, r), (0, 0))
                row.append((PRIOR_WEIGHT * mean + accepted, PRIOR_WEIGHT * (1 - mean) + tried - accepted))
            beliefs.append(row)
        return beliefs

    def rates(self):  # -> rates[d][r]: the belief's mean for every depth and rank (the shape is planned at it)
        return [[a / (a + b) for a, b in row] for row in self.beliefs()]

    def hopeful_rates(self):  # -> rates[d][r] at the optimistic point, mean + sqrt(ln(t + 1)) std in round t
        return [[optimistic_alpha(a, b, self.t) for a, b in row] for row in self.beliefs()]

    def costs(self, past):  # -> c per draft call, v over 1..cost_sizes rows, o per drafting round, a plain round's cost
        v = v_curve(past.target_durations, self.cost_sizes, past.v_shape)
        t1 = t1_estimate(past.target_durations, v)
        c = median(self.level_seconds) / t1 if self.level_seconds and t1 else past.c_prior
        if not t1:
            return c, v, 0.0, 1.0
        rest = [seconds / t1 - levels * c - v[min(1 + n, self.cost_sizes)] for levels, n, seconds in self.rounds]
        plain = max(1.0, median(self.plain_seconds) / t1) if self.plain_seconds else 1.0
        return c, v, max(0.0, median(rest)) if rest else plain - 1.0, plain

    def choose(self, past):
        self.t += 1
        seen = sum(past.prompt_overlaps)
        self.prompt = (PROMPT_WEIGHT * len(past.prompt_overlaps), PROMPT_WEIGHT * seen)
        K = self.chain.choose(past)                                    # 1. AutoK: draft at all, how deep
        self.widths = (1,) * max(K, 1)
        if K == 0 or self.t == 1:
            return K                                                   # plain, or a first round: no counts yet
        c, v, o, plain = self.costs(past)
        planned = self.rates()
        shape, speedup = best_shape(planned, c, v, self.shapes, o, plain)
        if max(shape) > 1 and speedup >= TREE_MARGIN * tree_speedup(self.widths, planned, c, v, o, plain) \
                and holds_if_higher(shape, planned, alpha_belief(past), c, v, o, plain, self.K_max):
            self.widths = shape                                        # 2.-3. a tree, where it pays by the margin
        return len(self.widths)

    def update(self, event):
        depths, ranks = depths_and_ranks(event.parents) if event.parents else ((0,), (0,))
        for node, ok in event.tried or ():
            count = self.counts.setdefault((int(depths[node]) - 1, ranks[node]), [0, 0])
            count[0], count[1] = count[0] + 1, count[1] + bool(ok)
        if self.t == 1:  # the first round (choose counts rounds): its calls carry the prompt
            return
        if event.drafts and event.parents:
            levels = int(max(depths))
            keep(self.level_seconds, event.propose_seconds / levels)
            keep(self.rounds, (levels, len(event.drafts), event.seconds))
        elif not event.drafts:
            keep(self.plain_seconds, event.seconds)


def auto_tree(drafter, K_max):  # -> (ModelTreeDrafter, AutoTree)
    """speculative_generate(..., tree="auto"): a draft model growing the shape AutoTree picks each round."""
    if type(drafter) is not ModelDrafter:
        raise ValueError(f"tree='auto' picks the shapes a draft model grows, not a {type(drafter).__name__}'s "
                         f"(prompt lookup: give a fixed shape, tree=(3, 1))")
    policy = AutoTree(checked_K_max(K_max))
    return ModelTreeDrafter(drafter.model, (1,) * K_max, c_prior=drafter.c_given, shape=policy.current), policy
