"""Load test for gpt2np's completions server: the serving measures by vLLM's names, per concurrency level.

    python tools/load_test.py                                   # starts a server on the bundled pair itself
    python tools/load_test.py --url http://127.0.0.1:8000       # a running server
    python tools/load_test.py --serve "--target_model_size 124M --draft_model_size none" --max_tokens 32
    python tools/load_test.py --compare-max-batch 1,8 --json out.json   # one server per --max_batch value

At each concurrency level (default 1, 2, 4, 8, 16) that many clients, each a thread with its own HTTP
connection, send --requests_per_client completions one after another, greedy by default, max_tokens
tokens each; the first ceil(stream_fraction x clients) clients stream (server-sent events), the others
do not. Reported per configuration and level (definitions: tools/load_test_stats.py): request and output
token throughput, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p99; TTFT, TPOT and ITL from the
streamed requests), answers refused "busy" (429), errors, served answers without max_tokens tokens,
greedy answers that differ from the same request sent alone (errors, statuses >= 500 above all, and
differing answers are repeated on stderr and make the exit status 1), and the speculative measures
from the rounds each answer reports (the answer's field "gpt2np").

Servers it starts (--serve ARGS, repeatable; --compare FLAG=V1,V2 or --compare-max-batch V1,V2 start
one per value, with --FLAG V appended) listen on 127.0.0.1 on a free port, one at a time, and are stopped
at the end, on errors and on Ctrl-C too. Needs requests only (python main.py's requirements); the servers
need requirements-serve.txt.
"""
import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import requests

from load_test_stats import level_summary, level_table, outcome, overview, request_row

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo", "KING HENRY:\nOnce more", "First Citizen:\nBefore we"]
OWN_FLAGS = ("--host", "--port")  # the tool chooses these for the servers it starts
# request fields the tool sets itself, and the flag that sets each: --extra must not override them
# silently (a stream or max_tokens of --extra's would make the measures lie about what was asked)
OWN_FIELDS = {"prompt": "--prompt", "max_tokens": "--max_tokens", "max_new_tokens": "--max_tokens",
              "max_length": "--max_tokens", "stream": "--stream_fraction", "stream_options": "--stream_fraction",
              "temperature": "--temperature", "seed": "--seed", "model": "none: the tool sends the served model's id"}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_ints(text):  # "1,2,4" -> [1, 2, 4]
    words = text.split(",")
    if not all(w.strip().isdigit() and int(w) > 0 for w in words):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return [int(w) for w in words]


def json_object(text):  # '{"K": 2}' -> {"K": 2}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def parse_args(argv):
    p = OneLineParser(prog="python tools/load_test.py", description=__doc__.split("\n")[0])
    p.add_argument("--url", help="a running server's base URL (default: start servers, see --serve)")
    p.add_argument("--serve", action="append", metavar="ARGS", help="start `python -m gpt2np.serve ARGS` "
                   "(repeat to compare configurations; default: one server with no arguments, the bundled pair); "
                   "ARGS without a space need the form --serve=--flag=value")
    p.add_argument("--compare", metavar="FLAG=V1,V2", help="one server per value, each with --FLAG V appended "
                   "to every --serve configuration, e.g. max_queue=8,16 (default: none)")
    p.add_argument("--compare-max-batch", "--compare_max_batch", dest="compare_max_batch", metavar="V1,V2",
                   type=positive_ints, help="the same as --compare max_batch=V1,V2 (default: none)")
    p.add_argument("--concurrency", type=positive_ints, default=[1, 2, 4, 8, 16], help="levels (default: 1,2,4,8,16)")
    p.add_argument("--requests_per_client", type=int, default=4,
                   help="completions each client sends, one after another (default: %(default)s)")
    p.add_argument("--max_tokens", type=int, default=32, help="tokens asked for per request (default: %(default)s)")
    p.add_argument("--stream_fraction", type=float, default=0.5, help="fraction of clients streaming (default: half)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    p.add_argument("--seed", type=int, default=None,
                   help="with sampling: request i gets seed + i (default: none sent, the server draws a fresh seed "
                        "per request)")
    p.add_argument("--extra", type=json_object, default={}, help='more request fields, e.g. \'{"K": "auto"}\' (not '
                   'the fields the flags set: prompt, max_tokens, stream, temperature, seed, model) (default: none)')
    p.add_argument("--prompt", action="append", help="a prompt (repeatable; default: four Shakespeare openings)")
    p.add_argument("--retry_busy", action="store_true", help="retry a 429 after its Retry-After (default: count it)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request (default: %(default)s)")
    p.add_argument("--start_timeout", type=float, default=300,
                   help="seconds for a started server to answer /health (default: %(default)s)")
    p.add_argument("--json", type=Path, help="also write every number and request here (atomically) (default: none)")
    args = p.parse_args(argv)
    problem = check_args(args)
    if problem:
        p.error(problem)
    return args


