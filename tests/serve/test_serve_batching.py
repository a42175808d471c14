"""gpt2np.serve with continuous batching (--max_batch 4, the bundled pair): many clients decoded together
(plain requests in one packed batch, drafting ones in another), each answered exactly as if it had
been served alone.

A real uvicorn server on 127.0.0.1 (tests/serve_helpers.py). The worker's packed step is wrapped by
HeldSteps, which records the packed batches at every step and can hold a step until the test lets it run, so
"requests join a running batch", "the queue is full" and "a client leaves mid-way" happen at known
moments; no test asserts a duration. Every expected text comes from gpt2np.generate on separately
loaded models (greedy: a speculative request gives the same tokens).
"""
import json
import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
openai = pytest.importorskip("openai", reason="the client tests need the openai package (requirements-dev.txt)")
import requests  # noqa: E402

import gpt2np  # noqa: E402
from serve_helpers import DRAFT, TARGET, running_server, slow_down  # noqa: E402
from test_serve_load import complete, wait_until  # noqa: E402

PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo", "KING HENRY:\nOnce more", "First Citizen:\nBefore we", "MERCUTIO:\n",
           "HAMLET:\nTo be", "LADY MACBETH:\nOut", "\n"]


def batching_engine(max_batch=4, max_queue=16, prefill_chunk=256):
    from gpt2np.serve.engine import Engine
    target, drafter = gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT)
    return Engine(target, {drafter.name: drafter, "ngram": gpt2np.NgramDrafter()}, max_queue=max_queue,
                  max_batch=max_batch, prefill_chunk=prefill_chunk)


class HeldSteps:
    """Wraps the engine's scheduler step: records (sequences in its packed batches, jobs active) at every step;
    while not free(), each step waits for a permit (allow(n)); delay: seconds added to every step."""

    def __init__(self, engine, delay=0.0):
        self.engine, self.delay = engine, delay
        self.permits, self.released, self.seen = threading.Semaphore(0), threading.Event(), []
        self.step, engine._step = engine._step, self

    def __call__(self):
        engine = self.engine
        self.seen.append((sum(len(b) for b in (engine._batch, *engine._drafting.values())), engine.active))
        while not self.released.is_set() and not self.permits.acquire(timeout=0.02):
            pass
        time.sleep(self.delay)
        return self.step()

    def allow(self, n=1):
        self.permits.release(n)

    def free(self):
        self.released.set()


@pytest.fixture(scope="module")
def reference():
    return gpt2np.load_model(TARGET)


def expected(target, prompt, n, temperature=0, seed=None):
    rng = None if seed is None else np.random.default_rng(seed)
    tokens = gpt2np.generate(target, target.tokenizer.encode(prompt), n, temperature=temperature, rng=rng)
    return target.tokenizer.decode([t for t in tokens if t != target.eot_id])


def ask_openai(url, body, stream):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    extra = {k: body[k] for k in ("speculative",) if k in body}
    answer = client.completions.create(model=TARGET, prompt=body["prompt"], max_tokens=body["max_tokens"],
                                       temperature=body["temperature"], seed=body.get("seed"), stream=stream,
                                       extra_body=extra)
    chunks = list(answer) if stream else [answer]
    return 200, "".join(c.choices[0].text for c in chunks), None


def logged_errors(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "gpt2np.serve" and r.levelno >= logging.ERROR]


def test_eight_clients_four_at_a_time_each_answered_as_alone(reference, caplog):
    """8 concurrent clients (half streaming; requests and openai; 2 speculative, 2 sampled with a seed,
    the rest greedy): at most 4 run at once, queued ones join the running batch as others finish, and
    every text equals generate's for the same request (the same seed: the same draws)."""
    bodies = [{"prompt": p, "max_tokens": 12 + 7 * i, "temperature": 0, "speculative": i in (2, 5)}
              for i, p in enumerate(PROMPTS)]
    for i in (3, 6):
        bodies[i] |= {"temperature": 0.9, "seed": 40 + i}
    texts = [expected(reference, b["prompt"], b["max_tokens"], b["temperature"], b.get("seed")) for b in bodies]
    engine, joined = batching_engine(), []
    held, open_job = HeldSteps(engine), engine._open
    engine._open = lambda job: joined.append(engine.active) or open_job(job)  # how many ran when each joined
    with running_server(engine) as url, ThreadPoolExecutor(8) as pool:
        clients = [pool.submit(ask_openai if i % 4 < 2 else complete, url, b, i % 2 == 1) for i, b in enumerate(bodies)]
        arrived = lambda: held.seen and engine.active + engine.queued + engine.served == 8  # noqa: E731
        assert wait_until(arrived), "the 8 requests did not all arrive"      # the worker is held in a step
        health = requests.get(url + "/health", timeout=10).json()
        assert (health["active"], health["queued"], health["max_batch"]) == (engine.active, engine.queued, 4)
        assert health["active"] >= 1 and health["busy"]
        held.free()
        answers = [c.result(timeout=120) for c in clients]
        after = requests.get(url + "/health", timeout=10).json()
    wrong = [(i, status, text, texts[i]) for i, (status, text, _) in enumerate(answers)
             if (status, text) != (200, texts[i])]
    assert not wrong, f"{len(wrong)} of 8 answers differ from generate's, e.g. {wrong[0]}"
    actives = [active for _, active in held.seen]
    assert max(actives) == 4, f"never 4 at once: {actives}"
    assert len(joined) == 8 and sum(n > 0 for n in joined) >= 3, f"running when each joined: {joined}"
    assert (after["active"], after["queued"], after["served"], after["cancelled"]) == (0, 0, 8, 0), after
    assert not logged_errors(caplog)


