"""Measurement is the caller's request (issue 24): a speculative run makes exactly the target calls
its rounds need, unless asked to calibrate c and v, and then says what the extra calls cost."""
import numpy as np
import pytest

from gpt2np import GPT2Config, random_model, speculative_generate, speculative_stream
from gpt2np.decoding.autoregressive import generate, request_cache
from gpt2np.decoding.run_stats import CALIBRATION_CALLS
from gpt2np.report import format_stats
from gpt2np.teach.classroom import toy_pair  # (n_vocab, order, model_seed)

from bench.spec import TimedProxy  # the model interface around a model, recording (tokens fed, seconds) per call


@pytest.mark.parametrize("K", [1, 3, "auto"])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_without_calibration_the_target_runs_once_per_round(K, temperature):
    target, draft = toy_pair(n_vocab=5)
    counted = TimedProxy(target)
    rng = np.random.default_rng(1) if temperature else None
    result = speculative_generate(counted, draft, [0, 1], 40, K, temperature=temperature, rng=rng)
    s = result.stats
    assert s.prompt_positions == 0  # auto reads the prompt only where policies.READ_PROMPT is set (off by default)
    assert len(counted.calls) == s.rounds == s.target_calls, (len(counted.calls), s.rounds)
    assert sum(n for n, _ in counted.calls) == 2 + len(result.tokens) - 1 + s.drafted - s.accepted  # prompt, then each round's
    assert s.calibration_seconds == 0.0                                                # fed tokens, nothing else


def test_calibration_adds_the_one_token_calls_c_and_v_need_and_says_so():
    target, draft = toy_pair(n_vocab=5)
    counted = TimedProxy(target)
    s = speculative_generate(counted, draft, [0, 1], 40, 3, temperature=0, calibrate=True).stats
    extra = len(counted.calls) - s.rounds
    one_token_rounds = s.target_timings.get(1, (0, 0.0))[0]
    assert extra == (CALIBRATION_CALLS if one_token_rounds < CALIBRATION_CALLS else 0)
    assert [n for n, _ in counted.calls[s.rounds:]] == [1] * extra and s.calibration_seconds > 0
    assert s.c is not None and s.v is not None and s.predicted_speedup_refined is not None


def test_without_calibration_unmeasured_c_and_v_are_none_not_guesses():
    """Greedy, the target drafting for itself (every draft accepted), 4 rounds of K + 1 = 5 tokens:
    no round is a one-token target call, so there is nothing to measure c and v by."""
    target, _ = toy_pair(n_vocab=5)
    s = speculative_stream(target, target, [0, 1], 20, 4, temperature=0).run().stats
    assert s.rounds == 4 and s.target_timings.get(1) is None, s.target_timings
    assert s.c is None and s.v is None and s.predicted_speedup_refined is None
    assert "calibrate=True" in format_stats(s)  # the table says why, and how to get them


def test_the_proxy_hands_out_caches_sized_as_its_model_does():
    """bench's TimedProxy says sized_caches where its model takes n_ctx (a GPT2), so a run through it gets the
    cache the run feeds, as the model alone would; around a toy model (new_cache() only) it asks for none."""
    target = random_model(GPT2Config(n_vocab=11, n_ctx=40, n_embd=8, n_head=2, n_layer=1), seed=0, tokenizer=None)
    proxy = TimedProxy(target)
    assert proxy.sized_caches and request_cache(proxy, 12).n_ctx == 12 and proxy.new_cache().n_ctx == 40
    assert generate(proxy, [1, 2, 3], 9, temperature=0) == generate(target, [1, 2, 3], 9, temperature=0)
    toy = TimedProxy(toy_pair(n_vocab=5)[0])
    assert not toy.sized_caches and len(request_cache(toy, 3)) == 0
