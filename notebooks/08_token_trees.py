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
# # 08 · Token trees: many candidate continuations, verified in one target pass
#
# A round of speculative decoding (notebook 04) drafts a **chain** *x₁..x_K* and verifies it with one
# target pass over *K* + 1 rows. After the first rejection every later draft was paid for and thrown
# away. A **token tree** spends those rows differently: where the draft is unsure, a node gets several
# children, so that one of them is more likely to be the target's token. The target still scores
# the whole tree in **one** call, and the output is still **exactly** the target's distribution.
# This is SpecInfer's token-tree verification (Miao et al. 2024), Medusa's tree attention (Cai et
# al. 2024), and the multi-draft speculative sampling of Yang et al. 2024 and Jeon et al. 2024;
# Sequoia (Chen et al. 2024) picks the tree's shape from the hardware's own cost curve.
#
# A tree's **shape** here is its width per depth: (3, 2, 1) gives the root (the context's newest
# token) 3 children, each of those 2, and each of those 1: 3 + 6 + 6 = 15 drafted nodes, 16 target
# rows. A chain of *K* drafts is (1, 1, ..., 1). Four parts:
#
# 1. one round's tree, drawn, with the path the target accepted;
# 2. how one forward pass scores every node: positions by depth and a tree attention mask;
# 3. the tree kernel, which tries a node's children in turn, and why it is exact;
# 4. which tree: what theory predicts, what this machine measures, and where trees pay.
#
# Code: `gpt2np/decoding/tree_drafts.py` (drawing trees), `gpt2np/model/rows.py` (the one pass),
# `gpt2np/decoding/tree_kernel.py` (verification), `gpt2np/decoding/tree_shape.py` and
# `tree_policy.py` (which tree).

# %%
import os
import sys
from functools import partial
from operator import itemgetter
from pathlib import Path

# Import gpt2np from this clone of the repository (the folder above notebooks/), and before
# NumPy: it sets OpenBLAS's thread timeout, which OpenBLAS reads only when NumPy loads it.
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "gpt2np" / "__init__.py").is_file())
sys.path.insert(0, str(ROOT))
import gpt2np
from gpt2np.teach import explain
from threadpoolctl import threadpool_limits

threadpool_limits(1)  # the bundled models are tiny: one BLAS thread is faster (see notebook 04)

# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

# %%
from gpt2np.decoding import tree_shape
from gpt2np.decoding.policies import v_curve
from gpt2np.decoding.speculative_kernel import residual_distribution
from gpt2np.decoding.tree_drafters import ModelTreeDrafter
from gpt2np.decoding.tree_drafts import draw_children
from gpt2np.decoding.tree_kernel import node_output_distribution, proposals_from_q
from gpt2np.model import rows
from gpt2np.report import colour_by_provenance
from gpt2np.teach.broken_tree_kernels import BROKEN_TREE_KERNELS
from gpt2np.teach.exact import max_abs_difference, total_variation
from gpt2np.teach.toy_models import random_toy_model

# colour in Jupyter and on a terminal; plain text into a pipe or a file, or under NO_COLOR
colour = "NO_COLOR" not in os.environ and ("ipykernel" in sys.modules or sys.stdout.isatty())

target, draft = explain.load_bundled_pair()
tokenizer = target.tokenizer
print(f"target: {target.name}, {target.config.n_params():,} parameters; draft: {draft.name}, "
      f"{draft.config.n_params():,} parameters; {target.n_vocab} tokens (bytes)")
prompt = "ROMEO:\nWhat light through yonder window breaks?"
prompt_ids = tokenizer.encode(prompt)

# %% [markdown]
# ## 1 · One round's tree
#
# `speculative_generate(..., tree=(3, 2, 1))` makes the draft model grow that shape every round
# (`ModelTreeDrafter`): one draft call per **level**, the level's nodes in one call, each node's
# children drawn from the draft's *q* after its own path, **without replacement** (siblings are
# distinct). With `trace=True` each round's `RoundEvent` keeps the tree: `drafts` (node *i* is
# `drafts[i - 1]`, in level order), `parents`, the kernel's `tried` children and the accepted `path`.

# %%
result = gpt2np.speculative_generate(target, draft, prompt_ids, 120, tree=(3, 2, 1), temperature=0.8,
                                     rng=np.random.default_rng(1), trace=True)
print(prompt + colour_by_provenance(tokenizer, result.tokens, result.provenance, colour))
print(f"\n{result.stats.tokens_per_target_call:.2f} tokens per target call; acceptance by depth and sibling "
      f"rank, (tried, accepted): {result.stats.by_rank}")
