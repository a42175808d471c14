"""Per-size forward-pass costs: prefill, decode s/token at several contexts, the verification curve.

All three use the public model interface only (new_cache, forward, cache.truncate), so they keep
working whatever model/forward.py does inside. Each measurement returns the cache to a fixed length with
truncate() between runs, so every repeat sees the same context.

  prefill   one forward over an n-token prompt into an empty cache (logits of the last row), for
            every n in prefill_lens; JSON prefill[str(n)]. Hugging Face's time for the same
            prompts comes from alternating worker processes (prefill_pair.py, the hf section) and
            is printed beside it
  decode    one forward over 1 token with `context` tokens cached (s/token); compared with the
            roofline (weight bytes + the KV bytes read at that context) / bandwidth, both with the
            run's best bandwidth (vs_roofline) and pair by pair with a gemv pass timed right after
            each step (vs_roofline_paired: immune to the host's drift, uses gemv alone)
  verify    one forward over M = 1..verify_max_m tokens with `context` tokens cached, asking for
            all M rows of logits, as speculative decoding's verification does; reported as
            t(M) / t(1) measured back to back in each repeat, then the median; at every context
            in verify_contexts, JSON verify[str(context)].
"""
from .common import (forward_flops, kv_bytes, log, median, ms, print_table, random_ids, ratio, seconds,
                     summary, time_repeated, weight_bytes_per_token)


def measure_prefill(model, ids, repeats):
    cache = model.new_cache()

    def prefill():
        cache.truncate(0)
        model.forward(ids, cache, n_logits=1)

    s = time_repeated(prefill, repeats)
    flops = forward_flops(model.config, len(ids))
    return {"n_tokens": len(ids), "seconds": s["median"], "seconds_min": s["min"],
            "tokens_per_s": len(ids) / s["median"], "gflops": flops / s["median"] / 1e9}


def fill_cache(model, cache, ids):
    """Grow the cache to len(ids) tokens (feeding only what it lacks), untimed."""
    if len(cache) < len(ids):
        model.forward(ids[len(cache):], cache, n_logits=1)
    cache.truncate(len(ids))


def measure_decode(model, cache, context, token, repeats, bandwidth_gbps, probe=None):
    """s/token of a one-token forward with `context` tokens cached; with a probe, each step is
    followed by a gemv bandwidth pass and vs_roofline_paired is the median of per-pair ratios."""
    def step():
        model.forward([token], cache, n_logits=1)
        cache.truncate(context)

    step()  # warm-up
    config = model.config
    n_bytes = weight_bytes_per_token(config) + kv_bytes(config, context + 1)
    times, paired = [], []
    for _ in range(max(repeats, 5) * 2):  # cheap and the headline number: take more samples
        times.append(seconds(step))
        if probe is not None:
            paired.append(times[-1] / (n_bytes / (probe.gbps() * 1e9)))
    s = summary(times)
    roofline = n_bytes / (bandwidth_gbps * 1e9) if bandwidth_gbps else None
    return {"context": context, "s_per_token": s["median"], "s_per_token_min": s["min"],
            "bytes_read": n_bytes, "gbps": n_bytes / s["median"] / 1e9,
            "roofline_s": roofline, "vs_roofline": ratio(s["median"], roofline),
            "vs_roofline_paired": median(paired)}


def measure_verify(model, cache, context, tokens, max_m, repeats):
    """Forward over M = 1..max_m tokens (all M rows of logits) at a fixed context; ratios to M = 1."""
    def one(m):
        model.forward(tokens[:m], cache, n_logits=m)
        cache.truncate(context)

    ms_range = range(1, max_m + 1)
    for m in ms_range:  # warm-up
        one(m)
    times = {m: [] for m in ms_range}
    for _ in range(repeats):
        for m in ms_range:
            times[m].append(seconds(lambda: one(m)))
    return {"context": context,
            "seconds": {str(m): median(times[m]) for m in ms_range},
            "ratio": {str(m): median([t / t1 for t, t1 in zip(times[m], times[1])]) for m in ms_range}}


