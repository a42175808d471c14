"""gpt2np.serve under load: many clients at once, a full queue, clients that leave mid-stream.

These tests check that every request is answered with the right text (none lost, none mixed up),
that a full server (max_batch running, max_queue waiting) answers 429 with Retry-After, and that a
client that disconnects stops its generation instead of holding the worker. Where timing would
decide the outcome, the worker is held on a gate (serve_helpers.slow_down) so the test is
deterministic; no test asserts a duration.
"""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

import gpt2np  # noqa: E402
from serve_helpers import DRAFT, TARGET, bundled_engine, running_server, slow_down  # noqa: E402

PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo", "KING HENRY:\nOnce more", "First Citizen:\nBefore we"]


def request_kinds():
    """12 distinct requests: greedy speculative, seeded speculative sampling, seeded target-only."""
    kinds = []
    for i, prompt in enumerate(PROMPTS):
        n = 4 + i
        kinds += [{"prompt": prompt, "max_tokens": n, "temperature": 0},
                  {"prompt": prompt, "max_tokens": n, "temperature": 0.8, "seed": i, "K": 3},
                  {"prompt": prompt, "max_tokens": n, "temperature": 1.0, "seed": i, "speculative": False}]
    return kinds


def expected_text(target, drafter, kind):
    """What gpt2np's own decoders give for the request (the server must give the same)."""
    ids, n = target.tokenizer.encode(kind["prompt"]), kind["max_tokens"]
    if kind["temperature"] == 0:
        tokens = gpt2np.generate(target, ids, n, temperature=0)
    elif kind.get("speculative") is False:
        tokens = gpt2np.generate(target, ids, n, temperature=kind["temperature"],
                                 rng=np.random.default_rng(kind["seed"]))
    else:
        tokens = gpt2np.speculative_generate(target, drafter, ids, n, K=kind["K"], temperature=kind["temperature"],
                                             rng=np.random.default_rng(kind["seed"])).tokens
    return target.tokenizer.decode([t for t in tokens if t != target.eot_id])


