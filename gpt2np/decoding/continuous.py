"""Continuous batching: sequences join and leave a running batch at any step (Orca, Yu et al. 2022,
"iteration-level scheduling"; vLLM calls it continuous batching).

batched.py decodes a fixed list of prompts. A server never has one: requests arrive while others
are half done. ContinuousBatch keeps a set of running sequences; `add` puts one in at any time,
`cancel` takes one out, and every `step` is one packed forward pass (model/batch.py) over all of
them, in which a sequence added since the last step feeds its whole prompt (prefill joins the step:
the others do not wait for it in a pass of their own) and every other sequence feeds its last token:

    step t      [prompt of c (n_c rows) | last of a (1 row) | last of b (1 row)]  -> one token each
    step t + 1  [last of c | last of b]              a finished at step t: it left at once

Each sequence keeps its own KV cache (sized for prompt + n_tokens - 1 positions), its own sampling
options, rng and stops, and draws its token from its own logits in the order generate draws them; so
it gets exactly the tokens generate gives it alone, greedy token for token and sampled draw for draw,
whatever joins or leaves around it (its logits differ from the solo run's only by float32 rounding,
~1e-5, as in batched.py). prefill_chunk=n feeds a long prompt n rows per step instead (the others'
steps stay short; no token is drawn until the whole prompt is in). A step that raises (Ctrl-C in a
notebook, say) changes nothing: every sequence's cache, tokens and generator are put back where the
step found them, so the next step carries on as if it had not begun.

>>> from gpt2np.decoding.autoregressive import generate
>>> from gpt2np.teach.toy_models import random_toy_model
>>> model = random_toy_model(np.random.default_rng(0), n_vocab=4)
>>> batch = ContinuousBatch(model)
>>> a = batch.add([0], 3)
>>> first = batch.step()                    # a alone: its prompt, its first token
>>> b = batch.add([1, 2], 2)                # b joins the running batch
>>> while batch:
...     _ = batch.step()
>>> batch.tokens_of(a) == generate(model, [0], 3), batch.tokens_of(b) == generate(model, [1, 2], 2)
(True, True)
"""
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from .autoregressive import check_model
from .batched import check_sequence, checked_copy, packed_step, request_cache
from .sampling import is_greedy, next_token
from .stream import RoundEvent

USAGE = "ContinuousBatch(model).add(prompt_ids, n_tokens, ...)"


@dataclass
class Sequence:
    """One running request: what it feeds next, what it has drawn, and how it draws."""
    prompt: np.ndarray            # [n_prompt] ids
    n_tokens: int
    options: dict                 # temperature, top_k, top_p
    rng: object
    stops: frozenset
    cache: object                 # its own KVCache, prompt + n_tokens - 1 positions
    fed: int = 0                  # prompt rows fed so far
    tokens: list = field(default_factory=list)

    def feed(self, chunk):  # -> [n_rows] ids for this step: prompt rows (prefill), else the last token
        if self.fed < len(self.prompt):
            return self.prompt[self.fed:self.fed + (chunk or len(self.prompt))]
        return np.array(self.tokens[-1:])  # [1]

    def finished(self):
        return len(self.tokens) == self.n_tokens or (self.tokens and self.tokens[-1] in self.stops)


def check_prefill_chunk(prefill_chunk):  # -> it, or a one-line ValueError
    """None (whole prompts) or the most prompt rows a sequence feeds in a step, an integer >= 1."""
    if prefill_chunk is not None and (isinstance(prefill_chunk, bool) or
                                      not isinstance(prefill_chunk, (int, np.integer)) or prefill_chunk < 1):
        raise ValueError(f"prefill_chunk must be None (whole prompts) or an integer >= 1, got {prefill_chunk!r}")
    return None if prefill_chunk is None else int(prefill_chunk)