def check_args(args):
    """The first problem with the arguments, in one line, or None."""
    for flag in ("requests_per_client", "max_tokens"):
        if getattr(args, flag) < 1:
            return f"--{flag} must be at least 1, got {getattr(args, flag)}"
    if not 0 <= args.stream_fraction <= 1:
        return f"--stream_fraction must be in [0, 1], got {args.stream_fraction}"
    if not 0 <= args.temperature < math.inf:  # nan and inf too: they passed, and failed late in the server
        return f"--temperature must be a finite number >= 0, got {args.temperature}"
    for flag in ("timeout", "start_timeout"):
        if not 0 < getattr(args, flag) < math.inf:
            return f"--{flag} must be a finite number of seconds > 0, got {getattr(args, flag)}"
    own = [key for key in args.extra if key in OWN_FIELDS]
    if own:
        return f"--extra: {own[0]!r} is the tool's own field (flag: {OWN_FIELDS[own[0]]}); leave it out of --extra"
    if args.compare and args.compare_max_batch:
        return "--compare and --compare-max-batch: give one of them"
    if args.url and (args.serve or args.compare or args.compare_max_batch):
        return "--url tests a running server: --serve and --compare start servers of their own"
    if args.url and not url_is_usable(args.url):
        return f"--url: expected http://host:port, got {args.url!r}"
    if args.json:
        problem = json_path_problem(args.json)
        if problem:
            return problem
    try:
        configurations(args)
    except ValueError as e:
        return str(e)
    compared = None if args.url else compare_values(args)
    if compared and not server_has_flag(compared[0]):  # before any server starts: bad input, not a failed run
        typed = f"--compare {args.compare}" if args.compare else "--compare-max-batch"
        return f"{typed}: python -m gpt2np.serve has no --{compared[0]} flag (its --help lists them)"
    return None


