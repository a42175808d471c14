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
                                  a decode step's one-row blocks together (one_row_attention: each
                                  sequence's own scores and sums, the scale and exp once for the step)

So a sequence's logits differ from its solo run only where a product's float32 sums run in another
order for more rows (measured in tests/model/test_batch_forward.py; attention adds no difference of its
own, block by block or one_row_attention); over one block it is the solo run, bit for bit, and
forward_packed gives one sequence to that run itself (the same numbers; the blocks' bookkeeping cost a
packed step of one sequence 3-5 %: a batching server serving one request).
forward_separately, beside it, is that solo run for every sequence: the reference.
"""
import contextlib
import math

import numpy as np

from .fast.matmul import matmul
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
    kv = linear(x, w[:, n_embd:], b[n_embd:])                       # [n_rows, 2*n_embd]
    k, v = kv.reshape(len(x), 2, n_head, -1).transpose(1, 2, 0, 3)  # 2 x [n_head, n_rows, d_head]
    q = linear(x[out_rows], w[:, :n_embd], b[:n_embd])              # [n_out, n_embd]
    return q.reshape(len(out_rows), n_head, -1).transpose(1, 0, 2), k, v


def cached_attention(q, k, v, cache, layer):  # [n_head, n_out, d_head], 2 x [n_head, n_seq, d_head] -> like q
    """One sequence's attention, as forward.mha does it: write its n_seq keys and values after the
    len(cache) cached ones, then its n_out queries (its last rows) attend causally to all of them."""
    n_past, n_kv = len(cache), len(cache) + k.shape[1]
    cache_k, cache_v = cache.k[layer], cache.v[layer]               # [n_head, cache.n_ctx, d_head]
    cache_k[:, n_past:n_kv] = k                                     # write, never concatenate
    cache_v[:, n_past:n_kv] = v
    return causal_attention(q, cache_k[:, :n_kv], cache_v[:, :n_kv])


def one_row_attention(q, k, v, caches, layer):  # q, k, v [n_head, B, d_head] -> [n_head, B, d_head]
    """cached_attention for B sequences that feed one row each (a batched decode step), with what is the
    same for every sequence done once for all: each row's scores against its own cache go into one
    [B, n_head, 1, max n_kv] array (-inf past a sequence's own keys), scaled and exponentiated there at
    once. Each sequence's sum and weighted values stay its own calls, so every number is cached_attention's
    (over a row padded with zeros, a sum groups its terms in another order). On a small model the per-
    sequence calls are most of a step: 8 sequences of the bundled target, the step 0.88x (PERFORMANCE.md,
    "What each change bought")."""
    n_head, B, d_head = q.shape
    n_kvs = [len(cache) + 1 for cache in caches]
    scores = np.full((B, n_head, 1, max(n_kvs)), -np.inf, dtype=q.dtype)  # [B, n_head, 1, n_max]
    values = []
    for i, (cache, n_kv) in enumerate(zip(caches, n_kvs)):
        cache_k, cache_v = cache.k[layer], cache.v[layer]               # [n_head, cache.n_ctx, d_head]
        cache_k[:, n_kv - 1], cache_v[:, n_kv - 1] = k[:, i], v[:, i]   # write, never concatenate
        np.matmul(q[:, i, None], cache_k[:, :n_kv].transpose(0, 2, 1), out=scores[i, ..., :n_kv])
        values.append(cache_v[:, :n_kv])                                # [n_head, n_kv, d_head]
    scores *= 1.0 / math.sqrt(d_head)                                   # as forward.attention, then its softmax
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))       # exp(-inf) = 0 past each sequence's keys
    sums = np.empty((B, n_head, 1, 1), weights.dtype)
    for i, n_kv in enumerate(n_kvs):
        weights[i, ..., :n_kv].sum(axis=-1, keepdims=True, out=sums[i])  # over its own n_kv terms, as alone
    weights /= sums
    heads = np.empty_like(q)                                            # [n_head, B, d_head]
    for i, (n_kv, value) in enumerate(zip(n_kvs, values)):
        np.matmul(weights[i, ..., :n_kv], value, out=heads[:, i, None])  # [n_head, 1, d_head]
    return heads


SHARE_MIN_SCORES = 1 << 14  # blocks' attention goes to both cores from this many scores in all (sum of n_head *
                            # n_out * n_kv) on; below it a helper's wake-up (40-85 us) eats what it saves (355M,
                            # 8 sequences at context 64: 1.02x, within noise; 124M, 8 at 256: 1.12x; 355M, 8 at
                            # 512: 1.25x; PERFORMANCE.md, "What each change bought")


def shares_the_cores(n_head, q_starts, starts, caches):
    """Whether the blocks' attention is shared between the cores: enough of it in all (SHARE_MIN_SCORES),
    and every block short of forward's BLOCKS_MIN_SCORES (a long block's attention shares itself out,
    block by block, and two of them side by side would each find one core)."""
    n_outs, n_kvs = np.diff(q_starts), [len(cache) + n for cache, n in zip(caches, np.diff(starts))]
    scores = [n_head * n_out * n_kv for n_out, n_kv in zip(n_outs, n_kvs)]
    return bool(len(scores) > 1 and sum(scores) >= SHARE_MIN_SCORES and max(scores) < BLOCKS_MIN_SCORES)


def blocks_attention(q, k, v, caches, layer, starts, q_starts, n_threads):  # -> [n_head, n_out, d_head]
    """Each block's cached_attention against its own cache, the blocks shared between n_threads."""
    heads = [None] * len(caches)

    def attend(i):                                                   # block i against its own cache
        heads[i] = cached_attention(q[:, q_starts[i]:q_starts[i + 1]], k[:, starts[i]:starts[i + 1]],
                                    v[:, starts[i]:starts[i + 1]], caches[i], layer)
    with blas_single_threaded() if n_threads > 1 else contextlib.nullcontext():
        share(attend, range(len(caches)), n_threads)
    return np.concatenate(heads, axis=1)                             # [n_head, n_out, d_head]


