"""Drafters and K policies, measured: every fixed K against "heuristic" and "auto".

At the pair's shapes (random 124M draft -> 355M target), greedy, for each forced acceptance rate
alpha in plan.policy_alphas, two drafters:
  model    the 124M draft around forced_draft.ForcedAcceptanceDraft: a real draft's cost (c ~ 0.35)
  lookup   ForcedLookupDrafter below: proposes like prompt lookup (one-hot q, a few microseconds,
           c ~ 0), agreeing with the target's greedy token with probability alpha
  self     the target drafting for itself (the repositories' sanity pair): every draft accepted
           (alpha 1 by nature, reported as alpha 1.0), but a draft costs a whole target call (c ~ 1),
           so no fixed K can pay and auto must stay plain; run once per repeat, not per alpha
and for each, the fixed Ks plan.policy_Ks (default 1..plan.policy_K_max), then heuristic and auto
(K_max = plan.policy_K_max), and with plan.policy_read (--policy-read) "auto read": auto with
policies.READ_PROMPT set, reading the prompt's overlaps before its first round (policies.AutoK, 5.;
the forced drafters agree at the prompt's positions with the target's greedy token at alpha:
forced_draft.wanted_sequence); plan.policy_drafters picks the drafters. One repeat = for each alpha,
a group: a plain-decoding baseline, every run of that alpha back to back (in an order rotated with
the repeat), and a second baseline; each run's speedup is over the baseline drawn on the line between
the two at the run's midpoint (baseline_at: a shared machine's speed drifts by several per cent
within the minutes a group lasts; the report gives the drift), medians over repeats. Repeat r draws its forced coins with seed r, the same for every K of the repeat: auto's
early rounds decide how it goes on, so one coin sequence for all repeats would measure that
sequence's luck (seed 0 at alpha 0.8 rejects the very first draft), not the policy. The report
gives each policy's median and worst seed against the best fixed K (the K with the best median),
seed by seed on the same coins. With plan.policy_runs = n, every seed's groups run n times over (each
group between its own baselines, the rotation advancing each time) and a seed's speedup is the median
of its n runs (per_seed): identical runs differ by up to 17 % on a shared host, so with one run per
seed the worst seed is mostly the worst minute of the clock. With plan.policy_lockstep
(--policy-lockstep, python -m bench's default since 2026-11-28; --no-policy-lockstep for the above) a
group's runs and a plain run, their baseline, decode together instead, a round at a time, the run furthest
behind in tokens first (lockstep): each stretch of the output is decoded by every run within seconds of
the others, so the host's drift slows them alike. Meant for models larger than the CPU's caches (the
sweep's random 124M and up): interleaved runs would evict a small model's weights from each other's caches.

Prefill. As in spec.py, `speedup` replaces the first target call (prompt + k_1 drafts) by a
steady call of k_1 + 1 tokens, and the draft's prompt prefill by a one-token draft call.

Prediction, per run: the refined speedup summed over the run's actual rounds,
    sum_r E(a, k_r) / sum_r (k_r c + v(k_r + 1)),   E(a, k) = (1 - a^(k+1)) / (1 - a),
a = alpha_hat of the run, c = median one-token draft call / t1, v(M) = mean M-token target call /
t1 measured in the run (policies.v_curve's line where a size was never timed), t1 the baseline's.
For a fixed K whose run length is a multiple of K + 1 this is the (1 - a^(K+1))/((1 - a)(Kc + v)).

Replay, per group (replays): every fixed K, the heuristic and auto of a forced drafter run again in the chain
simulator (teach/policy_simulation.py) on the group's own coins and what its runs paid (group_v: each call
size's median; draft_c: c from the one-row draft calls), auto planning with the shape its run's probe read. The report's
"replayed" is auto / best of these, beside the measured one: the gap between the two is what the cost model
leaves out (the host's stalls and spiked readings, a run that priced a size out on one slow reading). Beside
it, "Bayes": the Bayes-optimal policy (policy_simulation.BayesOptimalK) replayed on the same coins and costs,
told c, v and the run's length, learning alpha from a uniform prior over BOUND_ALPHAS: the learner that is
best on average over that prior, on these very coins. Where it reads under a goal, a policy that must learn
alpha meets the goal there only by a luckier guess than the best one.

Also: the real n-gram drafter on the bundled Shakespeare pair, on a prompt whose continuation
repeats earlier text (real alpha), against the bundled draft model (bundled_lookup()).
"""
import time

