"""gpt2np.serve through real clients: the official openai package, requests, and the command line.

The server (tests/serve_helpers.py) runs the bundled pair on 127.0.0.1; every expected text is
computed here with gpt2np's own decoders on separately loaded copies of the same models, so each
test compares the server against the library, not against a hard-coded string.
"""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
openai = pytest.importorskip("openai", reason="the client tests need the openai package (requirements-dev.txt)")
import requests  # noqa: E402

import gpt2np  # noqa: E402
from serve_helpers import DRAFT, TARGET, bundled_engine, running_server  # noqa: E402
from test_serve_load import wait_until  # noqa: E402

PROMPT = "ROMEO:\nWhat light through yonder window breaks?"


@pytest.fixture(scope="module")
def server():
    engine = bundled_engine()
    with running_server(engine) as url:
        yield url, engine


@pytest.fixture(scope="module")
def local(server):
    """The same models, loaded again for the reference decoders (the server's are its worker's)."""
    return gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def text_of(model, tokens):
    return model.tokenizer.decode([t for t in tokens if t != model.eot_id])


def test_greedy_completion_equals_generate(client, local):
    target, _ = local
    expected = text_of(target, gpt2np.generate(target, target.tokenizer.encode(PROMPT), 60, temperature=0))
    completion = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=60, temperature=0)
    choice = completion.choices[0]
    assert choice.text == expected, f"server {choice.text!r}\n!= generate {expected!r}"
    assert choice.finish_reason == "length" and completion.object == "text_completion"
    assert completion.usage.prompt_tokens == len(target.tokenizer.encode(PROMPT))
    assert completion.usage.completion_tokens == 60
    extra = completion.model_extra["gpt2np"]
    kinds = [t["provenance"] for t in extra["tokens"]]
    assert len(kinds) == 60 and set(kinds) <= {"draft", "resample", "bonus", "target"}, set(kinds)
    # with a fixed K only a last round clamped to one wanted token has no drafts ("target")
    assert "target" not in kinds[:-1], kinds
    assert extra["stats"]["rounds"] == len(extra["rounds"]) and 0 <= extra["stats"]["alpha_hat"] <= 1


def test_streaming_equals_non_streaming(client):
    whole = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=50, temperature=0)
    chunks = list(client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=50, temperature=0, stream=True))
    assert len(chunks) > 2, f"expected one event per round, got {len(chunks)}"
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 50
    streamed = [t["provenance"] for c in chunks[:-1] for t in c.model_extra["gpt2np"]["tokens"]]
    assert len(streamed) + len(chunks[-1].model_extra["gpt2np"].get("tokens", [])) <= 50
    assert chunks[-1].model_extra["gpt2np"]["stats"]["tokens_per_target_call"] > 1


def test_seeded_sampling_reproducible_and_exact(client, local):
    target, drafter = local
    ask = dict(model=TARGET, prompt=PROMPT, max_tokens=40, temperature=0.9, top_p=0.95, seed=7,
               extra_body={"K": 3, "top_k": 40})
    first, again = (client.completions.create(**ask).choices[0].text for _ in range(2))
    assert first == again, "the same seed gave two different samples"
    other = client.completions.create(**{**ask, "seed": 8}).choices[0].text
    assert other != first, "seeds 7 and 8 gave the same 40-token sample"
    ids = target.tokenizer.encode(PROMPT)
    result = gpt2np.speculative_generate(target, drafter, ids, 40, K=3, temperature=0.9, top_k=40, top_p=0.95,
                                         rng=np.random.default_rng(7))
    assert first == text_of(target, result.tokens), "the server's sample differs from speculative_generate's"


def test_target_only_equals_generate_with_the_same_seed(client, local):
    target, _ = local
    completion = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=30, temperature=1.0, seed=3,
                                           extra_body={"speculative": False})
    expected = gpt2np.generate(target, target.tokenizer.encode(PROMPT), 30, temperature=1.0,
                               rng=np.random.default_rng(3))
    assert completion.choices[0].text == text_of(target, expected)
    assert {t["provenance"] for t in completion.model_extra["gpt2np"]["tokens"]} == {"target"}


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text(client, stream):
    greedy = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=80, temperature=0).choices[0].text
    stop = greedy[20:23]  # three characters from the middle: the text must end just before them
    answer = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=80, temperature=0, stop=[stop, "@@"],
                                       stream=stream)
    chunks = list(answer) if stream else [answer]
    text = "".join(c.choices[0].text for c in chunks)
    assert text == greedy[:greedy.index(stop)], f"stop {stop!r}: got {text!r}"
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stop_at", range(6))
def test_stop_text_ignores_what_follows_a_stop_inside_one_round(stop_at):
    """A round emits several tokens; once a stop string appears, the round's later tokens add nothing
    (found when a retrained pair put the stop mid-round: the server sent 'I will not e th')."""
    from gpt2np.serve.completions import StopText
    pieces = list("I will not make")  # one character a token, as with the bundled pair
    full = "".join(pieces)
    stop = full[6 + stop_at:9 + stop_at]
    text = StopText([stop, "@@"])
    sent = "".join(text.add(p) for p in pieces) + text.flush()
    assert text.stopped and sent == full[:full.index(stop)], (stop, sent)


