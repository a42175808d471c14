"""The GPT-2 forward pass in NumPy, with a KV cache (Radford et al. 2019, openai/gpt-2 model.py).

Dimension names used in every shape comment:
    n_seq   tokens fed in this call           n_past  tokens already in the cache
    n_kv    n_past + n_seq (keys attended to)  n_embd  width of the residual stream
    n_head  attention heads                   d_head  n_embd // n_head
    n_vocab vocabulary size                   n_ctx   longest context the model accepts
    n_layer transformer blocks                n_logits positions whose logits are returned

Everything is float32. NumPy 2 promotes float32 arrays mixed with float64 *arrays or NumPy
scalars* to float64 (11x slower), so constants below are Python floats, which never promote.

The slow, cache-free oracle this file is tested against lives in reference.py. Rows with explicit
positions and an attention scope (a token tree's nodes; later, packed sequences) are described in
rows.py; GPT2.forward_rows runs them through the same layers as forward, with that scope's mask.
"""
import functools
import math

import numpy as np

from .cost_probe import probe_repeats, row_cost_shape
from .fast.blocked_attention import attention_in_blocks
from .fast.layout import weights_order
from .kv_cache import CachePool, check_cache, check_room
from .rows import check_rows, scope_mask
from .fast.matmul import columns, matmul
from .fast.threads import in_row_blocks, rowwise, threads_allowed

BLOCKS_MIN_SCORES = 1 << 15  # attention goes in blocks from this many scores (n_head * n_seq * n_kv) on:
                             # prefill, and verification at long context, where blocks on both cores pay
                             # for their hand-offs; one query against 896 keys stays plain (splitting its
                             # heads between the cores was no faster: PERFORMANCE.md, "Long prompts")


def gelu(x, out=None):
    """GPT-2's tanh approximation of GELU (Hendrycks & Gimpel 2016), not the erf form:

        0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

    computed in one buffer (the formula as written makes 8 temporaries and took 1.4-1.6x as long),
    the result written into out if given (out=x is fine: x is read for the last time there)."""
    c = math.sqrt(2.0 / math.pi)
    y = x * x              # not x**3: NumPy's float32 power of negative numbers is ~100x slower
    y *= 0.044715 * c
    y += c
    y *= x                 # sqrt(2/pi) (x + 0.044715 x^3)
    np.tanh(y, out=y)
    y += 1.0
    y *= 0.5               # exact (a power of two): the same numbers as multiplying by 0.5 last
    return np.multiply(x, y, out=out)


def softmax(x):  # [..., n] -> [..., n]
    """Softmax over the last axis; subtracting the max changes nothing but prevents overflow."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)  # in place: one array fewer per call
    return e


@rowwise
def layer_norm(x, g, b, eps=1e-5, out=None):  # [n_seq, n_embd] -> [n_seq, n_embd]
    """Normalise each row to mean 0 and variance 1, then scale by g and shift by b (into out if given)."""
    inv_n = 1.0 / x.shape[-1]  # np.add.reduce, not x.mean(): mean's Python wrapper costs more here
    centred = np.subtract(x, np.add.reduce(x, axis=-1, keepdims=True) * inv_n, out=out)
    variance = np.einsum("...i,...i->...", centred, centred)[..., None] * inv_n  # each row's sum of squares:
    centred /= np.sqrt(variance + eps)  # in place from here on   # no [n_seq, n_embd] temporary
    centred *= g
    centred += b
    return centred


def linear(x, w, b, activation=None, residual=None):  # [m, in], [in, out], [out] -> [m, out]
    """GPT-2's Conv1D, x @ w + b: w is [in, out], so there is no transpose (unlike torch's Linear);
    then activation(x @ w + b), or residual + x @ w + b, where asked.

    matmul is x @ w, made fast for the few rows of a verification pass (matmul.py). What follows
    it is done in place, a block of rows at a time: on a long prompt each block is read once while
    it is in the core's cache, and the blocks are shared between the cores (threads.py)."""
    y = matmul(x, w)                      # [m, out]

    def finish(r0, r1):                   # rows [r0, r1) of y, in place
        block = y[r0:r1]
        block += b
        if residual is not None:
            block += residual[r0:r1]
        if activation is not None:
            activation(block, out=block)
    in_row_blocks(finish, y)
    return y


