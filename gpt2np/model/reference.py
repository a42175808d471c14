"""The slow reference: GPT-2 written like the equations, no cache, one head at a time.

This is the oracle the fast path in forward.py is tested against (tests/model/test_model.py), and the
baseline a picoGPT-style implementation gives (bench/). It shares nothing with forward.py: its
GELU, layer norm and softmax are its own, written as the formulas, so an error in the fast
path's versions cannot hide in the oracle. Attention is written out per head with an explicit full causal mask,
and every call recomputes the whole sequence from scratch.

    h_0   = W_te[tokens] + W_pe[0..n_seq)
    a_l   = h_{l-1} + concat_heads(softmax(Q K^T / sqrt(d_head) + M) V) W_o + b_o,
            with Q, K, V = LN_1(h_{l-1}) W_qkv + b_qkv split into heads
    h_l   = a_l + GELU(LN_2(a_l) W_fc + b_fc) W_proj + b_proj
    logits = LN_f(h_L) W_te^T
"""
import math

import numpy as np


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