def streamed_or_whole(url, body, stream):
    """One completion -> (usage, the token entries, the stats), from the body or from every event."""
    answer = requests.post(url + "/v1/completions", json={**body, "stream": stream}, stream=stream, timeout=60)
    assert answer.status_code == 200, answer.text
    if not stream:
        extension = answer.json()["gpt2np"]
        return answer.json()["usage"], extension["tokens"], extension["stats"]
    events = [json.loads(line[6:]) for line in answer.iter_lines(decode_unicode=True)
              if line.startswith("data: ") and line != "data: [DONE]"]
    tokens = [t for e in events for t in e["gpt2np"].get("tokens", [])]
    return events[-1]["usage"], tokens, events[-1]["gpt2np"]["stats"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_cuts_tokens_and_usage_alike_in_every_mode(server, local, stream):
    """A speculative round brings several tokens: the tokens (and usage) end at the one whose text completes
    the stop string, as a plain run's do, and the run's statistics are still reported; /health counts
    each run served, none cancelled (its client did not leave)."""
    (url, engine), (target, _) = server, local
    body = {"model": TARGET, "prompt": "ROMEO:", "max_tokens": 16, "temperature": 0, "stop": "wil"}
    # a stopped run is counted when the worker drops it, which may be after its client has its answer:
    # the counts are read once an earlier test's last run has left the worker
    assert wait_until(lambda: not engine.busy and engine.queued == 0)
    before = (engine.served, engine.cancelled)
    modes = [{}, {"speculative": False}, {"tree": [2, 1]}, {"drafter": "ngram"}]
    answers = [streamed_or_whole(url, {**body, **mode}, stream) for mode in modes]
    ids = [[t["id"] for t in tokens] for _, tokens, _ in answers]
    assert all(i == ids[0] for i in ids), ids
    text = target.tokenizer.decode(ids[0])
    assert "wil" in text and "wil" not in target.tokenizer.decode(ids[0][:-1]), text
    assert all(usage["completion_tokens"] == len(ids[0]) for usage, _, _ in answers), answers
    stats = [stats for _, _, stats in answers]
    assert stats[1] is None and all(stats[i] and stats[i]["rounds"] >= 1 for i in (0, 2, 3)), stats
    assert wait_until(lambda: engine.served - before[0] == len(modes)), (engine.served, before)
    assert engine.cancelled == before[1]


def test_token_id_prompt_equals_text_prompt(client, local):
    target, _ = local
    ids = target.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model=TARGET, prompt=ids, max_tokens=20, temperature=0).choices[0].text
    by_text = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=20, temperature=0).choices[0].text
    assert by_ids == by_text


def test_ngram_drafter_and_K_policies_stay_exact_at_temperature_0(client, local):
    target, _ = local
    expected = text_of(target, gpt2np.generate(target, target.tokenizer.encode(PROMPT), 40, temperature=0))
    for extra in ({"drafter": "ngram"}, {"K": "auto"}, {"K": "heuristic", "K_max": 6}):
        completion = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=40, temperature=0,
                                               extra_body=extra)
        assert completion.choices[0].text == expected, f"{extra}: {completion.choices[0].text!r}"
        stats = completion.model_extra["gpt2np"]["stats"]
        assert stats["drafter"].startswith(extra.get("drafter", DRAFT)), stats["drafter"]  # "ngram (n <= 3)"
        assert stats["policy"] == (extra["K"] if "K" in extra else "fixed")


def test_predict_with_requests(server, local):
    url, _ = server
    target, _ = local
    answer = requests.post(url + "/predict", json={"prompt": PROMPT}, timeout=60)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = text_of(target, gpt2np.generate(target, target.tokenizer.encode(PROMPT), 100, temperature=0))
    assert body["text"] == expected  # /predict's defaults: 100 tokens, temperature 0 (as main.py)
    assert len(body["provenance"]) == len(body["tokens"]) == 100
    assert body["stats"]["accepted"] <= body["stats"]["drafted"] and 0 <= body["stats"]["alpha_hat"] <= 1


def test_models_health_docs_and_page(server):
    url, _ = server
    models = requests.get(url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [TARGET]
    assert models["data"][0]["gpt2np"]["drafters"] == [DRAFT, "ngram"]
    health = requests.get(url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # the kernel beside whatever times the server (tools/load_test.py reads it): this process's, threads aside
    assert health.json()["blas"].split(",")[0] == gpt2np.blas_kernel().split(",")[0], health.json()
    assert requests.get(url + "/docs", timeout=10).status_code == 200
    assert "/v1/completions" in requests.get(url + "/openapi.json", timeout=10).json()["paths"]
    page = requests.get(url + "/", timeout=10)
    assert page.status_code == 200 and "accepted draft" in page.text and "://" not in page.text.split("<script>")[1]


def test_client_errors_reach_the_openai_client(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=5, temperature=-1)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=5)


def test_command_line_serves_and_refuses_bad_flags(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = subprocess.run([sys.executable, "-m", "gpt2np.serve", "--target_model_size", str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    process = subprocess.Popen([sys.executable, "-m", "gpt2np.serve", "--port", str(port), "--max_queue", "2"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, health = time.monotonic() + 60, None
        while time.monotonic() < deadline and health is None:
            try:
                health = requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
            except requests.ConnectionError:
                assert process.poll() is None, process.stderr.read()
                time.sleep(0.1)
        assert health and health["model"] == TARGET and health["max_queue"] == 2
        answer = requests.post(f"http://127.0.0.1:{port}/predict", json={"prompt": "KING:", "max_tokens": 5}, timeout=60)
        assert answer.status_code == 200 and json.loads(answer.text)["usage"]["completion_tokens"] == 5
    finally:
        process.terminate()
        process.wait(timeout=30)
