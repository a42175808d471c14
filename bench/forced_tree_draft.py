"""forced_draft.py's idea for token trees: a real draft model's cost, acceptance by depth and rank by construction.

Why: random 124M and 1558M models agree on nothing, so a table of chains against trees needs a
draft whose cost is the real draft's and whose acceptance per depth and per sibling rank is set
(to rates measured on real pairs: trees_report.py). Greedy decoding (temperature 0) only.

Construction. `sequence` = prompt + the target's greedy continuation (its baseline), so the token
the target wants at position i is sequence[i]. rates[d][r] = a_{d+1,r} as in tree_shape.py: the
chance that the child of rank r at depth d + 1 is accepted given that its r older siblings were not.
  1. Coins u[i, r] ~ Uniform(0, 1), one per (position, rank), drawn in advance from a seeded
     np.random.Generator: the same coins serve every shape and every alpha of a repeat.
  2. The children proposed for position i at depth d + 1 (d = i - len(context) of the round), in
     rank order: the baseline token g = sequence[i] at the first rank r with u[i, r] < rates[d][r]
     (none if there is no such rank), at every other rank a distinct wrong token (g + 1, g + 2, ...
     mod n_vocab). So rank r holds g with probability rates[d][r] given that no earlier rank does.
  3. Every draft call is the wrapped real model's (ForcedTreeModel: the same forward and
     forward_rows calls, FLOPs, bytes read and KV cache as ModelTreeDrafter makes: one call per
     tree level over that level's rows), then its logits are replaced: each row puts FORCED_LOGIT,
     FORCED_LOGIT - 1, ... on the children of step 2, in rank order, 0 elsewhere. ModelTreeDrafter
     then ranks a node's children by these logits (tree_drafts.draw_children, greedy) and a chain
     takes the argmax (rank 0), so the tree it builds is the forced one, and its q is one-hot at
     the argmax, which is what verify_tree's greedy path needs (it never reads q: it follows the
     child equal to the target's argmax).
A node's row depends only on the position it predicts, not on whether the node is on the correct
path: a node off it is never reached by the greedy kernel, so its children's tokens do not matter
(but its row is computed, the real cost). The target accepts a child iff it equals its argmax, i.e.
g while the run matches the baseline, so acceptance by depth and rank is rates[d][r] (tests check
it through the loop's stats.by_rank). A run that leaves the baseline (a float near-tie resolved
differently by a many-row call) is reported by the bench, as in forced_draft.py.

tree="auto": speculative_generate builds its own drafter for the shapes tree_policy.AutoTree picks
(tree_policy.auto_tree, for a plain draft model only); forced_auto_tree() swaps in a
ForcedTreeDrafter there for the length of a with-block, the way forced_batch_draft.packed_draft_calls
routes the batch loop's calls.

>>> choices = ForcedTreeChoices([1, 2, 3, 4, 5], rates=((1.0, 0.0), (0.0, 1.0)), n_vocab=50)
>>> choices.children(3, 0), choices.children(3, 1)   # depth 1: g = 4 at rank 0; depth 2: at rank 1
([4, 5], [5, 4])
"""
from contextlib import contextmanager

import numpy as np

from gpt2np.decoding import speculative
from gpt2np.decoding.sampling import is_greedy
from gpt2np.decoding.tree_drafters import ModelTreeDrafter
from gpt2np.decoding.tree_policy import AutoTree

from .forced_draft import WrappedModelCaches

FORCED_LOGIT = 10.0  # rank r's logit is FORCED_LOGIT - r; every other token's is 0


def check_rates(rates):  # -> rates as a tuple of tuples of floats in [0, 1], or a one-line ValueError
    rows = tuple(tuple(float(a) for a in row) for row in rates)
    if not rows or len({len(row) for row in rows}) != 1 or not rows[0] \
            or not all(0.0 <= a <= 1.0 for row in rows for a in row):
        raise ValueError(f"rates[d][r]: one row per depth, the same number of ranks in each, every rate in "
                         f"[0, 1], got {rates!r}")
    return rows


class ForcedTreeChoices:
    """Steps 1-2: the children to propose for each position, by depth and rank."""

    def __init__(self, sequence, rates, n_vocab, seed=0):
        self.sequence, self.rates, self.n_vocab = [int(t) for t in sequence], check_rates(rates), n_vocab
        self.ranks = len(self.rates[0])
        if n_vocab <= self.ranks:
            raise ValueError(f"{self.ranks} distinct children need more than {n_vocab} tokens")
        self.coins = np.random.default_rng(seed).random((len(self.sequence) + 1, self.ranks))  # [len + 1, R]

    def rank_of_baseline(self, position, depth):  # -> the rank holding g at that position and depth, or None
        rates = self.rates[min(max(depth, 0), len(self.rates) - 1)]  # past the last row: its rates
        return next((r for r in range(self.ranks) if self.coins[position, r] < rates[r]), None)

    def children(self, position, depth):  # -> [R] distinct tokens, rank order
        """The children of a node that predicts `position` (0-based in the sequence) at depth + 1."""
        if position >= len(self.sequence):
            return list(range(self.ranks))  # past the baseline: never reached when the run matches it
        g = self.sequence[position]
        wrong = [(g + 1 + j) % self.n_vocab for j in range(self.ranks)]  # never g: n_vocab > R
        hit = self.rank_of_baseline(position, depth)
        return wrong if hit is None else wrong[:hit] + [g] + wrong[hit:self.ranks - 1]


