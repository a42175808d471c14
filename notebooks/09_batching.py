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
# # 09 · Batching: several sequences in one forward pass, with and without drafting
#
# Everything so far decoded **one** sequence. A server answering a class of 30 students would then
# run 30 generations one after the other. On a CPU that wastes the thing notebook 07 measured: a
# product over a few rows costs little more than over one, because the weights are read from memory
# once either way. **Batching** puts the new rows of several sequences into one matrix, so that every
# step reads the weights once for all of them (Orca, Yu et al. 2022, "selective batching").
#
# Speculative decoding spends the same cheap rows on drafts. Inside a batch the two compete: once the
# batch's own rows fill the cheap part of the cost curve, drafted rows cost full price, and drafting
# stops paying. Serving systems meet exactly this (vLLM turns drafting off above a batch size;
# SmartSpec, Liu et al. 2024, picks *K* per batch from a cost model). Four parts:
#
# 1. what one packed pass over *M* rows costs, against *M*, on a model read from memory and on the
#    bundled target, which sits in the CPU's cache;
# 2. tokens/s against batch size *B* for plain batched decoding and for one sequence at a time;
# 3. the same with drafting (*K* = 1, 2, 4 and `K="auto"`), where drafting stops paying, and the
#    goodput rule that chooses *K* for a batch from the measured cost curve;
# 4. continuous batching: sequences joining and leaving a running batch.
#
# Code: `gpt2np/model/batch.py` (`forward_packed`), `gpt2np/decoding/batched.py` (`generate_batch`),
# `batched_speculative.py` (`speculative_generate_batch`), `batch_policy.py` (*K* for a batch),
# `continuous.py` (`ContinuousBatch`).
#
# Everything runs on **one core** (one BLAS thread). The machine that made these outputs has 2 cores
# shared with other work, so its timings move by 10–30 % from run to run; the **ratios**, each taken
# inside one run, are what count.

# %%
import sys
import time
from functools import partial
from pathlib import Path

# Import gpt2np from this clone of the repository (the folder above notebooks/), and before
# NumPy: it sets OpenBLAS's thread timeout, which OpenBLAS reads only when NumPy loads it.
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "gpt2np" / "__init__.py").is_file())
sys.path.insert(0, str(ROOT))
import gpt2np
from gpt2np.teach import explain
from threadpoolctl import threadpool_limits

threadpool_limits(1)  # one BLAS thread: on a shared 2-core machine a second one measures the neighbour

# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

# %%
from gpt2np.decoding.batch_policy import BatchAutoK, goodputs
from gpt2np.decoding.theory import expected_tokens_under_belief
from gpt2np.model.batch import forward_packed

target, draft = explain.load_bundled_pair()
wide = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=257, n_ctx=256, n_embd=768, n_head=12, n_layer=2), seed=0)
tokenizer = target.tokenizer
print("NumPy's BLAS:", gpt2np.blas_kernel())
for model in (target, draft, wide):
    print(f"{model.name:>18}: {model.config.n_layer} blocks of width {model.config.n_embd}, "
          f"{4 * model.config.n_params() / 2**20:5.1f} MiB of float32 weights")
lines = ["ROMEO:\nWhat light through yonder window breaks?", "JULIET:\nO Romeo, Romeo! wherefore art thou",
         "First Citizen:\nBefore we proceed any further,", "KING RICHARD III:\nNow is the winter of",
         "HAMLET:\nTo be, or not to be:", "MERCUTIO:\nO, then, I see Queen Mab", "PORTIA:\nThe quality of mercy",
         "LEAR:\nBlow, winds, and crack your cheeks!"]
prompts = [tokenizer.encode(line) for line in lines]  # 8 prompts, byte-level ids (all three models' vocabulary)

# %% [markdown]
# `wide` is a GPT-2 with random weights (`gpt2np.random_model`): two blocks of GPT-2 124M's shape
# (width 768), 56 MiB of weights, more than this CPU's caches hold, so that every pass reads its
# weights from memory as a 124M–1.5B model does. The bundled target (Shakespeare, 2.6M parameters)
# has under 10 MiB: after the first pass its weights stay in the cache. Random weights give no
# sensible text, but their passes cost what a trained model of that shape costs.
#
# ## 1 · Why rows are (nearly) free
#
# `forward_packed(model, [(ids_1, cache_1), (ids_2, cache_2), ...])` runs one forward pass over
# every sequence's new rows: they are stacked into one [Σ nᵢ, n_embd] matrix for every product
# (each weight read once), and attention runs per sequence against its own KV cache. Below, *M*
# sequences with 32 cached tokens each feed one new token each: one pass over *M* rows in all, the
# layout of plain batched decoding. Beside it, one sequence feeding *M* new rows (the layout of a
# verification pass: one attention call per layer instead of *M*). Each size is timed 11 times, the
# sizes interleaved, and the fastest of the 11 counts: a busy neighbour only ever slows a pass down.

