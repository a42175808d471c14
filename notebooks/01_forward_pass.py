# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · The GPT-2 forward pass, step by step
#
# GPT-2 (Radford et al. 2019) is one function: it takes a sequence of token ids and returns, at
# every position, a score (*logit*) for every token of the vocabulary that could come next.
# This notebook runs that function on the trained target model bundled with gpt2np, one step at
# a time, prints the shape of every intermediate array, plots the attention patterns, and checks
# at the end that the steps add up to the model's own `forward`. Then it shows the KV cache,
# which changes nothing about the result and a lot about the speed.
#
# The code being run is `gpt2np/model/forward.py` (the layout of openai/gpt-2's `model.py` and picoGPT);
# `explain.forward_trace` calls those same functions in the same order and keeps every
# intermediate. Dimension names, as in `model.py`: `n_seq` tokens in this call, `n_embd` width of
# the residual stream, `n_head` heads with `d_head = n_embd // n_head` dimensions each, `n_vocab`
# vocabulary size, `n_ctx` longest context, `n_layer` blocks.

# %%
import sys
from functools import partial
from pathlib import Path

# Import gpt2np from this clone of the repository (the folder above notebooks/), and before
# NumPy: it sets OpenBLAS's thread timeout, which OpenBLAS reads only when NumPy loads it.
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "gpt2np" / "__init__.py").is_file())
sys.path.insert(0, str(ROOT))
import gpt2np
from gpt2np.teach import explain
from threadpoolctl import threadpool_limits

# One BLAS thread: these models' matrices are tiny (160 columns), so a second thread saves little,
# and when another process keeps a core busy, 2-thread OpenBLAS slows down several-fold.
threadpool_limits(1)

# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

# %% [markdown]
# ## The model and its input
#
# The bundled pair was trained by `tools/train_pair.py` on Tiny Shakespeare. Its vocabulary is
# byte-level: GPT-2's 256 byte tokens with no merges, plus `<|endoftext|>`, so here one token is
# one character (notebook 02 shows the full BPE). Architecture and code are GPT-2's, only smaller.

# %%
target, draft = explain.load_bundled_pair()
model, config = target, target.config
print(model.name, config)
print(f"{config.n_params():,} parameters, d_head = n_embd // n_head = {config.d_head}")

prompt = "ROMEO:\nBut soft, what light through yonder"
ids = np.array(model.tokenizer.encode(prompt))
print(f"n_seq = {len(ids)} tokens")
print("ids:   ", ids[:10], "...")
print("tokens:", explain.token_labels(model.tokenizer, ids[:10]), "...")

# %% [markdown]
# ## Every intermediate, with its shape
#
# `forward_trace` runs the whole pass once and keeps everything. The table lists block 0's arrays;
# every block has the same shapes. Notice that the residual stream keeps the shape
# `[n_seq, n_embd]` from the embeddings to the last block: each block *adds* to it.

# %%
trace = explain.forward_trace(model, ids)
for name, shape in trace.shapes().items():
    print(f"{name:30s} {shape}")

# %% [markdown]
# ## Step 1 · Embeddings
#
# Each id selects one row of the token embedding `wte` `[n_vocab, n_embd]`; each *position*
# selects one row of the position embedding `wpe` `[n_ctx, n_embd]`. Attention by itself does
# not know the order of its inputs, so the position has to be written into the vectors. Their sum
# `x0` is the residual stream that enters block 0.

# %%
wte, wpe = model.params["wte"], model.params["wpe"]
print(f"wte {wte.shape} [n_vocab, n_embd]  ->  wte[ids]    {trace.token_embeddings.shape} [n_seq, n_embd]")
print(f"wpe {wpe.shape} [n_ctx, n_embd]    ->  wpe[:n_seq] {trace.position_embeddings.shape}")
print(f"x0 = wte[ids] + wpe[:n_seq]             {trace.x0.shape}")