# A round whose accepted path went through a second or third child: what a chain could not have kept.
record = next(r for r in result.trace if any(r.parents.index(r.parents[node]) != node for node in r.path))
start = sum(len(r.tokens) for r in result.trace[:result.trace.index(record)])
context = prompt_ids + result.tokens[:start]
print(f"\nround {result.trace.index(record) + 1}: context ...{tokenizer.decode(context)[-40:]!r}, "
      f"emitted {tokenizer.decode(record.tokens)!r} ({', '.join(record.provenance)})")

# %% [markdown]
# The tree below reads left to right, like the text: the root is the context's newest token, each
# column one depth. **Green**: the accepted path. **Red**: children the kernel tried and rejected.
# **Grey**: never tried (their parent was rejected, or an earlier sibling was accepted). **Orange**:
# the token the target adds after the path (a resample after a rejection, or a bonus at a leaf).

# %%
parents, tokens = record.parents, (context[-1], *record.drafts)  # node 0 = the root
depth, n = rows.tree_depths(parents), len(parents)
children = [[j for j in range(n) if parents[j] == i] for i in range(n)]
# Leaves one row apart in drawing order (a node's path sorts it among its cousins); parents centred.
leaves = sorted(tuple(rows.tree_path(parents, i)) for i in range(n) if not children[i])
y = np.zeros(n)
y[[path[-1] for path in leaves]] = -np.arange(len(leaves))
for i in reversed(range(n)):
    y[i] = np.mean(y[children[i]]) if children[i] else y[i]
rejected = {node for node, ok in record.tried if not ok}
colour = ["lightsteelblue" if i == 0 else "tab:green" if i in record.path else "salmon" if i in rejected
          else "lightgrey" for i in range(n)]
last, end = (record.path[-1] if record.path else 0), depth.max() + 1  # t goes in its own column

# %%
fig, ax = plt.subplots(figsize=(9, 0.45 * len(leaves) + 1.2))
for i in range(1, n):
    ax.plot([depth[parents[i]], depth[i]], [y[parents[i]], y[i]], c="grey", lw=0.8, zorder=1)
labels = explain.token_labels(tokenizer, tokens)
for i in range(n):
    ax.text(depth[i], y[i], f"{labels[i]}", ha="center", va="center", fontsize=11, zorder=2,
            bbox=dict(boxstyle="round", fc=colour[i], ec="black" if i in record.path else "none"))
ax.plot([depth[last], end], [y[last], y[last]], "--", c="tab:orange", zorder=1)
ax.text(end, y[last], explain.token_labels(tokenizer, record.tokens[-1:])[0], ha="center",
        va="center", fontsize=11, bbox=dict(boxstyle="round", fc="tab:orange"))
ax.set(xlim=(-0.5, end + 0.5), ylim=(-len(leaves) + 0.3, 0.7), yticks=[],
       xticks=range(end + 1), xlabel="depth (position after the context)")
ax.set_xticklabels(["root"] + [str(d) for d in range(1, end)] + [f"target's {record.provenance[-1]}"])
ax.set_title(f"shape (3, 2, 1): {n - 1} drafted nodes, one target call; emitted "
             f"{tokenizer.decode(record.tokens)!r}", fontsize=10)
for side in ("left", "right", "top"):
    ax.spines[side].set_visible(False)

# %% [markdown]
# A chain drafts only one child per depth, and stops at the first rejection. In a round like this
# one, where the path goes through a second or third child, the chain's round would have ended
# earlier; the tree's siblings gave the target other candidates at the same position, scored in the
# same call.
#
# ## 2 · One forward pass over the whole tree
#
# The target scores all the nodes in one call, `GPT2.forward_rows(ids, positions, scope, cache)`
# (`gpt2np/model/rows.py`). The nodes are flattened into rows in level order, and two things change
# from a plain forward pass:
#
# * **positions by depth**: a node at depth *d* sits at position `n_past + d`, where a plain forward
#   of its own path would put it (siblings share a position);
# * **the attention scope**: each row sees the cached prefix and, among the new rows, only itself and
#   its ancestors, `rows.tree_scope(parents)`, instead of the causal mask's "every row before me".
#
# Left: the tree's scope for the round above (row *i* sees column *j* where it is dark). Right: the
# chain's causal mask over the same rows, which would let a node see its cousins.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
names = [f"{i}:{label}" for i, label in enumerate(labels)]
for ax, mask, title in [(axes[0], rows.tree_scope(parents), "tree scope: ancestors and itself (and the prefix)"),
                        (axes[1], rows.chain_scope(n), "a chain's causal mask (wrong for a tree)")]:
    ax.imshow(mask, cmap="Greens", vmin=0, vmax=1.3)
    ax.set_xticks(range(n), names, rotation=90, fontsize=8); ax.set_yticks(range(n), names, fontsize=8)
    ax.set(title=title, xlabel="new row j (node: token)", ylabel="row i")
