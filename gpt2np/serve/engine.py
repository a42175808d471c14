"""The generation engine: one worker thread owns the models and runs one stream at a time.

The models and drafters keep KV caches and are not thread-safe, so every generation goes through
a bounded queue to a single worker (a server with one GPU does the same, batching aside). The
worker turns each round of gpt2np's round stream (gpt2np/decoding/stream.py) into a message for the
request that asked for it; a request whose client has gone sets `job.cancelled`, and the worker
then closes the stream (Stream.close) after the round it is in, or skips the job if it has not
started. `open_stream` is the one place that calls the package's decoders.
"""
import asyncio
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np

import gpt2np
from gpt2np import check_generation_request
from gpt2np.report import TokenTexts

from .names import hide_path, served_name

log = logging.getLogger("gpt2np.serve")


class QueueFull(Exception):
    """The waiting queue is full (429), or the worker is not running (503): answer with Retry-After."""

    def __init__(self, retry_after, status=429):
        super().__init__(f"the server is busy: {retry_after} s until a slot is likely free" if status == 429
                         else "the server is not running generations (starting or shutting down)")
        self.retry_after, self.status = retry_after, status


class RequestError(ValueError):
    """A request the models cannot serve; `param` names the field (OpenAI's error.param)."""

    def __init__(self, param, message):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Generation:
    """One checked generation request: everything the worker needs, nothing from HTTP."""
    prompt_ids: tuple            # token ids, at least one
    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    K: int | str = 4             # an int, "heuristic" or "auto"
    K_max: int = 8
    drafter: str | None = None   # a served drafter's name; None: target only


class Job:
    """A generation and the channel its messages go back on (an asyncio queue of the request's loop).

    Messages: ("round", event, pieces, live) per round, then ("done", result, tail), or
    ("error", status, message), or ("cancelled",).
    """

    def __init__(self, generation, loop):
        self.generation, self.loop = generation, loop
        self.messages = asyncio.Queue()
        self.cancelled = threading.Event()

    def put(self, message):
        try:
            self.loop.call_soon_threadsafe(self.messages.put_nowait, message)
        except RuntimeError:  # the request's event loop is closed: nobody is listening
            self.cancelled.set()

    def cancel(self):
        self.cancelled.set()


class LiveStats:
    """Statistics that exist after every round (the full SpeculativeStats only exist at the end)."""

    def __init__(self):
        self.rounds = self.tokens = self.drafted = self.accepted = self.rejections = 0
        self.overlaps, self.seconds = [], 0.0

    def add(self, event):
        self.rounds += 1
        self.tokens += len(event.tokens)
        self.drafted += len(event.drafts)
        self.accepted += event.decisions.count(True)
        self.rejections += event.decisions.count(False)
        self.overlaps += event.overlaps
        self.seconds += event.seconds

    def as_dict(self):
        examined = self.accepted + self.rejections
        return {
            "rounds": self.rounds, "tokens": self.tokens, "drafted": self.drafted, "accepted": self.accepted,
            "alpha_hat": float(np.mean(self.overlaps)) if self.overlaps else None,
            "alpha_empirical": self.accepted / examined if examined else None,
            "tokens_per_target_call": self.tokens / self.rounds if self.rounds else None,
            "seconds": self.seconds, "tokens_per_second": self.tokens / self.seconds if self.seconds else None,
        }


def new_seed():
    """A seed for a request that gave none, reported back so the sample can be reproduced."""
    return secrets.randbits(63)


