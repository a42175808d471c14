"""No request field is dropped silently: other repositories' names are honoured, unsupported fields
are refused by name, unknown fields are refused, and only `user` (and null / neutral values) pass unused.

A real server on 127.0.0.1 (tests/serve_helpers.py), reached with requests and the official openai
package; what an alias should do is computed with gpt2np's own decoders on separately loaded models.
"""
import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
openai = pytest.importorskip("openai", reason="the client tests need the openai package (requirements-dev.txt)")
import requests  # noqa: E402

import gpt2np  # noqa: E402
from serve_helpers import DRAFT, TARGET, bundled_engine, running_server  # noqa: E402

PROMPT = "ROMEO:\nWhat light"


@pytest.fixture(scope="module")
def server():
    with running_server(bundled_engine()) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local():
    target, drafter = gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT)
    return target, drafter, target.tokenizer.encode(PROMPT)


def post(url, path, **body):
    answer = requests.post(url + path, json=body, timeout=60)
    return answer.status_code, answer.json()


def K_counts(target, drafter, ids, n, K):  # as the server reports them: JSON keys are strings
    result = gpt2np.speculative_generate(target, drafter, ids, n, K=K, temperature=0)
    return {str(k): v for k, v in result.stats.K_counts.items()}


def test_predict_honours_gamma_and_max_new_tokens(server, local):
    target, drafter, ids = local
    status, body = post(server, "/predict", prompt=PROMPT, gamma=2, max_new_tokens=5)
    assert status == 200, body
    assert len(body["tokens"]) == body["usage"]["completion_tokens"] == 5, f"{len(body['tokens'])} tokens, not 5"
    expected = K_counts(target, drafter, ids, 5, K=2)
    assert expected != K_counts(target, drafter, ids, 5, K=4), "K 2 and K 4 would be indistinguishable here"
    assert body["stats"]["K_counts"] == expected, f"rounds by K {body['stats']['K_counts']}, gamma=2 gives {expected}"


def test_completions_honour_aliases_through_the_openai_client(client, local):
    target, drafter, ids = local
    for extra, n, K in (({"gamma": 3, "max_new_tokens": 6}, 6, 3), ({"max_length": len(ids) + 7}, 7, 4)):
        completion = client.completions.create(model=TARGET, prompt=PROMPT, temperature=0, extra_body=extra)
        assert completion.usage.completion_tokens == n, f"{extra}: {completion.usage.completion_tokens} tokens"
        stats = completion.model_extra["gpt2np"]["stats"]
        assert stats["K_counts"] == K_counts(target, drafter, ids, n, K), f"{extra}: {stats['K_counts']}"


def test_max_length_counts_the_prompt_on_predict(server, local):
    _, _, ids = local
    status, body = post(server, "/predict", prompt=PROMPT, max_length=len(ids) + 3)
    assert status == 200 and len(body["tokens"]) == 3, body


def test_two_spellings_that_agree_are_one_field(server, local):
    _, _, ids = local
    for extra in ({"K": 2, "gamma": 2}, {"max_new_tokens": 4}, {"max_length": len(ids) + 4}):
        status, body = post(server, "/v1/completions", prompt=PROMPT, temperature=0, max_tokens=4, **extra)
        assert status == 200 and body["usage"]["completion_tokens"] == 4, (extra, body)


@pytest.mark.parametrize("fields, param, named", [
    ({"K": 4, "gamma": 2}, "gamma", ("K", "gamma")),
    ({"max_tokens": 5, "max_new_tokens": 6}, "max_new_tokens", ("max_tokens", "max_new_tokens")),
    ({"max_tokens": 5, "max_length": 999}, "max_length", ("max_tokens", "max_length")),
    ({"max_new_tokens": 5, "max_length": 999}, "max_length", ("max_new_tokens", "max_length")),
])
@pytest.mark.parametrize("path", ["/predict", "/v1/completions"])
def test_two_spellings_that_disagree_are_a_400_naming_both(server, path, fields, param, named):
    status, body = post(server, path, prompt=PROMPT, **fields)
    assert status == 400, f"{fields}: {status} {body}"
    assert body["error"]["param"] == param and all(n in body["error"]["message"] for n in named), body


