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
# # 07 · Why verifying K tokens can cost as much as K+1 passes, and how gpt2np cuts it, per BLAS kernel
#
# Speculative decoding (notebook 04) checks *K* draft tokens with **one** forward pass of the target
# over *M* = *K* + 1 rows. Leviathan et al.'s Thm 3.8 assumes that pass costs as much as a one-row
# pass. Let *v*(*M*) be what it really costs, in one-row passes. Then the speedup is
#
# $$\text{speedup} = \frac{1 - \alpha^{K+1}}{(1 - \alpha)\,(K c + v(K+1))}$$
#
# (`gpt2np/decoding/theory.py`), with α the acceptance rate and *c* the draft's cost per token relative to
# the target. On a GPU *v* ≈ 1. On a CPU it depends on how the BLAS library multiplies a few rows
# by a weight matrix, and the code BLAS runs for that depends on the CPU. Most of a pass's time is
# products `x @ w`, so this notebook measures one of them, [*M*, 1024] × [1024, 4096] in float32 (the
# MLP's first product in GPT-2 355M, 16 MiB of weights):
#
# 1. what one row and *M* rows cost, in this process;
# 2. the same under every OpenBLAS kernel this CPU can run, each in its own process;
# 3. why: reading weights from memory and from cache, and what copying them costs;
# 4. what the measured *v* does to the predicted speedup.
#
# Everything runs on **one core** (one BLAS thread). The machine that made these outputs has 2 cores
# and shares them with other work, so its timings are noisy: they move by 10–30 % from run to run.
# The **ratios**, each taken inside one process and one repeat, are what count. The measuring code is
# in `gpt2np/teach/blas_curves.py`; gpt2np's products are in `gpt2np/model/fast/matmul.py`.

# %%
import os
import sys
from pathlib import Path

# Import gpt2np from this clone of the repository (the folder above notebooks/), and before
# NumPy: it sets OpenBLAS's thread timeout, which OpenBLAS reads only when NumPy loads it.
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "gpt2np" / "__init__.py").is_file())
sys.path.insert(0, str(ROOT))
import gpt2np
from gpt2np.teach import blas_curves, explain
from threadpoolctl import threadpool_limits

# One BLAS thread: on a 2-core machine shared with another job, 2-thread OpenBLAS products slow down
# several-fold whenever the other job takes a core, and the curves would measure that job.
threadpool_limits(1)

# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

