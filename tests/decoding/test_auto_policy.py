"""auto K: its rule against theory, that it never locks drafting out, that it stops drafting where
drafting cannot pay, and what it earns against every fixed K under a cost model (many coin seeds).

Its exactness is proved with the other policies' (test_drafters_policies.py: exact enumeration
with a scripted clock, greedy equality, caches against recomputation).
"""
import numpy as np
import pytest

from gpt2np.decoding import policies
from gpt2np.decoding.policies import (ALPHA_PRIOR, FIRST_ROUND_RISK, MARGINAL, PERFECT_DRAFT, PROMPT_WEIGHT,
                                      STALE_CALLS, TIMING_MARGIN, AutoK, Measurements, first_round_cap,
                                      optimistic_alpha, perfect_draft_weight, prior_v_curve)
from gpt2np.decoding.theory import expected_speedups_under_belief, predicted_speedups
from gpt2np.teach.policy_simulation import GreedyAutoK, compare_policies, measured_v, simulate_policy

V_SKYLAKEX, V_HASWELL = measured_v("SkylakeX", "1558M"), measured_v("Haswell", "1558M")  # measured, 1558M, EPYC


def timed(v, t1=10.0):
    """target_durations whose medians give the curve v exactly."""
    return {M: [t1 * x] * 3 for M, x in v.items()}


def test_expected_speedups_under_belief_are_the_average_of_the_curve_over_the_beta():
    """Against Monte Carlo over alpha ~ Beta(a, b) (200,000 draws: tolerance 5 standard errors)."""
    rng, v = np.random.default_rng(0), prior_v_curve(9)
    for a, b, c in [(1.5, 1.0, 0.1), (8.0, 3.0, 0.35), (30.0, 70.0, 0.0)]:
        alphas = rng.beta(a, b, 200_000)
        draws = np.array([predicted_speedups(x, c, v, 8) for x in alphas[:20_000]])  # [n, K_max + 1]
        closed = np.array(expected_speedups_under_belief(a, b, c, v, 8))
        tolerance = 5 * draws.std(axis=0) / np.sqrt(len(draws))
        assert np.all(np.abs(draws.mean(axis=0) - closed) <= tolerance + 1e-12), (a, b, draws.mean(0) - closed)


def test_auto_plans_with_the_belief_and_drafts_only_where_it_pays():
    for overlaps, cost, expected_draft in [([0.9] * 2000, 0.9, True), ([0.3] * 2000, 0.9, False),
                                          ([0.3] * 2000, 3.5, False), ([0.6] * 2000, 0.0, True)]:
        past = Measurements(overlaps=overlaps, target_durations=timed(V_HASWELL), draft_cost=cost)
        policy = AutoK(K_max=8)
        (a, b), c, v = policy.estimates(past)
        assert (a, b) == (ALPHA_PRIOR[0] + sum(overlaps), ALPHA_PRIOR[1] + len(overlaps) - sum(overlaps))
        assert c == pytest.approx(cost / 10.0) and v == pytest.approx(V_HASWELL)
        planned = expected_speedups_under_belief(a, b, c, v, 8)
        K = policy.choose(past)
        assert (K > 0) == expected_draft, (overlaps[0], cost, K)
        if K:
            assert K == 1 + int(np.argmax(planned[1:])), (K, planned)
        else:  # 2,000 positions: the optimistic alpha is within 0.05 of alpha, and plain wins there
            assert max(predicted_speedups(optimistic_alpha(a, b, 1), c, v, 8)[1:]) <= 1.0


def test_after_bad_luck_auto_tries_again_and_sooner_with_a_cheaper_draft():
    """Five failed positions, then nothing new (plain rounds examine none): the bound rises with
    the round count until drafting is tried again. It does not lock drafting out."""
    first_try = {}
    for c in (0.05, 0.15):
        past = Measurements(overlaps=[0.0] * 5, target_durations=timed(V_HASWELL), draft_cost=c * 10.0)
        policy = AutoK(K_max=8)
        Ks = [policy.choose(past) for _ in range(5000)]
        assert Ks[0] == 0, Ks[:5]  # the belief says plain: alpha's mean is 1.5 / 7.5 = 0.2
        first_try[c] = next((t for t, K in enumerate(Ks) if K > 0), None)
        assert first_try[c] is not None, f"c = {c}: no drafting round in 5,000"
    assert first_try[0.05] < first_try[0.15], first_try


