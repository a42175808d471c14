"""The prefill pair's worker processes (bench/prefill_pair.py, bench/prefill_worker.py) on a tiny config.

The protocol and the turn-taking are checked with two gpt2np workers (no torch needed); the
Hugging Face worker only where torch and transformers import. No timing assertions: every number
only has to be a positive time. Every test also checks that no worker outlives its block.
"""
import math
import sys
from pathlib import Path

import pytest

from gpt2np.model.config import PRESETS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

from bench import hf, prefill_pair  # noqa: E402
from bench.prefill_pair import Worker, WorkerError, measure_length, workers  # noqa: E402

TINY = PRESETS["tiny"]  # n_ctx 32


def positive(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def all_exited(pair):
    return all(w.proc.poll() is not None for w in pair.values())


def test_two_workers_take_turns_and_quit():
    """Two gpt2np workers in the numpy and hf seats: what the parent measures, and a clean exit."""
    with workers(TINY, threads=1, kinds=("numpy", "numpy"), labels=("numpy", "hf")) as pair:
        assert {w.info["impl"] for w in pair.values()} == {"gpt2np"}
        assert all(w.info["threads_requested"] == 1 for w in pair.values())
        r = measure_length(pair, 8, repeats=3, pause=0)
    assert all_exited(pair) and all(w.proc.returncode == 0 for w in pair.values())  # `quit` honoured
    assert r["n_tokens"] == 8 and r["rounds"] == 3
    for key in ("numpy_s", "numpy_s_min", "hf_s", "hf_s_min", "numpy_over_hf"):
        assert positive(r[key]), key
    assert r["numpy_s_min"] <= r["numpy_s"]


def test_a_command_the_worker_cannot_run_is_an_error_and_the_worker_goes_on():
    with workers(TINY, kinds=("numpy",)) as pair:
        w = pair["numpy"]
        with pytest.raises(WorkerError, match="exceed the context"):
            w.prefill(TINY.n_ctx + 1)
        w.send("bogus")
        assert w.reply()[0] == "error"
        assert positive(w.prefill(TINY.n_ctx))
    assert all_exited(pair)


def test_a_dead_worker_is_an_error_not_a_hang():
    with workers(TINY, kinds=("numpy",)) as pair:
        w = pair["numpy"]
        w.proc.kill()
        w.proc.wait()
        with pytest.raises(WorkerError, match="gone|exited"):
            w.prefill(8)


def test_workers_are_killed_on_an_exception():
    started = {}
    with pytest.raises(KeyboardInterrupt):
        with workers(TINY, kinds=("numpy", "numpy"), labels=("a", "b")) as pair:
            started.update(pair)
            raise KeyboardInterrupt
    assert len(started) == 2 and all_exited(started)


def test_a_worker_that_fails_to_start_reports_its_stderr():
    with pytest.raises(WorkerError, match="exited with code 2(.|\n)*invalid choice"):
        with workers(TINY, kinds=("no-such-kind",)):
            pass


def test_hf_worker_answers():
    reason = hf.available()
    if reason:
        pytest.skip(reason)
    with workers(TINY, threads=1, kinds=("hf",)) as pair:
        w = pair["hf"]
        assert w.info["impl"] == "hf" and w.info["torch_threads"] == 1
        assert w.info["hf_call"] in ("logits_to_keep", "num_logits_to_keep", "plain")
        assert positive(w.prefill(8)) and positive(w.prefill(TINY.n_ctx))
    assert all_exited(pair)
    assert prefill_pair.REPO == REPO