def test_draft_model_size_none_serves_the_target_alone_in_one_pass_a_step(reference, caplog):
    """--draft_model_size none (README: "for a class, serving the target alone keeps every request in one pass a
    step"): the server still serves prompt lookup by name, but it was every request's default, so each drafted
    as its own stream. Now a request that names no drafter runs the target alone, packed: 4 at once in one step;
    "drafter": "ngram" drafts; asking to draft without naming a drafter is a 400 naming the field."""
    from gpt2np.serve.__main__ import load_engine, parse_args
    engine = load_engine(parse_args(["--draft_model_size", "none", "--max_batch", "4"]))
    held = HeldSteps(engine)
    body = {"prompt": "ROMEO:\n", "max_tokens": 10, "temperature": 0}
    with running_server(engine) as url, ThreadPoolExecutor(4) as pool:
        served = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["gpt2np"]
        assert (served["drafters"], served["default_drafter"]) == (["ngram"], None), served
        sent = [pool.submit(complete, url, body, i % 2 == 1) for i in range(4)]
        assert wait_until(lambda: held.seen and engine.active + engine.queued == 4), "the 4 did not all arrive"
        held.free()
        answers = [f.result(timeout=60) for f in sent]
        alone = requests.post(url + "/v1/completions", json={**body, "model": TARGET}, timeout=60).json()
        lookup = requests.post(url + "/v1/completions", json={**body, "model": TARGET, "drafter": "ngram"},
                               timeout=60).json()
        refused = {field: requests.post(url + "/v1/completions", json={**body, "model": TARGET, field: value},
                                        timeout=60) for field, value in (("speculative", True), ("K", 3))}
    assert [(status, text) for status, text, _ in answers] == [(200, expected(reference, body["prompt"], 10))] * 4
    assert max(active for _, active in held.seen) == 4, f"never 4 in one pass: {held.seen}"
    assert (alone["gpt2np"]["speculative"], alone["gpt2np"]["drafter"]) == (False, None), alone["gpt2np"]
    assert (lookup["gpt2np"]["speculative"], lookup["gpt2np"]["drafter"]) == (True, "ngram"), lookup["gpt2np"]
    for field, answer in refused.items():
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["param"] == field, (answer.status_code, error)
        assert error["message"] == (f"{field}: this server drafts only with a drafter the request names (it serves "
                                    "the target alone by default): send drafter 'ngram'"), error
    assert not logged_errors(caplog)


def test_a_full_queue_answers_busy_while_four_run(reference, caplog):
    """max_batch 4, max_queue 2: with 4 running and 2 waiting, the next request (streaming or not) is 429."""
    engine = batching_engine(max_queue=2)
    held = HeldSteps(engine)
    body = {"prompt": "ROMEO:\n", "max_tokens": 10, "temperature": 0, "speculative": False}
    with running_server(engine) as url, ThreadPoolExecutor(6) as pool:
        sent = [pool.submit(complete, url, body, False)]
        assert wait_until(lambda: len(held.seen) == 1)                    # 1 running, its step held
        sent += [pool.submit(complete, url, body, i == 1) for i in range(2)]
        assert wait_until(lambda: engine.queued == 2)
        held.allow()                                                      # the 2 join: 3 running
        assert wait_until(lambda: len(held.seen) == 2)
        sent += [pool.submit(complete, url, body, i == 0) for i in range(2)]
        assert wait_until(lambda: engine.queued == 2)
        held.allow()                                                      # 1 joins: 4 running, 1 waits
        assert wait_until(lambda: len(held.seen) == 3 and engine.queued == 1)
        sent.append(pool.submit(complete, url, body, True))
        assert wait_until(lambda: engine.queued == 2)
        health = requests.get(url + "/health", timeout=10).json()
        assert (health["active"], health["queued"], health["max_queue"]) == (4, 2, 2), health
        for stream in (False, True):
            status, error, retry_after = complete(url, body, stream)
            assert status == 429 and error["error"]["code"] == "queue_full" and int(retry_after) >= 1, error
        held.free()
        answers = [f.result(timeout=60) for f in sent]
    text = expected(reference, body["prompt"], body["max_tokens"])
    assert [(status, t) for status, t, _ in answers] == [(200, text)] * 6
    assert not logged_errors(caplog)