# %%
CONTEXT, REPEATS = 32, explain.repeats(11)  # 11, or 1 in the test suite's run (it reads no time)
Ms = [*range(1, 13), 14, 16, 20, 24, 32, 40, 48, 64]
ids = np.resize(prompts[0], CONTEXT + max(Ms))  # [CONTEXT + 64] ids: the first prompt, repeated
durations, one_sequence = {}, {}  # model name -> {M: [seconds, one per repeat]}: M sequences x 1 row | 1 x M rows
for model in (target, draft, wide):
    short, long = model.new_cache(CONTEXT + 1), model.new_cache(CONTEXT + max(Ms))
    model.forward(ids[:CONTEXT], short)
    model.forward(ids[:CONTEXT], long)
    caches = [short.copy() for _ in range(max(Ms))]  # 64 sequences, each with CONTEXT tokens cached
    durations[model.name], one_sequence[model.name] = {M: [] for M in Ms}, {M: [] for M in Ms}
    for repeat in range(REPEATS):
        for M in Ms:
            layouts = [(durations[model.name], [(ids[CONTEXT:CONTEXT + 1], c) for c in caches[:M]], 1),
                       (one_sequence[model.name], [(ids[CONTEXT:CONTEXT + M], long)], M)]
            for times, calls, n_logits in layouts[::1 if repeat % 2 else -1]:  # which goes first alternates
                start = time.perf_counter()
                forward_packed(model, calls, n_logits)
                times[M].append(time.perf_counter() - start)
                for cache in (long, *caches[:M]):
                    cache.truncate(CONTEXT)
fastest = {name: np.array([min(t[M]) for M in Ms]) for name, t in durations.items()}  # [len(Ms)] seconds
ratio = {name: t / t[0] for name, t in fastest.items()}
ratio_one = {name: np.array([min(t[M]) for M in Ms]) / fastest[name][0] for name, t in one_sequence.items()}
print(f"{'':>3} " + " ".join(f"{name:^29}" for name in durations))
print(f"{'M':>3} " + " ".join(f"{'ms':>8} {'t(M)/t(1)':>9} {'one seq.':>9} " for name in durations))
for i, M in enumerate(Ms):
    print(f"{M:>3} " + " ".join(f"{1e3 * fastest[name][i]:8.2f} {ratio[name][i]:9.2f} {ratio_one[name][i]:9.2f} "
                                for name in durations))

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
for name, marker, colour in [(wide.name, "o", "C0"), (target.name, "s", "C1")]:
    axes[0].plot(Ms, ratio[name], marker + "-", c=colour, ms=4, label=f"{name}: M sequences, one new row each")
    axes[0].plot(Ms, ratio_one[name], marker + ":", c=colour, ms=4, label=f"{name}: one sequence, M new rows")
    axes[1].plot(Ms, Ms / fastest[name], marker + "-", c=colour, ms=4, label=name)
axes[0].plot(Ms, Ms, "-", c="lightgray", label="M separate one-row passes")
axes[0].axhline(1, c="gray", lw=0.8)
axes[0].set(xlabel="M (rows in the pass)", ylabel="t(M) / t(1)", ylim=(0, 1.1 * max(ratio[target.name])),
            title=f"cost of one packed pass, {gpt2np.blas_kernel().split(',')[0]}, 1 thread")
axes[1].set(xlabel="M (sequences in the pass)", ylabel="new tokens per second (M / t(M))", yscale="log",
            title="M sequences, one token each: tokens/s of the pass alone")
for ax in axes:
    ax.grid(alpha=0.3); ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# **Reading it.** The figures below are the ranges over six runs of this notebook on the machine of
# 2026-11-30 (OpenBLAS's SkylakeX kernel, one thread); the table above is one more run, and single
# timings move by 10–30 % from run to run, while the orderings described here held in every run.
# `wide`'s one-row pass took 2.0–2.4 ms, reading its 56 MiB at about 25 GB/s. **8 rows cost
# 1.65–1.9 one-row passes, 16 rows 2.8–3.2**: 16 sequences get a token each for the price of about 3.
# Then a jump, 3.9–4.6 at 20 rows: gpt2np's few-row products cover 1–16 rows (`blas_kernel()` above:
# its weights are in panels, "small-kernel products (M 1-16)"), and past 16 OpenBLAS's sgemm first
# copies ("packs") its operands, which costs about a one-row pass at once (notebook 07). Past the jump
# each further row is cheap again (64 rows: 12–14.5).
#
# The bundled target's weights sit in the cache, so its one-row pass is short (0.8–1.1 ms: 8 blocks
# of small products), and its rows are **not** free as separate sequences: 16 cost 3.5–4.7 one-row
# passes, 64 cost 10.5–15. The dotted line says why: the same rows fed as one sequence cost 2.1–2.9 at
# 16 rows, about what `wide`'s do (2.4–2.9). The products are the same in both layouts; what differs
# is attention, which is each sequence's own: its scores against its own cache, their sum and its
# weighted values, small NumPy calls for each of 16 sequences in each of 8 blocks, against a pass of
# about a millisecond (a step scales and exponentiates every sequence's scores in one call,
# `attention_together`, which in the builds of 2026-11-27 took 8 sequences' decode step from 2.9 to 2.6
# one-row passes). `wide` has 2 blocks and a pass read from memory, and for it the two layouts cost
# within a sixth of each other.

