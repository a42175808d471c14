"""A preallocated key/value cache that can be rolled back.

Autoregressive decoding feeds one token at a time; without a cache every step would recompute
the keys and values of the whole prefix. We keep them here instead, in buffers allocated once
for the full context (n_ctx), and only *write* into them (openai/gpt-2 concatenates a new array
every step; picoGPT has no cache at all).

Rolling back is the operation speculative decoding needs: after the target rejects some draft
tokens, the cache must look as if those tokens had never been fed. Because attention only ever
reads positions [0, len(cache)), rolling back is just lowering the length: the stale rows past
it are overwritten by the next tokens fed. A token tree's pass (rows.py) writes every node; keeping
the accepted path is keep_rows, which moves its rows down to where a plain pass would have put them.

>>> cache = KVCache.allocate(n_layer=2, n_head=2, n_ctx=8, d_head=4)
>>> cache.k.shape, len(cache)
((2, 2, 8, 4), 0)
>>> cache.length = 5; cache.truncate(3); len(cache)
3
"""
import sys
import threading

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

    def keep_rows(self, n_past, rows):
        """Keep the first n_past positions, then only the given rows of those fed after them, moved
        to n_past, n_past + 1, ...: after a token tree's pass (rows.py), the accepted path's nodes,
        wherever they lie among the tree's flattened rows. keep_rows(n, []) is truncate(n).

        Each kept row's key carries the position it was computed at, so keep only rows whose
        positions were n_past, n_past + 1, ... in the order given (a root-to-node path of the tree).

        >>> cache = KVCache.allocate(n_layer=1, n_head=1, n_ctx=8, d_head=1)
        >>> cache.k[0, 0, :6, 0] = [10, 11, 20, 21, 22, 23]; cache.length = 6
        >>> cache.keep_rows(2, [0, 2]); len(cache), cache.k[0, 0, :len(cache), 0].tolist()
        (4, [10.0, 11.0, 20.0, 22.0])
        """
        if isinstance(n_past, bool) or not isinstance(n_past, (int, np.integer)) or not 0 <= n_past <= self.length:
            raise ValueError(f"cache.keep_rows needs an integer 0 <= n_past <= {self.length}, got {n_past!r}")
        rows = np.asarray(rows) if len(rows) else np.zeros(0, np.int64)  # [n_keep]
        n_new = self.length - n_past
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or ((rows < 0) | (rows >= n_new)).any() \
                or len(np.unique(rows)) != len(rows):
            raise ValueError(f"cache.keep_rows needs distinct rows in [0, {n_new}) (the rows fed after "
                             f"position {n_past}), got {rows.tolist()}")
        kept = slice(n_past, n_past + len(rows))
        self.k[:, :, kept] = self.k[:, :, n_past + rows]  # fancy indexing copies first: no row is
        self.v[:, :, kept] = self.v[:, :, n_past + rows]  # overwritten before it is read
        self.length = n_past + len(rows)


