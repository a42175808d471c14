"""The chain simulator replays the bench's policies section on its own coins.

bench/forced_draft.py's ForcedChoices draws one coin per position of the whole sequence (prompt first), and
teach/policy_simulation.py's forced_coins(..., prompt_len=P) takes the output's from the same stream after a
P-token prompt: a fixed K run through the real loop with the forced draft examines, round by round, exactly
the positions the simulator's run examines, with the same outcomes. The simulator's own coins (prompt_len 0)
start at the prompt's first position instead, and the same check fails on them (the negative control).
"""
import sys
from pathlib import Path

import pytest

import gpt2np
from gpt2np.decoding.policies import make_policy
from gpt2np.teach.policy_simulation import PROMPT_LEN, first_failure, forced_coins, prompt_coins, simulate_policy

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

from bench.forced_draft import ForcedAcceptanceDraft, ForcedChoices, wanted_sequence  # noqa: E402
from tiny_pair import tiny_pair  # noqa: E402

N_TOKENS = 30


@pytest.fixture(scope="module")
def pair():
    target, draft, prompt, continuation = tiny_pair(PROMPT_LEN, N_TOKENS)  # the bench's prompt length
    return target, draft, prompt, wanted_sequence(target, prompt, continuation)


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_the_simulator_s_bench_coins_are_the_forced_drafter_s(alpha):
    for seed in range(5):
        agree = ForcedChoices(list(range(PROMPT_LEN + N_TOKENS)), alpha, 64, seed).agree  # [PROMPT_LEN + N + 1]
        assert forced_coins(N_TOKENS, alpha, seed, PROMPT_LEN).tolist() == agree[PROMPT_LEN:-1].tolist(), seed
        assert prompt_coins(5, alpha, seed, PROMPT_LEN) == [float(x) for x in agree[PROMPT_LEN - 5:PROMPT_LEN]]
        own = forced_coins(N_TOKENS, alpha, seed)
        assert own.tolist() == agree[:N_TOKENS].tolist()  # the simulator's own coins: from the prompt's first


def simulated_overlaps(coins, K):  # -> [beta of every position a fixed K's rounds examine]
    overlaps, emitted = [], 0
    while emitted < len(coins):
        k = min(K, len(coins) - emitted - 1)
        n_ok = first_failure(coins[emitted:emitted + k])
        overlaps += [1.0] * n_ok + [0.0] * (n_ok < k)
        emitted += n_ok + 1
    return overlaps


@pytest.mark.parametrize("K", [2, 4])
def test_a_fixed_K_examines_in_the_real_loop_what_the_simulator_s_run_examines(pair, K):
    target, draft, prompt, sequence = pair
    alpha, mismatched_own = 0.7, 0
    for seed in range(4):
        forced = ForcedAcceptanceDraft(draft, sequence, alpha, seed=seed)
        result = gpt2np.speculative_generate(target, forced, prompt, N_TOKENS, K=K, temperature=0, trace=True)
        assert result.tokens == sequence[PROMPT_LEN:], "the forced run left the target's greedy output"
        real = [b for event in result.trace for b in event.overlaps]
        bench = forced_coins(N_TOKENS, alpha, seed, PROMPT_LEN)  # [N]
        assert real == simulated_overlaps(bench, K), (seed, real)
        rounds = simulate_policy(make_policy(K), alpha, 0.1, {M: 1.0 for M in range(1, K + 2)}, N_TOKENS, seed,
                                 prompt_len=PROMPT_LEN)["rounds"]
        assert rounds == len(result.trace), (seed, rounds, len(result.trace))
        mismatched_own += real != simulated_overlaps(forced_coins(N_TOKENS, alpha, seed), K)
    assert mismatched_own >= 3, "the simulator's own coins replayed the bench's too: the check could not tell"