# %% [markdown]
# ### The weights' order depends on the kernel
#
# gpt2np stores every large weight column-major (each output's weights contiguous), the order its
# few-row methods need under most kernels. Under the Haswell kernels (every x86 CPU without AVX-512)
# those methods end at 7 rows, and from 8 rows on OpenBLAS's sgemm packs the weights first, which it
# does much faster from a **row-major** copy: on the Intel Xeon behind PERFORMANCE.md, a 355M pass
# over 8 rows took 150 ms stored and 124 ms row-major, while one row took 52 and 55 ms. So a model
# that serves batches takes the order `gpt2np.order_for_batches(model)` names for its kernel (the
# server does, with `--max_batch` above 1), and everything else keeps the one it was loaded in. Under
# SkylakeX a model is loaded in **panels**: each large weight cut into blocks of 32 columns, each
# block's [k, 32] weights contiguous (a 3-D array [n / 32, k, 32]), which OpenBLAS's small-matrix
# kernel multiplies by up to 16 rows as they lie, without packing, at nearly one row's cost (on the
# Zen 4 EPYC of PERFORMANCE.md, a 355M step of 8 sequences 0.79× its cost column-major, one
# sequence's step level; notebook 07, section 5), and batches keep it. Under the Haswell kernels there
# is no such kernel and panels are slow. The cell below times `wide` in the three orders on this
# machine's kernel, one sequence and 8, fastest of 11 passes each.

# %%
loaded_order = gpt2np.weights_order(wide)  # as random_model (and load_model) gave it, for this kernel
orders = {order: order for order in ("column-major", "row-major", "panels")}
by_order = {order: {M: [] for M in (1, 8)} for order in orders}
for repeat in range(REPEATS):
    for name, order in list(orders.items())[::1 if repeat % 2 else -1]:
        gpt2np.set_weights_order(wide, order)  # copies each large weight into that order, one at a time
        for M in (1, 8):
            start = time.perf_counter()
            forward_packed(wide, [(ids[CONTEXT:CONTEXT + 1], c) for c in caches[:M]])
            by_order[name][M].append(time.perf_counter() - start)
            for cache in caches[:M]:
                cache.truncate(CONTEXT)
batch_order = gpt2np.order_for_batches(wide)  # what a batching server would give wide under this kernel
gpt2np.set_weights_order(wide, loaded_order)
print(f"{gpt2np.blas_kernel()}\nloaded in: {loaded_order}, order_for_batches: {batch_order}")
for name, times in by_order.items():
    one, eight = min(times[1]), min(times[8])
    print(f"{name:>12}: 1 row {1e3 * one:6.2f} ms, 8 rows {1e3 * eight:6.2f} ms, t(8)/t(1) {eight / one:.2f}")

# %% [markdown]
# Under SkylakeX (one thread; six runs of 2026-11-30) the 8-row pass cost 1.35–1.43 times as much
# row-major as column-major (plain sgemm, since `pieces` needs column-major; earlier builds 1.27–1.63)
# and 0.59–0.62 times as much in panels (3.8–4.0 against 6.2–6.5 ms), whose one-row pass was no dearer
# either (1.9–2.1 against 2.9–3.3 ms; single passes on this shared machine move by a third): so under
# SkylakeX a model is loaded in panels and batches keep them. The same cell under the Haswell
# kernels (`OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512` set before Python starts, an earlier build
# on the machine before): one row 5.8 / 5.5 ms, 8 rows 14.9 ms column-major against 12.5 ms
# row-major, and the batch order is row-major (PERFORMANCE.md, Batching: "Row-major weights for
# batches" and "Panels").

# %% [markdown]
# ## 2 · Tokens per second against batch size
#
# `gpt2np.generate_batch(model, prompts, n_tokens)` decodes a list of prompts together: every step
# is one packed pass over the sequences still running; each has its own cache, options, rng, length
# and stop tokens, and leaves the pass when it finishes. Against it: the same prompts through
# `gpt2np.generate`, one after the other. 24 greedy tokens per sequence, the fastest of 5 runs each
# (interleaved); the one-at-a-time time of *B* sequences is the sum of their own runs. Every sequence of every batch
# must equal its solo run (asserted).

# %%
N_TOKENS, Bs = 24, [1, 2, 4, 8]
plain = {}  # model name -> {"alone": [tokens/s by B], "together": [...]}
for model in (target, wide):
    solo = [gpt2np.generate(model, p, N_TOKENS) for p in prompts]  # each prompt alone (and a warm-up)
    solo_s, together_s = [np.inf] * len(prompts), [np.inf] * len(Bs)  # the fastest run of each
    for repeat in range(explain.repeats(5)):  # solo and batched runs interleaved, so that both see the same neighbours
        for i, p in enumerate(prompts):
            solo_s[i] = min(solo_s[i], explain.best_time(partial(gpt2np.generate, model, p, N_TOKENS), 1)[1])
        for j, B in enumerate(Bs):
            together, seconds = explain.best_time(partial(gpt2np.generate_batch, model, prompts[:B], N_TOKENS), 1)
            wrong = [i for i in range(B) if together[i] != solo[i]]
            assert not wrong, f"{model.name}, B = {B}: sequences {wrong} differ from their solo runs"
            together_s[j] = min(together_s[j], seconds)
    n = [sum(map(len, solo[:B])) for B in Bs]  # tokens emitted by B sequences
    plain[model.name] = {"alone": [n_B / sum(solo_s[:B]) for n_B, B in zip(n, Bs)],
                         "together": [n_B / s for n_B, s in zip(n, together_s)]}
