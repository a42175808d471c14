"""tools/batch_bench.py: its decode-step pieces on a small random model, and a whole run as a user types it.

The step pieces must leave every cache as they found it (a pair of steps that let a cache grow would
time a longer context with every pair) and pick the same greedy token packed as one at a time (the
two sides do the same work). The run prints its three tables (whole runs, adjacent steps, a step taken
apart), one row per size and batch, every figure a number (the rest, a difference, may read below 0).
"""
import re
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO, load_tool

TOOL = REPO / "tools" / "batch_bench.py"


BENCH = load_tool("batch_bench")
SMALL = gpt2np.GPT2Config(n_vocab=97, n_ctx=32, n_embd=32, n_head=2, n_layer=2)


def test_a_step_puts_the_caches_back_and_both_sides_pick_the_same_tokens():
    model = gpt2np.random_model(SMALL, tokenizer=None, std=0.3)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    together, alone = BENCH.prefilled(model, prompts), BENCH.prefilled(model, prompts)
    for token in (11, 11, 40):  # each step from the same caches: the same picks again for the same token
        picks = {"together": BENCH.packed_step(model, together, token),
                 "alone": BENCH.steps_one_at_a_time(model, alone, token)}
        assert [len(c) for c in together] == [len(c) for c in alone] == [len(p) for p in prompts], "caches not put back"
        assert picks["together"] == picks["alone"] and len(picks["alone"]) == len(prompts), picks
    assert BENCH.packed_step(model, together, 11) == BENCH.steps_one_at_a_time(model, alone, 11) != \
        BENCH.packed_step(model, together, 40), "the picks do not depend on the step's token"


def test_step_ratios_gives_one_reading_per_pair():
    model = gpt2np.random_model(SMALL, tokenizer=None)
    ratios = BENCH.step_ratios({"together": model, "alone": model}, 3, 5, 4, np.random.default_rng(0))
    assert len(ratios) == 4 and all(r > 0 and np.isfinite(r) for r in ratios), ratios


def test_lockstep_sides_decode_every_sequence_and_keep_within_a_step_of_each_other():
    """The two sides of a --lockstep repeat: every sequence decoded to its end, the same tokens as generate_batch,
    the first tokens' seconds (the prefills) counted apart, and neither side ever a packed step ahead."""
    model = gpt2np.random_model(SMALL, tokenizer=None, std=0.3)
    prompts, n_tokens = [[1, 2, 3], [4, 5, 6, 7, 8], [9]], 4
    together, alone = BENCH.Together(model, prompts, n_tokens), BENCH.Alone(model, prompts, n_tokens)
    gaps = []
    for side in (together, alone):
        step = side.step

        def logged(step=step):
            gaps.append(together.emitted - alone.emitted)
            return step()
        side.step = logged
    BENCH.lockstep([together, alone])
    expected = gpt2np.generate_batch(model, prompts, n_tokens)
    assert together.outputs == [stream.tokens for stream in alone.streams] == expected
    assert together.emitted == alone.emitted == len(prompts) * n_tokens
    seconds = [(side.first, side.total) for side in (together, alone)]
    assert all(0 < first < total for first, total in seconds), seconds
    assert min(gaps) >= 0 and max(gaps) <= len(prompts), gaps  # the packed side goes first, then waits for the other


