"""API misuse gets a clear one-line ValueError before any work (issue 16, item 4; issue 13, item 7).

Each case is what a user might plausibly pass: float, 2-D or string token ids, a KV cache made by
another model, rng=5, cache.truncate(1.5). Before these checks they failed deep inside NumPy
(IndexError, TypeError), or worse, silently: truncate(1.5) set the cache length to 1.5.
"""
import numpy as np
import pytest

import gpt2np
from gpt2np.model.config import GPT2Config, PRESETS
from gpt2np.model.kv_cache import KVCache
from gpt2np.teach.toy_models import random_toy_model

BAD_IDS = [
    pytest.param([1.0, 2.0], "float64 values", id="float"),
    pytest.param(np.array([1.5, 2.5]), "float64 values", id="float-array"),
    pytest.param([[1, 2], [3, 4]], r"shape \(2, 2\)", id="2-D"),
    pytest.param("hello", "a string", id="string"),
    pytest.param(["a", "b"], "<U1 values", id="list-of-strings"),
    pytest.param([True, False], "bool values", id="bool"),
    pytest.param([1, [2, 3]], "got list", id="ragged"),
    pytest.param(None, r"shape \(\)", id="None"),
]


@pytest.fixture(scope="module")
def model():
    return gpt2np.random_model(PRESETS["tiny"])  # n_vocab 64, n_ctx 32


def one_line(info):
    message = str(info.value)
    assert "\n" not in message and len(message) < 200, message
    return message


@pytest.mark.parametrize("ids, message", BAD_IDS)
def test_forward_refuses_ids_that_are_not_1d_ints(model, ids, message):
    cache = model.new_cache()
    with pytest.raises(ValueError, match=message) as info:
        model.forward(ids, cache)
    assert "1-D sequence of ints" in one_line(info)
    assert len(cache) == 0  # refused before anything was written


@pytest.mark.parametrize("ids, message", BAD_IDS)
@pytest.mark.parametrize("decoder", ["generate", "speculative_generate"])
def test_generators_refuse_bad_prompts_before_any_forward_pass(model, ids, message, decoder, monkeypatch):
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("forward ran before the check"))
    run = {"generate": lambda: gpt2np.generate(model, ids, 3, temperature=0),
           "speculative_generate": lambda: gpt2np.speculative_generate(model, model, ids, 3, K=2, temperature=0)}
    with pytest.raises(ValueError, match=message) as info:
        run[decoder]()
    assert one_line(info).startswith("prompt token ids")


def test_out_of_range_ids_are_named_with_positions_not_listed_in_full(model):
    """Issue 13, item 7: a 1,000-token prompt must not put 1,000 numbers in the message."""
    ids = [3] * 30
    ids[4], ids[17] = 64, -2
    with pytest.raises(ValueError) as info:
        model.forward(ids, model.new_cache())
    assert one_line(info) == "token ids must be in [0, 64): 64 at position 4, -2 at position 17"
    long_prompt = np.full(1000, 70_000)  # every id out of range
    with pytest.raises(ValueError) as info:
        gpt2np.generate(model, long_prompt, 1, temperature=0)
    assert one_line(info).endswith("70000 at position 2 and 997 more")


def test_integer_ids_of_any_integer_dtype_still_work(model):
    expected = model.forward([1, 2, 3], model.new_cache())
    for ids in (np.array([1, 2, 3], np.uint8), np.array([1, 2, 3], np.int32), (1, 2, 3)):
        np.testing.assert_array_equal(model.forward(ids, model.new_cache()), expected)


def test_cache_from_another_model_is_refused(model):
    deeper = gpt2np.random_model(GPT2Config(n_vocab=64, n_ctx=32, n_embd=16, n_head=2, n_layer=3))
    with pytest.raises(ValueError, match=r"\(3, 2, 32, 8\).*needs \(2, 2, 32, 8\)") as info:
        model.forward([1, 2], deeper.new_cache())
    one_line(info)
    longer = KVCache.allocate(2, 2, 64, 8)  # more context than the model: wpe has only 32 rows
    with pytest.raises(ValueError, match="new_cache"):
        model.forward([1], longer)
    for not_a_cache in (None, 5, random_toy_model(np.random.default_rng(0)).new_cache()):
        with pytest.raises(ValueError, match="must be a KVCache"):
            model.forward([1], not_a_cache)


@pytest.mark.parametrize("n_logits", [0, 3, 1.0, True, None])
def test_n_logits_must_be_an_int_within_the_ids(model, n_logits):
    with pytest.raises(ValueError, match="1 <= n_logits <= len"):
        model.forward([1, 2], model.new_cache(), n_logits=n_logits)


def test_empty_ids_are_named_as_empty(model):
    with pytest.raises(ValueError, match="ids is empty") as info:  # it said: need 1 <= n_logits <= len(ids)
        model.forward([], model.new_cache())
    one_line(info)


@pytest.mark.parametrize("rng", [5, "seed", 0.5, np.random.SeedSequence(0)])
@pytest.mark.parametrize("temperature", [0, 0.8])
def test_rng_that_is_not_a_generator_is_refused(model, rng, temperature):
    for run in (lambda: gpt2np.generate(model, [1], 3, temperature=temperature, rng=rng),
                lambda: gpt2np.speculative_generate(model, model, [1], 3, K=2, temperature=temperature, rng=rng)):
        with pytest.raises(ValueError, match="rng must be a np.random.Generator .*, got [A-Za-z]+$") as info:
            run()
        one_line(info)


@pytest.mark.parametrize("n, message", [
    (1.5, "integer length, got 1.5"), ("2", "integer length"), (True, "integer length"),
    (None, "integer length"), (-1, "length 3 to -1"), (4, "length 3 to 4")])
def test_truncate_refuses_non_integers_and_out_of_range(model, n, message):
    cache = model.new_cache()
    model.forward([1, 2, 3], cache)
    with pytest.raises(ValueError, match=message):
        cache.truncate(n)
    assert len(cache) == 3  # unchanged
    cache.truncate(np.int64(1))  # NumPy integers are integers
    assert len(cache) == 1 and type(cache.length) is int