@functools.lru_cache(maxsize=4)  # every layer of one forward pass uses the same mask
def causal_mask(n_seq, n_kv):  # -> [n_seq, n_kv], read-only
    """Additive mask: 0 where query i may see key j, a large negative number elsewhere.

    The n_seq queries are the *last* n_seq of the n_kv positions (the first n_past come from the
    cache), so the triangle is anchored at the lower-right corner, as in openai/gpt-2's
    `attention_mask`. Verifying K draft tokens feeds K+1 queries against n_past + K+1 keys.

    >>> causal_mask(2, 4)
    array([[ 0.e+00,  0.e+00,  0.e+00, -1.e+10],
           [ 0.e+00,  0.e+00,  0.e+00,  0.e+00]], dtype=float32)
    """
    query_pos = np.arange(n_seq)[:, None] + (n_kv - n_seq)  # [n_seq, 1] absolute positions
    key_pos = np.arange(n_kv)[None, :]                       # [1, n_kv]
    mask = np.where(key_pos <= query_pos, 0.0, -1e10).astype(np.float32)
    mask.flags.writeable = False  # shared between calls through the cache
    return mask


def split_heads(qkv, n_head):  # [n_seq, 3*n_embd] -> [3, n_head, n_seq, d_head]: q, k, v
    """Cut qkv into q, k and v (its three n_embd-wide blocks), and each of them into n_head heads.

    One reshape, no copies: np.split and three reshapes cost ~30 us more a layer in a decode step."""
    n_seq = qkv.shape[0]
    return qkv.reshape(n_seq, 3, n_head, -1).transpose(1, 2, 0, 3)


def merge_heads(x):  # [n_head, n_seq, d_head] -> [n_seq, n_embd]
    n_head, n_seq, d_head = x.shape
    return x.transpose(1, 0, 2).reshape(n_seq, n_head * d_head)


def attention(q, k, v, mask):  # [n_head, n_seq, d_head], 2 x [n_head, n_kv, d_head] -> [n_head, n_seq, d_head]
    """softmax(q k^T / sqrt(d_head) + mask) v, for every head at once."""
    scores = q @ k.transpose(0, 2, 1)                           # [n_head, n_seq, n_kv]
    scores *= 1.0 / math.sqrt(q.shape[-1])                      # in place, as below: no new array
    if mask is not None:
        scores += mask                                          # broadcast over heads
    return softmax(scores) @ v                                  # [n_head, n_seq, d_head]


def causal_attention(q, k, v):  # [n_head, n_seq, d_head], 2 x [n_head, n_kv, d_head] -> [n_head, n_seq, d_head]
    """attention() with the causal mask, for the n_seq new queries (the last n_seq of n_kv positions).

    Long inputs go to fast/blocked_attention.py, which computes the same in blocks on every core allowed."""
    n_head, n_seq, d_head = q.shape
    n_kv = k.shape[1]
    if n_head * n_seq * n_kv >= BLOCKS_MIN_SCORES:
        return attention_in_blocks(q, k, v, threads_allowed())
    return attention(q, k, v, causal_mask(n_seq, n_kv) if n_seq > 1 else None)  # one query sees every key


def qkv_heads(x, c_attn, n_head, n_out):  # [n_seq, n_embd] -> [n_head, n_out, d_head], 2 x [n_head, n_seq, d_head]
    """Queries of the last n_out rows, keys and values of every row, split into heads.

    n_out < n_seq only in the last layer of a prefill: the keys and values of every position go
    to the cache, but only the positions whose logits are wanted need a query (and what follows it)."""
    if n_out == len(x):
        return split_heads(linear(x, **c_attn), n_head)         # one product: [n_seq, 3*n_embd]
    w, b, n_embd = c_attn["w"], c_attn["b"], x.shape[1]         # w's column blocks: q, k, v
    kv = linear(x, columns(w, n_embd, 3 * n_embd), b[n_embd:])  # [n_seq, 2*n_embd]
    k, v = kv.reshape(len(x), 2, n_head, -1).transpose(1, 2, 0, 3)  # 2 x [n_head, n_seq, d_head]
    q = linear(x[-n_out:], columns(w, 0, n_embd), b[:n_embd])   # [n_out, n_embd]
    return q.reshape(n_out, n_head, -1).transpose(1, 0, 2), k, v


