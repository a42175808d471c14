"""sampling.py: temperature, top-k and top-p against hand-computed cases and Hugging Face's rules."""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis.extra.numpy import arrays

from gpt2np.decoding.sampling import (check_sampling_options, greedy_distribution, next_token, sample, sampling_distribution,
                             softmax, top_p_filter)


def hf_style_distribution(logits, temperature, top_k, top_p):
    """Hugging Face's three warpers, written the way transformers describes them, as an oracle:
    divide by temperature; remove scores below the k-th largest; sort ascending and remove tokens
    whose cumulative probability is <= 1 - top_p, always keeping the most probable one."""
    scores = logits / temperature
    if top_k is not None:
        kth_largest = np.sort(scores)[::-1][min(top_k, len(scores)) - 1]
        scores = np.where(scores < kth_largest, -np.inf, scores)
    if top_p is not None:
        ascending = np.argsort(scores)
        remove_sorted = np.cumsum(softmax(scores[ascending])) <= 1 - top_p
        remove_sorted[-1] = False  # min_tokens_to_keep = 1
        remove = np.empty_like(remove_sorted)
        remove[ascending] = remove_sorted
        scores = np.where(remove, -np.inf, scores)
    return softmax(scores)


def test_temperature_divides_the_logits_before_softmax():
    logits = np.array([0.0, np.log(2.0)])  # probabilities 1/3, 2/3 at temperature 1
    np.testing.assert_allclose(sampling_distribution(logits, temperature=0.5), [0.2, 0.8], atol=1e-15)
    hot = np.array([1.0, np.sqrt(2.0)]) / (1 + np.sqrt(2.0))  # temperature 2: square roots
    np.testing.assert_allclose(sampling_distribution(logits, temperature=2.0), hot, atol=1e-15)


def test_top_k_keeps_the_k_largest_logits_and_every_tie_with_the_kth():
    e = np.exp
    np.testing.assert_allclose(sampling_distribution(np.array([1.0, 3.0, 2.0, 0.0]), top_k=2),
                               np.array([0, e(3), e(2), 0]) / (e(3) + e(2)), atol=1e-15)
    tied = sampling_distribution(np.array([1.0, 3.0, 2.0, 2.0]), top_k=2)  # HF keeps ties too
    np.testing.assert_allclose(tied, np.array([0, e(3), e(2), e(2)]) / (e(3) + 2 * e(2)), atol=1e-15)


def test_top_k_at_least_the_vocabulary_size_keeps_everything():
    logits = np.array([0.3, -1.0, 2.0])
    np.testing.assert_allclose(sampling_distribution(logits, top_k=3), softmax(logits), atol=1e-15)
    np.testing.assert_allclose(sampling_distribution(logits, top_k=50), softmax(logits), atol=1e-15)


@pytest.mark.parametrize("top_p, expected", [
    (0.3, [1.0, 0.0, 0.0]),      # the most probable token alone already reaches 0.3
    (0.5, [1.0, 0.0, 0.0]),      # exactly 0.5: still reached by one token (">= top_p")
    (0.51, [0.625, 0.375, 0.0]),
    (0.8, [0.625, 0.375, 0.0]),  # 0.5 + 0.3 == 0.8 exactly in float64
    (0.81, [0.5, 0.3, 0.2]),
    (1.0, [0.5, 0.3, 0.2]),
])
def test_top_p_keeps_the_smallest_set_of_most_probable_tokens_reaching_top_p(top_p, expected):
    np.testing.assert_allclose(top_p_filter(np.array([0.5, 0.3, 0.2]), top_p), expected, atol=1e-15)


def test_top_p_keeps_every_token_tied_with_the_least_probable_kept_one():
    # 0.4 reaches top_p = 0.3 alone, but the other 0.4 is tied with it: both stay (HF would keep one)
    np.testing.assert_allclose(top_p_filter(np.array([0.4, 0.2, 0.4]), 0.3), [0.5, 0.0, 0.5])


def test_temperature_is_applied_before_top_p():
    logits = np.log([0.6, 0.3, 0.1])
    np.testing.assert_allclose(sampling_distribution(logits, top_p=0.6), [1, 0, 0], atol=1e-15)
    # at temperature 2 the distribution flattens to about [0.47, 0.33, 0.19]: two tokens needed
    flat = sampling_distribution(logits, temperature=2.0, top_p=0.6)
    np.testing.assert_allclose(flat, np.sqrt([0.6, 0.3, 0]) / np.sqrt([0.6, 0.3]).sum(), atol=1e-15)


def test_top_k_is_applied_before_top_p_and_renormalises():
    logits = np.log([0.4, 0.35, 0.25])
    # top-k 2 gives [0.533, 0.467, 0]; top-p 0.5 then keeps only the first token. (The other
    # order, top-p first, would keep two tokens: 0.4 alone does not reach 0.5.)
    np.testing.assert_allclose(sampling_distribution(logits, top_k=2, top_p=0.5), [1, 0, 0], atol=1e-15)


