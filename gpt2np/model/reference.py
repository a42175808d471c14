"""The slow reference: GPT-2 written like the equations, no cache, one head at a time.

This is the oracle the fast path in model.py is tested against (tests/test_model.py), and the
baseline a picoGPT-style implementation gives (bench/). It shares only the elementwise pieces
(gelu, softmax, layer_norm) with model.py; attention is written out per head with an explicit
full causal mask, and every call recomputes the whole sequence from scratch.

    h_0   = W_te[tokens] + W_pe[0..n_seq)
    a_l   = h_{l-1} + concat_heads(softmax(Q K^T / sqrt(d_head) + M) V) W_o + b_o,
            with Q, K, V = LN_1(h_{l-1}) W_qkv + b_qkv split into heads
    h_l   = a_l + GELU(LN_2(a_l) W_fc + b_fc) W_proj + b_proj
    logits = LN_f(h_L) W_te^T
"""
import math

import numpy as np

from .forward import gelu, layer_norm, softmax


def reference_attention_head(q, k, v):  # 3 x [n_seq, d_head] -> [n_seq, d_head]
    n_seq, d_head = q.shape
    future = np.triu(np.ones((n_seq, n_seq), dtype=bool), k=1)  # [n_seq, n_seq] True above the diagonal
    scores = q @ k.T / math.sqrt(d_head)                      # [n_seq, n_seq]
    scores = np.where(future, -np.inf, scores)                 # a token never sees the future
    return softmax(scores) @ v                                 # [n_seq, d_head]


def reference_block(x, block, n_head):  # [n_seq, n_embd] -> [n_seq, n_embd]
    n_embd = x.shape[1]
    d_head = n_embd // n_head
    h = layer_norm(x, **block["ln_1"])
    qkv = h @ block["attn"]["c_attn"]["w"] + block["attn"]["c_attn"]["b"]  # [n_seq, 3*n_embd]
    q, k, v = qkv[:, :n_embd], qkv[:, n_embd:2 * n_embd], qkv[:, 2 * n_embd:]
    heads = []
    for i in range(n_head):                                    # one head at a time
        cols = slice(i * d_head, (i + 1) * d_head)
        heads.append(reference_attention_head(q[:, cols], k[:, cols], v[:, cols]))
    attn = np.concatenate(heads, axis=1)                       # [n_seq, n_embd]
    x = x + attn @ block["attn"]["c_proj"]["w"] + block["attn"]["c_proj"]["b"]
    h = layer_norm(x, **block["ln_2"])
    h = gelu(h @ block["mlp"]["c_fc"]["w"] + block["mlp"]["c_fc"]["b"])  # [n_seq, 4*n_embd]
    return x + h @ block["mlp"]["c_proj"]["w"] + block["mlp"]["c_proj"]["b"]


def gpt2_reference(ids, params, config):  # [n_seq] -> [n_seq, n_vocab]
    """Logits at every position of ids, recomputed from scratch (no KV cache)."""
    n_seq = len(ids)
    if n_seq > config.n_ctx:
        raise ValueError(f"{n_seq} tokens exceed the context of {config.n_ctx}")
    x = params["wte"][np.asarray(ids)] + params["wpe"][:n_seq]  # [n_seq, n_embd]
    for block in params["blocks"]:
        x = reference_block(x, block, config.n_head)
    return layer_norm(x, **params["ln_f"]) @ params["wte"].T    # [n_seq, n_vocab]
