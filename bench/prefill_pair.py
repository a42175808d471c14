"""Prefill against Hugging Face transformers, in two worker processes that take turns.

Part of the hf section (runs only when torch and transformers import). For each size the parent
starts two long-lived workers (prefill_worker.py): `numpy` (gpt2np.random_model of the size's
shape) and `hf` (transformers' GPT2LMHeadModel of the same config, fp32, eval, no_grad), each with
the run's --threads as its BLAS (and torch) thread limit. Each builds its model once and says
`ready`. Then, for every prompt length n in plan.prefill_lens:
  - one warm-up turn each (untimed), then `repeats` rounds of one timed turn each, the order
    swapped every round (numpy first, then hf first, ...), ~50 ms of sleep before every turn;
  - a turn is one prefill of the same n random ids (bench.common.random_ids) into an empty cache,
    logits of the last row, timed inside the worker around the forward call alone.
Separate processes, so neither library's threads, allocator or BLAS state touch the other's, and
taking turns puts both through the same drift of this shared host. Reported per length: numpy_s
and hf_s (medians), their minimums, numpy_over_hf = the median of the per-round ratios.
Workers are killed on the way out, whatever happened (try/finally): no process outlives the run.
"""
import json
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from .common import log, median

REPO = Path(__file__).resolve().parents[1]  # workers run `python -m bench.prefill_worker` from here
PAUSE_S = 0.05                              # sleep before each turn: the other worker's threads settle


class WorkerError(RuntimeError):
    """A worker died, said something outside the protocol, or could not run a command."""


class Worker:
    """One worker process and its side of the line protocol (prefill_worker.py's docstring)."""

    def __init__(self, kind, config, threads=None, label=None):
        self.kind, self.label = kind, label or kind
        cmd = [sys.executable, "-m", "bench.prefill_worker", kind, "--config", json.dumps(asdict(config))]
        cmd += ["--threads", str(threads)] if threads else []
        self.stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty worker cannot block
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, bufsize=1)
        self.info = None

    def wait_ready(self):
        """Block until the model is built; returns the worker's description (the `ready` line's JSON)."""
        word, rest = self.reply()
        if word != "ready":
            raise WorkerError(f"{self.label} worker: expected `ready`, got {word!r} {rest[:200]!r}")
        self.info = json.loads(rest)
        return self.info

    def prefill(self, n):
        """Seconds of one prefill of n tokens, timed in the worker."""
        self.send(f"prefill {n}")
        word, rest = self.reply()
        if word != "seconds":
            raise WorkerError(f"{self.label} worker, prefill {n}: {word} {rest}")
        return float(rest)

    def send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError(f"{self.label} worker is gone ({e}){self.stderr_tail()}") from None

    def reply(self):
        line = self.proc.stdout.readline()
        if not line:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise WorkerError(f"{self.label} worker exited with code {self.proc.returncode}{self.stderr_tail()}")
        word, _, rest = line.strip().partition(" ")
        return word, rest

    def stderr_tail(self, n=1500):
        self.stderr.flush()
        self.stderr.seek(0)
        text = self.stderr.read()[-n:].strip()
        return f"; its stderr ends:\n{text}" if text else ""

    def close(self):
        """Ask it to quit; kill it if it does not within a few seconds (or at once if that fails)."""
        try:
            if self.proc.poll() is None:
                self.send("quit")
                self.proc.wait(timeout=5)
        except (WorkerError, subprocess.TimeoutExpired, OSError):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout, self.stderr):
                try:
                    f.close()
                except OSError:
                    pass


@contextmanager
def workers(config, threads=None, kinds=("numpy", "hf"), labels=None):
    """{label: ready Worker} for the duration of the block, all killed on the way out (errors,
    KeyboardInterrupt included). Both are started before either is waited for: they load at once."""
    labels = labels or kinds
    started = {}
    try:
        for kind, label in zip(kinds, labels):
            started[label] = Worker(kind, config, threads, label)
        for w in started.values():
            w.wait_ready()
        yield started
    finally:
        for w in started.values():
            w.close()


def measure_length(pair, n, repeats, pause=PAUSE_S):
    """One warm-up turn each, then `repeats` rounds of alternating timed turns (order swapped every
    round); pair = {"numpy": Worker, "hf": Worker}, or any two labels (the first is the numerator)."""
    a, b = list(pair)
    for label in (a, b):
        pair[label].prefill(n)
    times = {a: [], b: []}
    for r in range(repeats):
        for label in ((a, b) if r % 2 == 0 else (b, a)):
            time.sleep(pause)
            times[label].append(pair[label].prefill(n))
    return {"n_tokens": n, f"{a}_s": median(times[a]), f"{a}_s_min": min(times[a]),
            f"{b}_s": median(times[b]), f"{b}_s_min": min(times[b]),
            f"{a}_over_{b}": median([x / y for x, y in zip(times[a], times[b])]), "rounds": repeats}


def run(size, config, lengths, repeats, threads=None):
    """(per length {str(n): result}, the workers' descriptions) for one size; see the module docstring."""
    log(f"{size}: prefill against Hugging Face, alternating worker processes (starting them)")
    with workers(config, threads) as pair:
        info = {label: w.info for label, w in pair.items()}
        out = {}
        for n in lengths:
            log(f"{size}: prefill of {n} tokens, gpt2np and Hugging Face taking turns")
            out[str(n)] = measure_length(pair, n, repeats)
    return out, info
