"""Several sequences in one forward pass: their new rows packed into one matrix (Orca, Yu et al. 2022,
"selective batching"; rows.py's packed scope, each block a chain).

On a CPU a weight product costs nearly the same for a few rows as for one: the weights are read from
memory once either way (matmul.py). Decoding B sequences one at a time reads every weight B times per
step; packed, once. Each sequence keeps its own KV cache and length, so no row is padded:

    x          [n_rows, n_embd]   n_rows = sum n_i: sequence i's n_i new rows, one block after the other
    positions  [n_rows]           block i's rows at len(cache_i), len(cache_i) + 1, ... (its own wpe rows)
    products   over all n_rows    c_attn, c_proj, the MLP, the output head: one read of each weight
    attention  block by block     block i's queries against cache_i (its keys and values written there
                                  first), causal within the block: forward.causal_attention, the call
                                  GPT2.forward makes for that sequence alone (blocked at long prefill too);
                                  the blocks shared between the cores where that pays (shares_the_cores);
                                  or together where padding them costs little (attention_together: each
                                  block's own scores and sums, the scale, mask and exp once for the step)

So a sequence's logits differ from its solo run only where a product's float32 sums run in another
order for more rows (measured in tests/model/test_batch_forward.py; attention adds no difference of its
own, block by block or together); over one block it is the solo run, bit for bit, and
forward_packed gives one sequence to that run itself (the same numbers; the blocks' bookkeeping cost a
packed step of one sequence 3-5 %: a batching server serving one request).
forward_separately, beside it, is that solo run for every sequence: the reference.
"""
import contextlib
import itertools
import math
from typing import NamedTuple

import numpy as np

from .fast.matmul import columns, matmul
from .fast.threads import blas_single_threaded, share, threads_allowed
from .forward import (BLOCKS_MIN_SCORES, GPT2, causal_attention, ffn, gpt2_forward, layer_norm, linear, merge_heads,
                      split_heads, token_id_array)
from .kv_cache import check_cache, check_room


def packed_layout(lengths, n_outs):  # -> starts [B + 1], out_rows [sum n_out_i]
    """Where each block starts (and the end), and which rows go on past the last layer's attention:
    the last n_out_i rows of block i (the rows whose logits are wanted).

    >>> starts, out_rows = packed_layout([3, 1, 2], [1, 1, 2])
    >>> starts.tolist(), out_rows.tolist()
    ([0, 3, 4, 6], [2, 3, 4, 5])
    """
    starts = np.cumsum([0, *lengths])
    out_rows = np.concatenate([np.arange(stop - n_out, stop) for stop, n_out in zip(starts[1:], n_outs)])
    return starts, out_rows


def packed_qkv(x, c_attn, n_head, out_rows):  # -> q [n_head, n_out, d_head], k, v [n_head, n_rows, d_head]
    """forward.qkv_heads where the rows that need a query lie anywhere (each block's last rows), not only
    at the end: the keys and values of every row (they go to the caches), queries for out_rows only."""
    if len(out_rows) == len(x):
        return split_heads(linear(x, **c_attn), n_head)             # one product: [n_rows, 3*n_embd]
    w, b, n_embd = c_attn["w"], c_attn["b"], x.shape[1]             # w's column blocks: q, k, v
    kv = linear(x, columns(w, n_embd, 3 * n_embd), b[n_embd:])      # [n_rows, 2*n_embd]
    k, v = kv.reshape(len(x), 2, n_head, -1).transpose(1, 2, 0, 3)  # 2 x [n_head, n_rows, d_head]
    q = linear(x[out_rows], columns(w, 0, n_embd), b[:n_embd])      # [n_out, n_embd]
    return q.reshape(len(out_rows), n_head, -1).transpose(1, 0, 2), k, v


def written(cache, layer, k, v):  # 2 x [n_head, n_seq, d_head] -> keys, values [n_head, len(cache) + n_seq, d_head]
    """One sequence's keys and values of this layer with its n_seq new ones written after the len(cache)
    cached ones (the cache's length grows once the whole pass is done)."""
    n_past, n_kv = len(cache), len(cache) + k.shape[1]
    cache_k, cache_v = cache.k[layer], cache.v[layer]               # [n_head, cache.n_ctx, d_head]
    cache_k[:, n_past:n_kv] = k                                     # write, never concatenate
    cache_v[:, n_past:n_kv] = v
    return cache_k[:, :n_kv], cache_v[:, :n_kv]


