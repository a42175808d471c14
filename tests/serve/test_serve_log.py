"""The server's log: one line per request on stderr once it is answered (time, client, method, path, status,
seconds, and a completion's tokens or an error's message), off with --quiet, and a line when it stops.

The command itself runs in a subprocess on 127.0.0.1 and a free port (--port 0; a watchdog kills it after
120 s in any case); the lines for a busy server and a client that left come from a real uvicorn in this
process (tests/serve_helpers.py) whose worker is held at a gate, read from the logger the command prints.
"""
import json
import logging
import queue
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

from serve_helpers import TARGET, bundled_engine, running_server, slow_down  # noqa: E402
from test_serve_load import complete, wait_until  # noqa: E402

SERVE = [sys.executable, "-m", "gpt2np.serve", "--draft_model_size", "ngram", "--port", "0"]
TIME = r"\d\d:\d\d:\d\d"


class Command:
    """The server command with its stderr read line by line in a thread."""

    def __init__(self, *flags, sigint_ignored=False):
        """sigint_ignored: started as a script's background job (`&`), which a shell starts with SIGINT ignored."""
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.process = subprocess.Popen([*SERVE, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, preexec_fn=ignore)
        self.watchdog = threading.Timer(120, self.process.kill)
        self.watchdog.start()
        self.lines = queue.Queue()
        threading.Thread(target=self.read, daemon=True).start()
        serving = self.next_line(60)
        found = re.search(r" on (http://127\.0\.0\.1:\d+)/ ", serving or "")
        assert found, f"expected the serving line, got {serving!r}"
        self.url = found.group(1)

    def read(self):
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of stderr: the process has closed it

    def next_line(self, timeout=30):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self):
        """SIGINT (Ctrl-C), as a user stops it; the rest of its stderr, up to its end."""
        self.process.send_signal(signal.SIGINT)
        status = self.process.wait(timeout=60)
        self.watchdog.cancel()
        rest = []
        while (line := self.next_line()) is not None:
            rest.append(line)
        return status, rest

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.watchdog.cancel()


def test_each_request_gets_one_line_on_stderr_and_the_server_says_when_it_stops():
    """It logged nothing per request (uvicorn runs at "warning") and nothing when stopped, so whoever ran a
    class's server could not see requests arrive."""
    command = Command()
    try:
        assert requests.get(command.url + "/health", timeout=30).status_code == 200
        health = command.next_line()
        assert re.fullmatch(rf"{TIME} 127\.0\.0\.1 GET /health 200 \d+\.\d{{3}} s", health or ""), health
        good = requests.post(command.url + "/v1/completions", json={"model": TARGET, "prompt": "ROMEO:",
                             "max_tokens": 9, "temperature": 0, "K": 3}, timeout=60)
        assert good.status_code == 200
        said = command.next_line()
        prompt_tokens = good.json()["usage"]["prompt_tokens"]
        assert re.fullmatch(rf"{TIME} 127\.0\.0\.1 POST /v1/completions 200 \d+\.\d{{3}} s: {prompt_tokens} prompt \+ 9 "
                            r"completion tokens \(length\), drafter ngram K 3", said or ""), said
        bad = requests.post(command.url + "/predict?prompt=secret", json={"prompt": "A", "temperature": -1}, timeout=30)
        assert bad.status_code == 400
        said = command.next_line()
        assert re.fullmatch(rf"{TIME} 127\.0\.0\.1 POST /predict 400 \d+\.\d{{3}} s: "
                            + re.escape(bad.json()["error"]["message"]), said or ""), said
        assert "secret" not in said, "the query (the playground's ?prompt=) stays out of the log"
        status, rest = command.stop()
    finally:
        command.kill()
    assert status == 130 and rest == ["stopped serving: 1 served, 0 cancelled (client left), 0 failed"], (status, rest)


def test_quiet_leaves_out_the_request_lines_only():
    command = Command("--quiet")
    try:
        assert requests.get(command.url + "/health", timeout=30).status_code == 200
        assert requests.post(command.url + "/predict", json={"prompt": "A", "max_tokens": 3}, timeout=60).ok
        status, rest = command.stop()
    finally:
        command.kill()
    assert status == 130 and rest == ["stopped serving: 1 served, 0 cancelled (client left), 0 failed"], (status, rest)


def test_a_server_started_in_a_scripts_background_still_exits_130_when_stopped():
    """A script that runs the server with `&` and stops it with kill -INT: the shell had started it with SIGINT
    ignored, so uvicorn's re-raise of the signal did nothing and the command exited 0, as if it had ended by
    itself."""
    command = Command("--quiet", sigint_ignored=True)
    try:
        assert requests.get(command.url + "/health", timeout=30).status_code == 200  # uvicorn's handlers are in
        status, rest = command.stop()
    finally:
        command.kill()
    assert status == 130 and rest == ["stopped serving: 0 served, 0 cancelled (client left), 0 failed"], (status, rest)


def test_help_says_requests_are_logged_and_how_to_turn_it_off():
    shown = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=120)
    text = " ".join(shown.stdout.split())
    assert "--quiet no line per request on stderr (by default each request, once answered, gets one" in text, text


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "gpt2np.serve.requests"]


def test_busy_answers_streams_and_clients_that_leave_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="gpt2np.serve.requests")
    engine, gate = bundled_engine(max_queue=2, max_batch=1), threading.Event()
    slow_down(engine, gate=gate)
    body = {"prompt": "ROMEO:\n", "max_tokens": 6, "temperature": 0, "speculative": False}
    with running_server(engine, log_requests=True) as url, ThreadPoolExecutor(3) as pool:
        held = pool.submit(complete, url, body, stream=False)
        assert wait_until(lambda: engine.busy)
        with pytest.raises(requests.Timeout):  # queued behind the held one; the client gives up
            requests.post(url + "/predict", json={"prompt": "KING:", "max_tokens": 5}, timeout=0.5)
        assert wait_until(lambda: len(lines(caplog)) == 1), lines(caplog)
        assert wait_until(lambda: engine.queued == 0)  # the one that left gave its place back at once
        queued = [pool.submit(complete, url, body, stream=True), pool.submit(complete, url, body, stream=False)]
        assert wait_until(lambda: engine.queued == 2)
        assert complete(url, body, stream=False)[0] == 429
        gate.set()
        assert held.result(timeout=60)[0] == 200 and [q.result(timeout=60)[0] for q in queued] == [200, 200]
        assert wait_until(lambda: len(lines(caplog)) == 5), lines(caplog)
    said = lines(caplog)
    assert re.fullmatch(r"127\.0\.0\.1 POST /predict 200 \d+\.\d{3} s: 5 prompt \+ 0 completion tokens, "
                        r"drafter shakespeare-260K K 4, client left", said[0]), said
    busy = [x for x in said if " 429 " in x]
    assert len(busy) == 1 and busy[0].endswith("s until a slot is likely free"), said
    assert re.match(r"127\.0\.0\.1 POST /v1/completions 429 \d+\.\d{3} s: the server is busy: ", busy[0]), busy
    done = [x for x in said if " 200 " in x and "client left" not in x]
    assert sorted(x.split(": ", 1)[1] for x in done) == [
        "7 prompt + 6 completion tokens (length), target only",
        "7 prompt + 6 completion tokens (length), target only",
        "7 prompt + 6 completion tokens (length), target only, streamed"], said
    assert json.dumps(said)  # plain strings