def mha(x, attn, cache_k, cache_v, n_past, n_head, n_out):  # [n_seq, n_embd] -> [n_out, n_embd]
    """Multi-head causal self-attention that appends this call's keys and values to the cache,
    for the last n_out of the n_seq rows (all of them, except in a prefill's last layer).

    cache_k, cache_v: [n_head, n_ctx, d_head], this layer's slice of the KVCache (written in place).
    """
    n_kv = n_past + len(x)
    q, k, v = qkv_heads(x, attn["c_attn"], n_head, n_out)       # [n_head, n_out | n_seq, d_head]
    cache_k[:, n_past:n_kv] = k                                 # write, never concatenate
    cache_v[:, n_past:n_kv] = v
    return causal_attention(q, cache_k[:, :n_kv], cache_v[:, :n_kv])  # [n_head, n_out, d_head]


def ffn(x, mlp, residual=None):  # [n_seq, n_embd] -> [n_seq, n_embd]: mlp(x), plus residual if given
    h = linear(x, **mlp["c_fc"], activation=gelu)                # [n_seq, 4*n_embd]
    return linear(h, **mlp["c_proj"], residual=residual)


def transformer_block(x, block, cache, layer, n_head, n_out=None):  # [n_seq, n_embd] -> [n_out, n_embd]
    """Pre-LN residual block: x + attention(ln_1(x)), then x + mlp(ln_2(x)), for the last n_out
    rows (default: all n_seq); the keys and values of all n_seq go to the cache."""
    n_out = len(x) if n_out is None else n_out
    heads = mha(layer_norm(x, **block["ln_1"]), block["attn"], cache.k[layer], cache.v[layer],
                len(cache), n_head, n_out)                      # [n_head, n_out, d_head]
    x = linear(merge_heads(heads), **block["attn"]["c_proj"], residual=x[len(x) - n_out:])  # [n_out, n_embd]
    return ffn(layer_norm(x, **block["ln_2"]), block["mlp"], residual=x)


