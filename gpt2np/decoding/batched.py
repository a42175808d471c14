"""Plain decoding of several sequences at once: one packed forward pass per step (model/batch.py).

Each sequence has its own prompt, n_tokens, sampling options, rng and stop tokens, its own KV cache
sized for it (prompt + n_tokens - 1 positions: the last token is never fed), and finishes on its own:
from the next step on it drops out of the packed call. The sequences share only the weights' reads.
Each token is drawn by next_token from the sequence's own logits with its own rng, in the order
generate draws them, so every sequence gets what generate gives it alone: the same tokens when
greedy, the same draws from an identically seeded rng when sampling. (Its logits differ from the solo
run's only by float32 rounding, ~1e-5: an argmax or a draw could flip only at a near tie.) A model
other than GPT2 (the toy models) runs the same loop with one forward call per sequence.

Per-sequence arguments are one value for every sequence or a list (or 1-D array) with one per prompt.
stop_tokens is the exception, because one sequence's stops are already a list:
  - a list of ids only (or None, one id, a set, a 1-D array) is ONE stop set for every sequence,
    whatever its length, as in generate: with two prompts, [a, b] stops both at a or at b;
  - a list in which some entry is None or a list is per sequence, one entry per prompt: [[a], [b]]
    stops the first at a and the second at b; [a, None] stops the first at a, the second only at eot_id.
Sampled sequences need one np.random.Generator each: one generator shared between sequences would make
each one's draws depend on when the others draw. batch_stream is the same run step by step, as a
Stream (stream.py) of BatchSteps.

>>> from gpt2np.decoding.autoregressive import generate
>>> from gpt2np.teach.toy_models import random_toy_model
>>> model = random_toy_model(np.random.default_rng(0), n_vocab=4)
>>> out = generate_batch(model, [[0], [1, 2]], n_tokens=[3, 5])
>>> out == [generate(model, [0], 3), generate(model, [1, 2], 5)]
True
"""
import time

import numpy as np

from ..model.batch import forward_packed, forward_separately
from ..model.forward import GPT2
from .autoregressive import (check_generation_request, check_model, check_rng, default_temperature, request_cache,
                             stop_set)
from .sampling import check_sampling_options, is_greedy, next_token
from .stream import RoundEvent, Stream

USAGE = "generate_batch(model, prompts, n_tokens, ...)"


def is_list(value):  # a list, a tuple or a 1-D array: one value per sequence
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1)


def per_sequence(value, n, name, is_one=lambda v: not is_list(v)):  # -> [n] values
    """value for every one of n sequences, or its list of one value per sequence (checked later)."""
    if isinstance(value, np.ndarray) and value.ndim > 1:  # [n, 1], say: its repr runs to hundreds of lines
        raise ValueError(f"{name} must be one value for every sequence or a 1-D list of one per prompt ({n}), "
                         f"got an array of shape {value.shape}")
    if is_one(value):
        return [value] * n
    if is_list(value) and len(value) == n:
        return list(value)
    raise ValueError(f"{name} must be one value for every sequence or a list of one per prompt ({n}), "
                     f"got a {type(value).__name__} of {len(value)}")


def each_checked(n, check):  # -> [check(i) for i in range(n)]
    """Every sequence's check; a ValueError names the first sequence that fails ("sequence 2: ..."), unless
    every sequence fails alike (n_tokens=0 given once for all): then the error is said once, for none."""
    results, errors = [], {}
    for i in range(n):
        try:
            results.append(check(i))
        except ValueError as error:
            errors[i] = str(error)
    if not errors:
        return results
    if len(errors) == n and len(set(errors.values())) == 1:
        raise ValueError(errors[0])
    first = min(errors)
    raise ValueError(f"sequence {first}: {errors[first]}")


def is_one_stop_list(stop_tokens):
    """The stop rule (module docstring): a list of ids only (or None, one id, a set, a 1-D array) is one
    stop set for every sequence, whatever its length; a list holding None or a list has one entry per sequence.

    >>> is_one_stop_list([26, 1]), is_one_stop_list([[26], [1]]), is_one_stop_list([26, None])
    (True, False, False)
    """
    if stop_tokens is None or not isinstance(stop_tokens, (list, tuple)):
        return True
    return all(isinstance(t, (int, np.integer)) for t in stop_tokens)