def cached_attention(q, k, v, cache, layer):  # [n_head, n_out, d_head], 2 x [n_head, n_seq, d_head] -> like q
    """One sequence's attention, as forward.mha does it: write its n_seq keys and values after the
    len(cache) cached ones, then its n_out queries (its last rows) attend causally to all of them."""
    return causal_attention(q, *written(cache, layer, k, v))


def padded_mask(n_outs, n_kvs):  # (B ints, B ints) -> [B, 1, max n_out, max n_kv] float32
    """What attention_together adds to its padded scores: 0 where block i's query j may look (key
    positions up to its own, n_kv_i - n_out_i + j), -inf elsewhere (after it, past the block's keys);
    a padding row (j >= n_out_i) sees key 0 only, so that its softmax stays finite (it is dropped).

    >>> padded_mask([1, 2], [2, 3])[:, 0].tolist()
    [[[0.0, 0.0, -inf], [0.0, -inf, -inf]], [[0.0, 0.0, -inf], [0.0, 0.0, 0.0]]]
    """
    n_outs, n_kvs = np.array(n_outs)[:, None, None], np.array(n_kvs)[:, None, None]  # [B, 1, 1]
    query = np.arange(n_outs.max())[None, :, None]                   # [1, n_q, 1]
    key = np.arange(n_kvs.max())[None, None, :]                      # [1, 1, n_kv]
    sees = np.where(query < n_outs, key <= n_kvs - n_outs + query, key == 0)  # [B, n_q, n_kv]
    return np.where(sees, 0.0, -np.inf).astype(np.float32)[:, None]  # [B, 1, n_q, n_kv]


SHARE_MIN_SCORES = 1 << 14  # blocks' attention goes to both cores from this many scores in all (sum of n_head *
                            # n_out * n_kv) on; below it a helper's wake-up (40-85 us) eats what it saves (355M,
                            # 8 sequences at context 64: 1.02x, within noise; 124M, 8 at 256: 1.12x; 355M, 8 at
                            # 512: 1.25x; PERFORMANCE.md, "What each change bought")
PAD_FREE_SCORES = 1 << 14   # padded scores this few cost attention_together's elementwise calls next to nothing


def shares_the_cores(scores):  # scores [B] ints: block i's n_head * n_out_i * n_kv_i
    """Whether the blocks' attention is shared between the cores: enough of it in all (SHARE_MIN_SCORES),
    and every block short of forward's BLOCKS_MIN_SCORES (a long block's attention shares itself out,
    block by block, and two of them side by side would each find one core)."""
    return len(scores) > 1 and sum(scores) >= SHARE_MIN_SCORES and max(scores) < BLOCKS_MIN_SCORES


def pads_little(scores, padded):  # scores [B] ints as above; padded: attention_together's, all heads
    """Whether the blocks' attention runs together (attention_together): two blocks or more, every one
    short of forward's BLOCKS_MIN_SCORES, and the padded scores few (PAD_FREE_SCORES) or at most twice
    the blocks' own (sequences of about one length feeding about as many rows: a decode step, a
    speculative round's verification)."""
    return len(scores) > 1 and max(scores) < BLOCKS_MIN_SCORES and padded <= max(2 * sum(scores), PAD_FREE_SCORES)


class StepAttention(NamedTuple):
    """How every layer of one packed step runs its blocks' attention (the last layer, which goes on
    with only the rows whose logits are wanted, has its own): plain ints, worked out once a step."""
    starts: list     # [B + 1] block i's rows (its keys and values): starts[i] .. starts[i + 1]
    q_starts: list   # [B + 1] block i's queries (its last rows): q_starts[i] .. q_starts[i + 1]
    n_kvs: list      # [B] block i's keys once this step's are written: len(cache_i) + n_i
    n_threads: int   # the cores the blocks are shared between (shares_the_cores), else 1
    mask: object     # padded_mask where the blocks run together (pads_little, on one core), else None


def step_attention(n_head, starts, n_outs, caches):  # -> StepAttention
    """The plan a packed step's layers share: where each block's rows and queries lie, its keys once
    written, and how its attention runs (shared between the cores, together, or block by block)."""
    starts, n_outs = [int(start) for start in starts], [int(n_out) for n_out in n_outs]
    q_starts = [0, *itertools.accumulate(n_outs)]
    n_kvs = [len(cache) + stop - start for cache, start, stop in zip(caches, starts, starts[1:])]
    scores = [n_head * n_out * n_kv for n_out, n_kv in zip(n_outs, n_kvs)]
    n_threads = threads_allowed() if shares_the_cores(scores) else 1
    together = n_threads == 1 and pads_little(scores, n_head * len(caches) * max(n_outs) * max(n_kvs))
    return StepAttention(starts, q_starts, n_kvs, n_threads, padded_mask(n_outs, n_kvs) if together else None)


