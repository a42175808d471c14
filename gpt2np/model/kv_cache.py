"""A preallocated key/value cache that can be rolled back.

Autoregressive decoding feeds one token at a time; without a cache every step would recompute
the keys and values of the whole prefix. We keep them here instead, in buffers allocated once
for the full context (n_ctx), and only *write* into them (openai/gpt-2 concatenates a new array
every step; picoGPT has no cache at all).

Rolling back is the operation speculative decoding needs: after the target rejects some draft
tokens, the cache must look as if those tokens had never been fed. Because attention only ever
reads positions [0, len(cache)), rolling back is just lowering the length: the stale rows past
it are overwritten by the next tokens fed.

>>> cache = KVCache.allocate(n_layer=2, n_head=2, n_ctx=8, d_head=4)
>>> cache.k.shape, len(cache)
((2, 2, 8, 4), 0)
>>> cache.length = 5; cache.truncate(3); len(cache)
3
"""
import numpy as np


class KVCache:
    """Keys and values of every layer for the first `length` positions.

    k, v: [n_layer, n_head, n_ctx, d_head] float32, heads first so that each head's keys are
    contiguous rows, which is what `q @ k.T` wants.
    """

    def __init__(self, k, v, length=0):
        assert k.shape == v.shape and k.ndim == 4, (k.shape, v.shape)
        self.k, self.v, self.length = k, v, length

    @classmethod
    def allocate(cls, n_layer, n_head, n_ctx, d_head, dtype=np.float32):
        shape = (n_layer, n_head, n_ctx, d_head)
        return cls(np.zeros(shape, dtype), np.zeros(shape, dtype))

    @property
    def n_ctx(self):
        return self.k.shape[2]

    def __len__(self):
        return self.length

    def truncate(self, n):
        """Roll back to the first n positions: everything fed after them is forgotten."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):  # 1.5 would pass 0 <= n <= length
            raise ValueError(f"cache.truncate needs an integer length, got {n!r}")
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {n}")
        self.length = int(n)

    def copy(self):
        return KVCache(self.k.copy(), self.v.copy(), self.length)


def check_cache(cache, shape, owner):
    """Raise a one-line ValueError unless cache is a KVCache of `shape` (one of owner's new_cache()).

    A cache from another model would be written out of bounds or broadcast silently into wrong keys.
    """
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a KVCache from model.new_cache(), got {type(cache).__name__}")
    if cache.k.shape != shape:
        raise ValueError(f"this cache is {cache.k.shape} [n_layer, n_head, n_ctx, d_head], but {owner} "
                         f"needs {shape}: use a cache from this model's new_cache()")