# %% [markdown]
# ## Step 2 · The causal mask
#
# Attention lets position *i* read from positions *j*. A language model predicts the *next*
# token, so position *i* must never see a later one: `causal_mask(n_seq, n_kv)` is added to the
# attention scores, 0 where *j ≤ i* and −10¹⁰ elsewhere, which the softmax turns into weights of
# exactly 0. The triangle is anchored at the lower-right corner (as in openai/gpt-2's
# `attention_mask`): when the first `n_kv − n_seq` keys come from the KV cache, the `n_seq` new
# queries are the *last* positions. Right: 3 new tokens after 3 cached ones, which is what
# speculative decoding does when the target checks drafted tokens (notebook 04).

# %%
from gpt2np.model.forward import causal_mask, gelu

fig, axes = plt.subplots(1, 2, figsize=(8, 3))
for ax, (n_seq, n_kv) in zip(axes, [(6, 6), (3, 6)]):
    ax.imshow(causal_mask(n_seq, n_kv) == 0, cmap="Greens", vmin=0, vmax=1.4)
    ax.set(title=f"causal_mask({n_seq}, {n_kv}): green = may attend", xlabel="key position j",
           ylabel="query row i", xticks=range(n_kv), yticks=range(n_seq))
plt.tight_layout()
print(causal_mask(3, 6))

# %% [markdown]
# ## Step 3 · Attention
#
# Block *l* first normalises the residual stream (`ln_1`), then one matrix `c_attn` maps each
# position to a query, a key and a value, which are cut into `n_head` heads of `d_head` numbers
# (`split_heads`). Each head computes
#
# $$\text{weights} = \operatorname{softmax}\!\left(\frac{q k^\top}{\sqrt{d_\text{head}}} + \text{mask}\right), \qquad \text{out} = \text{weights} \cdot v .$$
#
# Row *i* of `weights` is a probability distribution over the positions *i* may read. The heads'
# outputs are concatenated again (`merge_heads`) and projected by `c_proj`. The weights shown
# below are taken from `attention` in `gpt2np/model/forward.py` itself: with *v* = the identity matrix, `weights · v`
# *is* the weights.

# %%
layer0 = trace.layers[0]
print(f"ln_1(x0)           {layer0.ln_1.shape}  [n_seq, n_embd]")
print(f"q, k, v (per head) {layer0.q.shape}  [n_head, n_seq, d_head]  (c_attn gives [n_seq, 3*n_embd])")
print(f"weights            {layer0.attention_weights.shape}  [n_head, n_seq, n_seq]")
print(f"weights @ v        {layer0.heads.shape}  -> merge_heads, c_proj -> {layer0.attn_out.shape}")
w = layer0.attention_weights
print("every row sums to 1:", np.allclose(w.sum(axis=-1), 1, atol=1e-5),
      "| largest weight above the diagonal:", float(np.triu(w, k=1).max()))

# %% [markdown]
# Every head of the first and the last block, on our prompt (row = the position reading, column
# = the position read; brighter = more weight). Everything above the diagonal is black: the mask.

# %%
from matplotlib.colors import PowerNorm  # a square-root colour scale: small weights stay visible

labels = explain.token_labels(model.tokenizer, ids)
fig, axes = plt.subplots(2, config.n_head, figsize=(3.2 * config.n_head, 7))
for row, layer in zip(axes, [0, config.n_layer - 1]):
    for head, ax in enumerate(row):
        ax.imshow(trace.layers[layer].attention_weights[head], cmap="magma", norm=PowerNorm(0.5, 0, 1))
        ax.set_title(f"block {layer}, head {head}", fontsize=10)
        ax.set_xticks(range(len(ids)), labels, fontsize=5)
        ax.set_yticks(range(len(ids)), labels, fontsize=5)
plt.tight_layout()

# %% [markdown]
# Reading single heads is guesswork; a summary is steadier. The *mean attention distance* of a
# head is Σⱼ weights[i, j] · (i − j), averaged over the query positions *i*: 0 means "only
# itself", 1 "the previous character". (Early positions cannot look far, which pulls every head's
# average down a little.)

