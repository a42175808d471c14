"""Speculative decoding is exactly right: proofs by enumeration, not statistics (issue 3, item 4).

Every test that compares distributions runs the REAL code (verify_round, speculative_generate,
generate) under exact.exact_distribution, which walks every random outcome with probability > 0.
Both sides are exact, so the tolerance is float rounding, 1e-12; the broken variants of
broken_kernels.py miss by more than 1e-2.
"""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis.extra.numpy import arrays

from gpt2np.decoding.autoregressive import generate
from gpt2np.teach.broken_kernels import BROKEN_VARIANTS
from gpt2np.teach.exact import exact_distribution, max_abs_difference, total_variation
from gpt2np.decoding.sampling import sample
from gpt2np.decoding.speculative import CALIBRATION_CALLS, speculative_generate
from gpt2np.decoding.speculative_kernel import output_distribution, residual_distribution, verify_round
from gpt2np.decoding.theory import alpha, predicted_speedup_mixed
from gpt2np.tokenizer.bpe import vocabulary_fingerprint
from gpt2np.teach.toy_models import ToyModel, random_toy_model

EXACT = 1e-12  # both sides are exact sums of products of probabilities: only rounding differs


# ---- 4a: one position, hypothesis-drawn p and q -------------------------------------------------

@st.composite
def distribution(draw, n_vocab, support=None):
    """A probability vector on n_vocab tokens (restricted to `support` if given): often with exact
    zeros, sometimes one-hot."""
    support = np.ones(n_vocab, bool) if support is None else support
    if draw(st.booleans()) and draw(st.booleans()):  # one-hot, a quarter of the time
        weights = np.zeros(n_vocab)
        weights[draw(st.sampled_from(np.flatnonzero(support).tolist()))] = 1.0
    else:
        weights = draw(arrays(np.float64, n_vocab, elements=st.just(0.0) | st.floats(1e-9, 1.0)))
        weights = np.where(support, weights, 0.0)
        if weights.sum() == 0:
            weights[np.flatnonzero(support)[0]] = 1.0
    return weights / weights.sum()


@st.composite
def target_and_draft(draw):
    """(p, q) on 2-8 tokens: independent, equal, or with disjoint supports."""
    n_vocab = draw(st.integers(2, 8))
    relation = draw(st.sampled_from(["independent", "equal", "disjoint"]))
    if relation == "disjoint":
        in_p = np.array(draw(st.lists(st.booleans(), min_size=n_vocab, max_size=n_vocab)))
        hypothesis.assume(0 < in_p.sum() < n_vocab)
        return draw(distribution(n_vocab, in_p)), draw(distribution(n_vocab, ~in_p))
    p = draw(distribution(n_vocab))
    return p, (p.copy() if relation == "equal" else draw(distribution(n_vocab)))


def one_position_outcomes(p, q, kernel=verify_round):
    """Exact {(emitted token, accepted?): probability} of one draft x ~ q checked against p."""
    def run(rng):
        x = sample(q, rng)  # Step 1 with K = 1: the draft proposes x ~ q
        result = kernel([x], q[None], np.stack([p, p]), rng)  # p_2 (the bonus row) is unused here
        return (x, True) if result.n_accepted == 1 else (result.next_token, False)
    return exact_distribution(run)


def token_marginal(outcomes, n_vocab):
    marginal = np.zeros(n_vocab)
    for (token, _), probability in outcomes.items():
        marginal[token] += probability
    return marginal


@hypothesis.settings(deadline=None, max_examples=300)
@hypothesis.given(target_and_draft())
def test_kernel_emits_exactly_the_target_distribution_at_one_position(p_q):
    p, q = p_q
    emitted = token_marginal(one_position_outcomes(p, q), len(p))
    np.testing.assert_allclose(emitted, p, rtol=0, atol=EXACT)


@hypothesis.settings(deadline=None, max_examples=300)
@hypothesis.given(target_and_draft())
def test_kernel_accepts_with_probability_sum_of_min_p_q(p_q):
    p, q = p_q
    accepted = sum(prob for (_, ok), prob in one_position_outcomes(p, q).items() if ok)
    assert abs(accepted - alpha(p, q)) <= EXACT