def table_rows(text, header):  # -> the rows of the markdown table under the line starting with header
    lines = text[text.index(header):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| --- "))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.fixture(scope="module")
def runs():
    """{flag: the CompletedProcess} of a 124M run with --lockstep and one with --no-lockstep, started together:
    building the random 124M weights, a third of a run, is one core's work."""
    command = [sys.executable, str(TOOL), "--sizes", "124M", "--batches", "1,2", "--repeats", "1", "--context", "4",
               "--n_tokens", "2", "--step-pairs", "3", "--anatomy", "2"]
    procs = {flag: subprocess.Popen([*command, flag], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for flag in ("--lockstep", "--no-lockstep")}
    outputs = {flag: proc.communicate(timeout=300) for flag, proc in procs.items()}
    return {flag: subprocess.CompletedProcess(p.args, p.returncode, *outputs[flag]) for flag, p in procs.items()}


@pytest.mark.parametrize("lockstep", ["--lockstep", "--no-lockstep"])
def test_a_run_prints_the_whole_run_table_and_the_step_table(runs, lockstep):
    run = runs[lockstep]
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(("OpenBLAS", "not OpenBLAS")), run.stdout[:200]
    assert ("in lockstep" in run.stdout.splitlines()[0]) == (lockstep == "--lockstep"), run.stdout.splitlines()[0]
    whole = table_rows(run.stdout, "| size | B | alone tok/s")
    steps = table_rows(run.stdout, "The decode step alone")
    parts = table_rows(run.stdout, "A decode step taken apart")
    assert [row[:2] for row in whole] == [["124M", "1"], ["124M", "2"]], whole
    assert [row[:3] for row in steps] == [["124M", "1", "3"], ["124M", "2", "3"]], steps
    assert [row[:2] for row in parts] == [["124M", "1"], ["124M", "2"]] and {len(row) for row in parts} == {9}, parts
    numbers = [float(x) for row in whole + steps + parts for x in re.findall(r"\d+\.\d+", " ".join(row[2:]))]
    assert numbers and all(np.isfinite(numbers)), numbers


@pytest.mark.parametrize("flags", [["--step-pairs", "-1"], ["--sizes", "7M"], ["--batches", "0"]])
def test_bad_flags_get_a_usage_error(flags):
    run = subprocess.run([sys.executable, str(TOOL), *flags], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "error:" in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("python tools/batch_bench.py: error: "), run.stderr


@pytest.mark.parametrize("flags, says", [
    (["--batches", "0"], "--batches must be integers >= 1, got 0"),
    (["--batches", "foo"], "argument --batches"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--context", "0"], "--context must be at least 1, got 0"),
    (["--anatomy", "-2"], "--anatomy must be at least 0, got -2"),
    (["--sizes", "foo"], "--sizes foo: 'foo' is not one of"),
    (["--sizes", "124M,"], "--sizes 124M,: '' is not one of"),
    (["--context", "2000"], "--context 2000 + --n_tokens 16 exceeds the context of 124M, 1024 tokens"),  # was a
    (["--sizes", "tiny", "--context", "20"], "exceeds the context of tiny, 32 tokens"),  # traceback after work
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),  # was NumPy's, in a traceback
])
def test_each_bad_flag_is_named_in_its_error(flags, says, capfd):
    """One catch-all message used to list every rule without saying which flag broke one. main() in this
    process: the real one's usage errors are test_bad_flags_get_a_usage_error's."""
    with pytest.raises(SystemExit) as exit_info:
        BENCH.main(flags)
    run = capfd.readouterr()
    assert exit_info.value.code == 2 and says in run.err and "Traceback" not in run.err and run.out == "", run.err
    assert run.err.count("\n") == 1, run.err  # one line: no usage line before it


def test_the_tiny_preset_runs_on_weights_that_cannot_cut_into_panels():
    """--sizes lists tiny (n_embd 16): it ran into "panels need n_embd a multiple of 32"; its weights stay as
    stored where the orders ask for panels, and the table says so."""
    run = subprocess.run([sys.executable, str(TOOL), "--sizes", "tiny", "--batches", "1,2", "--repeats", "1",
                          "--context", "4", "--n_tokens", "2", "--step-pairs", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split(" | ")[:2] for line in run.stdout.splitlines() if line.startswith("| tiny |")]
    assert rows == [["| tiny", "1"], ["| tiny", "2"]] * 2, run.stdout
    if "panels" in run.stdout.splitlines()[0].split("; weights")[-1]:
        assert "(tiny: n_embd 16 does not cut into panels" in run.stdout, run.stdout



def test_where_the_orders_differ_the_packed_side_gets_its_own_copy():
    """Under a kernel whose batches want row-major weights (Haswell's) the packed side runs on a copy in that
    order, the one-at-a-time side on the stored one, the same weights; where they agree, one model."""
    model = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=97, n_ctx=32, n_embd=512, n_head=8, n_layer=1),
                                tokenizer=None)  # a 512 x 2048 MLP weight: large enough to be column-major
    gpt2np.set_weights_order(model, "column-major")                # as stored (loaded: panels under SkylakeX)
    models = BENCH.step_models(model, {"together": "row-major", "alone": "column-major"})
    assert models["alone"] is model and models["together"] is not model
    assert {name: gpt2np.weights_order(m) for name, m in models.items()} == \
        {"together": "row-major", "alone": "column-major"}
    w = [m.params["blocks"][0]["mlp"]["c_fc"]["w"] for m in (models["together"], model)]
    assert w[0].flags.c_contiguous and w[1].T.flags.c_contiguous and np.array_equal(*w)
    same = BENCH.step_models(model, {"together": "column-major", "alone": "column-major"})
    assert same["together"] is same["alone"] is model