def test_auto_times_one_plain_call_only_where_its_guess_of_v_could_decide():
    no_t1 = {3: [12.0] * 2}  # a timed 3-token call, no one-token call: v is relative to a guess
    unsure = Measurements(overlaps=[1.0, 0.0, 1.0, 1.0], target_durations=no_t1, draft_cost=0.5)
    sure = Measurements(overlaps=[1.0] * 12, target_durations=no_t1, draft_cost=0.5)
    (a, b), c, v = AutoK(8).estimates(unsure)
    assert max(expected_speedups_under_belief(a, b, c, v, 8)) < TIMING_MARGIN
    assert AutoK(8).choose(unsure) == 0
    (a, b), c, v = AutoK(8).estimates(sure)
    assert max(expected_speedups_under_belief(a, b, c, v, 8)) >= TIMING_MARGIN
    assert AutoK(8).choose(sure) > 0
    unsure.add_target_call(1, 10.0)  # once timed, no more plain rounds for timing's sake
    assert AutoK(8).choose(unsure) > 0


def test_the_simulation_is_the_refined_prediction_for_a_fixed_K():
    """Under the cost model, a fixed K run's speedup is (tokens) / sum(K c + v(K + 1)) exactly."""
    from gpt2np.decoding.policies import make_policy
    from gpt2np.teach.policy_simulation import first_failure, forced_coins
    coins = forced_coins(100, 0.7, seed=3)
    emitted, cost = 0, 0.0
    while emitted < 100:
        k = min(3, 100 - emitted - 1)
        emitted, cost = emitted + first_failure(coins[emitted:emitted + k]) + 1, cost + k * 0.2 + V_HASWELL[k + 1]
    run = simulate_policy(make_policy(3), 0.7, 0.2, V_HASWELL, 100, seed=3)
    assert abs(run["speedup"] - 100 / cost) < 1e-12, run["speedup"] - 100 / cost


def against_best(runs, speedups=None):
    """Each seed's speedup (auto's unless given) over the best fixed K by median on the same coins
    (plain decoding, 1.0, where no fixed K beats it)."""
    speedups = np.array(runs["auto"] if speedups is None else speedups)  # [seeds]
    medians = {K: np.median(s) for K, s in runs["fixed"].items()}
    best = max(medians, key=medians.get)
    return speedups / (np.array(runs["fixed"][best]) if medians[best] > 1.0 else 1.0)


@pytest.mark.parametrize("v", [V_SKYLAKEX, V_HASWELL], ids=["skylakex", "haswell"])
def test_auto_against_every_fixed_K_over_many_coin_seeds(v):
    """A 124M draft (c 0.09) into 1558M under each kernel's measured curve, 100 tokens, 40 coin seeds.

    The bounds are what the rule achieves with a margin (simulated medians: 0.96-1.00 of the best
    of plain decoding and the best fixed K; the issue's measured targets are in PERFORMANCE.md).
    The negative control, the same plan without optimism, locks itself out at alpha 0.8 on some
    seeds with a draft of c 0.2 (more than 50 of its rounds plain, 0.69-0.94 of the best fixed K);
    auto on those seeds keeps drafting in most rounds and gets 0.9 of the best fixed K or more.
    """
    seeds = range(40)
    for alpha in (0.3, 0.8, 1.0):
        ratio = against_best(compare_policies(alpha, 0.09, v, 100, seeds, policies=("auto",)))
        assert np.median(ratio) >= 0.94 and ratio.min() >= 0.84, (alpha, np.median(ratio), ratio.min())
    greedy = [simulate_policy(GreedyAutoK(8), 0.8, 0.2, v, 100, s) for s in seeds]
    locked = [s for s, run in zip(seeds, greedy) if run["K_counts"].get(0, 0) > 50]
    assert locked, "the control never locked itself out: the test could not tell"
    runs = compare_policies(0.8, 0.2, v, 100, locked, policies=("auto",))
    control = against_best(runs, [greedy[s]["speedup"] for s in locked])
    assert np.median(control) < 0.85, ("the control lost little by its lock-out: the test could not tell", control)
    auto = [simulate_policy(AutoK(8), 0.8, 0.2, v, 100, s)["K_counts"] for s in locked]
    assert all(counts.get(0, 0) <= sum(counts.values()) / 3 for counts in auto), auto
    assert against_best(runs).min() >= 0.9, (against_best(runs), control)