def blocks_attention(q, k, v, caches, layer, plan):  # -> [n_head, n_out, d_head]
    """Each block's cached_attention against its own cache, the blocks shared between plan.n_threads."""
    heads, starts, q_starts = [None] * len(caches), plan.starts, plan.q_starts

    def attend(i):                                                   # block i against its own cache
        heads[i] = cached_attention(q[:, q_starts[i]:q_starts[i + 1]], k[:, starts[i]:starts[i + 1]],
                                    v[:, starts[i]:starts[i + 1]], caches[i], layer)
    with blas_single_threaded() if plan.n_threads > 1 else contextlib.nullcontext():
        share(attend, range(len(caches)), plan.n_threads)
    return np.concatenate(heads, axis=1)                             # [n_head, n_out, d_head]


def attention_together(q, k, v, caches, layer, plan):  # -> [n_head, n_out, d_head]
    """Every block's cached_attention, with what is the same for every block done once for the step:
    each block's scores against its own cache go into one [B, n_head, max n_out, max n_kv] array,
    scaled, masked (plan.mask) and exponentiated there at once. Each block's sums and weighted values
    stay its own calls, so every number is cached_attention's (over a padded row a sum groups its terms
    otherwise; a masked score is -inf here, -1e10 there: both exponentiate to 0). On a small model the
    per-block calls are most of a step: 8 sequences of the bundled target, a decode step 0.88-0.94x, a
    verification of 5 rows each 0.84x (PERFORMANCE.md, "What each change bought")."""
    n_head, n_out, d_head = q.shape
    starts, q_starts = plan.starts, plan.q_starts
    scores = np.zeros((len(caches), n_head, *plan.mask.shape[2:]), q.dtype)  # [B, n_head, n_q, n_kv]
    values = []
    for i, (cache, n_kv) in enumerate(zip(caches, plan.n_kvs)):
        keys, block_values = written(cache, layer, k[:, starts[i]:starts[i + 1]], v[:, starts[i]:starts[i + 1]])
        np.matmul(q[:, q_starts[i]:q_starts[i + 1]], keys.transpose(0, 2, 1),
                  out=scores[i, :, :q_starts[i + 1] - q_starts[i], :n_kv])  # [n_head, n_q_i, n_kv]
        values.append(block_values)                                  # [n_head, n_kv, d_head]
    scores *= 1.0 / math.sqrt(d_head)                                # as forward.attention, then its mask
    scores += plan.mask
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))    # and its softmax's numerator
    sums = np.ones((*scores.shape[:3], 1), weights.dtype)            # [B, n_head, n_q, 1]
    heads = np.empty((n_head, n_out, d_head), q.dtype)
    for i, n_kv in enumerate(plan.n_kvs):
        n_q = q_starts[i + 1] - q_starts[i]
        weights[i, :, :n_q, :n_kv].sum(axis=-1, keepdims=True, out=sums[i, :, :n_q])  # its own terms, as alone
    weights /= sums
    for i, (value, n_kv) in enumerate(zip(values, plan.n_kvs)):
        np.matmul(weights[i, :, :q_starts[i + 1] - q_starts[i], :n_kv], value,
                  out=heads[:, q_starts[i]:q_starts[i + 1]])         # [n_head, n_q_i, d_head]
    return heads


def packed_block(x, block, caches, layer, n_head, plan, out_rows):  # [n_rows, n_embd] -> [n_out, n_embd]
    """forward.transformer_block over packed rows: the products once over every row, attention per block
    (together, where plan.mask says so)."""
    q, k, v = packed_qkv(layer_norm(x, **block["ln_1"]), block["attn"]["c_attn"], n_head, out_rows)
    attend = attention_together if plan.mask is not None else blocks_attention
    heads = attend(q, k, v, caches, layer, plan)                     # [n_head, n_out, d_head]
    residual = x if len(out_rows) == len(x) else x[out_rows]         # [n_out, n_embd]
    x = linear(merge_heads(heads), **block["attn"]["c_proj"], residual=residual)
    return ffn(layer_norm(x, **block["ln_2"]), block["mlp"], residual=x)


