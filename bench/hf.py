"""Optional: Hugging Face transformers' GPT-2 on PyTorch CPU, same shapes, paired with gpt2np.

Runs only when both `torch` and `transformers` import (they are never gpt2np dependencies).
The HF model gets random weights from its own initialiser (values do not change the speed),
fp32, eval mode, no_grad. Measured at each size, alternating one gpt2np call and one HF call so
both see the same machine state:
  decode   one token with verify_context tokens cached (HF: past_key_values, cropped back after
           each call when it is a DynamicCache, reused as is when it is a legacy tuple)
  verify5  a forward over 5 new tokens at the same context, relative to one token
  prefill  at every length in plan.prefill_lens, in two worker processes taking turns
           (prefill_pair.py): hf["prefill"][str(n)] = {n_tokens, numpy_s, hf_s, numpy_over_hf, ...},
           hf["prefill_workers"] = what each worker ran (hf_call: logits_to_keep,
           num_logits_to_keep or plain; threads; versions), or {"skipped": why} if a worker failed.
           Random weights of the size's shape in both workers, also for a named model.
numpy_over_hf < 1 means gpt2np is faster (the target at 355M: decode <= 1; prefill's:
prefill of 512 tokens <= 1 at 124M and 355M).
"""
from . import prefill_pair
from .common import log, median, ms, print_table, random_ids, seconds


def available():
    """None if torch and transformers both import, else the reason to skip."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything else
        return f"needs torch and transformers: pip install -r tools/requirements-hf.txt ({type(e).__name__}: {e})"
    return None


def hf_model(config):
    import torch
    import transformers
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(vocab_size=config.n_vocab, n_positions=config.n_ctx, n_embd=config.n_embd,
                                        n_layer=config.n_layer, n_head=config.n_head)
    return transformers.GPT2LMHeadModel(hf_config).eval()


def run_size(model, size, plan, threads):
    import torch
    if threads:
        torch.set_num_threads(threads)
    hf = hf_model(model.config)
    ctx = plan.verify_context
    ids = random_ids(ctx + 5, model.n_vocab, seed=7)
    cache = model.new_cache()
    model.forward(ids[:ctx], cache)
    with torch.no_grad():
        past = hf(torch.tensor([ids[:ctx]]), use_cache=True).past_key_values

        def hf_call(m):
            hf(torch.tensor([ids[ctx:ctx + m]]), past_key_values=past, use_cache=True)
            if hasattr(past, "crop") and past.get_seq_length() > ctx:
                past.crop(ctx - past.get_seq_length())  # a negative count removes tokens (4.x and 5.x)

        def np_call(m):
            model.forward(ids[ctx:ctx + m], cache, n_logits=m)
            cache.truncate(ctx)

        for f in (hf_call, np_call):  # warm-up
            f(1)
            f(5)
        t = {"np1": [], "hf1": [], "np5": [], "hf5": []}
        for _ in range(max(plan.repeats, 5)):
            t["np1"].append(seconds(lambda: np_call(1)))
            t["hf1"].append(seconds(lambda: hf_call(1)))
            t["np5"].append(seconds(lambda: np_call(5)))
            t["hf5"].append(seconds(lambda: hf_call(5)))
    return {"context": ctx, "torch_threads": torch.get_num_threads(),
            "hf_decode_s": median(t["hf1"]), "numpy_decode_s": median(t["np1"]),
            "numpy_over_hf": median([a / b for a, b in zip(t["np1"], t["hf1"])]),
            "hf_verify5_ratio": median([a / b for a, b in zip(t["hf5"], t["hf1"])]),
            "numpy_verify5_ratio": median([a / b for a, b in zip(t["np5"], t["np1"])])}


def versions():
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def print_report(sizes):
    rows = [[size, r["hf"]["context"], ms(r["hf"]["numpy_decode_s"]),
             ms(r["hf"]["hf_decode_s"]), r["hf"]["numpy_over_hf"], r["hf"]["numpy_verify5_ratio"],
             r["hf"]["hf_verify5_ratio"]]
            for size, r in sizes.items() if isinstance(r.get("hf"), dict) and "hf_decode_s" in r["hf"]]
    if rows:
        print_table("gpt2np vs Hugging Face transformers on PyTorch CPU (paired, medians)",
                    ["size", "context", "numpy ms/tok", "HF ms/tok", "numpy/HF", "numpy M=5/M=1", "HF M=5/M=1"],
                    rows)


def run(model, size, plan, threads):
    log(f"{size}: Hugging Face comparison")
    out = run_size(model, size, plan, threads)
    try:
        out["prefill"], out["prefill_workers"] = prefill_pair.run(size, model.config, plan.prefill_lens,
                                                                  plan.repeats, threads)
    except prefill_pair.WorkerError as e:  # the rest of the run is still worth its JSON
        log(f"{size}: prefill against Hugging Face failed: {e}")
        out["prefill"], out["prefill_workers"] = {}, {"skipped": str(e)}
    return out