@hypothesis.settings(deadline=None, max_examples=300)
@hypothesis.given(target_and_draft())
def test_analytic_output_distribution_equals_p(p_q):
    p, q = p_q
    np.testing.assert_allclose(output_distribution(p, q), p, rtol=0, atol=EXACT)


def test_residual_of_equal_distributions_is_p_not_a_division_by_zero():
    p = np.array([0.25, 0.75])
    np.testing.assert_array_equal(residual_distribution(p, p.copy()), p)  # RuntimeWarnings are errors


def test_one_position_check_catches_the_softmax_residual():
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.2, 0.5, 0.3])
    emitted = token_marginal(one_position_outcomes(p, q, BROKEN_VARIANTS["softmax_residual"]["kernel"]), 3)
    assert np.abs(emitted - p).max() > 0.05  # the impossible token 2 gets probability


def test_greedy_kernel_matches_the_argmax_and_draws_no_randomness():
    p = np.eye(3)[[1, 2, 0]]  # argmax p_1 = 1, p_2 = 2, p_3 = 0
    q = np.eye(3)[[1, 0]]
    assert verify_round([1, 0], q, p, rng=None, greedy=True).__dict__ == \
        dict(n_accepted=1, next_token=2, kind="resample")
    assert verify_round([1, 2], q, p, rng=None, greedy=True).__dict__ == \
        dict(n_accepted=2, next_token=0, kind="bonus")


# ---- 4b: whole generations on toy models ---------------------------------------------------------

def toy_pair(seed, n_vocab, zero_fraction=0.0, eot_id=None):
    """A trigram target and a (weaker) bigram draft over the same tokens."""
    rng = np.random.default_rng(seed)
    target = random_toy_model(rng, n_vocab, order=3, zero_fraction=zero_fraction, eot_id=eot_id)
    draft = random_toy_model(rng, n_vocab, order=2, zero_fraction=zero_fraction, eot_id=eot_id)
    return target, draft


PAIRS = {
    "3 tokens, eot=2": dict(seed=1, n_vocab=3, eot_id=2),
    "4 tokens, 30% zeros": dict(seed=1, n_vocab=4, zero_fraction=0.3),
}


def target_distribution(target, prompt, n_tokens, **options):
    return exact_distribution(lambda rng: tuple(generate(target, prompt, n_tokens, rng=rng, **options)))


def speculative_distribution(target, draft, prompt, n_tokens, K, **options):
    def run(rng):
        return tuple(speculative_generate(target, draft, prompt, n_tokens, K, rng=rng, **options).tokens)
    return exact_distribution(run)


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("K", [1, 2, 3])
@pytest.mark.parametrize("n_tokens", [2, 3, 4])
def test_speculative_generate_samples_exactly_the_target_joint_distribution(pair, K, n_tokens):
    target, draft = toy_pair(**PAIRS[pair])
    expected = target_distribution(target, [0], n_tokens)
    got = speculative_distribution(target, draft, [0], n_tokens, K)
    assert max_abs_difference(got, expected) <= EXACT


@pytest.mark.parametrize("options", [
    dict(temperature=0.6), dict(temperature=1.7), dict(top_k=2), dict(top_p=0.7),
    dict(temperature=1.3, top_k=3, top_p=0.9),
], ids=str)
@pytest.mark.parametrize("pair", PAIRS)
def test_exact_with_temperature_top_k_and_top_p(pair, options):
    target, draft = toy_pair(**PAIRS[pair])
    expected = target_distribution(target, [1], 3, **options)
    got = speculative_distribution(target, draft, [1], 3, K=2, **options)
    assert max_abs_difference(got, expected) <= EXACT


@hypothesis.settings(deadline=None, max_examples=15)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n_vocab=st.integers(2, 3), K=st.integers(1, 3),
                  n_tokens=st.integers(2, 3), zero_fraction=st.sampled_from([0.0, 0.4]),
                  eot=st.booleans(), temperature=st.sampled_from([0.5, 1.0, 2.0]))
