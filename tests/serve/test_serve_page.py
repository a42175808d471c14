"""The playground in a real browser: headless Chromium opens /, submits a prompt, and the
coloured token stream and the statistics must appear in the DOM. A screenshot is saved in the
test's temporary folder (the README's docs/playground.png is one of these).
"""
import re

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
pytest.importorskip("websocket", reason="driving Chromium needs websocket-client (requirements-dev.txt)")

from browser import Browser, chromium_path  # noqa: E402
from serve_helpers import bundled_engine, running_server  # noqa: E402

if chromium_path() is None:
    pytest.skip("no chromium on PATH (apt-get install chromium; .ci/run does it when run as root)",
                allow_module_level=True)

DOM_SUMMARY = """JSON.stringify({
  state: document.body.dataset.state, error: document.getElementById("error").textContent,
  kinds: Object.fromEntries(["draft", "resample", "bonus", "target"].map(
      k => [k, document.querySelectorAll("#spec .tok." + k).length])),
  plain: document.querySelectorAll("#plain .tok.target").length,
  text: Array.from(document.querySelectorAll("#spec .tok")).map(s => s.textContent).join(""),
  stats: Object.fromEntries(Array.from(document.querySelectorAll("[data-stat]")).map(
      e => [e.closest("section") ? e.closest("section").id + "." + e.dataset.stat : e.dataset.stat,
            e.textContent])),
  legend: document.querySelector(".legend").textContent, drafter: document.getElementById("drafter").value,
  colours: ["draft", "resample", "bonus"].map(k => {
      const s = document.querySelector("#spec .tok." + k); return s && getComputedStyle(s).backgroundColor; }),
})"""


def autorun(page_url, tmp_path, screenshot=None):  # -> (the page's final state, DOM_SUMMARY)
    """Open a ?autorun=1 page in headless Chromium and wait until its run is done or failed."""
    import json
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(page_url)
        state = browser.wait_for('["done", "error"].includes(document.body.dataset.state) && '
                                 'document.body.dataset.state', timeout=90)
        page = json.loads(browser.evaluate(DOM_SUMMARY))
        if screenshot:
            browser.screenshot(screenshot)
    finally:
        browser.close()
    return state, page


def test_playground_streams_coloured_tokens_and_statistics(tmp_path):
    import requests
    engine = bundled_engine()
    with running_server(engine) as url:
        expected = requests.post(url + "/v1/completions", json={"prompt": "ROMEO:\nWhat light", "max_tokens": 80,
                                 "temperature": 0}, timeout=60).json()["choices"][0]["text"]
        state, page = autorun(url + "/?autorun=1&compare=1&max_tokens=80&temperature=0&prompt=ROMEO%3A%0AWhat%20light",
                              tmp_path, screenshot=tmp_path / "playground.png")
    assert state == "done", f"page state {state!r}, error {page['error']!r}"
    kinds, stats = page["kinds"], page["stats"]
    assert kinds["draft"] > 0 and sum(kinds.values()) == 80, kinds
    assert kinds["target"] <= 1, f"{kinds}: only a last round with no room for drafts is a plain target step"
    assert page["plain"] == 80, "the comparison pane should hold the 80 target-only tokens"
    assert page["text"] == expected, "the page shows other text than the API returns"
    assert len(set(page["colours"]) - {None}) == sum(kinds[k] > 0 for k in ("draft", "resample", "bonus"))
    assert int(stats["spec.tokens"]) == 80 and 0 <= float(stats["spec.alpha_hat"]) <= 1
    assert float(stats["spec.tokens_per_target_call"]) > 1
    assert re.fullmatch(r"\d+\.\d\d×", stats["speedup"]) and re.fullmatch(r"\d+\.\d\d×", stats["spec.predicted_speedup"])
    assert "accepted draft" in page["legend"] and "bonus" in page["legend"]
    assert (tmp_path / "playground.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_form_takes_common_values_and_a_comparison_repeats_the_run_s_settings(tmp_path):
    """top_p 0.9 and temperature 0.75 were invalid to the browser (step 0.05 from 0.01, step 0.1), so Generate sent
    nothing; a comparison re-read the form mid-run and, with no seed, drew its own: now one request body per click,
    the target-only run on the speculative run's seed; the input a K policy ignores is disabled, a bad ?drafter=
    says so, and a prediction a run cannot have says why."""
    import json
    engine = bundled_engine()
    with running_server(engine) as url:
        browser = Browser(tmp_path / "profile")
        try:
            browser.open(url + "/?compare=1&max_tokens=12&temperature=0.75&top_p=0.9&seed=&K=auto&drafter=nope"
                         "&prompt=ROMEO%3A")
            browser.wait_for('document.getElementById("drafter").options.length > 0', timeout=30)
            form = json.loads(browser.evaluate('JSON.stringify({valid: document.getElementById("form").checkValidity(),'
                                               ' K: document.getElementById("K").disabled,'
                                               ' K_max: document.getElementById("K_max").disabled,'
                                               ' drafter: document.getElementById("drafter").value,'
                                               ' error: document.getElementById("error").textContent})'))
            browser.evaluate('document.getElementById("go").click()')
            state = browser.wait_for('["done", "error"].includes(document.body.dataset.state) && '
                                     'document.body.dataset.state', timeout=90)
            page = json.loads(browser.evaluate(DOM_SUMMARY))
            why = [browser.evaluate(f"predicted({stats})") for stats in (
                '{predicted_speedup_refined: null, batched: true}', '{predicted_speedup_refined: null, stopped: true}',
                '{predicted_speedup_refined: 1.234}')]
            policy_row = browser.evaluate('JSON.stringify(liveRows({tokens: 9, rounds: 3, tokens_per_second: 1, '
                                          'accepted: 2, drafted: 5}, {K_counts: null, policy: "heuristic", '
                                          'predicted_speedup_refined: null, stopped: true}, true).at(-1))')
        finally:
            browser.close()
    assert form["valid"] and form["K"] and not form["K_max"], form
    assert form["drafter"] == engine.default_drafter and 'no drafter "nope"' in form["error"], form
    assert state == "done", f"page state {state!r}, error {page['error']!r}"
    seeds = page["stats"]["spec.seed"], page["stats"]["plain.seed"]
    assert seeds[0] == seeds[1] and seeds[0].isdigit(), seeds  # drawn by the server once, then reused
    assert why[0].startswith("n/a (packed") and why[1].startswith("n/a (a stop string") and why[2] == "1.23×", why
    # a stopped prompt-lookup run with a K policy has K_counts null (the K asked for is not known): said, no error
    assert json.loads(policy_row)[1] == "heuristic, rounds per K: not known (prompt lookup may draft fewer than asked)"


def test_a_server_without_a_default_drafter_still_runs_the_page(tmp_path):
    """--draft_model_size none: /v1/models says default_drafter null (a request that names no drafter runs the
    target alone); the page, which shows drafting, picks the first drafter served (prompt lookup) and runs."""
    from gpt2np.serve.__main__ import load_engine, parse_args
    engine = load_engine(parse_args(["--draft_model_size", "none"]))
    with running_server(engine) as url:
        state, page = autorun(url + "/?autorun=1&max_tokens=12&temperature=0&prompt=ROMEO%3A", tmp_path)
    assert engine.default_drafter is None and page["drafter"] == "ngram", (engine.default_drafter, page["drafter"])
    assert state == "done" and sum(page["kinds"].values()) == 12, (state, page["error"], page["kinds"])