class ForcedTreeModel(WrappedModelCaches):
    """Step 3: the model interface (forward, forward_rows, new_cache, ...) around a real GPT2, every
    row's logits forced. round_start: len(context) of the current round (ForcedTreeDrafter sets it),
    so that a row predicting position i is at depth i - round_start + 1; None before the first round,
    where auto reads the prompt (policies.AutoK, 5.): a prompt position's row is at depth 1, as a
    round's first draft (one token past what the target has seen)."""

    def __init__(self, model, choices):
        self.model, self.choices, self.round_start = model, choices, None
        self.n_vocab, self.n_ctx, self.eot_id, self.config = model.n_vocab, model.n_ctx, model.eot_id, model.config
        self.name = f"forced tree around {getattr(model, 'name', None) or 'a model'}"

    def forced_logits(self, predicted):  # [n] positions -> [n, n_vocab]
        logits = np.zeros((len(predicted), self.n_vocab), dtype=np.float32)
        for row, position in enumerate(predicted):
            kids = self.choices.children(position, 0 if self.round_start is None else position - self.round_start)
            logits[row, kids] = FORCED_LOGIT - np.arange(len(kids))
        return logits

    def forward(self, ids, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        self.model.forward(ids, cache, n_logits)  # the real cost; its logits are discarded
        end = len(cache)                          # the last row predicts position `end`
        return self.forced_logits(range(end - n_logits + 1, end + 1))

    def forward_rows(self, ids, positions, scope, cache, n_logits=None, n_shared=None):  # -> [n_logits, n_vocab]
        """A tree level: row i sits at positions[i] and predicts positions[i] + 1."""
        n_logits = len(ids) if n_logits is None else n_logits
        self.model.forward_rows(ids, positions, scope, cache, n_logits, n_shared)  # the real cost
        return self.forced_logits([int(p) + 1 for p in list(positions)[len(ids) - n_logits:]])


class ForcedTreeDrafter(ModelTreeDrafter):
    """ModelTreeDrafter (a fixed shape, or shape= a policy's choice each round) over a ForcedTreeModel:
    its calls, its tree building and its q unchanged; only the logits are forced. shapes_used counts
    the rounds by widths drafted ("plain": none; tree="auto": which shapes AutoTree picked)."""

    def __init__(self, model, sequence, rates, widths, seed=0, shape=None, c_prior=None):
        forced = ForcedTreeModel(model, ForcedTreeChoices(sequence, rates, model.n_vocab, seed))
        super().__init__(forced, widths, c_prior=c_prior, shape=shape)
        if max(self.widths) > forced.choices.ranks:
            raise ValueError(f"widths {self.widths} need rates for {max(self.widths)} ranks, given "
                             f"{forced.choices.ranks}")
        self.shapes_used = {}

    def propose(self, context, k, options, rng):  # -> DraftTree
        if not is_greedy(options["temperature"]):
            raise ValueError("a forced tree drafter forces greedy acceptance: temperature 0 only")
        self.model.round_start = len(context)
        widths = (self.shape() if self.shape else self.widths)[:k] if k >= 1 else "plain"  # k = 0: no drafts
        self.shapes_used[widths] = self.shapes_used.get(widths, 0) + 1
        return super().propose(context, k, options, rng)


@contextmanager
def forced_auto_tree(sequence, rates, seed=0, policy_class=AutoTree):
    """Inside the block, speculative_generate(target, draft_model, ..., tree="auto") drafts with a
    ForcedTreeDrafter around draft_model, for the shapes a fresh policy_class picks (as
    tree_policy.auto_tree builds its ModelTreeDrafter); yields a list that receives each run's drafter."""
    before, made = speculative.auto_tree, []

    def auto_tree(drafter, K_max):
        policy = policy_class(K_max)
        made.append(ForcedTreeDrafter(drafter.model, sequence, rates, (1,) * K_max, seed, shape=policy.current,
                                      c_prior=drafter.c_given))
        return made[-1], policy

    speculative.auto_tree = auto_tree
    try:
        yield made
    finally:
        speculative.auto_tree = before
