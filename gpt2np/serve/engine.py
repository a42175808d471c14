"""The generation engine: one worker thread owns the models and runs up to max_batch generations at once.

The models and drafters keep KV caches and are not thread-safe, so every generation goes through
a bounded queue to a single worker (a server with one GPU does the same). The worker is a
continuous-batching scheduler (Orca's iteration-level scheduling, vLLM's continuous batching): it
keeps up to `max_batch` jobs active and, at every step boundary, admits jobs that waited and drops
jobs that finished or whose client has gone (`job.cancelled`). One step is

  * one packed forward pass over every active plain (target-only) job not riding in a drafting batch
    (below): gpt2np.ContinuousBatch, in
    which a newly admitted job's prompt rows ride with the others' last tokens (prefill joins the
    step; a long prompt is fed prefill_chunk rows a step, so the others' steps stay short), and
  * one round of every active speculative job drafted by a draft model with a chain (K an int,
    "heuristic" or "auto"), or by prompt lookup, that joined while others ran:
    gpt2np.ContinuousSpeculativeBatch, one per served drafter, whose round packs every job's draft
    calls (prompt lookup: each job looks up its own context; a newcomer's prompt rides in them, prefill_chunk
    rows a round to each model) and verifies every job's K + 1 rows in ONE
    target pass (a job with K="auto" gets the batch's K, which falls to 0 as the batch fills: drafting
    stops where rows cannot pay), and
  * one round of each other speculative job (a token tree, and a job that started alone), run as its own
    stream (gpt2np's round stream, gpt2np/decoding/stream.py) one after the other; its rows are not packed
    with the others'. A job alone keeps the single-sequence statistics (its own c and v: a packed job's
    passes are shared, so its reply has no such costs). A chain
    that started alone joins its drafter's batch once others draft there ("heuristic" with the schedule its
    rounds left it at), prompt-lookup chains ride in the draft model's batch (chain_home; under "auto" with a
    policy of their own),
    and plain jobs ride in a drafting batch as sequences with K = 0 (plain_home, _pack): one target pass a
    step where it can.

Capacity is max_batch + max_queue generations, running and waiting together: a request is refused
(429) only when that many are in already. Jobs join the batch at step boundaries only, so a burst that
arrives during a step waits in the queue for slots that are free; counting the queue alone against
max_queue would refuse it although slots are free.

Each round becomes a message for the request that asked for it, as it comes. Every job gets the
tokens it would get alone: each sequence of the packed pass keeps its own cache, options and rng.
`open_stream` (speculative, alone) and `_add_to_batch` (packed) are the places that call the decoders.
"""
import asyncio
import collections
import copy
import dataclasses
import logging
import queue
import threading
import time

import numpy as np

import gpt2np
from gpt2np import check_generation_request
from gpt2np.report import TokenTexts

from .jobs import Active, Generation, Job, LiveStats, QueueFull, RequestError, counted_K, new_seed  # noqa: F401
from .names import hide_path, served_name

log = logging.getLogger("gpt2np.serve")
BATCH_K_MAX = 8  # a drafting batch's bound on K="auto" (the requests' default K_max; a request's lower K_max caps
                 # its own K; BatchAutoK's choice costs ~80 us a round at 8 drafts, ~270 us at 32)


