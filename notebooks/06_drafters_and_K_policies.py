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
# # 06 · Drafters and K policies: prompt lookup, and K chosen from measurements
#
# Notebook 04 drafted with a second, smaller model. Two things limit that on a CPU: the draft's
# own cost *c* (a 124M draft reads 35 % of 355M's bytes, and decoding is memory-bound), and a
# fixed *K* that is right for one acceptance rate and wrong for the next. This notebook looks at
# the two levers:
#
# 1. **Prompt lookup** (`NgramDrafter`, `gpt2np/decoding/drafters.py`): no model at all. It proposes the
#    tokens that followed the most recent earlier occurrence of the context's last *n* tokens.
#    Its *q* is one-hot, so the kernel accepts a proposal *x* with probability *p(x)*, and
#    after a rejection samples *p* without *x*: exactly the target's distribution, at *c* ≈ 0.
# 2. **K policies** (`gpt2np/decoding/policies.py`): `heuristic` (Hugging Face's +2 / −1 schedule) and
#    `auto`, which before every round picks the *K* in 0..*K*max that maximises the refined
#    prediction (1 − α^{K+1}) / ((1 − α)(Kc + v(K+1))) from what the run has measured so far.

# %%
import os
import sys
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
from gpt2np.decoding.drafters import NgramDrafter
from gpt2np.decoding.policies import prior_v_curve
from gpt2np.decoding.theory import predicted_speedups
from gpt2np.report import colour_by_provenance
# colour in Jupyter and on a terminal; plain text into a pipe or a file, or under NO_COLOR
colour = "NO_COLOR" not in os.environ and ("ipykernel" in sys.modules or sys.stdout.isatty())

target, draft = explain.load_bundled_pair()
tokenizer = target.tokenizer
romeo = tokenizer.encode("ROMEO:\nWhat light through yonder window breaks?\n")
# A prompt whose continuation repeats earlier text: the Romeo lines, what the target itself writes
# after them, then the Romeo lines again (a chat history or a document being quoted looks like this).
prompt_ids = romeo + gpt2np.generate(target, romeo, 100, temperature=0) + romeo
print(f"prompt: {len(prompt_ids)} tokens (the target's context is {target.n_ctx})")

# %% [markdown]
# ## Prompt lookup, one proposal
#
# The drafter keeps an index from every *n*-gram of the context (*n* = 1..3) to the position just
# after its latest occurrence, updated with the tokens each round adds. A proposal is one
# dictionary lookup per *n*, longest first:

# %%
lookup = NgramDrafter(n_max=3)
lookup.reset(target)
drafts, q = lookup.propose(prompt_ids, 8, dict(temperature=0), rng=None)
suffix = tokenizer.decode(prompt_ids[-3:])
print(f"the context ends in {suffix!r}; the drafter proposes {tokenizer.decode(drafts)!r}")
print(f"q is one-hot: shape {q.shape}, row sums {q.sum(axis=1).tolist()}, q(x) = {q[0, drafts[0]]}")

# %% [markdown]
# ## Prompt lookup against the draft model, greedy
#
# Both runs must print exactly the target's own greedy text. Green: accepted drafts; red: the
# target's resample after a rejection; blue: the bonus token after *K* acceptances; uncoloured:
# a round with nothing to propose (a plain target step).

# %%
plain = gpt2np.generate(target, prompt_ids, 60, temperature=0)
for name, drafter in [("prompt lookup", NgramDrafter(n_max=3)), ("draft model", draft)]:
    result = gpt2np.speculative_generate(target, drafter, prompt_ids, 60, K=4, temperature=0, calibrate=True)
    s = result.stats
    print(f"--- {name}: alpha_hat {s.alpha_hat:.2f}, {s.tokens_per_target_call:.2f} tokens per target "
          f"call, c = {s.c:.3f}, identical to plain decoding: {result.tokens == plain}")
    print(colour_by_provenance(tokenizer, result.tokens, result.provenance, colour))

# %% [markdown]
# ### A smoothed q, for comparison
#
# `CountingNgramDrafter` keeps counts of what followed each *n*-gram and drafts *x ~ q* from the
# smoothed follower frequencies, (1 − ε)·count/total + ε/n_vocab. Its acceptance probability is
# Σ min(p, q) rather than p(x): a soft q hedges when the context was continued in several ways.

# %%
from gpt2np.decoding.drafters import CountingNgramDrafter

for drafter in [NgramDrafter(n_max=3), CountingNgramDrafter(n_max=3, eps=0.1)]:
    s = gpt2np.speculative_generate(target, drafter, prompt_ids, 60, K=4, temperature=1.0,
                                    rng=np.random.default_rng(0)).stats
    print(f"{drafter.name:<32} alpha_hat {s.alpha_hat:.2f}, {s.tokens_per_target_call:.2f} tokens per target call")

