"""Tiny n-gram language models behind the same interface as GPT-2, for exact tests and classes.

A toy model's next-token distribution depends on the last (order - 1) tokens: order 2 is a
bigram model, order 3 a trigram model. With 3-4 tokens in the vocabulary, every possible run of
`generate` or `speculative_generate` can be enumerated (exact.py), so "speculative decoding
samples from the target's distribution" can be checked to 1e-12 instead of with statistics.

The interface is the one in docs/CONTRACTS.md: n_vocab, n_ctx, eot_id, new_cache(),
forward(ids, cache, n_logits) -> [n_logits, n_vocab] logits. The logits are log-probabilities
(-inf where a probability is 0), so softmax(logits) gives the table's row back.

>>> model = ToyModel(np.array([[0.9, 0.1], [0.5, 0.5]]))  # bigram: row = previous token
>>> cache = model.new_cache()
>>> np.exp(model.forward([1, 0], cache, n_logits=2)).round(2).tolist()
[[0.5, 0.5], [0.9, 0.1]]
>>> cache.truncate(1); cache.tokens
[1]

forward_rows and keep_rows are GPT2.forward_rows's and KVCache.keep_rows's (model/rows.py): rows
with positions and a scope, so that a token tree's pass and a draft growing a tree level by level
run on toy models too, and the speculative loop with trees can be enumerated exactly. A row's
context is the first n_shared cached tokens, then the cached rows after them and the new rows its
scope marks, in order (a tree's node: its path); its position must be that context's length - 1,
where a plain forward of the path would put it (GPT-2 reads positions; a toy model checks them).

>>> cache = model.new_cache(); _ = model.forward([0], cache)
>>> np.exp(model.forward_rows([1, 0], [1, 1], [[True, False], [False, True]], cache)).round(2).tolist()
[[0.5, 0.5], [0.9, 0.1]]
>>> cache.keep_rows(1, [1]); cache.tokens
[0, 0]
"""
import numpy as np


class TokenCache:
    """The toy models' "KV cache": the tokens fed so far (an n-gram model needs nothing else)."""

    def __init__(self):
        self.tokens = []

    def __len__(self):
        return len(self.tokens)

    def truncate(self, n):
        """Roll back to the first n tokens, like KVCache.truncate."""
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"cannot truncate a cache of length {len(self.tokens)} to {n}")
        del self.tokens[n:]

    def keep_rows(self, n_past, rows):
        """Keep the first n_past tokens, then the given rows of those fed after them, in that order."""
        n_new = len(self.tokens) - n_past
        if not 0 <= n_past <= len(self.tokens) or len(set(rows)) != len(rows) \
                or any(not 0 <= r < n_new for r in rows):
            raise ValueError(f"cache.keep_rows needs 0 <= n_past <= {len(self.tokens)} and distinct rows in "
                             f"[0, {n_new}), got n_past={n_past}, rows={list(rows)}")
        self.tokens[n_past:] = [self.tokens[n_past + r] for r in rows]


class ToyModel:
    """An n-gram model: table[t_1, ..., t_{order-1}] is the next-token distribution [n_vocab].

    Contexts shorter than order - 1 tokens are padded on the left with token 0.
    """

    def __init__(self, table, n_ctx=64, eot_id=None):
        self.table = np.asarray(table, dtype=np.float64)  # [n_vocab] * order
        self.order, self.n_vocab = self.table.ndim, self.table.shape[-1]
        self.n_ctx, self.eot_id = n_ctx, eot_id
        assert np.allclose(self.table.sum(axis=-1), 1), "each row of the table must sum to 1"

    def __repr__(self):
        return f"ToyModel(order={self.order}, n_vocab={self.n_vocab}, eot_id={self.eot_id})"

    def new_cache(self):
        return TokenCache()

    def forward(self, ids, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        ids = [int(i) for i in ids]
        if not 1 <= n_logits <= len(ids):
            raise ValueError(f"need 1 <= n_logits <= len(ids), got {n_logits}, {len(ids)}")
        if len(cache) + len(ids) > self.n_ctx:
            raise ValueError(f"{len(cache)} cached + {len(ids)} new tokens exceed n_ctx={self.n_ctx}")
        cache.tokens.extend(ids)
        return self.log_rows([cache.tokens[:end] for end in range(len(cache) - n_logits + 1, len(cache) + 1)])

    def forward_rows(self, ids, positions, scope, cache, n_logits=None, n_shared=None):  # -> [n_logits, n_vocab]
        """GPT2.forward_rows on a toy model: row i's context is the first n_shared cached tokens, then
        the cached rows after them and the new rows that scope[i] marks, in order; positions[i] must
        be that context's length - 1. Logits of the last n_logits rows (default: all)."""
        ids = [int(i) for i in ids]
        n_logits, n_shared = len(ids) if n_logits is None else n_logits, len(cache) if n_shared is None else n_shared
        scope = np.asarray(scope, dtype=bool)  # [n_seq, len(cache) - n_shared + n_seq]
        if not 1 <= n_logits <= len(ids) or not 0 <= n_shared <= len(cache) \
                or scope.shape != (len(ids), len(cache) - n_shared + len(ids)):
            raise ValueError(f"forward_rows: n_logits {n_logits}, n_shared {n_shared}, scope {scope.shape} do not "
                             f"fit {len(ids)} rows after {len(cache)} cached tokens")
        if len(cache) + len(ids) > self.n_ctx:
            raise ValueError(f"{len(cache)} cached + {len(ids)} new rows exceed n_ctx={self.n_ctx}")
        seen = cache.tokens[n_shared:] + ids  # the rows a scope column stands for
        contexts = [cache.tokens[:n_shared] + [t for t, s in zip(seen, row) if s] for row in scope]
        wrong = [i for i, c in enumerate(contexts) if int(positions[i]) != len(c) - 1]
        if wrong:
            raise ValueError(f"row {wrong[0]}'s position {positions[wrong[0]]} is not its context's length - 1 "
                             f"({len(contexts[wrong[0]]) - 1})")
        cache.tokens.extend(ids)
        return self.log_rows(contexts[len(ids) - n_logits:])

    def log_rows(self, contexts):  # -> [len(contexts), n_vocab]: log p(next | each context)
        pad = [0] * (self.order - 1)
        rows = np.stack([self.table[tuple((pad + list(c))[len(c):])] for c in contexts])
        with np.errstate(divide="ignore"):  # log(0) = -inf is intended: that token is impossible
            return np.log(rows)


def random_table(rng, n_vocab, order, zero_fraction=0.0):  # -> [n_vocab] * order
    """Random next-token distributions; about zero_fraction of the entries are exactly 0."""
    weights = rng.dirichlet(np.ones(n_vocab), size=(n_vocab,) * (order - 1))  # [n_vocab]*order
    weights = np.where(rng.random(weights.shape) < zero_fraction, 0.0, weights)
    dead_rows = weights.sum(axis=-1) == 0                 # every entry zeroed: revive one token
    weights[dead_rows, rng.integers(n_vocab)] = 1.0
    return weights / weights.sum(axis=-1, keepdims=True)


def random_toy_model(rng, n_vocab=3, order=2, zero_fraction=0.0, n_ctx=64, eot_id=None):
    """A ToyModel with a random table.

    >>> random_toy_model(np.random.default_rng(0), n_vocab=4, order=3)
    ToyModel(order=3, n_vocab=4, eot_id=None)
    """
    return ToyModel(random_table(rng, n_vocab, order, zero_fraction), n_ctx=n_ctx, eot_id=eot_id)