FLOORS = {  # (cpu, kernel) -> {alpha: the median's floor at 40 tokens}; 100 tokens: + 0.02 at alpha 0.3 (the Xeon's
    # SkylakeX alpha 0.3 simulates 0.929 since the first round may risk a whole one-token call, 0.930 before: floor 0.92)
    ("EPYC", "SkylakeX"): {0.3: 0.96, 0.8: 0.97, 1.0: 0.98}, ("EPYC", "Haswell"): {0.3: 0.92, 0.8: 0.955, 1.0: 0.98},
    ("Xeon", "SkylakeX"): {0.3: 0.92, 0.8: 0.92, 1.0: 0.94}, ("Xeon", "Haswell"): {0.3: 0.90, 0.8: 0.93, 1.0: 0.89},
    ("Zen5", "SkylakeX"): {0.3: 0.96, 0.8: 0.955, 1.0: 0.975}, ("Zen5", "Haswell"): {0.3: 0.93, 0.8: 0.955, 1.0: 0.94},
}


@pytest.mark.parametrize("cpu, kernel", list(FLOORS))
def test_auto_at_40_and_100_tokens_where_the_issue_set_targets(cpu, kernel):
    """The rule's simulated medians over 100 coin seeds, 124M -> 1558M (c 0.09): at alpha 0.3 of
    plain decoding (or K = 1 where it pays), at 0.8 and 1.0 of the best fixed K. The previous rule
    (Bayes-UCB alone, no first-round cap, a plain timing round whatever the drafter's clock said)
    measured 0.903 / 0.938 under Haswell at alpha 0.3 and 0.955 under SkylakeX at alpha 0.8, 40 tokens,
    on the EPYC's curves. The Xeon's curves are steeper and dip (v(4) < v(3), v(8) < v(7) or v(9)):
    the best fixed K sits in a dip that a line through the timed sizes does not see, and auto's
    floors there are lower (simulated 0.91-0.98). The Zen 5 EPYC's curves (2026-11-27) simulate
    0.94-0.985 at 40 tokens and 0.96-0.993 at 100."""
    v, seeds = measured_v(kernel, "1558M", cpu), range(100)
    for n_tokens in (40, 100):
        for alpha in (0.3, 0.8, 1.0):
            ratio = against_best(compare_policies(alpha, 0.09, v, n_tokens, seeds, policies=("auto",)))
            floor = FLOORS[cpu, kernel][alpha] + (0.02 if n_tokens == 100 and alpha == 0.3 else 0.0)
            assert np.median(ratio) >= floor, (n_tokens, alpha, round(float(np.median(ratio)), 3), floor)


def test_the_first_round_risks_little_and_a_free_draft_starts_longer():
    """Before any position is examined, K is at most first_round_cap: the K whose round costs at most
    FIRST_ROUND_RISK one-token calls beyond a plain step if its first draft fails."""
    v = prior_v_curve(9)
    for c in (0.0, 0.09, 0.3):
        K = AutoK(8).choose(Measurements(c_prior=c))
        assert 1 <= K <= first_round_cap(c, v, 8), (c, K)
        assert K * c + v[K + 1] - 1 <= FIRST_ROUND_RISK or K == 1, (c, K)
    assert AutoK(8).choose(Measurements(c_prior=0.0)) > AutoK(8).choose(Measurements(c_prior=0.09))


def test_the_drafters_clock_can_vouch_for_the_guessed_one_token_call():
    """No one-token call timed, a modest plan: a plain round times one, unless the drafter's seconds
    per token over its c_prior agree with the guessed call (as a model drafter's do on a kernel
    with a few-row path); on a kernel without one (v twice the prior) they disagree by ~2x."""
    v_prior = prior_v_curve(9)
    for true_v5, c_prior, expected_plain in [(v_prior[5], 0.1, False), (2 * v_prior[5], 0.1, True),
                                             (v_prior[5], 0.0, True)]:
        t1 = 10.0  # the real one-token call; the drafter's token costs 0.11 of it (c_prior 0.1: 10 % off)
        past = Measurements(overlaps=[1.0, 0.0, 1.0, 1.0], target_durations={5: [t1 * true_v5] * 2},
                            draft_cost=0.11 * t1, c_prior=c_prior)
        (a, b), c, v = AutoK(8).estimates(past)
        assert max(expected_speedups_under_belief(a, b, c, v, 8)) < TIMING_MARGIN
        assert (AutoK(8).choose(past) == 0) == expected_plain, (true_v5, c_prior, c)