@pytest.mark.parametrize("fields, param", [
    ({"max_length": 2}, "max_length"),             # no room after the prompt
    ({"max_length": 10_000}, "max_length"),        # past the context
    ({"max_new_tokens": 10_000}, "max_new_tokens"),
    ({"gamma": 0}, "gamma"),
    ({"gamma": "often"}, "gamma"),
])
def test_alias_errors_name_the_spelling_sent(server, fields, param):
    status, body = post(server, "/v1/completions", prompt=PROMPT, **fields)
    assert status == 400 and body["error"]["param"] == param and param in body["error"]["message"], body


@pytest.mark.parametrize("field, value", [
    ("frequency_penalty", 0.5), ("presence_penalty", -1), ("logit_bias", {"50": -100}), ("best_of", 2),
    ("echo", True), ("suffix", "THE END"), ("logprobs", 0), ("logprobs", 2),
])
def test_fields_that_would_change_the_output_are_refused_by_name(client, field, value):
    with pytest.raises(openai.BadRequestError, match=field) as refused:
        client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=5, **{field: value})
    assert refused.value.body["param"] == field and "not supported" in refused.value.body["message"]


def test_neutral_values_and_user_change_nothing(client):
    plain = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=30, temperature=0)
    neutral = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=30, temperature=0, user="someone",
                                        frequency_penalty=0, presence_penalty=0.0, logit_bias={}, best_of=1, n=1,
                                        echo=False, extra_body={"logprobs": None, "suffix": None, "K": None})
    assert neutral.choices[0].text == plain.choices[0].text and neutral.usage == plain.usage


@pytest.mark.parametrize("path, fields, named", [
    ("/v1/completions", {"do_sample": False}, "do_sample"),
    ("/v1/completions", {"repetition_penalty": 1.2}, "repetition_penalty"),
    ("/v1/completions", {"stream": True, "stream_options": {"include_usage": True, "chunk": 1}},
     "stream_options.chunk"),
    ("/predict", {"max_new_token": 5}, "max_new_token"),
    ("/predict", {"stop": "\n"}, "stop"),
])
def test_unknown_fields_are_refused_by_name(server, path, fields, named):
    status, body = post(server, path, prompt=PROMPT, max_tokens=5, **fields)
    assert status == 400 and body["error"]["message"].startswith(f"{named}: unknown field"), body
    assert body["error"]["param"] == named.split(".")[0]


def test_stream_options_need_stream_and_usage_comes_last(client, server):
    status, body = post(server, "/v1/completions", prompt=PROMPT, max_tokens=5, stream_options={"include_usage": True})
    assert status == 400 and body["error"]["param"] == "stream_options", body
    chunks = list(client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5


def test_tree_field_drafts_trees_and_reports_each_round_s_tree(client, local):
    """tree (issue 28, item 6): the greedy text is the target's, rounds carry their tree and path."""
    target, _, ids = local
    want = target.tokenizer.decode(gpt2np.generate(target, ids, 20, temperature=0))
    for tree in ([3, 2], "auto"):
        completion = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=20, temperature=0,
                                               extra_body={"tree": tree})
        assert completion.choices[0].text == want, (tree, completion.choices[0].text)
        rounds, extension = completion.model_extra["gpt2np"]["rounds"], completion.model_extra["gpt2np"]
        assert (extension["K"], extension["tree"]) == (None, tree), "a tree run reported a K it did not use"
        streamed = list(client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=20, temperature=0,
                                                  stream=True, extra_body={"tree": tree}))
        assert {(c.model_extra["gpt2np"]["K"], str(c.model_extra["gpt2np"]["tree"])) for c in streamed} == \
            {(None, str(tree))}
        if tree == [3, 2]:
            assert rounds[0]["parents"] == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3], rounds[0]
            drafted = [r for r in rounds if r["K"] > 0]  # the last round may draft nothing: one token left
            assert drafted and all("parents" in r and "path" in r for r in drafted), rounds
            assert any(r["path"] for r in drafted), "no round accepted a node: the paths prove nothing"
            for r in drafted:  # the path descends the round's own tree from the root, one node per accepted depth
                path, parents = r["path"], r["parents"]
                assert len(path) <= 2 and len(path) == sum(r["decisions"]), r
                assert [parents[node] for node in path] == [0, *path][:len(path)], r


