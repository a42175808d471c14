"""generate_batch (decoding/batched.py): every sequence of a batch gets exactly what generate gives it
alone, greedy token for token and sampled draw for draw (its own seeded rng), whatever the others do
(other prompt lengths, lengths, options, stops); finished sequences leave the packed call; each cache
is sized for its request; every check runs before any work.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2np
from conftest import random_params
from gpt2np.decoding import batched
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.batched import batch_stream, generate_batch
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.teach.toy_models import random_toy_model
from test_autoregressive import NoWork

SMALL = GPT2Config(n_vocab=37, n_ctx=64, n_embd=12, n_head=3, n_layer=2)
PROMPTS = ["ROMEO:\nBut soft", "First Citizen:\nBefore we proceed any further, hear me speak.", "O", "JULIET:\n"]


@pytest.fixture(scope="module")
def target():
    return gpt2np.load_model("shakespeare-2.6M")


def alone(model, prompts, n_tokens, options, seeds, stops):  # each sequence through generate
    return [generate(model, p, n, rng=None if s is None else np.random.default_rng(s), stop_tokens=stop, **o)
            for p, n, o, s, stop in zip(prompts, n_tokens, options, seeds, stops)]


def together(model, prompts, n_tokens, options, seeds, stops):  # the same requests in one batch
    per = {key: [o.get(key) for o in options] for key in ("temperature", "top_k", "top_p")}
    rngs = [None if s is None else np.random.default_rng(s) for s in seeds]
    return generate_batch(model, prompts, n_tokens, rng=rngs, stop_tokens=stops, **per)


def assert_same(batch, solo, what):
    for i, (b, s) in enumerate(zip(batch, solo)):
        first = next((j for j, (x, y) in enumerate(zip(b, s)) if x != y), min(len(b), len(s)))
        assert b == s, f"{what}: sequence {i} differs from its solo run at token {first} of {len(s)}"


def test_greedy_batch_equals_generate_per_sequence_on_the_bundled_target(target):
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    newline, space = target.tokenizer.encode("\n"), target.tokenizer.encode(" ")
    requests = (prompts, [60, 25, 80, 40], [{}] * 4, [None] * 4, [None, newline, space, None])
    solo = alone(target, *requests)
    assert len({len(s) for s in solo}) > 1, "the sequences should finish at different steps"
    assert_same(together(target, *requests), solo, "greedy, bundled target")


def test_sampled_batch_draws_what_each_sequence_draws_alone(target):
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    options = [dict(temperature=0.8), dict(temperature=1.2, top_k=20), dict(temperature=0), dict(top_p=0.9)]
    requests = (prompts, [50, 70, 30, 45], options, [11, 12, None, 13], [None, None, None, [10]])
    assert_same(together(target, *requests), alone(target, *requests), "sampled, bundled target")


@settings(deadline=None, max_examples=15)
@given(data=st.data(), n_seqs=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_any_batch_on_random_models(data, n_seqs, seed):
    rng = np.random.default_rng(seed)
    model = GPT2(SMALL, random_params(SMALL, seed=seed % 3))
    prompts = [rng.integers(0, SMALL.n_vocab, data.draw(st.integers(1, 20))).tolist() for _ in range(n_seqs)]
    n_tokens = [data.draw(st.integers(1, 30)) for _ in range(n_seqs)]
    seeds = [data.draw(st.none() | st.integers(0, 99)) for _ in range(n_seqs)]
    options = [{} if s is None else dict(temperature=data.draw(st.sampled_from([0.5, 1.0, 2.0]))) for s in seeds]
    stops = [data.draw(st.none() | st.lists(st.integers(0, SMALL.n_vocab - 1), max_size=3)) for _ in range(n_seqs)]
    requests = (prompts, n_tokens, options, seeds, stops)
    assert_same(together(model, *requests), alone(model, *requests), "random small model")


def test_toy_models_run_the_same_loop_one_call_per_sequence():
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    requests = ([[0], [1, 2, 3], [4, 4]], [7, 3, 12], [{}, dict(temperature=0.7), dict(top_k=2)], [None, 1, 2],
                [None, None, 3])
    assert_same(together(model, *requests), alone(model, *requests), "toy model")


def test_finished_sequences_leave_the_packed_call_and_caches_fit_their_requests(target, monkeypatch):
    calls = []

    def recording(model, pairs):  # each packed call: (n_ids, cache.n_ctx) per sequence in it
        calls.append([(len(ids), cache.n_ctx) for ids, cache in pairs])
        return batched_forward(model, pairs)
    batched_forward = batched.forward_packed
    monkeypatch.setattr(batched, "forward_packed", recording)
    prompts = [[5, 6, 7], [8], [9, 10]]
    steps = list(batch_stream(target, prompts, [4, 1, 6]))
    assert [len(call) for call in calls] == [3, 2, 2, 2, 1, 1]                   # 1 token, then 4, then 6
    assert calls[0] == [(3, 3 + 4 - 1), (1, 1 + 1 - 1), (2, 2 + 6 - 1)]        # prompt + n_tokens - 1 positions
    assert [[i for i, _ in step] for step in steps] == [[0, 1, 2], [0, 2], [0, 2], [0, 2], [2], [2]]
    assert all(event.provenance == ["target"] and len(event.tokens) == 1 for step in steps for _, event in step)


def test_a_generator_shared_between_sequences_is_refused_and_would_break_exactness(target):
    prompts = [target.tokenizer.encode(p) for p in PROMPTS[:2]]
    with pytest.raises(ValueError, match="sequences 0 and 1 share one generator"):
        generate_batch(target, prompts, 20, rng=np.random.default_rng(0))

    class SameCoins:  # the negative control: two sequences drawing from one generator under two names
        def __init__(self, rng):
            self.rng = rng

        def choice(self, *args, **kwargs):
            return self.rng.choice(*args, **kwargs)
    shared = np.random.default_rng(7)
    batch = generate_batch(target, prompts, 30, temperature=1.0, rng=[SameCoins(shared), SameCoins(shared)])
    solo = [generate(target, p, 30, temperature=1.0, rng=np.random.default_rng(7)) for p in prompts]
    assert batch[0] != solo[0] or batch[1] != solo[1], "shared coins matched the solo runs: the test could not fail"


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[1, 2, 3]), "for one prompt pass \\[prompt_ids\\]"),
    (dict(prompts=[]), "non-empty list of prompts"),
    (dict(prompts=np.zeros((0, 3), dtype=int)), "non-empty list of prompts .* got ndarray of shape \\(0, 3\\)"),
    (dict(n_tokens=[3, 3]), "n_tokens must be one value for every sequence or a list of one per prompt \\(3\\)"),
    (dict(temperature=[0, -1, 0]), "sequence 1: temperature must be a finite number"),
    (dict(temperature=[0, 0, 0.5]), "sequence 2: sampling \\(temperature 0.5 > 0\\) needs rng"),
    (dict(n_tokens=[3, 3, 9]),
     "sequence 2: prompt \\(2 tokens\\) \\+ n_tokens \\(9\\) = 11 exceeds the context of 10"),
    (dict(prompts=[[1], [7], [2]]), "sequence 1: prompt token ids must be in \\[0, 5\\): 7 at position 0"),
    (dict(stop_tokens=[[1], None]), "stop_tokens must be one value for every sequence or a list of one per prompt"),
    (dict(stop_tokens=[None, [9], 2]), "sequence 1: stop_tokens must be in \\[0, 5\\)"),
    (dict(rng=[None, 5, None], temperature=0), "sequence 1: rng must be a np.random.Generator"),
])
def test_bad_requests_are_one_line_errors_before_any_work(kwargs, message):
    arguments = dict(prompts=[[1], [2, 3], [4, 0]], n_tokens=3) | kwargs
    with pytest.raises(ValueError, match=message) as info:
        generate_batch(NoWork(), arguments.pop("prompts"), arguments.pop("n_tokens"), **arguments)
    assert "\n" not in str(info.value)


def test_the_model_must_come_first():
    with pytest.raises(ValueError, match="model must be a model"):
        generate_batch([[1, 2]], random_toy_model(np.random.default_rng(0)), 3)


# ---- what callers pass: any integer dtype, arrays as lists, buffers they reuse, streams they loop over -------

@pytest.mark.parametrize("dtype", [np.uint64, np.int64, np.uint32, np.int8])
def test_prompts_of_any_integer_dtype_give_generate_s_tokens(dtype):
    """A np.uint64 prompt packed with int64 ids (a list prompt, any decode step) once concatenated to
    float64, which cannot index wte: an IndexError inside the pass."""
    model = GPT2(SMALL, random_params(SMALL, seed=0))
    prompts = [np.array([1, 2, 3], dtype=dtype), [4, 5]]
    expected = [generate(model, [1, 2, 3], 4), generate(model, [4, 5], 4)]
    assert generate_batch(model, prompts, 4) == expected
    assert generate_batch(model, np.array([[1, 2], [4, 5]], dtype=dtype), 4) == \
        [generate(model, [1, 2], 4), generate(model, [4, 5], 4)]


def test_one_dimensional_arrays_are_per_sequence_lists():
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    prompts, seeds = [[0], [1, 2]], [5, 6]
    as_lists = generate_batch(model, prompts, [3, 6], temperature=[0.5, 1.5], top_k=[2, 4],
                              rng=[np.random.default_rng(s) for s in seeds])
    as_arrays = generate_batch(model, prompts, np.array([3, 6]), temperature=np.array([0.5, 1.5]),
                               top_k=np.array([2, 4]), rng=[np.random.default_rng(s) for s in seeds])
    assert as_arrays == as_lists and [len(t) for t in as_arrays] == [3, 6]
    with pytest.raises(ValueError, match="n_tokens must be one value for every sequence or a list of one per "
                                         "prompt \\(2\\), got a ndarray of 3"):
        generate_batch(model, prompts, np.array([3, 6, 1]))


@pytest.mark.parametrize("name", ["n_tokens", "temperature", "top_k"])
def test_a_column_of_values_is_one_line_naming_its_shape(name):
    """np.full((300, 1), 3) as n_tokens was taken as one value for every sequence, and its error printed the
    array: 300 lines blamed on sequence 0."""
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    arguments = dict(n_tokens=3, temperature=np.full((300, 1), 0.5) if name == "temperature" else None,
                     rng=[np.random.default_rng(s) for s in range(300)])
    arguments[name] = np.full((300, 1), 3 if name != "temperature" else 0.5)
    with pytest.raises(ValueError) as info:
        generate_batch(model, [[0]] * 300, arguments.pop("n_tokens"), **arguments)
    assert str(info.value) == (f"{name} must be one value for every sequence or a 1-D list of one per prompt (300), "
                               "got an array of shape (300, 1)"), str(info.value)[:300]


def test_a_value_given_once_is_blamed_on_no_sequence():
    """n_tokens=0 once for every prompt said "sequence 0: ..."; an error every sequence shares is said once, and a
    per-sequence one still names its sequence."""
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    with pytest.raises(ValueError, match="^n_tokens must be an integer >= 1, got 0$"):
        generate_batch(model, [[0], [1, 2]], 0)
    with pytest.raises(ValueError, match="^sequence 1: n_tokens must be an integer >= 1, got 0$"):
        generate_batch(model, [[0], [1, 2]], [2, 0])


def test_the_stop_rule_a_flat_list_stops_every_sequence_lists_are_per_sequence():
    """The rule of the module docstring: [a, b] is one stop set for all, whatever the number of prompts."""
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    prompts = [[0], [1, 2]]
    a, b = generate(model, prompts[0], 1)[0], generate(model, prompts[1], 1)[0]
    assert a != b, "the two prompts' first greedy tokens should differ for this test to tell the rules apart"
    flat = generate_batch(model, prompts, 6, stop_tokens=[a, b])
    assert flat == [generate(model, p, 6, stop_tokens=[a, b]) for p in prompts] == [[a], [b]]
    assert generate_batch(model, prompts, 6, stop_tokens=[[b], [a]]) == \
        [generate(model, prompts[0], 6, stop_tokens=[b]), generate(model, prompts[1], 6, stop_tokens=[a])]
    assert generate_batch(model, prompts, 6, stop_tokens=[b, None]) == \
        [generate(model, prompts[0], 6, stop_tokens=b), generate(model, prompts[1], 6)]


def test_an_array_prompt_is_copied_when_the_stream_is_made():
    model = GPT2(SMALL, random_params(SMALL, seed=0))
    buffer = np.array([1, 2, 3])
    stream = batch_stream(model, [buffer, [4]], 4)
    buffer[:] = [7, 8, 9]  # the caller reuses its buffer before the first step
    first = [t for step in stream for i, event in step if i == 0 for t in event.tokens]
    assert first == generate(model, [1, 2, 3], 4) != generate(model, [7, 8, 9], 4)


def test_batch_stream_keeps_every_sequence_s_tokens_after_a_for_loop():
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    prompts, n_tokens = [[0], [1, 2], [3]], [4, 1, 6]
    stream = batch_stream(model, prompts, n_tokens)
    seen = [[] for _ in prompts]
    for step in stream:
        for i, event in step:
            seen[i] += event.tokens
    assert stream.result == seen == generate_batch(model, prompts, n_tokens)
    assert list(stream) == [] and stream.result == seen, "iterated again: nothing more, the result kept"
    assert stream.run() == seen and sorted(stream.tokens) == sorted(t for tokens in seen for t in tokens)


def test_a_stream_stopped_mid_way_keeps_each_sequence_s_tokens_apart(target):
    """.tokens interleaves the sequences step by step; .outputs keeps each one's tokens, so a stream stopped
    mid-way (Ctrl-C, close()) says what each sequence had: a prefix of its whole run; at the end, .result."""
    prompts = [target.tokenizer.encode(p) for p in PROMPTS[:3]]
    whole = generate_batch(target, prompts, [9, 4, 7], temperature=0)
    stream = batch_stream(target, prompts, [9, 4, 7], temperature=0)
    for _ in range(5):
        next(stream)
    stream.close()
    assert stream.outputs == [tokens[:5] for tokens in whole] and len(stream.tokens) == 14, stream.outputs
    stream = batch_stream(target, prompts, [9, 4, 7], temperature=0)
    assert stream.run() == stream.outputs == whole
