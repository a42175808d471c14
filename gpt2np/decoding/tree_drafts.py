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

The loop's tree drafters (speculative.py; drafters.py's interface, propose returning a DraftTree):
ModelTreeDrafter grows a fixed shape from a draft model, one call per level (LevelFeeder);
NgramTreeDrafter proposes several earlier matches of the context's suffix as a trie. Both leave
out the last nodes when the caches' context has no room for them (max_nodes).

>>> q = np.array([0.5, 0.3, 0.2])
>>> rng = np.random.default_rng(0)
>>> tree = draft_tree([7, 0], (2, 1), lambda tokens, parents, nodes: np.tile(q, (len(nodes), 1)), rng)
>>> tree.parents, len(tree.tokens)          # root; its 2 children; one grandchild under each
((-1, 0, 0, 1, 2), 5)
>>> tree.tokens[1] != tree.tokens[2]        # without replacement (the default): distinct siblings
True
"""
import time
from dataclasses import dataclass, replace
from itertools import islice

import numpy as np

from ..model.rows import check_parents, tree_depths, tree_path, tree_scope_for
from .drafters import ModelDrafter, NgramDrafter
from .sampling import distribution, greedy_distribution, is_greedy, sample


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


def check_widths(widths):  # -> widths as a tuple of ints, or a one-line ValueError
    """A tree's shape: children per node at each depth, e.g. (3, 2, 1).

    >>> check_widths([3, 2, 1])
    (3, 2, 1)
    """
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__len__") or len(widths) == 0 \
            or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1 for w in widths):
        raise ValueError(f"tree widths must be a non-empty tuple of integers >= 1 (children per node at each "
                         f"depth, e.g. (3, 2, 1)), got {widths!r}")
    return tuple(int(w) for w in widths)


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


# ---- the loop's tree drafters (speculative.py: a drafter may return a DraftTree) ------------------

def feed_rows(timed, ids, positions, scope, n_logits=None, n_shared=None):  # -> [n_logits, n_vocab]
    """TimedModel.feed for a rows call (model/rows.py), timed by its row count: a tree of M rows is
    on the same v(M) curve as a chain of M tokens."""
    start = time.perf_counter()
    logits = timed.model.forward_rows(np.asarray(ids), positions, scope, timed.cache, n_logits, n_shared)
    timed.durations.setdefault(len(ids), []).append(time.perf_counter() - start)
    return logits


def keep_path_rows(cache, n_past, rows):
    """cache.keep_rows(n_past, rows), or only a truncation when rows are 0, 1, ... (nothing moves)."""
    if list(rows) == list(range(len(rows))):
        cache.truncate(n_past + len(rows))
    else:
        cache.keep_rows(n_past, rows)


class LevelFeeder:
    """draft_tree's level_q for a draft model with a KV cache: ONE forward call per level.

    Level 0 (the root): a plain call over the tokens the cache lacks (the chain drafter's first call).
    Level d >= 1: the level's nodes in one forward_rows call, each at position len(context) - 1 + d,
    seeing the context (n_shared) and its own ancestors among the levels fed before (tree_scope_for).
    The last level (the leaves) is never fed: nobody reads a leaf's q, as the chain drafter never
    feeds x_K. keep() then leaves the cache holding the context and the accepted nodes it was fed.
    """

    def __init__(self, timed, context, options):
        self.timed, self.context, self.options, self.cached = timed, list(context), options, []

    def __call__(self, tokens, parents, nodes):  # -> [len(nodes), n_vocab]
        nodes = list(nodes)
        if nodes == [0]:
            logits = self.timed.feed(self.context[len(self.timed.cache):])  # [1, n_vocab]
        else:
            depth = int(tree_depths(parents)[nodes[0]])  # a level's nodes share their depth
            logits = feed_rows(self.timed, [tokens[n] for n in nodes], [len(self.context) - 1 + depth] * len(nodes),
                               tree_scope_for(parents, self.cached, nodes), n_shared=len(self.context))
            self.cached += nodes
        return distribution(logits, **self.options)

    def keep(self, path, n):
        """After the round: the context, then the accepted nodes that were fed; then at most n tokens."""
        if self.cached:
            rows = [self.cached.index(node) for node in path if node in self.cached]
            keep_path_rows(self.timed.cache, len(self.context), rows)
        self.timed.roll_back(n)


class ModelTreeDrafter(ModelDrafter):
    """A draft model proposing a tree of fixed shape: widths[d] children under every node at depth d,
    drawn without replacement by default (distinct siblings: a rejected token is never proposed
    again), one draft call per level (LevelFeeder). At temperature 0 a node's children are the
    draft's top tokens (ranked at temperature 1) and q is one-hot, as the chain drafter's.
    A round asked for k < len(widths) tokens drafts widths[:k]. Its K is the nodes it drafts.
    shape: a function giving each round's widths instead (tree_policy.AutoTree.current; depth
    at most len(widths)).
    """

    def __init__(self, model, widths, replacement=False, c_prior=None, shape=None):
        super().__init__(model, c_prior=c_prior)
        self.widths, self.replacement, self.shape = check_widths(widths), bool(replacement), shape
        self.depth = len(self.widths)
        self.name = f"{self.name}, tree {'auto' if shape else self.widths}"
        self.levels, self.drafted = None, 0

    def reset(self, target):
        super().reset(target)
        self.levels, self.drafted, self.n_ctx = None, 0, min(target.n_ctx, self.model.n_ctx)

    def propose(self, context, k, options, rng):  # -> DraftTree
        if k < 1:
            self.levels = None
            return DraftTree((int(context[-1]),), (-1,), np.zeros((1, self.model.n_vocab)), self.replacement)
        greedy = is_greedy(options["temperature"])
        self.levels = LevelFeeder(self.timed, context, dict(options, temperature=1.0) if greedy else options)
        widths = self.shape() if self.shape else self.widths
        tree = draft_tree(context, widths[:k], self.levels, rng, self.replacement, greedy,
                          max_nodes=self.n_ctx - len(context))  # the rows both caches have room for
        self.drafted += len(tree.tokens) - 1
        if greedy:  # q as the target's p will be: one-hot at the argmax (leaves' rows stay 0)
            tree = replace(tree, q=np.where(tree.q.any(axis=1, keepdims=True), greedy_distribution(tree.q), 0.0))
        return tree

    def roll_back(self, n, path=()):
        self.levels.keep(path, n) if self.levels is not None else self.timed.roll_back(n)

    def cost_per_token(self):  # seconds per drafted node
        return self.seconds / self.drafted if self.drafted else None


LOOKUP_SCAN = 8  # occurrences of one suffix looked at per candidate wanted (repeats are skipped)


class NgramTreeDrafter(NgramDrafter):
    """Prompt lookup proposing several earlier matches at once, as one trie (trie_tree): what followed
    the most recent occurrences of the longest context suffix seen before, then of shorter suffixes,
    until `candidates` distinct continuations of up to `depth` tokens are found. No randomness:
    the tree is a function of the context, so the kernel's one-hot rule keeps it exact.

    >>> drafter = NgramTreeDrafter(n_max=2, candidates=2, depth=2)
    >>> drafter.reset(target=None)
    >>> drafter.propose([5, 6, 7, 5, 6, 8, 5, 6], 2, {}, None).tokens   # "5 6" was followed by 8 ..., 7 ...
    (6, 8, 5, 7, 5)
    """

    def __init__(self, n_max=3, n_min=1, candidates=3, depth=4):
        super().__init__(n_max, n_min)
        check_widths((candidates, depth))
        self.candidates, self.depth = int(candidates), int(depth)
        self.name = f"ngram trie (n <= {n_max}, {candidates} matches, depth {depth})"

    def reset(self, target):
        super().reset(target)
        self.occurrences = {}  # n-gram -> positions after each of its occurrences, oldest first
        self.n_ctx = getattr(target, "n_ctx", None)  # the target's rows must fit its cache

    def update_index(self, context):
        for end in range(self.n_indexed, len(context) - 1):
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                self.occurrences.setdefault(tuple(context[end - n + 1:end + 1]), []).append(end + 1)
        super().update_index(context)

    def continuations(self, context, k):  # -> up to `candidates` distinct lists of <= k tokens
        found = []
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            followers = self.occurrences.get(tuple(context[len(context) - n:]), [])
            for follower in islice(reversed(followers), LOOKUP_SCAN * self.candidates):
                if (c := list(context[follower:follower + k])) not in found:
                    found.append(c)
                if len(found) == self.candidates:
                    return found
        return found

    def propose(self, context, k, options, rng):  # -> DraftTree
        start = time.perf_counter()
        self.update_index(context)
        found = self.continuations(context, min(k, self.depth)) if k > 0 else []
        tree = trie_tree(context, found, self.n_vocab or (max(context) + 1),
                         self.n_ctx - len(context) if self.n_ctx else None)
        self.calls, self.drafted = self.calls + 1, self.drafted + len(tree.tokens) - 1
        self.seconds += time.perf_counter() - start
        return tree

    def roll_back(self, n, path=()):
        pass


def as_tree_drafter(drafter, widths):  # -> the tree drafter of speculative_generate(..., tree=widths)
    """tree=(w_1, ..., w_D) for a drafter made by drafters.as_drafter: a draft model grows that shape
    (ModelTreeDrafter); prompt lookup proposes up to w_1 w_2 ... w_D earlier matches (the shape's
    leaves) of up to D tokens each, as a trie (NgramTreeDrafter)."""
    widths = check_widths(widths)
    if type(drafter) is NgramDrafter:
        return NgramTreeDrafter(drafter.n_max, drafter.n_min, int(np.prod(widths)), len(widths))
    if type(drafter) is ModelDrafter:
        return ModelTreeDrafter(drafter.model, widths)
    raise ValueError(f"tree= grows a tree from a draft model or prompt lookup, not from a "
                     f"{type(drafter).__name__} (a tree drafter is passed as the draft, without tree=)")
