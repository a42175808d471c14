"""Several prompts in one request (OpenAI's `prompt: [...]`, as lm-evaluation-harness and other batching clients
send them): one choice per prompt, choices[i] continuing prompt i exactly as the same request with that prompt
alone, the prompts run side by side in the server's packed batch, and refused or busy as one request.

A real uvicorn server on 127.0.0.1 (tests/serve_helpers.py), reached with requests and the official openai
package; the expected texts come from gpt2np.generate on separately loaded models, or from the same server
asked one prompt at a time. HeldSteps (test_serve_batching.py) records the packed batch at every step.
"""
import json
import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
openai = pytest.importorskip("openai", reason="the client tests need the openai package (requirements-dev.txt)")
import requests  # noqa: E402

import gpt2np  # noqa: E402
from serve_helpers import TARGET, running_server  # noqa: E402
from test_serve_batching import DRAFT, PROMPTS, HeldSteps, batching_engine, expected, logged_errors  # noqa: E402
from test_serve_load import complete, wait_until  # noqa: E402


@pytest.fixture(scope="module")
def reference():
    return gpt2np.load_model(TARGET)


def client_of(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(url, **body):
    answer = requests.post(url + "/v1/completions", json={"model": TARGET, **body}, timeout=120)
    return answer.status_code, answer.json()


def streamed(url, **body):
    """A streamed request's events over HTTP -> ({index: text}, {index: [finish_reason of each event]}, events)."""
    answer = requests.post(url + "/v1/completions", json={"model": TARGET, "stream": True, **body}, stream=True,
                           timeout=120)
    assert answer.status_code == 200, answer.text
    texts, reasons, events = defaultdict(str), defaultdict(list), []
    said = [line for line in answer.iter_lines(decode_unicode=True) if line]
    for line in said[:-1]:
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
            for choice in events[-1]["choices"]:
                texts[choice["index"]] += choice["text"]
                reasons[choice["index"]].append(choice["finish_reason"])
    assert said[-1] == "data: [DONE]", f"the stream ended with {said[-1]!r}"
    return dict(texts), dict(reasons), events


def test_several_prompts_are_one_choice_each_in_order_as_alone_in_one_packed_step(reference, caplog):
    """Four prompts (strings and token ids) in one request through the openai client: four choices, index
    0..3, each the greedy text generate gives its prompt alone; usage summed; gpt2np's object a list, one per
    choice; the four were admitted at one step boundary (the first packed step holds all four)."""
    engine = batching_engine(max_batch=4)
    held = HeldSteps(engine)
    held.free()
    prompts = PROMPTS[:3] + [reference.tokenizer.encode(PROMPTS[3])]
    with running_server(engine) as url:
        answer = client_of(url).completions.create(model=TARGET, prompt=prompts, max_tokens=9, temperature=0,
                                                   extra_body={"speculative": False})
    texts = [expected(reference, p, 9) for p in PROMPTS[:4]]
    assert [c.index for c in answer.choices] == [0, 1, 2, 3], answer.choices
    assert [c.text for c in answer.choices] == texts, [(c.text, t) for c, t in zip(answer.choices, texts)]
    own = answer.model_extra["gpt2np"]
    assert isinstance(own, list) and len(own) == 4, own
    n_tokens = [len(o["tokens"]) for o in own]
    assert answer.usage.completion_tokens == sum(n_tokens) and set(n_tokens) <= set(range(1, 10)), n_tokens
    assert answer.usage.prompt_tokens == sum(len(reference.tokenizer.encode(p)) for p in PROMPTS[:4]), answer.usage
    assert held.seen[0] == (4, 4), f"the four did not start in one packed step: {held.seen[:3]}"
    assert not logged_errors(caplog)


def test_more_prompts_than_free_slots_wait_their_turn_and_stay_exact(reference):
    """max_batch 2, three prompts: two start, the third waits (/health: 2 active, 1 queued) and joins when a
    slot frees, each text still as alone; the engine's counts go back to nothing."""
    engine = batching_engine(max_batch=2)
    held = HeldSteps(engine)
    lengths = {"max_tokens": 6, "temperature": 0, "speculative": False}
    with running_server(engine) as url, ThreadPoolExecutor(1) as pool:
        sent = pool.submit(post, url, prompt=PROMPTS[4:7], **lengths)
        assert wait_until(lambda: held.seen and engine.active + engine.queued == 3), "the 3 prompts did not arrive"
        health = requests.get(url + "/health", timeout=10).json()
        held.free()
        status, body = sent.result(timeout=60)
        after = requests.get(url + "/health", timeout=10).json()
    assert (health["active"], health["queued"]) == (2, 1), health
    assert status == 200 and [c["text"] for c in body["choices"]] == [expected(reference, p, 6) for p in PROMPTS[4:7]]
    assert (after["active"], after["queued"], after["served"]) == (0, 0, 3), after
    assert (engine._taken, engine.queued) == (0, 0)


def test_sampled_prompts_are_each_the_request_alone_with_its_seed():
    """temperature 0.9 and a seed: choice i equals the same request with prompt i alone (the seed seeds each
    prompt's draws, so one prompt twice gives one text twice); without a seed each prompt gets its own, reported
    in its gpt2np object, and the texts of a prompt twice differ."""
    engine = batching_engine(max_batch=4)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
    sampling = {"max_tokens": 12, "temperature": 0.9}
    with running_server(engine) as url:
        status, together = post(url, prompt=prompts, seed=11, **sampling)
        alone = [post(url, prompt=p, seed=11, **sampling)[1]["choices"][0]["text"] for p in prompts[:2]]
        _, unseeded = post(url, prompt=[PROMPTS[0]] * 3, max_tokens=24, temperature=1.0)
    assert status == 200 and [c["text"] for c in together["choices"]] == alone + alone[:1], (together, alone)
    assert [o["seed"] for o in together["gpt2np"]] == [11] * 3
    seeds = [o["seed"] for o in unseeded["gpt2np"]]
    assert len(set(seeds)) == 3, seeds
    assert len({c["text"] for c in unseeded["choices"]}) > 1, "three unseeded samples of 24 tokens were equal"


def test_a_stream_of_several_prompts_tells_them_apart_by_index(reference):
    """stream true (requests, and the openai client with include_usage): each prompt's events carry its index,
    its text joins to the non-streamed text, exactly its last event has a finish_reason; the include_usage
    event sums every prompt's usage. Drafting prompts (the bundled draft, K 2) too: greedy, the same text."""
    engine = batching_engine(max_batch=4)
    prompts = PROMPTS[:3]
    with running_server(engine) as url:
        _, whole = post(url, prompt=prompts, max_tokens=10, temperature=0)
        for drafting in ({"speculative": False}, {"K": 2}):
            texts, reasons, _ = streamed(url, prompt=prompts, max_tokens=10, temperature=0, **drafting)
            assert texts == {i: c["text"] for i, c in enumerate(whole["choices"])}, (drafting, texts)
            assert all(r[-1] is not None and r[:-1] == [None] * (len(r) - 1) for r in reasons.values()), reasons
        chunks = list(client_of(url).completions.create(model=TARGET, prompt=prompts, max_tokens=10, temperature=0,
                                                        stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump(exclude_none=True) == whole["usage"], (chunks[-1], whole["usage"])
    assert whole["choices"][0]["text"] == expected(reference, prompts[0], 10)


def test_a_stop_string_ends_its_own_prompt_only(reference):
    """A stop string met early in one prompt's text ends that choice ("stop", the text before it), while the
    others run to max_tokens, streamed or not; each choice equals its prompt's request alone."""
    n = 20
    texts = [expected(reference, p, n) for p in PROMPTS[:3]]
    stop = next(texts[0][i:i + 3] for i in range(2, n) if all(texts[0][i:i + 3] not in t for t in texts[1:]))
    engine = batching_engine(max_batch=4)
    with running_server(engine) as url:
        alone = [post(url, prompt=p, max_tokens=n, temperature=0, stop=stop)[1]["choices"][0] for p in PROMPTS[:3]]
        status, together = post(url, prompt=PROMPTS[:3], max_tokens=n, temperature=0, stop=stop)
        streamed_texts, reasons, _ = streamed(url, prompt=PROMPTS[:3], max_tokens=n, temperature=0, stop=stop)
    assert alone[0]["finish_reason"] == "stop" and alone[0]["text"] == texts[0][:texts[0].index(stop)], alone[0]
    assert status == 200 and together["choices"] == [{**c, "index": i} for i, c in enumerate(alone)], together
    assert streamed_texts == {i: c["text"] for i, c in enumerate(alone)}
    assert [r[-1] for _, r in sorted(reasons.items())] == [c["finish_reason"] for c in alone], reasons


def test_a_fault_in_one_prompt_is_named_by_its_index_and_nothing_runs(reference):
    """A token id out of the vocabulary in prompt[1], a prompt too long for max_tokens in prompt[2], more prompts
    than the server takes at once: each a 400 that says which, and no prompt of the request is queued."""
    engine = batching_engine(max_batch=2, max_queue=2)
    too_long = "ROMEO: " * 34  # 238 tokens (bytes): room for 18
    with running_server(engine) as url:
        answers = [post(url, prompt=["ROMEO:", [1, 9999]], max_tokens=5),
                   post(url, prompt=["ROMEO:", "JULIET:", too_long], max_tokens=30),
                   post(url, prompt=["ROMEO:"] * 5, max_tokens=5)]
        health = requests.get(url + "/health", timeout=10).json()
    room = reference.n_ctx - len(reference.tokenizer.encode(too_long))
    said = [(status, body["error"]["param"], body["error"]["message"]) for status, body in answers]
    assert said == [
        (400, "prompt", "prompt[1]: token ids must be in [0, 257)"),
        (400, "max_tokens", f"prompt[2]: prompt ({len(reference.tokenizer.encode(too_long))} tokens) + max_tokens "
                            f"(30) exceeds the context of 256 tokens: ask for at most {room}"),
        (400, "prompt", "prompt: 5 prompts, more generations than this server takes at once (4: --max_batch 2 + --max_queue 2): "
                        "send at most 4 generations (prompts x n) a request")], said
    assert (health["active"], health["queued"], health["served"], engine._taken) == (0, 0, 0, 0), health


def test_a_busy_server_refuses_the_whole_request_or_takes_it_whole(reference):
    """max_batch 1, max_queue 2, one request running (its step held): three prompts would need three places
    and two are free: 429, none of them queued; two prompts fit, wait, and are answered."""
    engine = batching_engine(max_batch=1, max_queue=2)
    held = HeldSteps(engine)
    body = {"max_tokens": 4, "temperature": 0, "speculative": False}
    with running_server(engine) as url, ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, url, prompt=PROMPTS[0], **body)
        assert wait_until(lambda: len(held.seen) == 1)
        status, refused = post(url, prompt=PROMPTS[1:4], **body)
        queued_after_refusal = engine.queued
        second = pool.submit(post, url, prompt=PROMPTS[1:3], **body)
        assert wait_until(lambda: engine.queued == 2)
        held.free()
        answers = [first.result(timeout=60), second.result(timeout=60)]
    assert (status, refused["error"]["code"], queued_after_refusal) == (429, "queue_full", 0), refused
    assert [c["text"] for c in answers[1][1]["choices"]] == [expected(reference, p, 4) for p in PROMPTS[1:3]]


def test_a_client_leaving_a_stream_of_several_prompts_stops_them_all():
    """A client that reads one event of a three-prompt stream and leaves: the worker stops all three (counted
    as cancelled), and the server serves the next request."""
    engine = batching_engine(max_batch=4)
    held = HeldSteps(engine)
    with running_server(engine) as url:
        answer = requests.post(url + "/v1/completions", json={"model": TARGET, "prompt": PROMPTS[:3], "stream": True,
                                                              "max_tokens": 200, "temperature": 0,
                                                              "speculative": False},
                               stream=True, timeout=60)
        held.allow(2)
        lines = answer.iter_lines(decode_unicode=True)
        assert next(line for line in lines if line.startswith("data: "))
        answer.close()
        held.free()
        assert wait_until(lambda: engine.cancelled == 3 and engine.active == 0), (engine.cancelled, engine.active)
        assert complete(url, {"prompt": "KING:", "max_tokens": 3, "temperature": 0, "speculative": False}, stream=False)[0] == 200
    assert engine.served == 1 and engine._taken == 0


def test_the_log_line_of_several_prompts_sums_them(caplog):
    """--log_requests: a request of three prompts is one line, "3 prompts:", the tokens summed, each prompt's
    ending in order."""
    caplog.set_level(logging.INFO, logger="gpt2np.serve.requests")
    engine = batching_engine(max_batch=4)
    with running_server(engine, log_requests=True) as url:
        status, body = post(url, prompt=PROMPTS[:3], max_tokens=5, temperature=0, speculative=False)
        assert wait_until(lambda: any("/v1/completions" in r.getMessage() for r in caplog.records))
    said = [r.getMessage() for r in caplog.records if r.name == "gpt2np.serve.requests"][-1]
    usage, reasons = body["usage"], ", ".join(c["finish_reason"] for c in body["choices"])
    assert status == 200 and said.endswith(
        f"200 {said.split(' 200 ')[1].split(' s:')[0]} s: 3 prompts: {usage['prompt_tokens']} prompt + "
        f"{usage['completion_tokens']} completion tokens ({reasons}), target only"), said


def test_n_choices_of_a_prompt_are_each_the_request_alone_with_seed_plus_j(reference):
    """n 3 of two prompts (the openai client's n): six choices in OpenAI's order, choice 3i + j prompt i's j-th,
    each the same request alone with prompt i and seed + j; greedy, n equal texts; a request whose prompts x n
    pass what the server takes at once is a 400 naming n."""
    engine = batching_engine(max_batch=4, max_queue=4)
    sampling = {"max_tokens": 10, "temperature": 0.9}
    with running_server(engine) as url:
        client = client_of(url)
        answer = client.completions.create(model=TARGET, prompt=PROMPTS[:2], n=3, seed=5, **sampling)
        alone = [post(url, prompt=p, seed=5 + j, **sampling)[1]["choices"][0]["text"] for p in PROMPTS[:2]
                 for j in range(3)]
        greedy = client.completions.create(model=TARGET, prompt=PROMPTS[2], n=2, max_tokens=8, temperature=0)
        status, refused = post(url, prompt=PROMPTS[:3], n=3, max_tokens=5)
    assert [c.index for c in answer.choices] == list(range(6)), answer.choices
    assert [c.text for c in answer.choices] == alone, [(c.text, t) for c, t in zip(answer.choices, alone)]
    assert len(set(alone)) > 1 and [o["seed"] for o in answer.model_extra["gpt2np"]] == [5, 6, 7] * 2
    assert [c.text for c in greedy.choices] == [expected(reference, PROMPTS[2], 8)] * 2
    assert (status, refused["error"]["param"], refused["error"]["message"]) == (
        400, "n", "n: 3 prompts x n 3, more generations than this server takes at once (8: --max_batch 4 + "
                  "--max_queue 4): send at most 8 generations (prompts x n) a request"), refused


def test_usage_counts_each_prompt_once_whatever_n_and_each_choice_has_its_own(reference, caplog):
    """OpenAI (and vLLM) count a prompt's tokens once, not n times: usage.prompt_tokens of 2 prompts x n 3 was
    6 prompts' worth. Each choice's own usage is in its gpt2np object; streamed, OpenAI's usage is only in the
    include_usage event (it was each choice's in its last event, which a client summing usage counted twice);
    the log line says "2 prompts x n 3"."""
    caplog.set_level(logging.INFO, logger="gpt2np.serve.requests")
    engine = batching_engine(max_batch=4, max_queue=4)
    body = {"prompt": PROMPTS[:2], "n": 3, "max_tokens": 5, "temperature": 0, "speculative": False}
    with running_server(engine, log_requests=True) as url:
        status, whole = post(url, **body)
        _, _, events = streamed(url, **body, stream_options={"include_usage": True})
        assert wait_until(lambda: sum("/v1/completions" in r.getMessage() for r in caplog.records) == 2)
    prompt_tokens = sum(len(reference.tokenizer.encode(p)) for p in PROMPTS[:2])
    assert status == 200 and whole["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 30,
                                                "total_tokens": prompt_tokens + 30}, whole["usage"]
    assert [o["usage"]["prompt_tokens"] for o in whole["gpt2np"]] == \
        [len(reference.tokenizer.encode(p)) for p in PROMPTS[:2] for _ in range(3)], whole["gpt2np"]
    assert [e.get("usage") for e in events[:-1]] == [None] * (len(events) - 1), "usage before the include_usage event"
    assert events[-1]["usage"] == whole["usage"] and events[-1]["choices"] == []
    said = [r.getMessage() for r in caplog.records if r.name == "gpt2np.serve.requests"][0]
    assert f": 2 prompts x n 3: {prompt_tokens} prompt + 30 completion tokens (length" in said, said


def test_a_request_whose_choices_all_stopped_frees_its_room_before_its_answer_arrives(reference):
    """A choice that a stop string ends is stopped by the worker at its next step boundary: its room was freed
    only then, so a client that sent its next request as soon as it had its answer was told "busy" (429) by a
    server with nothing else to do. The room is free once the request has what it asked for."""
    from serve_helpers import slow_down
    texts = [expected(reference, p, 20) for p in PROMPTS[:4]]
    stops = sorted({t[2] for t in texts})  # each choice stops at its third character or before
    engine = batching_engine(max_batch=4, max_queue=1)
    slow_down(engine, delay=0.3)  # the worker is mid-step when the answer goes out
    body = {"prompt": PROMPTS[:4], "max_tokens": 20, "temperature": 0, "speculative": False, "stop": stops}
    with running_server(engine) as url:
        answers = [post(url, **body) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 200], [b.get("error") for _, b in answers]
    assert all(c["finish_reason"] == "stop" for _, b in answers for c in b["choices"]), answers[0][1]["choices"]


def test_faults_of_the_whole_request_are_not_blamed_on_a_prompt():
    """A drafter that is not served is the request's fault, not prompt[0]'s; a token id out of the vocabulary
    is prompt[1]'s, said once ("prompt[1]: token ids ...", not "prompt[1]: prompt: ...")."""
    engine = batching_engine(max_batch=4)
    with running_server(engine) as url:
        drafter = post(url, prompt=["ROMEO:", "JULIET:"], max_tokens=5, drafter="nosuch")
        ids = post(url, prompt=["ROMEO:", [1, 9999]], max_tokens=5)
    assert drafter[0] == 400 and drafter[1]["error"]["message"].startswith("drafter must be one of"), drafter
    assert ids[1]["error"]["message"] == "prompt[1]: token ids must be in [0, 257)", ids


def test_prompt_lookup_requests_run_in_one_packed_batch_each_as_alone(reference):
    """Prompt lookup ("drafter": "ngram") ran as one stream per request, one after the other (only a draft model's
    jobs were packed): they now share the target's pass, each looking up its own context, K fixed or "auto"
    (riding in the draft model's batch, which a server that serves one has; under "auto" the lookups' own policy
    chooses their K there, and the lookup's own batch never runs). Four prompts in one request run in one drafting
    batch of four; greedy, each is the target's own text; sampled with a seed, each is the same request alone
    (which runs as its own stream)."""
    engine = batching_engine(max_batch=4)
    seen, unused = [], []
    for batch, sizes in ((engine._drafting[DRAFT], seen), (engine._drafting["ngram"], unused)):
        step = batch.step
        batch.step = lambda batch=batch, sizes=sizes, step=step: sizes.append(len(batch)) or step()
    prompts = [p + p for p in PROMPTS[:4]]  # each prompt twice: the lookup finds what follows
    body = {"prompt": prompts, "max_tokens": 12, "drafter": "ngram", "K": 3}
    with running_server(engine) as url:
        status, greedy = post(url, temperature=0, **body)
        _, sampled = post(url, temperature=0.9, seed=21, **body)
        _, auto = post(url, temperature=0, **{**body, "K": "auto"})
        alone = [post(url, **{**body, "prompt": p}, temperature=0.9, seed=21)[1]["choices"][0]["text"]
                 for p in prompts]
    assert status == 200 and [c["text"] for c in greedy["choices"]] == [expected(reference, p, 12) for p in prompts]
    assert max(seen) == 4, f"the lookup batch's sizes: {seen}"
    assert any(r["drafts"] for o in greedy["gpt2np"] for r in o["rounds"]), "the lookup never drafted"
    assert [c["text"] for c in sampled["choices"]] == alone
    assert [c["text"] for c in auto["choices"]] == [c["text"] for c in greedy["choices"]], "K auto, packed too"
    assert seen.count(4) >= 2 * 4 and not unused, f"both requests of four ran packed: {seen}, {unused}"


def test_readmes_openai_example_runs_as_written(tmp_path):
    """README's Python example for the server (the openai package: a completion, a stream, a batch of prompts with
    n), run as written against a real server, its address the only change: every line runs, the batch prints its
    four choices."""
    import ast
    import re
    import subprocess
    import sys
    from pathlib import Path
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "from openai import" in block)
    engine = batching_engine(max_batch=4)
    with running_server(engine) as url:
        script = tmp_path / "example.py"
        script.write_text(example.replace("http://127.0.0.1:8000", url), encoding="utf-8")
        ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    last = ran.stdout.strip().splitlines()[-1]
    texts, tokens = last.rsplit(" ", 1)
    assert len(ast.literal_eval(texts)) == 4 and 4 <= int(tokens) <= 80, last  # four texts, at most 4 x 20 tokens


def test_retry_after_counts_the_places_a_refused_request_lacks():
    """A 429's Retry-After was one job's share of the mean job time whatever the request needed; a request of
    several prompts waits for as many places as it lacks (10 s a job, one slot, 2 of 4 places taken: a request of
    4 prompts lacks 2, 20 s; it said 10)."""
    engine = batching_engine(max_batch=1, max_queue=3)
    held = HeldSteps(engine)
    body = {"max_tokens": 4, "temperature": 0, "speculative": False}
    with running_server(engine) as url, ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(post, url, prompt=PROMPTS[0], **body)]
        assert wait_until(lambda: len(held.seen) == 1)
        sent.append(pool.submit(post, url, prompt=PROMPTS[1], **body))
        assert wait_until(lambda: engine.queued == 1)
        engine._seconds_per_job = 10.0
        refused = requests.post(url + "/v1/completions", json={"model": TARGET, "prompt": PROMPTS[:4], **body},
                                timeout=30)
        held.free()
        assert [f.result(timeout=60)[0] for f in sent] == [200, 200]
    assert (refused.status_code, refused.headers.get("Retry-After")) == (429, "20"), refused.text


def test_an_item_of_a_prompt_list_that_is_no_prompt_is_named_by_its_index():
    """["a", []] was told the whole field's help and the list (cut at 60 characters: the item lost in a long list);
    the item at fault is named, as a fault found later (a token id out of the vocabulary) is."""
    engine = batching_engine(max_batch=2)
    with running_server(engine) as url:
        said = {repr(p): post(url, prompt=p, max_tokens=2)[1]["error"]
                for p in (["a", []], ["a"] * 40 + [1], [[1, 2], [3, -1]], ["a", None])}
    assert {k: (v["param"], v["message"]) for k, v in said.items()} == {
        "['a', []]": ("prompt", "prompt[1]: must be a string or a non-empty list of token ids (integers >= 0), got []"),
        repr(["a"] * 40 + [1]): ("prompt", "prompt[40]: must be a string or a non-empty list of token ids (integers "
                                           ">= 0), got 1"),
        "[[1, 2], [3, -1]]": ("prompt", "prompt[1]: must be a string or a non-empty list of token ids (integers >= "
                                        "0), got [3, -1]"),
        "['a', None]": ("prompt", "prompt[1]: must be a string or a non-empty list of token ids (integers >= 0), got "
                                  "null")}, said
