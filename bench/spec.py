"""Speculative decoding, measured against its own prediction (Leviathan et al. 2023, Thm 3.8).

Two kinds of run, both greedy (temperature 0) so that the output must equal the baseline's:
  self    draft = target (the same model object, its own cache): every draft is accepted
          (alpha = 1) and c is about 1, so Thm 3.8 predicts exactly 1x and the refined
          prediction (K+1) / (K + v) shows what verification costs;
  forced  a benchmark-only drafter around the pair's draft-shaped model (forced_draft.py) whose
          proposals are the target's greedy token with probability alpha, for each alpha.

One repeat = the baseline (gpt2np.generate on the target alone) and then every configured run,
back to back, so each speedup is a ratio of two runs a few seconds apart; we report medians.

Prefill. Both loops start with a prefill the theory does not model, and speculative decoding has
two (the target's first call covers the prompt plus the first drafts, the draft's covers the
prompt). `speedup` therefore replaces each prefill call by its steady-state equivalent measured in
the same run (the baseline's prefill by one one-token call; the target's first call by one
(K+1)-token call; the draft's first call by one one-token draft call). `speedup_end_to_end` is the
plain wall-time ratio, prefill included, with a short prompt (spec_prompt_len tokens).

Long prompts. The forced-acceptance runs are repeated after a prompt of
spec_long_prompt tokens (896 by default), with their own baseline: every call then attends to
~900 cached tokens, so t1, c and v are those of a long context, and `speedup` (prefill calls
replaced by steady-state ones, as above) says whether the short prompt's speedups hold there.
`speedup_end_to_end` of these rows includes both ~900-token prefills. JSON: speculative.forced_long,
the shape of speculative.forced, each run's prompt_len saying which prompt it had.

Tokens per run. speculative_generate clamps the last round (k = min(K, tokens still wanted - 1)),
so a run whose length is not a multiple of K + 1 ends with a short round even at alpha = 1, and
tokens per round come out below (1 - a^(K+1)) / (1 - a). The default run length is 6 x (K + 1) (30 at K = 4).

Predictions use alpha_hat from the run and c, v measured in the same repeat:
  t1 = median one-token target call of the baseline, c = mean one-token draft call / t1,
  v = mean (K+1)-token target call / t1;
  thm38 = (1 - a^(K+1)) / ((1 - a)(K c + 1)), refined = the same with K c + v;
  refined_at_measured_tokens = measured tokens per target call / (K c + v), which takes alpha's
  sampling noise out and leaves only the cost model to compare.
`round_cost_t1` is what one round really cost in units of t1 (all seconds in the steady-state
loop / rounds / t1), beside `predicted_round_cost_t1` = K c + v: where they differ, the cost
model misses something (two-token draft catch-up calls, Python work between calls).
"""
import time

from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.decoding.theory import expected_tokens_per_round, predicted_speedup

from .common import log, median, ms, print_table, random_ids, ratio
from .forced_draft import ForcedAcceptanceDraft, WrappedModelCaches


class TimedProxy(WrappedModelCaches):
    """The model interface around a model, recording (tokens fed, seconds) for every forward call. Its caches
    are the model's own, sized to a run as the loop asks where the model's are (WrappedModelCaches)."""

    def __init__(self, model):
        self.model, self.calls = model, []
        self.n_vocab, self.n_ctx, self.eot_id = model.n_vocab, model.n_ctx, model.eot_id
        if hasattr(model, "row_cost_shape"):  # auto's probe of the cost curve (a GPT2's): not a forward call
            self.row_cost_shape = model.row_cost_shape

    def forward(self, ids, cache, n_logits=1):
        start = time.perf_counter()
        logits = self.model.forward(ids, cache, n_logits)
        self.calls.append((len(ids), time.perf_counter() - start))
        return logits


def run_baseline(target, prompt, n_tokens):
    """Greedy decoding with the target alone; returns tokens, wall time and per-call timings."""
    proxy = TimedProxy(target)
    start = time.perf_counter()
    tokens = generate(proxy, prompt, n_tokens, temperature=0)
    wall = time.perf_counter() - start
    prefill = proxy.calls[0][1]
    t1 = median([s for _, s in proxy.calls[1:]]) or prefill
    return {"tokens": tokens, "wall": wall, "prefill": prefill, "t1": t1,
            "steady": wall - prefill + t1}


def mean_call(timings, n_seq):
    calls, secs = timings.get(n_seq, (0, 0.0))
    return secs / calls if calls else None


