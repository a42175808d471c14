"""ContinuousBatch (decoding/continuous.py): sequences join a running batch at any step, finish or are
cancelled at any step, and every one that runs to its end gets exactly what generate gives it alone
(greedy token for token, sampled draw for draw from its own seeded rng); each step is one packed
forward pass in which a newcomer's prompt rows ride with the others' last tokens.
"""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2np
from conftest import random_params
from gpt2np.decoding import batched
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.continuous import ContinuousBatch
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.teach.toy_models import random_toy_model
from test_autoregressive import NoWork

SMALL = GPT2Config(n_vocab=37, n_ctx=64, n_embd=12, n_head=3, n_layer=2)
PROMPTS = ["ROMEO:\nBut soft", "First Citizen:\nBefore we proceed any further, hear me speak.", "O", "JULIET:\n",
           "KING HENRY:\nOnce more unto the breach", "\n"]


@pytest.fixture(scope="module", params=["shakespeare-2.6M", "shakespeare-260K"])
def bundled(request):  # the bundled pair: the target and its draft model, each run as the batch's model
    return gpt2np.load_model(request.param)


def rng_of(seed):
    return None if seed is None else np.random.default_rng(seed)


def solo(model, request):  # request: dict(prompt, n, options, seed, stops, ...)
    return generate(model, request["prompt"], request["n"], rng=rng_of(request["seed"]),
                    stop_tokens=request["stops"], **request["options"])


def run_schedule(model, requests, prefill_chunk=None):
    """Drive a batch: request i is added before step request["join"], cancelled before step
    request.get("cancel"); returns (tokens per request, sizes of the batch at each step)."""
    batch, handles, tokens, sizes, step = ContinuousBatch(model, prefill_chunk), {}, {}, [], 0
    while step == 0 or batch or any(r["join"] >= step for r in requests):
        for i, r in enumerate(requests):
            if r["join"] == step:
                handles[i] = batch.add(r["prompt"], r["n"], rng=rng_of(r["seed"]), stop_tokens=r["stops"],
                                       **r["options"])
            if r.get("cancel") == step and handles[i] in batch:
                tokens[i] = batch.tokens_of(handles[i])
                assert batch.cancel(handles[i]) and handles[i] not in batch
        sizes.append(len(batch))
        for handle, event in batch.step():
            assert event.provenance == ["target"] and len(event.tokens) == 1 and event.K == 0
            if handle not in batch:  # finished in this step: it has left already
                i = next(i for i, h in handles.items() if h == handle)
                tokens[i] = batch.pop_tokens(handle)
        step += 1
    return [tokens[i] for i in range(len(requests))], sizes


def assert_each_as_alone(model, requests, got, what):
    for i, (r, tokens) in enumerate(zip(requests, got)):
        expected = solo(model, r)
        if "cancel" in r:  # cancelled mid-way: what it drew so far is a prefix of its solo run
            expected = expected[:len(tokens)]
            assert len(tokens) < r["n"], f"{what}: request {i} was not cancelled mid-way ({len(tokens)} tokens)"
        first = next((j for j, (x, y) in enumerate(zip(tokens, expected)) if x != y), min(len(tokens), len(expected)))
        assert tokens == expected, (f"{what}: request {i} differs from its solo run at token {first} of "
                                    f"{len(expected)} ({len(tokens)} drawn)")


def bundled_requests(model):
    """Six requests joining at steps 0..9, different lengths and options, stops, one cancelled at step 12."""
    ids = [model.tokenizer.encode(p) for p in PROMPTS]
    newline, space = model.tokenizer.encode("\n"), model.tokenizer.encode(" ")
    rows = [(0, 40, {}, None, None), (0, 25, dict(temperature=0.8), 11, newline), (3, 30, {}, None, space),
            (3, 50, dict(temperature=1.1, top_k=20), 12, None), (4, 35, {}, None, None),
            (9, 20, dict(top_p=0.9), 13, None)]
    requests = [dict(prompt=p, join=j, n=n, options=o, seed=s, stops=stop) for p, (j, n, o, s, stop) in zip(ids, rows)]
    requests[4]["cancel"] = 12
    return requests


