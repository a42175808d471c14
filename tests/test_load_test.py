"""tools/load_test.py: its statistics against hand-computed values, and whole runs against real servers.

The statistics (tools/load_test_stats.py) are pure functions: each case below was worked out by hand
(and the percentile cross-checked against numpy). The runs drive the bundled pair over HTTP: once
with --url against a server in this process (tests/serve_helpers.py, so its own counters can be
read), and once with the tool starting and stopping its own servers (--compare); every number the
tool reports is checked against the others (every request answered, max_tokens tokens each,
TTFT <= E2EL, TPOT and the throughputs recomputed from the per-request rows).
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "load_test.py"
sys.path.insert(0, str(REPO / "tools"))
from load_test_stats import (inter_token_latencies, level_summary, percentile, request_measures,  # noqa: E402
                             speculative_measures, summary, tpot)


def close(got, want, what, tol=1e-9):
    off = None if got is None else got - want
    assert off is not None and abs(off) <= tol, f"{what}: {got} != {want} (off by {off})"


# --- statistics, by hand -------------------------------------------------------------------------
def test_percentile_interpolates_between_order_statistics():
    close(percentile([4, 1, 3, 2], 50), 2.5, "p50 of 1..4")            # halfway between 2 and 3
    close(percentile([1, 2, 3, 4], 99), 3.97, "p99 of 1..4")           # rank 0.99 * 3 = 2.97: 3 + 0.97
    close(percentile([10, 20], 99), 19.9, "p99 of 10, 20")             # rank 0.99: 10 + 0.99 * 10
    close(percentile([5, 1, 9], 0), 1, "p0 is the minimum")
    close(percentile([5, 1, 9], 100), 9, "p100 is the maximum")
    close(percentile([7.5], 99), 7.5, "one value")
    assert percentile([], 50) is None


def test_percentile_agrees_with_numpy():
    rng = np.random.default_rng(29)
    for n in (1, 2, 3, 10, 101):
        values = list(rng.exponential(size=n))
        for q in (0, 1, 50, 90, 99, 100):
            close(percentile(values, q), float(np.percentile(values, q)), f"p{q} of {n} values", tol=1e-12)


def test_summary_mean_p50_p99_and_missing_values():
    s = summary([1.0, 3.0, None])
    assert s["n"] == 2, s
    close(s["mean"], 2.0, "mean")
    close(s["p50"], 2.0, "p50")
    close(s["p99"], 2.98, "p99")  # 1 + 0.99 * 2
    assert summary([]) == {"n": 0, "mean": None, "p50": None, "p99": None}


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it():
    close(tpot(1.0, 0.2, 5), 0.2, "(1.0 - 0.2) / 4")
    close(tpot(0.5, 0.1, 2), 0.4, "(0.5 - 0.1) / 1")
    assert tpot(1.0, 0.2, 1) is None and tpot(1.0, None, 5) is None  # one token, or no first token seen


def test_inter_token_latencies_are_the_gaps_between_chunks():
    gaps = inter_token_latencies([0.5, 0.75, 1.5, 1.625])
    assert len(gaps) == 3, gaps
    for got, want in zip(gaps, [0.25, 0.75, 0.125]):
        close(got, want, "gap")
    assert inter_token_latencies([3.0]) == [] and inter_token_latencies([]) == []


def test_request_measures_streamed_and_whole():
    streamed = {"stream": True, "start": 10.0, "end": 10.7, "n_out": 4, "arrivals": [10.1, 10.3, 10.6]}
    m = request_measures(streamed)
    close(m["ttft"], 0.1, "TTFT", 1e-9)
    close(m["e2el"], 0.7, "E2EL", 1e-9)
    close(m["tpot"], 0.2, "TPOT = (0.7 - 0.1) / 3", 1e-9)
    assert len(m["itl"]) == 2 and abs(m["itl"][0] - 0.2) < 1e-9 and abs(m["itl"][1] - 0.3) < 1e-9, m["itl"]
    whole = request_measures({"stream": False, "start": 2.0, "end": 2.5, "n_out": 4, "arrivals": []})
    assert whole["ttft"] is None and whole["tpot"] is None and whole["itl"] == [], whole
    close(whole["e2el"], 0.5, "E2EL")


def test_speculative_measures_by_hand():
    rounds = [{"drafts": [5, 6, 7], "decisions": [True, True, False]},   # 2 of 3 accepted
              {"drafts": [8, 9, 10], "decisions": [False]},             # 0 of 3
              {"drafts": [1, 2, 3], "decisions": [True, True, True]},   # 3 of 3
              {"drafts": [], "decisions": []}]                          # a target-only step: not a drafting round
    s = speculative_measures(rounds)
    assert (s["drafted"], s["accepted"], s["drafting_rounds"]) == (9, 5, 3), s
    close(s["acceptance_rate"], 5 / 9, "acceptance rate")
    close(s["mean_accepted_length"], 1 + 5 / 3, "mean accepted length")
    for i, (got, want) in enumerate(zip(s["per_position_acceptance"], [2 / 3, 2 / 3, 1 / 3])):
        close(got, want, f"position {i + 1}")
    assert speculative_measures([{"drafts": [], "decisions": []}]) is None and speculative_measures([]) is None


def test_level_summary_counts_and_throughputs():
    def served(stream, n_out, start, end, arrivals=()):
        return {"outcome": "served", "stream": stream, "n_out": n_out, "start": start, "end": end,
                "arrivals": list(arrivals), "rounds": [{"drafts": [1, 2], "decisions": [True, False]}]}
    records = [served(True, 4, 0.0, 1.0, [0.25, 0.5, 1.0]), served(False, 3, 0.5, 1.5),
               {"outcome": "busy", "stream": False, "n_out": 0, "busy_retries": 0},
               {"outcome": "server_error", "stream": True, "n_out": 0}]
    s = level_summary(records, duration=2.0, max_tokens=4)
    assert (s["sent"], s["served"], s["busy"], s["server_errors"], s["errors"], s["short"]) == (4, 2, 1, 1, 0, 1), s
    close(s["request_throughput"], 1.0, "2 served / 2 s")
    close(s["output_token_throughput"], 3.5, "7 tokens / 2 s")
    close(s["ttft_s"]["mean"], 0.25, "the streamed request's TTFT")
    close(s["tpot_s"]["mean"], 0.25, "(1.0 - 0.25) / 3")
    assert s["e2el_s"]["n"] == 2 and s["itl_s"]["n"] == 2, s
    close(s["itl_s"]["mean"], 0.375, "mean of 0.25 and 0.5")
    close(s["speculative"]["acceptance_rate"], 0.5, "2 accepted of 4 drafted")


# --- whole runs ------------------------------------------------------------------------------------
def run_tool(*args, timeout=240):
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def check_level(level, concurrency, per_client, max_tokens, stream_fraction=0.5):
    """Every count and number of one level agrees with the others and with the per-request rows."""
    rows, sent = level["requests"], concurrency * per_client
    where = f"concurrency {concurrency}"
    assert (level["sent"], level["served"], len(rows)) == (sent, sent, sent), f"{where}: {level['sent']} sent, " \
        f"{level['served']} served, {len(rows)} rows; want {sent}; first message: {[r['message'] for r in rows][:1]}"
    assert level["busy"] == level["errors"] == level["server_errors"] == level["short"] == 0, level
    assert level["differ"] == 0, f"{where}: {level['differ']} greedy answers differ from the same request alone"
    assert all(r["n_out"] == max_tokens for r in rows), [r["n_out"] for r in rows]
    streamed = [r for r in rows if r["stream"]]
    assert len(streamed) == level["streamed"] == math.ceil(stream_fraction * concurrency) * per_client, level
    assert level["output_tokens"] == sent * max_tokens, level["output_tokens"]
    close(level["output_token_throughput"] * level["duration_s"], sent * max_tokens, "tokens = tok/s x s", 1e-6)
    close(level["request_throughput"] * level["duration_s"], sent, "requests = req/s x s", 1e-6)
    for r in rows:
        assert 0 < r["e2el"] <= level["duration_s"], (r["e2el"], level["duration_s"])
        if r["stream"]:
            assert 0 < r["ttft"] <= r["e2el"], f"TTFT {r['ttft']} > E2EL {r['e2el']}"
            close(r["tpot"], (r["e2el"] - r["ttft"]) / (max_tokens - 1), "TPOT from its row", 1e-9)
            assert all(gap >= 0 for gap in r["itl"]) and r["ttft"] + sum(r["itl"]) <= r["e2el"] + 1e-9, r
        else:
            assert r["ttft"] is None and r["tpot"] is None, r
    assert level["ttft_s"]["n"] == len(streamed) and level["e2el_s"]["n"] == sent, level
    assert level["itl_s"]["n"] == sum(len(r["itl"]) for r in streamed), level["itl_s"]
    for key in ("ttft_s", "tpot_s", "e2el_s"):
        values = [r[key[:-2]] for r in rows if r[key[:-2]] is not None]
        assert min(values) <= level[key]["p50"] <= level[key]["p99"] <= max(values), (key, level[key])
    spec = level["speculative"]
    if spec is not None:  # a chain's i-th draft is accepted only after the (i-1)-th: per position never rises
        assert 0 <= spec["acceptance_rate"] <= 1 and spec["drafted"] >= spec["accepted"], spec
        per = spec["per_position_acceptance"]
        assert all(a >= b for a, b in zip(per, per[1:])), per
        close(spec["mean_accepted_length"], 1 + sum(per), "mean accepted length = 1 + sum per position", 1e-9)


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
    from serve_helpers import bundled_engine, running_server
    engine = bundled_engine()
    with running_server(engine) as url:
        yield url, engine


def test_run_against_a_url_at_concurrency_1_and_2(server, tmp_path):
    import requests
    url, _ = server
    served_before = requests.get(url + "/health", timeout=10).json()["served"]
    out = tmp_path / "run.json"
    done = run_tool("--url", url, "--concurrency", "1,2", "--max_tokens", "4", "--requests_per_client", "2",
                    "--json", str(out))
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    result = json.loads(out.read_text())
    [config] = result["configurations"]
    assert [lv["concurrency"] for lv in config["levels"]] == [1, 2]
    for level, concurrency in zip(config["levels"], (1, 2)):
        check_level(level, concurrency, per_client=2, max_tokens=4)
        header = f"concurrency {concurrency}: {2 * concurrency} requests ({level['streamed']} streamed), 4 tokens each"
        assert header in done.stdout, done.stdout
        assert f"output token throughput {level['output_token_throughput']:.1f} tok/s" in done.stdout
    served_after = config["health_after"]["served"]  # the server's own count: 6 + 4 prompts alone
    assert served_after - served_before == 2 * (1 + 2) + 4, (served_before, served_after)
    assert not list(tmp_path.glob(".run.json.*")), "the temporary file was left behind"
    assert out.stat().st_mode & 0o777 == 0o666 & ~current_umask(), "not open()'s mode (mkstemp's 0600?)"
    # the client's kernel is not the server's: a server reached by --url is asked (its /health reports its own)
    assert config["blas"] == config["health_after"]["blas"] and not config["blas"].startswith("not known"), config
    assert f"server's BLAS kernel: {config['blas']}" in done.stdout and f"BLAS kernel, {url}: {config['blas']}" \
        in done.stdout, done.stdout


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def compare_run(tmp_path, *compare):
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
    out = tmp_path / "compare.json"
    done = run_tool(*compare, "--concurrency", "2", "--max_tokens", "4", "--requests_per_client", "1",
                    "--json", str(out))
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    configs = json.loads(out.read_text())["configurations"]
    for config in configs:
        check_level(config["levels"][0], 2, per_client=1, max_tokens=4)
    assert "vs 1st" in done.stdout and len(re.findall(r"^== ", done.stdout, re.M)) == len(configs), done.stdout
    import gpt2np  # the servers it starts run in this environment: the kernel their start line names
    kernel = gpt2np.blas_kernel().split(",")[0]  # "OpenBLAS 0.3.x SkylakeX" (the threads may differ)
    for config in configs:
        assert config["blas"].startswith(kernel) and "this Python's" not in config["blas"], config["blas"]
        assert f"BLAS kernel, {config['name']}: {config['blas']}" in done.stdout, done.stdout
    return configs, done


def test_compare_starts_one_server_per_value(tmp_path):
    configs, done = compare_run(tmp_path, "--compare", "max_queue=4,16")
    assert [c["name"] for c in configs] == ["--max_queue 4", "--max_queue 16"]
    assert [c["health_after"]["max_queue"] for c in configs] == [4, 16], "the flag did not reach the servers"
    assert done.stderr.count("started: python -m gpt2np.serve") == 2, done.stderr


def test_busy_answers_are_counted_and_retried(tmp_path):
    """A queue of 1 and one generation at a time (--max_batch 1): 8 clients at once (2 requests each)
    must meet 429s; counted, every request is still accounted for; with --retry_busy every one is served
    (4 clients, 1 request each: still twice what the server holds, and each retry waits Retry-After, >= 1 s,
    so every further client would add about a second). 64 tokens a request: a generation lasts far longer than
    starting the clients' threads, so they overlap even when another test process shares the cores (at 8
    tokens, under pytest-xdist, each request was once served before the next client's arrived: no 429)."""
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
    small, tokens = "--max_queue 1 --max_batch 1", 64
    for retry, clients, per_client in ((False, 8, 2), (True, 4, 1)):
        out = tmp_path / f"busy{retry}.json"
        done = run_tool("--serve", small, "--concurrency", str(clients), "--max_tokens", str(tokens),
                        "--requests_per_client", str(per_client), "--json", str(out),
                        *(["--retry_busy"] if retry else []))
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
        [level] = json.loads(out.read_text())["configurations"][0]["levels"]
        rows = level["requests"]
        assert level["served"] + level["busy"] == level["sent"] == len(rows) == clients * per_client, level
        assert level["busy"] == sum(r["status"] == 429 for r in rows), [r["status"] for r in rows]
        if retry:
            assert level["busy"] == 0 and level["busy_retries"] > 0, level
        else:
            assert level["busy"] > 0, "8 clients against a queue of 1 were never told busy"
            assert level["output_tokens"] == tokens * level["served"], level


