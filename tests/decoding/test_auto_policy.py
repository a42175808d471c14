"""auto K: its rule against theory, that it never locks drafting out, that it stops drafting where
drafting cannot pay, and what it earns against every fixed K under a cost model (many coin seeds).

Its exactness is proved with the other policies' (test_drafters_policies.py: exact enumeration
with a scripted clock, greedy equality, caches against recomputation).
"""
import numpy as np
import pytest

from gpt2np.decoding.policies import ALPHA_PRIOR, TIMING_MARGIN, AutoK, Measurements, optimistic_alpha, prior_v_curve
from gpt2np.decoding.theory import expected_speedups_under_belief, predicted_speedups
from gpt2np.teach.policy_simulation import GreedyAutoK, compare_policies, simulate_policy

V_SKYLAKEX = {1: 1.0, 2: 1.2, 3: 1.27, 4: 1.35, 5: 1.42, 6: 1.49, 7: 1.56, 8: 1.63, 9: 1.7}   # 1558M, measured
V_HASWELL = {1: 1.0, 2: 1.36, 3: 1.52, 4: 1.69, 5: 1.85, 6: 1.98, 7: 2.1, 8: 2.23, 9: 2.35}   # 1558M, `rows`


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


@pytest.mark.parametrize("v", [V_SKYLAKEX, V_HASWELL], ids=["skylakex", "haswell"])
def test_auto_against_every_fixed_K_over_many_coin_seeds(v):
    """A 124M draft (c 0.09) into 1558M under each kernel's measured curve, 100 tokens, 40 coin seeds.

    The bounds are what the rule achieves with a margin (simulated medians: 0.93-1.01 of the best
    of plain decoding and the best fixed K; the issue's measured targets are in PERFORMANCE.md).
    The negative control, the same plan without optimism, locks itself out at alpha 0.8 on some
    seeds with a draft of c 0.2 (more than 50 of its rounds plain); auto on those seeds does not.
    """
    seeds = range(40)
    for alpha in (0.3, 0.8, 1.0):
        runs = compare_policies(alpha, 0.09, v, 100, seeds, policies=("auto",))
        medians = {K: np.median(s) for K, s in runs["fixed"].items()}
        best = max(medians, key=medians.get)
        reference = np.maximum(np.array(runs["fixed"][best]), 1.0) if alpha < 0.5 else np.array(runs["fixed"][best])
        ratio = np.array(runs["auto"]) / reference
        assert np.median(ratio) >= 0.90 and ratio.min() >= 0.80, (alpha, np.median(ratio), ratio.min())
    greedy = [simulate_policy(GreedyAutoK(8), 0.8, 0.2, v, 100, s)["K_counts"] for s in seeds]
    locked = [s for s, counts in zip(seeds, greedy) if counts.get(0, 0) > 50]
    assert locked, "the control never locked itself out: the test could not tell"
    auto = [simulate_policy(AutoK(8), 0.8, 0.2, v, 100, s)["K_counts"] for s in locked]
    assert all(counts.get(0, 0) <= 5 for counts in auto), auto
