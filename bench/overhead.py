"""Python overhead: what a forward call and a speculative round cost beyond their arithmetic.

1. Per-call overhead of the forward pass. Models with GPT-2's structure but n_embd = 64 and a
   64-token vocabulary do almost no arithmetic, so a one-token forward with 128 tokens cached
   costs nearly pure interpreter and NumPy dispatch time. Timing them at several n_layer and
   fitting overhead = fixed + per_layer * n_layer (after subtracting their FLOP time at the
   measured GEMM rate, a few microseconds) estimates the overhead inside every decode step
   of a real size: fixed + per_layer * L.
2. The bundled tiny trained pair (gpt2np.bundled_models()), where this overhead dominates: ms
   per forward call beyond the FLOP time, and, for plain and speculative decoding, ms per
   token of work outside the forward calls (sampling, the verification kernel, bookkeeping).
   Skipped with a note when the package has no bundled pair yet.
3. Thread hand-off. gpt2np.model.fast.matmul shares a few-row product between this thread and helper
   threads, which sleep between products: the median time from handing a helper a no-op until it
   runs, after idle gaps like those between two products of a forward pass. Times the number of
   shared products in a forward pass (4 per layer and the head), it estimates what hand-offs add
   to a verification pass.
"""
import time

import numpy as np

import gpt2np
from gpt2np.model.config import GPT2Config
from gpt2np.decoding.speculative import speculative_generate

from .common import fmt, forward_flops, log, median, ms, print_table, random_ids, seconds
from .spec import TimedProxy

PROMPT_TEXT = "ROMEO:\nWhat light through yonder window breaks?\n"


def time_call(model, context, calls, repeats):
    """Median seconds of one one-token forward with `context` tokens cached (batches of `calls`)."""
    cache = model.new_cache()
    model.forward(random_ids(context, model.n_vocab), cache)
    token = [1]

    def batch():
        for _ in range(calls):
            model.forward(token, cache, n_logits=1)
            cache.truncate(context)

    batch()
    return median([seconds(batch) / calls for _ in range(repeats)])


def per_call_overhead(plan, gemm_gflops, calls):
    context = 128 if not plan.tiny else 8
    points = []
    for n_layer in plan.overhead_layers:
        config = GPT2Config(n_vocab=64, n_ctx=2 * context, n_embd=64, n_head=16, n_layer=n_layer)
        model = gpt2np.random_model(config, seed=0, tokenizer=None)
        t = time_call(model, context, calls, max(plan.repeats, 3))
        flop_s = forward_flops(config, 1, context) / (gemm_gflops * 1e9)
        points.append({"n_layer": n_layer, "seconds": t, "flop_seconds": flop_s, "overhead_s": t - flop_s})
    x = np.array([p["n_layer"] for p in points], dtype=np.float64)
    y = np.array([p["overhead_s"] for p in points])
    per_layer, fixed = np.polyfit(x, y, 1)
    estimates = {size: fixed + per_layer * plan.config(size).n_layer for size in plan.sizes}
    return {"context": context, "points": points, "fixed_s": float(fixed), "per_layer_s": float(per_layer),
            "estimated_s_per_call": {k: float(v) for k, v in estimates.items()}}


def handoff_latency(repeats):
    """{idle gap in s: median s from submit to the helper running}, for gaps of 0, 0.2 and 2 ms."""
    from gpt2np.model.fast.matmul import helpers
    out = {}
    for gap in (0.0, 2e-4, 2e-3):
        latencies = []
        for _ in range(repeats):
            idle_until = time.perf_counter() + gap
            while time.perf_counter() < idle_until:  # busy, as the caller is between two products
                pass
            start = time.perf_counter()
            latencies.append(helpers(1)[0].submit(time.perf_counter).result() - start)
        out[str(gap)] = median(latencies)
    return out


def bundled_pair():
    """(target, draft) names: the bundled models with the most and fewest parameters, or None."""
    names = gpt2np.bundled_models()
    if len(names) < 2:
        return None
    models = {name: gpt2np.load_model(name) for name in names}
    by_size = sorted(names, key=lambda n: models[n].config.n_params())
    return models[by_size[-1]], models[by_size[0]]


def loop_overhead(model_calls_seconds, wall, n_tokens):
    return (wall - model_calls_seconds) / n_tokens