def test_compare_max_batch(tmp_path):
    configs, done = compare_run(tmp_path, "--compare-max-batch", "1,2")
    assert [c["name"] for c in configs] == ["--max_batch 1", "--max_batch 2"]
    assert [c["health_after"]["max_batch"] for c in configs] == [1, 2], "the flag did not reach the servers"
    assert done.stderr.count("started: python -m gpt2np.serve") == 2, done.stderr


@pytest.fixture(scope="module")
def tool():  # tools/load_test.py as a module
    from conftest import load_tool
    return load_tool("load_test")


@pytest.mark.parametrize("args, says", [
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "1,x"], "--concurrency"),
    (["--max_tokens", "0"], "--max_tokens"),
    (["--stream_fraction", "1.5"], "--stream_fraction"),
    (["--extra", "{not json"], "--extra"),
    (["--extra", "[1, 2]"], "--extra"),
    (["--extra", '{"K": 2, "max_tokens": 64}'], "--max_tokens"),  # the tool's own fields: refused, not overridden
    (["--extra", '{"stream": false}'], "--stream_fraction"),
    (["--extra", '{"prompt": "x"}'], "--prompt"),
    (["--extra", '{"temperature": 1}'], "--temperature"),
    (["--extra", '{"seed": 1}'], "--seed"),
    (["--extra", '{"model": "gpt2"}'], "'model'"),
    (["--extra", '{"max_length": 9}'], "--max_tokens"),
    (["--url", "http://127.0.0.1:9", "--serve", ""], "--url"),
    (["--url", "localhost:8000"], "--url"),
    (["--url", "http://"], "--url: expected http://host:port, got 'http://'"),  # these two were an
    (["--url", "http://[::1"], "--url: expected http://host:port, got 'http://[::1'"),  # UnboundLocalError
    (["--url", "http://host:port"], "--url: expected http://host:port, got 'http://host:port'"),
    # exit status 1 after the run had begun: bad input, caught before any server starts
    (["--compare", "nosuch_flag=1,2"], "--compare nosuch_flag=1,2: python -m gpt2np.serve has no --nosuch_flag flag"),
    (["--serve", "--port 8000"], "--port"),
    (["--compare", "max_queue"], "--compare"),
    (["--compare", "max_queue=1,,2"], "--compare"),
    (["--compare", "max_queue=1", "--compare-max-batch", "1,2"], "--compare"),
    (["--compare-max-batch", "0"], "--compare-max-batch"),
    (["--json", "/no/such/folder/out.json"], "--json"),
    (["--json", str(REPO / "tools")], "--json"),  # a folder: refused before the run, not after it
    (["--json", "/proc/out.json"], "--json /proc/out.json"),  # even as root (os.access says yes): tried
    (["--temperature", "nan"], "--temperature must be a finite number"),
    (["--temperature", "inf"], "--temperature must be a finite number"),
    (["--timeout", "nan"], "--timeout"),
    (["--requests_per_client", "0"], "--requests_per_client"),
])
def test_bad_arguments_are_one_line_and_exit_2(tool, capsys, args, says):
    """The tool's parse_args (main's first step) in this process; test_a_bad_argument_through_the_command_line
    runs one through python tools/load_test.py."""
    with pytest.raises(SystemExit) as exited:
        tool.parse_args(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(lines) == 1 and says in lines[0], (exited.value.code, lines)


def test_a_bad_argument_through_the_command_line():
    done = run_tool("--concurrency", "1,x", timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "--concurrency" in lines[0], (done.returncode, done.stderr)
    assert done.stdout == ""


def test_unreachable_url_is_one_line_and_fails():
    done = run_tool("--url", "http://127.0.0.1:9", "--concurrency", "1", timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "cannot reach" in lines[0], (done.returncode, done.stderr)


def test_a_server_that_cannot_start_is_one_line():
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
    done = run_tool("--serve", "--target_model_size no-such-model", "--concurrency", "1", timeout=120)
    error = [x for x in done.stderr.splitlines() if not x.startswith("started:")]
    assert done.returncode == 1 and len(error) == 1 and "exited with status 2" in error[0], done.stderr


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="finds the server's process in /proc (Linux)")
def test_ctrl_c_stops_the_started_server():
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
    tool = subprocess.Popen([sys.executable, str(TOOL), "--concurrency", "2", "--requests_per_client", "100000"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        started = tool.stderr.readline()  # "started: python -m gpt2np.serve ... --port N --quiet (pid P)"
        found = re.search(r"--port (\d+) .*\(pid (\d+)\)", started)
        assert found, f"expected the started server's port and pid, got {started!r}"
        assert "--quiet" in started, started  # no request lines: the tail printed on errors keeps the error
        port, pid = found.groups()
        deadline = time.monotonic() + 60
        while not served_some(port):  # clients sending: the server has answered some of their requests
            assert time.monotonic() < deadline, "the server did not come up, or answered no request"
            time.sleep(0.05)
        tool.send_signal(signal.SIGINT)
        assert tool.wait(timeout=60) == 130, tool.stderr.read()
        assert not Path(f"/proc/{pid}").exists() or process_state(pid) == "Z", f"server {pid} still running"
    finally:
        if tool.poll() is None:
            tool.kill()


def served_some(port):
    import requests
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["served"] > 0
    except requests.RequestException:
        return False


def process_state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"


def test_the_kernel_of_a_started_server_is_the_one_its_start_line_names(tmp_path):
    """gpt2np.serve prints "serving ... (...; weights W; <gpt2np.blas_kernel()>)" before it answers /health:
    the tool's figures are that process's, whose threads may differ from this one's."""
    from conftest import load_tool
    tool = load_tool("load_test")
    kernel = "OpenBLAS 0.3.31 Haswell, 1 thread, few-row products: rows (M 2-7); small row-major weights: plain"
    with open(tmp_path / "log", "w+") as log:
        log.write("some warning\nserving shakespeare-2.6M with drafters ['shakespeare-260K'] on http://127.0.0.1:1/ "
                  f"(up to 8 at once, 16 waiting; weights row-major; {kernel})\n")
        assert tool.started_kernel(log) == kernel
