"""Token trees of drafts: several candidate continuations, drawn level by level from the draft's q.

A chain of K drafts (speculative_kernel.py) is a tree with one child per node. A tree puts several
children where the draft is unsure, so that one of them is more likely to be the target's token
(SpecInfer, Miao et al. 2024; Multi-Candidate Speculative Decoding, Yang et al. 2024). The tree
kernel (tree_kernel.py) tries a node's children in turn, and what it may do depends on HOW they
were drawn, which a tree therefore records:

    with replacement     x_1, ..., x_m i.i.d. ~ q            (duplicates possible)
    without replacement  x_j ~ q with x_1..x_{j-1} removed, renormalised
                         (Yang et al.'s "without replacement"; Jeon et al. 2024, Recursive
                         Speculative Decoding, draw the same law with the Gumbel-top-k trick)

A DraftTree lists its nodes parents first (model/rows.py's convention, so that its rows go
straight into GPT2.forward_rows): node 0 is the root, the newest token of the context, not a
draft; each other node is a drafted token; a node's children appear in the order they were drawn.
q[i] is the draft distribution node i's children were drawn from: q after the context and the path
root..i, after the same temperature / top-k / top-p as the target's (sampling.py). Leaves' rows
are never read (zeros here).

draft_tree draws a whole tree, one LEVEL at a time: `level_q(tokens, parents, nodes)` gives the
draft's q after each node of the current level, which a draft GPT-2 computes in one forward_rows
call per level (the rows of a level, each seeing its own path). path_distributions is the slow way,
one forward pass per node over its own path, for any model (toy models, the tests' oracle).

The loop's tree drafters, which grow these trees from a draft model or prompt lookup, are
tree_drafters.py's.

>>> q = np.array([0.5, 0.3, 0.2])
>>> rng = np.random.default_rng(0)
>>> tree = draft_tree([7, 0], (2, 1), lambda tokens, parents, nodes: np.tile(q, (len(nodes), 1)), rng)
>>> tree.parents, len(tree.tokens)          # root; its 2 children; one grandchild under each
((-1, 0, 0, 1, 2), 5)
>>> tree.tokens[1] != tree.tokens[2]        # without replacement (the default): distinct siblings
True
"""
from dataclasses import dataclass

import numpy as np

from ..model.rows import check_parents, tree_path
from .sampling import distribution, sample
from .tree_shape import tree_size


@dataclass(frozen=True, eq=False)
class DraftTree:
    tokens: tuple        # [n] node i's token; tokens[0] is the root, the context's newest token
    parents: tuple       # [n] node i's parent; -1 for the root, parents[i] < i otherwise
    q: np.ndarray        # [n, n_vocab] the distribution node i's children were drawn from
    replacement: bool    # True: siblings i.i.d. from q; False: each without the earlier siblings
    drawn_from: np.ndarray | None = None  # [n, n_vocab] if given: the law node i itself was drawn
                         # from, given its earlier siblings (overrides q and replacement); one-hot
                         # rows for candidates proposed with certainty (trie_tree: prompt lookup)

    def __post_init__(self):
        check_parents(self.parents)
        if len(self.tokens) != len(self.parents) or len(self.q) != len(self.parents) \
                or (self.drawn_from is not None and len(self.drawn_from) != len(self.parents)):
            raise ValueError(f"a DraftTree needs one token, parent and q row (and drawn_from row, if "
                             f"given) per node: {len(self.tokens)}, {len(self.parents)}, {len(self.q)}")

    def children(self):  # -> [n] lists of node indices, each in drawing order
        kids = [[] for _ in self.parents]
        for node, parent in enumerate(self.parents[1:], start=1):
            kids[parent].append(node)
        return kids

    def is_chain(self):  # one child per node (or none): the target scores it with a plain forward
        return all(parent == node - 1 for node, parent in enumerate(self.parents))


def without_tokens(q, drawn):  # [n_vocab] -> [n_vocab], or None if nothing is left
    """q with the tokens already drawn removed, renormalised: the law of the next draw without
    replacement. None when the drawn tokens held all of q's mass.

    >>> without_tokens(np.array([0.5, 0.3, 0.2]), [0]).tolist()
    [0.0, 0.6, 0.4]
    """
    rest = np.array(q, dtype=np.float64)
    rest[list(drawn)] = 0.0
    total = rest.sum()
    return rest / total if total > 0 else None


def draw_children(q, width, rng, replacement, greedy=False):  # [n_vocab] -> [<= width] tokens
    """width tokens from q, in drawing order: i.i.d. (replacement), or each from q without the
    earlier ones (fewer than width when q's support runs out). greedy: q's width most probable
    tokens (ties: the lower id first), no randomness; at temperature 0 pass q at temperature 1
    here, to rank by (the greedy kernel never reads q)."""
    if greedy:
        ranked = np.argsort(-np.asarray(q), kind="stable")[:width]
        return [int(x) for x in ranked if q[x] > 0]
    if replacement:
        return [sample(q, rng) for _ in range(width)]
    drawn = []
    for _ in range(width):
        rest = without_tokens(q, drawn)
        if rest is None:
            break
        drawn.append(sample(rest, rng))
    return drawn


