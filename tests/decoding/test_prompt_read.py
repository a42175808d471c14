"""auto reads the prompt before its first round where policies.READ_PROMPT is set (off by default; policies.AutoK,
5.; speculative.read_prompt).

  * what it reads: beta = sum_x min(p, q) at the prompt's last positions, equal to one prefix at a time
    through each model (tolerance stated), both caches left holding prompt[:-1], no call on the stopwatches;
  * who reads: nobody by default; with READ_PROMPT set, only a policy that asks (auto, tree="auto") with a drafter that can say what it would have
    drafted (a draft model); a fixed K, prompt lookup and a one-token prompt read nothing;
  * exactness: exact enumeration of auto and tree="auto" over prompts long enough to be read (the choice of
    K still uses the past only; the negative control that such an enumeration can fail is
    test_drafters_policies.test_peeking_at_the_round_to_choose_K_is_caught), and greedy output equal to the
    target's on the bundled pair;
  * what it changes: the belief (alpha_belief), the first round's cap, and in the chain simulator the
    40-token rows that the first rounds decide.
"""
from types import SimpleNamespace

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding import policies
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.drafters import ModelDrafter, NgramDrafter
from gpt2np.decoding.policies import (PROMPT_POSITIONS, PROMPT_WEIGHT, AutoK, Measurements, alpha_belief,
                                      first_round_cap)
from gpt2np.decoding.sampling import distribution
from gpt2np.decoding.speculative import read_prompt, speculative_generate
from gpt2np.decoding.stopwatch import TimedModel
from gpt2np.teach.exact import exact_distribution, max_abs_difference
from gpt2np.teach.policy_simulation import main as simulation_main
from gpt2np.teach.policy_simulation import measured_v, table_rows
from test_drafters_policies import scripted_clock  # noqa: F401  (a pytest fixture)
from test_speculative_exact import EXACT, PAIRS, target_distribution, toy_pair

READER = SimpleNamespace(prompt_positions=PROMPT_POSITIONS)  # what a reading auto asks read_prompt for
BETA_TOLERANCE = 1e-5  # float32 logits of a prefill of many rows against one prefix at a time: measured 1.5e-6


@pytest.fixture
def reading(monkeypatch):
    """auto built inside the test reads the prompt (policies.READ_PROMPT set)."""
    monkeypatch.setattr(policies, "READ_PROMPT", True)


@pytest.fixture(scope="module")
def pair():
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def one_prefix_at_a_time(model, prompt, n, options):  # -> [n, n_vocab]: each prefix through a fresh cache
    ends = range(len(prompt) - n, len(prompt))
    return np.array([distribution(model.forward(np.asarray(prompt[:end]), model.new_cache())[-1], **options)
                     for end in ends])


@pytest.mark.parametrize("options", [dict(temperature=0.0), dict(temperature=0.8, top_k=20, top_p=None),
                                     dict(temperature=1.0, top_k=None, top_p=0.9)], ids=str)
def test_the_prompt_s_overlaps_are_beta_one_prefix_at_a_time(pair, options):
    target, draft = pair
    options = {"top_k": None, "top_p": None, **options}
    prompt = target.tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    timed, drafter = TimedModel(target), ModelDrafter(draft)
    drafter.reset(target)
    overlaps, seconds = read_prompt(timed, drafter, prompt, options, READER)
    n = PROMPT_POSITIONS
    p, q = one_prefix_at_a_time(target, prompt, n, options), one_prefix_at_a_time(draft, prompt, n, options)
    expected = np.minimum(p, q).sum(axis=-1)  # [n]
    gap = float(np.abs(np.array(overlaps) - expected).max())
    assert len(overlaps) == n and gap <= BETA_TOLERANCE, gap
    assert len(timed.cache) == len(drafter.timed.cache) == len(prompt) - 1
    assert timed.calls == 0 and drafter.calls == 0 and seconds > 0  # a prefill, not a round's call


def test_only_auto_with_a_draft_model_reads_the_prompt_and_at_most_its_last_positions(monkeypatch):
    target, draft = toy_pair(**PAIRS["3 tokens, eot=2"])
    long_prompt = [0, 1] * 15                                         # 30 tokens: 29 positions, 16 read

    def read(drafter, K, prompt, **options):
        return speculative_generate(target, drafter, prompt, 6, K, temperature=0, **options).stats.prompt_positions
    assert read(ModelDrafter(draft), "auto", long_prompt) == 0        # off by default
    assert speculative_generate(target, ModelDrafter(draft), long_prompt, 6, tree="auto").stats.prompt_positions == 0
    monkeypatch.setattr(policies, "READ_PROMPT", True)
    assert read(ModelDrafter(draft), "auto", long_prompt) == PROMPT_POSITIONS
    assert read(ModelDrafter(draft), "auto", [0, 1, 0]) == 2
    assert read(ModelDrafter(draft), "auto", [0]) == 0                # nothing before its last token
    assert read(ModelDrafter(draft), 3, long_prompt) == 0             # a fixed K asked for nothing
    assert read(ModelDrafter(draft), "heuristic", long_prompt) == 0
    assert read(NgramDrafter(), "auto", long_prompt) == 0             # lookup has no q over the prompt
    stats = speculative_generate(target, ModelDrafter(draft), long_prompt, 6, tree="auto", temperature=0).stats
    assert stats.prompt_positions == PROMPT_POSITIONS and 0 <= stats.prompt_overlap <= 1 and stats.prompt_seconds > 0


