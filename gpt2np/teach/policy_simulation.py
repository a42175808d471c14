"""A K policy against a cost model: many coin seeds in a second, no model, no clock.

The policies (decoding/policies.py) see only `past`: the overlaps beta of the positions examined,
the timed target calls by size, and the drafter's cost per drafted token. Here those come from a
model of the run instead of a real one:

  * coins: position i of the output is accepted when coins[i] < alpha, one coin per position,
    drawn once per seed, the same for every K (as bench's forced-acceptance drafter: its q is the
    target's greedy token with probability alpha, so beta is 1 or 0); with prompt_len, the bench's
    own coins for that seed, which index the whole sequence, the prompt first (forced_coins);
  * costs, in one-token target calls: a drafted token costs c, a target call over M tokens v(M).

A round with K drafts then accepts the drafts up to the first failed coin and emits one more
token; its cost is K c + v(K + 1). Plain decoding costs 1 a token. The same arithmetic is
theory.predicted_speedup's, so a policy that always chose the best K would score the refined
prediction; what a policy loses to it is what it pays for learning alpha, c and v. A drafting round
after plain ones also pays the draft's catch-up: its first call feeds the plain rounds' tokens too
(policies.catch_up_cost, at the target's curve shape: c = 0 owes nothing), as a draft model does.

>>> v = {M: 1.0 if M == 1 else 1.3 + 0.08 * (M - 2) for M in range(1, 10)}
>>> run = simulate_policy(make_policy(4), alpha=1.0, c=0.1, v=v, n_tokens=50, seed=0)
>>> run["K_counts"], round(run["speedup"], 3)  # 10 rounds of 5 tokens at 0.4 + 1.54 each
({4: 10}, 2.577)

`python -m gpt2np.teach.policy_simulation` prints auto against the best fixed K for both kernels'
measured v on three CPUs (MEASURED_V), 40 and 100 tokens, alpha 0.3-1 and the drafters of DRAFTERS, 200 seeds;
with --bound, what a Bayes-optimal policy that knows c, v, the length and a five-point prior over
alpha gets (bayes_optimal_costs): the most any policy can hope for from the first rounds' coins (with --seeds 10
or fewer, also that policy played on each of the bench's coin sequences: BayesOptimalK);
with --told-v, auto with no shape of the curve, with the shape a probe reads before the run
(probed_shape), and told the true v(M) from its first round (ToldCostsAutoK): what learning the
cost curve costs it on the Xeon's 1558M curve. The default table and --told-v run on the bench's own
coins (seed s is the policies section's coin seed s, after its 8-token prompt: forced_coins), with the
c each drafter assumes until it times a draft (DRAFTERS). The default table gives auto a probed
shape, as a GPT2 target of these sizes reads one; --no-probe gives it none (a toy target, a short run
at 124M). --cpu "Zen4 panels" puts --bound or --told-v on another CPU's 1558M curves, --seeds 5 (with
--told-v) on the bench's five coin sequences (seeds 0-4), each shown.
"""
from functools import lru_cache
from math import comb
from types import SimpleNamespace

import numpy as np

from ..decoding.drafters import parameter_ratio
from ..decoding.policies import PROMPT_POSITIONS, AutoK, Measurements, catch_up_cost, make_policy
from ..decoding.stream import RoundEvent
from ..decoding.theory import expected_speedups_under_belief
from ..model.config import PRESETS
from ..report import OneLineErrorParser
from .batch_simulation import log_noise, noise_arg, posterior_table


PROMPT_LEN = 8  # the bench's policies section's prompt (bench.common's spec_prompt_len): its replays' prompt_len
BOUND_ALPHAS = (0.3, 0.45, 0.6, 0.8, 1.0)  # the Bayes-optimal policy's prior: these alphas, each as likely (--bound,
                                           # the bench's "Bayes" replay)


def forced_coins(n_tokens, alpha, seed, prompt_len=0):
    """accepted[i]: whether a draft for output position i would be accepted (one coin per position).

    prompt_len = 0: the seed's stream from its first draw (the simulator's own coins). prompt_len = P: the
    coins bench's forced drafters draw for coin seed `seed` after a P-token prompt (forced_draft.py's
    ForcedChoices: one draw per position of the whole sequence, the prompt's first), so that a run here
    replays the bench's run on the same coins.

    >>> own, bench = forced_coins(6, 0.5, seed=0), forced_coins(4, 0.5, seed=0, prompt_len=2)
    >>> bench.tolist() == own[2:].tolist()   # the output's coins start after the prompt's
    True
    """
    return np.random.default_rng(seed).random(prompt_len + n_tokens)[prompt_len:] < alpha  # [n_tokens]