flags = blas_curves.cpu_flags()
print("NumPy's BLAS:", gpt2np.blas_kernel())
print(f"CPU: AVX2 {'yes' if 'avx2' in flags else 'no'}, AVX-512 {'yes' if 'avx512f' in flags else 'no'}; "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")

# %% [markdown]
# ## 1 · One row streams, *M* rows pack
#
# **One row** times a weight matrix is a matrix-vector product (BLAS's *gemv*). It reads each weight
# once, in the order the weights lie in memory, and does 2 flops per 4-byte weight. That is too
# little arithmetic to keep the core busy, so the time is set by how fast memory delivers 16 MiB.
#
# **Several rows** go to the general matrix product, *sgemm*. OpenBLAS's sgemm is built for big
# products. It first copies ("packs") the weights into the tile layout of its micro-kernel, then runs
# the micro-kernel over the copy. On both x86 kernels measured below that micro-kernel is 16 × 4
# (OpenBLAS's `kernel/x86_64/KERNEL.HASWELL` and `KERNEL.SKYLAKEX`): it takes 4 of our rows at a
# time, and leftover rows need another pass with narrower code. For a few
# rows, the copy and the passes cost far more than the arithmetic.
#
# We time each product on a stack of 6 distinct weight matrices (96 MiB, three times this CPU's
# 32 MiB L3 cache), taken in turn, so that every product reads its weights from memory, as a forward
# pass does. Two products:
#
# * **plain**: `x @ w` with `w` row-major (NumPy's default layout);
# * **gpt2np**: `gpt2np.model.fast.matmul.matmul(x, w)` with `w` column-major (each output's weights
#   contiguous, as gpt2np stores GPT-2's). It picks a method for each OpenBLAS kernel from the table
#   `METHODS` in `gpt2np/model/fast/matmul.py`.
#
# Each curve is t(*M*) / t(1) against its own one-row product. Within each repeat the two products
# alternate at every *M*, and the ratio is taken inside the repeat; we report the median over 7 repeats.

# %%
here = blas_curves.product_curve(max_m=12, repeats=explain.repeats(7), threads=1)
shape_text = f"[M, {here['shape'][0]}] x {here['shape']}"
print(f"{here['blas']}\n{shape_text}, {here['n_weights']} weights cycled\n")
print(f"{'M':>2} {'plain ms':>9} {'t(M)/t(1)':>9} {'gpt2np ms':>10} {'t(M)/t(1)':>9}")
for i, m in enumerate(here["m"]):
    print(f"{m:>2} {1e3 * here['seconds']['plain'][i]:9.2f} {here['ratio']['plain'][i]:9.2f} "
          f"{1e3 * here['seconds']['gpt2np'][i]:10.2f} {here['ratio']['gpt2np'][i]:9.2f}")
weight_bytes = 4 * here["shape"][0] * here["shape"][1]
print(f"\none row reads the weights at {weight_bytes / here['seconds']['plain'][0] / 1e9:.1f} GB/s (plain, row-major) "
      f"and {weight_bytes / here['seconds']['gpt2np'][0] / 1e9:.1f} GB/s (column-major)")

# %%
plt.figure(figsize=(7, 4))
plt.plot(here["m"], here["ratio"]["plain"], "o-", label="plain x @ w (row-major w)")
plt.plot(here["m"], here["ratio"]["gpt2np"], "s-", label="gpt2np matmul (column-major w)")
plt.plot(here["m"], here["m"], ":", c="gray", label="M separate one-row products")
plt.axhline(1, c="gray", lw=0.8)
plt.ylim(0, 1.15 * max(here["ratio"]["plain"] + here["ratio"]["gpt2np"]))
plt.xticks(here["m"]); plt.grid(alpha=0.3); plt.legend(fontsize=8, loc="lower right")
plt.xlabel("M (rows: K + 1 when verifying K drafts)"); plt.ylabel("t(M) / t(1)")
plt.title(f"OpenBLAS {here['kernel']} (this process), 1 thread: {shape_text}", fontsize=10);

# %% [markdown]
# **Reading it.** In the run shown here (OpenBLAS's SkylakeX kernel, this CPU's own), one row read
# the weights at 25 GB/s (row-major) and 19 GB/s (column-major). Plain `x @ w` cost 3.4–4.3 one-row
# products from *M* = 2 to 8: five rows cost as much as 3.8 passes over the weights. Multiples of 4
# are cheaper than their neighbours (*M* = 3, 4, 5: 3.70, 3.37, 3.77; *M* = 7, 8, 9: 4.26, 3.79,
# 4.23): that is the micro-kernel taking rows 4 at a time. gpt2np's product cost 1.1–1.8 one-row
# products over the same range (1.51 at *M* = 5). It never packs: for this kernel gpt2np cuts `w`
# into pieces small enough for OpenBLAS's small-matrix kernel, which reads the operands where they
# lie. That kernel also takes rows 4 at a time, so *M* = 4 (1.09) is cheaper than *M* = 3 (1.49).
#
# Each curve is relative to its own one-row product, and row-major `w` is read faster than
# column-major here. A model's one-token pass uses the same layout as its verification pass, so its
# own t(1) is the right denominator for *v*.

# %% [markdown]
# ## 2 · Every OpenBLAS kernel this CPU can run
#
# OpenBLAS ships code for many CPUs and picks one kernel when NumPy loads it. CPUs with AVX-512
# get **SkylakeX**, whose small-matrix path skips packing for small products. Every other x86 CPU,
# AMD's Zen included, gets **Haswell**, whose sgemm always packs (older x86 CPUs without AVX2 get
# **Sandybridge** or **Nehalem**, which pack too and take Haswell's way round it; an OpenBLAS built
# with every target may call an AVX-512 CPU **Cooperlake** or **SapphireRapids**, SkylakeX's kernels
# under another name: PERFORMANCE.md, "Every CPU"). Setting `OPENBLAS_CORETYPE=Haswell`
# (with `OPENBLAS_L2_SIZE=512`) forces the Haswell kernel on a newer CPU. OpenBLAS reads these
# variables only once, when NumPy loads it, so each kernel is measured in its own child process:
#
# * the CPU's own kernel: both variables removed from the child's environment (a CI machine may
#   set them);
# * Haswell: both variables set, where `/proc/cpuinfo` lists `avx2`.
#
# A child that ends up with a kernel already measured is dropped. gpt2np never sets these variables
# for itself; this notebook sets them only for the child processes it starts.

# %%
envs = blas_curves.blas_kernel_envs()
for name, env in envs.items():
    print(f"{name:>9}: OPENBLAS_CORETYPE={env.get('OPENBLAS_CORETYPE', '(unset)')}, "
          f"OPENBLAS_L2_SIZE={env.get('OPENBLAS_L2_SIZE', '(unset)')}")
curves = {name: blas_curves.product_curve_in_child(env, max_m=12, repeats=explain.repeats(7), threads=1)
          for name, env in envs.items()}
print()
for curve in curves.values():
    print(curve["blas"])
print(f"\n{'':>2} " + " ".join(f"{name + ' plain':>15} {name + ' gpt2np':>15}" for name in curves))
for i, m in enumerate(here["m"]):
    print(f"{m:>2} " + " ".join(f"{c['ratio']['plain'][i]:15.2f} {c['ratio']['gpt2np'][i]:15.2f}"
                                for c in curves.values()))

# %%
fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), sharey=True, squeeze=False)
top = 1.15 * max(max(c["ratio"]["plain"] + c["ratio"]["gpt2np"]) for c in curves.values())
for ax, (name, curve) in zip(axes[0], curves.items()):
    ax.plot(curve["m"], curve["ratio"]["plain"], "o-", label="plain x @ w (row-major w)")
    ax.plot(curve["m"], curve["ratio"]["gpt2np"], "s-", label="gpt2np matmul (column-major w)")
    ax.plot(curve["m"], curve["m"], ":", c="gray", label="M separate one-row products")
    ax.axhline(1, c="gray", lw=0.8)
    ax.set(xlabel="M (rows)", ylim=(0, top), xticks=curve["m"],
           title=f"OpenBLAS {name} kernel (child process), 1 thread\n{shape_text}")
    ax.grid(alpha=0.3); ax.legend(fontsize=8, loc="lower right")