plt.tight_layout()
print("positions:", rows.tree_positions(parents, n_past=len(context) - 1).tolist())

# %% [markdown]
# The check: each node's logits from the one tree pass must equal a plain forward pass over the
# prefix and that node's own path, root to node. The same arithmetic runs on matrices of a different
# height, so float32 rounds differently: `tests/model/test_tree_forward.py` allows 3·10⁻⁵ on this
# model (logits up to about 5). The negative control feeds the same rows with a chain's consecutive
# positions and causal mask.

# %%
prefix = context[:-1]  # the cache holds the prefix; the root (the newest token) is row 0 of the call
plain = np.stack([target.forward(prefix + [tokens[j] for j in rows.tree_path(parents, i)], target.new_cache())[0]
                  for i in range(n)])                                                         # [n, n_vocab]
cache = target.new_cache(); target.forward(prefix, cache)
tree_logits = target.forward_rows(tokens, rows.tree_positions(parents, len(prefix)), rows.tree_scope(parents), cache)
cache = target.new_cache(); target.forward(prefix, cache)
chain_logits = target.forward_rows(tokens, len(prefix) + np.arange(n), rows.chain_scope(n), cache)
print(f"{n} nodes in one call, logits {tree_logits.shape}")
print(f"max |tree pass - plain pass of the node's path|            = {np.abs(tree_logits - plain).max():.1e}")
print(f"max |chain positions and mask - plain pass of the path|     = {np.abs(chain_logits - plain).max():.1e}")

# %% [markdown]
# After verification the target's cache holds every node's key and value; `KVCache.keep_rows`
# keeps the accepted path's rows, moved to the positions a plain forward would have given them, and
# the next round goes on as if only that path had been fed.
#
# ## 3 · The tree kernel: children tried in turn against the residual
#
# At a node with children *x₁..x_m* (`gpt2np/decoding/tree_kernel.py`, Step 3′):
#
# * try *x_j* with probability min(1, *p_j(x_j)* / *q_j(x_j)*), where *q_j* is the law *x_j* was drawn
#   from (*q*, or without replacement *q* with *x₁..x_{j−1}* removed and renormalised);
# * if accepted, move to that child and start again there with its own *p* and *q*;
# * if rejected, *p_{j+1}* = norm(max(0, *p_j* − *q_j*)): the next sibling is tested against the
#   **residual**, not against *p*;
# * all rejected: the target draws *t* ~ *p_{m+1}*; a leaf reached: *t* ~ its *p* (the bonus).
#
# With one child per node this is the chain kernel, coin for coin. Below, one node over 4 tokens
# where the draft over-proposes token 0: its three children drawn without replacement, and the
# distributions each would be tested against.

# %%
p = np.array([0.05, 0.5, 0.2, 0.25])   # the target after the node
q = np.array([0.5, 0.2, 0.1, 0.2])     # the draft after the node
kids = draw_children(q, 3, np.random.default_rng(3), replacement=False)
p_j, steps = p, []
print(f"{'j':>2} {'x_j':>4} {'q_j(x_j)':>9} {'p_j(x_j)':>9} {'accept with':>11}")
for j, (x, q_j) in enumerate(zip(kids, proposals_from_q(q, kids, replacement=False)), start=1):
    steps.append((x, p_j, q_j))
    print(f"{j:>2} {x:>4} {q_j[x]:9.3f} {p_j[x]:9.3f} {min(1.0, p_j[x] / q_j[x]):11.3f}")
    p_j = residual_distribution(p_j, q_j)  # what the next sibling faces if x_j is rejected
print(f"all rejected: t ~ p_4 = {np.round(p_j, 3).tolist()}")

# %%
fig, axes = plt.subplots(1, len(steps), figsize=(4 * len(steps), 2.8), sharey=True)
for j, (ax, (x, p_now, q_now)) in enumerate(zip(axes, steps), start=1):
    ax.bar(np.arange(4) - 0.2, p_now, 0.4, label=f"p_{j}" + (" = p" if j == 1 else " (residual)"))
    ax.bar(np.arange(4) + 0.2, q_now, 0.4, label=f"q_{j}", color="tab:orange")
    ax.set_xticks(range(4), [str(t) for t in range(4)]); ax.get_xticklabels()[x].set_color("red")
    ax.set(title=f"child {j}: x_{j} = {x} (red)", xlabel="token"); ax.legend(fontsize=8)
axes[0].set_ylabel("probability")
plt.tight_layout()

