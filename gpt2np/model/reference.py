"""The slow reference: GPT-2 written like the equations, no cache, one head at a time.

This is the oracle the fast path in forward.py is tested against (tests/model/test_model.py), and the
baseline a picoGPT-style implementation gives (bench/). It shares nothing with forward.py: its
GELU, layer norm and softmax are its own, written as the formulas, so an error in the fast
path's versions cannot hide in the oracle. Attention is written out per head with an explicit full causal mask,
and every call recomputes the whole sequence from scratch. gpt2_rows_reference is the oracle of
forward_rows (rows.py): the same equations with each token's own position and an explicit
visibility matrix V (query i sees key j where V[i, j]) in place of the causal triangle.

    h_0   = W_te[tokens] + W_pe[0..n_seq)
    a_l   = h_{l-1} + concat_heads(softmax(Q K^T / sqrt(d_head) + M) V) W_o + b_o,
            with Q, K, V = LN_1(h_{l-1}) W_qkv + b_qkv split into heads
    h_l   = a_l + GELU(LN_2(a_l) W_fc + b_fc) W_proj + b_proj
    logits = LN_f(h_L) W_te^T
"""
import math

import numpy as np

from .fast.matmul import as_matrix  # a Conv1D weight as [in, out], in panels or not


def gelu(x):
    """GPT-2's tanh approximation of GELU (Hendrycks & Gimpel 2016), as the paper writes it."""
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, g, b, eps=1e-5):  # [n_seq, n_embd] -> [n_seq, n_embd]
    """(x - mean) / sqrt(variance + eps) per row, then scaled by g and shifted by b (Ba et al. 2016)."""
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def softmax(x):  # [..., n] -> [..., n]
    """exp(x) / sum exp(x) over the last axis; the max is subtracted first, which changes nothing but overflow."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference_attention_head(q, k, v, visible=None):  # 3 x [n_seq, d_head] -> [n_seq, d_head]
    n_seq, d_head = q.shape
    if visible is None:                                        # [n_seq, n_seq]: causal, on and below the diagonal
        visible = np.tril(np.ones((n_seq, n_seq), dtype=bool))
    scores = q @ k.T / math.sqrt(d_head)                      # [n_seq, n_seq]
    scores = np.where(visible, scores, -np.inf)                # a token never sees the future
    return softmax(scores) @ v                                 # [n_seq, d_head]


def reference_block(x, block, n_head, visible=None):  # [n_seq, n_embd] -> [n_seq, n_embd]
    n_embd = x.shape[1]
    d_head = n_embd // n_head
    h = layer_norm(x, **block["ln_1"])
    qkv = h @ as_matrix(block["attn"]["c_attn"]["w"]) + block["attn"]["c_attn"]["b"]  # [n_seq, 3*n_embd]
    q, k, v = qkv[:, :n_embd], qkv[:, n_embd:2 * n_embd], qkv[:, 2 * n_embd:]
    heads = []
    for i in range(n_head):                                    # one head at a time
        cols = slice(i * d_head, (i + 1) * d_head)
        heads.append(reference_attention_head(q[:, cols], k[:, cols], v[:, cols], visible))
    attn = np.concatenate(heads, axis=1)                       # [n_seq, n_embd]
    x = x + attn @ as_matrix(block["attn"]["c_proj"]["w"]) + block["attn"]["c_proj"]["b"]
    h = layer_norm(x, **block["ln_2"])
    h = gelu(h @ as_matrix(block["mlp"]["c_fc"]["w"]) + block["mlp"]["c_fc"]["b"])  # [n_seq, 4*n_embd]
    return x + h @ as_matrix(block["mlp"]["c_proj"]["w"]) + block["mlp"]["c_proj"]["b"]


def gpt2_reference(ids, params, config):  # [n_seq] -> [n_seq, n_vocab]
    """Logits at every position of ids, recomputed from scratch (no KV cache)."""
    n_seq = len(ids)
    if n_seq > config.n_ctx:
        raise ValueError(f"{n_seq} tokens exceed the context of {config.n_ctx}")
    x = params["wte"][np.asarray(ids)] + params["wpe"][:n_seq]  # [n_seq, n_embd]
    for block in params["blocks"]:
        x = reference_block(x, block, config.n_head)
    return layer_norm(x, **params["ln_f"]) @ params["wte"].T    # [n_seq, n_vocab]


def rows_visibility(n_past, scope):  # [n_seq, n_seq] bool -> [n_past + n_seq, n_past + n_seq] bool
    """Who sees whom among the prefix and the rows: the prefix causally, every row the whole prefix,
    rows each other where scope says; no prefix token sees a row."""
    n_seq = len(scope)
    visible = np.zeros((n_past + n_seq, n_past + n_seq), dtype=bool)
    visible[:n_past, :n_past] = np.tril(np.ones((n_past, n_past), dtype=bool))
    visible[n_past:, :n_past] = True
    visible[n_past:, n_past:] = scope
    return visible


def gpt2_rows_reference(prefix_ids, ids, positions, scope, params, config):  # -> [n_seq, n_vocab]
    """Logits of the rows ids (row i at positions[i], seeing the prefix and the rows j with
    scope[i, j]) after prefix_ids at positions 0..n_past-1, recomputed from scratch (no KV cache)."""
    n_past = len(prefix_ids)
    tokens = np.concatenate([np.asarray(prefix_ids, dtype=np.int64), np.asarray(ids, dtype=np.int64)])
    where = np.concatenate([np.arange(n_past), np.asarray(positions, dtype=np.int64)])  # [n_past + n_seq]
    x = params["wte"][tokens] + params["wpe"][where]              # [n_past + n_seq, n_embd]
    visible = rows_visibility(n_past, np.asarray(scope, dtype=bool))
    for block in params["blocks"]:
        x = reference_block(x, block, config.n_head, visible)
    return (layer_norm(x, **params["ln_f"]) @ params["wte"].T)[n_past:]  # [n_seq, n_vocab]