def test_exact_on_random_toy_pairs(seed, n_vocab, K, n_tokens, zero_fraction, eot, temperature):
    target, draft = toy_pair(seed, n_vocab, zero_fraction, eot_id=n_vocab - 1 if eot else None)
    expected = target_distribution(target, [0], n_tokens, temperature=temperature)
    got = speculative_distribution(target, draft, [0], n_tokens, K, temperature=temperature)
    assert max_abs_difference(got, expected) <= EXACT


@pytest.mark.parametrize("name", sorted(BROKEN_VARIANTS))
def test_exact_check_rejects_each_broken_variant(name):
    # negative controls: the same comparison must fail, by a lot, for every known bug.
    # K = 3 and N = 3 so that a round can reject after its first position (see broken_kernels.py).
    target, draft = toy_pair(**PAIRS["3 tokens, eot=2"])
    expected = target_distribution(target, [0], 3)
    assert max_abs_difference(speculative_distribution(target, draft, [0], 3, K=3), expected) <= EXACT
    broken = speculative_distribution(target, draft, [0], 3, K=3, **BROKEN_VARIANTS[name])
    assert total_variation(broken, expected) > 0.05  # measured: 0.069 to 0.20


# ---- 4d: temperature 0 ---------------------------------------------------------------------------

@hypothesis.settings(deadline=None, max_examples=150)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n_vocab=st.integers(2, 8), K=st.integers(1, 8),
                  n_tokens=st.integers(1, 16), zero_fraction=st.sampled_from([0.0, 0.5]),
                  prompt=st.lists(st.integers(0, 1), min_size=1, max_size=3))
def test_greedy_speculative_equals_target_greedy_token_for_token(seed, n_vocab, K, n_tokens,
                                                                 zero_fraction, prompt):
    target, draft = toy_pair(seed, n_vocab, zero_fraction)
    result = speculative_generate(target, draft, prompt, n_tokens, K, temperature=0)
    assert result.tokens == generate(target, prompt, n_tokens, temperature=0)


# ---- 4e: caches after any number of rounds ------------------------------------------------------

class CacheSpy:
    """Wraps a model and keeps every cache it hands out, so a test can inspect it afterwards."""

    def __init__(self, model):
        self.model, self.caches = model, []

    def __getattr__(self, name):  # n_vocab, n_ctx, eot_id, forward, tokenizer...
        return getattr(self.model, name)

    def new_cache(self):
        self.caches.append(self.model.new_cache())
        return self.caches[-1]


def assert_caches_match_recomputation(target, draft, prompt, n_tokens, K, atol=0.0, **options):
    """Run speculative_generate, then check each model's cache behaves exactly like a fresh cache fed
    the same tokens: feeding the rest of the sequence through it gives the logits a from-scratch
    forward pass over the whole sequence gives. A stale or missing cached position changes those.

    Works for any models with the common interface (toy models with atol=0; GPT-2 with atol ~1e-5,
    incremental vs one-shot float32). The target's cache must hold everything but the newest token;
    the draft's may lag behind (it catches up at its next call).
    """
    spies = CacheSpy(target), CacheSpy(draft)
    result = speculative_generate(*spies, prompt, n_tokens, K, **options)
    sequence = list(prompt) + result.tokens
    for spy in spies:
        (cache,) = spy.caches
        n_cached = len(cache)
        assert n_cached <= len(sequence) - 1 and (spy is spies[1] or n_cached == len(sequence) - 1)
        if hasattr(cache, "tokens"):  # a toy model's cache: compare the tokens themselves too
            assert cache.tokens == sequence[:n_cached]
        n_rest = len(sequence) - n_cached
        fresh = spy.model.forward(np.array(sequence), spy.model.new_cache(), n_logits=n_rest)
        cached = spy.model.forward(np.array(sequence[n_cached:]), cache, n_logits=n_rest)
        np.testing.assert_allclose(cached, fresh, rtol=0, atol=atol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_caches_after_any_number_of_rounds_equal_a_recomputation(seed, K, temperature):
    target, draft = toy_pair(seed, n_vocab=4, zero_fraction=0.3)
    for n_tokens in range(1, 13):  # a run of every length stops after a different number of rounds
        rng = np.random.default_rng(seed * 100 + n_tokens)
        assert_caches_match_recomputation(target, draft, [3, 1], n_tokens, K,
                                          temperature=temperature, rng=rng)


def test_caches_match_when_end_of_text_stops_inside_an_accepted_block():
    target, draft = eot_in_second_draft_pair()
    assert_caches_match_recomputation(target, draft, [0], 10, K=4, temperature=0)


# ---- the loop's promises: provenance, stats, checks ----------------------------------------------

def eot_in_second_draft_pair():
    """Target == draft, greedy path 0 -> 1 -> 2 (eot): with K = 4 both are accepted drafts."""
    table = np.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.8, 0.1, 0.1]])
    return ToyModel(table, eot_id=2), ToyModel(table, eot_id=2)