class Engine:
    """The served target, its drafters by name, and the worker that runs up to max_batch generations."""

    def __init__(self, target, drafters, model_id=None, max_queue=16, max_batch=8, prefill_chunk=256,
                 target_alone_by_default=False):
        """drafters: name -> drafter, the first the default (target_alone_by_default: none, a request drafts only
        with the drafter it names: --draft_model_size none). Models loaded from a folder are served by the
        folder's name (names.py): the ids, the drafter names and the statistics never show a local path.
        max_batch: generations running at once (1: one at a time); prefill_chunk: the most prompt
        rows a newcomer feeds per step (None: its whole prompt in one step)."""
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.target = hide_path(target)
        self.drafters = {served_name(name): hide_drafter_path(d) for name, d in drafters.items()}
        if len(self.drafters) < len(drafters):
            raise ValueError(f"two drafters would be served under one name: {sorted(map(str, drafters))}")
        self.default_drafter = None if target_alone_by_default else next(iter(self.drafters), None)
        self.model_id = served_name(model_id or getattr(target, "name", "gpt2np"))
        self.tokenizer, self.n_ctx = target.tokenizer, target.n_ctx
        self.max_queue, self.max_batch, self.prefill_chunk = max_queue, max_batch, prefill_chunk
        self._waiting = queue.Queue()  # each request's jobs, one item; unbounded: submit_all() bounds self._taken
        self._held = collections.deque()  # jobs of a request taken from the queue that found no free slot yet
        self._taken, self._lock = 0, threading.Lock()  # jobs submitted and not yet gone: at most capacity
        self._n_waiting = 0  # jobs submitted, not yet admitted, not gone (queued), under self._lock
        self._thread, self._stopping = None, False
        self._active, self._members = {}, {}  # job -> Active; (batch, handle) -> its job
        self._new_batches()
        self._seconds_per_job = 1.0  # running mean, for Retry-After
        # answered (to max_tokens, <|endoftext|> or a stop string); their client left (running or waiting);
        # ended by an error (500, or a 400 the checks missed)
        self.served = self.cancelled = self.failed = 0

    def _new_batches(self):
        """The packed batches, empty: plain jobs in one, drafting jobs in one per served draft model."""
        self._batch = gpt2np.ContinuousBatch(self.target, self.prefill_chunk)
        self._drafting = {name: gpt2np.ContinuousSpeculativeBatch(self.target, packed_draft(d), K_max=BATCH_K_MAX,
                                                                  prefill_chunk=self.prefill_chunk)
                          for name, d in self.drafters.items() if packed_draft(d) is not None}

    def batch_for(self, g):  # -> the packed batch a Generation joins, or None: it runs as its own stream
        """Plain jobs: plain_home (a drafting batch running, else the plain batch). A chain drafted by a draft
        model or prompt lookup (a fixed K, "heuristic" or "auto"): its drafter's batch, unless it would run alone
        (nothing active, nothing waiting): then its own stream, which reports its own costs (c, v, the predicted
        speedup) and runs the single-sequence K policies. A tree: its own stream."""
        if g.drafter is None:
            return self.plain_home()
        alone = not self._active and self._waiting.empty() and not self._held
        if g.tree is None and not alone:  # a chain: an int K, "heuristic" (its own schedule) or "auto"
            return self.chain_home(g)
        return None

    def chain_home(self, g):  # -> the drafting batch a chain joins
        """Its drafter's batch; but a prompt-lookup chain rides in a draft model's batch where one is served,
        looking up its own context there (ContinuousSpeculativeBatch.add(lookup=); under "auto" a policy of the
        lookups' own chooses its K), so that both share one target pass."""
        own = self._drafting.get(g.drafter)
        if not isinstance(self.drafters[g.drafter], gpt2np.NgramDrafter):
            return own
        return next((b for name, b in self._drafting.items()
                     if not isinstance(self.drafters[name], gpt2np.NgramDrafter)), own)

    def plain_home(self):  # -> the packed batch a plain job joins
        """The fullest drafting batch running, where a plain job rides as a sequence with K = 0 (the same tokens
        as the plain batch's: generate's), so that a step runs one target pass, not one for the plain jobs
        and one for the drafting ones; else the plain batch. Either feeds a long prompt prefill_chunk rows a
        step."""
        running = [b for b in self._drafting.values() if len(b)]
        return max(running, key=len) if running else self._batch

    def fits_a_step(self, rows):  # -> whether `rows` prompt rows may be fed in one step (prefill_chunk)
        return self.prefill_chunk is None or rows <= self.prefill_chunk

    # lifecycle ----------------------------------------------------------------------------------
    def start(self):
        if self._thread is None:
            self.warm_up()
            self._stopping = False
            self._thread = threading.Thread(target=self._work, name="gpt2np-worker", daemon=True)
            self._thread.start()
        return self

    def warm_up(self):
        """One short generation per decoder before serving (the packed pass with two sequences): the
        first request should not pay for first calls (allocations, BLAS start-up), or a comparison
        made with it would be unfair."""
        prompt, n = [self.target.eot_id or 0], min(6, self.n_ctx - 1)
        for batch in (gpt2np.ContinuousBatch(self.target),
                      *(gpt2np.ContinuousSpeculativeBatch(self.target, b.draft) for b in self._drafting.values())):
            for _ in range(min(2, self.max_batch)):
                batch.add(prompt, n)
            while batch:
                batch.step()
        for drafter in self.drafters:
            g = Generation(tuple(prompt), max_tokens=n, drafter=drafter)
            type(self).open_stream(self, g).run()  # the class's adapter, whatever a test put on the instance

    def stop(self):
        """Refuse what still waits (503), let the running generations end, stop the worker."""
        while True:
            try:
                jobs = self._waiting.get_nowait()
            except queue.Empty:
                break
            self._refuse(jobs or ())
        if self._thread is not None:
            self._waiting.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self):
        return self._n_waiting

    @property
    def active(self):
        """Generations running now (at most max_batch)."""
        return len(self._active)

    @property
    def busy(self):
        return bool(self._active)

    @property
    def capacity(self):
        """Generations the server takes at once: max_batch running, max_queue more waiting."""
        return self.max_batch + self.max_queue

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
        if g.tree is not None and g.drafter is None:
            raise RequestError("tree", "tree: a token tree is drafted: leave speculative true")
        if g.tree == "auto" and isinstance(self.drafters[g.drafter], gpt2np.NgramDrafter):
            raise RequestError("tree", f"tree: 'auto' picks the shapes a draft model grows; the drafter "
                                       f"{g.drafter!r} takes a fixed shape (e.g. [3, 1])")
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
        """Queue a checked generation; returns its Job. QueueFull when max_batch + max_queue generations
        are running or waiting already: a free batch slot is room, even before the worker's next step
        boundary admits the job into it."""
        return self.submit_all([generation], loop)[0]

    def submit_all(self, generations, loop):
        """Queue one request's checked generations (its prompts) together, all or none; returns their Jobs,
        which share one inbox. They wait side by side, so free slots admit them at the same step boundary."""
        inbox = asyncio.Queue()
        jobs = [Job(g, loop, inbox, i, on_gone=self._release) for i, g in enumerate(generations)]
        if not self.alive:
            raise QueueFull(self.retry_after(), status=503)
        with self._lock:  # request threads submit, the worker releases: one count for both
            if self._taken + len(jobs) > self.capacity:
                raise QueueFull(self.retry_after(self._taken + len(jobs) - self.capacity))
            self._taken += len(jobs)
            self._n_waiting += len(jobs)
        self._waiting.put(tuple(jobs))  # one item: the worker admits them at one step boundary, as slots allow
        return jobs

    def _release(self, job):
        """A submitted job is gone (answered, cancelled, failed or refused at shutdown), or its request has
        all it wants from it (job.finish, job.cancel): its room is free, once, and it no longer counts as
        queued. A client that has its answer, or has left, frees its room for the next request at once,
        though the worker drops the job only at its next step boundary (or skips it in the queue)."""
        with self._lock:
            if job.gone:
                return
            job.gone = True
            self._taken -= 1
            self._n_waiting -= not job.admitted

    def retry_after(self, slots=1):
        """Whole seconds until `slots` places are likely free (max_batch jobs end per mean job time): at least 1.
        A request of several prompts (or n) that does not fit needs as many places as it lacks."""
        return max(1, int(np.ceil(self._seconds_per_job * slots / self.max_batch)))

    # the worker ---------------------------------------------------------------------------------
    def open_stream(self, g, rng=None):
        """The adapter to gpt2np's decoders: a Generation -> a Stream of RoundEvents (rng: its generator, by
        default a fresh one from its seed)."""
        sampling = sampling_of(g, rng)
        if g.drafter is None:
            return gpt2np.plain_stream(self.target, list(g.prompt_ids), g.max_tokens, **sampling)
        drafter = copy.copy(self.drafters[g.drafter])  # its own state (a cache, an index): streams interleave
        K = dict(K=g.K) if g.tree is None else dict(tree=g.tree)  # a tree fixes each round's drafts
        return gpt2np.speculative_stream(self.target, drafter, list(g.prompt_ids), g.max_tokens, K_max=g.K_max,
                                         calibrate=True, **K, **sampling)  # the reply's stats hold c, v

    def _work(self):
        while self._admit():
            try:
                self._step()
            except Exception:  # the worker must outlive any request
                log.exception("generation failed")
                for job in list(self._active):
                    self._leave(job, ("error", 500, "internal error while generating"))
                self._new_batches()

    def _refuse(self, jobs):
        """Jobs that waited, at shutdown: 503 each."""
        for job in jobs:
            job.cancel()
            job.put(("error", 503, "the server is shutting down"))
            self._release(job)

    def _admit(self):  # -> False once stopping and nothing is left to run
        """At a step boundary: jobs that waited join, up to max_batch active; waits only when idle. A
        request's jobs come as one item: those that find no slot are held for the next boundary."""
        while len(self._active) < self.max_batch and not self._stopping:
            if not self._held:
                try:
                    jobs = self._waiting.get(block=not self._active)
                except queue.Empty:
                    break
                if jobs is None:
                    self._stopping = True  # stop(): finish what runs, admit nothing more
                    break
                self._held.extend(jobs)
            job = self._held.popleft()
            with self._lock:
                job.admitted = True
                self._n_waiting -= not job.gone
            if job.cancelled.is_set():  # its client left while it waited
                self.cancelled += 1
                self._release(job)
            else:
                self._open(job)
        return bool(self._active) or not self._stopping

    def _add_to_batch(self, batch, g, emitted=(), rng=None, schedule=None):  # -> its handle in the batch
        """The adapter to gpt2np's packed batches: a Generation joins a plain or a drafting batch (a plain one with
        K = 0); one that moves mid-way (_pack) joins with the tokens it emitted as more prompt, its own generator
        and, K "heuristic", the schedule its rounds left it at."""
        sampling = sampling_of(g, rng)
        ids, n_tokens = list(g.prompt_ids) + list(emitted), g.max_tokens - len(emitted)
        if batch is self._batch:
            return batch.add(ids, n_tokens, **sampling)
        if g.drafter is None:  # a plain job riding in a drafting batch
            return batch.add(ids, n_tokens, 0, **sampling)
        lookup = None if batch is self._drafting[g.drafter] else self.drafters[g.drafter]  # (chain_home)
        return batch.add(ids, n_tokens, g.K, K_max=g.K_max, lookup=lookup, schedule=schedule, **sampling)

    def _open(self, job):
        """Start a job: it joins its packed batch (batch_for), or gets its own stream."""
        g = job.generation
        lookup = g.drafter is not None and not isinstance(self.drafters.get(g.drafter), gpt2np.ModelDrafter)
        active = Active(TokenTexts(self.tokenizer), time.perf_counter(), live=LiveStats(counted_K(g, lookup)))
        try:
            active.batch, active.rng = self.batch_for(g), generator_of(g)
            if active.batch is not None:
                active.handle = self._add_to_batch(active.batch, g, rng=active.rng)
                self._members[active.batch, active.handle] = job
            else:
                active.stream = self.open_stream(g, active.rng)
                if g.K == "heuristic" and g.tree is None:  # the schedule its stream follows, kept beside it
                    active.schedule = gpt2np.make_policy("heuristic", g.K_max)
        except ValueError as e:  # check() should have caught it; still the client's error
            job.put(("error", 400, str(e).splitlines()[0]))
            self.failed += 1
            self._release(job)
            return
        self._active[job] = active

    def _step(self):
        """One scheduler step: drop the jobs whose client left, one packed pass for the plain jobs, one
        packed round per drafting batch, one round of each other speculative job; every round goes to
        its request as it comes."""
        for job in [job for job in self._active if job.cancelled.is_set()]:
            self._leave(job, ("stopped",) if job.satisfied else ("cancelled",))
        self._pack()
        for batch in (b for b in (self._batch, *self._drafting.values()) if len(b)):
            for handle, event in batch.step():
                job = self._members[batch, handle]
                self._deliver(job, event)
                if handle not in batch:  # finished: it has left the batch already
                    self._leave(job, ("done", batch.pop_tokens(handle)))
        for job, active in [(job, a) for job, a in self._active.items() if a.stream is not None]:
            try:
                self._deliver(job, next(active.stream))
            except StopIteration:
                self._leave(job, ("done", active.stream.result))
            except Exception:  # this job's decoder failed: the others go on
                log.exception("generation failed")
                self._leave(job, ("error", 500, "internal error while generating"))

    def _pack(self):
        """At a step boundary, so that the step runs as few target passes as it can, a job running beside a
        drafting batch with others in it joins it: a chain that started alone (its own stream; measured, 2
        clients of 124M -> 355M, K "auto": 18-21 output tok/s, packed 32-33) joins its drafter's batch, a plain
        job the fullest drafting batch (plain_home). Its prompt is the request's prompt and every token it
        emitted, its generator its own: a fixed K (0 for a plain job) draws what it would alone (each round the
        same rows, from the same context and generator), and so does "heuristic" (its schedule, kept beside its
        stream, goes with it: Active.schedule); "auto" follows the target's law as any packed job.
        It feeds its prompt and tokens again on joining, so one with more than prefill_chunk of them stays where it
        is (it would draw nothing for the steps its chunks take), as does one that has all its tokens, or
        <|endoftext|>: it is ending."""
        for job, active in list(self._active.items()):
            g, rows = job.generation, len(job.generation.prompt_ids) + len(active.tokens)
            if active.stream is not None:  # started alone
                home = self.batch_for(g)
            else:  # in the plain batch, or in a drafting batch already
                home = self.plain_home() if active.batch is self._batch else None
            if (home is None or home is self._batch or not len(home) or not self.fits_a_step(rows)
                    or len(active.tokens) >= g.max_tokens or self.target.eot_id in active.tokens):
                continue
            handle = self._add_to_batch(home, g, active.tokens, active.rng, active.schedule)
            if active.stream is not None:
                active.stream.close()
            else:
                active.batch.cancel(active.handle)
                del self._members[active.batch, active.handle]
            active.stream, active.batch, active.handle, active.offset = None, home, handle, len(active.tokens)
            self._members[home, handle] = job

    def _deliver(self, job, event):
        """A round -> ("round", event, pieces, live) for its request (<|endoftext|> shows as ""). A job that
        moved into its batch mid-way (_pack) counts its rounds' tokens from its request's first."""
        active, eot = self._active[job], self.target.eot_id
        if active.offset:
            event = dataclasses.replace(event, n_emitted=event.n_emitted + active.offset)
        active.tokens += event.tokens
        active.live.add(event)
        if active.schedule is not None and active.stream is not None:  # as its stream's own schedule moves
            active.schedule.update(event)
        pieces = ["" if t == eot else p for t, p in zip(event.tokens, active.texts.pieces(event.tokens))]
        job.put(("round", event, pieces, active.live.as_dict()))

    def _leave(self, job, message):
        """The job leaves the active set at once: done (its tail and live statistics added), stopped
        (its request has its answer: a stop string), cancelled (its client left), or failed; for the
        last three its decoder stops where it is. The counters: served for done and stopped."""
        active = self._active.pop(job)
        if active.batch is not None:
            active.batch.cancel(active.handle)
            self._members.pop((active.batch, active.handle))
        elif message[0] != "done":
            active.stream.close()
        if message[0] == "done":
            message = (*message, active.texts.flush(), active.live.as_dict())
        if message[0] in ("done", "stopped"):
            self.served += 1
        elif message[0] == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1
        self._release(job)  # before the message: a client with its answer finds the room free
        job.put(message)
        self._seconds_per_job = 0.8 * self._seconds_per_job + 0.2 * (time.perf_counter() - active.started)


def packed_draft(drafter):  # -> what a drafting batch drafts with: a draft model's model, prompt lookup, or None
    if isinstance(drafter, gpt2np.ModelDrafter):
        return drafter.model
    return drafter if isinstance(drafter, gpt2np.NgramDrafter) else None


def generator_of(g):  # -> a Generation's own generator, fresh from its seed
    return np.random.default_rng(g.seed)


def sampling_of(g, rng=None):  # -> the decoders' sampling arguments for a Generation, with rng or its own generator
    return dict(temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, rng=generator_of(g) if rng is None else rng)


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
