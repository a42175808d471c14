"""Which tree: the shape with the most expected tokens per unit of cost, from this machine's v(M).

A shape is widths (w_1, ..., w_D): every node at depth d - 1 gets w_d children (tree_drafts.py), so a
round drafts D levels (one draft call each) and the target scores 1 + n(w) rows in one call, where
n(w) = w_1 + w_1 w_2 + ... + w_1 ... w_D. A chain of K drafts is (1,) * K.

What a round gains. Let a_{d,r} be the chance that the child of rank r at depth d is accepted given
that it is tried (its parent was reached and its r older siblings were rejected): acceptance by
depth and sibling rank, what run_stats.acceptance_by_rank counts. A node reached at depth d - 1
passes one of its w_d children with chance

    P_d(w_d) = 1 - (1 - a_{d,0}) (1 - a_{d,1}) ... (1 - a_{d,w_d - 1}),

and since every node of a level has the same number of children, whichever child passed has
its own w_{d+1} to try. So the accepted path reaches depth d with chance P_1 P_2 ... P_d, and a
round emits one token more than its accepted drafts (the resample, or the bonus token):

    E[tokens per round] = 1 + sum_d P_1 ... P_d.

What it costs, in one-token target calls: D draft calls of c each (a level's rows cost the draft
about what one row costs), one target call over 1 + n(w) rows, v(1 + n(w)), and o for the rest of
the round's work (drawing, trying, Python), against a plain round's 1 + o_plain (its call and its
rest): nothing beside a large model's calls, most of a round beside a tiny one's. The predicted
speedup (Leviathan et al.'s Theorem 3.8 with the tree's numbers) is

    speedup(w) = E[tokens per round] (1 + o_plain) / (D c + v(1 + n(w)) + o).

For a chain with a_{d,0} = alpha at every depth this is the chain's formula (theory.py). Sequoia
(Chen et al. 2024) chooses a tree by the same ratio with the hardware's own cost curve, over all
trees by dynamic programming; the shapes here are the ones tree_drafts grows (a width per depth),
few enough to try every one. Pure functions; the K-policy side is tree_policy.py.

>>> chain, tree = (1, 1), (2, 1)
>>> rates = ((0.5, 0.4), (0.5, 0.4))                 # a_{d,r}: depth 1 and 2, ranks 0 and 1
>>> expected_tokens(chain, rates)                    # 1 + 0.5 + 0.25
1.75
>>> round(expected_tokens(tree, rates), 3)           # 1 + 0.7 + 0.7 * 0.5
2.05
>>> tree_size(tree), tree_size((3, 2, 1))            # drafted nodes: 2 + 2; 3 + 6 + 6
(4, 15)
"""
import math
from functools import lru_cache


def pass_chance(rates_at_depth, width):
    """P_d(w): the chance that one of the first `width` children of a reached node is accepted.

    >>> pass_chance((0.5, 0.4, 0.2), 2)        # 1 - 0.5 * 0.6
    0.7
    """
    return 1.0 - math.prod(1.0 - rates_at_depth[r] for r in range(width))


def pass_chances(rates_at_depth):  # -> [P_d(0), P_d(1), ...]: pass_chance for every width at once
    """Up to the first rank whose rate is None (unknown: no shape that tries it can be priced)."""
    chances, rejected = [0.0], 1.0
    for rate in rates_at_depth:
        if rate is None:
            break
        rejected *= 1.0 - rate
        chances.append(1.0 - rejected)
    return chances


def expected_tokens(widths, rates):
    """E[tokens per round] = 1 + sum over depths of P_1 ... P_d; rates[d][r] = a_{d+1,r} (0-based)."""
    total, reach = 1.0, 1.0
    for d, width in enumerate(widths):
        reach *= pass_chance(rates[d], width)
        total += reach
    return total


@lru_cache(maxsize=None)
def tree_size(widths):
    """n(w): the drafted nodes of a full tree of that shape (the root, the context's last token, not counted)."""
    total, level = 0, 1
    for width in widths:
        level *= width
        total += level
    return total


def tree_speedup(widths, rates, c, v, o=0.0, plain=1.0):
    """Predicted speedup over plain decoding: E[tokens] plain / (D c + v(1 + n) + o); v: {M: v(M)};
    o: a drafting round's work besides its calls, plain: a plain round's cost (1 + its own rest),
    both in one-token target calls, if measured."""
    return expected_tokens(widths, rates) * plain / (len(widths) * c + v[1 + tree_size(widths)] + o)


def candidate_shapes(max_depth, max_width, max_nodes):
    """Every width-per-depth shape with depth <= max_depth, widths <= max_width, n(w) <= max_nodes,
    widths never growing with depth (a restriction that keeps the set small: a deeper level is
    reached less often, so its nodes are usually worth less). Chains first, then by size.

    >>> candidate_shapes(2, 2, 6)
    [(1,), (1, 1), (2,), (2, 1), (2, 2)]
    """
    shapes, grow = [], [()]
    while grow:  # extend each shape by one level, as long as it stays within the bounds
        w = grow.pop()
        for width in range(1, min(w[-1] if w else max_width, max_width) + 1):
            if len(w) < max_depth and tree_size(w + (width,)) <= max_nodes:
                shapes.append(w + (width,))
                grow.append(w + (width,))
    return sorted(shapes, key=lambda w: (max(w) > 1, tree_size(w), w))


def best_shape(rates, c, v, shapes, o=0.0, plain=1.0):
    """The shape of `shapes` with the largest tree_speedup (the first of equals: chains and small
    trees first), and that speedup. rates must cover every depth and rank the shapes use."""
    chances = [pass_chances(row) for row in rates]  # P_d(w) for every w, computed once
    best, best_speedup = None, -1.0
    for widths in shapes:  # tree_speedup for each shape, from the table (a policy asks every round)
        tokens, reach = 1.0, 1.0
        for d, width in enumerate(widths):
            reach *= chances[d][width]
            tokens += reach
        speedup = tokens * plain / (len(widths) * c + v[1 + tree_size(widths)] + o)
        if speedup > best_speedup:
            best, best_speedup = widths, speedup
    return best, best_speedup