PROBE_NOISE = 0.06  # one probe's v_shape(M) against the pass's v(M): lognormal, per size (model/cost_probe.py; at
                    # 1558M three readings a size read within 3-8 % of the median of five probes, and the block's
                    # median curve within 0-8 % of the whole pass's: PERFORMANCE.md, "The cost curve's shape")


def probed_shape(v, seed, noise=PROBE_NOISE):  # -> {M: v_shape(M)}: v as one probe before a run reads it
    """v(M) with independent lognormal noise per size M >= 2 (v_shape(1) = 1), drawn from the seed's own stream."""
    rng = np.random.default_rng(20_000 + seed)
    return {M: 1.0 if M == 1 else x * float(rng.lognormal(0.0, noise)) for M, x in v.items()}


PROMPT_READ_COST = 1.0  # one-token target calls a read of the prompt adds (speculative.read_prompt): the target's
                        # prefill of prompt[:-1] becomes a call of its own, where the first round's call carried it;
                        # at 1558M and 40 tokens the read's runs fell 4-8 % below their refined prediction at alpha
                        # 0.8-1, against auto's own (PERFORMANCE.md, "A draft that is never rejected")


def prompt_coins(n, alpha, seed, prompt_len=0):  # -> [n] beta at the prompt's positions read first (0.0 or 1.0)
    """What auto reads at n prompt positions when the drafter agrees there at rate alpha too, as bench's forced
    drafters do (forced_draft.py: the target's greedy token at a prompt position w.p. alpha), from its own stream;
    with prompt_len = P, the bench's coins at the prompt's last n positions (before the output's: forced_coins)."""
    if prompt_len:
        if not 0 <= n < prompt_len:
            raise ValueError(f"a prompt of {prompt_len} tokens has {prompt_len - 1} positions to read, not {n}")
        return [float(x) for x in np.random.default_rng(seed).random(prompt_len)[prompt_len - n:] < alpha]
    return [float(x) for x in np.random.default_rng(30_000 + seed).random(n) < alpha]


def simulate_policy(policy, alpha, c, v, n_tokens, seed, drift=None, probe=False, prompt=0, prompt_len=0,
                    c_prior=None, noise=None, shape=None):
    """Run `policy` for n_tokens: {"speedup" over plain decoding, "K_counts", "rounds"}.

    v: {M: cost of an M-token target call in one-token calls}, M = 1..K_max + 1. As in the real
    loop (speculative.observe), the first round's target call carries the prompt and is not shown
    to the policy; every later call is, with the drafter's cost once it has drafted. drift: None,
    or round -> the factor by which the machine's speed distorts the timings the policy sees in
    that round (a shared machine's minute-to-minute drift; the costs counted stay c and v).
    probe: the target read its cost curve's shape before the run, as a GPT2 does for auto
    (past.v_shape = probed_shape(v, seed); its time is not counted, at most 1 % of a plain run).
    prompt: the positions of the prompt (its length - 1) whose overlaps auto (a policy with
    prompt_positions) reads before the run, at most PROMPT_POSITIONS (prompt_coins), as it does with
    policies.READ_PROMPT set; the read costs PROMPT_READ_COST. prompt_len > 0: the bench's coins for this seed
    after a prompt of that length (forced_coins, prompt_coins). c_prior: the c the policy assumes until the
    drafter's first call is timed (default c; a ModelDrafter assumes its parameter ratio: C_PRIOR).
    noise: None, every reading is its true cost (times the drift); a log-standard deviation, or "spiky"
    (batch_simulation.SPIKES: late far more often than early, as this EPYC's 1558M rounds read), for each
    round's target call and drafting cost as the policy reads them, drawn from the seed's second stream
    (the coins and the costs counted stay as they are). shape: the cost shape the policy reads before the run, as a
    real run's probe read it (bench/policies.py's replays), in place of probe's.
    """
    accepted = forced_coins(n_tokens, alpha, seed, prompt_len)  # [n_tokens]
    readings, log = np.random.default_rng([seed, 1]), log_noise(noise)
    read = (lambda x: x * float(np.exp(log(readings)))) if log else (lambda x: x)  # what the policy reads of x
    past = Measurements(c_prior=c if c_prior is None else c_prior)
    past.v_shape = shape if shape is not None else probed_shape(v, seed) if probe else None
    reads = prompt and hasattr(policy, "prompt_positions")  # auto, whether or not READ_PROMPT is set for real runs
    past.prompt_overlaps = prompt_coins(min(prompt, PROMPT_POSITIONS), alpha, seed, prompt_len) if reads else []
    policy.reset()
    emitted, cost, K_counts = 0, PROMPT_READ_COST if past.prompt_overlaps else 0.0, {}
    while emitted < n_tokens:
        past.tokens_left = n_tokens - emitted
        K = min(policy.choose(past), n_tokens - emitted - 1)  # clamped: never past n_tokens
        n_ok = first_failure(accepted[emitted:emitted + K])
        decisions = [True] * n_ok + [False] * (n_ok < K)      # the positions the round examined
        past.overlaps += [float(d) for d in decisions]
        policy.update(RoundEvent(tokens=[0] * (n_ok + 1), provenance=[], K=K, n_emitted=emitted + n_ok + 1,
                                 drafts=[0] * K, decisions=decisions))  # what the heuristic learns from
        debt = catch_up_cost(c, v, past.owed) if K else 0.0   # the plain rounds' tokens, fed by its first call
        if K_counts:                                          # not the first round (the prompt's, or after its prefill)
            seen = drift(sum(K_counts.values())) if drift else 1.0
            past.add_target_call(K + 1, read(v[K + 1] * seen))
            if K and past.owed <= 1:                          # as speculative.observe: no c from a catch-up
                past.add_draft_cost(read(c * seen))
        past.owed = 0 if K else past.owed + 1
        K_counts[K] = K_counts.get(K, 0) + 1
        emitted, cost = emitted + n_ok + 1, cost + K * c + v[K + 1] + debt
    return {"speedup": n_tokens / cost, "K_counts": dict(sorted(K_counts.items())),
            "rounds": sum(K_counts.values())}


