"""Bad requests: every one gets a 4xx JSON error that names the field, never a 500 or a traceback.

One table, sent raw over HTTP (requests), so invalid JSON and oversized bodies reach the server
exactly as a careless client would send them. After the table the server must still be healthy
and still answer a good request correctly.
"""
import json

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

from serve_helpers import TARGET, bundled_engine, running_server  # noqa: E402

MAX_BODY = 64 * 1024
GOOD = {"model": TARGET, "prompt": "KING:", "max_tokens": 8}
GOOD_TEXT = '{"prompt": "KING:", "max_tokens": 8}'


def with_(**fields):
    return json.dumps({**GOOD, **fields})


def without(name):
    return json.dumps({k: v for k, v in GOOD.items() if k != name})


# (case, path, body: str / bytes / a generator (chunked upload), status, field the error must name)
CASES = [
    ("max_tokens a string", "/v1/completions", with_(max_tokens="8"), 400, "max_tokens"),
    ("max_tokens a float", "/v1/completions", with_(max_tokens=8.5), 400, "max_tokens"),
    ("max_tokens a bool", "/v1/completions", with_(max_tokens=True), 400, "max_tokens"),
    ("max_tokens negative", "/v1/completions", with_(max_tokens=-3), 400, "max_tokens"),
    ("max_tokens zero", "/v1/completions", with_(max_tokens=0), 400, "max_tokens"),
    ("max_tokens past the context", "/v1/completions", with_(max_tokens=10_000), 400, "max_tokens"),
    ("prompt + max_tokens past the context", "/v1/completions", with_(prompt="a" * 200, max_tokens=100), 400,
     "max_tokens"),
    ("prompt longer than the context", "/v1/completions", with_(prompt="To be. " * 100), 400, "prompt"),
    ("prompt a number", "/v1/completions", with_(prompt=5), 400, "prompt"),
    ("prompt ids out of the vocabulary", "/v1/completions", with_(prompt=[1, 99_999]), 400, "prompt"),
    ("prompt ids negative", "/v1/completions", with_(prompt=[1, -1]), 400, "prompt"),
    ("prompt ids mixed with text", "/v1/completions", with_(prompt=[1, "a"]), 400, "prompt"),
    ("prompt missing", "/v1/completions", without("prompt"), 400, "prompt"),
    ("temperature < 0", "/v1/completions", with_(temperature=-0.5), 400, "temperature"),
    ("temperature subnormal", "/v1/completions", with_(temperature=5e-324), 400, "temperature"),
    ("temperature a string", "/v1/completions", with_(temperature="hot"), 400, "temperature"),
    ("top_p 0", "/v1/completions", with_(top_p=0), 400, "top_p"),
    ("top_p > 1", "/v1/completions", with_(top_p=1.5), 400, "top_p"),
    ("top_k 0", "/v1/completions", with_(top_k=0), 400, "top_k"),
    ("seed negative", "/v1/completions", with_(seed=-1), 400, "seed"),
    ("seed huge", "/v1/completions", with_(seed=2**70), 400, "seed"),
    ("K 0", "/v1/completions", with_(K=0), 400, "K"),
    ("K unknown policy", "/v1/completions", with_(K="sometimes"), 400, "K"),
    ("drafter a path", "/v1/completions", with_(drafter="../weights/124M"), 400, "drafter"),
    ("stream not a bool", "/v1/completions", with_(stream="yes"), 400, "stream"),
    ("stop a number", "/v1/completions", with_(stop=5), 400, "stop"),
    ("stop five strings", "/v1/completions", with_(stop=list("abcde")), 400, "stop"),
    ("n 0", "/v1/completions", with_(n=0), 400, "n"),
    ("best_of past n", "/v1/completions", with_(n=2, best_of=3), 400, "best_of"),
    ("seed + n past 2**63", "/v1/completions", with_(n=3, seed=2**63 - 2), 400, "seed"),
    ("logprobs", "/v1/completions", with_(logprobs=3), 400, "logprobs"),
    ("echo", "/v1/completions", with_(echo=True), 400, "echo"),
    ("frequency_penalty", "/v1/completions", with_(frequency_penalty=0.5), 400, "frequency_penalty"),
    ("an unknown field", "/v1/completions", with_(do_sample=True), 400, "do_sample"),
    ("K and gamma disagree", "/v1/completions", with_(K=3, gamma=2), 400, "gamma"),
    ("unknown model", "/v1/completions", with_(model="gpt-4"), 404, "model"),
    ("model a path", "/v1/completions", with_(model="../../etc/passwd"), 404, "model"),
    ("invalid JSON", "/v1/completions", '{"prompt": "KING:", "max_tokens": 8', 400, None),
    ("not JSON at all", "/v1/completions", "prompt=KING", 400, None),
    ("a JSON array", "/v1/completions", "[1, 2]", 400, None),
    ("an empty body", "/v1/completions", "", 400, None),
    ("invalid UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 8}', 400, None),
    ("oversized body", "/v1/completions", with_(prompt="x" * (MAX_BODY + 1)), 413, None),
    ("oversized chunked body", "/v1/completions", lambda: (b"x" * 8192 for _ in range(MAX_BODY // 8192 + 2)), 413,
     None),
    ("predict: prompt missing", "/predict", "{}", 400, "prompt"),
    ("predict: prompt a list", "/predict", json.dumps({"prompt": ["a"]}), 400, "prompt"),
    ("predict: max_tokens past the context", "/predict", json.dumps({"prompt": "A", "max_tokens": 999}), 400,
     "max_tokens"),
    ("predict: top_p > 1", "/predict", json.dumps({"prompt": "A", "top_p": 2}), 400, "top_p"),
    ("predict: an unknown field", "/predict", json.dumps({"prompt": "A", "max_new_token": 5}), 400, "max_new_token"),
]


@pytest.fixture(scope="module")
def server():
    engine = bundled_engine()
    with running_server(engine, max_body_bytes=MAX_BODY) as url:
        yield url, engine


@pytest.mark.parametrize("case, path, body, status, field", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_4xx_json_error_naming_the_field(server, case, path, body, status, field):
    url, _ = server
    data = body() if callable(body) else body
    answer = requests.post(url + path, data=data, headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == status, f"{case}: {answer.status_code} {answer.text[:300]}"
    error = answer.json()["error"]
    assert error["message"] and "\n" not in error["message"], f"{case}: not one line: {error['message']!r}"
    assert "Traceback" not in answer.text and 'File "' not in answer.text
    if field is not None:
        assert error["param"] == field and field in error["message"], f"{case}: {error}"
    assert "Input should" not in error["message"], f"{case}: pydantic's wording, not the project's: {error}"


# (case, body, Content-Type, what the message must say, the field it names)
SAID = [
    ("temperature NaN", GOOD_TEXT.replace("}", ', "temperature": NaN}'), "application/json",
     "temperature: must be a finite number", "temperature"),
    ("top_p Infinity", GOOD_TEXT.replace("}", ', "top_p": Infinity}'), "application/json",
     "top_p: must be a finite number", "top_p"),
    ("a logit_bias NaN", GOOD_TEXT.replace("}", ', "logit_bias": {"5": NaN}}'), "application/json",
     "must be a finite number", "logit_bias"),
    ("JSON sent as text/plain", GOOD_TEXT, "text/plain", "Content-Type: application/json (got 'text/plain')", None),
    ("JSON sent as a form", GOOD_TEXT, "application/x-www-form-urlencoded", "Content-Type: application/json", None),
    ("JSON without a Content-Type", GOOD_TEXT, None, "Content-Type: application/json (none was sent)", None),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe", "max_tokens": 8}', "application/json", "could not be parsed", None),
]


# (path, fields, the whole message): the sampling fields' ranges in main.py's words (cli/flags.py,
# "--temperature must be a finite number >= 0 (0 means greedy), got -1.0"), with the value as sent; they
# were pydantic's ("temperature: Input should be greater than or equal to 0")
WORDED = [
    ("/v1/completions", {"temperature": -1},
     "temperature: must be a finite number >= 0 (0 means greedy), at most 100, got -1"),
    ("/predict", {"temperature": -0.5},
     "temperature: must be a finite number >= 0 (0 means greedy), at most 100, got -0.5"),
    ("/v1/completions", {"temperature": 101},
     "temperature: must be a finite number >= 0 (0 means greedy), at most 100, got 101"),
    ("/v1/completions", {"temperature": "hot"},
     'temperature: must be a finite number >= 0 (0 means greedy), at most 100, got "hot"'),
    ("/v1/completions", {"top_p": 0},
     "top_p: must be a finite number in (0, 1] (1, or leaving it out, keeps every token), got 0"),
    ("/predict", {"top_p": 2}, "top_p: must be a finite number in (0, 1] (1, or leaving it out, keeps every token), got 2"),
    ("/v1/completions", {"top_k": 0}, "top_k: must be an integer, at least 1 (leave it out to keep every token), got 0"),
    ("/v1/completions", {"top_k": 2.5}, "top_k: must be an integer, at least 1 (leave it out to keep every token), got 2.5"),
    ("/v1/completions", {"seed": -1}, "seed: must be a non-negative integer, below 2**63, got -1"),
    ("/v1/completions", {"K": 0}, "K: must be an integer from 1 to 32, 'heuristic' or 'auto', got 0"),
    ("/v1/completions", {"K_max": 0}, "K_max: must be an integer from 1 to 32 (the bound of K 'heuristic' or 'auto' "
                                      "and of tree 'auto'), got 0"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens: must be a positive integer (new tokens at most), got 0"),
    ("/predict", {"prompt": ["a"]}, 'prompt: must be a string (POST /v1/completions also takes token ids), got ["a"]'),
    ("/predict", {"prompt": None}, "prompt: required (must be a string (POST /v1/completions also takes token ids))"),
]


@pytest.mark.parametrize("path, fields, says", WORDED, ids=[f"{p} {f}" for p, f, _ in WORDED])
def test_sampling_fields_are_refused_in_the_project_s_words(server, path, fields, says):
    url, _ = server
    body = {k: v for k, v in {**({"prompt": "A"} if path == "/predict" else GOOD), **fields}.items() if v is not None}
    answer = requests.post(url + path, json=body, timeout=30)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["message"] == says, error
    assert error["param"] == next(iter(fields)) and error["type"] == "invalid_request_error", error


@pytest.mark.parametrize("case, body, content_type, says, field", SAID, ids=[c[0] for c in SAID])
def test_the_message_says_what_is_wrong(server, case, body, content_type, says, field):
    url, _ = server
    headers = {"Content-Type": content_type} if content_type else {}
    answer = requests.post(url + "/v1/completions", data=body, headers=headers, timeout=30)
    error = answer.json()["error"]
    assert answer.status_code == 400 and says in error["message"], f"{case}: {error}"
    assert error["param"] == field and error["type"] == "invalid_request_error", f"{case}: {error}"


def test_wrong_method_and_path_are_json_errors(server):
    url, _ = server
    for answer, status in ((requests.get(url + "/v1/completions", timeout=10), 405),
                           (requests.get(url + "/nowhere", timeout=10), 404)):
        assert answer.status_code == status and answer.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/", "/health", "/v1/models"])
def test_head_is_allowed_where_get_is(server, path):
    url, _ = server
    got, head = requests.get(url + path, timeout=10), requests.head(url + path, timeout=10)
    assert (head.status_code, head.content) == (200, b"") and got.status_code == 200
    assert head.headers["content-type"] == got.headers["content-type"]


def test_healthy_and_correct_after_the_table(server):
    url, engine = server
    for case, path, body, status, field in CASES:  # the whole table once more, then a good request
        requests.post(url + path, data=body() if callable(body) else body, timeout=30)
    assert requests.get(url + "/health", timeout=10).json()["status"] == "ok"
    first = requests.post(url + "/v1/completions", json={**GOOD, "temperature": 0}, timeout=30)
    again = requests.post(url + "/v1/completions", json={**GOOD, "temperature": 0}, timeout=30)
    assert first.status_code == again.status_code == 200
    assert first.json()["choices"][0]["text"] == again.json()["choices"][0]["text"]
    assert first.json()["usage"]["completion_tokens"] == 8
