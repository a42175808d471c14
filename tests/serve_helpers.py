"""A real uvicorn server on 127.0.0.1 in a background thread, serving the bundled pair.

The test modules of gpt2np.serve share this: each starts its own server (on a free port the
operating system picks) and reaches it over HTTP like any client. The engine object stays at hand,
so a test can read its counters or slow its worker down (SlowStream) without touching the code
under test.
"""
import contextlib
import socket
import threading
import time

import gpt2np

TARGET, DRAFT = "shakespeare-2.6M", "shakespeare-260K"


def bundled_engine(max_queue=16, max_batch=8):
    from gpt2np.serve.engine import Engine
    target, drafter = gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT)
    return Engine(target, {drafter.name: drafter, "ngram": gpt2np.NgramDrafter()}, max_queue=max_queue,
                  max_batch=max_batch)


@contextlib.contextmanager
def running_server(engine, **app_options):
    """Serve create_app(engine) until the block ends; yields the base URL."""
    import uvicorn
    from threadpoolctl import threadpool_limits
    from gpt2np.serve.app import create_app
    limits = threadpool_limits(limits=1, user_api="blas")  # as the command line does for small models
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, **app_options), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        limits.restore_original_limits()


class SlowStream:
    """A Stream whose rounds each wait `delay` seconds first, and whose first round waits for
    `gate` (a threading.Event) when one is given: a stand-in for a big model, so a test can hold
    the worker busy for as long as it needs."""

    def __init__(self, stream, delay=0.0, gate=None):
        self.stream, self.delay, self.gate, self.rounds = stream, delay, gate, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.gate is not None:
            self.gate.wait(timeout=60)
            self.gate = None
        time.sleep(self.delay)
        event = next(self.stream)
        self.rounds += 1
        return event

    def close(self):
        self.stream.close()

    @property
    def result(self):
        return self.stream.result


class SlowSteps:
    """A packed batch's step() that waits `delay` seconds first, and for `gate` at its first call: the
    same stand-in as SlowStream, for the jobs that run in a batch (engine.py packs plain jobs and
    chains drafted by a draft model)."""

    def __init__(self, step, delay=0.0, gate=None):
        self.step, self.delay, self.gate = step, delay, gate

    def __call__(self):
        if self.gate is not None and not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        time.sleep(self.delay)
        return self.step()


def slow_down(engine, delay=0.0, gate=None, opened=None):
    """Make engine's worker slow: its own streams become SlowStreams and its packed batches' steps
    SlowSteps (one gate for all: the worker waits at its first step or round until the test opens it).
    Every generation the worker starts is appended to `opened` (its Generation), and the tokens it
    delivers are counted in engine.delivered: a test can tell a generation stopped early."""
    original = engine.open_stream
    engine.delivered = {}

    def open_stream(generation, rng=None):
        return SlowStream(original(generation, rng), delay, gate)

    def start(job, open_job=engine._open):
        if opened is not None:
            opened.append(job.generation)
        return open_job(job)

    def deliver(job, event, deliver_=engine._deliver):
        engine.delivered[job] = engine.delivered.get(job, 0) + len(event.tokens)
        return deliver_(job, event)

    def new_batches(new=engine._new_batches):
        new()
        for batch in (engine._batch, *engine._drafting.values()):
            batch.step = SlowSteps(batch.step, delay, gate)
    engine.open_stream, engine._open, engine._deliver, engine._new_batches = open_stream, start, deliver, new_batches
    new_batches()
    return original