def check_rng_unshared(rng, options, running):
    """A sampling newcomer's generator is none a running sampling sequence draws from (their draws would
    interleave); a greedy one draws nothing, and may share it (batched.check_own_generators)."""
    def samples(o):
        return not is_greedy(o["temperature"])
    if rng is not None and samples(options) and any(s.rng is rng and samples(s.options) for s in running):
        raise ValueError("rng: a running sequence already draws from this generator; each sampled "
                         "sequence needs its own (np.random.default_rng(seed))")


def generator_state(rng):  # -> what set_generator_state needs to put rng back (None: nothing to put back)
    """An np.random.Generator's state (~1 us); None for no generator, or a stand-in without a bit_generator."""
    bits = getattr(rng, "bit_generator", None)
    return None if bits is None else bits.state


def set_generator_state(rng, state):
    if state is not None:
        rng.bit_generator.state = state


HANDLES = itertools.count()  # every batch's handles come from here: one batch's handle is never another's


class Handles:
    """What both continuous batches keep by handle: the running sequences (_running, in the order they
    joined) and the finished ones' tokens until they are popped (_finished). Handles are ints unique in the
    process (HANDLES), so one batch's handle given to another finds nothing there (it read the other
    sequence's tokens when every batch counted from 0); _first and _next bound the ones this batch gave."""

    def _new_handle(self):
        handle = next(HANDLES)
        if self._first is None:
            self._first = handle
        self._next = handle + 1
        return handle

    def pop_tokens(self, handle):
        """A finished sequence's tokens, forgotten afterwards (a long-running batch keeps none)."""
        if self._is_handle(handle) and handle in self._running:
            raise ValueError(f"pop_tokens({handle!r}): that sequence is still running; pop it once it has "
                             f"finished (`handle in batch` is False), or read it now with tokens_of")
        return self._finished.pop(self._finished_handle(handle, "pop_tokens"))

    def _is_handle(self, handle):  # an int add() could have returned (a list, say, cannot be looked up)
        return (isinstance(handle, (int, np.integer)) and not isinstance(handle, bool) and self._first is not None
                and self._first <= handle < self._next)

    def _int_handle(self, handle, call):  # -> handle, or a TypeError: True would pass for handle 1
        if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
            raise TypeError(f"{call.format(repr(handle))}: a handle is an int that add returned, "
                            f"got {type(handle).__name__}")
        return handle

    def _finished_handle(self, handle, method):  # -> handle, or a ValueError that says why it has no tokens
        """A handle neither running nor finished and unpopped is named with why: a long-running batch
        keeps no record of what it cancelled or popped, so those two are told apart from a handle it never gave."""
        if self._is_handle(handle) and handle in self._finished:
            return handle
        why = ("it was cancelled, or its tokens were already popped (or another batch gave it)" if self._is_handle(handle)
               else "this batch never gave that handle (handles are the ints its add returned)")
        raise ValueError(f"{method}({handle!r}): no tokens to read: {why}")

    @property
    def running(self):  # -> [handle] in the order they joined
        return list(self._running)

    def __contains__(self, handle):
        return self._int_handle(handle, "{} in batch") in self._running

    def __len__(self):
        return len(self._running)

    def _undoable(self, step, keep, put_back):  # -> step()'s value; on any exception, nothing has changed
        """step(), undone if it raises (a KeyboardInterrupt between the packed pass and the last draw left
        the sequences not yet drawn with a cache a row longer than their tokens, and the next step fed
        their last token twice): keep(seq) -> what put_back(seq, kept) restores, for every running
        sequence; the running and finished sets are restored in place (a policy holds _running)."""
        running, finished = dict(self._running), set(self._finished)
        kept = [(seq, keep(seq)) for seq in running.values()]
        try:
            return step()
        except BaseException:
            for seq, state in kept:
                put_back(seq, state)
            self._running.clear()
            self._running.update(running)
            for handle in set(self._finished) - finished:
                del self._finished[handle]
            raise