def first_failure(coins):
    """How many leading coins are True: the accepted drafts of a round."""
    failed = np.flatnonzero(~coins)
    return int(failed[0]) if failed.size else len(coins)


def compare_policies(alpha, c, v, n_tokens, seeds, K_max=8, policies=("auto", "heuristic"), probe=False, prompt=0,
                     prompt_len=0):
    """For each seed: every fixed K 1..K_max and the named policies, as speedups over plain decoding
    (probe, prompt: what the named policies' runs read first; prompt_len: the bench's coins, simulate_policy).

    Returns {"fixed": {K: [speedup per seed]}, name: [speedup per seed], "best_fixed": [...]}:
    best_fixed is, per seed, the best fixed K's speedup (an oracle that knew the seed's coins).
    """
    out = {"fixed": {K: [simulate_policy(make_policy(K), alpha, c, v, n_tokens, s, prompt_len=prompt_len)["speedup"]
                         for s in seeds] for K in range(1, K_max + 1)}}
    for name in policies:
        out[name] = [simulate_policy(make_policy(name, K_max), alpha, c, v, n_tokens, s, probe=probe, prompt=prompt,
                                     prompt_len=prompt_len)["speedup"]
                     for s in seeds]
    out["best_fixed"] = [max(out["fixed"][K][i] for K in out["fixed"]) for i in range(len(seeds))]
    return out


class GreedyAutoK(AutoK):
    """The negative control: auto's plan at the belief's mean, without optimism (K = 0 included).

    Plain rounds examine no position, so once its belief says plain it never learns otherwise:
    after an unlucky start it stops drafting for the rest of the run. auto's optimism is the fix.
    """

    def choose(self, past):
        (a, b), c, v = self.estimates(past)
        planned = expected_speedups_under_belief(a, b, c, v, self.K_max)
        return max(range(self.K_max + 1), key=planned.__getitem__)


class ToldCostsAutoK(AutoK):
    """auto told the true cost curve v(M) at every size from its first round (its belief about alpha
    still learned): the simulation's measure of what learning v costs auto (PERFORMANCE.md, "K
    policies, sixth look"). Not a policy for real runs: no run knows its v before timing it."""

    def __init__(self, v, K_max=8):
        super().__init__(K_max)
        self.true_v, self.name = dict(v), "auto told v"

    def estimates(self, past):
        belief, c, _ = super().estimates(past)
        return belief, c, self.true_v