# %% [markdown]
# Why this is exact, at one node, by induction on *m*: trying *x₁* ~ *q₁* is one position of
# speculative sampling, which emits *x* by acceptance with probability min(*p*, *q₁*)(*x*) and is
# rejected with probability Σ max(0, *p* − *q₁*). The residual *p₂* does not depend on which *x₁* was
# rejected, and by induction the other *m* − 1 children emit exactly *p₂*. So
# P(*x*) = min(*p*, *q₁*)(*x*) + max(0, *p* − *q₁*)(*x*) = *p*(*x*). `node_output_distribution` is that
# recursion as code, over every first draw:

# %%
for replacement in (False, True):
    for m in (1, 2, 3):
        law = node_output_distribution(p, q, m, replacement)
        print(f"m = {m}, {'with' if replacement else 'without'} replacement: emitted law "
              f"{np.round(law, 6).tolist()}, max |law - p| = {np.abs(law - p).max():.1e}")

# %% [markdown]
# **Whole sequences, exactly.** As in notebook 05, a toy pair over 3 tokens (a trigram target, a
# bigram draft: `gpt2np.teach.toy_models`) lets `gpt2np.teach.exact.exact_distribution` run the real
# `speculative_generate` once per random path and add up the probabilities: the exact law of the
# output, with no sampling error. The tree rounds here go through the same code as the bundled pair's:
# the draft grows the tree level by level with `forward_rows`, the target scores it in one call. The
# broken kernels (`gpt2np.teach.broken_tree_kernels`) are plausible mistakes; each leaves a chain
# exactly right, so only a tree with siblings shows them.

# %%
rng = np.random.default_rng(0)
toy_target, toy_draft = random_toy_model(rng, n_vocab=3, order=3), random_toy_model(rng, n_vocab=3, order=2)
toy_prompt, n_tokens, lines = [0, 1], 3, []
for options in ({}, {"temperature": 0.7, "top_k": 2}):
    want = explain.exact_target_distribution(toy_target, toy_prompt, n_tokens, **options)
    for shape, replacement in [((2,), False), ((2, 1), False), ((3, 1), False), ((2,), True), ((2, 1), True)]:
        drafter = ModelTreeDrafter(toy_draft, shape, replacement)
        law = explain.exact_speculative_distribution(toy_target, drafter, toy_prompt, n_tokens, 4, **options)
        lines.append(f"{str(options or 'temperature 1'):<32} tree {str(shape):<7} {'with' if replacement else 'without'} "
                     f"replacement: max |P_tree - P_target| = {max_abs_difference(law, want):.1e}")
print("\n".join(lines))

# %%
want = explain.exact_target_distribution(toy_target, toy_prompt, n_tokens)
laws = {"tree (2, 1), verify_tree": explain.exact_speculative_distribution(toy_target, toy_draft, toy_prompt,
                                                                           n_tokens, 4, tree=(2, 1))}
for name, kernel in BROKEN_TREE_KERNELS.items():
    laws[f"broken: {name}"] = explain.exact_speculative_distribution(toy_target, toy_draft, toy_prompt, n_tokens, 4,
                                                                     tree=(2, 1), tree_kernel=kernel)
for name, law in laws.items():
    print(f"{name:<46} total variation from the target: {total_variation(law, want):.4f}")

# %%
outcomes = list(want)
fig, axes = plt.subplots(2, 2, figsize=(11, 5.5), sharey=True)
for ax, (name, law) in zip(axes.flat, laws.items()):
    ax.bar(np.arange(len(outcomes)), [want[o] for o in outcomes], 0.8, color="lightgrey", label="target (generate)")
    ax.plot(np.arange(len(outcomes)), [law.get(o, 0.0) for o in outcomes], "o", ms=3,
            c="tab:green" if name.startswith("tree") else "tab:red", label="speculative, tree (2, 1)")
    ax.set(title=f"{name}\nTV {total_variation(law, want):.3f}", xlabel=f"3-token outcome ({len(outcomes)} of them)", xticks=[])
    ax.legend(fontsize=7)
axes[0][0].set_ylabel("exact probability"); axes[1][0].set_ylabel("exact probability")
plt.tight_layout()

# %% [markdown]
# **Reading it.** The real kernel matches the target's law of every 3-token outcome to about 10⁻¹⁶
# (float rounding), for every shape, with and without replacement, at temperature 1 and with
# temperature / top-*k*. Each broken kernel runs, accepts plausibly, writes fluent text, and misses
# the law by a total variation of 0.13–0.20 here: "any child passes" and "siblings see the unmodified
# *p*" over-accept tokens that a rejected sibling's residual already paid for; "the with-replacement
# rule on any tree" tests a sibling against *q* although it was drawn from *q* without its elder
# siblings. `tests/decoding/test_tree_kernel.py` runs the same checks over more shapes and pairs,
# and at temperature 0 token for token; `tests/teach/test_tree_statistical.py` checks the bundled
# pair with a chi-square test.