class ContinuousBatch(Handles):
    """Running sequences decoded together, one packed forward pass per step; any may join or leave.

    add(...) -> a handle (an int); step() -> [(handle, RoundEvent)] for the sequences that drew a token
    in that pass; a sequence that finished (n_tokens, a stop token, eot_id) has left when step returns
    (`handle in batch` is False) and its tokens stay readable once with pop_tokens(handle)."""

    def __init__(self, model, prefill_chunk=None):
        check_model(model, "model", USAGE)
        self.model, self.prefill_chunk = model, check_prefill_chunk(prefill_chunk)
        self._running, self._finished, self._first, self._next = {}, {}, None, 0

    def add(self, prompt_ids, n_tokens, temperature=None, top_k=None, top_p=None, rng=None, *, stop_tokens=None):
        """Check one request as generate checks it (one-line ValueError) and put it in the batch; it
        feeds its prompt in the next step. Returns its handle."""
        options, stops = check_sequence(self.model, prompt_ids, n_tokens, temperature, top_k, top_p, rng,
                                        stop_tokens)
        check_rng_unshared(rng, options, self._running.values())
        prompt, n_tokens = checked_copy(prompt_ids), int(n_tokens)  # a copy: the prompt is fed at the next step
        handle = self._new_handle()
        self._running[handle] = Sequence(prompt, n_tokens, options, rng, stops,
                                         request_cache(self.model, len(prompt) + n_tokens - 1))
        return handle

    def cancel(self, handle):
        """Take a running sequence out now (its client left); True if it was running. A handle is an
        int add returned (anything else is a TypeError)."""
        return self._running.pop(self._int_handle(handle, "cancel({})"), None) is not None

    def step(self):  # -> [(handle, RoundEvent)]
        """One packed forward pass over every running sequence; each that has fed its whole prompt
        draws one token; finished sequences leave before step returns. If it raises, nothing changed."""
        if not self._running:
            return []
        return self._undoable(self._step, lambda s: (len(s.cache), s.fed, len(s.tokens), generator_state(s.rng)),
                              put_back)

    def _step(self):
        start, handles = time.perf_counter(), list(self._running)
        feeds = [self._running[h].feed(self.prefill_chunk) for h in handles]
        logits = packed_step(self.model, [(ids, self._running[h].cache) for h, ids in zip(handles, feeds)])
        seconds = time.perf_counter() - start
        return [event for h, ids, rows in zip(handles, feeds, logits)
                if (event := self._advance(h, len(ids), rows[-1], seconds)) is not None]

    def _advance(self, handle, n_fed, logits, seconds):  # logits [n_vocab] -> (handle, RoundEvent) or None
        """The sequence's bookkeeping after a pass: prompt rows counted, else its token drawn."""
        seq = self._running[handle]
        if seq.fed < len(seq.prompt):
            seq.fed += n_fed
            if seq.fed < len(seq.prompt):
                return None  # a chunk of a long prompt: no token until the whole prompt is in
        seq.tokens.append(next_token(logits, rng=seq.rng, **seq.options))
        if seq.finished():
            del self._running[handle]  # it leaves now: its last token is never fed
            self._finished[handle] = seq.tokens
        return handle, RoundEvent(tokens=seq.tokens[-1:], provenance=["target"], K=0,
                                  n_emitted=len(seq.tokens), seconds=seconds)

    def tokens_of(self, handle):
        """The tokens a sequence has drawn so far (running or finished and not yet popped)."""
        seq = self._running.get(handle) if self._is_handle(handle) else None
        return list(seq.tokens) if seq is not None else list(self._finished[self._finished_handle(handle, "tokens_of")])


def put_back(seq, kept):  # a Sequence where an undone step found it (ContinuousBatch._undoable)
    n_cached, seq.fed, n_tokens, state = kept
    seq.cache.truncate(n_cached)
    del seq.tokens[n_tokens:]
    set_generator_state(seq.rng, state)