def test_joining_finishing_and_cancelled_sequences_each_get_their_solo_tokens(bundled):
    requests = bundled_requests(bundled)
    got, sizes = run_schedule(bundled, requests)
    assert max(sizes) >= 4 and len({len(t) for t in got}) > 2, f"a weak schedule: sizes {sizes}"
    assert_each_as_alone(bundled, requests, got, bundled.name)


def test_a_chunked_prefill_gives_the_same_tokens_and_draws_nothing_early(bundled):
    requests = bundled_requests(bundled)
    got, sizes = run_schedule(bundled, requests, prefill_chunk=3)
    assert_each_as_alone(bundled, requests, got, f"{bundled.name}, prefill_chunk=3")
    batch = ContinuousBatch(bundled, prefill_chunk=3)
    batch.add(list(range(7)), 2)
    assert [batch.step() for _ in range(2)] == [[], []] and len(batch.step()) == 1  # 3 + 3 + 1 rows, then a token


def test_one_packed_call_per_step_with_the_newcomer_prefill_inside_it(bundled, monkeypatch):
    calls = []

    def recording(model, pairs):
        calls.append([(len(ids), cache.n_ctx) for ids, cache in pairs])
        return packed(model, pairs)
    packed = batched.forward_packed
    monkeypatch.setattr(batched, "forward_packed", recording)
    batch = ContinuousBatch(bundled)
    a = batch.add([5, 6, 7], 3)
    batch.step()
    b = batch.add([8, 9], 4)
    batch.step()
    batch.step()                                                 # a's third token: a leaves
    assert a not in batch and batch.running == [b] and len(batch) == 1
    batch.step()
    assert calls == [[(3, 5)], [(1, 5), (2, 5)], [(1, 5), (1, 5)], [(1, 5)]], calls
    assert batch.pop_tokens(a) == generate(bundled, [5, 6, 7], 3)