# v(M) measured per CPU, BLAS kernel and target size (PERFORMANCE.md; sizes not measured are interpolated).
# EPYC, the AMD EPYC (AVX-512) of the first sessions: 1558M SkylakeX "K policies, third look" (v(2) 1.2,
# v(5) 1.42), 1558M Haswell `rows` (v(2) 1.36, v(3) 1.52, v(5) 1.85, v(8) 2.23), 355M SkylakeX the
# verification curve, 355M Haswell `rows`. Xeon, an Intel Xeon (Sapphire Rapids, AVX-512), 1558M,
# `python -m bench --sections kernels --kernel-sizes 1558M`: steeper, and not monotonic (under Haswell
# 8 rows take plain sgemm, cheaper than 7 or 9; under SkylakeX v(4) < v(3) and v(8) < v(7)), so the best
# K is where the curve dips (K = 3 or 7), which a line through the timed sizes does not see. Zen5, an AMD EPYC
# of family 26 (AVX-512), 1558M, `python tools/kernel_ab.py --size 1558M --rows 1,2,3,4,5,6,7,8,9 --pairs 6
# --context 64` (2026-11-27, session 37): a 6-row pass no dearer than a 5-row one under SkylakeX, 4 rows cheaper
# than 3 under Haswell; the same command read other dips a day earlier (PERFORMANCE.md, "K policies, eighth look").
# Zen4, an AMD EPYC of family 25 (AVX-512), the same command (2026-11-28, sessions 39 and 40): the weights as stored
# (column-major), and "Zen4 panels", the weights in panels, as a model loads under SkylakeX since session 40
# (`--order panels` today): v(2) under 1 (one row is padded to two there), 6 rows no dearer than 5, 8 than 7, and a
# step at 9 (PERFORMANCE.md, "K policies, eleventh look"). "Zen4 panels s57", the same machine and command with
# `--order panels` two days on (2026-11-30, session 57), each size the median of three runs (seeds 0-2): flatter to
# 6 rows (v(5) 1.01), 7 rows the step (1.10, 1.47, 1.31 in the three), 9 rows 1.17-1.36. Every other SkylakeX curve
# here is the stored order's.
MEASURED_V = {
    ("EPYC", "SkylakeX", "1558M"): (1.2, 1.27, 1.35, 1.42, 1.49, 1.56, 1.63, 1.7),
    ("EPYC", "Haswell", "1558M"): (1.36, 1.52, 1.69, 1.85, 1.98, 2.1, 2.23, 2.35),
    ("EPYC", "SkylakeX", "355M"): (1.39, 1.40, 1.37, 1.50, 1.60, 1.77, 1.75, 2.01),
    ("EPYC", "Haswell", "355M"): (1.49, 1.56, 1.68, 1.79, 2.05, 2.30, 2.41, 2.62),
    ("Xeon", "SkylakeX", "1558M"): (1.23, 1.44, 1.41, 1.66, 1.77, 2.01, 1.91, 2.17),
    ("Xeon", "Haswell", "1558M"): (1.48, 1.78, 1.89, 2.16, 2.39, 2.53, 2.52, 3.07),
    ("Zen5", "SkylakeX", "1558M"): (1.15, 1.29, 1.33, 1.58, 1.69, 1.78, 1.68, 1.81),
    ("Zen5", "Haswell", "1558M"): (1.30, 1.46, 1.42, 1.56, 1.82, 2.01, 2.04, 2.37),
    ("Zen4", "SkylakeX", "1558M"): (1.15, 1.28, 1.25, 1.41, 1.36, 1.46, 1.55, 1.65),
    ("Zen4 panels", "SkylakeX", "1558M"): (0.93, 1.11, 1.18, 1.21, 1.18, 1.30, 1.26, 1.52),
    ("Zen4 panels s57", "SkylakeX", "1558M"): (0.99, 1.08, 1.07, 1.01, 1.06, 1.31, 1.14, 1.33),
}


def preset_c_prior(draft, target):  # preset names -> the c a ModelDrafter assumes until it times a draft
    """drafters.parameter_ratio of two presets' models: the draft's parameters over the target's.

    >>> round(preset_c_prior("124M", "1558M"), 4)
    0.0799
    """
    return parameter_ratio(*(SimpleNamespace(config=PRESETS[name]) for name in (draft, target)))


DRAFTERS = (("1558M", "124M", 0.09, preset_c_prior("124M", "1558M")), ("1558M", "lookup", 0.0, 0.0),
            ("355M", "124M", 0.3, preset_c_prior("124M", "355M")), ("355M", "lookup", 0.0, 0.0))
# target, drafter, c as measured, and c_prior: the c the drafter assumes until it times a draft (lookup: 0)
C_PRIOR = DRAFTERS[0][3]  # a 124M ModelDrafter's for a 1558M target


def measured_v(kernel, target, cpu="EPYC"):
    """{M: v(M)} for M = 1..9 from MEASURED_V."""
    return {1: 1.0, **{M: x for M, x in enumerate(MEASURED_V[cpu, kernel, target], start=2)}}


