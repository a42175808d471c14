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
        padded = [0] * (self.order - 1) + cache.tokens
        ends = range(len(padded) - n_logits, len(padded))  # positions whose next token we predict
        rows = np.stack([self.table[tuple(padded[end - self.order + 2:end + 1])] for end in ends])
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