class Engine:
    """The served target, its drafters by name, and the worker that runs generations one at a time."""

    def __init__(self, target, drafters, model_id=None, max_queue=16):
        """drafters: name -> drafter. Models loaded from a folder are served by the folder's name
        (names.py): the ids, the drafter names and the statistics never show a local path."""
        self.target = hide_path(target)
        self.drafters = {served_name(name): hide_drafter_path(d) for name, d in drafters.items()}
        if len(self.drafters) < len(drafters):
            raise ValueError(f"two drafters would be served under one name: {sorted(map(str, drafters))}")
        self.default_drafter = next(iter(self.drafters), None)
        self.model_id = served_name(model_id or getattr(target, "name", "gpt2np"))
        self.tokenizer, self.n_ctx = target.tokenizer, target.n_ctx
        self.max_queue = max_queue
        self._waiting = queue.Queue(maxsize=max_queue)
        self._thread, self._running = None, False
        self._seconds_per_job = 1.0  # running mean, for Retry-After
        self.served = self.cancelled = 0  # generations run; generations stopped or skipped: their client left

    # lifecycle ----------------------------------------------------------------------------------
    def start(self):
        if self._thread is None:
            self.warm_up()
            self._thread = threading.Thread(target=self._work, name="gpt2np-worker", daemon=True)
            self._thread.start()
        return self

    def warm_up(self):
        """One short generation per decoder before serving: the first request should not pay for
        first calls (allocations, BLAS start-up), or a comparison made with it would be unfair."""
        prompt = (self.target.eot_id or 0,)
        for drafter in [None, *self.drafters]:
            g = Generation(prompt, max_tokens=min(6, self.n_ctx - 1), drafter=drafter)
            type(self).open_stream(self, g).run()  # the class's adapter, whatever a test put on the instance

    def stop(self):
        """Refuse what still waits (503), let the running generation end, stop the worker."""
        while True:
            try:
                job = self._waiting.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                job.put(("error", 503, "the server is shutting down"))
        if self._thread is not None:
            self._waiting.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self):
        return self._waiting.qsize()

    @property
    def busy(self):
        return self._running

    # requests -----------------------------------------------------------------------------------
    def encode(self, prompt):
        """prompt: text or token ids -> token ids; RequestError(prompt) unless they fit the model."""
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        ids = ids or [self.target.eot_id]  # an empty prompt: unconditional, from <|endoftext|>
        if any(not 0 <= i < self.target.n_vocab for i in ids):
            raise RequestError("prompt", f"prompt: token ids must be in [0, {self.target.n_vocab})")
        if len(ids) >= self.n_ctx:
            raise RequestError("prompt", f"the prompt is {len(ids)} tokens; the context holds {self.n_ctx}, "
                                         "so a prompt may have at most n_ctx - 1 tokens")
        return ids

    def check(self, generation):
        """Every check the decoders would make, before the request is queued (RequestError)."""
        g = generation
        if g.drafter is not None and g.drafter not in self.drafters:
            raise RequestError("drafter", f"drafter must be one of {sorted(self.drafters)} (or speculative "
                                          f"false), got {g.drafter!r}")
        room = self.n_ctx - len(g.prompt_ids)
        if g.max_tokens > room:
            raise RequestError("max_tokens", f"prompt ({len(g.prompt_ids)} tokens) + max_tokens ({g.max_tokens})"
                                             f" exceeds the context of {self.n_ctx} tokens: ask for at most {room}")
        try:
            gpt2np.check_sampling_options(g.temperature, g.top_k, g.top_p)
            gpt2np.make_policy(g.K, g.K_max)
            check_generation_request(self.target, list(g.prompt_ids), g.max_tokens)
        except ValueError as e:
            raise RequestError(_field_named(str(e)), str(e).splitlines()[0]) from None

    def submit(self, generation, loop):
        """Queue a checked generation; returns its Job. QueueFull when the queue is full."""
        job = Job(generation, loop)
        if not self.alive:
            raise QueueFull(self.retry_after(), status=503)
        try:
            self._waiting.put_nowait(job)
        except queue.Full:
            raise QueueFull(self.retry_after()) from None
        return job

    def retry_after(self):
        """Whole seconds until the queue has likely drained a slot: at least 1."""
        return max(1, int(np.ceil(self._seconds_per_job)))

    # the worker ---------------------------------------------------------------------------------
    def open_stream(self, g):
        """The adapter to gpt2np's decoders: a Generation -> a Stream of RoundEvents."""
        rng = np.random.default_rng(g.seed)
        sampling = dict(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, rng=rng)
        if g.drafter is None:
            return gpt2np.plain_stream(self.target, list(g.prompt_ids), g.max_tokens, **sampling)
        return gpt2np.speculative_stream(self.target, self.drafters[g.drafter], list(g.prompt_ids),
                                         g.max_tokens, K=g.K, K_max=g.K_max, calibrate=True,  # the reply's
                                         **sampling)                                          # stats hold c, v

    def _work(self):
        while True:
            job = self._waiting.get()
            if job is None:
                return
            if job.cancelled.is_set():  # its client left while it waited
                self.cancelled += 1
                continue
            start, self._running = time.perf_counter(), True
            try:
                self._run(job)
            except Exception:  # the worker must outlive any request
                log.exception("generation failed")
                job.put(("error", 500, "internal error while generating"))
            finally:
                self._running, self.served = False, self.served + 1
                self._seconds_per_job = 0.8 * self._seconds_per_job + 0.2 * (time.perf_counter() - start)

    def _run(self, job):
        try:
            stream = self.open_stream(job.generation)
        except ValueError as e:  # check() should have caught it; still the client's error
            job.put(("error", 400, str(e).splitlines()[0]))
            return
        texts, live = TokenTexts(self.tokenizer), LiveStats()
        eot = self.target.eot_id
        for event in stream:
            if job.cancelled.is_set():
                stream.close()
                self.cancelled += 1
                job.put(("cancelled",))
                return
            live.add(event)
            pieces = ["" if t == eot else p for t, p in zip(event.tokens, texts.pieces(event.tokens))]
            job.put(("round", event, pieces, live.as_dict()))
        job.put(("done", stream.result, texts.flush(), live.as_dict()))


def hide_drafter_path(drafter):
    """A drafter and the model inside it (a ModelDrafter's .model) named by their folders' names."""
    hide_path(getattr(drafter, "model", None))
    return hide_path(drafter)


def _field_named(message):
    """The request field a decoder's one-line ValueError is about (its messages start with it)."""
    for name in ("temperature", "top_k", "top_p", "K_max", "K", "n_tokens", "prompt"):
        if message.startswith(name) or f" {name} " in message[:40]:
            return "max_tokens" if name == "n_tokens" else name
    return None