class CachePool:
    """The arrays of caches nobody holds any more, lent again to the next caches of one model.

    Why: a new array's memory is given to the process page by page as it is first written, each page
    zeroed, and a virtual machine may have handed memory freed seconds ago back to its host, which
    backs it again on that write. On the Zen 4 VM of PERFORMANCE.md a 35 MB array written 4 s after
    the last one was freed took ~110 ms, one reused ~6 ms; a 1558M run of 100 tokens writes ~70 MB
    of cache. A process that decodes run after run (a server, the bench) would pay that every run,
    and more for whichever run allocated last (the trees section's auto: 200 ms of its first step).

    allocate() lends the arrays of a cache that is gone (nothing but the pool holds them: no KVCache,
    no view of them anywhere) when they hold at least n_ctx positions, the fewest such: the new cache
    is a view of their first n_ctx positions (rows past a cache's length are never read, so what an
    earlier run left there does not matter). Otherwise it allocates new arrays of exactly n_ctx, and
    forgets the smallest idle pair (none fit), so that the pool never holds more arrays than were in
    use at once. clear() forgets every idle pair.

    >>> pool = CachePool()
    >>> a = pool.allocate(n_layer=1, n_head=2, n_ctx=8, d_head=4); a_keys = a.k
    >>> b = pool.allocate(1, 2, 4, 4)            # a is in use: new arrays
    >>> del a; c = pool.allocate(1, 2, 4, 4)     # a is gone, but its keys are still held
    >>> np.shares_memory(c.k, a_keys), len(pool.pairs)
    (False, 3)
    >>> del a_keys, c; d = pool.allocate(1, 2, 6, 4)  # a's arrays: 8 positions, lent as 6
    >>> d.k.shape, len(pool.pairs)
    ((1, 2, 6, 4), 3)
    """

    def __init__(self):
        self.pairs, self.lock = [], threading.Lock()  # [[k, v, a marker]]: every pair allocated and kept

    @staticmethod
    def idle(pair):  # nothing but the pool holds the arrays: no KVCache, no view of them (a view holds its .base)
        alone = sys.getrefcount(pair[2])  # the marker: an object only this list holds, counted the same way
        return sys.getrefcount(pair[0]) == alone and sys.getrefcount(pair[1]) == alone

    def allocate(self, n_layer, n_head, n_ctx, d_head, dtype=np.float32):
        with self.lock:
            idle = [pair for pair in self.pairs if self.idle(pair)]
            fits = [pair for pair in idle if pair[0].shape[2] >= n_ctx and pair[0].dtype == dtype
                    and pair[0].shape[:2] + pair[0].shape[3:] == (n_layer, n_head, d_head)]
            if fits:
                pair = min(fits, key=lambda pair: pair[0].shape[2])
                cache = KVCache(pair[0][:, :, :n_ctx], pair[1][:, :, :n_ctx])  # 2 x [n_layer, n_head, n_ctx, d_head]
            else:
                if idle:  # none fits: drop one, so that no more pairs are kept than were in use at once
                    smallest = min(idle, key=lambda pair: pair[0].size)
                    self.pairs = [pair for pair in self.pairs if pair is not smallest]
                cache = KVCache.allocate(n_layer, n_head, n_ctx, d_head, dtype)
                self.pairs.append([cache.k, cache.v, object()])
            return cache

    def clear(self):
        with self.lock:
            self.pairs = [pair for pair in self.pairs if not self.idle(pair)]


def check_cache(cache, shape, owner):
    """Raise a one-line ValueError unless cache is a KVCache of `shape` (one of owner's new_cache()),
    or of the same shape with fewer positions (owner's new_cache(n_ctx), sized for one request).

    A cache from another model would be written out of bounds or broadcast silently into wrong keys.
    """
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a KVCache from model.new_cache(), got {type(cache).__name__}")
    n_layer, n_head, n_ctx, d_head = shape
    if cache.k.shape[:2] + cache.k.shape[3:] != (n_layer, n_head, d_head) or not 1 <= cache.n_ctx <= n_ctx:
        raise ValueError(f"this cache is {cache.k.shape} [n_layer, n_head, n_ctx, d_head], but {owner} "
                         f"needs {shape} (or fewer positions): use a cache from this model's new_cache()")


def check_room(cache, n_new, n_ctx, what):
    """Raise a one-line ValueError unless n_new more positions (`what`: "tokens", "rows") fit both the
    model's context n_ctx and the cache (a cache from new_cache(n_ctx) may hold fewer positions)."""
    if len(cache) + n_new > n_ctx:
        raise ValueError(f"{len(cache)} cached + {n_new} new {what} exceed the context of {n_ctx} tokens")
    if len(cache) + n_new > cache.n_ctx:
        raise ValueError(f"{len(cache)} cached + {n_new} new {what} exceed this cache's {cache.n_ctx} "
                         f"positions: allocate a larger one (model.new_cache(n_ctx))")
