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
# # 03 · From logits to a token: temperature, top-k, top-p
#
# The model's last row of logits is a score for every token. To generate, we turn scores into a
# probability distribution and draw one token from it. How we do that changes the text a lot:
# always taking the most likely token (greedy) is repetitive, drawing from the raw softmax is
# sometimes incoherent, and three knobs sit in between. `gpt2np.sampling_distribution` applies
# them in Hugging Face's order:
#
# 1. **temperature** *T*: divide the logits by *T* (*T* < 1 sharpens, *T* > 1 flattens;
#    *T* = 0 is not a division but greedy decoding, an argmax);
# 2. **top-k** (Fan et al. 2018): keep only the *k* highest-scoring tokens;
# 3. **top-p**, nucleus sampling (Holtzman et al. 2020): keep the smallest set of most probable
#    tokens whose total probability reaches *p*, and renormalise.
#
# `gpt2np.sample(probs, rng)` then draws the token, from an explicit, seeded
# `np.random.Generator`: it is the only place in gpt2np where randomness is drawn.
# Speculative decoding (notebook 04) applies the same transform to both of its models; its
# guarantee is to reproduce exactly the distribution built here.

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
# ## One row of logits
#
# The bundled target model, after a prompt that ends where a new word starts: the next character
# is genuinely uncertain. (The bundled models are byte-level, so each token is one character.)

# %%
target, _ = explain.load_bundled_pair()
tokenizer = target.tokenizer
prompt = "JULIET:\nO Romeo, what shall I "
prompt_ids = tokenizer.encode(prompt)
logits = target.forward(prompt_ids, target.new_cache())[-1]   # [n_vocab]
print(f"logits: shape {logits.shape}, dtype {logits.dtype}, range {logits.min():.1f} .. {logits.max():.1f}")
probs = gpt2np.sampling_distribution(logits)                   # temperature 1: plain softmax
shown = np.argsort(-probs)[:20]                                # the 20 most probable tokens, for the plots
shown_labels = explain.token_labels(tokenizer, shown)
print("most probable next characters:", [(t, round(p, 3)) for _, t, p in explain.top_tokens(probs, tokenizer, 6)])

# %% [markdown]
# ## Temperature
#
# Softmax of `logits / T`. As *T* → 0 the distribution collapses onto the argmax, which is why
# *T* = 0 is defined as greedy decoding (a separate, named code path: dividing by a tiny number
# would overflow). Large *T* spreads probability towards uniform. The entropy (in bits) measures
# the spread: 0 for a certain choice, log₂(257) ≈ 8 for uniform over this vocabulary.

# %%
fig, axes = plt.subplots(1, 4, figsize=(16, 3), sharey=True)
for ax, T in zip(axes, [0, 0.5, 1.0, 2.0]):
    p_T = gpt2np.sampling_distribution(logits, temperature=T)
    ax.bar(range(len(shown)), p_T[shown], color="tab:blue")
    ax.set_xticks(range(len(shown)), shown_labels)
    ax.set_title(f"T = {T}{' (greedy)' if T == 0 else ''}: entropy {explain.entropy_bits(p_T):.2f} bits")
axes[0].set_ylabel("probability")
plt.tight_layout()

# %%
temperatures = np.linspace(0.05, 3, 60)
entropies = [explain.entropy_bits(gpt2np.sampling_distribution(logits, temperature=T)) for T in temperatures]
plt.figure(figsize=(5, 3))
plt.plot(temperatures, entropies)
plt.axhline(np.log2(target.n_vocab), ls="--", c="gray", label="uniform over 257 tokens")
plt.xlabel("temperature T"); plt.ylabel("entropy (bits)"); plt.legend(); plt.grid(alpha=0.3);

# %% [markdown]
# ## Top-k
#
# Keep the *k* tokens with the highest logits, set the others to −∞, then softmax. Every kept
# token keeps its *relative* probability: the kept mass is rescaled to 1. (Tokens tied with the
# *k*-th logit are all kept.) The weakness: *k* is fixed, whether the model is sure (one good
# token) or unsure (dozens).

# %%
fig, axes = plt.subplots(1, 3, figsize=(14, 3), sharey=True)
for ax, k in zip(axes, [None, 10, 3]):
    p_k = gpt2np.sampling_distribution(logits, top_k=k)
    ax.bar(range(len(shown)), p_k[shown], color="tab:green")
    ax.set_xticks(range(len(shown)), shown_labels)
    ax.set_title("no top-k" if k is None else f"top_k = {k}: {np.count_nonzero(p_k)} tokens kept")