# %% [markdown]
# ## 4 · Which tree
#
# Let *a_{d,r}* be the chance that the child of sibling rank *r* (0 = first tried) at depth *d* is
# accepted, given that it is tried. A reached node at depth *d* − 1 with *w_d* children passes one
# of them with chance *P_d* = 1 − Π_{r<w_d} (1 − *a_{d,r}*), so (`tree_shape.expected_tokens`)
#
# $$E[\text{tokens per round}] = 1 + P_1 + P_1 P_2 + \dots + P_1 \cdots P_D .$$
#
# A round costs *D* draft calls (one per level) of *c* each, one target call over 1 + *n*(*w*) rows,
# *v*(1 + *n*), and *o* per drafted node for everything else (drawing, softmax of each node's rows,
# trying, Python), all in one-token target calls; `tree_shape.tree_speedup` is
# E[tokens] / (*D c* + *v*(1 + *n*) + *o n*). With one child per node this is Leviathan et al.'s
# Thm 3.8 with the measured *v* (notebook 07). A tree wins when its extra siblings raise *P_d*
# more than its extra rows raise *v* and *o n*.
#
# First the costs on this machine: *v*(*M*) of the bundled target, through the plain forward (a
# chain's call) and `forward_rows` (a tree's), and *c* of the draft; the median of 30 interleaved
# calls each, turned into ratios by `policies.v_curve` (the K and tree policies' own estimator).

# %%
ids = np.array(tokenizer.encode(" But soft, what light through yonder window breaks"))[:16]  # up to 16 rows
seconds = {"forward": {}, "forward_rows": {}, "draft": {}}
caches = {"target": target.new_cache(), "draft": draft.new_cache()}
target.forward(prompt_ids, caches["target"]); draft.forward(prompt_ids, caches["draft"])
for _ in range(explain.repeats(30)):
    for M in range(1, 17):
        for kind, call in [("forward", partial(target.forward, ids[:M], caches["target"], M)),
                           ("forward_rows", partial(target.forward_rows, ids[:M], len(prompt_ids) + np.arange(M),
                                                    rows.chain_scope(M), caches["target"]))]:
            seconds[kind].setdefault(M, []).append(explain.best_time(call, 1)[1])
            caches["target"].truncate(len(prompt_ids))
    seconds["draft"].setdefault(1, []).append(explain.best_time(partial(draft.forward, ids[:1], caches["draft"]), 1)[1])
    caches["draft"].truncate(len(prompt_ids))
t1 = float(np.median(seconds["forward"][1]))
v_chain, v_tree = v_curve(seconds["forward"], 16), v_curve(seconds["forward_rows"], 16)
c = float(np.median(seconds["draft"][1])) / t1
print(f"target one-token call {1e3 * t1:.2f} ms, draft {1e3 * c * t1:.2f} ms: c = {c:.3f}")
print("M             " + " ".join(f"{M:>5}" for M in range(1, 17)))
print("v forward     " + " ".join(f"{v_chain[M]:5.2f}" for M in range(1, 17)))
print("v forward_rows" + " ".join(f"{v_tree[M]:5.2f}" for M in range(1, 17)))

# %% [markdown]
# For comparison, a large target: GPT-2 355M's *v*(*M*) under OpenBLAS's SkylakeX kernel with
# gpt2np's products, as PERFORMANCE.md reports it (`python -m bench --sections kernels`; the sizes it
# did not time filled in by `v_curve`'s line).

# %%
v_355M = v_curve({1: [1.0], 2: [1.25], 3: [1.33], 5: [1.46], 7: [1.61], 8: [1.56], 9: [1.86], 12: [2.05],
                  16: [2.32]}, 16)
plt.figure(figsize=(7, 3.8))
plt.plot(range(1, 17), [v_chain[M] for M in range(1, 17)], "o-", label=f"{target.name}: forward (chains)")
plt.plot(range(1, 17), [v_tree[M] for M in range(1, 17)], "s-", label=f"{target.name}: forward_rows (trees)")
plt.plot(range(1, 17), [v_355M[M] for M in range(1, 17)], "^--", label="355M, SkylakeX, gpt2np (PERFORMANCE.md)")
plt.plot(range(1, 17), range(1, 17), ":", c="grey", label="M one-token calls")
plt.ylim(0, 4); plt.xticks(range(1, 17)); plt.grid(alpha=0.3); plt.legend(fontsize=8)
plt.xlabel("M (rows: 1 + drafted nodes)"); plt.ylabel("v(M) = t(M) / t(1)")
plt.title("what a target call over M rows costs, in one-token calls", fontsize=10);