@pytest.mark.parametrize("fields, message", [
    ({"tree": [3, 0]}, "tree: must be a list of 1 to 8 integers from 1 to 8"),
    ({"tree": "wide"}, "tree: must be a list of 1 to 8 integers from 1 to 8"),
    ({"tree": [2], "K": 3}, "tree: a tree fixes each round's drafts: leave K out"),
    ({"tree": [2], "gamma": 3}, "leave gamma out"),
    ({"tree": "auto", "drafter": "ngram"}, "tree: 'auto' picks the shapes a draft model grows"),
    ({"tree": [8, 8]}, "tree: at most 64 nodes in all"),           # 72 nodes: past the rows kept for a tree
    ({"tree": [8] * 8}, "tree: at most 64 nodes in all"),          # 19 million nodes, once cut to 64 a round
])
def test_bad_tree_fields_are_a_400_naming_tree(server, fields, message):
    status, body = post(server, "/v1/completions", prompt=PROMPT, max_tokens=5, **fields)
    assert status == 400 and body["error"]["param"] == "tree" and message in body["error"]["message"], body


def test_an_empty_prompt_is_documented_as_starting_from_endoftext(server):
    """{"prompt": ""} answers from <|endoftext|> with prompt_tokens 1, which only a code comment said; the
    prompt fields' descriptions in /docs (OpenAPI) now say so."""
    schemas = requests.get(server + "/openapi.json", timeout=30).json()["components"]["schemas"]
    for name in ("CompletionRequest", "PredictRequest"):
        said = schemas[name]["properties"]["prompt"].get("description", "")
        assert '"" starts from <|endoftext|>' in said and "1 prompt token" in said, (name, said)
    status, body = post(server, "/v1/completions", prompt="", max_tokens=3, temperature=0)
    assert status == 200 and body["usage"]["prompt_tokens"] == 1, body


# ---- what clients of OpenAI-compatible servers send (an audit with the openai package, session 62) ----------

def test_a_prompt_in_a_list_of_one_is_that_prompt(client, server, local):
    """LangChain's OpenAI LLM and other batching clients send prompt=[...]: a list of one string (or of one list
    of ids) was a 400; it is that prompt, answered as the prompt itself is, but for gpt2np's object: a list of
    one, as for any list of prompts (several: test_serve_prompts.py)."""
    target, _, ids = local
    want = target.tokenizer.decode(gpt2np.generate(target, ids, 8))
    for prompt in ([PROMPT], [ids], PROMPT):
        completion = client.completions.create(model=TARGET, prompt=prompt, max_tokens=8, temperature=0)
        assert completion.choices[0].text == want and completion.usage.prompt_tokens == len(ids), prompt
        shape = list if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else dict
        assert isinstance(completion.model_extra["gpt2np"], shape), "a list of prompts, even of one: a list"
    status, body = post(server, "/v1/completions", prompt=[], max_tokens=8)
    assert status == 400 and "a list of at least one token id" in body["error"]["message"], body