axes[0][0].set_ylabel("t(M) / t(1)")
plt.tight_layout()

# %% [markdown]
# **Reading it.** Same product, same machine, two kernels. In this run:
#
# * **SkylakeX** (the CPU's own): plain `x @ w` cost 3.1–4.0 one-row products from *M* = 2 to 8, and
#   gpt2np's small-kernel pieces 1.1–1.7.
# * **Haswell**: plain `x @ w` cost 2.0–3.4, with the same dips at *M* = 4 (2.01) and 8 (2.41). There
#   is no small-matrix kernel here. gpt2np's method is "rows": it cuts `w` into blocks of 512 KB and
#   multiplies each block by the *M* rows one at a time, *M* gemv calls per block. The first call
#   reads the block from memory, the other *M* − 1 from the core's cache. That cost 1.35 at *M* = 2,
#   2.05 at *M* = 5 and 2.38 at *M* = 7. The table sends *M* = 8 to `x @ w` on the column-major `w`,
#   which cost 3.02, more than the plain curve's 2.41 on a row-major `w`.
#
# So the kernel matters twice. It sets how bad plain `x @ w` is, and it decides which trick works:
# pieces need SkylakeX's small-matrix kernel, while rows need only gemv, which every BLAS has. The
# SkylakeX curves of section 1 and of its child process are the same experiment run twice (plain
# *M* = 2: 3.35 and 3.10). The gap between them shows how much a busy neighbour moves the numbers.

# %% [markdown]
# ## 3 · Why streaming is cheap and packing is not
#
# Two measurements on one core explain the curves. gemv reads 512 KB blocks of weights (the size
# "rows" uses): first a different block each call, 96 MiB in all, so every read comes from memory;
# then the same block again and again, so it comes from the core's L2 cache (1 MiB a core on this EPYC). Third, we copy the
# whole 96 MiB once with `np.copyto`: a copy reads and writes every weight, and packing is at least a
# copy.

# %%
rates = blas_curves.gemv_rates()
print(f"gemv, each 512 KB block once (from memory):   {rates['memory_gbps']:6.1f} GB/s")
print(f"gemv, one 512 KB block again (from cache):    {rates['cache_gbps']:6.1f} GB/s")
print(f"copying the weights (a read and a write):     {rates['copy_gbps']:6.1f} GB/s of weights")
print(f"\ncopying the weights once costs {rates['memory_gbps'] / rates['copy_gbps']:.2f} one-row products; "
      f"a row read from cache costs {rates['memory_gbps'] / rates['cache_gbps']:.2f} of one from memory")
estimate = [blas_curves.rows_ratio(m, rates["memory_gbps"], rates["cache_gbps"]) for m in here["m"]]
print("rows with no overhead, 1 + (M - 1) x memory / cache, M = 1..12:", " ".join(f"{e:.2f}" for e in estimate))

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1, 1.6]})
axes[0].bar(["gemv\nfrom memory", "gemv\nfrom cache", "copy\n(packing's floor)"],
            [rates["memory_gbps"], rates["cache_gbps"], rates["copy_gbps"]], color=["tab:blue", "tab:green", "tab:red"])