def packed_forward(ids, lengths, caches, params, n_head, n_outs):  # [n_rows] -> [sum n_out_i, n_vocab]
    """gpt2_forward for packed blocks of rows (checked by forward_packed): every layer's products once,
    every block's attention against its own cache; logits of each block's last n_out_i rows, in order."""
    positions = np.concatenate([np.arange(len(c), len(c) + n) for c, n in zip(caches, lengths)])  # [n_rows]
    x = params["wte"][ids] + params["wpe"][positions]                # [n_rows, n_embd]
    starts, out_rows = packed_layout(lengths, n_outs)
    every_row, plan = np.arange(len(ids)), step_attention(n_head, starts, lengths, caches)
    last_plan = plan if list(n_outs) == list(lengths) else step_attention(n_head, starts, n_outs, caches)
    n_layer = len(params["blocks"])
    for layer, block in enumerate(params["blocks"]):                 # the last layer: only the out rows
        last = layer == n_layer - 1
        x = packed_block(x, block, caches, layer, n_head, last_plan if last else plan,
                         out_rows if last else every_row)
    for cache, n in zip(caches, lengths):
        cache.length += n
    x = layer_norm(x, **params["ln_f"])                              # [sum n_out_i, n_embd]
    return matmul(x, params["wte"].T)                                # tied head: [sum n_out_i, n_vocab]


def check_packed_call(model, calls, n_logits):  # -> ids [B] np.intp arrays, n_logits [B] ints
    """The sequences' ids and caches checked as GPT2.forward checks one (one-line ValueErrors naming the
    sequence), n_logits one int for all or one per sequence, and no cache given twice. Ids of any integer
    dtype come back as np.intp, so that every sequence's ids concatenate to one integer array."""
    if not isinstance(model, GPT2):
        raise ValueError(f"forward_packed needs a GPT2 model, got {type(model).__name__}")
    if not isinstance(calls, (list, tuple)) or not calls:
        raise ValueError("forward_packed needs a non-empty list of (ids, cache) pairs, one per sequence")
    n_logits = list(n_logits) if isinstance(n_logits, (list, tuple)) else [n_logits] * len(calls)
    if len(n_logits) != len(calls):
        raise ValueError(f"n_logits: one per sequence ({len(calls)}), got {len(n_logits)}")
    c, seen, all_ids = model.config, set(), []
    for i, ((ids, cache), n_out) in enumerate(zip(calls, n_logits)):
        ids = token_id_array(ids, model.n_vocab, what=f"sequence {i}'s token ids")
        if isinstance(n_out, bool) or not isinstance(n_out, (int, np.integer)) or not 1 <= n_out <= len(ids):
            raise ValueError(f"sequence {i}: need 1 <= n_logits <= len(ids), "
                             f"got n_logits={n_out!r}, len(ids)={len(ids)}")
        check_cache(cache, (c.n_layer, c.n_head, c.n_ctx, c.d_head), model.name)
        check_room(cache, len(ids), model.n_ctx, f"tokens (sequence {i})")
        if id(cache) in seen:
            raise ValueError(f"sequence {i}'s cache is also another sequence's: each needs its own")
        seen.add(id(cache))
        all_ids.append(ids.astype(np.intp, copy=False))  # uint64 with int64 would concatenate to float64
    return all_ids, [int(n) for n in n_logits]


def forward_packed(model, calls, n_logits=1):  # [(ids_i [n_i], cache_i)] -> [[n_logits_i, n_vocab]]
    """GPT2.forward for several sequences in one pass: calls = [(ids_i, cache_i), ...], each ids_i fed
    after its own cache; n_logits one int for all or one per sequence. Returns each sequence's logits
    for its last n_logits_i rows, and every cache grows by its n_i, as separate forward calls would.

    >>> import gpt2np
    >>> model = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=50, n_ctx=16, n_embd=8, n_head=2, n_layer=1))
    >>> a, b = model.new_cache(), model.new_cache(n_ctx=4)
    >>> [x.shape for x in forward_packed(model, [([1, 2, 3], a), ([7], b)])], len(a), len(b)
    ([(1, 50), (1, 50)], 3, 1)
    """
    ids, n_outs = check_packed_call(model, calls, n_logits)
    caches = [cache for _, cache in calls]
    if len(calls) == 1:  # one sequence: its own forward pass (module docstring)
        return [gpt2_forward(ids[0], model.params, model.config.n_head, caches[0], n_outs[0])]
    logits = packed_forward(np.concatenate(ids), [len(i) for i in ids], caches, model.params,
                            model.config.n_head, n_outs)             # [sum n_out_i, n_vocab]
    return np.split(logits, np.cumsum(n_outs)[:-1])                  # B x [n_out_i, n_vocab]


def forward_separately(model, calls, n_logits=1):  # the reference: the same, one model.forward per sequence
    """forward_packed's reference: each sequence alone through model.forward, one after the other."""
    n_logits = list(n_logits) if isinstance(n_logits, (list, tuple)) else [n_logits] * len(calls)
    return [model.forward(ids, cache, n_out) for (ids, cache), n_out in zip(calls, n_logits)]