def wait_until(condition, timeout=30):
    """Poll condition() until true or timeout seconds have passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def complete(url, body, stream):
    """One completion over HTTP -> (status, text or error body, Retry-After header)."""
    answer = requests.post(url + "/v1/completions", json={**body, "model": TARGET, "stream": stream},
                           stream=stream, timeout=120)
    if answer.status_code != 200:
        return answer.status_code, answer.json(), answer.headers.get("Retry-After")
    if not stream:
        return 200, answer.json()["choices"][0]["text"], None
    text, done = "", False
    for line in answer.iter_lines(decode_unicode=True):
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            text += json.loads(line[6:])["choices"][0]["text"]
    assert done, "the event stream ended without data: [DONE]"
    return 200, text, None


def test_32_concurrent_clients_every_request_answered_correctly():
    from threadpoolctl import threadpool_limits
    target, drafter, kinds = gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT), request_kinds()
    with threadpool_limits(limits=1, user_api="blas"):  # as the server: one BLAS thread for small models
        expected = [expected_text(target, drafter, kind) for kind in kinds]
    engine = bundled_engine(max_queue=24)
    refusals, lock = [], threading.Lock()

    def client(c):  # 3 requests each, streaming and not, retrying after a 429
        results = []
        for r in range(3):
            k = (c * 3 + r) % len(kinds)
            for attempt in range(200):
                status, body, retry_after = complete(url, kinds[k], stream=(c + r) % 2 == 0)
                if status != 429:
                    break
                with lock:
                    refusals.append((body, retry_after))
                time.sleep(0.25 + 0.02 * (c % 7))  # not Retry-After's whole second: keeps the test short
            results.append((k, status, body))
        return results

    with running_server(engine) as url:
        with ThreadPoolExecutor(32) as pool:
            answers = [a for results in pool.map(client, range(32)) for a in results]
        health = requests.get(url + "/health", timeout=10).json()
    assert len(answers) == 96, f"{96 - len(answers)} requests lost"
    wrong = [(k, status, body) for k, status, body in answers if status != 200 or body != expected[k]]
    assert not wrong, f"{len(wrong)} of 96 answers wrong, e.g. {wrong[0]} (expected {expected[wrong[0][0]]!r})"
    for body, retry_after in refusals:
        assert body["error"]["code"] == "queue_full" and int(retry_after) >= 1
    assert health["status"] == "ok" and health["queued"] == 0 and not health["busy"]
    assert engine.served == 96 and engine.cancelled == 0
    print(f"96 requests from 32 clients, all correct; {len(refusals)} answered 429 first")


def test_a_full_queue_answers_429_with_retry_after_then_recovers():
    """One at a time (max_batch 1: a free batch slot would be room too) with a queue of 2."""
    engine, gate = bundled_engine(max_queue=2, max_batch=1), threading.Event()
    slow_down(engine, gate=gate)
    body = {"prompt": "ROMEO:\n", "max_tokens": 10, "temperature": 0}
    with running_server(engine) as url, ThreadPoolExecutor(3) as pool:
        held = [pool.submit(complete, url, body, stream=False)]
        assert wait_until(lambda: engine.busy), "the first request did not reach the worker"  # held at the gate
        held += [pool.submit(complete, url, body, stream=i == 1) for i in range(2)]  # then 2 wait in the queue
        assert wait_until(lambda: engine.queued == 2), "the worker was not held with a full queue"
        for stream in (False, True):
            status, error, retry_after = complete(url, body, stream)
            assert status == 429 and error["error"]["type"] == "rate_limit_error" and int(retry_after) >= 1
        gate.set()
        texts = [f.result(timeout=60) for f in held]
        assert [status for status, _, _ in texts] == [200] * 3 and len({text for _, text, _ in texts}) == 1
        assert complete(url, body, stream=False)[1] == texts[0][1]
        assert requests.get(url + "/health", timeout=10).json()["status"] == "ok"


def test_a_client_leaving_mid_stream_stops_its_generation_and_frees_the_worker():
    engine, opened = bundled_engine(), []
    slow_down(engine, delay=0.02, opened=opened)  # 200 tokens would take seconds: long enough to leave early
    with running_server(engine) as url:
        answer = requests.post(url + "/v1/completions", json={"model": TARGET, "prompt": "ROMEO:\n",
                               "max_tokens": 200, "temperature": 0, "stream": True}, stream=True, timeout=60)
        first = next(line for line in answer.iter_lines(decode_unicode=True) if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"]
        answer.close()  # the client leaves after its first event
        assert wait_until(lambda: engine.cancelled == 1), "the generation went on after its client left"
        emitted = sum(engine.delivered.values())
        assert len(opened) == 1 and emitted < 200, f"the stream emitted all {emitted} tokens: it was never stopped"
        status, text, _ = complete(url, {"prompt": "KING:", "max_tokens": 12, "temperature": 0}, stream=False)
        target = gpt2np.load_model(TARGET)
        expected = target.tokenizer.decode(gpt2np.generate(target, target.tokenizer.encode("KING:"), 12, temperature=0))
        assert status == 200 and text == expected
        health = requests.get(url + "/health", timeout=10).json()
        assert not health["busy"]
        assert (health["served"], health["cancelled"], health["failed"]) == (1, 1, 0), "the leaver counted as served"


def test_a_client_leaving_while_queued_is_skipped():
    engine, gate, opened = bundled_engine(), threading.Event(), []
    slow_down(engine, gate=gate, opened=opened)
    body = {"model": TARGET, "prompt": "ROMEO:\n", "max_tokens": 5, "temperature": 0}
    with running_server(engine) as url, ThreadPoolExecutor(1) as pool:
        running = pool.submit(complete, url, body, stream=False)
        assert wait_until(lambda: engine.busy)
        waiting = requests.post(url + "/v1/completions", json={**body, "stream": True}, stream=True, timeout=60)
        assert wait_until(lambda: engine.queued == 1)
        job = engine._waiting.queue[0][0]  # the request's one job
        waiting.close()  # leaves before its generation starts
        assert wait_until(job.cancelled.is_set), "the server did not notice the client leave"
        gate.set()
        assert running.result(timeout=60)[0] == 200
        assert wait_until(lambda: engine.queued == 0)
        assert len(opened) == 1 and engine.cancelled == 1, "a generation ran for a client that had left"


def test_a_client_leaving_a_non_streaming_request_frees_the_worker():
    engine, opened = bundled_engine(), []
    slow_down(engine, delay=0.02, opened=opened)
    with running_server(engine) as url:
        with pytest.raises(requests.Timeout):  # the client gives up and closes its connection
            requests.post(url + "/predict", json={"prompt": "ROMEO:\n", "max_tokens": 200}, timeout=0.3)
        assert wait_until(lambda: engine.cancelled == 1), "the generation went on after its client left"
        assert len(opened) == 1 and sum(engine.delivered.values()) < 200
        assert complete(url, {"prompt": "KING:", "max_tokens": 4, "temperature": 0}, stream=False)[0] == 200


def test_a_stopped_engine_answers_503_and_refuses_what_waits():
    import asyncio
    from gpt2np.serve.engine import Generation, QueueFull
    engine = bundled_engine()
    with pytest.raises(QueueFull) as refused:  # never started: nothing would run the job
        engine.submit(Generation((0,), 4), loop=None)
    assert refused.value.status == 503 and refused.value.retry_after >= 1
    engine.start()
    engine.stop()
    assert not engine.alive
    with pytest.raises(QueueFull):
        engine.submit(Generation((0,), 4), loop=asyncio.new_event_loop())