def test_end_of_text_inside_an_accepted_block_stops_generation_there():
    target, draft = eot_in_second_draft_pair()
    result = speculative_generate(target, draft, [0], 10, K=4, temperature=0, trace=True)
    assert result.tokens == [1, 2] and result.provenance == ["draft", "draft"]
    assert result.stats.rounds == 1 and result.trace[0].drafts == [1, 2, 0, 1]


@hypothesis.settings(deadline=None, max_examples=40)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), K=st.integers(1, 6), n_tokens=st.integers(1, 20))
def test_exactly_n_tokens_one_provenance_each_and_consistent_stats(seed, K, n_tokens):
    target, draft = toy_pair(seed, n_vocab=4, zero_fraction=0.3)
    rng = np.random.default_rng(seed)
    result = speculative_generate(target, draft, [0], n_tokens, K, rng=rng, trace=True)
    s = result.stats
    assert len(result.tokens) == len(result.provenance) == n_tokens
    assert s.rounds == s.target_calls == len(result.trace)
    assert s.drafted == sum(len(r.drafts) for r in result.trace) and s.accepted <= s.drafted
    assert result.provenance.count("draft") == s.accepted  # no eot here: every accepted draft is kept
    assert result.provenance.count("resample") == s.rejections
    ends = [result.provenance.count(kind) for kind in ("resample", "bonus", "target")]
    assert sum(ends) == s.rounds  # every round ends with one target token ("target": no drafts)
    assert s.tokens_per_target_call == n_tokens / s.rounds
    for record in result.trace:  # trace rows are the distributions the kernel saw
        assert record.q.shape == (len(record.drafts), 4) and record.p.shape == (len(record.drafts) + 1, 4)
        assert record.q_at_drafts == [record.q[i, x] for i, x in enumerate(record.drafts)]
        assert record.p_at_drafts == [record.p[i, x] for i, x in enumerate(record.drafts)]
        assert record.overlaps == [alpha(record.p[i], record.q[i]) for i in range(len(record.decisions))]
    assert s.alpha_hat is None or 0 <= s.alpha_hat <= 1


def test_K_is_clamped_to_the_tokens_still_wanted():
    target, draft = toy_pair(0, n_vocab=3)
    result = speculative_generate(target, draft, [0], 3, K=8, temperature=0, trace=True)
    assert len(result.tokens) == 3
    assert len(result.trace[0].drafts) == 2  # a round emits at most k + 1 tokens: k = 3 - 1


def test_context_check_is_prompt_plus_n_whatever_K():
    target, draft = toy_pair(0, n_vocab=3)
    target.n_ctx = draft.n_ctx = 6
    # prompt 2 + N 4 = n_ctx: fine even with K = 8, because K is clamped to what remains
    assert len(speculative_generate(target, draft, [0, 1], 4, K=8, rng=np.random.default_rng(0)).tokens) == 4
    with pytest.raises(ValueError, match=r"prompt \(2 tokens\) \+ n_tokens \(5\) = 7 .* 6 tokens"):
        speculative_generate(target, draft, [0, 1], 5, K=1, rng=np.random.default_rng(0))


