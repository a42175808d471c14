"""The Python API's defaults work and agree, and its first arguments are checked (issue 27, item 4).

One set of defaults for all five generation functions (gpt2np/__init__.py's table): greedy unless
an rng is passed, temperature 1.0 when one is; sampling needs an explicit generator; K = 4. And
arguments in another repository's order, e.g. (ids, drafter, target), are a one-line ValueError
naming the argument, never an AttributeError from deep inside.
"""
import inspect

import numpy as np
import pytest

import gpt2np
from gpt2np.model.config import PRESETS
from gpt2np.teach.toy_models import random_toy_model

FUNCTIONS = [gpt2np.generate, gpt2np.plain_stream, gpt2np.generate_without_cache,
             gpt2np.speculative_generate, gpt2np.speculative_stream]
SHARED_DEFAULTS = dict(temperature=None, top_k=None, top_p=None, rng=None, stop_tokens=None)


@pytest.fixture(scope="module")
def pair():
    """A tiny random GPT-2 target (n_vocab 64) and a toy draft of the same vocabulary."""
    return gpt2np.random_model(PRESETS["tiny"], seed=1, std=0.3), random_toy_model(
        np.random.default_rng(0), n_vocab=64, order=2)


def run(function, target, draft, *args, **kwargs):
    """Any of the five with one calling convention: -> the list of new tokens."""
    speculative = function in (gpt2np.speculative_generate, gpt2np.speculative_stream)
    out = function(target, draft, *args, **kwargs) if speculative else function(target, *args, **kwargs)
    out = out.run() if isinstance(out, gpt2np.Stream) else out
    return out.tokens if isinstance(out, gpt2np.SpeculativeResult) else out


def one_line(info):
    message = str(info.value)
    assert "\n" not in message and len(message) < 220, message
    return message


def test_every_generation_function_has_the_same_defaults():
    for function in FUNCTIONS:
        parameters = inspect.signature(function).parameters
        got = {name: parameters[name].default for name in SHARED_DEFAULTS}
        assert got == SHARED_DEFAULTS, f"{function.__name__}: {got}"
        assert list(parameters)[:2] in (["model", "prompt_ids"], ["target", "draft"]), function.__name__
    for function in (gpt2np.speculative_generate, gpt2np.speculative_stream):
        parameters = inspect.signature(function).parameters
        assert (parameters["K"].default, parameters["K_max"].default) == (4, 8), function.__name__


def test_the_shortest_call_works_and_is_greedy(pair):
    """gpt2np.generate(model, ids, 20) raised before (temperature 1.0 by default, no rng)."""
    target, draft = pair
    greedy = gpt2np.generate(target, [1, 2, 3], 20, temperature=0)
    assert len(greedy) == 20
    for function in FUNCTIONS:
        assert run(function, target, draft, [1, 2, 3], 20) == greedy, function.__name__


def test_passing_an_rng_samples_at_temperature_one(pair):
    """A generator is a request to sample: temperature None is then 1.0, as before this change."""
    target, draft = pair
    for function in FUNCTIONS:
        implicit = run(function, target, draft, [1, 2, 3], 12, rng=np.random.default_rng(5))
        explicit = run(function, target, draft, [1, 2, 3], 12, temperature=1.0, rng=np.random.default_rng(5))
        assert implicit == explicit, function.__name__
    plain = gpt2np.generate(target, [1, 2, 3], 12, rng=np.random.default_rng(5))
    assert plain != gpt2np.generate(target, [1, 2, 3], 12), "sampled the greedy sequence: a weak test"
    assert gpt2np.generate_without_cache(target, [1, 2, 3], 12, rng=np.random.default_rng(5)) == plain


@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.__name__)
def test_sampling_without_a_generator_says_how_to_pass_one(pair, function):
    target, draft = pair
    with pytest.raises(ValueError, match=r"temperature 0.8 > 0\) needs rng=np.random.default_rng\(seed\)") as info:
        run(function, target, draft, [1, 2, 3], 5, temperature=0.8)
    one_line(info)


def test_speculative_generate_defaults_K_to_four_like_the_stream(pair):
    target, draft = pair
    result = gpt2np.speculative_generate(target, draft, [1, 2, 3], 11, trace=True)
    assert result.stats.K == 4 and [len(r.drafts) for r in result.trace][:2] == [4, 4]
    stream = gpt2np.speculative_stream(target, draft, [1, 2, 3], 11, trace=True)
    assert stream.run().tokens == result.tokens


class NotToBeCalled:
    """Fails the test if the check let a forward pass happen."""
    n_vocab, n_ctx, eot_id = 64, 32, None

    def new_cache(self):
        raise AssertionError("work started before the arguments were checked")

    forward = new_cache


WRONG_ORDERS = [  # (call, the argument the message must name, what it must say was given)
    (lambda t, d: gpt2np.speculative_generate([1, 2, 3], d, t, 5), "target", "got list"),
    (lambda t, d: gpt2np.speculative_stream([1, 2, 3], d, t, 5), "target", "got list"),
    (lambda t, d: gpt2np.speculative_generate(np.array([1, 2]), t, d, 5), "target", "got ndarray"),
    (lambda t, d: gpt2np.speculative_generate(gpt2np.NgramDrafter(), t, [1, 2], 5), "target",
     "got NgramDrafter (a drafter: it goes second, as the draft)"),
    (lambda t, d: gpt2np.speculative_generate(t, [1, 2, 3], d, 5), "draft", "got list"),
    (lambda t, d: gpt2np.speculative_stream(t, "124M", [1, 2], 5), "draft", "got str"),
    (lambda t, d: gpt2np.generate([1, 2, 3], t, 5), "model", "got list"),
    (lambda t, d: gpt2np.plain_stream("124M", [1, 2, 3], 5), "model", "got str"),
    (lambda t, d: gpt2np.generate_without_cache(None, [1, 2, 3], 5), "model", "got NoneType"),
]


@pytest.mark.parametrize("call, argument, given", WRONG_ORDERS)
def test_arguments_in_another_order_are_one_line_errors_naming_the_argument(call, argument, given):
    with pytest.raises(ValueError) as info:
        call(NotToBeCalled(), NotToBeCalled())
    message = one_line(info)
    assert message.startswith(f"{argument} must be a model"), message
    assert given in message, message
    assert ("(target, draft, prompt_ids, n_tokens" in message) == (argument != "model"), message
    assert ("(model, prompt_ids, n_tokens" in message) == (argument == "model"), message


def test_the_order_message_names_the_function_that_was_called():
    with pytest.raises(ValueError, match=r": speculative_stream\(target, draft, prompt_ids, n_tokens, \.\.\.\)$"):
        gpt2np.speculative_stream([1, 2, 3], NotToBeCalled(), NotToBeCalled(), 5)
    with pytest.raises(ValueError, match=r": generate_without_cache\(model, prompt_ids, n_tokens, \.\.\.\)$"):
        gpt2np.generate_without_cache([1, 2, 3], NotToBeCalled(), 5)


def test_models_and_drafters_in_the_right_places_still_pass(pair):
    """The checks are duck-typed: toy models, GPT-2s and drafters all have what they look for."""
    target, draft = pair
    for drafter in (draft, gpt2np.ModelDrafter(draft), gpt2np.NgramDrafter(n_max=2)):
        tokens = gpt2np.speculative_generate(target, drafter, [1, 2, 3, 1, 2], 6, K=2).tokens
        assert tokens == gpt2np.generate(target, [1, 2, 3, 1, 2], 6)
