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
    o         the rest of a drafting round: its wall time less its draft calls and its target call
              as c and v predict them (median of the latest rounds), in one-token calls, against a
              plain round's 1 + o_plain (its wall time over a one-token call). Tiny models pay
              mostly this: on the bundled pair a round's Python costs about a target call.

Plain rounds come first to time TIMING_CALLS one-token calls (AutoK times one: a tree's v reaches
16 rows, where one slow sample misleads more), and whenever no shape is predicted to beat plain decoding. Deterministic given the past, so the loop stays exact (policies.py says why).
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
TIMING_CALLS = 3              # one-token calls timed (plain rounds) before planning: every v(M) is over their
                              # median, and one slow first call made every tree look free on the bundled pair


class AutoTree:
    """The shape with the best predicted speedup at optimistic acceptance rates (module docstring)."""

    def __init__(self, K_max=8, max_width=MAX_WIDTH, max_nodes=MAX_NODES):
        self.K_max, self.name = K_max, "auto tree"
        self.shapes = candidate_shapes(K_max, max_width, max_nodes)
        self.max_width, self.M_max = max_width, max_nodes + 1
        self.reset()

    def reset(self):
        self.t, self.counts, self.level_seconds, self.rounds, self.widths = 0, {}, [], [], (1,)
        self.plain_seconds = []

    def current(self):  # -> the shape chosen last
        return self.widths

    def rates(self):  # -> (planned, hopeful): rates[d][r] for d < K_max, r < max_width, a_{d+1,r}
        """planned: the belief's mean for first children, its optimistic point for later siblings (the
        shape); hopeful: the optimistic point for every rank (whether to draft at all)."""
        pooled = {}
        for (d, r), (tried, accepted) in self.counts.items():
            total = pooled.setdefault(r, [0, 0])
            total[0], total[1] = total[0] + tried, total[1] + accepted
        priors = []
        for r in range(self.max_width):
            a0, b0 = ALPHA_PRIOR if r == 0 else SIBLING_PRIOR
            tried, accepted = pooled.get(r, (0, 0))
            priors.append((a0 + accepted) / (a0 + b0 + tried))
        planned, hopeful = [], []
        for d in range(self.K_max):
            means, tops = [], []
            for r, mean in enumerate(priors):
                tried, accepted = self.counts.get((d, r), (0, 0))
                a, b = PRIOR_WEIGHT * mean + accepted, PRIOR_WEIGHT * (1 - mean) + tried - accepted
                means.append(a / (a + b))
                tops.append(optimistic_alpha(a, b, self.t))
            planned.append(means[:1] + tops[1:])
            hopeful.append(tops)
        return planned, hopeful

    def costs(self, past):  # -> c per draft call, v, o per drafting round, a plain round's cost
        v = v_curve(past.target_durations, self.M_max)
        t1 = t1_estimate(past.target_durations, v)
        c = median(self.level_seconds) / t1 if self.level_seconds and t1 else past.c_prior
        if not t1:
            return c, v, 0.0, 1.0
        rest = [seconds / t1 - levels * c - v[min(1 + n, self.M_max)] for levels, n, seconds in self.rounds]
        plain = max(1.0, median(self.plain_seconds) / t1) if self.plain_seconds else 1.0
        return c, v, max(0.0, median(rest)) if rest else plain - 1.0, plain

    def choose(self, past):
        self.t += 1
        if past.target_durations and len(past.target_durations.get(1, ())) < TIMING_CALLS:
            return 0                                                   # time plain calls first
        c, v, o, plain = self.costs(past)
        planned, hopeful = self.rates()
        if best_shape(hopeful, c, v, self.shapes, o, plain)[1] <= 1.0:
            return 0                                                   # plain wins even so
        self.widths = best_shape(planned, c, v, self.shapes, o, plain)[0]
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
    policy = AutoTree(K_max)
    return ModelTreeDrafter(drafter.model, (1,) * K_max, c_prior=drafter.c_given, shape=policy.current), policy