def burst(pool, url, bodies):
    """Send every body at once (a barrier releases the clients together) -> their futures."""
    barrier = threading.Barrier(len(bodies))

    def client(i, body):
        barrier.wait(timeout=30)
        return complete(url, body, i % 2 == 1)
    return [pool.submit(client, i, body) for i, body in enumerate(bodies)]


def test_a_burst_while_a_step_runs_fills_the_free_slots_before_it_is_busy(reference, caplog):
    """max_batch 4, max_queue 1: while 1 runs (its step held, so nobody joins), a burst of 4 all wait for
    the 3 free slots and the queue's 1 (running + waiting reach max_batch + max_queue, none refused);
    a second burst of 3 is then all 429; every admitted request is answered with generate's text."""
    engine = batching_engine(max_batch=4, max_queue=1)
    held = HeldSteps(engine)
    bodies = [{"prompt": p, "max_tokens": 8, "temperature": 0, "speculative": False} for p in PROMPTS[:5]]
    with running_server(engine) as url, ThreadPoolExecutor(8) as pool:
        sent = [pool.submit(complete, url, bodies[0], False)]
        assert wait_until(lambda: len(held.seen) == 1)                    # 1 running, its step held
        sent += burst(pool, url, bodies[1:])
        assert wait_until(lambda: engine.queued == 4 or any(f.done() for f in sent[1:]))
        refused = [f.result(timeout=60) for f in burst(pool, url, bodies[:3])]
        assert [status for status, _, _ in refused] == [429] * 3, refused
        assert all(error["error"]["code"] == "queue_full" for _, error, _ in refused)
        held.free()
        answers = [f.result(timeout=60) for f in sent]
        health = requests.get(url + "/health", timeout=10).json()
    texts = [expected(reference, b["prompt"], b["max_tokens"]) for b in bodies]
    assert [(status, text) for status, text, _ in answers] == [(200, t) for t in texts], answers
    assert (health["served"], health["cancelled"], health["failed"]) == (5, 0, 0), health
    assert not logged_errors(caplog)


def test_a_burst_beyond_capacity_loses_nothing(reference):
    """9 requests at once on max_batch 4, max_queue 1: at least the first 5 in are served; each of the
    others is served or answered 429 (never lost, never an error), and /health counts the served ones."""
    engine = batching_engine(max_batch=4, max_queue=1)
    bodies = [{"prompt": PROMPTS[i % 8], "max_tokens": 16, "temperature": 0, "speculative": False} for i in range(9)]
    with running_server(engine) as url, ThreadPoolExecutor(9) as pool:
        answers = [f.result(timeout=120) for f in burst(pool, url, bodies)]
        health = requests.get(url + "/health", timeout=10).json()
    served = [(body, text) for body, (status, text, _) in zip(bodies, answers) if status == 200]
    busy = [error for status, error, _ in answers if status == 429]
    assert len(served) + len(busy) == 9 and len(served) >= 5, answers
    assert all(text == expected(reference, b["prompt"], b["max_tokens"]) for b, text in served)
    assert all(error["error"]["code"] == "queue_full" for error in busy)
    assert (health["served"], health["cancelled"], health["failed"], health["active"]) == (len(served), 0, 0, 0)