plt.tight_layout()

# %% [markdown]
# ## Top-p (nucleus)
#
# Sort the tokens by probability and keep the shortest prefix whose cumulative probability
# reaches *p*. When the model is confident the nucleus is small; when it is unsure it is large.
# The left plot shows the cumulative probability of the sorted tokens and where *p* = 0.9 cuts.

# %%
cumulative = np.cumsum(np.sort(probs)[::-1])
p_nucleus = gpt2np.sampling_distribution(logits, top_p=0.9)
n_kept = np.count_nonzero(p_nucleus)
fig, axes = plt.subplots(1, 2, figsize=(12, 3))
axes[0].plot(np.arange(1, 41), cumulative[:40], marker=".")
axes[0].axhline(0.9, ls="--", c="gray"); axes[0].axvline(n_kept, ls=":", c="tab:red")
axes[0].set(xlabel="number of most probable tokens kept", ylabel="cumulative probability",
            title=f"top_p = 0.9 keeps {n_kept} tokens")
axes[1].bar(np.arange(len(shown)) - 0.2, probs[shown], 0.4, label="softmax")
axes[1].bar(np.arange(len(shown)) + 0.2, p_nucleus[shown], 0.4, label="top_p = 0.9")
axes[1].set_xticks(range(len(shown)), shown_labels); axes[1].legend()
plt.tight_layout()

# %% [markdown]
# The three combine, in this order: temperature first, then top-k on the scaled logits, then
# top-p on the resulting probabilities.

# %%
combined = gpt2np.sampling_distribution(logits, temperature=0.8, top_k=10, top_p=0.9)
print(f"temperature 0.8, top_k 10, top_p 0.9: {np.count_nonzero(combined)} tokens kept:")
print([(t, round(p, 3)) for _, t, p in explain.top_tokens(combined, tokenizer, np.count_nonzero(combined))])

# %% [markdown]
# ## Drawing tokens
#
# `gpt2np.sample(probs, rng)` draws one token. Drawn 5,000 times with a seeded generator, the
# frequencies match the probabilities up to sampling noise (about ±√(p(1−p)/n), i.e. ±0.007
# for p = 0.3).

# %%
rng = np.random.default_rng(0)
p_T = gpt2np.sampling_distribution(logits, temperature=0.8, top_k=10)
counts = explain.sample_counts(p_T, 5000, rng)
plt.figure(figsize=(9, 3))
plt.bar(np.arange(len(shown)) - 0.2, p_T[shown], 0.4, label="probability (T = 0.8, top_k = 10)")
plt.bar(np.arange(len(shown)) + 0.2, counts[shown] / counts.sum(), 0.4, label="frequency in 5,000 draws")
plt.xticks(range(len(shown)), shown_labels); plt.legend();
print("largest |frequency - probability|:", float(np.abs(counts / counts.sum() - p_T).max()))

# %% [markdown]
# ## What the knobs do to text
#
# The same prompt, 150 new characters, with one seeded generator per setting. Greedy decoding
# needs no generator at all. (At a high temperature a byte-level model can emit bytes that are not
# valid UTF-8 together; they print as �.)

# %%
settings = [dict(temperature=0), dict(temperature=0.5), dict(temperature=1.0),
            dict(temperature=1.5), dict(temperature=1.5, top_k=5), dict(temperature=1.5, top_p=0.8)]
for options in settings:
    rng = np.random.default_rng(1)
    tokens = gpt2np.generate(target, prompt_ids, 150, rng=rng, **options)
    print(f"--- {options}\n{prompt}{tokenizer.decode(tokens)}\n")

# %% [markdown]
# **Summary.** Temperature reshapes the whole distribution; top-k and top-p cut its tail, with
# a fixed count or a fixed mass. All three are deterministic functions of the logits; the only
# randomness is the final draw, from a generator you pass in.
#
# *References:* Holtzman et al. 2020, *The Curious Case of Neural Text Degeneration* (top-p);
# Fan, Lewis & Dauphin 2018, *Hierarchical Neural Story Generation* (top-k); Hugging Face
# `TemperatureLogitsWarper` / `TopKLogitsWarper` / `TopPLogitsWarper` (the order used here).