import gpt2np
from gpt2np.decoding.autoregressive import generate, plain_stream
from gpt2np.decoding.drafters import ModelDrafter, NgramDrafter, one_hot_rows
from gpt2np.decoding import policies
from gpt2np.decoding.policies import v_curve
from gpt2np.decoding.speculative import speculative_stream
from gpt2np.decoding.theory import expected_tokens_per_round
from gpt2np.teach.policy_simulation import BOUND_ALPHAS, BayesOptimalK, simulate_policy

from .common import StreamSide, lockstep, log, median, print_table, random_ids, ratio
from .forced_draft import ForcedAcceptanceDraft, ForcedChoices, wanted_sequence
from .spec import TimedProxy


class ForcedLookupDrafter:
    """A drafter of prompt lookup's cost whose proposal at position i is the target's greedy token
    with probability alpha (coins drawn in advance, as in forced_draft.py), else another token."""

    def __init__(self, sequence, alpha, n_vocab, seed=0):
        self.forced = ForcedChoices(sequence, alpha, n_vocab, seed)
        self.name, self.c_prior, self.n_vocab = f"forced lookup alpha={alpha}", 0.0, n_vocab

    def check(self, target, prompt_ids, n_tokens):
        pass

    def reset(self, target):
        self.calls, self.seconds, self.drafted = 0, 0.0, 0

    def propose(self, context, k, options, rng):
        start = time.perf_counter()
        drafts = [self.forced.wanted(len(context) + i) for i in range(k)]
        self.calls, self.drafted = self.calls + 1, self.drafted + len(drafts)
        self.seconds += time.perf_counter() - start
        return drafts, one_hot_rows(drafts, self.n_vocab)

    def roll_back(self, n):
        pass

    def cost_per_token(self):
        return self.seconds / self.drafted if self.drafted else None

    timings = property(lambda self: {"lookup": (self.calls, self.seconds)})


def mean_call(calls, n_seq):
    secs = [s for n, s in calls if n == n_seq]
    return sum(secs) / len(secs) if secs else None


def open_run(target, drafter, draft_proxy, prompt, n_tokens, K, K_max):
    """One greedy speculative run as a StreamSide, not yet started; `record` turns it into run_one's record."""
    proxy = TimedProxy(target)
    stream = speculative_stream(proxy, drafter, prompt, n_tokens, K, K_max=K_max, temperature=0, calibrate=True)

    def record(seconds, when):  # once the side has ended (side: below)
        return {"K": K, "K_max": K_max, "ks": side.ks, "wall": seconds - stream.result.stats.calibration_seconds,
                "when": when, "result": stream.result, "calls": proxy.calls,
                "draft_calls": draft_proxy.calls if draft_proxy else [], "cost_per_token": drafter.cost_per_token(),
                "prompt_len": len(prompt)}

    side = StreamSide(stream, record, proxy)
    return side


def alone(side):
    """Run one StreamSide by itself: its record, its midpoint on the clock as `when`."""
    start = time.perf_counter()
    (seconds,) = lockstep([side])
    return side.record(seconds, start + seconds / 2)


def run_one(target, drafter, draft_proxy, prompt, n_tokens, K, K_max):
    """One greedy run through the stream, timed: what measured() needs once its baseline is known."""
    return alone(open_run(target, drafter, draft_proxy, prompt, n_tokens, K, K_max))


def steady_calls(run):  # -> [(rows, seconds)]: the rounds' target calls after the prompt's (not calibration)
    read = run["result"].stats.prompt_positions > 0
    return run["calls"][1:len(run["ks"]) + read]


def calls_by_size(runs):  # -> {rows: [seconds]}: every steady call of a group's runs (run at the same time)
    sizes = {}
    for run in runs:
        for n, seconds in steady_calls(run):
            sizes.setdefault(n, []).append(seconds)
    return sizes