def run(model, size, plan, sections, bandwidth_gbps, probe=None):
    """The prefill / decode / verify results for one model, as a dict for results["sizes"][size]."""
    config = model.config
    out = {}
    ids = random_ids(max(plan.contexts + plan.prefill_lens + plan.verify_contexts), config.n_vocab)
    if "prefill" in sections:
        out["prefill"] = {}
        for n in plan.prefill_lens:
            log(f"{size}: prefill of {n} tokens")
            out["prefill"][str(n)] = measure_prefill(model, ids[:n], plan.repeats)
    cache = model.new_cache()
    extra = random_ids(plan.verify_max_m, config.n_vocab, seed=2)
    if "verify" in sections:
        out["verify"] = {}
        for context in sorted(plan.verify_contexts):  # ascending: each fill only feeds what is missing
            log(f"{size}: verification curve, M = 1..{plan.verify_max_m} at context {context}")
            fill_cache(model, cache, ids[:context])
            out["verify"][str(context)] = measure_verify(model, cache, context, extra, plan.verify_max_m,
                                                         plan.repeats)
    if "decode" in sections:
        out["decode"] = {}
        cache.truncate(0)
        for context in sorted(plan.contexts):
            log(f"{size}: decode at context {context}")
            fill_cache(model, cache, ids[:context])
            out["decode"][str(context)] = measure_decode(model, cache, context, extra[0], plan.repeats,
                                                         bandwidth_gbps, probe)
    return out


def prefill_by_length(entry):
    """entry["prefill"] as {str(n): result}, also from JSON written before prefill had lengths."""
    p = entry.get("prefill") or {}
    return {str(p["n_tokens"]): p} if "n_tokens" in p else p


def verify_by_context(entry):
    """entry["verify"] as {str(context): curve}, also from JSON written before it had contexts."""
    v = entry.get("verify") or {}
    return {str(v["context"]): v} if "ratio" in v else v


def hf_prefill(entry):
    """{str(n): paired result} of the prefill pair (prefill_pair.py), or {} when not measured."""
    hf = entry.get("hf")
    return (hf.get("prefill") or {}) if isinstance(hf, dict) else {}


def print_report(sizes):
    rows = []
    for size, r in sizes.items():
        own, paired = prefill_by_length(r), hf_prefill(r)
        for n in sorted(set(own) | set(paired), key=int):
            p, h = own.get(n, {}), paired.get(n, {})
            rows.append([size, int(n), ms(p.get("seconds")), p.get("tokens_per_s"), p.get("gflops"),
                         ms(h.get("numpy_s")), ms(h.get("hf_s")), h.get("numpy_over_hf")])
    if rows:
        print_table("Prefill: one forward over the prompt into an empty cache, logits of the last row (median)",
                    ["size", "tokens", "ms", "tokens/s", "GFLOP/s", "paired numpy ms", "HF ms", "numpy/HF"], rows,
                    note="paired numpy ms, HF ms: gpt2np and Hugging Face in two worker processes taking turns "
                         "(bench/prefill_pair.py);\n"
                         "numpy/HF: median of the per-round ratios")
    rows = [[size, int(ctx), ms(d["s_per_token"]), ms(d["roofline_s"]), d["vs_roofline"],
             d.get("vs_roofline_paired"), d["gbps"]]
            for size, r in sizes.items() for ctx, d in (r.get("decode") or {}).items()]
    if rows:
        print_table("Decode (median)",
                    ["size", "context", "decode ms/tok", "roofline ms", "x roofline", "x paired", "GB/s"], rows,
                    note="roofline = (fp32 weight bytes per token + KV bytes at that context) / best bandwidth; "
                         "x paired: each step over the roofline from a gemv pass timed right after it")
    curves = [(size, c) for size, r in sizes.items() for c in verify_by_context(r).values()]
    if curves:
        m_keys = list(curves[0][1]["ratio"])
        rows = [[size, c["context"], ms(c["seconds"]["1"])] + [c["ratio"].get(m) for m in m_keys[1:]]
                for size, c in curves]
        print_table("Verification curve: forward over M new tokens / forward over 1 (median of paired ratios)",
                    ["size", "context", "M=1 ms"] + [f"M={m}" for m in m_keys[1:]], rows)
