"""The loop's tree drafters (speculative.py: a drafter's propose may return a DraftTree).

ModelTreeDrafter grows a tree of a fixed shape (or the shape a policy picks each round:
tree_policy.AutoTree) from a draft model, ONE draft call per level (LevelFeeder, through the model's
forward_rows); NgramTreeDrafter proposes several earlier matches of the context's suffix as a trie.
Both leave out the last nodes when the caches' context has no room for them. as_tree_drafter is
speculative_generate(..., tree=widths). Drawing and shaping trees is tree_drafts.py's.
"""
import time
from dataclasses import replace
from itertools import islice

import numpy as np

from ..model.rows import tree_depths, tree_scope_for
from .drafters import ModelDrafter, NgramDrafter, is_integer
from .sampling import distribution, greedy_distribution, is_greedy
from .tree_drafts import DraftTree, check_widths, draft_tree, trie_tree


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

    def fit_cache(self, n_positions):
        """The target's cache holds n_positions (the loop sized it to the run): so do the draft's and the trees."""
        super().fit_cache(n_positions)
        self.n_ctx = min(self.n_ctx, n_positions)

    def propose(self, context, k, options, rng):  # -> DraftTree
        if k < 1:
            self.levels = None
            return DraftTree((int(context[-1]),), (-1,), np.zeros((1, self.model.n_vocab)), self.replacement)
        widths = (self.shape() if self.shape else self.widths)[:k]
        self.caught_up = len(context) - len(self.timed.cache)  # as ModelDrafter.propose: the loop's CATCH_UP
        if max(widths) == 1:  # a chain: the chain drafter's plain calls (one token a call, no rows scopes)
            return self.chain(context, len(widths), options, rng)
        greedy = is_greedy(options["temperature"])
        self.levels = LevelFeeder(self.timed, context, dict(options, temperature=1.0) if greedy else options)
        tree = draft_tree(context, widths, self.levels, rng, self.replacement, greedy,
                          max_nodes=self.n_ctx - len(context))  # the rows both caches have room for
        self.drafted += len(tree.tokens) - 1
        if greedy:  # q as the target's p will be: one-hot at the argmax (leaves' rows stay 0)
            tree = replace(tree, q=np.where(tree.q.any(axis=1, keepdims=True), greedy_distribution(tree.q), 0.0))
        return tree

    def chain(self, context, k, options, rng):  # -> a chain DraftTree from ModelDrafter.propose
        """A shape of one child per level, drafted as the chain drafter drafts: the same tokens and q
        (at temperature 0 both take the argmax), in plain forward calls (a tree's rows calls cost more)."""
        self.levels = None
        drafts, q = ModelDrafter.propose(self, context, k, options, rng)  # [d], [d, n_vocab]
        self.drafted += len(drafts)
        rows = np.zeros((len(drafts) + 1, self.model.n_vocab))  # node i's children were drawn from q[i]
        rows[:len(drafts)] = q
        return DraftTree((int(context[-1]), *map(int, drafts)), tuple(range(-1, len(drafts))), rows, self.replacement)

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
        if not (is_integer(candidates) and is_integer(depth) and candidates >= 1 and depth >= 1):
            raise ValueError(f"NgramTreeDrafter's candidates and depth must be integers >= 1, got "
                             f"candidates={candidates!r}, depth={depth!r}")
        self.candidates, self.depth = int(candidates), int(depth)
        self.name = f"ngram trie (n <= {n_max}, {candidates} matches, depth {depth})"

    def reset(self, target):
        super().reset(target)
        self.occurrences = {}  # n-gram -> positions after each of its occurrences, oldest first
        self.n_ctx = getattr(target, "n_ctx", None)  # the target's rows must fit its cache

    def fit_cache(self, n_positions):
        """The target's cache holds n_positions (the loop sized it to the run): the tries' rows stay within it."""
        self.n_ctx = min(self.n_ctx or n_positions, n_positions)

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
    (ModelTreeDrafter, with the ModelDrafter's c_prior if it was given one); prompt lookup proposes up
    to w_1 w_2 ... w_D earlier matches (the shape's leaves) of up to D tokens each, as a trie
    (NgramTreeDrafter)."""
    widths = check_widths(widths)
    if type(drafter) is NgramDrafter:
        return NgramTreeDrafter(drafter.n_max, drafter.n_min, int(np.prod(widths)), len(widths))
    if type(drafter) is ModelDrafter:
        return ModelTreeDrafter(drafter.model, widths, c_prior=drafter.c_given)  # as tree="auto" (tree_policy)
    raise ValueError(f"tree= grows a tree from a draft model or prompt lookup, not from a "
                     f"{type(drafter).__name__} (a tree drafter is passed as the draft, without tree=)")