def measured(run, baseline, group=None):
    """A run's speedup and refined prediction against its baseline (t1, steady seconds, tokens).

    The first round's call also feeds the prompt, which the baseline's steady seconds leave out: it counts as
    a round of its own size, priced at the run's own calls of that size, else at the median of the group's
    (`group`: calls_by_size of the runs measured with it), else on a line through the run's timed sizes. A
    first round's size is often one the run never plays again (auto: K = 5 first, then 7-8 at alpha 1), and
    a line through 8 and 9 rows overprices 6 on a flat curve.

    A run that read the prompt first (auto: stats.prompt_positions) fed prompt[:-1] in a call of its own in
    each model, and its first round is a steady round. There the target's read counts as the baseline's
    prefill (of the whole prompt, one row of logits), so that the read's extra rows of logits stay in the
    run's time (at 1558M, 8 tokens: 0.260 s against 0.244 for the plain prefill, a one-token call 0.210),
    and the draft's read is taken out whole (its extra rows: a 124M head over 7 rows, ~1 % of a 1558M pass)."""
    ks, K_max, result, t1 = run["ks"], run["K_max"], run["result"], baseline["t1"]
    read = result.stats.prompt_positions > 0
    own = steady_calls(run)
    timed = {m: [s for n, s in own if n == m] for m in range(2, K_max + 2)}
    v_fit = v_curve({1: [t1], **timed}, K_max + 1)  # in the baseline's t1: without it v_curve infers t1 from
    # the prior curve (v(8) ~ 1.8): before session 56 auto's first round of 6 rows read ~1.6 one-token calls
    # at 1558M on panels, more than its whole first call with the prompt (1.4), its speedup 3-8 % low at 40 tokens
    others = {m: median(seconds) / t1 for m, seconds in (group or {}).items()}
    v = {m: ratio(mean_call(own, m), t1) or others.get(m) or v_fit[m] for m in range(1, K_max + 2)}
    first_target = baseline["prefill"] if read else run["calls"][0][1] - v[ks[0] + 1] * t1
    draft_calls = run["draft_calls"]
    one_token = [s for n, s in draft_calls if n == 1] or [s for n, s in draft_calls[1:] if n == 2]
    t_draft = median(one_token) if one_token else (run["cost_per_token"] or 0.0)
    prefill = draft_calls[0][1] if draft_calls and draft_calls[0][0] == run["prompt_len"] - read else None
    first_draft = 0.0 if prefill is None else prefill - (0.0 if read else t_draft)  # a read holds no draft call
    steady = run["wall"] - first_target - first_draft
    a, c = result.stats.alpha_hat, t_draft / t1
    predicted = None
    if a is not None:
        predicted = sum(expected_tokens_per_round(a, k) for k in ks) / sum(k * c + v[k + 1] for k in ks)
    return {"K": run["K"], "speedup": baseline["steady"] / steady, "predicted_refined": predicted, "alpha_hat": a,
            "c": c, "rounds": len(ks), "K_counts": result.stats.K_counts,
            "exact": result.tokens == baseline["tokens"], "probe_seconds": result.stats.probe_seconds,
            "probe_share": result.stats.probe_seconds / run["wall"], "prompt_overlap": result.stats.prompt_overlap,
            "prompt_positions": result.stats.prompt_positions,
            "prompt_share": result.stats.prompt_seconds / run["wall"]}


def open_baseline(target, prompt, n_tokens):
    """Plain greedy decoding of the target as a StreamSide; its `record` is the baseline measured() needs:
    the tokens, t1 (the median one-token call), the steady seconds (the prefill call replaced by t1) and the
    prefill call's seconds."""
    proxy = TimedProxy(target)
    stream = plain_stream(proxy, prompt, n_tokens, temperature=0)

    def record(seconds, when):
        t1 = median([s for _, s in proxy.calls[1:]])
        return {"tokens": stream.result, "t1": t1, "steady": seconds - proxy.calls[0][1] + t1, "when": when,
                "prefill": proxy.calls[0][1]}

    return StreamSide(stream, record, proxy)


def baseline_run(target, prompt, n_tokens):
    return alone(open_baseline(target, prompt, n_tokens))


def baseline_at(before, after, when):
    """The plain baseline at time `when`, drawn on the line between one run just before a group of
    runs and one just after it: on a shared machine the speed drifts by several per cent within
    minutes, and a group of runs lasts minutes (its last run would otherwise be measured against a
    baseline taken minutes before it)."""
    share = min(1.0, max(0.0, (when - before["when"]) / (after["when"] - before["when"])))
    return {"tokens": before["tokens"],
            **{key: before[key] + share * (after[key] - before[key]) for key in ("t1", "steady", "prefill")}}