# %% [markdown]
# **Reading it.** On this CPU neither target scores rows for free: both curves stay near 1.1–1.6 up to
# about 8 rows and reach about 2.3–3 at 16 (the bundled curves move by a few tenths from run to run,
# `forward_rows` most: it builds a mask for every call). So a tree of 15 nodes costs a target call
# about 2.3 times a one-token call (up to 3 in other builds); a chain of 3 drafts, about 1.2 of one. The tiny target's curve is
# about as flat as the large one's, although its call is about a millisecond against tens of
# milliseconds: a 2.6M-parameter call is mostly the fixed cost of its hundred-odd NumPy operations
# rather than reading weights, and that cost, too, grows with the rows.

# %% [markdown]
# Now acceptance by depth and sibling rank, from one run with a wide tree (3, 2, 1, 1, 1) at
# temperature 0 and 0.8 (`stats.by_rank`), and the sweep: tokens per target call and tokens per
# second of chains (*K* = 2..5), fixed trees, the automatic shape (`tree="auto"`, `tree_policy.AutoTree`)
# and the auto *K* policy's chains, 200 tokens each, the fastest of 3 interleaved runs
# (`explain.tree_sweep`). Beside each: the predicted tokens per round from the wide run's rates,
# and the speedup `tree_speedup` predicts from the measured *v* and *c* alone (*o* = 0).

# %%
SHAPES = [2, 3, 4, 5, (2, 1), (2, 1, 1), (3, 2, 1), "auto", "auto K"]
_, plain_seconds = explain.best_time(partial(gpt2np.generate, target, prompt_ids, 200), explain.repeats(3))
sweeps, rates = {}, {}
for temperature in (0.0, 0.8):
    wide = gpt2np.speculative_generate(target, draft, prompt_ids, 200, tree=(3, 2, 1, 1, 1), temperature=temperature,
                                       rng=np.random.default_rng(0))
    rates[temperature] = [[accepted / tried if tried else 0.0 for tried, accepted in at_depth]
                          for at_depth in wide.stats.by_rank]  # rates[d - 1][r] = a_{d,r}
    sweeps[temperature] = explain.tree_sweep(target, draft, prompt_ids, 200, SHAPES, temperature, seed=0,
                                             repeats=explain.repeats(3))
print(f"target alone: {200 / plain_seconds:.0f} tokens/s")
for temperature, rate in rates.items():
    print(f"temperature {temperature}: a_(d,r) = " + "  ".join(f"d={d + 1}: " + ", ".join(f"{a:.2f}" for a in row)
                                                         for d, row in enumerate(rate)))

# %%
for temperature, sweep in sweeps.items():
    print(f"temperature {temperature}\n{explain.tree_sweep_lines(sweep)}")
    print(f"{'':<14} {'predicted tokens/call':>22} {'predicted speedup (o = 0)':>26} {'measured speedup':>17}")
    for row in sweep[:-2]:  # the fixed shapes
        widths = (1,) * row["shape"] if isinstance(row["shape"], int) else row["shape"]
        v = v_chain if max(widths) == 1 else v_tree
        print(f"{str(row['shape']):<14} {tree_shape.expected_tokens(widths, rates[temperature]):>22.2f} "
              f"{tree_shape.tree_speedup(widths, rates[temperature], c, v):>25.2f}x "
              f"{row['tokens_per_second'] * plain_seconds / 200:>16.2f}x")
    print()

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 3.8))
names = [str(s) if not isinstance(s, int) else f"K={s}" for s in SHAPES]
for i, (temperature, sweep) in enumerate(sweeps.items()):
    colours = ["tab:blue" if isinstance(r["shape"], int) or r["shape"] == "auto K" else "tab:green" for r in sweep]
    axes[0].bar(np.arange(len(sweep)) + 0.4 * i - 0.2, [r["tokens_per_target_call"] for r in sweep], 0.4,
                color=colours, alpha=1 - 0.45 * i)
    axes[1].bar(np.arange(len(sweep)) + 0.4 * i - 0.2, [r["tokens_per_second"] for r in sweep], 0.4,
                color=colours, alpha=1 - 0.45 * i)
axes[1].axhline(200 / plain_seconds, c="grey", ls=":", label="target alone")
axes[0].set(ylabel="tokens per target call", title="chains (blue) and trees (green): left bar T = 0, right T = 0.8")
axes[1].set(ylabel="tokens per second", title="the same runs' speed (fastest of 3)")
for ax in axes:
    ax.set_xticks(range(len(SHAPES)), names, rotation=30, fontsize=8); ax.grid(alpha=0.3, axis="y")