def measure_bundled(target, draft, plan, gemm_gflops):
    n_ctx = min(target.n_ctx, draft.n_ctx)
    n_tokens, n_prompt = min(64, n_ctx // 2), min(16, n_ctx // 4)
    tokenizer = getattr(target, "tokenizer", None)
    prompt = (tokenizer.encode(PROMPT_TEXT)[:n_prompt] if tokenizer is not None
              else random_ids(n_prompt, target.n_vocab, seed=6))  # text gives the pair a realistic alpha
    out = {"target": target.name, "draft": draft.name, "n_tokens": n_tokens, "K": plan.K, "models": {}}
    for role, model in (("target", target), ("draft", draft)):
        t = time_call(model, len(prompt), 50, max(plan.repeats, 3))
        flop_s = forward_flops(model.config, 1, len(prompt)) / (gemm_gflops * 1e9)
        out["models"][role] = {"n_params": model.config.n_params(), "s_per_call": t, "flop_seconds": flop_s,
                               "overhead_s_per_call": t - flop_s}
    runs = {"plain": [], "speculative": []}
    for _ in range(max(plan.repeats, 3)):
        proxy = TimedProxy(target)
        start = time.perf_counter()
        gpt2np.generate(proxy, prompt, n_tokens, temperature=0)
        wall = time.perf_counter() - start
        runs["plain"].append((wall / n_tokens, loop_overhead(sum(s for _, s in proxy.calls), wall, n_tokens)))
        start = time.perf_counter()
        res = speculative_generate(target, draft, prompt, n_tokens, plan.K, temperature=0, calibrate=True)
        wall = time.perf_counter() - start
        st = res.stats
        forward_s = st.target_seconds + st.draft_seconds + st.calibration_seconds
        runs["speculative"].append((wall / len(res.tokens), loop_overhead(forward_s, wall, len(res.tokens)),
                                    st.alpha_hat, st.c, st.v, st.predicted_speedup, st.predicted_speedup_refined))
    for name, rs in runs.items():
        out[name] = {"s_per_token": median([r[0] for r in rs]), "loop_overhead_s_per_token": median([r[1] for r in rs])}
    out["speculative"]["alpha_hat"] = runs["speculative"][0][2]
    for i, key in enumerate(("c", "v", "predicted_thm38", "predicted_refined"), start=3):
        out["speculative"][key] = median([r[i] for r in runs["speculative"]])  # speculative_generate's own
    out["speculative"]["speedup"] = out["plain"]["s_per_token"] / out["speculative"]["s_per_token"]
    return out


def run(plan, gemm_gflops, decode_s=None):
    log("overhead: per-call Python overhead on near-zero-FLOP models")
    calls = 200 if not plan.tiny else 20
    result = {"per_call": per_call_overhead(plan, gemm_gflops, calls)}
    if decode_s:
        result["per_call"]["fraction_of_decode"] = {
            size: result["per_call"]["estimated_s_per_call"][size] / s for size, s in decode_s.items()
            if size in result["per_call"]["estimated_s_per_call"]}
    latency = handoff_latency(50 if plan.tiny else 300)
    products = {size: 4 * plan.config(size).n_layer + 1 for size in plan.sizes}
    result["handoff"] = {"latency_s": latency, "products_per_forward": products}
    if decode_s:
        result["handoff"]["estimated_fraction_of_decode"] = {
            size: products[size] * latency["0.0002"] / s for size, s in decode_s.items()}
    pair = bundled_pair()
    if pair is None:
        result["bundled"] = {"skipped": "gpt2np.bundled_models() has no draft/target pair yet"}
    else:
        log(f"overhead: bundled pair {pair[1].name} -> {pair[0].name}")
        result["bundled"] = measure_bundled(*pair, plan, gemm_gflops)
    print_report(result)
    return result


def print_report(r):
    pc = r["per_call"]
    frac = pc.get("fraction_of_decode", {})
    rows = [[size, ms(s), 100 * frac[size] if size in frac else None]
            for size, s in pc["estimated_s_per_call"].items()]
    points = ", ".join(f"L={p['n_layer']}: {ms(p['seconds']):.3f} ms" for p in pc["points"])
    print_table("Python overhead per forward call (fit on near-zero-FLOP models)",
                ["size", "overhead ms/call", "% of decode"], rows,
                note=f"overhead = {ms(pc['fixed_s']):.3f} ms + {ms(pc['per_layer_s']):.3f} ms x n_layer "
                     f"(measured: {points})")
    h = r["handoff"]
    frac = h.get("estimated_fraction_of_decode", {})
    rows = [[size, n, 1e3 * n * h["latency_s"]["0.0002"], frac.get(size)] for size, n in h["products_per_forward"].items()]
    lat = ", ".join(f"{1e3 * float(gap):g} ms idle: {1e6 * s:.0f} us" for gap, s in h["latency_s"].items())
    print_table("Thread hand-off in few-row forward passes (gpt2np/model/fast/matmul.py helper threads)",
                ["size", "shared products", "est. ms per pass", "x one-token pass"], rows,
                note=f"median wake-up latency of a helper thread after {lat}; "
                     "estimate = shared products x latency at 0.2 ms idle")
    b = r["bundled"]
    if "skipped" in b:
        print(f"\nBundled tiny pair: skipped ({b['skipped']})")
        return
    rows = [[role, m["n_params"], ms(m["s_per_call"]), ms(m["flop_seconds"]), ms(m["overhead_s_per_call"])]
            for role, m in b["models"].items()]
    print_table(f"Bundled pair: {b['draft']} -> {b['target']}, per forward call",
                ["model", "params", "ms/call", "FLOP ms", "overhead ms"], rows)
    sp = b["speculative"]
    rows = [[name, ms(x["s_per_token"]), ms(x["loop_overhead_s_per_token"])]
            for name, x in (("plain", b["plain"]), ("speculative", b["speculative"]))]
    print_table(f"Bundled pair: decoding {b['n_tokens']} tokens greedily",
                ["loop", "ms/token", "outside forward ms/token"], rows,
                note=f"speculative (K={b['K']}): alpha_hat {sp['alpha_hat']:.3f}, c {fmt(sp['c'])}, v {fmt(sp['v'])}: "
                     f"speedup {sp['speedup']:.2f}x over plain; predicted {fmt(sp['predicted_thm38'])} (Thm 3.8), "
                     f"{fmt(sp['predicted_refined'])} (refined)")
