"""The slow reference path (gpt2np.model.reference: no cache, one head at a time) against the fast path.

The task: greedy decoding of reference_new tokens after a prompt_len-token prompt, which is what a
picoGPT-style implementation does (every step recomputes the whole sequence, and the output
head runs on every position). The fast path is gpt2np.generate with its KV cache.

The reference needs about a second per step at 124M, so by default it generates only
reference_tokens tokens; one more call at the last step's length (prompt_len + reference_new - 1)
pins the other end, and the total for reference_new steps is extrapolated with a straight line
through (sequence length, seconds) of all measured calls (a step's cost grows about linearly with
the sequence at these lengths). `extrapolated` says whether that happened; pass
`--reference-tokens 64` to measure every step instead (about a minute more at 124M).
"""
import time

import numpy as np

from gpt2np.decoding.autoregressive import generate
from gpt2np.model.reference import gpt2_reference

from .common import log, print_table, random_ids, seconds


def reference_greedy(model, prompt, n_tokens):
    """Greedy decoding through gpt2_reference; returns tokens and [(sequence length, seconds)]."""
    ids, steps = list(prompt), []
    for _ in range(n_tokens):
        start = time.perf_counter()
        logits = gpt2_reference(ids, model.params, model.config)  # [n_seq, n_vocab]
        steps.append((len(ids), time.perf_counter() - start))
        ids.append(int(np.argmax(logits[-1])))
    return ids[len(prompt):], steps


def extrapolate(steps, lengths):
    """Sum over `lengths` of a straight line fitted to steps [(length, seconds)]."""
    x, y = np.array(steps, dtype=np.float64).T
    slope, intercept = np.polyfit(x, y, 1) if len(set(x)) > 1 else (0.0, float(np.mean(y)))
    return float(sum(intercept + slope * n for n in lengths))


def run(model, size, plan):
    prompt = random_ids(plan.prompt_len, model.n_vocab, seed=4)
    n_new, n_ref = plan.reference_new, min(plan.reference_tokens, plan.reference_new)
    log(f"reference: fast path, {n_new} tokens after {len(prompt)} at {size}")
    generate(model, prompt, 2, temperature=0)  # warm-up
    fast_times, fast_tokens = [], None
    for _ in range(max(plan.repeats // 2, 1)):
        start = time.perf_counter()
        fast_tokens = generate(model, prompt, n_new, temperature=0)
        fast_times.append(time.perf_counter() - start)
    fast = float(np.median(fast_times))
    log(f"reference: slow path, {n_ref} of {n_new} tokens")
    ref_tokens, steps = reference_greedy(model, prompt, n_ref)
    lengths = [len(prompt) + i for i in range(n_new)]
    extrapolated = n_ref < n_new
    if extrapolated:  # pin the far end of the line: one call at the last step's length
        last = random_ids(lengths[-1], model.n_vocab, seed=5)
        steps.append((lengths[-1], seconds(lambda: gpt2_reference(last, model.params, model.config))))
        ref_total = extrapolate(steps, lengths)
    else:
        ref_total = sum(s for _, s in steps)
    result = {"size": size, "prompt_len": len(prompt), "n_new": n_new, "reference_tokens_measured": n_ref,
              "extrapolated": extrapolated, "reference_steps": [[n, s] for n, s in steps],
              "reference_seconds": ref_total, "fast_seconds": fast, "speedup_vs_reference": ref_total / fast,
              "tokens_match": ref_tokens == fast_tokens[:n_ref]}
    print_report(result)
    return result


def print_report(r):
    how = (f"{r['reference_tokens_measured']} steps measured + 1 at the last length, extrapolated linearly"
           if r["extrapolated"] else "every step measured")
    print_table(f"Slow reference vs fast path at {r['size']}: {r['n_new']} new tokens after {r['prompt_len']}",
                ["reference s", "fast s", "fast speedup", "same tokens"],
                [[r["reference_seconds"], r["fast_seconds"], r["speedup_vs_reference"], r["tokens_match"]]],
                note=f"reference: {how}")