@pytest.mark.parametrize("options", [{}, dict(temperature=0.6, top_k=2)], ids=str)
@pytest.mark.parametrize("pair_name", PAIRS)
def test_auto_reading_the_prompt_samples_exactly_the_target(pair_name, options, scripted_clock, reading):
    target, draft = toy_pair(**PAIRS[pair_name])
    prompt = [1, 0, 1, 1, 0]
    want = target_distribution(target, prompt, 4, **options)
    runs = []

    def run(rng):
        scripted_clock()
        result = speculative_generate(target, ModelDrafter(draft, c_prior=0.1), prompt, 4, "auto", rng=rng, K_max=3,
                                      **options)
        runs.append(result.stats.prompt_positions)
        return tuple(result.tokens)
    got = exact_distribution(run)
    assert set(runs) == {4}, set(runs)  # every path read the prompt
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)


def test_auto_tree_reading_the_prompt_samples_exactly_the_target(scripted_clock, reading):
    target, draft = toy_pair(seed=1, n_vocab=3)
    prompt = [0, 1, 0]
    want = target_distribution(target, prompt, 4)

    def run(rng):
        scripted_clock()
        result = speculative_generate(target, ModelDrafter(draft, c_prior=0.05), prompt, 4, rng=rng, tree="auto",
                                      K_max=2)
        assert result.stats.prompt_positions == 2
        return tuple(result.tokens)
    got = exact_distribution(run)
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)


@pytest.mark.parametrize("tree", [None, "auto"])
def test_auto_reading_the_prompt_gives_the_target_s_greedy_tokens_on_the_bundled_pair(pair, tree, reading):
    target, draft = pair
    prompt = target.tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    result = speculative_generate(target, draft, prompt, 80, "auto" if tree is None else 4, tree=tree)
    assert result.stats.prompt_positions == PROMPT_POSITIONS
    assert result.tokens == generate(target, prompt, 80, temperature=0)


def test_the_prompt_counts_prompt_weight_a_position_and_lifts_the_first_round_s_cap():
    """With c 0.09 on a curve flat enough to draft long, the blind first round is capped (first_round_cap: 4);
    16 prompt positions that all agreed start it at K_max, 16 that all disagreed keep it plain."""
    v = {M: 1.0 if M == 1 else 1.2 + 0.03 * (M - 2) for M in range(1, 10)}
    shape = dict(v)
    blind = Measurements(c_prior=0.09, v_shape=shape)
    agreed = Measurements(c_prior=0.09, v_shape=shape, prompt_overlaps=[1.0] * 16)
    disagreed = Measurements(c_prior=0.09, v_shape=shape, prompt_overlaps=[0.0] * 16)
    assert alpha_belief(agreed) == (1.5 + 16 * PROMPT_WEIGHT, 1.0)
    assert alpha_belief(disagreed) == (1.5, 1.0 + 16 * PROMPT_WEIGHT)
    first = {name: AutoK(8).choose(past) for name, past in [("blind", blind), ("agreed", agreed),
                                                           ("disagreed", disagreed)]}
    assert first == {"blind": first_round_cap(0.09, v, 8), "agreed": 8, "disagreed": 0}, first


def test_in_the_simulator_reading_the_prompt_does_not_pay_for_the_pass_it_costs():
    """40 tokens, c 0.09, 100 seeds, each read prompt position agreeing w.p. alpha as the bench's forced drafter's do,
    the read charged PROMPT_READ_COST (the target's prefill becomes a call of its own, measured at 1558M). A run that
    reads nothing finds alpha = 1 in its first rounds (policies.PERFECT_DRAFT), so the read's information is worth
    less than its pass: at most a point gained in any row, and at alpha 0.8-1 on the Zen 4's panels curve 3
    points or more lost. Hence READ_PROMPT stays off."""
    for cpu, kernel, alphas in [("Zen4 panels", "SkylakeX", (0.3, 0.8, 1.0)), ("EPYC", "Haswell", (0.3, 0.8))]:
        v = measured_v(kernel, "1558M", cpu)
        for alpha in alphas:
            blind = table_rows((AutoK(8),), alpha, 0.09, v, 40, range(100), probes=(True,))[0]["median"]
            read = table_rows((AutoK(8),), alpha, 0.09, v, 40, range(100), probes=(True,), prompt=16)[0]["median"]
            assert read <= blind + 0.01, (cpu, kernel, alpha, blind, read)
            if kernel == "SkylakeX" and alpha >= 0.8:
                assert read <= blind - 0.03, (cpu, kernel, alpha, blind, read)


def test_the_simulation_refuses_a_negative_prompt(capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulation_main(["--prompt", "-1"])
    assert exit_info.value.code == 2 and "--prompt must be 0 to 16" in capsys.readouterr().err