def check_prompts(prompts):  # -> list of prompts
    """A list of prompts (or a 2-D array, a row each), each a list of ids; none at all, or one prompt
    (a flat list of ints), is a one-line error."""
    rows = list(prompts) if isinstance(prompts, np.ndarray) and prompts.ndim == 2 else prompts  # [B, n] -> B rows
    if not isinstance(rows, (list, tuple)) or len(rows) == 0:
        shape = f" of shape {prompts.shape}" if isinstance(prompts, np.ndarray) else ""
        raise ValueError(f"prompts must be a non-empty list of prompts (each a list of token ids), "
                         f"got {type(prompts).__name__}{shape}")
    if all(isinstance(p, (int, np.integer)) for p in rows):
        raise ValueError("prompts must be a list of prompts, got one list of ints: for one prompt pass [prompt_ids]")
    return list(rows)


def check_own_generators(rngs, options):
    """No np.random.Generator given to two sequences that sample (one for all, or the same one twice): their
    draws would interleave. A greedy sequence draws nothing, so it may share one, as generate accepts an
    rng at temperature 0."""
    owners = {}
    for i, (rng, o) in enumerate(zip(rngs, options)):
        if rng is None or is_greedy(o["temperature"]):
            continue
        if id(rng) in owners:
            raise ValueError(f"rng: sequences {owners[id(rng)]} and {i} share one generator; each sampled "
                             f"sequence needs its own (rng=[np.random.default_rng(seed_i), ...])")
        owners.setdefault(id(rng), i)


def check_sequence(model, prompt, n_tokens, temperature, top_k, top_p, rng, stop_tokens):  # -> options, stops
    """One sequence's request checked as generate checks it; its sampling options and stop set."""
    temperature = default_temperature(temperature, rng)
    check_sampling_options(temperature, top_k, top_p)
    check_generation_request(model, prompt, n_tokens)
    check_rng(rng, temperature)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p), stop_set(model, stop_tokens)


def check_batch(model, prompts, n_tokens, temperature, top_k, top_p, rng, stop_tokens):  # -> per-sequence lists
    """Every sequence's request checked before any work; a bad one is a one-line ValueError naming it."""
    check_model(model, "model", USAGE)
    prompts = check_prompts(prompts)
    n = len(prompts)
    values = [per_sequence(v, n, name) for v, name in [(n_tokens, "n_tokens"), (temperature, "temperature"),
                                                       (top_k, "top_k"), (top_p, "top_p"), (rng, "rng")]]
    values.append(per_sequence(stop_tokens, n, "stop_tokens", is_one_stop_list))
    n_tokens, temperature, top_k, top_p, rngs, stop_tokens = values
    checked = each_checked(n, lambda i: check_sequence(model, prompts[i], n_tokens[i], temperature[i], top_k[i],
                                                       top_p[i], rngs[i], stop_tokens[i]))
    options, stops = [o for o, _ in checked], [s for _, s in checked]
    check_own_generators(rngs, options)  # after each sequence's temperature is known: only samplers draw
    return [checked_copy(p) for p in prompts], [int(n) for n in n_tokens], options, rngs, stops


def checked_copy(prompt):  # [n_prompt] ids of any integer dtype -> [n_prompt] np.intp, the batch's own
    """A checked prompt as the batch keeps it: a copy (the caller may reuse its buffer before the
    prompt is fed), as np.intp (np.uint64 ids packed with int64 ones would make float64)."""
    return np.array(prompt, dtype=np.intp)


def packed_step(model, calls):  # [(ids_i, cache_i)] -> [[1, n_vocab]]: one logits row per sequence
    if isinstance(model, GPT2):
        return forward_packed(model, calls)
    return forward_separately(model, calls)  # any model of the interface: one forward call each


class BatchStep(list):
    """One step of a batch: [(sequence, RoundEvent)] for the sequences it served, a list as before. Its
    tokens and provenance are theirs, sequence after sequence, so a Stream of steps keeps in .tokens
    every token the batch emitted so far, and in .result each sequence's tokens."""

    @property
    def tokens(self):
        return [t for _, event in self for t in event.tokens]

    @property
    def provenance(self):
        return [p for _, event in self for p in event.provenance]