@settings(deadline=None, max_examples=15)
@given(data=st.data(), n_seqs=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_any_schedule_on_random_models(data, n_seqs, seed):
    rng = np.random.default_rng(seed)
    model = GPT2(SMALL, random_params(SMALL, seed=seed % 3))
    requests = []
    for _ in range(n_seqs):
        s = data.draw(st.none() | st.integers(0, 99))
        requests.append(dict(prompt=rng.integers(0, SMALL.n_vocab, data.draw(st.integers(1, 20))).tolist(),
                             join=data.draw(st.integers(0, 8)), n=data.draw(st.integers(1, 30)), seed=s,
                             options={} if s is None else dict(temperature=data.draw(st.sampled_from([0.5, 1.0]))),
                             stops=data.draw(st.none() | st.lists(st.integers(0, SMALL.n_vocab - 1), max_size=3))))
    if data.draw(st.booleans()):
        requests[0]["cancel"] = requests[0]["join"] + 1
    got, _ = run_schedule(model, requests, prefill_chunk=data.draw(st.none() | st.integers(1, 8)))
    if "cancel" in requests[0] and len(got[0]) == len(solo(model, requests[0])):
        del requests[0]["cancel"]  # it had finished before its cancel
    assert_each_as_alone(model, requests, got, "random small model")


def test_toy_models_one_forward_call_per_sequence():
    model = random_toy_model(np.random.default_rng(3), n_vocab=5, order=2)
    requests = [dict(prompt=[0], join=0, n=7, options={}, seed=None, stops=None),
                dict(prompt=[1, 2, 3], join=2, n=9, options=dict(temperature=0.7), seed=1, stops=None),
                dict(prompt=[4, 4], join=2, n=12, options=dict(top_k=2), seed=2, stops=[3], cancel=5),
                dict(prompt=[2], join=6, n=4, options={}, seed=None, stops=None)]
    got, _ = run_schedule(model, requests)
    assert_each_as_alone(model, requests, got, "toy model")


def test_a_generator_shared_with_a_running_sequence_is_refused_and_would_break_exactness(bundled):
    batch, shared = ContinuousBatch(bundled), np.random.default_rng(0)
    batch.add([1, 2], 5, rng=shared)
    with pytest.raises(ValueError, match="already draws from this generator"):
        batch.add([3], 5, rng=shared)

    class SameCoins:  # the negative control: two sequences drawing from one generator under two names
        def __init__(self, rng):
            self.rng = rng

        def choice(self, *args, **kwargs):
            return self.rng.choice(*args, **kwargs)
    coins, prompts = np.random.default_rng(7), [bundled.tokenizer.encode(p) for p in PROMPTS[:2]]
    batch = ContinuousBatch(bundled)
    handles = [batch.add(p, 30, temperature=1.0, rng=SameCoins(coins)) for p in prompts]
    while batch:
        batch.step()
    alone = [generate(bundled, p, 30, temperature=1.0, rng=np.random.default_rng(7)) for p in prompts]
    assert [batch.pop_tokens(h) for h in handles] != alone, "shared coins matched the solo runs: cannot fail"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1), "temperature must be a finite number"),
    (dict(temperature=0.5), "sampling \\(temperature 0.5 > 0\\) needs rng"),
    (dict(n_tokens=9), "prompt \\(2 tokens\\) \\+ n_tokens \\(9\\) = 11 exceeds the context of 10"),
    (dict(n_tokens=0), "n_tokens must be an integer >= 1"),
    (dict(prompt_ids=[1, 7]), "prompt token ids must be in \\[0, 5\\): 7 at position 1"),
    (dict(prompt_ids=[]), "the prompt is empty"),
    (dict(stop_tokens=[9]), "stop_tokens must be in \\[0, 5\\)"),
    (dict(rng=5, temperature=0), "rng must be a np.random.Generator"),
])
def test_bad_requests_are_one_line_errors_before_any_work(kwargs, message):
    arguments = dict(prompt_ids=[1, 2], n_tokens=3) | kwargs
    batch = ContinuousBatch(NoWork())
    with pytest.raises(ValueError, match=message) as info:
        batch.add(arguments.pop("prompt_ids"), arguments.pop("n_tokens"), **arguments)
    assert "\n" not in str(info.value) and len(batch) == 0 and batch.step() == []


@pytest.mark.parametrize("make, message", [
    (lambda: ContinuousBatch([[1, 2]]), "model must be a model"),
    (lambda: ContinuousBatch(NoWork(), prefill_chunk=0), "prefill_chunk must be None"),
    (lambda: ContinuousBatch(NoWork(), prefill_chunk=2.5), "prefill_chunk must be None"),
])
def test_bad_batches_are_one_line_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_cancelling_an_unknown_or_finished_handle_is_false(bundled):
    batch = ContinuousBatch(bundled)
    handle = batch.add([1], 1)
    assert len(batch.step()) == 1 and handle not in batch
    assert not batch.cancel(handle) and not batch.cancel(12345)
    assert batch.pop_tokens(handle) == generate(bundled, [1], 1)


# ---- prompts of any integer dtype, buffers the caller reuses, handles that are not ints ----------------

def run_to_the_end(batch, handles):
    while batch:
        batch.step()
    return [batch.pop_tokens(h) for h in handles]


@pytest.mark.parametrize("dtype", [np.uint64, np.int64, np.uint32, np.int8])
def test_a_newcomer_of_any_integer_dtype_joins_a_running_batch(dtype):
    """A np.uint64 prompt packed with the running sequence's int64 token once made the pass's ids float64:
    an IndexError at every step from then on, the running sequence stuck until the newcomer was cancelled."""
    model = GPT2(SMALL, random_params(SMALL, seed=0))
    batch = ContinuousBatch(model)
    running = batch.add([1, 2], 10)
    batch.step()
    newcomer = batch.add(np.array([3, 4], dtype=dtype), 5)
    assert run_to_the_end(batch, [running, newcomer]) == [generate(model, [1, 2], 10), generate(model, [3, 4], 5)]