def test_greedy_rounds_after_full_acceptance_catch_the_draft_cache_up():
    target, draft = toy_pair(3, n_vocab=4)
    result = speculative_generate(target, target, [0], 12, K=3, temperature=0, trace=True)
    assert result.provenance == (["draft"] * 3 + ["bonus"]) * 3  # same model: every draft accepted
    assert result.stats.alpha_hat == result.stats.alpha_empirical == 1.0
    assert result.stats.draft_timings[2][0] == 2  # rounds 2 and 3 feed the draft x_K + bonus at once


@pytest.mark.parametrize("K", [0, -1, 1.5, True, None])
def test_bad_K_raises(K):
    target, draft = toy_pair(0, n_vocab=3)
    with pytest.raises(ValueError, match="K"):
        speculative_generate(target, draft, [0], 4, K, temperature=0)


class FakeTokenizer:
    """What check_same_vocabulary reads of a tokenizer: its fingerprint."""

    def __init__(self, pieces):
        self.fingerprint = vocabulary_fingerprint(pieces, [], {})


@pytest.mark.parametrize("change, message", [
    (dict(n_vocab=4), "n_vocab 4 vs 3"),
    (dict(eot_id=1), "eot_id 1 vs None"),
    (dict(tokenizer=FakeTokenizer([b"a", b"b", b"X"])),
     f"fingerprints: draft {vocabulary_fingerprint([b'a', b'b', b'X'], [], {})[:12]}, "
     f"target {vocabulary_fingerprint([b'a', b'b', b'c'], [], {})[:12]}"),
])
def test_draft_with_another_vocabulary_is_refused(change, message):
    target, draft = toy_pair(0, n_vocab=3)
    target.tokenizer = FakeTokenizer([b"a", b"b", b"c"])
    draft.tokenizer = FakeTokenizer([b"a", b"b", b"c"])
    if "n_vocab" in change:
        draft = random_toy_model(np.random.default_rng(0), n_vocab=4)
    for name, value in change.items():
        setattr(draft, name, value)
    with pytest.raises(ValueError, match=message):
        speculative_generate(target, draft, [0], 4, K=2, temperature=0)


def test_same_vocabulary_in_two_tokenizer_objects_is_accepted():
    target, draft = toy_pair(0, n_vocab=3)
    target.tokenizer, draft.tokenizer = FakeTokenizer([b"a", b"b", b"c"]), FakeTokenizer([b"a", b"b", b"c"])
    assert len(speculative_generate(target, draft, [0], 4, K=2, temperature=0).tokens) == 4


def test_sampling_needs_an_rng_and_greedy_does_not():
    target, draft = toy_pair(0, n_vocab=3)
    with pytest.raises(ValueError, match="rng"):
        speculative_generate(target, draft, [0], 4, K=2, temperature=1.0)
    speculative_generate(target, draft, [0], 4, K=2, temperature=0, rng=None)


def test_c_and_v_are_measured_on_request_and_feed_the_predicted_speedups():
    target, draft = toy_pair(0, n_vocab=3)
    s = speculative_generate(target, draft, [0], 30, K=3, rng=np.random.default_rng(0), calibrate=True).stats
    one_token_calls = s.target_timings.get(1, (0, 0.0))[0]
    assert s.c > 0 and s.v > 0 and (s.calibration_seconds > 0) == (one_token_calls < CALIBRATION_CALLS)
    assert s.K_counts == {0: 1, 3: 14}  # the last round, one token left, drafts none (K clamped: counted as 0)
    assert s.predicted_speedup == predicted_speedup_mixed(s.alpha_hat, s.K_counts, s.c, lambda K: 1.0)
    assert s.predicted_speedup_refined == predicted_speedup_mixed(s.alpha_hat, s.K_counts, s.c,
                                                                  lambda K: s.v if K == 3 else 1.0)
    assert s.target_calls == sum(calls for calls, _ in s.target_timings.values())