# %%
distance = explain.mean_attention_distance(trace)  # [n_layer, n_head]
plt.figure(figsize=(6, 3))
for head in range(config.n_head):
    plt.plot(range(config.n_layer), distance[:, head], "o", label=f"head {head}")
plt.xlabel("block"); plt.ylabel("mean distance (characters)"); plt.grid(alpha=0.3)
plt.legend(fontsize=7, ncol=2); plt.title("how far back each head looks");
print(np.round(distance, 1))

# %% [markdown]
# On this prompt the middle blocks mostly read the last few characters, the word being spelled
# out, while block 0 and the last blocks spread their weight further back; a few heads put most
# of their weight on one early position such as the line break after `ROMEO:` (the bright
# columns above), a cheap way to know where the current line began. Nobody programmed this:
# it is what training on Shakespeare made useful.

# %% [markdown]
# ## Step 4 · The MLP
#
# After attention has moved information *between* positions, the MLP transforms each position on
# its own: `ln_2`, a widening to `4 · n_embd` (`c_fc`), the GELU non-linearity, and back to
# `n_embd` (`c_proj`). GPT-2 uses the tanh approximation of GELU (Hendrycks & Gimpel 2016),
# which is `gelu` in `gpt2np/model/forward.py`; it is a smooth ReLU that lets small negative values through.

# %%
print(f"ln_2        {layer0.ln_2.shape}\nc_fc        {layer0.mlp_hidden.shape}  [n_seq, 4*n_embd]"
      f"\ngelu, c_proj {layer0.mlp_out.shape}")
x = np.linspace(-4, 4, 201, dtype=np.float32)
plt.figure(figsize=(4.5, 3))
plt.plot(x, gelu(x), label="gelu(x), GPT-2's tanh form")
plt.plot(x, np.maximum(x, 0), "--", label="relu(x), for comparison")
plt.legend(); plt.grid(alpha=0.3); plt.title("the MLP's non-linearity");

# %% [markdown]
# ## Step 5 · Residual connections, final norm and the output head
#
# Each block returns `x + attention(ln_1(x))`, then `+ mlp(ln_2(x))`: it adds to the stream and
# never replaces it. After the last block, `ln_f` normalises the stream and the logits are its
# product with `wte` transposed: GPT-2 reuses (*ties*) the token embedding as the output matrix,
# so a token scores high when its embedding points the way the final vector points.

# %%
print(f"ln_f {trace.ln_f.shape} @ wte.T {wte.T.shape} -> logits {trace.logits.shape} [n_seq, n_vocab]")
probs = gpt2np.sampling_distribution(trace.logits[-1])  # softmax of the last row
print(f"\nafter {prompt[-20:]!r}, the model expects:")
for token_id, text, p in explain.top_tokens(probs, model.tokenizer, n=5):
    print(f"   {text!r:8} p = {p:.3f}")

# %% [markdown]
# One pass gives a prediction at *every* position, not only the last (this is what makes
# training efficient, and what speculative decoding uses to check several drafted tokens at
# once). Row *i* is the model's guess for token *i + 1*, having seen tokens 0..*i*:

# %%
guesses = explain.token_labels(model.tokenizer, trace.logits.argmax(axis=-1))
print("input  :", "".join(labels))
print("guessed:", " " + "".join(guesses[:-1]), "  <- each character is the guess for the one above it")
hits = np.mean(trace.logits.argmax(axis=-1)[:-1] == ids[1:])
print(f"the top guess was right at {hits:.0%} of the positions")

# %% [markdown]
# **Check.** The step-by-step trace and `GPT2.forward` (batched heads, preallocated cache) must
# give the same logits:

# %%
fast = model.forward(ids, model.new_cache(), n_logits=len(ids))
print("max |trace.logits - model.forward| =", float(np.abs(trace.logits - fast).max()))

