"""--allow_origin: a web page served from another origin (a teacher's page, a notebook's front end) may call
the API from the browser (CORS). Without it only the playground, served by the server itself, can.

A real server on 127.0.0.1 (tests/serve_helpers.py): first the headers a browser asks for and reads, with
requests; then headless Chromium (tests/browser.py) opening a page from another port, whose script posts a
completion: it reads the text with the flag and is refused by the browser without it (the negative control).
"""
import http.server
import threading
from functools import partial

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

from browser import Browser, chromium_path  # noqa: E402
from serve_helpers import TARGET, bundled_engine, running_server  # noqa: E402

PAGE = """<!doctype html><meta charset="utf-8"><body data-state="running"><pre id="out"></pre><script>
const api = new URLSearchParams(location.search).get("api");
fetch(api + "/v1/completions", {method: "POST", headers: {"Content-Type": "application/json"},
  body: JSON.stringify({prompt: "ROMEO:", max_tokens: 6, temperature: 0, speculative: false})})
  .then(r => r.json()).then(b => { out.textContent = b.choices[0].text; document.body.dataset.state = "done"; })
  .catch(e => { out.textContent = String(e); document.body.dataset.state = "error"; });
</script>"""


def preflight(url, origin):
    return requests.options(url + "/v1/completions", timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})


def test_an_allowed_origin_gets_the_headers_its_browser_reads_and_no_other_does():
    page, other = "http://localhost:3000", "http://elsewhere.example"
    body = {"model": TARGET, "prompt": "ROMEO:", "max_tokens": 3, "temperature": 0}
    with running_server(bundled_engine(), allow_origins=[page]) as url:
        asked = preflight(url, page)
        answer = requests.post(url + "/v1/completions", json=body, headers={"Origin": page}, timeout=30)
        refused = requests.post(url + "/v1/completions", json={**body, "max_tokens": 0}, headers={"Origin": page},
                                timeout=30)
        foreign = requests.post(url + "/v1/completions", json=body, headers={"Origin": other}, timeout=30)
        foreign_asked = preflight(url, other)
    assert asked.status_code == 200 and asked.headers["Access-Control-Allow-Origin"] == page, asked.headers
    assert "POST" in asked.headers["Access-Control-Allow-Methods"], asked.headers
    assert answer.status_code == 200 and answer.headers["Access-Control-Allow-Origin"] == page, answer.headers
    assert "retry-after" in answer.headers["Access-Control-Expose-Headers"].lower(), answer.headers
    assert refused.status_code == 400 and refused.headers["Access-Control-Allow-Origin"] == page, \
        "a 400's message must reach the page's script too"
    assert "Access-Control-Allow-Origin" not in foreign.headers and foreign_asked.status_code == 400
    assert foreign_asked.json()["error"]["message"] == (
        "CORS preflight refused (origin) for the origin 'http://elsewhere.example': this server allows "
        "http://localhost:3000 (--allow_origin) and the methods GET, HEAD, POST"), foreign_asked.text


def test_without_the_flag_no_page_elsewhere_is_allowed():
    with running_server(bundled_engine()) as url:
        asked = preflight(url, "http://localhost:3000")
        answer = requests.post(url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 2},
                               headers={"Origin": "http://localhost:3000"}, timeout=30)
    assert "Access-Control-Allow-Origin" not in asked.headers and asked.status_code == 405, asked.headers
    assert answer.status_code == 200 and "Access-Control-Allow-Origin" not in answer.headers


@pytest.fixture
def page_elsewhere(tmp_path):  # -> the URL of PAGE, served from its own port (another origin)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text(PAGE, encoding="utf-8")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    handler.log_message = lambda *args: None
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()
    site.server_close()


@pytest.mark.skipif(chromium_path() is None, reason="no chromium on PATH (apt-get install chromium; .ci/run does it "
                                                    "when run as root)")
@pytest.mark.parametrize("allowed", [True, False])
def test_a_page_from_another_origin_calls_the_api_in_a_browser_only_when_allowed(tmp_path, page_elsewhere, allowed):
    pytest.importorskip("websocket", reason="driving Chromium needs websocket-client (requirements-dev.txt)")
    origins = [page_elsewhere] if allowed else []
    with running_server(bundled_engine(), allow_origins=origins) as url:
        want = requests.post(url + "/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 6, "temperature": 0,
                                                            "speculative": False}, timeout=30).json()["choices"][0]
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(f"{page_elsewhere}/index.html?api={url}")
            state = browser.wait_for('document.body.dataset.state !== "running" && document.body.dataset.state',
                                     timeout=60)
            text = browser.evaluate("document.getElementById('out').textContent")
        finally:
            browser.close()
    if allowed:
        assert (state, text) == ("done", want["text"]), (state, text)
    else:
        assert state == "error" and "Failed to fetch" in text, (state, text)


def test_a_server_error_reaches_the_page_with_its_cors_headers(caplog):
    """A bug in a route (an unhandled error) answers OpenAI's 500 JSON, and, for an allowed origin, with the CORS
    headers its browser needs to let the page's script read it: Starlette's handler for Exception sits outside
    every middleware, so its 500 had none and the page saw only a network error."""
    page = "http://localhost:3000"
    engine = bundled_engine()

    def broken(prompt):
        raise RuntimeError("a bug in encode")
    engine.encode = broken
    body = {"model": TARGET, "prompt": "ROMEO:", "max_tokens": 3, "temperature": 0}
    with running_server(engine, allow_origins=[page]) as url:
        answer = requests.post(url + "/v1/completions", json=body, headers={"Origin": page}, timeout=30)
        health = requests.get(url + "/health", timeout=30)
    assert answer.status_code == 500 and answer.headers.get("Access-Control-Allow-Origin") == page, answer.headers
    assert answer.json()["error"]["type"] == "server_error" and "a bug" not in answer.text, answer.text
    assert health.status_code == 200
    assert any("unhandled error" in r.getMessage() for r in caplog.records), "the bug is logged on the server"