axes[0].set(ylabel="GB/s of weights", title=f"one core, OpenBLAS {here['kernel']} (this process)")
axes[1].plot(here["m"], estimate, "k--", label="rows with no overhead: 1 + (M - 1) x memory / cache")
for i, (name, curve) in enumerate(curves.items()):
    axes[1].plot(curve["m"], curve["ratio"]["gpt2np"], "s-", c=f"C{i}", label=f"{name}: gpt2np matmul")
    axes[1].plot(curve["m"], curve["ratio"]["plain"], "o:", c=f"C{i}", alpha=0.6, label=f"{name}: plain x @ w")
axes[1].axhline(1, c="gray", lw=0.8)
axes[1].set(xlabel="M (rows)", ylabel="t(M) / t(1)", xticks=here["m"], ylim=(0, None),
            title="section 2's curves (child processes) against that estimate")
for ax in axes:
    ax.grid(alpha=0.3)
axes[1].legend(fontsize=7)
plt.tight_layout()

# %% [markdown]
# **Reading it.** In this run one core read weights from memory at 18.6 GB/s and from its cache at
# 89.3 GB/s, 4.8 times faster. That is the whole idea of "rows": the first row pays for memory, and
# each further row costs only 0.21 of it. Reading every block once from memory and *M* − 1 times
# from cache, with nothing else, would cost 1.21 at *M* = 2 and 1.83 at *M* = 5 (dashed line).
# Haswell's rows curve lies a little above that (1.35 and 2.05): each gemv call costs some Python and
# NumPy overhead, and a block's reads from cache are not entirely free. SkylakeX's pieces lie below
# it (1.48 at *M* = 5). Its small-matrix kernel reads a weight from memory once and uses it for
# 4 rows while it is still in a register, so only the fifth row onwards reads from cache.
#
# Packing works the other way round. Copying the weights alone ran at 11.4 GB/s, so one copy costs
# 1.63 one-row products before the micro-kernel has done any arithmetic. Then the micro-kernel runs
# over the packed copy once per group of 4 rows, plus once for each leftover group. That is why plain
# `x @ w` starts at 2.3–3.4 one-row products and climbs in steps of 4.

# %% [markdown]
# ## 4 · What *v* does to the speedup
#
# Put each measured curve into the formula as *v*(*K* + 1), with α = 0.8 and *c* = 0.1 (a drafter
# whose proposals the target accepts 80 % of the time, costing a tenth of a target pass per token).
# *v* = 1 is Thm 3.8. A caveat: these are product-level ratios. A whole pass also does attention,
# layer norms and Python bookkeeping, so its *v* differs (`python -m bench --sections verify`
# measures real passes). The product is most of the pass, though, and it moves *v* the same way.

# %%
alpha, c = 0.8, 0.1
Ks = list(range(1, len(here["m"])))
v_curves = {"Thm 3.8 (v = 1)": [1.0] * len(here["m"]),
            **{f"{name}: {product}": curve["ratio"][product] for name, curve in curves.items()
               for product in ("plain", "gpt2np")}}
speedups = {label: blas_curves.refined_speedups(v, alpha, c) for label, v in v_curves.items()}
print(f"alpha = {alpha}, c = {c}\n")
print(f"{'v from':>18} {'v(5)':>5} {'speedup at K = 4':>17} {'best K':>6} {'its speedup':>11}")
for label, s in speedups.items():
    print(f"{label:>18} {v_curves[label][4]:5.2f} {s[3]:16.2f}x {Ks[int(np.argmax(s))]:6} {max(s):10.2f}x")

# %%
plt.figure(figsize=(10, 4.5))
plt.plot(Ks, speedups["Thm 3.8 (v = 1)"], "k-", lw=2, label="Thm 3.8 (v = 1)")
for i, name in enumerate(curves):
    plt.plot(Ks, speedups[f"{name}: plain"], "o:", c=f"C{i}", label=f"{name}: v of plain x @ w")
    plt.plot(Ks, speedups[f"{name}: gpt2np"], "s-", c=f"C{i}", label=f"{name}: v of gpt2np matmul")
plt.axhline(1, c="gray", lw=0.8)
plt.xticks(Ks); plt.grid(alpha=0.3); plt.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
plt.xlabel("K (draft tokens per round)"); plt.ylabel("predicted speedup over target-only")
plt.title(f"alpha = {alpha}, c = {c}, v from {shape_text} per OpenBLAS kernel (" + ", ".join(curves) + ")",
          fontsize=9)
plt.tight_layout()

