"""Single-sequence decoding at the API's edges (audit 60): each test is one reported defect.

A np.uint64 prompt crashing generate_without_cache at its second step (float64 ids); a plain stream
decoding whatever the caller's list held when it was iterated, not when it was opened; random.Random
taken as an rng and failing at the first draw; a small NumPy integer n_tokens wrapping around inside
the context check; a draft's context error worded as the target's; unchecked n_min, ModelDrafter
models and NgramTreeDrafter widths; draft_sampler=, kernel= and tree_kernel= ignored by runs that never
call them, and a ModelDrafter's c_prior dropped by tree=; K_counts counting the K asked for where the
loop drafted fewer; docstrings naming K_max positional and a provenance comment missing "target".
"""
import random

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding import autoregressive


@pytest.fixture(scope="module")
def pair():
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    return target, draft, target.tokenizer.encode("ROMEO:\nWhat light")


@pytest.fixture(scope="module")
def small():  # n_ctx 128, no tokenizer: the n_tokens overflow cases
    config = gpt2np.GPT2Config(n_vocab=50, n_ctx=128, n_embd=32, n_head=2, n_layer=1)
    return gpt2np.random_model(config, seed=0, tokenizer=None)


def one_line(info):
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    return message


class NoForward:
    """Wraps a model; fails the test if a forward pass or a cache is asked for (checks come first)."""

    def __init__(self, model):
        self.n_vocab, self.n_ctx, self.eot_id = model.n_vocab, model.n_ctx, model.eot_id

    def new_cache(self, *args):
        raise AssertionError("new_cache() called before the request was checked")

    def forward(self, *args, **kwargs):
        raise AssertionError("forward() called before the request was checked")


# ---- 1. prompts of any integer dtype, with or without the cache ---------------------------------------

@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.uint16, np.int32])
def test_an_integer_array_prompt_of_any_dtype_decodes_without_the_cache(pair, dtype):
    target, _, ids = pair
    expected = gpt2np.generate(target, ids, 3)
    prompt = np.array(ids, dtype=dtype)
    assert gpt2np.generate_without_cache(target, prompt, 3) == expected
    assert gpt2np.plain_stream(target, prompt, 3, use_cache=False).run() == expected
    assert gpt2np.generate(target, prompt, 3) == expected


# ---- 2. a plain stream decodes the prompt it was opened with ------------------------------------------

def test_a_plain_stream_decodes_the_prompt_it_was_opened_with(pair):
    target, draft, ids = pair
    expected = gpt2np.generate(target, ids, 10)
    buf = list(ids)
    plain, cacheless = gpt2np.plain_stream(target, buf, 10), gpt2np.plain_stream(target, buf, 10, use_cache=False)
    spec = gpt2np.speculative_stream(target, draft, buf, 10)
    buf[:] = target.tokenizer.encode("JULIET:\nO Romeo")
    assert plain.run() == cacheless.run() == spec.run().tokens == expected


def test_a_prompt_grown_past_the_context_after_the_checks_changes_nothing(pair):
    target, _, ids = pair
    buf = list(ids)
    stream = gpt2np.plain_stream(target, buf, 10)
    buf.extend([5] * 240)  # 257 tokens: the checks ran on 17
    assert stream.run() == gpt2np.generate(target, ids, 10)


# ---- 3. an rng is a np.random.Generator ---------------------------------------------------------------

RUNS = {
    "generate": lambda t, d, ids, rng: gpt2np.generate(t, ids, 3, rng=rng),
    "generate_without_cache": lambda t, d, ids, rng: gpt2np.generate_without_cache(t, ids, 3, rng=rng),
    "plain_stream": lambda t, d, ids, rng: gpt2np.plain_stream(t, ids, 3, rng=rng),
    "speculative_generate": lambda t, d, ids, rng: gpt2np.speculative_generate(t, d, ids, 3, rng=rng),
    "speculative_stream": lambda t, d, ids, rng: gpt2np.speculative_stream(t, d, ids, 3, rng=rng),
    "generate_batch": lambda t, d, ids, rng: gpt2np.generate_batch(t, [ids], 3, rng=rng),
}


@pytest.mark.parametrize("rng", [random.Random(0), random.SystemRandom()], ids=["Random", "SystemRandom"])
@pytest.mark.parametrize("run", RUNS)
def test_a_python_random_generator_is_refused_before_any_forward_pass(pair, run, rng):
    """random.Random has a choice method, which the check took for a Generator's: it failed at the first
    draw, after the prefill, with "Random.choice() got an unexpected keyword argument 'p'"."""
    target, draft, ids = pair
    with pytest.raises(ValueError, match=r"rng must be a np.random.Generator .*, got (System)?Random$") as info:
        RUNS[run](NoForward(target), NoForward(draft), ids, rng)
    one_line(info)


def test_a_stand_in_that_draws_as_a_generator_still_passes():
    """exact.ScriptedRng and the tests' stand-ins take choice(n, p=...): they are still accepted."""
    class StandIn:
        def choice(self, a, p):
            return int(np.argmax(p))

    class Any:
        def choice(self, *args, **kwargs):
            return 0

    for rng in (StandIn(), Any(), np.random.default_rng(0), None):
        autoregressive.check_rng_type(rng)


# ---- 4. a NumPy integer n_tokens is an int once checked ------------------------------------------------

SMALL_RUNS = {
    "generate": lambda m, prompt, n: gpt2np.generate(m, prompt, n),
    "plain_stream": lambda m, prompt, n: gpt2np.plain_stream(m, prompt, n),
    "generate_without_cache": lambda m, prompt, n: gpt2np.generate_without_cache(m, prompt, n),
    "speculative_generate": lambda m, prompt, n: gpt2np.speculative_generate(m, m, prompt, n, K=2),
    "speculative_stream": lambda m, prompt, n: gpt2np.speculative_stream(m, m, prompt, n, K=2),
}


@pytest.mark.parametrize("run", SMALL_RUNS)
def test_a_small_numpy_integer_n_tokens_cannot_wrap_around_the_context_check(small, run):
    with pytest.raises(ValueError, match=r"prompt \(100 tokens\) \+ n_tokens \(100\) = 200 exceeds the context "
                                         "of 128 tokens") as info:
        SMALL_RUNS[run](small, [1] * 100, np.int8(100))  # 100 + np.int8(100) is np.int8(-56) in NumPy 2
    one_line(info)


@pytest.mark.parametrize("run", ["generate", "generate_without_cache", "speculative_generate"])
def test_a_small_numpy_integer_n_tokens_that_fits_decodes_as_an_int(small, run):
    """120 + np.int8(8) = 128 wraps to -128 in np.int8: the cache sizes read it (new_cache refused -128)."""
    result = SMALL_RUNS[run](small, [1] * 120, np.int8(8))
    tokens = getattr(result, "tokens", result)
    assert tokens == gpt2np.generate(small, [1] * 120, 8)