axes[1].legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# **Reading it.** The counting side works. The rates of one wide run predict each fixed shape's
# tokens per target call to within about 0.3, *K* = 5 at 0.8 aside (these counts do not depend on
# the clock: the same seeds give the same numbers in every run). A tree gives more tokens per target call than the
# chain of its depth: (2, 1, 1) 3.17 and (3, 2, 1) 3.28 against *K* = 3's 2.90 at temperature 0
# (3.08 and 3.39 against 2.90 at 0.8), because a rejected first child often has a sibling the
# target accepts (*a_{d,1}* ≈ 0.4). A longer chain can collect as many (*K* = 5: 3.17 at temperature
# 0; 3.85 at 0.8, seed 0's lucky draws against a prediction of 3.26).
#
# The clock says otherwise: on this pair **every tree is slower than the best chain**. The measured
# speedups fall short of the prediction for chains and trees alike, and much further for trees
# (all timings move by 10–30 % from run to run on this shared machine). The prediction counts the
# two models' calls (*c*, and *v* of the rows) and nothing else, the *o* = 0 above. A tree does
# more of everything else: every node's row of *q* and of *p* goes through a softmax over the
# vocabulary, every tried child through the kernel's Python, every level through a draft call over
# more rows, and the target's rows through a mask. Against a 1–3 ms target call that is not small.
# The automatic shape (`tree="auto"`) estimates this *o* from the run's own clock and takes the
# auto *K* policy's depth, branching only where the run's counts predict a tree beats that chain by
# 5 %, and would still beat every chain were α a standard deviation higher (`tree_policy.py`); its shapes and tokens per call move from run to run because its choices
# follow the clock. A round's time split by where it
# went, for a chain and two trees (greedy; of 3 runs each, the fastest one's own stopwatches):

# %%
breakdown = {}
for shape in [3, (2, 1, 1), (3, 2, 1)]:
    kwargs = dict(K=shape) if isinstance(shape, int) else dict(tree=shape)
    runs = [explain.best_time(partial(gpt2np.speculative_generate, target, draft, prompt_ids, 200, **kwargs), 1)
            for _ in range(explain.repeats(3))]
    run, wall = min(runs, key=itemgetter(1))  # (result, seconds) of the fastest run
    s = run.stats
    breakdown[str(shape)] = {"draft calls": s.draft_seconds / s.rounds, "target call": s.target_seconds / s.rounds,
                             "everything else": (wall - s.draft_seconds - s.target_seconds) / s.rounds,
                             "tokens": 200 / s.rounds, "nodes": s.drafted / s.rounds}
print(f"{'shape':<10} {'nodes':>5} {'tokens':>6} {'draft ms':>8} {'target ms':>9} {'rest ms':>7} {'ms/token':>8}")
for name, b in breakdown.items():
    ms = 1e3 * (b["draft calls"] + b["target call"] + b["everything else"])
    print(f"{name:<10} {b['nodes']:5.1f} {b['tokens']:6.2f} {1e3 * b['draft calls']:8.2f} {1e3 * b['target call']:9.2f} "
          f"{1e3 * b['everything else']:7.2f} {ms / b['tokens']:8.3f}")

# %%
fig, ax = plt.subplots(figsize=(7, 3))
left = np.zeros(len(breakdown))
for part, colour in [("draft calls", "tab:orange"), ("target call", "tab:blue"), ("everything else", "tab:grey")]:
    widths = [1e3 * b[part] / b["tokens"] for b in breakdown.values()]
    ax.barh(range(len(breakdown)), widths, left=left, color=colour, label=part)
    left += widths
ax.set_yticks(range(len(breakdown)), [f"{name}: {b['nodes']:.0f} nodes, {b['tokens']:.2f} tokens/round"
                                      for name, b in breakdown.items()])
ax.set(xlabel="milliseconds per emitted token", title=f"{target.name} + {draft.name}, greedy, 200 tokens")
ax.legend(fontsize=8); ax.invert_yaxis()
plt.tight_layout()

