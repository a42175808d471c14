"""What the engine works with: a checked request (Generation), its channel back to the request
(Job), the statistics a round adds to (LiveStats), a running job's state (Active), and the two errors
a request can meet before it runs (RequestError, 400; QueueFull, 429 / 503). Plain data and small
classes, nothing that runs a model: the scheduler is engine.py.
"""
import asyncio
import secrets
import threading
from dataclasses import dataclass, field

import numpy as np

from gpt2np.report import TokenTexts


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
    tree: tuple | str | None = None  # children per depth, "auto", or None: chains of K


class Job:
    """A generation and the channel its messages go back on (an asyncio queue of the request's loop,
    `inbox`, which the jobs of one request's several prompts share: each message comes as (index, message)).

    Messages: ("round", event, pieces, live) per round, then ("done", result, tail, live), or
    ("error", status, message), or ("cancelled",) / ("stopped",) (after cancel() / finish()).

    `cancelled` tells the worker to stop the job; `satisfied` says why: False, its client left
    (counted as cancelled), True, its request had its answer before the decoder ended (a stop
    string: counted as served).
    """

    def __init__(self, generation, loop, inbox=None, index=0, on_gone=None):
        """on_gone(job): frees the job's room in the engine (Engine._release: once, whoever calls it)."""
        self.generation, self.loop, self.index, self.on_gone = generation, loop, index, on_gone
        self.gone = self.admitted = False  # the engine's: its room freed; taken from the queue by the worker
        self.inbox = asyncio.Queue() if inbox is None else inbox
        self.cancelled = threading.Event()
        self.satisfied = False

    def put(self, message):
        try:
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, (self.index, message))
        except RuntimeError:  # the request's event loop is closed: nobody is listening
            self.cancelled.set()

    def cancel(self):
        """The client left (or the request ended otherwise): stop generating; its room is free now."""
        self.cancelled.set()
        self._free()

    def finish(self):
        """The request has its answer (a stop string): stop generating, counted as served; its room is free now."""
        if not self.cancelled.is_set():
            self.satisfied = True
        self.cancelled.set()
        self._free()

    def _free(self):
        if self.on_gone is not None:
            self.on_gone(self)


def counted_K(generation, lookup):  # -> event -> the round's K as SpeculativeStats counts it; None: not known
    """How a job's rounds are counted in K_counts, in SpeculativeStats' meaning (run_stats.py): a chain
    round's K is the K asked for clamped to the tokens still wanted minus one (K=8 with 7 tokens to go
    counts as 6, and a last round with one token to go as 0), a tree round's K the nodes it drafted.

    A fixed K: that clamp, from the tokens the job emitted before the round (every drafter). A draft
    model with a K policy: the drafts it proposed (event.K), which is the clamped K, since a draft model
    drafts all it is asked for; a tree: event.K as well. Prompt lookup (`lookup`) with a K policy
    ("heuristic", "auto"): it may propose fewer drafts than the policy asked for, and the K asked for
    is not in the round: None, not known (the rounds' own K, drafts proposed, stays in `rounds`)."""
    g = generation
    if g.drafter is None:  # the target alone (speculative false): every round K 0, whatever K came with it
        return lambda event: event.K
    if g.tree is None and isinstance(g.K, int):
        return lambda event: min(g.K, g.max_tokens - (event.n_emitted - len(event.tokens)) - 1)
    if g.tree is not None or not lookup:
        return lambda event: event.K
    return None


class LiveStats:
    """Statistics that exist after every round (the full SpeculativeStats only exist at the end).
    K_counts: rounds by K in SpeculativeStats' meaning (counted_K; every round K 0 for target-only), or
    None where that K is not known; `drafted` counts the drafts proposed."""

    def __init__(self, count_K=lambda event: event.K):
        self.rounds = self.tokens = self.drafted = self.accepted = self.rejections = 0
        self.overlaps, self.seconds, self.count_K = [], 0.0, count_K
        self.K_counts = None if count_K is None else {}

    def add(self, event):
        self.rounds += 1
        if self.K_counts is not None:
            K = self.count_K(event)
            self.K_counts[K] = self.K_counts.get(K, 0) + 1
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
            "rejections": self.rejections,
            "K_counts": None if self.K_counts is None else dict(sorted(self.K_counts.items())),
            "alpha_hat": float(np.mean(self.overlaps)) if self.overlaps else None,
            "alpha_empirical": self.accepted / examined if examined else None,
            "tokens_per_target_call": self.tokens / self.rounds if self.rounds else None,
            "seconds": self.seconds, "tokens_per_second": self.tokens / self.seconds if self.seconds else None,
        }


def new_seed():
    """A seed for a request that gave none, reported back so the sample can be reproduced."""
    return secrets.randbits(63)


@dataclass(eq=False)
class Active:
    """A job the worker is running: its place in a packed batch, or its own stream."""
    texts: TokenTexts
    started: float
    batch: object = None          # the packed batch it runs in (ContinuousBatch, ContinuousSpeculativeBatch) ...
    handle: int | None = None     # ... and its handle there
    stream: object = None         # or a speculative job's own Stream of rounds ...
    rng: object = None            # the generator it draws from (it goes on drawing when the job moves: Engine._pack)
    tokens: list = field(default_factory=list)  # the tokens delivered so far
    offset: int = 0               # tokens emitted before it joined its batch (its batch counts from there)
    schedule: object = None       # a K "heuristic" chain alone: its schedule, moved by its rounds (it joins with it)
    live: LiveStats = field(default_factory=LiveStats)