def table_rows(policies, alpha, c, v, n_tokens, seeds, probes=None, prompt=0, prompt_len=0, c_prior=None, noise=None):
    """A row for each policy: the best fixed K by median (0 = plain decoding, where no K beats it; the fixed Ks
    simulated once) and the policy's speedups over it seed by seed, and over plain decoding;
    probes: for each policy, whether its runs read the curve's shape first (default: none do); prompt: the
    prompt positions there are to read; prompt_len, c_prior, noise: the bench's coins, the drafter's first c and
    the policies' readings (simulate_policy)."""
    runs = compare_policies(alpha, c, v, n_tokens, seeds, policies=(), prompt_len=prompt_len)
    medians = {K: np.median(s) for K, s in runs["fixed"].items()}
    best = max(medians, key=medians.get)
    best = best if medians[best] > 1.0 else 0
    reference = np.array(runs["fixed"][best]) if best else np.ones(len(seeds))  # [seeds]
    rows = []
    for policy, probe in zip(policies, probes or [False] * len(policies)):
        mine = np.array([simulate_policy(policy, alpha, c, v, n_tokens, s, probe=probe, prompt=prompt,
                                         prompt_len=prompt_len, c_prior=c_prior, noise=noise)["speedup"]
                         for s in seeds])  # [seeds]
        ratio = mine / reference
        rows.append({"best_K": best, "best_median": float(np.median(reference)), "median": float(np.median(ratio)),
                     "p5": float(np.quantile(ratio, 0.05)), "worst": float(ratio.min()),
                     "worst_of_plain": float(mine.min()), "ratios": [float(x) for x in ratio]})
    return rows