def check_widths(widths, max_width=None, max_nodes=None):  # -> widths as a tuple of ints, or a one-line ValueError
    """A tree's shape: children per node at each depth, e.g. (3, 2, 1), which drafts 3 + 3*2 + 3*2*1
    = 15 nodes. max_width, max_nodes: if given, the most children a node may have and the most
    nodes a round may draft (a command's caps on what its user types; the library's own callers
    leave them out: its tree drafters check other pairs with it, e.g. (matches, depth)).

    >>> check_widths([3, 2, 1])
    (3, 2, 1)
    >>> check_widths((100,), max_width=8, max_nodes=64)
    Traceback (most recent call last):
    ValueError: a tree may have at most 8 children a node and 64 nodes in all ((3, 2, 1) drafts 15), got (100,): 100 nodes

    A sequence only: a dict's or a set's keys would be read as widths ({2: 1} as (2,)).
    """
    if not isinstance(widths, (list, tuple, np.ndarray)) or getattr(widths, "ndim", 1) != 1 or len(widths) == 0 \
            or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1 for w in widths):
        raise ValueError(f"tree widths must be a non-empty tuple of integers >= 1 (children per node at each "
                         f"depth, e.g. (3, 2, 1)), got {widths!r}")
    widths = tuple(int(w) for w in widths)
    nodes = tree_size(widths)  # Python ints: exact, however wide
    if (max_width is not None and max(widths) > max_width) or (max_nodes is not None and nodes > max_nodes):
        caps = [f"{max_width} children a node"] * (max_width is not None) + [f"{max_nodes} nodes in all"] * (
            max_nodes is not None)
        raise ValueError(f"a tree may have at most {' and '.join(caps)} ((3, 2, 1) drafts 15), got {widths}: "
                         f"{nodes} nodes")
    return widths


def draft_tree(context, widths, level_q, rng, replacement=False, greedy=False, max_nodes=None):  # -> DraftTree
    """A tree under context[-1] with widths[d] children under every node at depth d (fewer where q's
    support runs out without replacement), drawn one level at a time; at most max_nodes drafted
    nodes (the last ones in level order left out: what room the caches have left).

    level_q(tokens, parents, nodes) -> [len(nodes), n_vocab]: the draft's q after each node's path
    (the tree so far given by tokens and parents). Pure: the same rng draws give the same tree.
    Exactness allows any such cut: which children a node gets may depend on its q and the drafts
    drawn before, never on the target.
    """
    check_widths(widths)
    limit = float("inf") if max_nodes is None else max_nodes
    tokens, parents, q_rows, level = [int(context[-1])], [-1], {}, [0]
    for width in widths:
        if not level or len(tokens) - 1 >= limit:  # (no level: cannot happen, a q row always has a token left)
            break
        next_level = []
        for node, q in zip(level, level_q(tuple(tokens), tuple(parents), level)):  # one call a level
            q_rows[node] = q
            for x in draw_children(q, min(width, limit - len(tokens) + 1), rng, replacement, greedy):
                tokens.append(x)
                parents.append(node)
                next_level.append(len(tokens) - 1)
        level = next_level
    n_vocab = len(next(iter(q_rows.values()))) if q_rows else 0
    q = np.zeros((len(tokens), n_vocab))             # [n, n_vocab], leaves' rows stay 0
    for node, row in q_rows.items():
        q[node] = row
    return DraftTree(tuple(tokens), tuple(parents), q, replacement)


def trie_tree(context, continuations, n_vocab, max_nodes=None):  # -> DraftTree
    """Candidate continuations proposed with certainty (prompt lookup's several earlier matches) as
    one tree: common prefixes merged (a trie), siblings distinct, in the order first proposed; each
    node drawn_from one-hot at its token, as NgramDrafter's chain. The kernel then accepts a child
    x with probability p_j(x) and, after rejecting it, tries the next against p without x. At most
    max_nodes drafted nodes (later ones left out).

    >>> trie_tree([5], [[1, 2], [1, 3], [4]], n_vocab=6).parents
    (-1, 0, 1, 1, 0)
    """
    tokens, parents, index = [int(context[-1])], [-1], {}  # index: (parent, token) -> node
    for continuation in continuations:
        node = 0
        for x in continuation:
            if (node, int(x)) not in index and max_nodes is not None and len(tokens) > max_nodes:
                break
            if (node, int(x)) not in index:
                index[node, int(x)] = len(tokens)
                tokens.append(int(x))
                parents.append(node)
            node = index[node, int(x)]
    drawn_from = np.zeros((len(tokens), n_vocab))
    drawn_from[np.arange(1, len(tokens)), tokens[1:]] = 1.0
    return DraftTree(tuple(tokens), tuple(parents), np.zeros((len(tokens), n_vocab)), False, drawn_from)


def path_tokens(context, tokens, parents, node):  # -> context + the drafted tokens on root..node
    return list(context) + [tokens[i] for i in tree_path(parents, node)[1:]]


def path_distributions(model, context, tokens, parents, nodes, options):  # -> [len(nodes), n_vocab]
    """The model's distribution after each node's path, one plain forward pass per node (slow, any
    model with the interface): a level_q for toy drafts, and the target's p rows in the tests."""
    logits = [model.forward(path_tokens(context, tokens, parents, node), model.new_cache())[0] for node in nodes]
    return distribution(np.stack(logits), **options)