def run_speculative(target, draft, prompt, n_tokens, K, baseline):
    """One speculative run, with the steady-state time and the predictions of the module docstring."""
    start = time.perf_counter()
    result = speculative_generate(target, draft, prompt, n_tokens, K, temperature=0, calibrate=True)
    wall = time.perf_counter() - start
    st, P, t1 = result.stats, len(prompt), baseline["t1"]
    k1 = min(K, n_tokens - 1)
    first_target = mean_call(st.target_timings, P + k1) or 0.0     # prompt + first drafts
    first_draft = mean_call(st.draft_timings, P) or 0.0            # the draft's prefill
    t_verify = mean_call(st.target_timings, K + 1) or first_target
    t_draft = mean_call(st.draft_timings, 1) or mean_call(st.draft_timings, 2) or first_draft
    forward_s = st.target_seconds + st.draft_seconds + st.calibration_seconds
    steady = wall - st.calibration_seconds - first_target - first_draft + t_verify + t_draft
    c, v, a = t_draft / t1, t_verify / t1, st.alpha_hat
    tokens_per_round = len(result.tokens) / st.rounds
    calls_2 = st.draft_timings.get(2, (0, 0.0))
    return {
        "tokens_match_baseline": result.tokens == baseline["tokens"], "rounds": st.rounds,
        "alpha_hat": a, "alpha_empirical": st.alpha_empirical,
        "tokens_per_round": tokens_per_round,
        "expected_tokens_per_round": expected_tokens_per_round(a, K) if a is not None else None,
        "c": c, "v": v, "stats_c": st.c, "stats_v": st.v,
        "speedup": baseline["steady"] / steady, "speedup_end_to_end": baseline["wall"] / wall,
        "predicted_thm38": predicted_speedup(a, K, c) if a is not None else None,
        "predicted_refined": predicted_speedup(a, K, c, v) if a is not None else None,
        "predicted_refined_at_measured_tokens": tokens_per_round / (K * c + v),
        "stats_predicted_refined": st.predicted_speedup_refined,
        "round_cost_t1": steady / st.rounds / t1, "predicted_round_cost_t1": K * c + v,
        "draft_catchup_calls": calls_2[0], "draft_catchup_t1": ratio(mean_call(st.draft_timings, 2), t1),
        "loop_overhead_s_per_token": (wall - forward_s) / len(result.tokens),
        "baseline_s_per_token": baseline["steady"] / n_tokens, "spec_s_per_token": steady / n_tokens,
        "t1": t1,
    }


MEDIAN_KEYS = ("speedup", "speedup_end_to_end", "c", "v", "stats_c", "stats_v", "predicted_thm38",
               "predicted_refined", "predicted_refined_at_measured_tokens", "stats_predicted_refined",
               "round_cost_t1", "predicted_round_cost_t1", "draft_catchup_t1", "loop_overhead_s_per_token",
               "baseline_s_per_token", "spec_s_per_token", "t1")


def combine(runs):
    """Medians over repeats of the timing-dependent numbers; the rest from the first repeat."""
    out = dict(runs[0])
    for key in MEDIAN_KEYS:
        out[key] = median([r[key] for r in runs])
    out["tokens_match_baseline"] = all(r["tokens_match_baseline"] for r in runs)
    out["refined_error"] = ratio(out["speedup"], out["predicted_refined"])
    out["refined_error"] = None if out["refined_error"] is None else out["refined_error"] - 1
    out["repeats"] = len(runs)
    return out


def repeated_runs(target, size, prompt, plan, drafts, label=""):
    """A warm-up baseline, then spec_repeats x (a baseline + one run per draft), back to back.

    drafts = {name: make_draft(sequence)}, sequence = prompt + the target's greedy tokens (what a
    forced drafter must know); returns {name: [one run_speculative dict per repeat]}."""
    N, K = plan.spec_tokens, plan.K
    log(f"{size}: speculative decoding{label}, warm-up baseline ({N} tokens)")
    warm = run_baseline(target, prompt, N)
    sequence = prompt + warm["tokens"]
    runs = {name: [] for name in drafts}
    for r in range(plan.spec_repeats):
        log(f"{size}: speculative repeat {r + 1}/{plan.spec_repeats}{label}: baseline + {', '.join(drafts)}")
        baseline = run_baseline(target, prompt, N)
        for name, make_draft in drafts.items():
            runs[name].append(run_speculative(target, make_draft(sequence), prompt, N, K, baseline))
    return runs


def forced_drafts(draft_model, plan):
    return {f"forced {a}": lambda sequence, a=a: ForcedAcceptanceDraft(draft_model, sequence, a, seed=0)
            for a in plan.alphas}