@hypothesis.settings(deadline=None, max_examples=200)
@hypothesis.given(
    logits=arrays(np.float64, st.integers(2, 12), elements=st.floats(-8, 8), unique=True),
    temperature=st.floats(0.1, 3.0),
    top_k=st.none() | st.integers(1, 14),
    top_p=st.none() | st.floats(0.05, 1.0),
)
def test_matches_hugging_face_warpers_on_untied_logits(logits, temperature, top_k, top_p):
    hypothesis.assume(np.min(np.diff(np.sort(logits))) > 1e-6)  # ties are tested separately
    hf = hf_style_distribution(logits, temperature, top_k, top_p)
    if top_p is not None:  # the two cumulative sums may round differently right at the boundary
        z = logits / temperature
        kept = z >= np.sort(z)[::-1][min(top_k or len(z), len(z)) - 1]
        cumulative = np.cumsum(np.sort(softmax(np.where(kept, z, -np.inf)))[::-1])
        hypothesis.assume(np.all(np.abs(cumulative - top_p) > 1e-9))
    np.testing.assert_allclose(sampling_distribution(logits, temperature, top_k, top_p), hf, atol=1e-12)


@hypothesis.settings(deadline=None, max_examples=100)
@hypothesis.given(
    logits=arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(1, 10)),
                  elements=st.floats(-30, 30, width=32)),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    top_k=st.none() | st.integers(1, 12),
    top_p=st.none() | st.floats(0.01, 1.0),
)
def test_rows_sum_to_one_and_a_batch_equals_row_by_row(logits, temperature, top_k, top_p):
    probs = sampling_distribution(logits, temperature, top_k, top_p)
    assert probs.dtype == np.float64 and probs.shape == logits.shape
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, atol=1e-12)
    assert np.all(probs >= 0)
    assert np.all(probs[np.arange(len(logits)), logits.argmax(axis=-1)] > 0)  # the argmax always survives
    for row, row_probs in zip(logits, probs):
        np.testing.assert_array_equal(sampling_distribution(row, temperature, top_k, top_p), row_probs)


def test_temperature_zero_is_a_one_hot_argmax_whatever_the_scale_of_the_logits():
    logits = np.array([[1e30, -1e30, 3e30], [5.0, 7.0, 7.0]], dtype=np.float32)  # no overflow, no nan
    np.testing.assert_array_equal(sampling_distribution(logits, temperature=0),
                                  [[0, 0, 1], [0, 1, 0]])  # ties: the first maximum, like np.argmax


def test_temperature_zero_ignores_top_k_and_top_p():
    logits = np.array([0.1, 2.0, 1.0])  # the argmax survives every top-k and top-p filter anyway
    np.testing.assert_array_equal(sampling_distribution(logits, 0, top_k=2, top_p=0.3), [0, 1, 0])


def test_minus_infinity_logits_get_probability_zero():
    with np.errstate(divide="ignore"):
        logits = np.log([0.0, 0.25, 0.75])
    np.testing.assert_allclose(sampling_distribution(logits, temperature=0.5), [0, 0.1, 0.9], atol=1e-15)
    np.testing.assert_allclose(sampling_distribution(logits, top_k=3), [0, 0.25, 0.75], atol=1e-15)


@pytest.mark.parametrize("options, name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature="1"), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=-3), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(top_k=True), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=-0.5), "top_p"),
    (dict(top_p=1.01), "top_p"), (dict(top_p=float("nan")), "top_p"),
])
def test_invalid_options_raise_a_one_line_value_error_naming_the_option(options, name):
    with pytest.raises(ValueError, match=name) as error:
        check_sampling_options(**options)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=name):
        sampling_distribution(np.zeros(3), **options)


def test_valid_edge_options_are_accepted():
    check_sampling_options(temperature=0, top_k=1, top_p=1.0)
    check_sampling_options(temperature=np.float32(0.7), top_k=np.int64(5), top_p=np.float64(1e-9))


class ChoiceOnly:
    """A fake rng with nothing but choice(n, p=...): what exact enumeration relies on."""

    def __init__(self, outcome):
        self.outcome, self.calls = outcome, []

    def choice(self, n, p):
        self.calls.append((n, list(p)))
        return np.int64(self.outcome)


def test_sample_draws_through_rng_choice_only_and_returns_a_python_int():
    rng = ChoiceOnly(2)
    token = sample(np.array([0.1, 0.2, 0.7]), rng)
    assert token == 2 and type(token) is int
    assert rng.calls == [(3, [0.1, 0.2, 0.7])]


def test_next_token_at_temperature_zero_needs_no_rng():
    assert next_token(np.array([0.0, 5.0, 1.0]), temperature=0, rng=None) == 1


def test_sample_with_a_real_generator_follows_the_probabilities():
    rng = np.random.default_rng(0)
    counts = np.bincount([sample(np.array([0.1, 0.0, 0.9]), rng) for _ in range(2000)], minlength=3)
    assert counts[1] == 0 and 120 < counts[0] < 290  # mean 200, sd 13.4: a 6-sigma band


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-12])
def test_a_tiny_temperature_gives_the_greedy_distribution_not_nan(temperature):
    """Found by the server's tests: logits / 5e-324 overflowed to +inf and softmax returned NaN."""
    logits = np.array([[3.0, -1.0, 2.5, 0.0], [-7.0, 1.0, 0.5, 1.0 - 1e-9]])
    probs = sampling_distribution(logits, temperature=temperature, top_k=3)
    assert np.all(np.isfinite(probs))
    np.testing.assert_array_equal(probs, sampling_distribution(logits, temperature=0))


@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 3, 7)])
def test_greedy_distribution_is_one_hot_at_the_first_argmax_for_any_leading_shape(shape):
    z = np.random.default_rng(1).integers(0, 3, shape).astype(np.float32)  # many ties: the first one wins
    reference = (np.arange(shape[-1]) == np.argmax(z, axis=-1)[..., None]).astype(np.float64)
    got = greedy_distribution(z)
    assert got.shape == shape and got.dtype == np.float64
    assert np.array_equal(got, reference), np.abs(got - reference).max()