def test_a_streaming_client_leaving_does_not_disturb_the_others(reference, caplog):
    engine = batching_engine()
    held = HeldSteps(engine, delay=0.01)  # 200 tokens take > 2 s: the leaver is still running when it leaves
    bodies = [{"prompt": p, "max_tokens": 40 + 10 * i, "temperature": 0, "speculative": False}
              for i, p in enumerate(PROMPTS[:3])]
    with running_server(engine) as url, ThreadPoolExecutor(3) as pool:
        leaver = requests.post(url + "/v1/completions", json={"model": TARGET, "prompt": "HAMLET:\n", "max_tokens": 200,
                               "temperature": 0, "speculative": False, "stream": True}, stream=True, timeout=60)
        assert wait_until(lambda: len(held.seen) == 1)
        stayers = [pool.submit(complete, url, b, i % 2 == 0) for i, b in enumerate(bodies)]
        assert wait_until(lambda: engine.queued == 3)
        held.allow()                                    # the leaver's first token; then the 3 join it
        assert wait_until(lambda: len(held.seen) == 2)  # held: 4 in the batch
        first = next(line for line in leaver.iter_lines(decode_unicode=True) if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["text"] is not None
        leaver.close()  # leaves after its first event, with 3 others in the batch
        held.free()
        assert wait_until(lambda: engine.cancelled == 1), "the leaver's generation went on"
        answers = [f.result(timeout=60) for f in stayers]
    assert max(size for size, _ in held.seen) == 4 and held.seen[-1][0] < 4, held.seen
    texts = [expected(reference, b["prompt"], b["max_tokens"]) for b in bodies]
    assert [(status, text) for status, text, _ in answers] == [(200, t) for t in texts]
    assert (engine.served, engine.cancelled, engine.failed) == (3, 1, 0) and not logged_errors(caplog)


def test_speculative_requests_run_a_round_each_beside_the_packed_step(reference, caplog):
    """Four greedy speculative requests (two with the draft model: packed in its drafting batch; two by
    prompt lookup: packed in the lookup's) active with a plain one: each has its own drafter state,
    round by round interleaved, and gives generate's text."""
    engine = batching_engine()
    held = HeldSteps(engine)
    plain = {"prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0, "speculative": False}
    drafting = [{"prompt": p, "max_tokens": 40, "temperature": 0, "drafter": d}
                for p, d in zip(PROMPTS[1:5], [DRAFT, DRAFT, "ngram", "ngram"])]
    with running_server(engine) as url, ThreadPoolExecutor(5) as pool:
        sent = [pool.submit(complete, url, plain, False)]
        assert wait_until(lambda: len(held.seen) == 1)  # the plain one holds the worker: the others queue
        sent += [pool.submit(complete, url, b, i % 2 == 0) for i, b in enumerate(drafting)]
        assert wait_until(lambda: engine.queued == 4)  # 3 join at the next boundary (max_batch 4), 1 later
        held.free()
        answers = [f.result(timeout=60) for f in sent]
    assert [active for _, active in held.seen].count(4) >= 10, held.seen  # four ran side by side
    texts = [expected(reference, b["prompt"], b["max_tokens"]) for b in [plain, *drafting]]
    assert [(status, text) for status, text, _ in answers] == [(200, t) for t in texts]
    assert not logged_errors(caplog)


def test_drafting_requests_that_arrive_while_others_run_share_one_packed_round(reference, caplog):
    """A plain request holds the worker; four drafting requests (the draft model, chains: K 4 greedy
    streamed, K 3 sampled with a seed, K "auto" greedy, K 2 greedy streamed) arrive meanwhile and run in
    ONE ContinuousSpeculativeBatch: its rounds hold 3-4 of them at once (max_batch 4 with the plain
    one), each text equals its solo run (greedy: generate; seeded K 3: speculative_generate with that
    seed), and each reply's statistics say the job was batched, with its rounds by K."""
    engine = batching_engine()
    held = HeldSteps(engine)
    drafting_batch, sizes = engine._drafting[DRAFT], []
    step = drafting_batch.step
    drafting_batch.step = lambda: sizes.append(len(drafting_batch)) or step()
    plain = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "speculative": False}
    bodies = [{"prompt": PROMPTS[1], "max_tokens": 40, "temperature": 0, "K": 4},
              {"prompt": PROMPTS[2], "max_tokens": 30, "temperature": 0.8, "seed": 5, "K": 3},
              {"prompt": PROMPTS[3], "max_tokens": 35, "temperature": 0, "K": "auto"},
              {"prompt": PROMPTS[4], "max_tokens": 25, "temperature": 0, "K": 2}]
    target, drafter = reference, gpt2np.load_drafter(DRAFT)
    ids = target.tokenizer.encode(PROMPTS[2])
    sampled = gpt2np.speculative_generate(target, drafter, ids, 30, K=3, temperature=0.8, rng=np.random.default_rng(5))
    texts = [expected(target, b["prompt"], b["max_tokens"]) for b in bodies]
    texts[1] = target.tokenizer.decode([t for t in sampled.tokens if t != target.eot_id])
    with running_server(engine) as url, ThreadPoolExecutor(5) as pool:
        first = pool.submit(complete, url, plain, False)
        assert wait_until(lambda: len(held.seen) == 1)  # the plain one holds the worker: the others queue
        sent = [pool.submit(requests.post, url + "/v1/completions", json={**b, "model": TARGET}, timeout=120)
                for b in bodies]
        assert wait_until(lambda: engine.queued == 4)
        held.free()
        replies = [f.result(timeout=120) for f in sent]
        assert first.result(timeout=60)[:2] == (200, expected(target, plain["prompt"], 12))
    assert [r.status_code for r in replies] == [200] * 4, [r.text[:200] for r in replies]
    got = [r.json()["choices"][0]["text"] for r in replies]
    wrong = [(i, g, t) for i, (g, t) in enumerate(zip(got, texts)) if g != t]
    assert not wrong, f"{len(wrong)} of 4 drafting answers differ from their solo runs, e.g. {wrong[0]}"
    assert max(sizes, default=0) >= 3, f"the drafting jobs never shared a round: batch sizes {sizes}"
    for body, reply in zip(bodies, replies):
        stats = reply.json()["gpt2np"]["stats"]
        assert stats["batched"] and stats["drafter"] == DRAFT and stats["rounds"] == len(reply.json()["gpt2np"]["rounds"])
        assert sum(stats["K_counts"].values()) == stats["rounds"], stats
        if body["K"] != "auto":  # the K asked for, clamped to the tokens still wanted minus one (SpeculativeStats)
            before = [0] + [r["n_emitted"] for r in reply.json()["gpt2np"]["rounds"][:-1]]
            clamped = [min(body["K"], body["max_tokens"] - n - 1) for n in before]
            assert stats["K_counts"] == {str(k): clamped.count(k) for k in sorted(set(clamped))}, stats
        assert stats["tokens_per_target_call"] >= 1 and stats["c"] is None, stats
    assert not logged_errors(caplog)


def solo_text(target, body):  # -> the text of body's request alone (greedy: generate's; seeded: speculative_generate's)
    if body["temperature"] == 0:
        return expected(target, body["prompt"], body["max_tokens"])
    drafter = gpt2np.NgramDrafter() if body["drafter"] == "ngram" else gpt2np.load_drafter(DRAFT)
    run = gpt2np.speculative_generate(target, drafter, target.tokenizer.encode(body["prompt"]), body["max_tokens"],
                                      K=body["K"], temperature=body["temperature"],
                                      rng=np.random.default_rng(body["seed"]))
    return target.tokenizer.decode([t for t in run.tokens if t != target.eot_id])


def alone_then_others(engine, gate, reference, first, others):
    """`first` reaches the idle server (its own stream, its first round held at `gate`: slow_down's) and `others`
    queue behind it in their order (each sent once the one before is queued: the order they are admitted in);
    -> the replies, each checked 200 and equal to its request's solo run (solo_text)."""
    post = lambda b: requests.post(url + "/v1/completions", json={**b, "model": TARGET}, timeout=120)  # noqa: E731
    with running_server(engine) as url, ThreadPoolExecutor(1 + len(others)) as pool:
        sent = [pool.submit(post, first)]
        assert wait_until(lambda: engine.active == 1)
        for n, body in enumerate(others, 1):
            sent.append(pool.submit(post, body))
            assert wait_until(lambda n=n: engine.queued == n)
        gate.set()
        replies = [f.result(timeout=120) for f in sent]
    assert [r.status_code for r in replies] == [200] * len(replies), [r.text[:200] for r in replies]
    got, want = [r.json()["choices"][0]["text"] for r in replies], [solo_text(reference, b) for b in (first, *others)]
    assert got == want, f"answers differ from their solo runs: {[(g, w) for g, w in zip(got, want) if g != w]}"
    return replies


@pytest.mark.parametrize("drafter, K, temperature, seed", [(DRAFT, 3, 0.8, 5), ("ngram", 2, 0.9, 7),
                                                           (DRAFT, "auto", 0, None), (DRAFT, "heuristic", 0.8, 5),
                                                           ("ngram", "heuristic", 0.9, 7)])
def test_a_drafting_request_that_started_alone_joins_the_batch_when_another_comes(reference, caplog, drafter, K,
                                                                                   temperature, seed):
    """A drafting request that finds the server idle runs as its own stream. Once another drafts with its
    drafter it joins their packed batch (before, it ran its own target pass beside the batch's every step
    to its end) and goes on from the tokens it has with its own generator: its text is still its solo
    run's (a seeded fixed K, or "heuristic" with the schedule its rounds left it at: the same draws; before,
    a "heuristic" one kept its stream), and its rounds count on from its first."""
    engine = batching_engine()
    gate = threading.Event()
    slow_down(engine, gate=gate)  # its first round waits until the other request is queued
    batch, sizes = engine._drafting[DRAFT], []  # prompt lookup with a K of its own rides in the draft model's batch
    step = batch.step
    batch.step = lambda: sizes.append(len(batch)) or step()
    first = {"prompt": PROMPTS[1], "max_tokens": 40, "temperature": temperature, "seed": seed, "K": K,
             "drafter": drafter}
    other = {"prompt": PROMPTS[2], "max_tokens": 30, "temperature": 0, "K": 2, "drafter": drafter}
    replies = alone_then_others(engine, gate, reference, first, [other])
    assert 2 in sizes, f"the request that started alone never joined the batch: its sizes were {sizes}"
    reply = replies[0].json()["gpt2np"]
    emitted = [r["n_emitted"] for r in reply["rounds"]]
    assert emitted == sorted(set(emitted)) and emitted[-1] == len(reply["tokens"]) == 40, emitted
    assert reply["stats"]["batched"] and reply["stats"]["rounds"] == len(emitted), reply["stats"]
    if isinstance(K, int):  # K_counts: each round's K clamped to the tokens it still wanted - 1
        clamped = [min(K, 40 - n - 1) for n in [0] + emitted[:-1]]
        assert reply["stats"]["K_counts"] == {str(k): clamped.count(k) for k in sorted(set(clamped))}, reply["stats"]
    assert not logged_errors(caplog)


def test_plain_requests_ride_in_the_drafting_batch_one_target_pass_a_step(reference, caplog):
    """A plain request running in the plain batch moves into the drafting batch when a drafting request comes
    (a sequence with K = 0 there, going on from its tokens with its own generator), and a plain request that
    arrives while drafting ones run joins them: no step runs the plain batch's target pass beside the
    drafting batch's, and every text is its request's alone (the seeded plain one: the same draws)."""
    engine = batching_engine()
    held = HeldSteps(engine)
    passes = []  # (the engine step it ran in, which batch)
    for name, batch in (("plain", engine._batch), ("drafting", engine._drafting[DRAFT])):
        step = batch.step
        batch.step = lambda name=name, step=step: passes.append((len(held.seen), name)) or step()
    first = {"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0.9, "seed": 11, "speculative": False}
    drafting = {"prompt": PROMPTS[1], "max_tokens": 30, "temperature": 0, "K": 3}
    later = {"prompt": PROMPTS[2], "max_tokens": 20, "temperature": 0, "speculative": False}
    post = lambda b: requests.post(url + "/v1/completions", json={**b, "model": TARGET}, timeout=120)  # noqa: E731
    with running_server(engine) as url, ThreadPoolExecutor(3) as pool:
        sent = [pool.submit(post, first)]
        assert wait_until(lambda: len(held.seen) == 1)  # the plain one alone, in the plain batch, held
        held.allow(3)
        assert wait_until(lambda: len(held.seen) == 4)
        sent.append(pool.submit(post, drafting))
        assert wait_until(lambda: engine.queued == 1)
        held.allow(3)
        assert wait_until(lambda: len(held.seen) == 7)
        sent.append(pool.submit(post, later))
        assert wait_until(lambda: engine.queued == 1)
        held.free()
        replies = [f.result(timeout=120) for f in sent]
    assert [r.status_code for r in replies] == [200] * 3, [r.text[:200] for r in replies]
    got = [r.json()["choices"][0]["text"] for r in replies]
    want = [expected(reference, b["prompt"], b["max_tokens"], b["temperature"], b.get("seed"))
            for b in (first, drafting, later)]
    assert got == want, f"answers differ from their requests alone: {[(g, w) for g, w in zip(got, want) if g != w]}"
    both = sorted({step for step, name in passes if name == "plain"} & {step for step, name in passes
                                                                          if name == "drafting"})
    assert not both, f"{len(both)} steps ran the plain batch's pass beside the drafting batch's, from step {both[0]}"
    assert ("plain", "drafting") == tuple(dict.fromkeys(name for _, name in passes)), passes
    emitted = [r["n_emitted"] for r in replies[0].json()["gpt2np"]["rounds"]]
    assert emitted == list(range(1, 41)), emitted  # its rounds count on across the move
    assert not logged_errors(caplog)


def test_long_prompts_ride_in_the_drafting_batch_a_chunk_a_step(reference, caplog, monkeypatch):
    """With --prefill_chunk 8, a drafting request that started alone (its prompt already past 8 tokens) keeps its
    own stream when another comes (joining, it would draw nothing for the steps its chunks take); a drafting and a
    plain request with prompts past 8 that arrive meanwhile ride in the drafting batch, each fed 8 prompt rows a
    step in the target's one pass (before, the drafting one fed its whole prompt in one round and the plain one
    took a pass of its own in the plain batch). Each text as alone."""
    from gpt2np.decoding import batched_speculative
    engine = batching_engine(prefill_chunk=8)
    gate = threading.Event()
    slow_down(engine, gate=gate)
    passes, rows, packed = [], [], batched_speculative.forward_packed
    for name, batch in (("plain", engine._batch), ("drafting", engine._drafting[DRAFT])):
        step = batch.step
        batch.step = lambda name=name, step=step, batch=batch: passes.append((name, len(batch))) or step()
    monkeypatch.setattr(batched_speculative, "forward_packed", lambda model, calls, n: (
        model is engine.target and rows.append([len(ids) for ids, _ in calls])) or packed(model, calls, n))
    bodies = [{"prompt": PROMPTS[1], "max_tokens": 30, "temperature": 0, "K": 3},
              {"prompt": PROMPTS[2], "max_tokens": 20, "temperature": 0, "K": 2},
              {"prompt": PROMPTS[3], "max_tokens": 20, "temperature": 0, "speculative": False}]
    n_prompt = [len(reference.tokenizer.encode(b["prompt"])) for b in bodies]
    assert min(n_prompt) > 8, n_prompt
    replies = alone_then_others(engine, gate, reference, bodies[0], bodies[1:])
    assert {name for name, _ in passes} == {"drafting"} and max(size for _, size in passes) == 2, passes
    assert not replies[0].json()["gpt2np"]["stats"].get("batched"), replies[0].json()["gpt2np"]["stats"]
    assert all(max(call) <= 8 + 2 for call in rows), rows[:12]  # a chunk, or its last rows and 2 drafts
    assert any(call.count(8) == 2 for call in rows), rows  # both newcomers fed a chunk in one pass
    assert not logged_errors(caplog)


def test_heuristic_requests_that_arrive_while_others_run_are_packed_each_as_alone(reference, caplog):
    """K "heuristic" requests (the draft model sampled with a seed, prompt lookup greedy) that arrive while a plain
    one holds the worker join the draft model's packed batch (the lookup one drafting by its own lookup there),
    each with its own schedule: each text is its solo run's (speculative_generate with K "heuristic" and the
    seed), its rounds' K moves, and it reports batched. Before, each ran as its own stream beside the passes."""
    engine = batching_engine()
    held = HeldSteps(engine)
    sizes = {DRAFT: [], "ngram": []}
    for name, batch in engine._drafting.items():
        step = batch.step
        batch.step = lambda name=name, step=step, batch=batch: sizes[name].append(len(batch)) or step()
    plain = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0, "speculative": False}
    bodies = [{"prompt": PROMPTS[1], "max_tokens": 40, "temperature": 0.8, "seed": 3, "K": "heuristic",
               "drafter": DRAFT},
              {"prompt": PROMPTS[2] * 3, "max_tokens": 40, "temperature": 0, "K": "heuristic", "drafter": "ngram"},
              {"prompt": PROMPTS[3], "max_tokens": 30, "temperature": 0, "K": 2, "drafter": DRAFT}]
    post = lambda b: requests.post(url + "/v1/completions", json={**b, "model": TARGET}, timeout=120)  # noqa: E731
    with running_server(engine) as url, ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, plain)
        assert wait_until(lambda: len(held.seen) == 1)  # the plain one holds the worker: the others queue
        sent = [pool.submit(post, b) for b in bodies]
        assert wait_until(lambda: engine.queued == 3)
        held.free()
        replies = [f.result(timeout=120) for f in [first, *sent]]
    assert [r.status_code for r in replies] == [200] * 4, [r.text[:200] for r in replies]
    got = [r.json()["choices"][0]["text"] for r in replies[1:]]
    want = [solo_text(reference, b) for b in bodies]
    assert got == want, f"answers differ from their solo runs: {[(g, w) for g, w in zip(got, want) if g != w]}"
    # packed, not streams of their own: the draft model's batch held all three (the lookup one riding there with
    # its own lookup) and the plain rider; the lookup's own batch never ran a pass
    assert max(sizes[DRAFT], default=0) == 4 and sizes["ngram"] == [], sizes
    for body, reply in zip(bodies[:2], replies[1:3]):
        stats, rounds = reply.json()["gpt2np"]["stats"], reply.json()["gpt2np"]["rounds"]
        assert stats["batched"] and stats["rounds"] == len(rounds), stats
        assert len({r["K"] for r in rounds}) >= 2, f"{body['drafter']}: the schedule's K never moved: {rounds}"
    assert not logged_errors(caplog)


