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


def bundled_engine(max_queue=16):
    from gpt2np.serve.engine import Engine
    target, drafter = gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT)
    return Engine(target, {drafter.name: drafter, "ngram": gpt2np.NgramDrafter()}, max_queue=max_queue)


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


def slow_down(engine, delay=0.0, gate=None, opened=None):
    """Make engine's worker run SlowStreams; each opened stream is appended to `opened`."""
    original = engine.open_stream

    def open_stream(generation):
        stream = SlowStream(original(generation), delay, gate)
        if opened is not None:
            opened.append(stream)
        return stream
    engine.open_stream = open_stream
    return original