def test_a_stale_one_token_timing_is_taken_again_where_the_plan_is_marginal():
    """Every v(M) is a ratio to the one-token call. Timed in a slow minute and never again, it makes
    drafting look better than it is: where the plan is within MARGINAL of plain decoding, a one-token
    call last timed STALE_CALLS calls ago is timed again (a plain round); where drafting clearly
    pays, no round is spent on it."""
    for overlaps, expected_plain in [([1.0, 0.0, 0.0] * 20, True), ([1.0] * 60, False)]:
        past = Measurements(overlaps=overlaps, draft_cost=0.9, c_prior=0.09)
        for _ in range(3):
            past.add_target_call(1, 14.0)        # the slow minute: 1.4 x the machine's usual 10.0
        for _ in range(STALE_CALLS - 1):
            past.add_target_call(2, 12.3)        # v(2) = 1.23, read as 0.88 against the stale call
        assert AutoK(8).choose(past) > 0, "not yet stale: the plan decides"
        past.add_target_call(2, 12.3)
        (a, b), c, v = AutoK(8).estimates(past)
        best = max(expected_speedups_under_belief(a, b, c, v, 8)[1:])
        assert (abs(best - 1) <= MARGINAL) == expected_plain, best  # alpha ~0.34 planned at 1.29 (truly ~1.0)
        assert (AutoK(8).choose(past) == 0) == expected_plain, (overlaps[:3], best)
        past.add_target_call(1, 10.0)            # timed again: no longer stale
        assert AutoK(8).choose(past) > 0


def test_under_a_drifting_clock_the_refresh_keeps_the_worst_seeds_closer_to_plain():
    """alpha 0.3 with a 124M draft into 1558M on a curve where K = 1 is about level with plain
    decoding (v(2) 1.23, c 0.09); the machine runs 1.4x slower in rounds 5-14 (timings only). With the
    refresh, the worst 5 % of 100 seeds lose less than without it (STALE_CALLS never reached)."""
    v = {1: 1.0, 2: 1.23, 3: 1.44, 4: 1.41, 5: 1.66, 6: 1.77, 7: 2.01, 8: 1.91, 9: 2.17}
    slow = lambda r: 1.4 if 5 <= r < 15 else 1.0  # noqa: E731

    def p5():
        runs = [simulate_policy(AutoK(8), 0.3, 0.09, v, 100, s, drift=slow)["speedup"] for s in range(100)]
        return float(np.quantile(runs, 0.05))
    refreshed = p5()
    try:
        policies.STALE_CALLS = 10 ** 9
        control = p5()
    finally:
        policies.STALE_CALLS = STALE_CALLS
    assert refreshed >= control + 0.01, (refreshed, control)


def test_what_learning_v_costs_auto_on_a_steep_curve():
    """ToldCostsAutoK plans with the true v(M) from its first round (its belief about alpha still
    learned); on the Xeon's steep 1558M curve at alpha 0.8, 100 tokens, knowing v saves auto's
    worst seeds most (PERFORMANCE.md, "K policies, sixth look": worst 0.815 -> 0.923 over 200 seeds)."""
    from gpt2np.teach.policy_simulation import ToldCostsAutoK, table_rows
    v = measured_v("SkylakeX", "1558M", cpu="Xeon")
    past = Measurements(target_durations=timed(prior_v_curve(9)), c_prior=0.09)
    assert ToldCostsAutoK(v).estimates(past)[2] == v and AutoK(8).estimates(past)[2] != v
    seeds = range(100)
    auto, told = table_rows((AutoK(8), ToldCostsAutoK(v)), 0.8, 0.09, v, 100, seeds)
    print(f"auto {auto['median']:.3f} / {auto['worst']:.3f}, told v {told['median']:.3f} / {told['worst']:.3f}")
    assert told["median"] >= auto["median"] and told["worst"] >= auto["worst"] + 0.05, (auto, told)