# %% [markdown]
# ## What theory says *K* should be
#
# The refined prediction for each *K* (0 = plain decoding, exactly 1×), at the cost curve *auto*
# assumes before it has measured anything, v(1) = 1 and v(M) = 1.3 + 0.08 (M − 2) from two tokens
# on: a one-token call is a matrix-vector product, two or more tokens take the slower small-M
# product path (355M on this CPU measures v(2) ≈ 1.4, v(5) ≈ 1.5). With a free drafter (c = 0)
# drafting pays from α ≈ 0.3; with a 124M draft for 355M (c ≈ 0.35) nothing pays below α ≈ 0.65,
# because the first draft already costs the jump to v(2) plus c. Below that `auto` chooses *K* = 0.
# `auto` does not plan with one α̂, though: it keeps a belief about α (a Beta distribution over every
# position examined so far), sizes *K* by the speedup averaged over that belief, and drafts at all
# only if drafting pays at an optimistic α (the belief's mean plus √(ln(t + 1)) standard deviations
# in round *t*). Plain rounds examine nothing, so after bad luck the belief stays put while *t*
# grows, and `auto` tries again: it cannot lock drafting out for the rest of a run.

# %%
K_max = 8
v = prior_v_curve(K_max + 1)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
for ax, c in zip(axes, [0.0, 0.35]):
    for a in [0.3, 0.6, 0.8, 0.95]:
        speedups = predicted_speedups(a, c, v, K_max)
        best = int(np.argmax(speedups))
        ax.plot(range(K_max + 1), speedups, marker="o", label=f"alpha {a}: auto picks K = {best}")
        ax.plot([best], [speedups[best]], "k*", markersize=12)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set(title=f"c = {c}", xlabel="K (0 = plain decoding)", ylabel="predicted speedup")
    ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# ## `auto` and `heuristic` against every fixed *K*, measured
#
# Each drafter at K = 1..8, then the two policies (greedy, 60 tokens, the fastest of 3 runs,
# interleaved with plain decoding so that a busy moment on a shared machine slows every run).
# The bars are measured speedups; the dots the refined prediction from each run's own α̂, c, v.
# On these tiny models Python overhead, not arithmetic, sets the speed: a verification call costs
# more one-token calls than on real GPT-2 sizes, the timings are noisy, and the speedups are
# modest and move from run to run, `auto`'s with them (it decides from timings taken during the
# run). `auto` is built for the memory-bound regime of real sizes: `python -m bench --sections
# policies` runs this sweep at 124M → 355M shapes (`--pair 124M,1558M --sizes 1558M`: gpt2 drafting
# for gpt2-xl), where PERFORMANCE.md reports it against every fixed *K*.

# %%
Ks = list(range(1, 9)) + ["heuristic", "auto"]
sweeps = {name: explain.speculative_sweep(target, drafter, prompt_ids, 60, Ks, temperature=0,
                                          repeats=explain.repeats(3))
          for name, drafter in [("prompt lookup", NgramDrafter(n_max=3)), ("draft model", draft)]}
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharey=True)
for ax, (name, sweep) in zip(axes, sweeps.items()):
    rows = sweep["rows"]
    x = np.arange(len(rows))
    ax.bar(x, [r["measured_speedup"] for r in rows], color=["C0"] * 8 + ["C1", "C2"])
    ax.plot(x, [r["stats"].predicted_speedup_refined or np.nan for r in rows], "k.", label="refined prediction")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xticks(x, [str(r["K"]) for r in rows], rotation=30)
    ax.set(title=name, ylabel="speedup over plain decoding")
    ax.legend(fontsize=8)
plt.tight_layout()
for name, sweep in sweeps.items():
    auto = sweep["rows"][-1]["stats"]
    best = sweep["rows"][int(np.argmax([r["measured_speedup"] for r in sweep["rows"][:8]]))]
    print(f"{name}: best fixed K = {best['K']} ({best['measured_speedup']:.2f}x); auto "
          f"{sweep['rows'][-1]['measured_speedup']:.2f}x using K {auto.K_counts} (K: rounds), alpha_hat "
          f"{auto.alpha_hat:.2f}")

