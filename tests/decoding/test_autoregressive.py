"""autoregressive.generate: exactly N tokens, end-of-text, checks before work, greedy without rng."""
import itertools

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding.autoregressive import generate
from gpt2np.teach.exact import exact_distribution
from gpt2np.teach.toy_models import ToyModel, random_toy_model


class NoRandomness:
    """An rng that fails the test if anything asks it for a random number."""

    def choice(self, *args, **kwargs):  # the method check_rng looks for on the class: rng-like
        raise AssertionError("greedy decoding drew a random number")

    def __getattr__(self, name):
        raise AssertionError(f"greedy decoding used the rng ({name})")


class NoWork:
    """A model that passes every check but fails the test if asked to do any work."""
    n_vocab, n_ctx, eot_id = 5, 10, None

    def new_cache(self):
        raise AssertionError("new_cache() called before the request was checked")

    def forward(self, ids, cache, n_logits=1):
        raise AssertionError("forward() called before the request was checked")


def test_generates_exactly_n_tokens_when_there_is_no_end_of_text():
    model = random_toy_model(np.random.default_rng(0), n_vocab=4, order=3)
    for n in [1, 2, 7, 20]:
        tokens = generate(model, [1, 2], n, rng=np.random.default_rng(n))
        assert len(tokens) == n and all(type(t) is int and 0 <= t < 4 for t in tokens)


def test_stops_right_after_end_of_text_and_includes_it():
    # bigram: 0 -> 1 -> 2 (end of text) with certainty; 2 -> 0 would continue if we did not stop
    model = ToyModel(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float), eot_id=2)
    assert generate(model, [0], 10, temperature=0) == [1, 2]
    assert generate(model, [0], 10, rng=np.random.default_rng(0)) == [1, 2]
    assert generate(model, [0], 1, temperature=0) == [1]  # n_tokens comes first: no eot needed


def test_a_prompt_that_ends_with_end_of_text_is_a_start_token_not_a_stop():
    model = ToyModel(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float), eot_id=2)
    assert generate(model, [2], 3, temperature=0) == [0, 1, 2]


def test_context_length_is_checked_before_any_work_and_names_both_numbers():
    with pytest.raises(ValueError, match=r"prompt \(4 tokens\) \+ n_tokens \(7\) = 11 .* 10 tokens"):
        generate(NoWork(), [0, 1, 2, 3], 7, temperature=0)


@pytest.mark.parametrize("prompt, n_tokens, options, message", [
    ([], 3, dict(temperature=0), "prompt is empty"),
    ([0, 5], 3, dict(temperature=0), r"\[0, 5\)"),
    ([0], 0, dict(temperature=0), "n_tokens"),
    ([0], 2.0, dict(temperature=0), "n_tokens"),
    ([0], 3, dict(temperature=-1.0), "temperature"),
    ([0], 3, dict(temperature=1.0, top_p=2.0), "top_p"),
    ([0], 3, dict(temperature=0.8), "rng"),  # sampling without an rng
])
def test_bad_requests_raise_before_any_work(prompt, n_tokens, options, message):
    with pytest.raises(ValueError, match=message):
        generate(NoWork(), prompt, n_tokens, **options)


def test_prompt_plus_n_tokens_equal_to_n_ctx_is_allowed():
    model = random_toy_model(np.random.default_rng(1), n_ctx=6)
    assert len(generate(model, [0, 1], 4, rng=np.random.default_rng(0))) == 4


def test_greedy_decoding_draws_no_randomness_and_follows_the_argmax():
    table = np.array([[0.1, 0.7, 0.2], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]])
    tokens = generate(ToyModel(table), [0], 5, temperature=0, rng=NoRandomness())
    assert tokens == [1, 2, 0, 1, 2]


def test_same_seed_same_tokens_and_the_prompt_is_not_mutated():
    model = random_toy_model(np.random.default_rng(2), n_vocab=5, order=2)
    prompt = [3, 1]
    first = generate(model, prompt, 12, rng=np.random.default_rng(7), temperature=0.8, top_k=3)
    assert first == generate(model, prompt, 12, rng=np.random.default_rng(7), temperature=0.8, top_k=3)
    assert prompt == [3, 1]


def test_exact_distribution_is_the_chain_rule_of_the_model():
    # P(x_1..x_n | prompt) = prod_t table[x_{t-2}, x_{t-1}, x_t]: enumerating the real generate()
    # gives exactly that, which also checks the enumerator.
    model = random_toy_model(np.random.default_rng(3), n_vocab=3, order=3, zero_fraction=0.2)
    distribution = exact_distribution(lambda rng: tuple(generate(model, [1, 0], 3, rng=rng)))
    for tokens in itertools.product(range(3), repeat=3):
        context = [1, 0, *tokens]
        expected = np.prod([model.table[context[t - 2], context[t - 1], context[t]] for t in range(2, 5)])
        assert abs(distribution.get(tokens, 0.0) - expected) <= 1e-15


def test_plain_stream_without_the_kv_cache_gives_the_same_tokens():
    """use_cache=False recomputes the whole context every step: same draws, same tokens."""
    model = random_toy_model(np.random.default_rng(4), n_vocab=4, order=3)
    for seed in range(3):
        cached = generate(model, [0, 1], 12, rng=np.random.default_rng(seed))
        stream = gpt2np.plain_stream(model, [0, 1], 12, rng=np.random.default_rng(seed), use_cache=False)
        assert stream.run() == cached and stream.provenance == ["target"] * len(cached)