def test_a_long_prompt_is_fed_in_chunks_beside_a_running_request(reference, monkeypatch):
    from gpt2np.decoding import batched
    rows, packed = [], batched.forward_packed
    monkeypatch.setattr(batched, "forward_packed", lambda model, calls: rows.append([len(i) for i, _ in calls])
                        or packed(model, calls))
    engine = batching_engine(prefill_chunk=16)
    held = HeldSteps(engine)
    running = {"prompt": "ROMEO:\n", "max_tokens": 60, "temperature": 0, "speculative": False}
    long = {"prompt": "First Citizen:\nBefore we proceed any further, hear me speak. " * 3, "max_tokens": 20,
            "temperature": 0, "speculative": False}
    n_long = len(reference.tokenizer.encode(long["prompt"]))
    with running_server(engine) as url, ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(complete, url, running, True)]
        assert wait_until(lambda: len(held.seen) == 1)
        sent.append(pool.submit(complete, url, long, False))
        assert wait_until(lambda: engine.queued == 1)
        held.free()
        answers = [f.result(timeout=60) for f in sent]
    texts = [expected(reference, b["prompt"], b["max_tokens"]) for b in (running, long)]
    assert [text for _, text, _ in answers] == texts
    chunks = [call[1] for call in rows if len(call) == 2 and call[1] > 1]  # the long prompt's rows beside the other's 1
    assert sum(chunks) == n_long and max(chunks) == 16 and len(chunks) == -(-n_long // 16), (n_long, rows[:12])


def test_a_failing_packed_step_answers_500_and_the_server_goes_on(reference, caplog):
    engine = batching_engine()

    def broken():
        raise RuntimeError("a bug in the packed step")
    engine._batch.step = broken  # the worker replaces its batch after a failure
    body = {"prompt": "KING:", "max_tokens": 12, "temperature": 0, "speculative": False}
    with running_server(engine) as url:
        status, error, _ = complete(url, body, False)
        assert status == 500 and error["error"]["type"] == "server_error" and "Traceback" not in str(error)
        assert complete(url, body, True)[:2] == (200, expected(reference, "KING:", 12))
        health = requests.get(url + "/health", timeout=10).json()
        assert health["status"] == "ok"
        assert (health["served"], health["cancelled"], health["failed"]) == (1, 0, 1), health
    assert any("generation failed" in m for m in logged_errors(caplog))


def test_max_batch_one_serves_one_at_a_time_with_the_same_text(reference):
    engine = batching_engine(max_batch=1)
    held = HeldSteps(engine)
    held.free()
    bodies = [{"prompt": p, "max_tokens": 15, "temperature": 0, "speculative": False} for p in PROMPTS[:4]]
    with running_server(engine) as url, ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda b: complete(url, b, False), bodies))
    assert [text for _, text, _ in answers] == [expected(reference, b["prompt"], 15) for b in bodies]
    assert max(active for _, active in held.seen) == 1 and max(size for size, _ in held.seen) == 1