def print_table(policy, seeds, alphas=(0.3, 0.6, 0.8, 1.0), tokens=(40, 100), probe=True, prompt=0, noise=None):
    """The markdown table of `policy` against the best fixed K, every measured curve x drafter x tokens x alpha
    (probe: each run reads the curve's shape first, as a real one of these sizes does; prompt: a model drafter's
    runs read that many prompt positions first, as a draft model's do; prompt lookup reads none), on the bench's
    coins after its prompt (PROMPT_LEN tokens, or one more than the positions read) with each drafter's c_prior
    (noise: the readings', simulate_policy)."""
    prompt_len = max(PROMPT_LEN, prompt + 1)
    print("| cpu | kernel | target | drafter (c) | tokens | alpha | best fixed K (median) | auto / best: median"
          " | 5 % of seeds | worst seed | auto / plain: worst seed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cpu, kernel in dict.fromkeys((cpu, kernel) for cpu, kernel, _ in MEASURED_V):
        for target, drafter, c, c_prior in DRAFTERS:
            if (cpu, kernel, target) not in MEASURED_V:
                continue
            for n_tokens in tokens:
                for alpha in alphas:
                    r = table_rows((policy,), alpha, c, measured_v(kernel, target, cpu), n_tokens, seeds, (probe,),
                                   prompt if drafter != "lookup" else 0, prompt_len, c_prior, noise)[0]
                    best = f"K={r['best_K']} {r['best_median']:.2f}" if r["best_K"] else "plain"
                    print(f"| {cpu} | {kernel} | {target} | {drafter} ({c}) | {n_tokens} | {alpha} | {best} "
                          f"| {r['median']:.3f} | {r['p5']:.3f} | {r['worst']:.3f} | {r['worst_of_plain']:.3f} |")


def bayes_optimal_plan_reference(alphas, prior, c, v, K_max=8):  # -> plan(n, s, f) -> (expected cost [A], K)
    """The Bayes-optimal K policy for a prior over the given alphas only, which knows c and v: plan(n, s, f),
    with n tokens left and s accepted and f rejected positions seen, gives the expected cost (one-token calls)
    of the rest of the run at each alpha and the K that achieves it (dynamic programming, by recursion; cached).
    The slow reference of bayes_optimal_plan: a state at a time, as the recurrence reads."""
    alphas, prior = np.array(alphas, dtype=float), np.array(prior, dtype=float)  # [A], [A]

    @lru_cache(maxsize=None)
    def plan(n, s, f):  # -> ([A], K)
        if n == 0:
            return np.zeros(len(alphas)), 0
        belief = prior * alphas ** s * (1 - alphas) ** f
        belief = belief / belief.sum() if belief.sum() > 0 else prior  # the posterior ([A]; any, where impossible)
        best, best_K = None, 0
        for K in range(min(K_max, n - 1) + 1):
            total = np.full(len(alphas), K * c + v[K + 1])
            for j in range(K + 1):  # j drafts accepted: probability alpha^j (1 - alpha) or alpha^K
                total = total + alphas ** j * ((1 - alphas) if j < K else 1) * plan(n - j - 1, s + j, f + (j < K))[0]
            if best is None or belief @ total < belief @ best - 1e-12:
                best, best_K = total, K
        return best, best_K

    return plan


def bayes_optimal_plan(alphas, prior, c, v, K_max=8):  # -> plan(n, s, f) -> (expected cost [A], K)
    """bayes_optimal_plan_reference's plan, solved a level of tokens left at a time over every (s, f) at once.

    With N tokens in all, n left, s accepted and f rejected positions seen satisfy s + f <= N - n (each
    rejection ends a round, and a round emits a token more than it accepts), so level n's table is
    [A, N - n + 1, N - n + 1]; a round of K drafts at level n reads levels n - 1 .. n - K - 1 at (s + j, f + 1)
    and (s + K, f), inside theirs. The work is ~N^3 / 3 states x 45 terms as array arithmetic: 100 tokens in
    well under a second where the recursion takes half a minute. A state past the levels solved (a longer run,
    or a prompt's positions read first: n + s + f > N) solves them again for N = n + s + f.

    >>> v = {M: 1.0 if M == 1 else 1.3 + 0.08 * (M - 2) for M in range(1, 10)}
    >>> fast, slow = (solve([0.3, 0.8, 1.0], [1, 1, 1], 0.1, v) for solve in (bayes_optimal_plan,
    ...                                                                       bayes_optimal_plan_reference))
    >>> [(fast(12, s, f)[1], slow(12, s, f)[1]) for s, f in ((0, 0), (3, 0), (0, 3))]  # the K of each state
    [(3, 3), (5, 5), (0, 0)]
    >>> float(abs(fast(12, 0, 0)[0] - slow(12, 0, 0)[0]).max()) < 1e-12
    True
    """
    alphas, prior = np.array(alphas, dtype=float), np.array(prior, dtype=float)  # [A], [A]
    a = alphas[:, None, None]                                                     # [A, 1, 1]
    solved = {"N": -1}

    def belief(g):  # -> [A, g, g]: the posterior over alphas after s accepted and f rejected positions
        return posterior_table(alphas, prior, g)

    def solve(N):
        costs, Ks = [np.zeros((len(alphas), N + 1, N + 1))], [np.zeros((N + 1, N + 1), dtype=int)]
        for n in range(1, N + 1):
            g = N - n + 1                                                         # s, f = 0 .. N - n
            w = belief(g)                                                         # [A, g, g]
            best, best_K, best_mean = None, np.zeros((g, g), dtype=int), None
            for K in range(min(K_max, n - 1) + 1):
                total = np.full((len(alphas), g, g), K * c + v[K + 1])            # [A, g, g]
                for j in range(K + 1):  # j drafts accepted: probability alpha^j (1 - alpha), or alpha^K
                    rejected = j < K
                    later = costs[n - j - 1][:, j:j + g, int(rejected):int(rejected) + g]  # [A, g, g]
                    total = total + a ** j * ((1 - a) if rejected else 1) * later
                mean = (w * total).sum(axis=0)                                    # [g, g]
                if best is None:
                    best, best_mean = total, mean
                    continue
                better = mean < best_mean - 1e-12                                 # the first minimum: fewest drafts
                best, best_mean = np.where(better, total, best), np.where(better, mean, best_mean)
                best_K = np.where(better, K, best_K)
            costs.append(best)
            Ks.append(best_K)
        solved.update(N=N, costs=costs, Ks=Ks)

    def plan(n, s, f):  # -> ([A], K)
        if n + s + f > solved["N"]:
            solve(n + s + f)
        return solved["costs"][n][:, s, f], int(solved["Ks"][n][s, f])

    return plan


def bayes_optimal_costs(alphas, prior, c, v, n_tokens, K_max=8, prompt=0, plan=None):
    """Expected cost (one-token calls) of n_tokens at each alpha under the Bayes-optimal K policy for a
    prior over the given alphas only, which knows c, v and n_tokens (bayes_optimal_plan): a bound no
    causal policy beats on average over that prior. [len(alphas)]

    prompt > 0: the policy first reads that many prompt positions, each accepted with probability
    alpha (prompt_coins), free of cost: the run starts from their successes and failures, and its
    expected cost is averaged over the binomial law of those. plan: bayes_optimal_plan's for these alphas, prior,
    c, v and K_max, where the caller has one already (the dynamic programme is then not solved again).

    >>> v = {M: 1.0 if M == 1 else 1.3 + 0.08 * (M - 2) for M in range(1, 10)}
    >>> [round(float(x), 2) for x in bayes_optimal_costs([1.0], [1.0], 0.1, v, 10)]  # K = 8, then plain
    [3.66]
    >>> no_read, read = (bayes_optimal_costs([0.3, 1.0], [1, 1], 0.1, v, 20, prompt=P) for P in (0, 7))
    >>> [round(float(x), 2) for x in no_read - read]  # what the read saves: at alpha 0.3, the early tries
    [0.28, 0.0]
    """
    alphas, plan = np.array(alphas, dtype=float), plan or bayes_optimal_plan(alphas, prior, c, v, K_max)  # [A]
    return sum(comb(prompt, s) * alphas ** s * (1 - alphas) ** (prompt - s) * plan(n_tokens, s, prompt - s)[0]
               for s in range(prompt + 1))  # [A]: with no read (prompt 0) plan(n_tokens, 0, 0)


class BayesOptimalK:
    """The Bayes-optimal policy (bayes_optimal_plan) as a K policy, for the simulator only: it is told c, v and
    the run's length, so no real run can play it. Played on given coins it says what the learner of alpha that is
    best on average does on those coins, where the bound says it over the prior (print_bound, seed by seed)."""

    def __init__(self, alphas, prior, c, v, K_max=8, plan=None):  # plan: bayes_optimal_plan's, where one is at hand
        self.plan, self.name = plan or bayes_optimal_plan(alphas, prior, c, v, K_max), "Bayes-optimal"

    def reset(self):
        pass

    def choose(self, past):
        s = round(sum(past.overlaps))  # the simulator's overlaps are 1 or 0
        return self.plan(past.tokens_left, s, len(past.overlaps) - s)[1]

    def update(self, event):
        pass


def print_bound(kernel, n_tokens, alphas=BOUND_ALPHAS, seeds=range(200), cpu="EPYC", prompt=0):
    """The Bayes-optimal policy's expected cost against the best fixed K's (or plain decoding's), per
    alpha, for a 124M draft into 1558M under `kernel` and a uniform prior over `alphas`; prompt > 0: the
    policy reads that many prompt positions first (bayes_optimal_costs), at PROMPT_READ_COST. With 10 seeds or
    fewer and no read, also the policy played on the bench's coins for those seeds (BayesOptimalK), seed by seed
    over the fixed K with the best median there: what any learner of alpha could hope for on those very coins."""
    v, c, prior = measured_v(kernel, "1558M", cpu), 0.09, [1.0] * len(alphas)
    plan = bayes_optimal_plan(alphas, prior, c, v)  # solved once: for the bound and for the policy on the coins
    optimal = bayes_optimal_costs(alphas, prior, c, v, n_tokens, prompt=prompt, plan=plan) + \
        (PROMPT_READ_COST if prompt else 0.0)  # [A]
    for alpha, cost in zip(alphas, optimal):
        fixed = compare_policies(alpha, c, v, n_tokens, seeds, policies=())["fixed"]
        reference = min([n_tokens] + [np.mean([n_tokens / x for x in s]) for s in fixed.values()])
        read = f", {prompt} prompt positions read" if prompt else ""
        each = ""
        if len(seeds) <= 10 and not prompt:
            row = table_rows((BayesOptimalK(alphas, prior, c, v, plan=plan),), alpha, c, v, n_tokens, seeds,
                             prompt_len=PROMPT_LEN)[0]
            best = f"K = {row['best_K']}" if row["best_K"] else "plain decoding"
            each = (f"; on the bench's coins, over {best}: " + ", ".join(f"{x:.3f}" for x in row["ratios"])
                    + f" (median {row['median']:.3f})")
        print(f"{cpu} {kernel}, {n_tokens} tokens{read}, alpha {alpha}: Bayes-optimal / best (expected cost) "
              f"{reference / cost:.3f}{each}")


def print_learning_cost(cpu="Xeon", kernel="SkylakeX", c=0.09, seeds=range(200), alphas=(0.3, 0.8, 1.0),
                        tokens=(40, 100), prompt=0, noise=None):
    """auto without the curve's shape (a line through the sizes it times), auto with a probed shape (as a
    GPT2 target reads it: probed_shape) and ToldCostsAutoK, on one measured 1558M curve: each over the
    best fixed K (plain decoding where none beats it), median and worst seed; with 10 seeds or fewer,
    each seed's too. Every run replays the bench's policies section: its coins for seeds 0, 1, ... after its
    prompt (PROMPT_LEN tokens, or one more than the positions read), and the c its 124M drafter assumes
    until it times a draft (C_PRIOR).
    prompt > 0: a fourth column, auto with a probed shape that also reads that many prompt positions first.
    noise: the readings every policy sees (simulate_policy; told v's only through c)."""
    v = measured_v(kernel, "1558M", cpu)
    bench = dict(prompt_len=max(PROMPT_LEN, prompt + 1), c_prior=C_PRIOR, noise=noise)
    read = f" | shape probed, {prompt} prompt positions read: median / worst" if prompt else ""
    print(f"| {cpu} {kernel} 1558M, c {c}: tokens | alpha | auto, no shape: median / worst "
          f"| auto, shape probed: median / worst{read} | told v: median / worst |")
    print("| --- | --- | --- | --- | --- |" + (" --- |" if prompt else ""))
    for n_tokens in tokens:
        for alpha in alphas:
            policies, probes = (AutoK(8), AutoK(8), ToldCostsAutoK(v)), (False, True, False)
            rows = table_rows(policies, alpha, c, v, n_tokens, seeds, probes=probes, **bench)
            if prompt:
                rows.insert(2, table_rows((AutoK(8),), alpha, c, v, n_tokens, seeds, (True,), prompt, **bench)[0])
            each = "".join(f" ({', '.join(f'{x:.3f}' for x in r['ratios'])})" if len(seeds) <= 10 else ""
                           for r in rows)
            print(f"| {n_tokens} | {alpha} | " + " | ".join(f"{r['median']:.3f} / {r['worst']:.3f}" for r in rows)
                  + f" |{each}")


def main(argv=None):
    """python -m gpt2np.teach.policy_simulation [--bound | --told-v | --no-probe] [--cpu CPU] [--seeds N]
    [--prompt N] [--noise SIGMA | spiky]"""
    curves = sorted({cpu for cpu, _, _ in MEASURED_V})
    p = OneLineErrorParser(prog="python -m gpt2np.teach.policy_simulation", description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--bound", action="store_true", help="the Bayes-optimal policy against the best fixed K")
    mode.add_argument("--told-v", action="store_true", help="auto without the curve's shape, with a probed one, and "
                      "told the true v(M) (ToldCostsAutoK)")
    p.add_argument("--no-probe", action="store_true", help="the default table with auto given no shape (a target "
                   "that cannot read one: a toy model, or a run too short for it)")
    p.add_argument("--cpu", choices=curves, help="--bound / --told-v: one CPU's 1558M curves (MEASURED_V) "
                   "instead of the default ones (the Xeon's for --told-v)")
    p.add_argument("--seeds", type=int, default=200, help="coin seeds 0..N-1 (default 200; N <= 10: each seed shown)")
    p.add_argument("--prompt", type=int, default=0, help="prompt positions a draft model's auto reads before the run "
                   "(its prompt's length - 1, at most policies.PROMPT_POSITIONS; the bench's prompt: 7); default 0, "
                   "none (with --told-v: a fourth column; with --bound: the bound with that read)")
    p.add_argument("--noise", type=noise_arg, default=None, help="the readings auto sees: a log-standard deviation, "
                   "or 'spiky' for one-sided spikes as measured at 1558M (batch_simulation.SPIKES); default: none "
                   "(not with --bound, whose policy reads no clock)")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.no_probe and (args.bound or args.told_v):
        p.error("--no-probe goes with the default table (--told-v shows both; --bound has no auto)")
    if args.noise is not None and args.bound:
        p.error("--noise goes with the default table or --told-v (--bound's policy reads no clock)")
    if not 0 <= args.prompt <= PROMPT_POSITIONS:
        p.error(f"--prompt must be 0 to {PROMPT_POSITIONS} (policies.PROMPT_POSITIONS: the most positions auto "
                f"reads), got {args.prompt}")
    seeds = range(args.seeds)
    if args.told_v:
        print_learning_cost(**({"cpu": args.cpu} if args.cpu else {}), seeds=seeds, prompt=args.prompt,
                            noise=args.noise)
    elif args.bound:
        runs = (("EPYC", "SkylakeX", 40), ("EPYC", "Haswell", 40), ("EPYC", "Haswell", 100),
                ("Xeon", "SkylakeX", 40), ("Xeon", "Haswell", 40))
        if args.cpu:
            runs = [(args.cpu, kernel, n) for kernel in ("SkylakeX", "Haswell")
                    if (args.cpu, kernel, "1558M") in MEASURED_V for n in (40, 100)]
        for cpu, kernel, n in runs:
            print_bound(kernel, n, seeds=seeds, cpu=cpu, prompt=args.prompt)
    else:
        if args.cpu:
            p.error("--cpu goes with --bound or --told-v")
        print_table(AutoK(8), seeds, probe=not args.no_probe, prompt=args.prompt, noise=args.noise)


if __name__ == "__main__":  # python -m gpt2np.teach.policy_simulation [--bound | --told-v] [--cpu CPU]: 200 seeds (~45 s)
    main()
