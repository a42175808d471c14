"""The statistics of a job without SpeculativeStats of its own (packed in a batch, or ended by a stop
string) mean what SpeculativeStats' mean: K_counts counts each chain round's K clamped to the tokens
still wanted minus one (K 8 with 7 tokens to go counts as 6), a tree round's nodes, and K is the one
used most; where the engine cannot know that K (prompt lookup with a K policy) both are null.

A real server on 127.0.0.1 (tests/serve_helpers.py); the solo runs to compare with are gpt2np's own
decoders on separately loaded models.
"""
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

import gpt2np  # noqa: E402
from serve_helpers import DRAFT, TARGET, bundled_engine, running_server, slow_down  # noqa: E402
from test_serve_load import wait_until  # noqa: E402

PROMPT = "ROMEO:\nWhat light"


def counts(Ks):  # as the server reports them: JSON keys are strings
    return {str(k): n for k, n in sorted(Counter(Ks).items())}


def most_used(K_counts):  # SpeculativeStats.K: the K used most, the larger on a tie
    return max((int(k) for k in K_counts), key=lambda k: (K_counts[str(k)], k))


def post(url, **body):
    answer = requests.post(url + "/v1/completions", json={"model": TARGET, "prompt": PROMPT, "temperature": 0, **body},
                           timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    return answer.json()


@pytest.fixture(scope="module")
def local():
    target, drafter = gpt2np.load_model(TARGET), gpt2np.load_drafter(DRAFT)
    return target, drafter, target.tokenizer.encode(PROMPT)


def test_a_batched_job_counts_the_clamped_K_as_speculative_stats_does(local):
    """K 8 with max_tokens 7, packed beside a plain request: its reply said K_counts {8: rounds}, K 8,
    for rounds that drafted 6 and fewer; now the clamped K, as the same run alone reports it."""
    target, drafter, ids = local
    alone = gpt2np.speculative_generate(target, drafter, ids, 7, K=8, temperature=0).stats
    assert 8 not in alone.K_counts, alone.K_counts
    engine, gate = bundled_engine(), threading.Event()
    slow_down(engine, gate=gate)
    with running_server(engine) as url, ThreadPoolExecutor(2) as pool:
        plain = pool.submit(post, url, max_tokens=30, speculative=False)
        assert wait_until(lambda: engine.active == 1)  # the plain job holds the worker at its first step
        batched = pool.submit(post, url, max_tokens=7, K=8)
        assert wait_until(lambda: engine.queued == 1)
        gate.set()
        reply, _ = batched.result(timeout=120), plain.result(timeout=120)
    stats = reply["gpt2np"]["stats"]
    assert stats["batched"] and stats["policy"] == "fixed", stats
    before = [0] + [r["n_emitted"] for r in reply["gpt2np"]["rounds"][:-1]]
    assert stats["K_counts"] == counts(min(8, 7 - n - 1) for n in before), stats
    assert stats["K_counts"] == counts(r["K"] for r in reply["gpt2np"]["rounds"]), "a draft model drafts all it is asked"
    assert stats["K_counts"] == {str(k): n for k, n in alone.K_counts.items()} and stats["K"] == alone.K, (stats, alone)
    assert reply["gpt2np"]["K"] == 8, "the request's K stays what it asked for"


def stopped(url, **body):
    """A greedy request, then the same with a stop string its text reaches: the stopped reply."""
    full = post(url, **body)["choices"][0]["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), full
    reply = post(url, stop=stop, **body)
    assert reply["gpt2np"]["stats"]["stopped"] and reply["choices"][0]["finish_reason"] == "stop", reply
    return reply


@pytest.fixture(scope="module")
def server():
    with running_server(bundled_engine()) as url:
        yield url


def test_a_stopped_prompt_lookup_job_counts_the_clamped_K_not_the_K_asked_for(server):
    """K 32, max_tokens 30, prompt lookup, ended by a stop string: it said {32: rounds}; now each round's
    32 clamped to the tokens left (29 in the first round), the K SpeculativeStats would count."""
    reply = stopped(server, max_tokens=30, K=32, drafter="ngram")
    stats = reply["gpt2np"]["stats"]
    before = [0] + [r["n_emitted"] for r in reply["gpt2np"]["rounds"][:-1]]
    assert stats["K_counts"] == counts(min(32, 30 - n - 1) for n in before) and "32" not in stats["K_counts"], stats
    assert stats["K"] == most_used(stats["K_counts"]) and stats["policy"] == "fixed", stats
    assert stats["drafted"] == sum(len(r["drafts"]) for r in reply["gpt2np"]["rounds"]), stats


def test_a_stopped_tree_job_counts_the_nodes_each_round_drafted(server):
    """tree [3, 1]: it said K_counts {4: rounds} (the K field's default, which a tree ignores); now the
    nodes each round drafted, as SpeculativeStats counts a tree run's rounds."""
    reply = stopped(server, max_tokens=30, tree=[3, 1])
    stats = reply["gpt2np"]["stats"]
    assert stats["K_counts"] == counts(r["K"] for r in reply["gpt2np"]["rounds"]) and "4" not in stats["K_counts"], stats
    assert stats["K"] == most_used(stats["K_counts"]) and stats["policy"] == "fixed", stats


def test_prompt_lookup_with_a_K_policy_reports_its_K_as_not_known(server):
    """K 'heuristic' with prompt lookup, stopped: it said K_counts {'heuristic': rounds} and policy
    'fixed'; the K the policy asked for is not in the rounds (lookup may draft fewer), so K and
    K_counts are null and the policy is named; the rounds keep the drafts proposed."""
    reply = stopped(server, max_tokens=30, K="heuristic", drafter="ngram")
    stats = reply["gpt2np"]["stats"]
    assert stats["K_counts"] is None and stats["K"] is None and stats["policy"] == "heuristic", stats
    assert stats["rounds"] == len(reply["gpt2np"]["rounds"]) and all("K" in r for r in reply["gpt2np"]["rounds"])


def test_a_stopped_draft_model_job_with_a_policy_counts_its_drafts(server):
    """K 'heuristic' with the draft model, stopped: a draft model drafts all it is asked for, so each
    round's drafts are its K clamped to the tokens left; K_counts counts them, never past that bound."""
    reply = stopped(server, max_tokens=30, K="heuristic")
    stats, rounds = reply["gpt2np"]["stats"], reply["gpt2np"]["rounds"]
    before = [0] + [r["n_emitted"] for r in rounds[:-1]]
    assert all(r["K"] == len(r["drafts"]) <= 30 - n - 1 for r, n in zip(rounds, before)), rounds
    assert stats["K_counts"] == counts(r["K"] for r in rounds) and stats["policy"] == "heuristic", stats