def url_is_usable(url):  # an http(s) URL with a host and, if any, a port number ('http://' and 'http://[::1' fail)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  read for its ValueError: a port that is not a number
    except ValueError:  # that, or an unclosed [ of an IPv6 address
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def json_path_problem(path):
    """Why --json cannot be written (one line), or None: checked before any server starts, as write_json
    writes it (a temporary file in its folder, then a rename). The folder is tried by making and removing a
    temporary file: os.access says yes to root even where nothing can be made (/proc)."""
    if path.is_dir() or not path.name:
        return f"--json {path} is a folder: name a file in it, e.g. {path / 'load_test.json'}"
    folder = path.resolve().parent
    if not folder.is_dir():
        return (f"--json {path}: {folder} is not a folder" if folder.exists() else
                f"--json {path}: the folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        return f"--json {path}: cannot write in the folder {folder} ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def compare_values(args):
    """--compare / --compare-max-batch -> (flag, [values]) or None."""
    if args.compare_max_batch:
        return "max_batch", [str(v) for v in args.compare_max_batch]
    if not args.compare:
        return None
    flag, _, values = args.compare.partition("=")
    if not flag or flag.startswith("-") or "" in values.split(","):
        raise ValueError(f"--compare: expected FLAG=V1,V2 (the server's flag without dashes), got {args.compare!r}")
    return flag, values.split(",")


def configurations(args):
    """[(name, server arguments or None for --url)]; ValueError for arguments the tool cannot use."""
    if args.url:
        return [(args.url, None)]
    bases, configs, compared = args.serve or [""], [], compare_values(args)
    for base in bases:
        try:
            words = shlex.split(base)
        except ValueError as e:
            raise ValueError(f"--serve {base!r}: {e}") from None
        if any(w.split("=")[0] in OWN_FLAGS for w in words):
            raise ValueError(f"--serve {base!r}: leave out --host and --port (the tool picks a free port)")
        if compared and f"--{compared[0]}" in [w.split("=")[0] for w in words]:
            raise ValueError(f"--serve {base!r} already sets --{compared[0]}, which --compare varies")
        for extra in ([f"--{compared[0]}", v] for v in compared[1]) if compared else [[]]:
            configs.append((" ".join(words + extra) or "(default)", words + extra))
    return configs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_has_flag(flag):
    """Whether `python -m gpt2np.serve --help` lists --flag (before any server is started for it)."""
    done = subprocess.run([sys.executable, "-m", "gpt2np.serve", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    return f"--{flag}" in done.stdout.replace("=", " ").split()


@contextlib.contextmanager
def started_server(server_args, start_timeout):
    """python -m gpt2np.serve ARGS on 127.0.0.1 and a free port until the block ends, stopped however it
    ends; yields (its URL, a function returning the last lines of its stderr, its BLAS kernel). --quiet: a
    line per request would push an error's lines out of the tail this tool prints when requests fail."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    command = [sys.executable, "-m", "gpt2np.serve", *server_args, "--host", "127.0.0.1", "--port", str(port),
               "--quiet"]  # no line per request: the log's last lines are kept for what went wrong
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    print(f"started: python {shlex.join(command[1:])} (pid {process.pid})", file=sys.stderr, flush=True)
    try:
        wait_for_health(f"http://127.0.0.1:{port}", process, lambda: log_tail(log, 1), start_timeout)
        yield f"http://127.0.0.1:{port}", lambda: log_tail(log, 8), started_kernel(log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


SERVING_LINE = re.compile(r"^serving .*; weights [^;]*; (?P<kernel>.+)\)\s*$")  # gpt2np.serve's start line


def started_kernel(log):
    """The BLAS kernel of a server this tool started: the one its start line names ("serving ... (...; weights
    ...; <gpt2np.blas_kernel()>)", printed before it answers /health), else this Python's, which started it."""
    log.seek(0)
    for line in log.read().splitlines():
        found = SERVING_LINE.match(line)
        if found:
            return found["kernel"]
    done = subprocess.run([sys.executable, "-c", "import gpt2np; print(gpt2np.blas_kernel())"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    mine = done.stdout.strip() or "not known"
    return f"{mine} (this Python's: the server's start line did not name its own; its threads may differ)"


def url_kernel(url):
    """The BLAS kernel of a server at --url, if its /health or /v1/models reports one ("blas"); gpt2np.serve's
    do not: the client's own kernel is not the server's, so it is said to be unknown."""
    for path, find in (("/health", lambda d: d.get("blas")),
                       ("/v1/models", lambda d: (d["data"][0].get("gpt2np") or {}).get("blas"))):
        with contextlib.suppress(requests.RequestException, ValueError, KeyError, IndexError, TypeError,
                                 AttributeError):
            kernel = find(requests.get(url + path, timeout=30).json())
            if kernel:
                return str(kernel)
    return "not known: the server's /health and /v1/models do not report it (gpt2np.serve names it on its stderr)"


def log_tail(log, n):
    log.seek(0)
    return [x for x in log.read().splitlines() if x.strip()][-n:]


def wait_for_health(url, process, last_line, start_timeout):
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}: "
                               f"{(last_line() or ['no message'])[0]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/health", timeout=5).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer /health within {start_timeout:g} s")


def request_body(args, model, prompt, stream, index):
    body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "stream": stream, **args.extra}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if args.seed is not None:
        body["seed"] = args.seed + index
    return body


def one_request(session, url, body, timeout, retry_busy):
    """Send one completion; -> its record: outcome (served / busy / server_error / error), status,
    start, end, n_out, text, the token-carrying chunks' arrival times, the rounds, busy_retries, message."""
    record = {"stream": body["stream"], "start": time.perf_counter(), "n_out": 0, "text": "", "arrivals": [],
              "rounds": [], "busy_retries": 0, "status": None, "message": None}
    try:
        while True:
            answer = session.post(url + "/v1/completions", json=body, stream=body["stream"], timeout=timeout)
            if answer.status_code != 429 or not retry_busy:
                break
            record["busy_retries"] += 1
            time.sleep(min(float(answer.headers.get("Retry-After", 1)), 10))
        record["status"] = answer.status_code
        if answer.status_code == 200:
            (read_stream if body["stream"] else read_whole)(answer, record)
        else:
            record["message"] = error_message(answer)
    except Exception as e:  # noqa: BLE001 (no connection, a broken stream, an unreadable body: all recorded)
        record["message"] = f"{type(e).__name__}: {e}"
    record["end"] = time.perf_counter()
    record["outcome"] = outcome(record)
    return record


def error_message(answer):
    try:
        return str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return answer.text[:200]


def read_whole(answer, record):
    body = answer.json()
    record["text"] = body["choices"][0]["text"]
    record["n_out"] = body["usage"]["completion_tokens"]
    record["rounds"] = (body.get("gpt2np") or {}).get("rounds") or []


def read_stream(answer, record):
    """Server-sent events: each chunk's arrival time if it carries tokens, its round, the closing usage."""
    streamed = 0
    for line in answer.iter_lines():
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        event, now = json.loads(line[6:]), time.perf_counter()
        if "error" in event:  # the status was already 200: the generation failed on the way
            record["message"] = f"streamed error: {event['error'].get('message')}"
            return
        if not event.get("choices"):  # include_usage's last event (OpenAI's): no choices, the usage
            record["n_out"] = (event.get("usage") or {}).get("completion_tokens", record["n_out"])
            continue
        extension = event.get("gpt2np") or {}
        n = len(extension.get("tokens") or []) if "tokens" in extension else int(bool(event["choices"][0]["text"]))
        if n:
            record["arrivals"].append(now)
            streamed += n
        record["text"] += event["choices"][0]["text"]
        if extension.get("round"):
            record["rounds"].append(extension["round"])
        record["n_out"] = (event.get("usage") or {}).get("completion_tokens", record["n_out"])
    record["n_out"] = record["n_out"] or streamed


def run_level(url, model, args, prompts, concurrency):
    """`concurrency` client threads at once; -> (their records, the level's wall time in seconds)."""
    streaming = math.ceil(args.stream_fraction * concurrency)
    records, lock = [], threading.Lock()

    def client(c):
        with requests.Session() as session:
            for j in range(args.requests_per_client):
                index = c * args.requests_per_client + j
                prompt = prompts[(c + j) % len(prompts)]
                body = request_body(args, model, prompt, c < streaming, index)
                record = one_request(session, url, body, args.timeout, args.retry_busy)
                with lock:
                    records.append({**record, "client": c, "prompt": prompt})

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)  # short waits: Ctrl-C reaches the main thread
    return records, time.perf_counter() - start


def references(url, model, args, prompts):
    """Each prompt's greedy answer sent alone (also the warm-up); {} when sampling. A refused one stops the run."""
    found = {}
    with requests.Session() as session:
        for prompt in prompts:
            record = one_request(session, url, request_body(args, model, prompt, False, 0), args.timeout, True)
            if record["outcome"] != "served":
                raise RuntimeError(f"the first request alone was answered {record['status']}: {record['message']}")
            found[prompt] = record["text"]
    return found if args.temperature == 0 else {}


def measure(url, args, name, kernel):
    """Every concurrency level against one server (whose BLAS kernel is `kernel`); prints each level's table
    and returns the results."""
    try:
        answer = requests.get(url + "/v1/models", timeout=30)
        model = answer.json()["data"][0]["id"]
    except requests.ConnectionError:
        raise RuntimeError(f"cannot reach {url} (is the server running?)") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise RuntimeError(f"GET {url}/v1/models answered {answer.status_code} without a model: is {url} the "
                           f"base URL of an OpenAI-compatible server?") from None
    prompts = args.prompt or PROMPTS
    print(f"-- {name}: server's BLAS kernel: {kernel}", flush=True)
    alone = references(url, model, args, prompts)
    levels = []
    for concurrency in args.concurrency:
        records, duration = run_level(url, model, args, prompts, concurrency)
        level = {"concurrency": concurrency, "max_tokens": args.max_tokens,
                 "streamed": sum(r["stream"] for r in records),
                 **level_summary(records, duration, args.max_tokens),
                 "differ": sum(r["outcome"] == "served" and r["prompt"] in alone and r["text"] != alone[r["prompt"]]
                               for r in records),
                 "requests": [request_row(r) for r in records]}
        print("\n".join(level_table(name, level)), flush=True)
        shout(name, level)
        levels.append(level)
    health = requests.get(url + "/health", timeout=30).json()
    return {"name": name, "url": url, "model": model, "blas": kernel, "health_after": health, "levels": levels}


def shout(name, level):
    """Failures go to stderr as well, loudly, with the first message of each kind."""
    where = f"!! {name} | concurrency {level['concurrency']}"
    for kind, label in (("server_error", "SERVER ERRORS (status >= 500)"), ("error", "errors")):
        if level[kind + "s"]:
            first = next(r["message"] for r in level["requests"] if r["outcome"] == kind)
            print(f"{where}: {level[kind + 's']} {label}; first: {first}", file=sys.stderr, flush=True)
    if level["differ"]:
        print(f"{where}: {level['differ']} greedy answers differ from the same request sent alone",
              file=sys.stderr, flush=True)


def write_json(path, data):
    """Write through a temporary name in the same folder and rename: a reader never sees half a file."""
    fd, temporary = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have made (0644 under umask 022)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def run(args):
    results = []  # --compare's flag: checked by check_args, before any server starts
    for name, server_args in configurations(args):
        with contextlib.ExitStack() as stack:
            url, log, kernel = (args.url, None, None) if args.url else stack.enter_context(
                started_server(server_args, args.start_timeout))
            url = url.rstrip("/").removesuffix("/v1")
            results.append(measure(url, args, name, kernel or url_kernel(url)))
            if log and any(lv["server_errors"] for lv in results[-1]["levels"]):
                print("\n".join(f"!! server log: {line}" for line in log()), file=sys.stderr)
    print("\n" + "\n".join(overview(results)))
    for r in results:  # every tok/s and latency above was measured on this kernel
        print(f"BLAS kernel, {r['name']}: {r['blas']}")
    if args.json:
        write_json(args.json, {"tool": "tools/load_test.py", "argv": sys.argv[1:], "date": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "configurations": results})
    failed = sum(lv["server_errors"] + lv["errors"] + lv["differ"] for r in results for lv in r["levels"])
    if failed:
        print(f"!! {failed} requests failed or differ from alone (the lines starting with !! above)",
              file=sys.stderr)
    return 1 if failed else 0


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even where the shell ignored it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # both unwind through started_server's cleanup
    try:
        return run(args)
    except KeyboardInterrupt:
        print("python tools/load_test.py: interrupted; servers stopped", file=sys.stderr)
        return 130
    except (RuntimeError, requests.RequestException, ValueError, KeyError) as e:
        print(f"python tools/load_test.py: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