print(f"{'tokens/s':>18} {'B':>2} {'one at a time':>13} {'batched':>8} {'ratio':>6} {'section 1: B t(1)/t(B)':>23}")
for name, rate in plain.items():
    for j, B in enumerate(Bs):
        print(f"{name:>18} {B:>2} {rate['alone'][j]:13.0f} {rate['together'][j]:8.0f} "
              f"{rate['together'][j] / rate['alone'][j]:5.2f}x {B / ratio[name][Ms.index(B)]:22.2f}x")
# Sampling: each sequence with its own generator draws exactly what it draws alone.
sampled = gpt2np.generate_batch(target, prompts, N_TOKENS, temperature=0.8, rng=[np.random.default_rng(i) for i in range(8)])
alone = [gpt2np.generate(target, p, N_TOKENS, temperature=0.8, rng=np.random.default_rng(i)) for i, p in enumerate(prompts)]
print(f"sampled at T = 0.8, 8 sequences: {sum(a == b for a, b in zip(sampled, alone))} of 8 equal their solo runs")
assert sampled == alone

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
for ax, name in zip(axes, plain):
    ax.plot(Bs, plain[name]["together"], "o-", label="batched: generate_batch")
    ax.plot(Bs, plain[name]["alone"], "s--", label="one at a time: generate")
    for B, t, a in zip(Bs, plain[name]["together"], plain[name]["alone"]):
        ax.annotate(f"{t / a:.1f}x", (B, t), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set(xlabel="B (sequences)", ylabel="tokens per second", xticks=Bs, ylim=(0, None),
           title=f"{name}: {N_TOKENS} greedy tokens per sequence")
    ax.grid(alpha=0.3); ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# **Reading it.** Every sequence of every batch equalled its solo run (greedy, both models), and
# 8 sampled sequences, each with its own generator, drew exactly their solo draws. On `wide`,
# **8 sequences together gave about 2.8× the tokens per second of one at a time** (2.7–2.85× in six
# runs of 2026-11-30; 2.7–3.7× in earlier builds). A step that cost only its pass would give
# *B* t(1)/t(*B*) = 4.2–4.9× (section 1, the last column); the rest goes to work outside the pass: each
# sequence's token drawn from its logits, the step's bookkeeping, and the prompts' prefill. The bundled
# target gains less, 2.1–2.3× at *B* = 8: its passes are short, so the same per-sequence work is a
# larger share. At *B* = 1 the batched path costs what `generate` does (0.94–1.03× for both models in
# those runs; 0.93–1.17× in earlier ones): `forward_packed` hands a lone sequence to the model's own
# pass.

# %% [markdown]
# ## 3 · With and without drafting
#
# `gpt2np.speculative_generate_batch(target, draft, prompts, n_tokens, K=...)` runs speculative
# rounds for the whole batch: each draft step is one packed call of the draft model, then **one**
# packed target call verifies every sequence's *K* + 1 rows, and each sequence accepts with its own
# coins and rolls back its own caches. So a round of *B* sequences costs *K* draft passes over *B*
# rows plus one target pass over *B*(*K* + 1) rows. `K="auto"` chooses one *K* per round for the
# whole batch (`batch_policy.BatchAutoK`, below; at most `K_max` = 8). Only the bundled pair has a
# draft that agrees with its target, so this part measures on it: *B* = 1 to 16 (the 8 prompts
# twice), 48 greedy tokens per sequence, the methods alternating within each of 3 repeats, the
# fastest of each kept; every output must equal the plain batch's.

# %%
N_SPEC, spec_Bs, many = 48, [1, 2, 4, 8, 16], prompts * 2  # 16 prompts: each of the 8 twice
methods = {"plain batched": partial(gpt2np.generate_batch, target),
           **{f"K = {K}": partial(gpt2np.speculative_generate_batch, target, draft, K=K) for K in (1, 2, 4)},
           'K = "auto"': partial(gpt2np.speculative_generate_batch, target, draft, K="auto")}
speed = {name: [] for name in methods}  # tokens/s by B
for B in spec_Bs:
    reference = gpt2np.generate_batch(target, many[:B], N_SPEC)
    best = {name: np.inf for name in methods}
    for repeat in range(explain.repeats(3)):
        for name, run in methods.items():
            out, seconds = explain.best_time(partial(run, many[:B], N_SPEC), 1)
            assert out == reference, f"B = {B}, {name}: {sum(a != b for a, b in zip(out, reference))} sequences differ"
            best[name] = min(best[name], seconds)
    for name in methods:
        speed[name].append(sum(map(len, reference)) / best[name])
print(f"{'tokens/s':<14}" + "".join(f"{'B = ' + str(B):>9}" for B in spec_Bs))
for name, rates in speed.items():
    print(f"{name:<14}" + "".join(f"{r:9.0f}" for r in rates))
gain = [max(speed[f"K = {K}"][i] for K in (1, 2, 4)) / speed["plain batched"][i] for i in range(len(spec_Bs))]
print(f"{'best K / plain':<14}" + "".join(f"{g:8.2f}x" for g in gain))
print("drafting pays (best fixed K faster than plain batched) for B =", [B for B, g in zip(spec_Bs, gain) if g > 1])

# %%
auto_K = {}  # B -> the K auto chose, round by round
for B in spec_Bs:
    stream = gpt2np.speculative_batch_stream(target, draft, many[:B], N_SPEC, K="auto")
    auto_K[B] = [max(event.K for _, event in step) for step in stream]
print("K = \"auto\": rounds at each K, by B (the run's first and last rounds included)")
for B, Ks in auto_K.items():
    print(f"  B = {B:>2}: " + " ".join(f"{K}:{Ks.count(K)}" for K in sorted(set(Ks))))
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
for name, rates in speed.items():
    axes[0].plot(spec_Bs, rates, "o-" if name.startswith("K") else "k-", lw=2.5 if name.startswith("plain") else 1.5, label=name)
axes[0].set(xlabel="B (sequences)", ylabel="tokens per second", xticks=spec_Bs, ylim=(0, None),
            title=f"{target.name} + {draft.name}, greedy, {N_SPEC} tokens each")
for B, Ks in auto_K.items():
    axes[1].plot(range(1, len(Ks) + 1), Ks, "o-", ms=3, label=f"B = {B}")
axes[1].set(xlabel="round", ylabel="K chosen", title='K = "auto": its K round by round')
for ax in axes:
    ax.grid(alpha=0.3); ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# **Reading it.** The table is one run; these timings move from run to run by as much as drafting's
# gain, so here are the ranges over ten runs. Alone and in pairs (*B* = 1–2) drafting pays on the
# bundled pair: the best fixed *K* gave 1.08–1.8× plain decoding's tokens/s. Then its gain shrinks as
# the batch fills the cheap rows: 0.9–1.25× at *B* = 4, and **at *B* = 8 and 16 about nothing** on
# average (0.8–1.2× over fourteen runs: the run shown may land on either side, and its verdict line
# with it). On this pair the crossover lies at about 8 sequences. `K="auto"` drafts
# less once the batch is full (right, and the counts printed above it, one more run of each; in four
# runs of 2026-11-30: *K* = 3 in about half the rounds of one sequence and most of two, 2–3 at four, 1
# or 2 at eight, 1–2 at sixteen with 8–9 plain rounds; 0–5 in all; a 0 early on is a plain round that
# times the batch's plain pass, which auto needs beside its drafting rounds' passes, and a round where
# no sequence drafts is the plain batched step; the last rounds, as sequences finish, are short). Its
# *K* from eight on moves from run to run (*K* = 1 through one of those runs at 8, *K* = 2 through the
# others; in earlier builds, plain or *K* = 1 at sixteen). It gave 0.96–1.55× plain at *B* = 1–2 and about plain batched's at *B* = 8 and 16
# (0.75–1.2×): the spread there is the machine's, as between two runs of the same rounds. (Until
# 2026-11-27 auto priced every row count past 16 that it had not timed at full cost, as for a GPT-2
# release, and from eight sequences on played plain or *K* = 1: this pair has no such edge, the
# goodput rule below.)
#
# ### The goodput rule
#
# Which *K* is best for a batch? SmartSpec's answer is the one that maximises the **goodput**,
# tokens per second of the whole batch:
#
# $$\text{goodput}(K) = \frac{B\,E(\alpha, K)}{K\,d(B) + T(B(K+1))}, \qquad E(\alpha, K) = 1 + \alpha + \dots + \alpha^K,$$
#
# with *T*(*B*(*K* + 1)) the seconds of the round's target pass (*B* sequences, *K* + 1 new rows
# each), *d*(*B*) the seconds of a draft step over *B* rows, and *K* = 0 plain batched decoding,
# goodput(0) = *B* / *T*(*B*). `batch_policy.goodputs` computes it. Section 1 showed that the same
# rows cost less as a few long blocks than as many one-row sequences, so *T* is timed here in the
# round's own layout, for *B* = 1..12 and *K* = 0..4 (the fastest of 5); *d* is the draft's pass
# from section 1. (`BatchAutoK` learns *T* from its run's own calls, by rows in all, and fills the
# sizes it has not timed with `policies.v_curve`'s line.) For `wide`, which has no draft,
# *d*(*B*) = 0.1 *T*(*B*): a draft a tenth as costly. The acceptance rate α is a parameter: 0.6,
# the bundled pair's own (measured first) and 0.9.

# %%
alpha_here = np.mean([gpt2np.speculative_generate(target, draft, p, N_SPEC, K=4).stats.alpha_empirical for p in prompts])
K_MAX, B_range = 4, range(1, 13)
T = {}  # model name -> {(B, K): seconds of one pass over B sequences of K + 1 new rows each}
for model in (target, wide):
    short = model.new_cache(CONTEXT + K_MAX + 1)
    model.forward(ids[:CONTEXT], short)
    caches = [short.copy() for _ in B_range]
    times = {(B, K): [] for B in B_range for K in range(K_MAX + 1)}
    for repeat in range(explain.repeats(5)):
        for B, K in times:
            start = time.perf_counter()
            forward_packed(model, [(ids[CONTEXT:CONTEXT + K + 1], cache) for cache in caches[:B]], K + 1)
            times[B, K].append(time.perf_counter() - start)
            for cache in caches[:B]:
                cache.truncate(CONTEXT)
    T[model.name] = {key: min(t) for key, t in times.items()}
print(f"the bundled pair's acceptance rate (greedy, K = 4): alpha = {alpha_here:.2f}")
print(f"{'target pass, ms':>18} " + " ".join(f"{'K = ' + str(K):>7}" for K in range(K_MAX + 1)))
for name in T:
    for B in (1, 4, 8, 12):
        print(f"{name:>18} B = {B:>2} " + " ".join(f"{1e3 * T[name][B, K]:7.2f}" for K in range(K_MAX + 1)))

# %%
d = {target.name: {B: fastest[draft.name][Ms.index(B)] for B in B_range},  # the draft's pass over B rows
     wide.name: {B: 0.1 * T[wide.name][B, 0] for B in B_range}}            # a draft a tenth of wide's cost
rows_T = {(name, B): {B * (K + 1): T[name][B, K] for K in range(K_MAX + 1)} for name in T for B in B_range}
best = {}  # (model name, alpha) -> [(K*, goodput(K*) / goodput(0)) for B in B_range]
for name in (target.name, wide.name):
    for alpha in (0.6, alpha_here, 0.9):
        tokens = [sum(alpha ** j for j in range(K + 1)) for K in range(K_MAX + 1)]
        gains = [np.array(goodputs(tokens, B, d[name][B], rows_T[name, B].__getitem__)) for B in B_range]
        best[name, alpha] = [(int(np.argmax(g)), g.max() / g[0]) for g in gains]
print("K* (the best K by goodput) : its goodput over plain batched's, for B = 1..12")
for (name, alpha), rows in best.items():
    print(f"{name:>18}, alpha {alpha:.2f}: " + " ".join(f"{K}:{gain:.2f}" for K, gain in rows))

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
tokens = [sum(alpha_here ** j for j in range(K + 1)) for K in range(K_MAX + 1)]
for B in Bs:
    g = goodputs(tokens, B, d[target.name][B], rows_T[target.name, B].__getitem__)
    axes[0].plot(range(K_MAX + 1), np.array(g) / g[0], "o-", label=f"B = {B}")
axes[0].set(xlabel="K (drafts per sequence per round)", ylabel="goodput(K) / goodput(0)", xticks=range(K_MAX + 1),
            title=f"the bundled pair, alpha = {alpha_here:.2f}, measured T and d")
for j, ((name, alpha), rows) in enumerate(best.items()):
    gains = [gain for _, gain in rows]
    axes[1].plot(B_range, gains, "o-" if name == wide.name else "s--", c=f"C{j % 3}", ms=4, label=f"{name}, alpha {alpha:.2f}")
    for B, (K, gain) in zip(B_range, rows):
        axes[1].annotate(str(K), (B, gain), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7, c=f"C{j % 3}")
axes[1].set(xlabel="B (sequences)", ylabel="goodput(K*) / goodput(0)", xticks=B_range,
            title="what the best K gains over plain batched (K* written at each point)")
for ax in axes:
    ax.axhline(1, c="gray", lw=0.8)
    ax.grid(alpha=0.3); ax.legend(fontsize=7)
plt.tight_layout()

# %% [markdown]
# **Reading it.** Left (*B* = 1–8) and the printed rows (*B* = 1–12), the bundled pair at its own α
# (0.72), from this run's measured passes; in six runs of 2026-11-30 the best drafting round gained
# 1.7–2.1× at *B* = 1 (*K* = 3), 1.25–1.37× at *B* = 4 (*K* = 1), 1.11–1.18× at *B* = 8 (*K* = 1–3) and
# 1.24–1.32× at *B* = 12 (*K* = 1–2): the gain falls as the batch fills, and single passes timed on a
# shared machine move the peak from run to run. Right, `wide` (a draft a tenth of its cost): at α = 0.6
# the best *K* falls from 4 at one sequence to 2 and then 1, and **to 0 from *B* = 8** (at *B* = 6 too,
# by a hair), where even *K* = 1 puts 16 rows or more in the pass, at the 16-row jump of section 1; at
# α = 0.72 drafting past the jump pays nothing (*K* = 0 from *B* = 9). At α = 0.9 the rule drafts past
# *B* = 9 too (*K* = 2–3, 1.01–1.11×, or plain at 12):
# past the jump each row is cheap again, and drafts accepted 90 % of the time pay for them.
#
# For the bundled pair the rule predicts too much: a gain of 1.2–1.5 at every *B* from 4 to 12 at its
# own α, where section 3 measured 0.8–1.2× from *B* = 8 over many runs. The rule counts only the two models'
# passes, and a round does more. Timing rounds of *K* = 2 and their target pass alone:

# %%
print(f"{'K = 2, per round':>16} {'round ms':>9} {'draft steps':>11} {'target pass':>11} {'the rest':>9}")
cache = target.new_cache(CONTEXT + 3)
target.forward(ids[:CONTEXT], cache)
for B in (1, 4, 8, 12):
    rounds = [step[0][1] for step in gpt2np.speculative_batch_stream(target, draft, many[:B], N_SPEC, K=2)][1:-2]
    caches, passes = [cache.copy() for _ in range(B)], []  # and its target pass alone, timed right after
    for repeat in range(len(rounds)):
        start = time.perf_counter()
        forward_packed(target, [(ids[CONTEXT:CONTEXT + 3], c) for c in caches], 3)
        passes.append(time.perf_counter() - start)
        for c in caches:
            c.truncate(CONTEXT)
    round_ms, target_ms = 1e3 * np.median([event.seconds for event in rounds]), 1e3 * np.median(passes)
    draft_ms = 1e3 * np.median([event.propose_seconds for event in rounds])  # draft calls and their sampling
    print(f"{'B = ' + str(B):>16} {round_ms:9.2f} {draft_ms:11.2f} {target_ms:11.2f} {round_ms - draft_ms - target_ms:9.2f}")

# %% [markdown]
# At *B* = 8 a round took 5.4–6.1 ms (six runs of 2026-11-30): its target pass 3.55–3.95, its two draft
# steps 1.1–1.3 (two draft passes cost 0.7 in section 1; each step also turns *B* rows of logits into
# distributions and draws), and 0.5–0.9 ms went to the rest: the target's *B*(*K* + 1) rows into
# distributions, each sequence's verification and cache rollbacks. That work grows with *B* (0.2–0.6 ms
# at *B* = 1–4, 1.0–1.2 at 12; 1.8–4.2 at 8–12 in an earlier build; single rounds move by a third from
# run to run): at *B* = 8 the round spent about 1.2 ms beyond its passes, over a quarter of the
# 4.4–4.7 ms of passes the rule counts (nearly half in that earlier build). Beside a
# pass of tens of milliseconds (a 124M–1.5B target) it would hardly count; beside this pair's 1–5 ms
# passes it moves the crossover from "not up to 12" to about 8.
#
# `BatchAutoK` makes this choice every round with two changes. α is not known, so it keeps a Beta
# belief over it from every position examined so far, and averages *E* over the belief
# (`expected_tokens_under_belief`: by Jensen's inequality this is more than *E* at the belief's mean,
# because *E* is convex in α); whether to draft at all it decides at an optimistic α, so that an
# unlucky start does not lock drafting out, and once the batch has drafted, a retry must be worth what it
# could teach: the best plan after about three rounds' positions, over the rounds the tokens left take,
# against what one try round loses (`try_value`, a knowledge gradient). And *T*, *d* are its own run's
# timed calls (its target
# calls by rows in all, its draft calls by rows including their sampling), a prior curve until there
# are some. A row count it has not timed follows the line through those it has, except past the
# few-row products (16 rows on a GPT-2 release, where OpenBLAS starts packing): there each untimed row
# costs its share of a 16-row pass, so that a full batch does not pay to find that out. This pair's
# weights are small (they sit in the core's cache, and a product over many rows is plain `x @ w`), so
# it has no such edge, and its line carries on. A third cost it prices is the draft's catch-up: a
# draft that has not drafted for a sequence must first read its prompt and everything since (a 124M
# pass over 8 × 17 rows costs about two plain 355M rounds), so that is spread over the tokens the
# batch still wants, and never paid on the prior alone. Before anything is timed it already drafts less as *B* grows:

# %%
a, b = 1 + 40, 1 + 10  # a Beta belief after 40 accepted and 10 rejected drafts: mean 0.79
mean = a / (a + b)
print("E under the belief:", " ".join(f"{e:.2f}" for e in expected_tokens_under_belief(a, b, K_MAX)))
print("E at its mean:     ", " ".join(f"{sum(mean ** j for j in range(K + 1)):.2f}" for K in range(K_MAX + 1)))
print("BatchAutoK's first choice for B = 1, 2, 4, 8, 16, 32, 64 (prior costs, c = 0.1):",
      [BatchAutoK(K_max=K_MAX, c_prior=0.1).choose(B) for B in (1, 2, 4, 8, 16, 32, 64)])

# %% [markdown]
# ## 4 · Continuous batching: sequences join and leave
#
# A server never has a fixed list of prompts: requests arrive while others are half done.
# `gpt2np.ContinuousBatch(model)` keeps the running sequences; `add` puts one in at any time,
# `cancel` takes one out (its client left), and every `step()` is one packed pass over all of them.
# A sequence added since the last step feeds its whole prompt in that pass (its prefill joins the
# others' one-row steps), and a sequence that has its tokens leaves at once. Below, six requests on
# the bundled target, sampled at temperature 0.8, each with its own generator, arrive at different
# steps; request 4 is cancelled at step 14. Every finished request must equal its solo run, and the
# cancelled one a prefix of it.

# %%
arrivals = {0: [(0, 12), (1, 20)], 3: [(2, 8)], 6: [(3, 16), (4, 18)], 11: [(5, 10)]}  # step -> [(prompt, n_tokens)]
CANCEL = (14, 4)  # at step 14, request 4
batch = gpt2np.ContinuousBatch(target)
request, fed, drawn = {}, [], []  # handle -> request; per step: {request: rows fed}; per step: requests that drew
partial_tokens, step = None, 0
while batch or step <= max(arrivals):
    for i, n in arrivals.get(step, []):
        request[batch.add(prompts[i], n, temperature=0.8, rng=np.random.default_rng(i))] = i
    if step == CANCEL[0]:
        handle = next(h for h, i in request.items() if i == CANCEL[1])
        partial_tokens = batch.tokens_of(handle)
        batch.cancel(handle)
    new = {h for h in batch.running if not any(request[h] in f for f in fed)}
    fed.append({request[h]: len(prompts[request[h]]) if h in new else 1 for h in batch.running})
    drawn.append([request[h] for h, _ in batch.step()])
    step += 1
finished = {i: batch.pop_tokens(h) for h, i in request.items() if i != CANCEL[1]}
solo = {i: gpt2np.generate(target, prompts[i], n, temperature=0.8, rng=np.random.default_rng(i))
        for ns in arrivals.values() for i, n in ns}
wrong = [i for i in finished if finished[i] != solo[i]]
assert not wrong and partial_tokens == solo[CANCEL[1]][:len(partial_tokens)], f"requests {wrong} differ from their solo runs"
print(f"{step} steps; every finished request equals its solo run, the cancelled one the first "
      f"{len(partial_tokens)} tokens of its solo run")
for i, tokens in sorted(finished.items()):
    print(f"request {i}: {lines[i].splitlines()[0]:<18} + {tokenizer.decode(tokens)!r}")

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
for t, rows in enumerate(fed):
    for i, n in rows.items():
        axes[0].barh(i, 1, left=t, color="tab:orange" if n > 1 else "tab:blue", edgecolor="white")
axes[0].scatter(CANCEL[0], CANCEL[1], marker="x", s=80, c="red", zorder=3, label="cancelled")
axes[0].set(ylabel="request", yticks=range(len(solo)), title="which request is in which step: "
            "orange its prefill (the whole prompt), blue one new token")
axes[0].invert_yaxis(); axes[0].legend(fontsize=8, loc="lower right")
axes[1].bar(np.arange(len(fed)) + 0.5, [sum(rows.values()) for rows in fed], width=0.9, color="grey")
axes[1].set(xlabel="step (one packed forward pass)", ylabel="rows in the pass")
for ax in axes:
    ax.grid(alpha=0.3, axis="x")
plt.tight_layout()

# %% [markdown]
# **Reading it.** 22 steps, one packed pass each. A step where requests join carries their whole
# prompts (89 rows at step 0, 69 at step 6); every other step one row per running request. Request 4
# was cancelled at step 14 after 8 tokens and left at once; every other request left the step after
# its last token, so nobody waits for the longest one. Each finished request drew exactly what it
# draws alone, with its own generator, whatever joined or left around it. A long prompt makes its
# step long for everyone in it; `ContinuousBatch(model, prefill_chunk=n)` feeds prompts *n* rows a
# step instead. The server runs this loop: `python -m gpt2np.serve --max_batch 8` (the default;
# `--max_batch 1` serves one request at a time).
#
# **Summary.** A CPU reads a model's weights once per pass whatever the rows, so while the weights
# come from memory, rows are nearly free: 8 rows of `wide` cost 1.65–1.9 one-row passes, 16 rows
# 2.8–3.2 (section 1's output), until OpenBLAS's packing sets in past 16. Batching turns that into
# tokens per second: about 2.8× at 8 sequences here (section 2), each sequence exactly its solo run. On
# the tiny bundled target, whose weights sit in the cache, rows as separate sequences are not free (16
# cost 3.5–4.7 one-row passes), mostly through
# each sequence's own attention beside a short pass. Speculative decoding spends the same cheap
# rows on drafts, so inside a batch the two compete: on the bundled pair drafting's 1.1–1.8× alone
# fell to about nothing (0.8–1.2×) from 8 sequences. The goodput rule, B·E(α, K) / (K d(B) + T(B(K + 1))) from
# the measured costs, explains the fall (*K** shrinks as *B* grows, and reaches 0 where the rows stop
# being cheap), and `K="auto"` makes that choice every round; where a round's work outside the
# passes is large, as here, the rule drafts more than pays. Continuous batching lets requests join
# and leave at every step.
#
# *References:* Yu et al. 2022, *Orca* (iteration-level scheduling, selective batching); Liu et al.
# 2024, *Optimizing Speculative Decoding for Serving LLMs Using Goodput* (SmartSpec); Kwon et al.
# 2023, *vLLM* (PagedAttention, continuous batching); Leviathan et al. 2023 (E(α, K)).
