"""stop_tokens: ids that end generation exactly as <|endoftext|> does (issue 27, item 8).

Other repositories call them end tokens (`end_tokens`, Hugging Face's list-valued eos_token_id).
Every generation function takes `stop_tokens`; the stream stops right after the first one, which it
keeps. The oracle is the unstopped sequence cut after its first stop token; speculative decoding
must give exactly that at temperature 0 and exactly plain decoding's distribution when sampling
(the exact enumeration of tests/decoding/test_speculative_exact.py), with a negative control.
"""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import gpt2np
from gpt2np.decoding import speculative
from gpt2np.model.config import PRESETS
from gpt2np.teach.exact import exact_distribution, max_abs_difference, total_variation
from gpt2np.teach.toy_models import ToyModel, random_toy_model

EXACT = 1e-12  # both sides are exact sums of products of probabilities: only rounding differs


def cut_after_first_stop(tokens, stops):
    """The oracle: tokens up to and including the first one in stops."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokens[:end]


def toy_pair(seed, n_vocab, eot_id=None):
    rng = np.random.default_rng(seed)
    return (random_toy_model(rng, n_vocab, order=3, eot_id=eot_id),
            random_toy_model(rng, n_vocab, order=2, eot_id=eot_id))


def all_five(target, draft, prompt, n_tokens, **options):
    """{function name: new tokens} for the same request through each generation function."""
    return {
        "generate": gpt2np.generate(target, prompt, n_tokens, **options),
        "plain_stream": gpt2np.plain_stream(target, prompt, n_tokens, **options).run(),
        "generate_without_cache": gpt2np.generate_without_cache(target, prompt, n_tokens, **options),
        "speculative_generate": gpt2np.speculative_generate(target, draft, prompt, n_tokens, K=3, **options).tokens,
        "speculative_stream": gpt2np.speculative_stream(target, draft, prompt, n_tokens, K=3, **options).run().tokens,
        "speculative, ngram": gpt2np.speculative_generate(target, gpt2np.NgramDrafter(), prompt, n_tokens,
                                                          **options).tokens,
    }


@pytest.fixture(scope="module")
def gpt2_pair():
    """Tiny random GPT-2s (n_vocab 64): the real forward pass, draft and target of the same shape."""
    return (gpt2np.random_model(PRESETS["tiny"], seed=1, std=0.3),
            gpt2np.random_model(PRESETS["tiny"], seed=2, std=0.3))


def test_every_function_stops_after_the_first_stop_token_and_keeps_it(gpt2_pair):
    target, draft = gpt2_pair
    prompt = [5, 9, 5, 9, 5]
    full = gpt2np.generate(target, prompt, 24, temperature=0)
    stops_tried = 0
    for stop in sorted(set(full[3:])):  # stops that occur after a few tokens: drafts may carry them
        expected = cut_after_first_stop(full, {stop})
        got = all_five(target, draft, prompt, 24, temperature=0, stop_tokens=[stop])
        assert all(tokens == expected for tokens in got.values()), (stop, expected, got)
        stops_tried += len(expected) < len(full)
    assert stops_tried >= 2, f"only {stops_tried} stop tokens ended a run early: a weak test"


def test_stop_tokens_in_an_accepted_block_end_it_there():
    """Target == draft (every draft accepted), greedy path 0 -> 1 -> 2 -> 0: with K = 4 a stop at 2
    is the second accepted draft of the first round; the two drafts after it are dropped."""
    table = np.array([[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.8, 0.1, 0.1]])
    target, draft = ToyModel(table), ToyModel(table)
    result = gpt2np.speculative_generate(target, draft, [0], 10, K=4, temperature=0, stop_tokens=[2], trace=True)
    assert result.tokens == [1, 2] and result.provenance == ["draft", "draft"]
    assert result.stats.rounds == 1 and result.trace[0].drafts == [1, 2, 0, 1]


def test_stream_events_end_at_the_stop_token(gpt2_pair):
    target, draft = gpt2_pair
    full = gpt2np.generate(target, [3, 4], 20, temperature=0)
    stop = full[6]
    for stream in (gpt2np.plain_stream(target, [3, 4], 20, stop_tokens=stop),
                   gpt2np.speculative_stream(target, draft, [3, 4], 20, K=2, stop_tokens=stop)):
        events = list(stream)
        assert events[-1].tokens[-1] == stop and stream.tokens == cut_after_first_stop(full, {stop})
        assert stop not in [t for e in events[:-1] for t in e.tokens]


def test_n_tokens_first_eot_still_stops_and_the_prompt_never_stops():
    model = ToyModel(np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=float), eot_id=3)
    assert gpt2np.generate(model, [0], 1, stop_tokens=[2]) == [1]             # n_tokens comes first
    assert gpt2np.generate(model, [0], 9, stop_tokens=[0]) == [1, 2, 3]       # eot stops as before
    assert gpt2np.generate(model, [1, 2], 9, stop_tokens=[2]) == [3]          # eot before the stop
    assert gpt2np.generate(model, [3, 2, 0], 9, stop_tokens=[2, 0]) == [1, 2]  # in the prompt: no stop


@pytest.mark.parametrize("stop_tokens", [2, np.int64(2), [2], (2, 2), {2}, np.array([2], np.uint8), [], None])
def test_one_id_or_any_sequence_of_ids(stop_tokens):
    model = ToyModel(np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=float), eot_id=None if stop_tokens else 2)
    assert gpt2np.generate(model, [0], 9, stop_tokens=stop_tokens) == [1, 2]


@pytest.mark.parametrize("stop_tokens, message", [
    ([64], r"stop_tokens must be in \[0, 64\): 64 at position 0"),
    ([-1, 3], r"-1 at position 0"),
    ("\n", "got a string: encode text first"),
    ([1.0], "float64 values"),
    ([[1, 2]], r"shape \(1, 2\)"),
    (True, "bool"),
])
@pytest.mark.parametrize("function", ["generate", "speculative_stream"])
def test_bad_stop_tokens_are_one_line_errors_before_any_work(gpt2_pair, monkeypatch, stop_tokens, message,
                                                             function):
    target, draft = gpt2_pair
    monkeypatch.setattr(target, "forward", lambda *a, **k: pytest.fail("forward ran before the check"))
    call = {"generate": lambda: gpt2np.generate(target, [1, 2], 5, stop_tokens=stop_tokens),
            "speculative_stream": lambda: gpt2np.speculative_stream(target, draft, [1, 2], 5, stop_tokens=stop_tokens)}
    with pytest.raises(ValueError, match=message) as info:
        call[function]()
    assert str(info.value).startswith("stop_tokens") and "\n" not in str(info.value)


@hypothesis.settings(deadline=None, max_examples=80)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n_vocab=st.integers(2, 8), K=st.integers(1, 6),
                  n_tokens=st.integers(1, 14), stops=st.sets(st.integers(0, 7), max_size=3),
                  eot=st.booleans())
def test_greedy_speculative_with_stop_tokens_is_the_cut_greedy_sequence(seed, n_vocab, K, n_tokens, stops, eot):
    target, draft = toy_pair(seed, n_vocab, eot_id=n_vocab - 1 if eot else None)
    stops = sorted(s for s in stops if s < n_vocab)
    full = gpt2np.generate(target, [0], n_tokens, temperature=0)
    result = gpt2np.speculative_generate(target, draft, [0], n_tokens, K, temperature=0, stop_tokens=stops)
    assert result.tokens == cut_after_first_stop(full, set(stops))
    assert len(result.provenance) == len(result.tokens)


# ---- sampling: the same distribution, by exact enumeration --------------------------------------

def plain_distribution(target, prompt, n_tokens, stops, **options):
    return exact_distribution(lambda rng: tuple(gpt2np.generate(target, prompt, n_tokens, rng=rng,
                                                                stop_tokens=stops, **options)))


def speculative_distribution(target, draft, prompt, n_tokens, K, stops, **options):
    return exact_distribution(lambda rng: tuple(gpt2np.speculative_generate(
        target, draft, prompt, n_tokens, K, rng=rng, stop_tokens=stops, **options).tokens))


@pytest.mark.parametrize("stops", [[1], [0, 2], [2]])
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("options", [dict(), dict(temperature=0.7, top_k=2)], ids=str)
def test_speculative_samples_exactly_plain_decodings_distribution_with_stop_tokens(stops, K, options):
    target, draft = toy_pair(seed=1, n_vocab=3)
    expected = plain_distribution(target, [0], 4, stops, **options)
    assert any(len(seq) < 4 for seq in expected), "no sequence stopped early: a weak test"
    got = speculative_distribution(target, draft, [0], 4, K, stops, **options)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)


def test_exact_check_fails_when_a_round_keeps_drafts_after_a_stop_token(monkeypatch):
    """Negative control: a loop that cuts a round only at eot (the stop tokens ignored inside a
    round, honoured between rounds) emits tokens after the stop: the comparison must catch it."""
    target, draft = toy_pair(seed=1, n_vocab=3)
    expected = plain_distribution(target, [0], 4, [1])
    honest = speculative.round_tokens
    monkeypatch.setattr(speculative, "round_tokens",
                        lambda result, stops: honest(result, frozenset()))
    broken = speculative_distribution(target, draft, [0], 4, 3, [1])
    assert total_variation(broken, expected) > 0.05, total_variation(broken, expected)  # measured: 0.38