def gpt2_forward(ids, params, n_head, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
    """Feed ids after the len(cache) cached tokens; return logits for the last n_logits of them.

    Only the positions asked for go through the final layer norm and the output head: for
    decoding that is one row instead of n_seq, and the head is the biggest product in the model.
    """
    ids = np.asarray(ids)
    n_past, n_seq = len(cache), len(ids)
    x = params["wte"][ids] + params["wpe"][n_past:n_past + n_seq]  # [n_seq, n_embd]
    n_layer = len(params["blocks"])
    for layer, block in enumerate(params["blocks"]):              # the last layer: only n_logits rows out
        x = transformer_block(x, block, cache, layer, n_head, n_seq if layer < n_layer - 1 else n_logits)
    cache.length = n_past + n_seq
    x = layer_norm(x, **params["ln_f"])                           # [n_logits, n_embd]
    return matmul(x, params["wte"].T)                             # tied head: [n_logits, n_vocab]


def rows_block(x, block, cache, layer, n_head, mask):  # [n_seq, n_embd] -> [n_out, n_embd], n_out = len(mask)
    """transformer_block with a given additive mask [n_out, n_past + n_seq] instead of the causal one
    (rows.py): every row's key and value go to the cache, the last n_out rows' queries attend."""
    n_past, n_out = len(cache), len(mask)
    cache_k, cache_v = cache.k[layer], cache.v[layer]
    q, k, v = qkv_heads(layer_norm(x, **block["ln_1"]), block["attn"]["c_attn"], n_head, n_out)
    cache_k[:, n_past:n_past + len(x)] = k                      # row order, whatever the positions
    cache_v[:, n_past:n_past + len(x)] = v
    heads = attention(q, cache_k[:, :n_past + len(x)], cache_v[:, :n_past + len(x)], mask)  # [n_head, n_out, d_head]
    x = linear(merge_heads(heads), **block["attn"]["c_proj"], residual=x[len(x) - n_out:])  # [n_out, n_embd]
    return ffn(layer_norm(x, **block["ln_2"]), block["mlp"], residual=x)


def gpt2_rows_forward(ids, positions, scope, params, n_head, cache, n_logits, n_shared):  # -> [n_logits, n_vocab]
    """gpt2_forward for rows at the given positions, each seeing the first n_shared cached positions
    and the rows its scope names (rows.py); logits for the last n_logits rows. Always the plain
    attention with a mask: a tree's few rows never need the blocks that a long chain's prefill takes."""
    mask = scope_mask(scope, n_shared)                            # [n_seq, n_past + n_seq]
    x = params["wte"][ids] + params["wpe"][positions]              # [n_seq, n_embd]
    n_layer = len(params["blocks"])
    for layer, block in enumerate(params["blocks"]):              # the last layer: only n_logits rows out
        x = rows_block(x, block, cache, layer, n_head, mask if layer < n_layer - 1 else mask[-n_logits:])
    cache.length += len(ids)
    x = layer_norm(x, **params["ln_f"])                           # [n_logits, n_embd]
    return matmul(x, params["wte"].T)                             # [n_logits, n_vocab]


def token_id_array(ids, n_vocab, what="token ids"):  # [n_seq] -> [n_seq] integer array
    """ids as a 1-D integer array, or a one-line ValueError saying what is wrong with them.

    Names at most 3 offending ids with their positions: a long prompt must not print them all.
    >>> token_id_array([5, 70000, 3, -1], n_vocab=50257)
    Traceback (most recent call last):
    ValueError: token ids must be in [0, 50257): 70000 at position 1, -1 at position 3
    """
    if isinstance(ids, (str, bytes)):
        raise ValueError(f"{what} must be a 1-D sequence of ints, got a string: "
                         f"encode text first (model.tokenizer.encode)")
    try:
        array = np.asarray(ids)
    except (ValueError, TypeError):  # ragged lists, objects NumPy cannot stack
        raise ValueError(f"{what} must be a 1-D sequence of ints, got {type(ids).__name__}") from None
    if array.shape == (0,):  # np.asarray([]) is float64; the caller says why empty is wrong
        return array.astype(np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":  # "iu": signed or unsigned ints, not bool
        kind = f"shape {array.shape}" if array.ndim != 1 else f"{array.dtype} values"
        raise ValueError(f"{what} must be a 1-D sequence of ints, got {kind} ({type(ids).__name__})")
    bad = np.flatnonzero((array < 0) | (array >= n_vocab))  # positions of out-of-range ids
    if len(bad):
        named = ", ".join(f"{array[i]} at position {i}" for i in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ValueError(f"{what} must be in [0, {n_vocab}): {named}{more}")
    return array


class GPT2:
    """A GPT-2 model behind the interface the generation loops use.

    n_vocab, n_ctx, eot_id; new_cache(); forward(ids, cache, n_logits) -> [n_logits, n_vocab].
    The toy models in toy_models.py implement the same interface. forward_rows: rows with explicit
    positions and scope (a token tree's nodes, rows.py). row_cost_shape: the shape of this
    machine's v(M), read from one block (cost_probe.py), for a K policy that plans with it.
    """

    def __init__(self, config, params, tokenizer=None, name=None):
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self.name = name or f"GPT-2 ({config.n_params() / 1e6:.1f}M parameters)"
        self.n_vocab, self.n_ctx = config.n_vocab, config.n_ctx
        self.eot_id = tokenizer.eot_id if tokenizer is not None else None
        self.cost_shapes = {}  # (M_max, BLAS threads, weights' order) -> (readings, shape): row_cost_shape's record
        self.cache_pool = CachePool()  # the arrays of caches nobody holds, lent to the next new_cache()

    def __repr__(self):
        return f"GPT2({self.name!r}, {self.config})"

    def new_cache(self, n_ctx=None):
        """A KVCache for n_ctx positions (default: the model's whole context). Sized for one request
        (its prompt + the tokens it will feed) it takes n_ctx / model.n_ctx of the memory: a whole
        355M cache is ~200 MB. Its arrays may be those of a cache nobody holds any more, lent again
        (kv_cache.CachePool: memory written before costs less than new memory); the pool keeps no
        more caches' arrays than were in use at once, and model.cache_pool.clear() lets go of them."""
        c = self.config
        n_ctx = c.n_ctx if n_ctx is None else n_ctx
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)) or not 1 <= n_ctx <= c.n_ctx:
            raise ValueError(f"new_cache needs an integer n_ctx in [1, {c.n_ctx}] (or None), got {n_ctx!r}")
        return self.cache_pool.allocate(c.n_layer, c.n_head, int(n_ctx), c.d_head)

    def forward(self, ids, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        ids = self.checked_call(ids, cache, n_logits, "tokens")
        return gpt2_forward(ids, self.params, self.config.n_head, cache, n_logits)

    def forward_rows(self, ids, positions, scope, cache, n_logits=None, n_shared=None):  # -> [n_logits, n_vocab]
        """Feed ids after the cached tokens, row i at positions[i] and seeing the first n_shared cached
        positions (default: all) and the rows j with scope[i, j]: the cached rows after n_shared,
        then the new rows (rows.py). Logits of the last n_logits rows (default: every row). The
        cache then holds every row, in row order: cache.keep_rows(n_past, path) keeps an accepted
        path. A tree: forward_rows(tokens, rows.tree_positions(parents, n_past), rows.tree_scope(parents), cache).
        """
        n_logits = len(ids) if n_logits is None else n_logits
        ids = self.checked_call(ids, cache, n_logits, "rows")
        positions, scope, n_shared = check_rows(positions, scope, len(ids), self.n_ctx, len(cache), n_shared)
        return gpt2_rows_forward(ids, positions, scope, self.params, self.config.n_head, cache, n_logits, n_shared)

    def row_cost_shape(self, M_max, passes=math.inf):  # -> {M: v_shape(M)}, M = 1..M_max, or None
        """One block's cost over M rows against one row, M = 1..M_max: the shape of this machine's v(M)
        (cost_probe.py), read in at most `passes` one-row passes' time (None where one reading of each
        size would take longer). Reads the weights, changes nothing but its own record: the model
        remembers what it read, per sizes, BLAS threads and weights' order, and reads again only where
        it may now take more readings of each size (a server or a console reads it once)."""
        repeats = probe_repeats(self.config.n_layer, M_max, passes)
        key = (M_max, threads_allowed(), weights_order(self))
        read = self.cost_shapes.get(key)  # (readings of each size, shape)
        if read is not None and read[0] >= repeats or not repeats:
            return read[1] if read is not None else None
        self.cost_shapes[key] = (repeats, row_cost_shape(transformer_block, self.params, self.config, M_max, repeats))
        return self.cost_shapes[key][1]

    def checked_call(self, ids, cache, n_logits, what):
        """forward's and forward_rows' checks: the ids, 1 <= n_logits <= len(ids), the cache's shape
        and its room for len(ids) more `what` (one-line ValueErrors). Returns the ids as an array."""
        ids = token_id_array(ids, self.n_vocab)
        n_seq = len(ids)
        if n_seq == 0:
            raise ValueError("ids is empty: a forward call needs at least one token")
        if isinstance(n_logits, bool) or not isinstance(n_logits, (int, np.integer)) \
                or n_seq == 0 or not 1 <= n_logits <= n_seq:
            raise ValueError(f"need 1 <= n_logits <= len(ids), got n_logits={n_logits!r}, len(ids)={n_seq}")
        c = self.config
        check_cache(cache, (c.n_layer, c.n_head, c.n_ctx, c.d_head), self.name)
        check_room(cache, n_seq, self.n_ctx, what)
        return ids