def packed_block(x, block, caches, layer, n_head, starts, out_rows, n_outs):  # [n_rows, n_embd] -> [n_out, n_embd]
    """forward.transformer_block over packed rows: the products once over every row, attention per block
    (a decode step's one-row blocks together, where they stay on one core)."""
    q, k, v = packed_qkv(layer_norm(x, **block["ln_1"]), block["attn"]["c_attn"], n_head, out_rows)
    q_starts = np.cumsum([0, *n_outs])                               # block i's queries: q_starts[i]..[i+1]
    n_threads = threads_allowed() if shares_the_cores(q.shape[0], q_starts, starts, caches) else 1
    if n_threads == 1 and len(x) == len(caches):                     # one row a sequence (so one query each)
        heads = one_row_attention(q, k, v, caches, layer)            # [n_head, B, d_head]
    else:
        heads = blocks_attention(q, k, v, caches, layer, starts, q_starts, n_threads)
    residual = x if len(out_rows) == len(x) else x[out_rows]         # [n_out, n_embd]
    x = linear(merge_heads(heads), **block["attn"]["c_proj"], residual=residual)
    return ffn(layer_norm(x, **block["ln_2"]), block["mlp"], residual=x)


def packed_forward(ids, lengths, caches, params, n_head, n_outs):  # [n_rows] -> [sum n_out_i, n_vocab]
    """gpt2_forward for packed blocks of rows (checked by forward_packed): every layer's products once,
    every block's attention against its own cache; logits of each block's last n_out_i rows, in order."""
    positions = np.concatenate([np.arange(len(c), len(c) + n) for c, n in zip(caches, lengths)])  # [n_rows]
    x = params["wte"][ids] + params["wpe"][positions]                # [n_rows, n_embd]
    starts, out_rows = packed_layout(lengths, n_outs)
    every_row = np.arange(len(ids))
    n_layer = len(params["blocks"])
    for layer, block in enumerate(params["blocks"]):                 # the last layer: only the out rows
        last = layer == n_layer - 1
        x = packed_block(x, block, caches, layer, n_head, starts, out_rows if last else every_row,
                         n_outs if last else lengths)
    for cache, n in zip(caches, lengths):
        cache.length += n
    x = layer_norm(x, **params["ln_f"])                              # [sum n_out_i, n_embd]
    return matmul(x, params["wte"].T)                                # tied head: [sum n_out_i, n_vocab]


def check_packed_call(model, calls, n_logits):  # -> ids [B] arrays, n_logits [B] ints
    """The sequences' ids and caches checked as GPT2.forward checks one (one-line ValueErrors naming the
    sequence), n_logits one int for all or one per sequence, and no cache given twice."""
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
        all_ids.append(ids)
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