@pytest.mark.parametrize("flags", [["--max_batch", "0"], ["--prefill_chunk", "-1"], ["--max_batch", "many"]])
def test_bad_batch_flags_are_one_line_errors(flags):
    bad = subprocess.run([sys.executable, "-m", "gpt2np.serve", *flags], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert flags[0] in bad.stderr and "Traceback" not in bad.stderr


def test_a_target_without_a_tokenizer_is_refused_at_start(tmp_path, no_random_init):
    """random:124M with no GPT-2 BPE files in --models_dir: the server speaks text, so it says so at
    start (it used to answer every request 500), and before building the weights (random:1558M's take
    about 30 s): load_engine, which main runs before serving, in this process with the init refused; then
    the real command's one line and status 2."""
    from gpt2np.serve.__main__ import load_engine, parse_args
    with pytest.raises(ValueError) as refused:
        load_engine(parse_args(["--target_model_size", "random:124M", "--models_dir", str(tmp_path)]))
    said = str(refused.value)
    assert said.startswith("--target_model_size random:124M has no tokenizer and the server answers in "
                           "text") and "--models_dir" in said, said
    bad = subprocess.run([sys.executable, "-m", "gpt2np.serve", "--target_model_size", "random:124M",
                          "--models_dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr == f"error: {said}\n", bad.stderr

def test_a_random_draft_of_another_vocabulary_is_refused_before_its_init(no_random_init):
    """The server's --draft_model_size random:1558M beside the bundled target: refused before the draft's
    weights are built (about 30 s), the flag named."""
    from gpt2np.serve.__main__ import load_engine, parse_args
    with pytest.raises(ValueError) as refused:
        load_engine(parse_args(["--draft_model_size", "random:1558M"]))
    assert str(refused.value) == "--draft_model_size random:1558M: draft and target must share a vocabulary: n_vocab 50257 vs 257 (draft vs target)", refused.value


@pytest.mark.parametrize("max_batch, told, order", [(8, "row-major", "row-major"), (8, "panels", "panels"),
                                                     (1, "row-major", "as loaded")])
def test_a_batching_server_gives_its_models_the_batch_order(monkeypatch, bpe_dir, max_batch, told, order):
    """--max_batch above 1: the target (and a draft model) take the order matmul.BATCH_LAYOUT names for
    this kernel (here the running kernel is told `told`); one at a time, the weights stay as loaded
    (matmul.LOADED_LAYOUT: panels under SkylakeX, column-major as stored elsewhere). The models are
    random ones of 124M's shape cut to one block: every weight as large as 124M's (so kept column-major,
    matmul.COLUMN_MAJOR_MIN) and n_embd 768 (so cut into panels); the order never depends on the depth."""
    from dataclasses import replace
    from gpt2np.checkpoints import loading
    from gpt2np.model.config import PRESETS
    from gpt2np.model.fast import layout
    from gpt2np.model.fast import matmul
    from gpt2np.serve.__main__ import load_engine, parse_args
    monkeypatch.setattr(matmul, "BATCH_LAYOUT", {matmul.KERNEL: told})
    if matmul.BLAS is None:
        pytest.skip("no OpenBLAS: no kernel table, the weights stay as stored")
    monkeypatch.setitem(loading.RANDOM_SHAPES, "124M-one-block", replace(PRESETS["124M"], n_layer=1))
    engine = load_engine(parse_args(["--target_model_size", "random:124M-one-block", "--draft_model_size",
                                     "random:124M-one-block", "--models_dir", str(bpe_dir.parent),
                                     "--max_batch", str(max_batch)]))
    drafter = next(d for d in engine.drafters.values() if isinstance(d, gpt2np.ModelDrafter))
    order = matmul.loaded_layout() if order == "as loaded" else order
    assert layout.weights_order(engine.target) == order and layout.weights_order(drafter.model) == order