# %% [markdown]
# ## Step 6 · The KV cache changes nothing but speed
#
# To generate, we append the chosen token and run the model again. Without a cache, step *t*
# recomputes keys and values for all `n_prompt + t` tokens, although those of the old tokens
# cannot have changed: position *j*'s key and value depend only on tokens 0..*j* (that is what
# the mask guarantees). So we compute them once and keep them. `KVCache` holds `k` and `v` for
# every block, `[n_layer, n_head, n_ctx, d_head]`, allocated once; `model.forward(ids, cache)`
# feeds only the *new* ids, writes their keys and values into the next rows and attends over
# all `len(cache)` rows.

# %%
cache = model.new_cache()
print("cache.k:", cache.k.shape, "[n_layer, n_head, n_ctx, d_head]; len(cache) =", len(cache))
logits = model.forward(ids, cache)                 # the prompt in one call ("prefill")
print("after the prompt:     len(cache) =", len(cache), "| logits", logits.shape, "(last position only)")
logits = model.forward([int(logits[-1].argmax())], cache)  # one new token: 1 query, len(cache) keys
print("after one more token: len(cache) =", len(cache))

# %% [markdown]
# Same logits, whether the sequence goes in at once or one token at a time through the cache.
# The tiny differences are float32 rounding (the same sums, added in a different order by BLAS);
# every greedy choice is identical.

# %%
all_at_once = model.forward(ids, model.new_cache(), n_logits=len(ids))
one_at_a_time = explain.incremental_logits(model, ids)
print("max |difference| =", float(np.abs(all_at_once - one_at_a_time).max()),
      "| same argmax everywhere:", np.array_equal(all_at_once.argmax(-1), one_at_a_time.argmax(-1)))

# %% [markdown]
# And the speed: greedy decoding of the same tokens, with the cache (`gpt2np.generate`) and
# without it (`explain.generate_without_cache`, a fresh cache at every step). The work per new
# token grows with the context without the cache (quadratic in total) and stays one token's
# worth with it.

# %%
n_new = 60
with_cache, seconds_with = explain.best_time(partial(gpt2np.generate, model, ids, n_new, temperature=0))
without_cache, seconds_without = explain.best_time(
    partial(explain.generate_without_cache, model, ids, n_new), repeats=1)
print("same tokens:", with_cache == without_cache)
print(f"with the KV cache:    {seconds_with:.2f} s ({n_new / seconds_with:.0f} tokens/s)")
print(f"without (recompute):  {seconds_without:.2f} s ({n_new / seconds_without:.0f} tokens/s), "
      f"{seconds_without / seconds_with:.1f}x slower")
print("\n" + prompt + model.tokenizer.decode(with_cache))

# %% [markdown]
# **Rolling back.** Attention only reads rows `0..len(cache)−1`, so forgetting the last tokens is
# just `cache.truncate(n)`: the stale rows are overwritten by whatever is fed next. Speculative
# decoding relies on this to forget rejected draft tokens (notebook 04).

# %%
cache = model.new_cache()
model.forward(ids, cache)
model.forward(model.tokenizer.encode(" window"), cache)    # feed 7 more tokens...
cache.truncate(len(ids))                                  # ...and forget them
rolled_back = model.forward(model.tokenizer.encode(" moon"), cache, n_logits=1)
fresh = model.forward(np.concatenate([ids, model.tokenizer.encode(" moon")]), model.new_cache())
print("after truncate, max |difference| from a fresh run:", float(np.abs(rolled_back - fresh).max()),
      "| same argmax:", rolled_back.argmax() == fresh.argmax())

# %% [markdown]
# **Summary.** Embeddings → *n_layer* × (attention + MLP, each added to the residual stream) →
# final norm → tied output head. Shapes: `[n_seq]` ids → `[n_seq, n_embd]` all the way through
# → `[n_seq, n_vocab]` logits. The KV cache turns each generation step from "run the whole
# sequence" into "run one token", with the same logits.
#
# *References:* Radford et al. 2019, *Language Models are Unsupervised Multitask Learners*;
# Vaswani et al. 2017, *Attention Is All You Need*; openai/gpt-2 `src/model.py`; jaymody/picoGPT.