# %% [markdown]
# **Reading it.** A tree's round costs more than the chain's: a target call over 7 or 16 rows
# instead of 4, the draft's level calls over more rows, and more of "everything else" (the loop's
# own work: softmax, drawing, the kernel, Python), which grows with the nodes. The 0.3–0.4 more
# tokens per round that the trees buy do not pay for it, and per emitted token the chain is the
# cheapest.
#
# **Where trees pay.** A tree wins when its extra siblings buy more acceptance than its extra rows
# and nodes cost. On the bundled pair neither side is favourable:
#
# * **the cost side**: a flat *v*(*M*) on a large target, whose one-token call is tens of milliseconds
#   (it reads hundreds of MB of weights), so that the per-node work *o* is negligible beside it and a
#   tree's extra rows cost only what *v* says. A GPU, where *v* ≈ 1 for dozens of rows, is the
#   extreme case, and where SpecInfer, Medusa and Sequoia use trees;
# * **the acceptance side**: a draft whose first choice is often wrong but whose second is often right
#   (*a_{d,1}* high). The bundled draft's first choice is right about three times in four (*a_{d,0}* ≈
#   0.75), which leaves a second child little to add.
#
# `tree_shape.best_shape` over every shape up to depth 5, width 4 and 15 nodes (`candidate_shapes`,
# what `tree="auto"` chooses from), with *o* = 0, for the bundled draft's rates and for a draft right
# 45 % of the time at its first choice and 55 % at its second; each with this target's own curve and
# *c* (measured above), and with *c* = 0.1 (a large target) on the 355M curve above and on *v* = 1
# (a GPU-like flat curve). With *o* = 0 the prediction leaves out the very work that sank the trees
# above, so on this target's own line it is the most any shape could give:

# %%
shapes = tree_shape.candidate_shapes(5, 4, 15)
chains = [w for w in shapes if max(w) == 1]
unsure = [[0.45, 0.55, 0.3, 0.2]] * 5  # a_(d,r) for r = 0..3 at every depth
bundled = [row + [None] * (4 - len(row)) for row in rates[0.8]]  # None: a rank the wide run never tried
flat = {M: 1.0 for M in range(1, 17)}
print(f"{'draft':<32} {'v(M)':<18} {'best chain':<16} {'speedup':>7}   {'best shape':<14} {'speedup':>7} {'/ chain':>7}")
for name, rate in [("bundled draft's rates (T = 0.8)", bundled), ("first choice 45 %, second 55 %", unsure)]:
    usable = [w for w in shapes if all(rate[d][r] is not None for d, width in enumerate(w) for r in range(width))]
    for curve, v, c_curve in [(target.name, v_tree, c), ("355M", v_355M, 0.1), ("flat", flat, 0.1)]:
        chain, chain_speedup = tree_shape.best_shape(rate, c_curve, v, chains)
        best, best_speedup = tree_shape.best_shape(rate, c_curve, v, usable)
        print(f"{name:<32} {curve:<18} {str(chain):<16} {chain_speedup:6.2f}x   {str(best):<14} {best_speedup:6.2f}x "
              f"{best_speedup / chain_speedup:6.2f}x")

# %% [markdown]
# (Shapes that need a rate the wide run never measured, a fourth sibling say, are left out for the
# bundled rates rather than guessed.) On this target's own curve, and on the 355M curve, the bundled
# draft's best shape is a chain, or a tree within a few per cent of it: even with *o* = 0 no tree
# gains much here (`python -m bench.trees` prices shapes up to 40 nodes against this target's curve
# and finds at most 1.06 × the best chain, short of the 1.10 × once hoped for on the bundled pair:
# PERFORMANCE.md, "Token trees on the bundled pair"). With a
# flat curve even this draft's siblings pay a little ((2, 2, 1, 1), about 1.14 × the best chain), and
# the unsure draft prefers a tree on every curve, this target's own included (there about 1.2–1.3 ×;
# (2, 2), about 1.19 × on the 355M curve; (2, 2, 2), about 1.5 × on the flat one): on the bundled pair it is the draft's rates, more than
# the target's rows, that leave trees nothing to win. This is the comparison `tree="auto"` makes
# every round with the running machine's own *v*, *c* and *o* and the run's own rates.
#
# **Summary.** A token tree spends a verification pass's rows on alternatives instead of on ever
# deeper guesses. One `forward_rows` call scores every node, with positions by depth and a mask
# that lets each node see only the prefix and its own path, and gives each node the logits of a
# plain pass over its path. The kernel tries a node's children in turn against the residual, which
# keeps the output exactly the target's, checked here by enumeration with broken kernels as
# negative controls. Whether a tree is faster is a question of costs: it buys tokens per target
# call and pays with more rows per call and more work per node. On the bundled pair the work per
# node wins and the best chain stays fastest; a large target with a flat *v*(*M*), or a draft whose
# second choice is often right, tips the balance towards trees. `python main.py --tree 3,2,1` (or
# `--tree auto`) runs the same comparison from the command line.
#
# *References:* Miao et al. 2024, *SpecInfer* (token-tree verification, multi-step speculative
# sampling); Cai et al. 2024, *Medusa* (tree attention); Yang et al. 2024, *Multi-Candidate
# Speculative Decoding*; Jeon et al. 2024, *Recursive Speculative Decoding*; Sun et al. 2023, *SpecTr*;
# Chen et al. 2024, *Sequoia* (tree shape from the hardware's cost curve); Leviathan et al. 2023
# (Thm 3.8).