def timed_group(target, prompt, N, runs):
    """[measured run] for a group of runs (callables, each opening a StreamSide: open_run), run back to back
    and bracketed by plain baselines; and the group's drift, the later baseline's steady seconds over
    the earlier's."""
    before = baseline_run(target, prompt, N)
    records = [alone(one()) for one in runs]
    after = baseline_run(target, prompt, N)
    group = calls_by_size(records)
    return ([measured(r, baseline_at(before, after, r["when"]), group) for r in records],
            after["steady"] / before["steady"], (records, median([before["t1"], after["t1"]])))


def lockstep_group(target, prompt, N, runs):
    """timed_group's result with the group's runs and one plain run decoding in lockstep (lockstep()), the
    plain run their baseline; the drift: the plain run's one-token calls, the later half's median over
    the earlier half's (what lockstep cancels)."""
    plain, sides = open_baseline(target, prompt, N), [one() for one in runs]
    seconds = lockstep([plain] + sides)
    calls = [s for _, s in plain.proxy.calls[1:]]  # [N - 1] one-token calls after the prefill
    drift = median(calls[len(calls) // 2:]) / median(calls[:len(calls) // 2]) if len(calls) > 1 else 1.0
    baseline, records = plain.record(seconds[0], None), [side.record(s, None) for side, s in zip(sides, seconds[1:])]
    group = calls_by_size(records)
    return [measured(r, baseline, group) for r in records], drift, (records, baseline["t1"])


def group_v(records, t1, K_max, shape=None):  # -> {M: v(M)}, M = 1..K_max + 1: what a group's target calls cost
    """The v a replay charges: each size's median over the group's steady target calls in the baseline's
    one-token call t1, a size no run timed on the line through them (policies.v_curve: along the shape a
    run's probe read, where one did).

    >>> from types import SimpleNamespace
    >>> result = SimpleNamespace(stats=SimpleNamespace(prompt_positions=0))  # a run that read no prompt first
    >>> runs = [{"calls": [(9, 9.0), (4, 1.1), (4, 1.3), (1, 5.0)], "ks": [3, 3, 3], "result": result,
    ...          "draft_calls": [(8, 1.0), (1, 0.1), (1, 0.3)], "cost_per_token": 0.2}]
    >>> {M: round(x, 2) for M, x in group_v(runs, 1.0, 3).items()}  # 4 rows: the median; 2-3 on a line through it
    {1: 1.0, 2: 1.04, 3: 1.12, 4: 1.2}
    >>> round(draft_c(runs, 1.0), 2)  # the one-row draft calls' median
    0.2
    """
    sizes = {n: seconds for n, seconds in calls_by_size(records).items() if n > 1}
    return v_curve({1: [t1], **sizes}, K_max + 1, shape)


def draft_c(records, t1):  # -> the c a replay charges: a drafter's runs' median one-row draft call over t1
    """(A drafter without a draft model, whose runs made no draft call: its seconds per drafted token.)"""
    one_row = [s for r in records for n, s in r["draft_calls"] if n == 1]
    per_token = [r["cost_per_token"] for r in records if r["cost_per_token"]]
    return (median(one_row) if one_row else median(per_token) if per_token else 0.0) / t1


def replays(alpha, seed, n_tokens, prompt_len, Ks, K_max, v, c, c_prior, shape=None):  # -> {str(K): speedup}
    """Every fixed K, the heuristic and auto of one group replayed in the chain simulator
    (teach/policy_simulation.py) on the group's own coins (ForcedChoices' seed, after the prompt) and costs
    (group_v, draft_c), auto planning with the shape its run's probe read: what the cost model says the runs
    should have measured. Where a run reads well under its replay, the difference is the host's (a stall,
    a slow minute, a reading that spiked and was never read again), which the model leaves out.
    "bayes": the Bayes-optimal policy over BOUND_ALPHAS on the same coins, told c, v and n_tokens (BayesOptimalK)."""
    def replayed(policy, **more):
        return simulate_policy(policy, alpha, c, v, n_tokens, seed, prompt_len=prompt_len, **more)["speedup"]
    def made(K):
        return policies.make_policy(K, K_max)
    return {**{str(K): replayed(made(K)) for K in Ks}, "heuristic": replayed(made("heuristic")),
            "auto": replayed(made("auto"), c_prior=c_prior, shape=shape),
            "bayes": replayed(BayesOptimalK(BOUND_ALPHAS, [1.0] * len(BOUND_ALPHAS), c, v, K_max))}


def cost_shape_read(target, K_max):  # -> the cost shape auto read last ({M: v_shape(M)}, M = 1..K_max + 1), or None
    shapes = [shape for key, (_, shape) in getattr(target, "cost_shapes", {}).items() if key[0] == K_max + 1]
    return shapes[-1] if shapes else None


def pooled(runs):
    """Runs of one cell as one row: the first run's fields, the rounds and K_counts summed over the
    runs, the median prediction, and exact only if every run was."""
    out = dict(runs[0])
    out["rounds"] = sum(r["rounds"] for r in runs)
    out["K_counts"] = {K: sum(r["K_counts"].get(K, 0) for r in runs)
                       for K in sorted({K for r in runs for K in r["K_counts"]})}
    out["predicted_refined"] = median([r["predicted_refined"] for r in runs])
    out["exact"] = all(r["exact"] for r in runs)
    out["probes"] = ([x for r in runs for x in r["probes"]] if all("probes" in r for r in runs) else  # pooled rows
                     [r["probe_share"] for r in runs if "probe_share" in r])  # runs: the shape's reading's share
    out["prompt_reads"] = ([x for r in runs for x in r["prompt_reads"]] if all("prompt_reads" in r for r in runs) else
                           [[r["prompt_positions"], r["prompt_overlap"], r["prompt_share"]] for r in runs
                            if r.get("prompt_positions")])  # runs that read the prompt: positions, mean beta, share
    return out


def combine(runs):
    """One row from a cell's repeats: median speedup and prediction; rounds and K_counts summed
    over the repeats (each repeat has its own coins, so repeat 0's K usage alone can mislead)."""
    out = pooled(runs)
    out["speedups"] = [r["speedup"] for r in runs]  # one per coin seed, in seed order
    out["spreads"] = [r.get("spread") for r in runs]  # per seed: [lowest, highest] of its runs
    if all("replayed" in r for r in runs):
        out["replays"] = [r["replayed"] for r in runs]  # per seed: what the chain simulator replays (replays)
    if all("bayes_replayed" in r for r in runs):
        out["bayes_replays"] = [r["bayes_replayed"] for r in runs]  # per seed: the Bayes-optimal policy's replay
    if all("replay_costs" in r for r in runs):
        out["replay_costs"] = [r["replay_costs"] for r in runs]  # per seed: the costs and shape auto's replay had
    out["speedup"] = median(out["speedups"])
    out["refined_error"] = None if out["predicted_refined"] is None else out["speedup"] / out["predicted_refined"] - 1
    return out


def run(target, plan, draft_model):
    """{"rows": [...], "drifts": [...]} for every (drafter, alpha, K) of the module docstring. Within a
    group (one repeat, one alpha) the runs' order rotates with the repeat, so that no policy is always
    the one furthest from a baseline."""
    n_prompt = plan.policy_prompt_len or plan.spec_prompt_len
    prompt, N, K_max = random_ids(n_prompt, target.n_vocab, seed=3), plan.policy_tokens, plan.policy_K_max
    sequence = wanted_sequence(target, prompt, baseline_run(target, prompt, N)["tokens"])  # warm-up, what greedy gives
    Ks = list(plan.policy_Ks or range(1, K_max + 1)) + ["heuristic", "auto"] + [READ] * plan.policy_read
    c_prior = draft_model.config.n_params() / target.config.n_params()  # what ModelDrafter assumes
    runs, drifts = {}, []

    def opened(drafter, proxy, K):  # open_run, the target's record of its cost shape first forgotten where asked
        if K in ("auto", READ) and plan.policy_fresh_probe:
            getattr(target, "cost_shapes", {}).clear()  # auto reads the cost shape again, as a fresh process would
        if K != READ:
            return open_run(target, drafter, proxy, prompt, N, K, K_max)
        before, policies.READ_PROMPT = policies.READ_PROMPT, True  # auto, reading the prompt (set as it is built)
        try:
            return open_run(target, drafter, proxy, prompt, N, "auto", K_max)
        finally:
            policies.READ_PROMPT = before

    def forced(name, a, K, seed):  # -> a callable opening one run (a StreamSide) of the forced drafter `name` at alpha a
        def one():
            proxy = TimedProxy(ForcedAcceptanceDraft(draft_model, sequence, a, seed=seed)) if name == "model" else None
            drafter = (ModelDrafter(proxy, c_prior=c_prior) if proxy
                       else ForcedLookupDrafter(sequence, a, target.n_vocab, seed=seed))
            return opened(drafter, proxy, K)
        return (name, a, str(K)), one

    def itself(K):  # the target drafting for itself: the same weights, its own cache (c ~ 1)
        def one():
            proxy = TimedProxy(target)
            return opened(ModelDrafter(proxy, c_prior=1.0), proxy, K)
        return ("self", 1.0, str(K)), one

    n_runs = plan.policy_runs
    for r in range(plan.policy_repeats):
        groups = [(f"alpha {a}", [forced(name, a, K, r) for name in plan.policy_drafters if name != "self" for K in Ks])
                  for a in plan.policy_alphas]
        groups += [("the target drafting for itself", [itself(K) for K in Ks])] if "self" in plan.policy_drafters else []
        for i in range(n_runs):
            turn = r * n_runs + i
            for what, group in groups:
                if not group:
                    continue
                group = group[turn % len(group):] + group[:turn % len(group)]  # rotated with every group's turn
                log(f"policies: seed {r + 1}/{plan.policy_repeats}, run {i + 1}/{n_runs}, {what}: "
                    + (f"{len(group)} runs and plain decoding in lockstep" if plan.policy_lockstep
                       else f"baseline, {len(group)} runs, baseline"))
                rows, drift, (records, t1) = (lockstep_group if plan.policy_lockstep else timed_group)(
                    target, prompt, N, [one for _, one in group])
                drifts.append(drift)
                replayed_group(group, rows, records, t1, r, len(prompt), N, Ks, K_max, c_prior,
                               cost_shape_read(target, K_max))
                for (key, _), row in zip(group, rows):
                    runs.setdefault(key, {}).setdefault(r, []).append(row)
    rows = [{"drafter": name, "alpha_nominal": a, **combine([per_seed(rs) for _, rs in sorted(by_seed.items())]),
             **({"K": READ} if K == READ else {})}  # its runs were opened as "auto"
            for (name, a, K), by_seed in runs.items()]
    return {"n_tokens": N, "K_max": K_max, "Ks": [K for K in Ks if isinstance(K, int)], "rows": rows,
            "drifts": drifts, "runs_per_seed": n_runs, "lockstep": plan.policy_lockstep,
            "fresh_probe": plan.policy_fresh_probe, "blas_kernel": gpt2np.blas_kernel()}


def replayed_group(group, rows, records, t1, seed, prompt_len, N, Ks, K_max, c_prior, shape):
    """Each forced drafter's runs of a group get their replay (row["replayed"]: replays on the group's costs,
    v from all its runs, c from that drafter's); the target drafting for itself has no coins to replay."""
    fixed, v = [K for K in Ks if isinstance(K, int)], group_v(records, t1, K_max, shape)
    for name in dict.fromkeys(key[0] for key, _ in group if key[0] != "self"):
        mine = [record for (key, _), record in zip(group, records) if key[0] == name]
        alpha, c = next(key[1] for key, _ in group if key[0] == name), draft_c(mine, t1)
        replay = replays(alpha, seed, N, prompt_len, fixed, K_max, v, c, c_prior if name == "model" else 0.0, shape)
        for (key, _), row in zip(group, rows):
            if key[0] == name and key[2] in replay:
                row["replayed"] = replay[key[2]]
            if key[0] == name and key[2] == "auto":  # what the replay charged, for the JSON (the first run a seed)
                row["replay_costs"] = {"v": v, "c": c, "shape": shape}
                row["bayes_replayed"] = replay["bayes"]  # what a learner of alpha could do on these coins and costs


READ = "auto read"  # --policy-read: auto with policies.READ_PROMPT set, reading the prompt before its first round


def per_seed(runs):
    """One coin seed's row from its runs (the same coins, each run between its own baselines): the
    median speedup and prediction, the speedups' range, rounds and K_counts summed over the runs
    (the same coins give the same rounds unless auto's clock readings decided otherwise).

    >>> runs = [{"speedup": s, "predicted_refined": 1.0, "exact": True, "rounds": 2, "K_counts": {3: 2}}
    ...         for s in (1.0, 1.3, 1.1)]
    >>> row = per_seed(runs)
    >>> row["speedup"], row["spread"], row["rounds"], row["K_counts"]
    (1.1, [1.0, 1.3], 6, {3: 6})
    """
    out = pooled(runs)
    speedups = [r["speedup"] for r in runs]
    out["speedup"], out["spread"] = median(speedups), [min(speedups), max(speedups)]
    if all("replayed" in r for r in runs):
        out["replayed"] = median([r["replayed"] for r in runs])  # the replays of the seed's runs (replays)
    if all("bayes_replayed" in r for r in runs):
        out["bayes_replayed"] = median([r["bayes_replayed"] for r in runs])
    return out


def bundled_lookup(plan):
    """The real prompt-lookup drafter on the bundled pair, on a prompt whose continuation repeats it:
    the Romeo prompt, the target's own greedy continuation of it, then the Romeo prompt again."""
    from threadpoolctl import threadpool_limits
    if not {"shakespeare-2.6M", "shakespeare-260K"} <= set(gpt2np.bundled_models()):
        return {"skipped": "the bundled pair is not installed"}
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    romeo = target.tokenizer.encode("ROMEO:\nWhat light through yonder window breaks?\n")
    N, rows = 60, []
    with threadpool_limits(limits=1, user_api="blas"):  # as main.py: one thread for models this narrow
        prompt = romeo + generate(target, romeo, 100, temperature=0) + romeo  # 196 tokens, n_ctx 256
        for name in ("ngram", "model"):
            for K in [1, 2, 4, 8, "heuristic", "auto"]:
                runs = []
                for _ in range(plan.policy_repeats + 1):
                    proxy = TimedProxy(draft) if name == "model" else None
                    drafter = ModelDrafter(proxy, c_prior=0.1) if proxy else NgramDrafter(n_max=3)
                    baseline = baseline_run(target, prompt, N)
                    runs.append(measured(run_one(target, drafter, proxy, prompt, N, K, 8), baseline))
                rows.append({"drafter": name, **combine(runs)})
    return {"prompt_tokens": len(prompt), "n_tokens": N, "rows": rows}


def by_drafter_and_alpha(rows):
    """{(drafter, alpha): {str(K): row}}: the sweep's rows, one group per drafter and alpha."""
    by = {}
    for r in rows:
        by.setdefault((r["drafter"], r["alpha_nominal"]), {})[str(r["K"])] = r
    return by


def against_best_fixed(group, Ks, name, field="speedups", reference_field=None):
    """(median, worst) over seeds of policy `name`'s speedup / the best fixed K's on the same coins
    (the best fixed K: the best median; plain decoding, 1.0, where no fixed K beats it); field="replays":
    the same of the runs' replays, the best fixed K still the measured one; field="bayes_replays",
    reference_field="replays": the Bayes-optimal policy's replays over the best fixed K's."""
    best = max(Ks, key=lambda K: group[str(K)]["speedup"])
    reference = group[str(best)][reference_field or field] if group[str(best)]["speedup"] > 1 else \
        [1.0] * len(group[name][field])
    ratios = [x / y for x, y in zip(group[name][field], reference)]
    return median(ratios), min(ratios)


def print_report(result):
    if not result:
        return
    Ks, rows = result.get("Ks") or list(range(1, result["K_max"] + 1)), []
    for (name, a), g in by_drafter_and_alpha(result["rows"]).items():
        fixed = [g[str(K)]["speedup"] for K in Ks]
        worst_err = max(abs(r["refined_error"]) for r in g.values() if r["refined_error"] is not None)
        auto_med, auto_worst = against_best_fixed(g, Ks, "auto")
        heuristic_med, heuristic_worst = against_best_fixed(g, Ks, "heuristic")
        read = [*against_best_fixed(g, Ks, READ), min(g[READ]["speedups"])] if READ in g else []
        replay = list(against_best_fixed(g, Ks, "auto", "replays")) if "replays" in g["auto"] else [None, None]
        bayes = "bayes_replays" in g["auto"]  # the Bayes-optimal policy's replays, over the best fixed K's replays
        replay += list(against_best_fixed(g, Ks, "auto", "bayes_replays", "replays")) if bayes else [None, None]
        rows.append([name, a, *fixed, g["heuristic"]["speedup"], g["auto"]["speedup"], max(max(fixed), 1.0),
                     heuristic_med, heuristic_worst, auto_med, auto_worst, min(g["auto"]["speedups"]), *replay, *read,
                     " ".join(f"{k}:{n}" for k, n in g["auto"]["K_counts"].items()),
                     worst_err, all(r["exact"] for r in g.values())])
    read = any(str(r["K"]) == READ for r in result["rows"])
    seeds = len(next(iter(result["rows"]))["speedups"]) if result["rows"] else 0
    n_runs = result.get("runs_per_seed", 1)
    drifts = result.get("drifts") or [1.0]
    spread = f"{min(drifts):.3f}-{max(drifts):.3f} (median {median(drifts):.3f}, {len(drifts)} groups)"
    drift = (f"\nin lockstep with plain decoding, its baseline: its one-token calls' later half over the earlier {spread}"
             if result.get("lockstep") else
             f"\nplain baselines bracketing each group: the later over the earlier {spread}; each run is measured "
             "against the line between them")
    each = f", each seed the median of {n_runs} runs" if n_runs > 1 else ""
    probes = [x for r in result["rows"] if str(r["K"]) == "auto" for x in r.get("probes", [])]
    drift += (f"\nauto's reading of the target's cost shape before a run: median {100 * median(probes):.2f} %, at most "
              f"{100 * max(probes):.2f} % of its runs' time over {len(probes)} runs ("
              + ("--policy-fresh-probe: read before every run)" if result.get("fresh_probe") else
                 "the model remembers it: later runs of the process read nothing)") if probes else "")
    reads = [x for r in result["rows"] if str(r["K"]) == READ for x in r.get("prompt_reads", [])]
    drift += (f"\nauto read's reading of the prompt before a run: {median([n for n, _, _ in reads]):.0f} positions, mean beta "
              f"{min(b for _, b, _ in reads):.2f}-{max(b for _, b, _ in reads):.2f} over {len(reads)} runs, median "
              f"{100 * median([s for _, _, s in reads]):.2f} % of a run's time (both models' prefill; the target's "
              "counted as the baseline's)" if reads else "")
    print_table(f"K policies: speedup over plain decoding, greedy, {result['n_tokens']} tokens, medians over "
                f"{seeds} coin seed(s){each}; BLAS: {result.get('blas_kernel', 'not recorded')}",
                ["drafter", "alpha", *[f"K={K}" for K in Ks], "heur", "auto", "best", "heur/best", "worst seed",
                 "auto/best", "worst seed", "auto's worst", "replayed", "worst seed", "Bayes", "worst seed",
                 *(["read/best", "worst seed", "read's worst"] if read else []),
                 "auto's K:rounds (all seeds)", "max |err|", "exact"], rows,
                note="model: the pair's draft with forced acceptance; lookup: a drafter of prompt lookup's cost "
                     "(c ~ 0); self: the target\ndrafting for itself (alpha 1, c ~ 1); best: the best fixed K's "
                     "median, or plain decoding (1.0) if no fixed K beats it;\nheur/best, auto/best and worst seed: "
                     "the median and the worst over seeds of the policy / best, seed by seed on the same coins;\n"
                     "replayed: the same as the chain simulator replays the runs on their coins and their group's costs "
                     "(replays; - without coins):\nauto/best well below it is the host's (stalls, spiked readings) or "
                     "what the cost model leaves out (Python's time a round, on small models);\nBayes: the same of "
                     "the Bayes-optimal policy, told c, v and the length, learning alpha from a uniform prior\nover "
                     f"{', '.join(map(str, BOUND_ALPHAS))}: the learner best on average, on these coins "
                     "(a goal above it is met there only by luckier guessing);\n"
                     "max |err|: the largest |measured / refined prediction - 1| over the row's runs" + drift)


def print_bundled(result):
    if not result or "rows" not in result:
        return
    rows = [[r["drafter"], r["K"], r["alpha_hat"], r["c"], r["speedup"], r["predicted_refined"],
             " ".join(f"{k}:{n}" for k, n in r["K_counts"].items()), r["exact"]] for r in result["rows"]]
    print_table(f"Bundled pair, a prompt that repeats ({result['prompt_tokens']} tokens), {result['n_tokens']} "
                "new tokens, greedy: prompt lookup vs the draft model",
                ["drafter", "K", "a_hat", "c", "speedup", "refined", "K:rounds", "exact"], rows)