def forced_result(runs, plan, common):
    return {"draft": plan.pair[0],
            "runs": [{**common, "draft": f"{plan.pair[0]} forced", "alpha_nominal": a,
                      **combine(runs[f"forced {a}"])} for a in plan.alphas]}


def run_long_prompt(target, size, plan, draft_model, common):
    """The forced-acceptance runs after a spec_long_prompt-token prompt (module docstring)."""
    P, N = plan.spec_long_prompt, plan.spec_tokens
    n_ctx = min(target.n_ctx, draft_model.n_ctx)
    if P + N > n_ctx:
        return {"skipped": f"a {P}-token prompt + {N} tokens exceeds the context of {n_ctx} tokens"}
    prompt = random_ids(P, target.n_vocab, seed=4)
    runs = repeated_runs(target, size, prompt, plan, forced_drafts(draft_model, plan),
                         label=f" after a {P}-token prompt")
    return forced_result(runs, plan, {**common, "prompt_len": P})


def run(target, size, plan, draft_model=None):
    """Speculative results for one target: {"self": {...}}, plus "forced" and "forced_long" with draft_model."""
    prompt = random_ids(plan.spec_prompt_len, target.n_vocab, seed=3)
    drafts = {"self": lambda sequence: target}
    if draft_model is not None:
        drafts.update(forced_drafts(draft_model, plan))
    runs = repeated_runs(target, size, prompt, plan, drafts)
    common = {"K": plan.K, "n_tokens": plan.spec_tokens, "prompt_len": len(prompt), "target": size}
    out = {"self": {**common, "draft": size, "alpha_nominal": 1.0, **combine(runs["self"])}}
    if draft_model is not None:
        out["forced"] = forced_result(runs, plan, common)
        if plan.spec_long_prompt:
            out["forced_long"] = run_long_prompt(target, size, plan, draft_model, common)
    return out


def all_runs(spec):
    """Every run of a speculative result: self, forced, then forced_long (missing ones left out)."""
    return (([spec["self"]] if "self" in spec else []) + spec.get("forced", {}).get("runs", [])
            + spec.get("forced_long", {}).get("runs", []))


def long_prompt(spec, run):
    """Whether run is one of the long-prompt set: its prompt is not the self run's short one."""
    short = spec.get("self", {}).get("prompt_len")
    return short is not None and run["prompt_len"] != short


def print_report(sizes):
    runs = [(f"{r['draft']}->{size}" + (", long prompt" if long_prompt(e["speculative"], r) else ""), r)
            for size, e in sizes.items() if e.get("speculative") for r in all_runs(e["speculative"])]
    if not runs:
        return
    rows = [[name, r["prompt_len"], r["K"], r["alpha_nominal"], r["alpha_hat"], r["tokens_per_round"], r["c"], r["v"],
             r["speedup"], r["speedup_end_to_end"], r["predicted_thm38"], r["predicted_refined"],
             r["predicted_refined_at_measured_tokens"], r["tokens_match_baseline"]] for name, r in runs]
    print_table("Speculative decoding, greedy: measured vs predicted speedup (medians over repeats)",
                ["draft->target", "prompt", "K", "alpha", "a_hat", "tok/round", "c", "v", "speedup", "end2end",
                 "Thm3.8", "refined", "ref@tok", "exact"], rows,
                note="speedup: prefill calls replaced by steady-state calls (see bench/spec.py); end2end: wall "
                     "time with prefill; Thm3.8 assumes v = 1;\nrefined = (1-a^(K+1))/((1-a)(Kc+v)) at a = a_hat; "
                     "ref@tok = measured tok/round / (Kc+v); exact: output == target-only greedy output;\n"
                     "long prompt: the forced runs again after `prompt` tokens, with their own baseline "
                     "(c, v, speedup at that context)")
    rows = [[name, r["prompt_len"], r["alpha_nominal"], r["round_cost_t1"], r["predicted_round_cost_t1"],
             r["draft_catchup_calls"], r["draft_catchup_t1"], ms(r["loop_overhead_s_per_token"]),
             ms(r["baseline_s_per_token"]), ms(r["spec_s_per_token"])] for name, r in runs]
    print_table("Speculative decoding: where a round's time goes (units of t1 = one one-token target call)",
                ["draft->target", "prompt", "alpha", "round cost", "Kc+v", "catch-up calls", "catch-up cost",
                 "loop ms/tok", "plain ms/tok", "spec ms/tok"], rows,
                note="catch-up: draft calls fed 2 tokens (after a fully accepted round the draft lacks x_K and "
                     "the bonus token), which Kc+v counts as one-token calls; loop: time outside forward calls")
