"""Causal attention for long inputs, in blocks shared between the cores (forward.attention is the plain form).

forward.attention computes every head's scores [n_seq, n_kv] at once, masks, normalises and
multiplies by v. For a long prompt that is slow three ways: half the scores are masked and
computed for nothing; the scores of all heads (16 x 512 x 512 floats at 355M, 16 MB) stream
through memory several times (max, subtract, exp, sum, divide); and all of it runs on one core.
Here the work is cut into tasks of a few heads and a block of queries each:

  - a block of queries i0..i1 sees the keys up to its last query, n_past + i1, so each block
    reads only those: the masked triangle above it is never computed;
  - only the block's last (i1 - i0) keys can lie in the future of one of its queries, so only
    that square gets the causal mask;
  - one task's scores stay under SCORE_BYTES, within a core's L2 cache, through every pass;
  - softmax is left unnormalised until after the product with v: dividing the [heads, queries,
    d_head] output by the row sums is the same arithmetic as dividing the [heads, queries, keys]
    probabilities, on n_kv / d_head times fewer numbers (flash attention's deferred division);
  - the tasks are shared between the caller and a helper thread (threads.share), with BLAS at
    one thread so the small products run side by side.

The same tasks serve a verification pass at long context (a few queries: heads split between
the cores). Equal to forward.attention up to float32 rounding (tests/model/test_attention.py).
"""
import functools
import math

import numpy as np

from .threads import blas_single_threaded, share

SCORE_BYTES = 1 << 20   # one task's float32 scores [heads, queries, keys]: half of a 2 MiB L2
QUERY_BLOCK = 64        # queries per task in prefill: finer skips more of the masked triangle,
                        # coarser costs fewer Python calls


def tasks(n_head, n_seq, n_kv, n_threads):  # -> ((h0, h1, i0, i1), ...)
    """Heads [h0, h1) and queries [i0, i1) of each task, longest first (the last ones fill gaps).

    >>> tasks(n_head=4, n_seq=1, n_kv=900, n_threads=2)   # one query: heads split between the cores
    ((0, 2, 0, 1), (2, 4, 0, 1))
    """
    n_past = n_kv - n_seq
    block = min(n_seq, QUERY_BLOCK)
    out = []
    for i0 in range(0, n_seq, block):
        i1 = min(n_seq, i0 + block)
        heads = max(1, SCORE_BYTES // (4 * (i1 - i0) * (n_past + i1)))  # heads whose scores fit
        if n_seq == block:
            heads = min(heads, -(-n_head // n_threads))  # a single block of queries: at least one task a core
        out += [(h0, min(n_head, h0 + heads), i0, i1) for h0 in range(0, n_head, heads)]
    return tuple(sorted(out, key=lambda t: -(t[1] - t[0]) * (t[3] - t[2]) * (n_past + t[3])))


def attend_block(q, k, v, out, n_past, task):
    """One task: heads [h0, h1) and queries [i0, i1) of causal attention, written into out.

    Shapes:
        q    [n_head, n_seq, d_head], already scaled by 1 / sqrt(d_head)
        k, v [n_head, n_kv, d_head], the cache up to the last new token
        out  [n_head, n_seq, d_head], this task's part written
    """
    h0, h1, i0, i1 = task
    n_see = n_past + i1                                           # keys the last query of the block sees
    scores = q[h0:h1, i0:i1] @ k[h0:h1, :n_see].transpose(0, 2, 1)  # [heads, queries, n_see]
    if i1 - i0 > 1:  # the block's own keys: query i sees key n_past + j only for j <= i
        scores[:, :, n_see - (i1 - i0):] += causal_square(i1 - i0)
    scores -= scores.max(axis=-1, keepdims=True)                  # softmax, in place, not yet divided
    np.exp(scores, out=scores)
    row_sums = scores.sum(axis=-1, keepdims=True)                 # [heads, queries, 1]
    block = out[h0:h1, i0:i1]                                     # [heads, queries, d_head] view
    np.matmul(scores, v[h0:h1, :n_see], out=block)
    block /= row_sums


@functools.lru_cache(maxsize=8)  # a handful of block sizes; read-only, shared between threads
def causal_square(n):  # -> [n, n]: 0 on and below the diagonal, -1e10 above (forward.causal_mask's values)
    mask = np.triu(np.full((n, n), -1e10, np.float32), k=1)
    mask.flags.writeable = False
    return mask


def attention_in_blocks(q, k, v, n_threads):  # [n_head, n_seq, d_head], 2 x [n_head, n_kv, d_head] -> [n_head, n_seq, d_head]
    """Causal attention of the n_seq new queries (the last of the n_kv positions), task by task."""
    n_head, n_seq, d_head = q.shape
    n_kv = k.shape[1]
    q = np.multiply(q, 1.0 / math.sqrt(d_head), order="C")      # [n_head, n_seq, d_head], scaled once
    out = np.empty((n_seq, n_head, d_head), np.float32).transpose(1, 0, 2)  # merge_heads then copies nothing
    with blas_single_threaded():
        share(lambda task: attend_block(q, k, v, out, n_kv - n_seq, task),
              tasks(n_head, n_seq, n_kv, n_threads), n_threads)
    return out
