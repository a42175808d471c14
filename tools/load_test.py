"""Load test for python -m gpt2np.serve: throughput, latency, time to first token, bad requests.

    python tools/load_test.py                        # starts a server on the bundled pair itself
    python tools/load_test.py --url http://127.0.0.1:8000 --clients 32 --requests 4

C clients send R requests each at once, alternating streaming and non-streaming completions of
max_tokens tokens at temperature 0 (the answer is checked against the first one of its prompt);
a 429 is retried after the server's Retry-After. Reports requests per second, p50/p99 latency
(first attempt to last byte, retries included), time to the first streamed token, how many
requests were refused 429 first, and then sends tests/serve/test_serve_bad_requests.py's table of bad
requests and counts the statuses (a 500 there is a bug). Needs requests only (and the server's
requirements when it starts one).
"""
import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo", "KING HENRY:\nOnce more", "First Citizen:\nBefore we"]


def start_server(max_queue):
    """python -m gpt2np.serve on a free port, with the body limit the bad-request table expects."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "gpt2np.serve", "--port", str(port), "--max_queue",
                                str(max_queue), "--max_body_bytes", "65536"], cwd=REPO, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            requests.get(url + "/health", timeout=2)
            return url, process
        except requests.ConnectionError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the server did not start")


def one_request(url, model, prompt, max_tokens, stream):
    """-> (text, seconds to the last byte, seconds to the first token or None, 429s seen)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    start, refused = time.perf_counter(), 0
    while True:
        answer = requests.post(url + "/v1/completions", json=body, stream=stream, timeout=600)
        if answer.status_code != 429:
            break
        refused += 1
        time.sleep(float(answer.headers.get("Retry-After", 1)))
    answer.raise_for_status()
    if not stream:
        return answer.json()["choices"][0]["text"], time.perf_counter() - start, None, refused
    text, first = "", None
    for line in answer.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and line != "data: [DONE]":
            piece = json.loads(line[6:])["choices"][0]["text"]
            if piece and first is None:
                first = time.perf_counter() - start
            text += piece
    return text, time.perf_counter() - start, first, refused


def load(url, model, clients, per_client, max_tokens):
    results, lock = [], threading.Lock()

    def client(c):
        for r in range(per_client):
            prompt = PROMPTS[(c + r) % len(PROMPTS)]
            outcome = one_request(url, model, prompt, max_tokens, stream=(c + r) % 2 == 0)
            with lock:
                results.append((prompt, (c + r) % 2 == 0, *outcome))

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return results, time.perf_counter() - start


def bad_requests(url):
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from test_serve_bad_requests import CASES  # the same table the tests send
    statuses = {}
    for case, path, body, _, _ in CASES:
        answer = requests.post(url + path, data=body() if callable(body) else body,
                               headers={"Content-Type": "application/json"}, timeout=60)
        statuses.setdefault(answer.status_code, []).append(case)
    return statuses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="a running server, started with --max_body_bytes 65536 for the "
                   "table's oversized cases (default: start one on the bundled pair)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--max_tokens", type=int, default=32)
    p.add_argument("--max_queue", type=int, default=32, help="the started server's queue (--url: the server's own)")
    args = p.parse_args()
    url, process = (args.url, None) if args.url else start_server(args.max_queue)
    try:
        model = requests.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        one_request(url, model, PROMPTS[0], args.max_tokens, False)  # warm-up
        results, seconds = load(url, model, args.clients, args.requests, args.max_tokens)
        first_text = {}
        wrong = sum(first_text.setdefault(prompt, text) != text for prompt, _, text, *_ in results)
        latency = np.array([r[3] for r in results])
        ttft = np.array([r[4] for r in results if r[1] and r[4] is not None])
        print(f"{len(results)} requests ({args.clients} clients x {args.requests}, {args.max_tokens} tokens each, "
              f"half streamed) in {seconds:.2f} s: {len(results) / seconds:.1f} requests/s, "
              f"{len(results) * args.max_tokens / seconds:.0f} tokens/s; {wrong} answers differ from their prompt's first")
        print(f"latency p50 {np.percentile(latency, 50):.3f} s, p99 {np.percentile(latency, 99):.3f} s; "
              f"time to first streamed token p50 {np.percentile(ttft, 50):.3f} s, p99 {np.percentile(ttft, 99):.3f} s")
        print(f"refused with 429 first: {sum(r[5] for r in results)} times")
        one = one_request(url, model, PROMPTS[0], args.max_tokens, True)
        print(f"time to first streamed token, server idle: {one[2] * 1000:.1f} ms")
        statuses = bad_requests(url)
        print("bad-request table: " + ", ".join(f"{s}: {len(c)}" for s, c in sorted(statuses.items())) +
              ("" if any(s >= 500 for s in statuses) else "  (no 5xx)"))
        for s in (s for s in statuses if s >= 500 or s < 400):
            print(f"  {s}: {statuses[s]}")
        print("health after:", requests.get(url + "/health", timeout=10).json())
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
