"""Deliberately broken token-tree kernels: the negative controls of tests/decoding/test_tree_kernel.py.

Each is a plausible mistake in multi-draft speculative sampling (tree_kernel.py). Each still runs,
accepts children at a plausible rate and emits fluent text; each leaves a chain (one child per
node) exactly right, so only a tree with siblings, checked by exact enumeration, shows it is
wrong. Use them in place of tree_kernel.verify_tree:

    BROKEN_TREE_KERNELS["siblings_see_unmodified_p"](tree, p, rng)

>>> sorted(BROKEN_TREE_KERNELS)
['any_child_passes', 'siblings_see_unmodified_p', 'with_replacement_rule_on_any_tree']
"""
from dataclasses import replace

from ..decoding.speculative_kernel import accept_draft, residual_distribution
from ..decoding.tree_kernel import verify_tree


def any_child_passes(p, proposals, tokens, rng):
    """BUG: accept the first child that passes its own test against p, as if each were the only
    draft (what a vectorised `any(u_j < p(x_j) / q_j(x_j))` does); the residual is never updated,
    so when all fail t ~ norm(max(0, p - q_1)), the one-draft residual. Each extra sibling is an
    extra chance for the tokens with p > 0, so they are over-accepted."""
    for j, (x, q_j) in enumerate(zip(tokens, proposals)):
        if accept_draft(p[x], q_j[x], rng):
            return j, p
    return None, residual_distribution(p, proposals[0])


def siblings_see_unmodified_p(p, proposals, tokens, rng):
    """BUG: the residual is carried along for the final draw, but each sibling is tested against
    the original p instead of the residual p_j: a token already "paid for" by a rejected sibling's
    residual mass is accepted again at p's full rate."""
    residual = p
    for j, (x, q_j) in enumerate(zip(tokens, proposals)):
        if accept_draft(p[x], q_j[x], rng):  # should be: residual[x]
            return j, residual
        residual = residual_distribution(residual, q_j)
    return None, residual


def with_replacement_rule_on_any_tree(tree, p, rng, greedy=False):
    """BUG: a tree drafted WITHOUT replacement verified with the with-replacement rule: each
    sibling is tested against q, although it was drawn from q without the earlier siblings."""
    return verify_tree(replace(tree, replacement=True), p, rng, greedy)


BROKEN_TREE_KERNELS = {  # name -> a kernel with verify_tree's signature
    "any_child_passes": lambda tree, p, rng, greedy=False: verify_tree(tree, p, rng, greedy, any_child_passes),
    "siblings_see_unmodified_p":
        lambda tree, p, rng, greedy=False: verify_tree(tree, p, rng, greedy, siblings_see_unmodified_p),
    "with_replacement_rule_on_any_tree": with_replacement_rule_on_any_tree,
}