# %% [markdown]
# ## Many coin seeds in a second: `auto` against a cost model
#
# One measured run is one sequence of coins; whether a policy locks itself out after an unlucky
# start shows only over many. `gpt2np.teach.policy_simulation` replaces the models by the cost
# model of Leviathan et al. with our measured v: a drafted token costs *c*, an *M*-token target
# call v(*M*), one-token calls; position *i* is accepted when its coin says so (probability α,
# the same coins for every policy). Here: a 124M draft for 1558M (*c* ≈ 0.09) with the verification
# curve measured at 1558M under the SkylakeX kernel, 100 tokens, 100 seeds. The negative control
# plans at the belief's mean without optimism: on unlucky seeds it stops drafting for good. `auto`
# is optimistic, but at a price: it tries drafting against its belief only where what it could gain
# at the optimistic α is three times what the belief expects a try to lose (a price that falls
# with every plain round it waits), its blind first round risks at most one one-token call beyond a
# plain step (`FIRST_ROUND_RISK`), and
# the draft model's own clock stands in for timing a plain step where the two agree.
# `python -m gpt2np.teach.policy_simulation` prints the whole table: every measured CPU and kernel
# (`MEASURED_V`), 40 and 100 tokens, α 0.3 to 1, model and lookup drafters at 355M and 1558M.
#
# The last box is a yardstick, not a policy a run can play: the Bayes-optimal policy
# (`BayesOptimalK`), told *c*, v and the run's length, with a uniform prior over five values of α
# (`BOUND_ALPHAS`). Each round it picks the *K* that minimises the expected cost of the rest of
# the run averaged over its posterior, counting what a round will teach it (dynamic programming
# over tokens left and positions accepted and rejected, solved once in a fraction of a second).
# Averaged over that prior no policy that must learn α does better. At one α, a fixed *K* chosen
# knowing that α can (the first box): the Bayes-optimal policy still pays for finding α out, and
# what `auto` pays beyond it is what its rules cost.

# %%
from gpt2np.teach.policy_simulation import (BOUND_ALPHAS, BayesOptimalK, GreedyAutoK, compare_policies, measured_v,
                                           simulate_policy)

v_1558 = measured_v("SkylakeX", "1558M")  # {M: v(M)}: 1.2 at two tokens, 1.42 at five, 1.7 at nine
seeds = range(100)
bayes = BayesOptimalK(BOUND_ALPHAS, [1.0] * len(BOUND_ALPHAS), 0.09, v_1558)  # one plan, for every alpha and seed
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), sharey=True)
for ax, a in zip(axes, [0.3, 0.6, 0.8]):
    runs = compare_policies(a, 0.09, v_1558, 100, seeds, policies=("auto", "heuristic"))
    greedy = [simulate_policy(GreedyAutoK(8), a, 0.09, v_1558, 100, s)["speedup"] for s in seeds]
    optimal = [simulate_policy(bayes, a, 0.09, v_1558, 100, s)["speedup"] for s in seeds]
    medians = {K: np.median(speedups) for K, speedups in runs["fixed"].items()}
    best = max(medians, key=medians.get)
    series = {f"fixed K = {best}": runs["fixed"][best], "auto": runs["auto"], "heuristic": runs["heuristic"],
              "no optimism": greedy, "Bayes-optimal": optimal}
    ax.boxplot(list(series.values()), showfliers=True)
    ax.set_xticks(range(1, 6), list(series), rotation=20)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set(title=f"alpha {a}", ylabel="speedup over plain (simulated)")
    print(f"alpha {a}: " + ", ".join(f"{k} median {np.median(x):.2f} worst {np.min(x):.2f}" for k, x in series.items()))
plt.tight_layout()

# %% [markdown]
# ## What `auto` does round by round
#
# The stream (`gpt2np.speculative_stream`) yields one event per round, so we can watch the policy:
# the K it asked for, and how many of the drafts were accepted.

# %%
stream = gpt2np.speculative_stream(target, NgramDrafter(n_max=3), prompt_ids, 60, K="auto", temperature=0)
events = list(stream)
fig, ax = plt.subplots(figsize=(10, 2.8))
ax.step(range(len(events)), [e.K for e in events], where="mid", label="K drafted")
ax.bar(range(len(events)), [sum(e.decisions) for e in events], alpha=0.4, color="C2", label="drafts accepted")
ax.set(xlabel="round", ylabel="tokens")
ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# ## Still exact
#
# Changing *K* between rounds keeps the output distribution exactly the target's, as long as
# each round's *K* depends only on earlier rounds: fix the past, and *K* is a constant, for which
# the kernel is exact. The test suite proves it by enumerating every random path on toy models
# (`tests/decoding/test_drafters_policies.py`, where a scripted clock makes `auto`'s timing-driven choices
# replay identically on every path); here is the same check for prompt lookup with `heuristic`,
# at temperature 1 on a 3-token toy vocabulary.

# %%
from gpt2np.teach.classroom import toy_pair
from gpt2np.teach.exact import max_abs_difference

toy_target, _ = toy_pair(n_vocab=3, order=2, model_seed=16)
toy_prompt = [0, 1, 0]
exact_target = explain.exact_target_distribution(toy_target, toy_prompt, 3)
exact_lookup = explain.exact_speculative_distribution(toy_target, NgramDrafter(n_max=2), toy_prompt, 3, "heuristic")
print(f"{len(exact_target)} outcomes; largest |P_speculative - P_target| = "
      f"{max_abs_difference(exact_lookup, exact_target):.1e}")