def test_on_the_bench_s_coins_at_alpha_08_a_probed_shape_or_told_v_meets_issue_26_where_a_line_does_not(capsys):
    """The bench's policies section's coins for seeds 0-4 (after its 8-token prompt, tests/bench/
    test_forced_coins_replay.py), replayed on the Zen 4's 1558M panels curve (100 tokens, alpha 0.8) with the c its
    124M drafter assumes at first: told the curve auto meets issue 26's median and worst seed (>= 0.97, >= 0.92;
    0.975 / 0.955), and with the shape a probe reads it meets the median (0.974), where a line through the sizes
    it times does not (0.964). What learning the curve still costs shows in the worst seed: 0.912 and 0.883, 0.043
    and 0.072 below the told one's. Until session 56 the simulator's coins were not the bench's (its output's
    coins started at the prompt's first position), and there both the line and the shape met the median. The CLI
    prints each seed's ratio."""
    from gpt2np.teach.policy_simulation import main
    main(["--told-v", "--cpu", "Zen4 panels", "--seeds", "5"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 100 | 0.8 |"))
    print(row)
    (line_median, line_worst), (probed_median, probed_worst), (told_median, told_worst) = [
        [float(x) for x in cell.split("/")] for cell in row.split("|")[3:6]]
    assert told_median >= 0.97 and told_worst >= 0.92, row
    assert probed_median >= 0.97 > line_median, row
    assert max(line_worst, probed_worst) <= told_worst - 0.03, row
    assert row.count("(") == 3 and all(len(part.split(",")) == 5 for part in row.split("(")[1:]), row


def test_the_simulated_heuristic_follows_its_schedule():
    """simulate_policy hands each round to the policy's update, as the loop does: the heuristic (start K = 5) drafts
    2 more after a round whose drafts were all accepted and 1 fewer otherwise, within 1..8. At alpha 1 it plays 5, 7,
    then 8; at alpha 0, 5, 4, 3, 2, then 1. Before session 57 the simulator never called update, and its heuristic
    played K = 5 throughout."""
    v = measured_v("SkylakeX", "1558M", "Zen4 panels")
    ones = simulate_policy(policies.make_policy("heuristic"), 1.0, 0.09, v, 60, 0)["K_counts"]
    zeros = simulate_policy(policies.make_policy("heuristic"), 0.0, 0.09, v, 12, 0)["K_counts"]
    assert ones == {0: 1, 5: 1, 7: 1, 8: 5}, ones  # 6 + 8 + 5 x 9 = 59 tokens, then one token left: K clamped to 0
    assert zeros == {0: 1, 1: 7, 2: 1, 3: 1, 4: 1, 5: 1}, zeros  # a token a round, the last clamped to 0


class Watching(AutoK):
    """auto, keeping the Measurements it was last shown (what it read of each call)."""

    def choose(self, past):
        self.past = past
        return super().choose(past)


def test_the_chain_simulator_s_spiky_readings_are_late_more_often_than_early_and_cost_nothing():
    """--noise spiky: what auto reads of a call is its cost times batch_simulation.SPIKES' factor (a core of
    N(0, 0.035) in log, a slow spike in 28 % of readings), from the seed's second stream. The costs counted and the
    coins stay: a fixed K runs the same whatever the readings, and without noise auto reads each call's cost
    exactly. With spikes, over 100 seeds at alpha 0.8 on the Zen 4's panels curve, most of its readings lie above
    the cost (the model: 64 %; here 60 %), about a tenth above it by 10 % (10 %; 11 %), almost none below it by 10 %
    (the core alone: 0.3 %; 0.2 %). A two-sided noise of the same spread would put as many below as above."""
    v = measured_v("SkylakeX", "1558M", "Zen4 panels")
    for K in (2, 5):
        quiet, spiky = (simulate_policy(policies.make_policy(K), 0.8, 0.09, v, 100, 3, noise=noise)
                        for noise in (None, "spiky"))
        assert quiet == spiky, (K, quiet, spiky)
    ratios = {None: [], "spiky": []}
    for noise, seen in ratios.items():
        for seed in range(100):
            policy = Watching(8)
            simulate_policy(policy, 0.8, 0.09, v, 100, seed, probe=True, noise=noise)
            seen += [x / v[M] for M, xs in policy.past.target_durations.items() for x in xs]
    assert ratios[None] and max(abs(x - 1) for x in ratios[None]) < 1e-12
    late = np.array(ratios["spiky"])  # [readings]
    shares = [float(np.mean(late > 1)), float(np.mean(late > 1.1)), float(np.mean(late < 1 / 1.1))]
    assert shares[0] >= 0.55 and shares[1] >= 0.07 and shares[2] < 0.02, shares


@pytest.mark.parametrize("argv", [["--cpu", "Zen4 panels"], ["--told-v", "--seeds", "0"], ["--bound", "--told-v"],
                                  ["--told-v", "--cpu", "Pentium"], ["--no-probe", "--told-v"],
                                  ["--bound", "--noise", "spiky"], ["--told-v", "--noise", "loud"]])
def test_the_simulation_s_command_line_refuses_what_it_cannot_run_in_one_line(argv, capsys):
    from gpt2np.teach.policy_simulation import main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "error:" in err[-1], err


def test_a_try_after_plain_rounds_is_priced_with_the_drafts_catch_up():
    """After 40 plain rounds a model draft's first call feeds them all (catch_up_cost): spread over the
    tokens left it is a small share of a long run, and most of a short one's last rounds. A draft that
    costs nothing (c = 0: prompt lookup) owes nothing; a caught-up draft (owed 0) drafts as before."""
    v = {1: 1.0, **{M: 1.3 + 0.08 * (M - 2) for M in range(2, 10)}}
    for c, owed, tokens_left, drafts in [(0.35, 0, 3, True), (0.35, 40, 1000, True), (0.35, 40, 3, False),
                                         (0.35, 40, None, False), (0.0, 40, 3, True)]:
        past = Measurements(overlaps=[1.0, 1.0, 1.0, 0.0] * 10, target_durations=timed(v), draft_cost=10.0 * c,
                            c_prior=c, owed=owed, tokens_left=tokens_left)
        assert (AutoK(8).choose(past) > 0) == drafts, (c, owed, tokens_left)


class CatchUpUnpriced(AutoK):
    """The control: auto as it was before it priced the draft's catch-up (it sees owed = 0)."""

    def choose(self, past):
        owed, past.owed = past.owed, 0
        try:
            return super().choose(past)
        finally:
            past.owed = owed


@pytest.mark.parametrize("kernel", ["SkylakeX", "Haswell"])
def test_pricing_the_catch_up_keeps_a_costly_draft_plainer_where_drafting_loses(kernel):
    """124M -> 355M (c 0.3), where plain decoding is the better side (alpha 0.3, 0.6), in the simulator
    that charges every try its catch-up: the priced rule's median over 60 coin seeds of 100 tokens is
    above the unpriced rule's (measured in lockstep on the Zen 4 EPYC: 1.5-3.3 % at alpha 0.3,
    PERFORMANCE.md), and where drafting pays (alpha 0.8, 1.0) no lower by more than 0.01."""
    v, seeds = measured_v(kernel, "355M"), range(60)
    for alpha, margin in [(0.3, 0.005), (0.6, 0.0), (0.8, -0.01), (1.0, -0.01)]:
        medians = [np.median([simulate_policy(policy, alpha, 0.3, v, 100, s)["speedup"] for s in seeds])
                   for policy in (AutoK(8), CatchUpUnpriced(8))]
        assert medians[0] >= medians[1] + margin, (alpha, [round(float(m), 4) for m in medians])


def test_the_weight_of_a_draft_never_rejected_is_bayes_rule_over_the_mixture():
    """Against the posterior computed by quadrature: prior PERFECT_DRAFT at alpha = 1 and the rest spread as
    Beta(ALPHA_PRIOR) (a grid of 200,001 points; tolerance 1e-6). The prompt's positions count PROMPT_WEIGHT each,
    any beta under 1 (a rejection, or a partial overlap at temperature > 0) ends it."""
    a0, b0 = ALPHA_PRIOR
    x = np.linspace(0.0, 1.0, 200_001)                                    # [grid]
    density = x ** (a0 - 1) * (1 - x) ** (b0 - 1)                         # [grid]
    for n_run, n_prompt in [(0, 0), (1, 0), (5, 0), (12, 0), (0, 16), (3, 7)]:
        n = n_run + PROMPT_WEIGHT * n_prompt
        marginal = np.trapezoid(density * x ** n, x) / np.trapezoid(density, x)
        expected = PERFECT_DRAFT / (PERFECT_DRAFT + (1 - PERFECT_DRAFT) * marginal)
        got = perfect_draft_weight(Measurements(overlaps=[1.0] * n_run, prompt_overlaps=[1.0] * n_prompt))
        assert abs(got - expected) <= 1e-6, (n_run, n_prompt, got, expected)
    weights = [perfect_draft_weight(Measurements(overlaps=[1.0] * n)) for n in range(20)]
    assert all(later > earlier for earlier, later in zip(weights, weights[1:])), weights
    for seen in ([1.0, 0.0], [1.0] * 8 + [0.97], [0.999]):
        assert perfect_draft_weight(Measurements(overlaps=seen)) == 0.0, seen
    assert perfect_draft_weight(Measurements(overlaps=[1.0] * 3, prompt_overlaps=[1.0, 0.5])) == 0.0
    assert perfect_draft_weight(Measurements(overlaps=[1.0 - 1e-9] * 4)) > PERFECT_DRAFT  # float noise of p == q


def test_after_one_round_of_accepted_drafts_auto_plans_its_longest_round(monkeypatch):
    """On a curve rising 0.1 a row with c 0.09: after one round whose 4 drafts were all accepted, a Beta alone
    (PERFECT_DRAFT = 0, the control) plans a shorter round than with the weight on alpha = 1; after a rejection
    the two plans are the same K (the weight is 0)."""
    v = {M: 1.0 if M == 1 else 1.2 + 0.1 * (M - 2) for M in range(1, 10)}
    def K_after(overlaps, perfect):
        monkeypatch.setattr(policies, "PERFECT_DRAFT", perfect)
        past = Measurements(overlaps=overlaps, target_durations=timed(v), draft_cost=0.9)
        policy = AutoK(8)
        policy.t = 1
        return policy.choose(past)
    accepted, rejected = [1.0] * 4, [1.0, 1.0, 0.0]
    assert K_after(accepted, PERFECT_DRAFT) == 8 > K_after(accepted, 0.0), (K_after(accepted, 0.0))
    assert K_after(rejected, PERFECT_DRAFT) == K_after(rejected, 0.0)


def test_in_the_simulator_a_draft_never_rejected_wins_the_short_runs_at_alpha_1(monkeypatch):
    """40 tokens on the Zen 4's panels curve (c 0.09, 100 seeds, a probed shape): the best fixed K is 7 (5 rounds of
    8 tokens); with the weight on alpha = 1 auto plays it from its first or second round, where a Beta alone (the
    control: 0.926) climbs over several rounds and ends a round later. At alpha 0.3 the weight costs nothing: the
    first rejection ends it."""
    v = measured_v("SkylakeX", "1558M", "Zen4 panels")
    from gpt2np.teach.policy_simulation import table_rows
    medians = {}
    for perfect in (PERFECT_DRAFT, 0.0):
        monkeypatch.setattr(policies, "PERFECT_DRAFT", perfect)
        for alpha in (0.3, 1.0):
            row = table_rows((AutoK(8),), alpha, 0.09, v, 40, range(100), probes=(True,))[0]
            medians[perfect, alpha] = row["median"]
    assert medians[PERFECT_DRAFT, 1.0] >= 0.955 and medians[PERFECT_DRAFT, 1.0] - medians[0.0, 1.0] >= 0.03, medians
    assert medians[PERFECT_DRAFT, 0.3] >= medians[0.0, 0.3] - 0.005, medians


def test_the_bayes_bound_reading_the_prompt_never_costs_over_the_prior_and_tends_to_knowing_alpha(capsys):
    """bayes_optimal_costs with `prompt` positions read first (free of cost there): averaged over the prior, the
    expected cost never rises with more positions read (information has no negative value to a Bayes-optimal
    policy), and with many it tends to the cost of a policy told alpha (the prior a single point), never below it.
    print_bound names the read in each line."""
    from gpt2np.teach.policy_simulation import bayes_optimal_costs, print_bound
    v, alphas, prior = measured_v("SkylakeX", "1558M", "Zen4 panels"), (0.3, 0.45, 0.6, 0.8, 1.0), [1.0] * 5
    over_prior = [float(np.mean(bayes_optimal_costs(alphas, prior, 0.09, v, 24, prompt=P))) for P in (0, 4, 16, 64)]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(over_prior, over_prior[1:])), over_prior
    told = np.array([bayes_optimal_costs([a], [1.0], 0.09, v, 24)[0] for a in alphas])            # [A]
    many = bayes_optimal_costs(alphas, prior, 0.09, v, 24, prompt=64)                               # [A]
    assert np.all(many >= told - 1e-9) and np.all(many <= told * 1.02), (many, told)
    print_bound("SkylakeX", 24, alphas=(0.3, 1.0), seeds=range(5), cpu="Zen4 panels", prompt=7)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("7 prompt positions read" in line for line in lines), lines


def test_the_bayes_optimal_policy_played_on_coins_costs_on_average_what_the_bound_says(capsys):
    """BayesOptimalK plays bayes_optimal_plan's K on given coins. Over 2000 coin seeds at each alpha of its prior
    (0.3 and 0.8, a draft that costs nothing, so no catch-up: the simulator's costs are the plan's; the EPYC's
    Haswell curve, where plain decoding is best at 0.3 and K = 3-5 at 0.8, so the plan must learn), the mean cost
    of its runs is bayes_optimal_costs' expected cost within 3.5 standard errors (measured: 20.844 / 20.844 at 0.3,
    11.53 / 11.47 at 0.8, standard errors 0.02 and 0.06), and no fixed K beats it on average over the prior.
    print_bound with 5 seeds gives its ratio on each of the bench's coin sequences too. Mutated to plan from the
    prior alone (s = f = 0 every round), the mean cost leaves the bound by 28 and 17 standard errors."""
    from gpt2np.teach.policy_simulation import BayesOptimalK, bayes_optimal_costs, print_bound
    v, alphas, n = measured_v("Haswell", "1558M", "EPYC"), (0.3, 0.8), 20
    expected = bayes_optimal_costs(alphas, [1.0, 1.0], 0.0, v, n)  # [2]
    means, bayes = [], BayesOptimalK(alphas, [1.0, 1.0], 0.0, v)  # one plan, cached, for every run
    for alpha, want in zip(alphas, expected):
        costs = np.array([n / simulate_policy(bayes, alpha, 0.0, v, n, s)["speedup"] for s in range(2000)])  # [seeds]
        error = costs.std(ddof=1) / np.sqrt(len(costs))
        assert abs(costs.mean() - want) <= 3.5 * error, (alpha, costs.mean(), want, error)
        means.append(costs.mean())
    for K in range(1, 9):
        fixed = [np.mean([n / simulate_policy(policies.make_policy(K), a, 0.0, v, n, s)["speedup"] for s in range(500)])
                 for a in alphas]
        assert np.mean(fixed) >= np.mean(expected) - 0.05, (K, fixed, expected)
    print_bound("SkylakeX", 40, alphas=(0.3, 0.8), seeds=range(5), cpu="Zen4 panels s57")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.count(",") >= 5 and "on the bench's coins" in line for line in lines), lines