class BatchStream(Stream):
    """A Stream of BatchSteps that also keeps each sequence's tokens apart: `.outputs`, every sequence's tokens
    so far in the prompts' order (the result's shape, filled as the steps come: equal to `.result` at the end).
    `.tokens` interleaves them, step by step; a stream stopped mid-way (Ctrl-C, close()) keeps `.outputs`.

    >>> s = BatchStream(iter([BatchStep([(0, RoundEvent([5], ["target"], 0, 1)), (1, RoundEvent([7, 8], ["draft",
    ...     "bonus"], 1, 2))]), BatchStep([(0, RoundEvent([6], ["target"], 0, 2))])]), n_sequences=2)
    >>> _ = next(s); s.tokens, s.outputs
    ([5, 7, 8], [[5], [7, 8]])
    >>> _ = next(s); s.outputs
    [[5, 6], [7, 8]]
    """

    def __init__(self, steps, n_sequences):
        super().__init__(steps)
        self.outputs = [[] for _ in range(n_sequences)]

    def __next__(self):
        step = super().__next__()
        for i, event in step:
            self.outputs[i] += event.tokens
        return step


def batch_steps(model, prompts, n_tokens, options, rngs, stops):
    """The loop as a generator: per packed call, a BatchStep of (sequence, RoundEvent of its one token)
    for the sequences in that call; returns every sequence's tokens. Finished sequences leave the call."""
    caches = [request_cache(model, len(p) + n - 1) for p, n in zip(prompts, n_tokens)]
    outputs = [[] for _ in prompts]
    feeds = dict(enumerate(prompts))  # the sequences still running -> the ids they feed next (first: the prompt)
    while feeds:
        start, running = time.perf_counter(), list(feeds)
        logits = packed_step(model, [(feeds[i], caches[i]) for i in running])
        step = []
        for i, rows in zip(running, logits):
            outputs[i].append(next_token(rows[-1], rng=rngs[i], **options[i]))
            step.append((i, RoundEvent(tokens=outputs[i][-1:], provenance=["target"], K=0,
                                       n_emitted=len(outputs[i]), seconds=time.perf_counter() - start)))
            if len(outputs[i]) == n_tokens[i] or outputs[i][-1] in stops[i]:
                del feeds[i]  # its last token is never fed: nothing would read its logits
            else:
                feeds[i] = np.array(outputs[i][-1:])  # [1]
        yield BatchStep(step)
    return outputs


def batch_stream(model, prompts, n_tokens, *, temperature=None, top_k=None, top_p=None, rng=None,
                 stop_tokens=None):
    """generate_batch step by step: checks every sequence now, then returns a Stream (stream.py) that
    yields, per packed forward pass, a BatchStep: a list of (sequence index, RoundEvent) for the
    sequences it served. Once it is exhausted, .result is every sequence's tokens (kept if iterated
    again; run() returns it); .outputs holds them as they come (BatchStream); .close() stops it where it is.

    >>> from gpt2np.teach.toy_models import random_toy_model
    >>> model = random_toy_model(np.random.default_rng(0), n_vocab=4)
    >>> stream = batch_stream(model, [[0], [1, 2]], n_tokens=[3, 1])
    >>> [[i for i, _ in step] for step in stream], stream.result == generate_batch(model, [[0], [1, 2]], [3, 1])
    ([[0, 1], [0], [0]], True)
    """
    checked = check_batch(model, prompts, n_tokens, temperature, top_k, top_p, rng, stop_tokens)
    return BatchStream(batch_steps(model, *checked), len(checked[0]))


def generate_batch(model, prompts, n_tokens, temperature=None, top_k=None, top_p=None, rng=None, *,
                   stop_tokens=None):
    """generate for several prompts at once: a list of each sequence's new tokens, each exactly what
    generate(model, prompts[i], n_tokens[i], ...) returns with the same options and an identically
    seeded rng. Every argument is one value for all sequences or a list with one per prompt, but
    stop_tokens: a flat list of ids stops every sequence, [[a], [b]] is per sequence (module docstring);
    sampling needs one generator per sequence, rng=[...]. Every prompt is fed in the first packed pass,
    whose activations grow with all the prompts' rows (1000 prompts of 200 tokens at the bundled 2.6M
    target: a 3.9 GB peak); for many long prompts, ContinuousBatch(model, prefill_chunk=n) feeds n rows a
    step (2.2 GB there, about 1 GB of it the caches)."""
    return batch_stream(model, prompts, n_tokens, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng,
                        stop_tokens=stop_tokens).run()