# %% [markdown]
# **Reading it.** With *v* = 1 (Thm 3.8), *K* = 4 would give 2.40×. In this run:
#
# * SkylakeX's plain `x @ w` has *v*(5) = 3.60, and the prediction at *K* = 4 is 0.84×. Speculative
#   decoding would be slower than decoding alone, and no *K* does better than break even (1.00× at
#   *K* = 7).
# * Haswell's plain curve has *v*(5) = 2.67, giving 1.09× at *K* = 4. Its best is 1.34× at *K* = 7,
#   which only rides the cheap *M* = 8 of the sawtooth.
# * gpt2np's products bring *v*(5) down to 1.48 (SkylakeX) and 2.05 (Haswell). The same drafter then
#   gives 1.78× and 1.37× at *K* = 4, and 2.11× on SkylakeX at *K* = 3, where *M* = 4 is cheap.
#
# In the formula's terms, a round at *K* = 4 emits (1 − α⁵)/(1 − α) = 3.36 tokens on average and
# costs *Kc* + *v* = 0.4 + *v* target passes. With *v* ≈ 3–3.6, those tokens cost about as much as
# decoding them one by one. With *v* ≈ 1.5–2 they cost 55–70 % of that.
#
# **Summary.** Verifying *K* drafts is one pass, but on a CPU that pass is only as cheap as its
# few-row products. A one-row product streams the weights at memory speed. OpenBLAS's sgemm first
# copies them and then runs its micro-kernel over the copy, 4 rows at a time. So 2–8 rows cost 2.0–4.3
# one-row products here, and how many depends on the kernel OpenBLAS picked for the CPU. gpt2np skips
# the copy. On SkylakeX it uses the small-matrix kernel in pieces; on Haswell, one gemv per row over
# cache-sized blocks. That brings *v*(5) to about 1.5–2, which is the difference between speculative
# decoding losing and winning (and under SkylakeX, with the weights stored for that kernel, to about
# 1.25: section 5).

# %% [markdown]
# ## 5 · A faster form of the small-matrix kernel, and the weights stored for it
#
# Not measured in this notebook (its curves above multiply column-major weights); the figures are from
# PERFORMANCE.md ("Panels"), on AMD EPYCs under SkylakeX, 2026-11-27 and 28.
#
# SkylakeX's small-matrix kernel comes in forms, one per layout of the operands. gpt2np's pieces
# give it a column-major `w`, so every output is a dot product along *k* (OpenBLAS's "TN" form). A
# row-major `w` takes the "NN" form: each entry of `x` times a whole row of weights, added into the
# outputs. If `w` is stored as contiguous blocks of columns ("panels": an array [*n* / 64, *k*, 64]),
# one core multiplied 2, 5 and 8 rows by 24 such weights of [1024, 4096] in 0.94, 1.14 and 1.21
# one-row products, where pieces take 1.9–2.1 at 8 rows. The same blocks cut out of an ordinary
# row-major `w` (rows of 256 bytes, 16 KB apart) cost 2.7: the layout in memory, not the kernel,
# made the difference.
#
# A layout serves every *M*, though, and one row is where it first lost: all of 355M's weights, one
# row through panels of 64, 1.15–1.29 of gemv, and a packed decode step of one sequence 1.14–1.19 of
# the same step on column-major weights. Decoding one row at a time is the baseline every speedup
# here is measured against, so panels stayed out. A day later, on another CPU, the one row was taken
# apart: panels of 32 columns cost 1.02 of gemv, and a whole one-row pass still 1.08, because NumPy
# hands a [1, *k*] @ [*k*, 32] product to gemv, which reads a narrow panel slower than the
# small-matrix kernel does. Padding the row with a zero row (two rows for one) sends it to the kernel:
# a one-row pass then cost 0.99–1.01 of the column-major one (80 alternated pairs), and 355M's
# *v*(2 / 5 / 8) came to 0.96 / 1.28 / 1.31 of it, against 1.32 / 1.52 / 1.85 for pieces. Since then,
# under SkylakeX, a loaded model's weights are cut into panels (`gpt2np.weights_order(model)` says
# "panels"; `matmul.by_panels`), and 124M drafting for 1558M at α = 0.8, *K* = 5 went from 1.24× to
# 1.48× plain decoding. Under Haswell there is no small-matrix kernel: every panel's product packs,
# and one token costs 1.8× as much, so the weights stay column-major there. The price under SkylakeX
# is the long prompt: past 16 rows each panel is one sgemm, which packs `x` again for every panel, and
# a prefill of 256–512 rows costs up to a third more.
#
# The lesson is the same as in sections 1–4: time the whole workload, one row and *M* rows, on the
# kernel that runs, before adopting a trick that makes one product faster; and when the whole workload
# says no, take the loss apart before giving the trick up.