def test_the_bayes_plan_solved_level_by_level_is_the_recursion_state_for_state():
    """bayes_optimal_plan (every (s, f) of a level at once) against bayes_optimal_plan_reference (the recursion, a
    state at a time): the same K and the same expected costs (to 1e-9) at every reachable state (s + f <= N - n) of
    a 30-token run, on a curve with a dip and a step (the Zen 4's panels), on the prior's curve, with a prior that
    puts weight on alpha = 0 and 1 (states that rule every alpha but one out) and a draft that costs nothing or a
    third of a call; and a state past the levels solved (a longer run) solves them again. Measured: none of the
    5,456 states of each differs in K, and the costs agree bit for bit. Mutated to read a rejected round's later
    costs at f in place of f + 1, or never to solve past the first run's levels, it fails."""
    from gpt2np.teach.policy_simulation import bayes_optimal_plan, bayes_optimal_plan_reference
    N, worst = 30, 0.0
    panels = measured_v("SkylakeX", "1558M", "Zen4 panels")
    for alphas, prior, c, v in [((0.3, 0.45, 0.6, 0.8, 1.0), [1.0] * 5, 0.09, panels),
                                ((0.0, 0.5, 1.0), [0.2, 0.5, 0.3], 0.0, prior_v_curve(9)),
                                ((0.2, 0.9), [3.0, 1.0], 0.35, V_HASWELL)]:
        fast, slow = bayes_optimal_plan(alphas, prior, c, v), bayes_optimal_plan_reference(alphas, prior, c, v)
        fast(N, 0, 0)
        for n in range(N + 1):
            for s in range(N - n + 1):
                for f in range(N - n - s + 1):
                    (cost, K), (cost_ref, K_ref) = fast(n, s, f), slow(n, s, f)
                    assert K == K_ref, (alphas, n, s, f, K, K_ref)
                    worst = max(worst, float(np.abs(cost - cost_ref).max()))
        longer = fast(N + 5, 2, 1)  # n + s + f = 38 > 30: solved again
        assert longer[1] == slow(N + 5, 2, 1)[1] and np.allclose(longer[0], slow(N + 5, 2, 1)[0], atol=1e-9)
    assert worst <= 1e-9, worst