def test_add_copies_an_array_prompt_the_caller_may_reuse_before_the_next_step():
    model = GPT2(SMALL, random_params(SMALL, seed=0))
    batch, buffer = ContinuousBatch(model), np.array([1, 2, 3])
    handle = batch.add(buffer, 4)
    buffer[:] = [7, 8, 9]
    assert run_to_the_end(batch, [handle]) == [generate(model, [1, 2, 3], 4)] != [generate(model, [7, 8, 9], 4)]


@pytest.mark.parametrize("handle", [True, [1], 1.0, None])
def test_a_handle_that_is_not_an_int_is_a_one_line_type_error(handle):
    """cancel(True) once cancelled handle 1 (True == 1 to a dict), cancel([1]) said "unhashable type"."""
    batch = ContinuousBatch(random_toy_model(np.random.default_rng(0), n_vocab=4))
    handles = [batch.add([0], 3), batch.add([1], 3)]
    message = f"cancel({handle!r}): a handle is an int that add returned, got {type(handle).__name__}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        batch.cancel(handle)
    with pytest.raises(TypeError, match="in batch: a handle is an int that add returned"):
        handle in batch
    second = np.int64(handles[1])  # a NumPy integer is a handle too
    assert batch.running == handles and second in batch and batch.cancel(second) and handles[1] not in batch


@pytest.mark.parametrize("where", ["after the pass", "between two draws", "at the last draw"])
def test_a_step_interrupted_anywhere_changes_nothing_and_the_batch_carries_on(bundled, monkeypatch, where):
    """Ctrl-C in a step (a notebook user stopping a cell) used to leave the sequences not yet drawn with a cache
    one row longer than their tokens: the next step fed their last token twice, their text went wrong and a
    later step overflowed a cache. Now a step that raises is undone (caches, tokens, generators), so after one
    interrupted step, stepping on gives every sequence exactly its solo run, greedy and sampled alike."""
    from gpt2np.decoding import continuous
    ids = [bundled.tokenizer.encode(p) for p in PROMPTS[:3]]
    requests = [dict(prompt=p, n=12, seed=seed, stops=None, options=dict(temperature=temperature))
                for p, seed, temperature in zip(ids, [None, 5, 6], [None, 0.9, 1.2])]
    calls, real_step, real_draw = {"pass": 0, "draw": 0}, continuous.packed_step, continuous.next_token
    third_step_draws = {"after the pass": None, "between two draws": 2, "at the last draw": 3}[where]

    def packed_step(*args):  # the third step's pass runs (every cache grows); then, maybe, Ctrl-C
        out = real_step(*args)
        calls["pass"] += 1
        if calls["pass"] == 3 and third_step_draws is None:
            raise KeyboardInterrupt
        return out

    def next_token(*args, **kwargs):  # the third step's n-th draw: Ctrl-C once its generator has moved
        token = real_draw(*args, **kwargs)
        calls["draw"] += 1
        if calls["pass"] == 3 and calls["draw"] == 6 + third_step_draws and "raised" not in calls:
            calls["raised"] = True
            raise KeyboardInterrupt
        return token
    monkeypatch.setattr(continuous, "packed_step", packed_step)
    monkeypatch.setattr(continuous, "next_token", next_token)
    batch = ContinuousBatch(bundled)
    handles = [batch.add(r["prompt"], r["n"], rng=rng_of(r["seed"]), **r["options"]) for r in requests]
    assert steps_through_interrupts(batch) == 1
    for i, (handle, r) in enumerate(zip(handles, requests)):
        assert batch.pop_tokens(handle) == solo(bundled, r), f"request {i} differs from its solo run ({where})"


def steps_through_interrupts(batch):  # -> how many steps raised KeyboardInterrupt before the batch emptied
    """Step a continuous batch to its end as a notebook user would, stepping on after each Ctrl-C."""
    interrupted = 0
    while batch:
        try:
            batch.step()
        except KeyboardInterrupt:
            interrupted += 1
    return interrupted