def test_speculative_false_runs_the_target_alone_whatever_drafting_fields_come_with_it(client, local):
    """A client that toggles speculative sends the same body (the playground's comparison run does): drafter,
    K_max and a tree beside speculative false cannot change the output, so they are accepted and unused; a
    tree was refused there while K and drafter passed."""
    target, _, ids = local
    answer = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=8, temperature=0,
                                       extra_body={"speculative": False, "tree": [2], "drafter": "ngram", "K_max": 3})
    own = answer.model_extra["gpt2np"]
    assert (own["speculative"], own["drafter"], own["tree"], own["K"]) == (False, None, None, None), own
    assert own["live"]["K_counts"] == {"0": 8}, "a target-only run's rounds are K 0 whatever K came with it"
    K_sent = client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=8, temperature=0,
                                       extra_body={"speculative": False, "K": 2}).model_extra["gpt2np"]
    assert K_sent["live"]["K_counts"] == {"0": 8}, K_sent["live"]
    assert answer.choices[0].text == target.tokenizer.decode(gpt2np.generate(target, ids, 8))


def test_max_tokens_left_out_is_openais_16(client):
    """It was a 400 ("required"), so client.completions.create(model=..., prompt=...) failed; OpenAI's and vLLM's
    completions default to 16."""
    completion = client.completions.create(model=TARGET, prompt=PROMPT, temperature=0)
    assert (completion.usage.completion_tokens, completion.choices[0].finish_reason) == (16, "length"), completion


def test_include_usage_sends_openais_last_event_with_no_choices(client):
    """stream_options include_usage: OpenAI sends one more event before [DONE], its choices empty, with usage;
    clients read usage there (`if not chunk.choices`). Without it no such event comes."""
    chunks = list(client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5, chunks[-1]
    assert all(chunk.choices for chunk in chunks[:-1]) and chunks[-2].choices[0].finish_reason == "length"
    plain = list(client.completions.create(model=TARGET, prompt=PROMPT, max_tokens=5, temperature=0, stream=True))
    assert all(chunk.choices for chunk in plain) and len(plain) == len(chunks) - 1


def test_routes_it_does_not_serve_say_what_it_serves(client, server):
    """/v1/chat/completions was a bare 404 "Not Found" (a wrong base_url or a route not served?), a 405 had no
    Allow header, and client.models.retrieve failed: each now says what is served, and retrieve works."""
    chat = requests.post(server + "/v1/chat/completions", json={"model": TARGET, "messages": []}, timeout=60)
    assert chat.status_code == 404 and chat.json()["error"]["message"] == (
        "POST /v1/chat/completions is not served here (GPT-2 has no chat format: send the text to continue as a "
        "prompt); this server serves POST /v1/completions, POST /predict, GET /v1/models, GET /health (GET /docs)")
    wrong_method = requests.get(server + "/v1/completions", timeout=60)
    assert wrong_method.status_code == 405 and wrong_method.headers["Allow"] == "POST", wrong_method.headers
    assert wrong_method.json()["error"]["message"] == "GET /v1/completions: method not allowed (allowed: POST)"
    assert client.models.retrieve(TARGET).id == TARGET
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.body["code"] == "model_not_found"


def test_neutral_values_pass_and_wrong_ones_say_what_they_must_be(server):
    """suffix "" appends nothing (accepted, as the other neutral values); drafter "" fell back to the default
    drafter where any other unknown name is refused; n 1.0 was told to "send 1"; a body nested 50,000 deep was
    said not to be UTF-8."""
    status, body = post(server, "/v1/completions", prompt=PROMPT, max_tokens=3, suffix="")
    assert status == 200, body
    for field, value, said in (("drafter", "", "drafter: must be one of GET /v1/models' gpt2np.drafters"),
                               ("n", 1.0, "n: must be a positive integer (choices a prompt, each its own draws)")):
        status, body = post(server, "/v1/completions", prompt=PROMPT, max_tokens=3, **{field: value})
        assert status == 400 and body["error"]["param"] == field and body["error"]["message"].startswith(said), body
    deep = requests.post(server + "/v1/completions", data=b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                         headers={"Content-Type": "application/json"}, timeout=60)
    assert deep.status_code == 400 and deep.json()["error"]["message"].startswith(
        "the request body could not be parsed"), deep.text[:300]
