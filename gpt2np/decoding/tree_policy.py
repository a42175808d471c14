"""tree="auto": each round's tree shape from the run's own acceptance and this machine's costs.

The K-policy interface (policies.py), for a tree drafter: choose(past) returns the depth of the
shape it picked (0: a plain round) and `widths` holds the shape, which the drafter grows
(ModelTreeDrafter(shape=policy.current)). The choice (tree_shape.best_shape):

    rates     a_{d,r} for every depth d and sibling rank r: a Beta belief per (d, r) from the
              run's counts (tried, accepted), with a prior from the same rank pooled over every
              depth (ranks behave alike at every depth until the counts say otherwise). As AutoK
              does with K: whether to draft at all is decided at an optimistic point of every
              belief (mean + sqrt(ln(t + 1)) standard deviations in round t), so bad luck never
              locks drafting out; the shape at the belief's mean for first children (how deep),
              optimistic for later siblings (how wide): a rank never tried looks promising until
              it is tried, the bonus fades as counts grow, so wide shapes are explored and then
              kept only where they pay;
    c         the draft's seconds per draft call (one per level) / a one-token target call;
    v(M)      the target's measured call times (policies.v_curve), its prior for sizes never timed;
    o         the rest of a drafting round, per drafted node: its wall time less its draft calls
              and its target call as c and v predict them, over its nodes (median of the latest
              rounds), in one-token calls. Tiny models pay mostly this: on the bundled pair a
              node's drawing and trying costs about what the target's call does.

A plain round comes first to time a one-token call (as AutoK's), and whenever no shape is predicted
to beat plain decoding. Deterministic given the past, so the loop stays exact (policies.py says why).
"""
from statistics import median

from .drafters import ModelDrafter
from .policies import ALPHA_PRIOR, keep, optimistic_alpha, t1_estimate, v_curve
from .run_stats import depths_and_ranks
from .tree_drafters import ModelTreeDrafter
from .tree_shape import best_shape, candidate_shapes

MAX_WIDTH, MAX_NODES = 4, 15  # the shapes tried: up to 4 children a node, 15 drafted nodes (16 target rows)
SIBLING_PRIOR = (1.0, 2.0)    # a later sibling's chance before any is tried: mean 1/3 (the draft's second choice)
PRIOR_WEIGHT = 2.0            # a (depth, rank) belief starts as this many positions of its rank's pooled mean


class AutoTree:
    """The shape with the best predicted speedup at optimistic acceptance rates (module docstring)."""

    def __init__(self, K_max=8, max_width=MAX_WIDTH, max_nodes=MAX_NODES):
        self.K_max, self.name = K_max, "auto tree"
        self.shapes = candidate_shapes(K_max, max_width, max_nodes)
        self.max_width, self.M_max = max_width, max_nodes + 1
        self.reset()

    def reset(self):
        self.t, self.counts, self.level_seconds, self.rounds, self.widths = 0, {}, [], [], (1,)

    def current(self):  # -> the shape chosen last
        return self.widths

    def rates(self, optimistic_ranks=1):  # -> rates[d][r] for d < K_max, r < max_width: a_{d+1,r}
        """The belief's mean for ranks below optimistic_ranks, its optimistic point for the others."""
        pooled = {}
        for (d, r), (tried, accepted) in self.counts.items():
            total = pooled.setdefault(r, [0, 0])
            total[0], total[1] = total[0] + tried, total[1] + accepted
        rows = []
        for d in range(self.K_max):
            row = []
            for r in range(self.max_width):
                a0, b0 = ALPHA_PRIOR if r == 0 else SIBLING_PRIOR
                tried, accepted = pooled.get(r, (0, 0))
                mean = (a0 + accepted) / (a0 + b0 + tried)
                tried, accepted = self.counts.get((d, r), (0, 0))
                a, b = PRIOR_WEIGHT * mean + accepted, PRIOR_WEIGHT * (1 - mean) + tried - accepted
                row.append(optimistic_alpha(a, b, self.t) if r >= optimistic_ranks else a / (a + b))
            rows.append(row)
        return rows

    def costs(self, past):  # -> c per draft call, v, o per drafted node
        v = v_curve(past.target_durations, self.M_max)
        t1 = t1_estimate(past.target_durations, v)
        c = median(self.level_seconds) / t1 if self.level_seconds and t1 else past.c_prior
        if not (t1 and self.rounds):
            return c, v, 0.0
        rest = [(seconds / t1 - levels * c - v[min(1 + n, self.M_max)]) / n for levels, n, seconds in self.rounds]
        return c, v, max(0.0, median(rest))

    def choose(self, past):
        self.t += 1
        if past.target_durations and 1 not in past.target_durations:
            return 0                                                   # time one plain call first
        c, v, o = self.costs(past)
        if best_shape(self.rates(optimistic_ranks=0), c, v, self.shapes, o)[1] <= 1.0:
            return 0                                                   # plain wins even so
        self.widths = best_shape(self.rates(), c, v, self.shapes, o)[0]
        return len(self.widths)

    def update(self, event):
        if event.tried:
            depths, ranks = depths_and_ranks(event.parents)
            for node, ok in event.tried:
                count = self.counts.setdefault((int(depths[node]) - 1, ranks[node]), [0, 0])
                count[0], count[1] = count[0] + 1, count[1] + bool(ok)
        if event.drafts and event.parents:
            levels = int(max(depths_and_ranks(event.parents)[0]))
            keep(self.level_seconds, event.propose_seconds / levels)
            keep(self.rounds, (levels, len(event.drafts), event.seconds))


def auto_tree(drafter, K_max):  # -> (ModelTreeDrafter, AutoTree)
    """speculative_generate(..., tree="auto"): a draft model growing the shape AutoTree picks each round."""
    if type(drafter) is not ModelDrafter:
        raise ValueError(f"tree='auto' picks the shapes a draft model grows, not a {type(drafter).__name__}'s "
                         f"(prompt lookup: give a fixed shape, tree=(3, 1))")
    policy = AutoTree(K_max)
    return ModelTreeDrafter(drafter.model, (1,) * K_max, c_prior=drafter.c_given, shape=policy.current), policy
