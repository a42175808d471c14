"""python -m gpt2np.classroom: runs, prints the table, passes the real sampler, rejects the broken
ones, and answers bad flags with one line on stderr and exit status 2.

Most tests call main(argv) in-process with a small --n_samples (fast); one runs the real
`python -m` entry point. The classroom's defaults use model seed 16, where every bug has a large
effect (see test_distribution_statistical.py), so even 300 samples reject every broken variant.
Where a bug cannot act (K = 1, one token, no drafts) or is too small for n samples, the summary
must say so beside the exact distance from the target, not read as a miss of the test; where no
test is possible (everything pooled into one bin) the run is refused before any sampling.
"""
import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt2np.teach.broken_kernels import unnormalised_residual_kernel
from gpt2np.teach.classroom import (NEGATIVE_CONTROLS, __doc__ as CLASSROOM_DOC, decision, format_experiment,
                                    format_row, format_summary, main, recovery_experiment, toy_pair, verdict)
from gpt2np.teach.exact import exact_distribution

REPO = Path(__file__).resolve().parents[2]
FAST = ["--n_samples", "300"]


def run_main(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr().out
    return status, out


@pytest.fixture(scope="module")
def fast_run():
    """run_main(capsys, *FAST) once for the tests that only read it: (status, stdout)."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        status = main(list(FAST))
    return status, out.getvalue()


def section(out, number):
    """The text of section `number` ("1.", "2.", "3.") of the classroom output."""
    return re.split(r"^\d\. ", out, flags=re.M)[number]


def summary_rows(out):
    """{variant: its line} of section 3 (without the header and the "TV n/a" note)."""
    rows = [line for line in section(out, 3).splitlines()[1:] if not line.startswith("  TV n/a")]
    return {line.split()[0]: line for line in rows}


def test_prints_the_table_and_passes_the_real_sampler(fast_run):
    status, out = fast_run
    assert status == 0
    real = section(out, 1)
    assert "outcome" in real and "target P" in real and "observed" in real
    rows = [line for line in real.splitlines() if re.match(r"^  [A-C]( [A-C]){2} ", line)]
    assert len(rows) == 27                                          # 3 tokens, 3 positions: 3^3 outcomes
    assert sum(float(row.split()[3]) for row in rows) == pytest.approx(1.0, abs=1e-3)  # target P column
    assert sum(int(row.split()[5]) for row in rows) == 300                            # observed column
    assert "verdict: consistent with the target distribution" in real and "REJECTED" not in real


def test_rejects_the_broken_sampler_shown_and_every_variant_in_the_summary(capsys):
    status, out = run_main(capsys, *FAST, "--broken", "softmax_residual")
    assert status == 0
    assert "softmax_residual" in section(out, 2) and "verdict: REJECTED" in section(out, 2)
    summary = summary_rows(out)
    assert len(summary) == len(NEGATIVE_CONTROLS) == len(section(out, 3).splitlines()[1:])
    assert all(line.rstrip().endswith("REJECTED") for line in summary.values()), summary
    assert all(re.search(r" TV 0\.\d{3} ", line) for line in summary.values()), summary  # exact distances


def test_options_reach_the_samplers(capsys):
    status, out = run_main(capsys, "--n_samples", "200", "--n_vocab", "4", "--order", "3", "--n_tokens", "2",
                           "--K", "3", "--temperature", "0.7", "--top_k", "3", "--top_p", "0.95",
                           "--seed", "5")
    assert status == 0
    assert "vocabulary A B C D" in out and "K = 3" in out and "top_k 3" in out and "rng seed 5" in out
    assert "verdict: consistent with the target distribution" in section(out, 1)
    # N = 2: one round drafts, so first_position_only IS the real kernel (it read "not detected"); the
    # greedy draft and the unnormalised residual are real bugs, but too small for 200 samples
    summary = summary_rows(out)
    first = summary["first_position_only"]
    assert " TV 0 " in first and "identical to the target here" in first
    assert re.search(r"TV 0\.021 .* too small for 200 samples \(about \d+ would show it\)", summary["greedy_draft"])
    assert re.search(r"TV 0\.039 .* too small for 200 samples \(about \d+ would show it\)",
                     summary["unnormalised_residual"])
    assert summary["softmax_residual"].rstrip().endswith("REJECTED")


def test_a_bug_that_cannot_act_reads_identical_not_undetected(capsys):
    """K = 1: first_position_only has no second draft to wave through; one token: no round drafts at all."""
    _, out = run_main(capsys, *FAST, "--K", "1")
    summary = summary_rows(out)
    first = summary["first_position_only"]
    assert " TV 0 " in first and "identical to the target here" in first
    assert all(summary[name].rstrip().endswith("REJECTED") for name in summary if name != "first_position_only")
    _, out = run_main(capsys, *FAST, "--n_tokens", "1")
    assert "drafts: none were made" in section(out, 1)
    assert all(" TV 0 " in line and "identical to the target here" in line for line in summary_rows(out).values())


def test_auto_K_with_the_draft_model_says_that_it_drafted_nothing(capsys):
    """--K auto with the toy draft model never drafts on 3-token runs: every sampler is plain
    decoding. The summary read "not detected" for all four bugs, as if the test had missed them."""
    _, out = run_main(capsys, *FAST, "--K", "auto")
    assert "drafts: none were made" in section(out, 1)
    summary = summary_rows(out)
    assert len(summary) == len(NEGATIVE_CONTROLS)
    assert all("TV n/a" in line and "no drafts made: plain decoding, the bug never acted" in line
               for line in summary.values()), summary


def test_the_z_column_is_described_as_it_is(fast_run):
    """z = (O - E) / sqrt(E) has spread sqrt(1 - P), not 1, and is far from normal where E < 1
    (it said "roughly N(0, 1)"); a row expected 0.04 times and seen once is not flagged."""
    _, out = fast_run
    assert "N(0, 1)" not in out
    assert "mean 0 and spread sqrt(1 - P)" in section(out, 1) and "far from normal below ~1" in section(out, 1)
    assert not format_row((0, 1, 2), 0.0001, 1, 400).endswith("<-")  # z = 4.8 from one draw of a 4% event
    assert format_row((0, 1, 2), 0.1, 80, 400).endswith("<-")        # z = 6.3 on 40 expected: suspicious


def test_no_test_possible_is_said_not_consistent():
    """One pooled bin: there is nothing to test. The verdicts said "consistent with the target
    distribution (p >= 0.001)" and the summary "not detected", from a p-value of 1."""
    target, draft = toy_pair(model_seed=16)
    real = recovery_experiment(target, draft, 3, 2, {}, n_samples=10, seed=0)
    broken = recovery_experiment(target, draft, 3, 2, {}, n_samples=10, seed=0, variant="greedy_draft")
    assert not real.result.tested and real.result.p_value is None
    assert verdict(real.result, 1e-3).startswith("no test possible: every outcome pooled into one bin")
    assert "verdict: no test possible" in format_experiment("1.", real, 1e-3, max_rows=5)
    assert "consistent" not in format_experiment("1.", real, 1e-3, max_rows=5)
    assert decision(broken, 1e-3) == "no test possible (one bin)"
    assert "no test possible (one bin)" in format_summary({"greedy_draft": broken}, 1e-3, K=2)


def test_prompt_lookup_drafter_with_auto_K_passes_and_its_negative_controls_fail(capsys):
    """The classroom command the README gives for prompt lookup: the real sampler passes, the broken
    one shown and every variant that applies to a drafter without a model are rejected."""
    status, out = run_main(capsys, *FAST, "--drafter", "ngram", "--K", "auto")
    assert status == 0
    assert "drafter: prompt lookup (ngram)" in out
    assert "verdict: consistent with the target distribution" in section(out, 1)
    assert "softmax_residual" in section(out, 2) and "verdict: REJECTED" in section(out, 2)
    summary = summary_rows(out)
    assert len(summary) == len(NEGATIVE_CONTROLS) - 1 and "greedy_draft" not in summary, summary
    assert all(line.rstrip().endswith("REJECTED") for line in summary.values()), summary
    assert "TV n/a: with K auto each round's K follows the clock" in section(out, 3)  # not enumerable


def test_every_example_in_the_docstring_says_how_long_it_takes():
    """The second example took 78 s (5 samplers x 20,000 runs) with nothing to say so."""
    examples = [line for line in CLASSROOM_DOC.splitlines() if "python -m gpt2np.classroom" in line]
    assert len(examples) == 3
    assert all(re.search(r"#.*\b(\d+(-\d+)? s|seconds)\b", line) for line in examples), examples
    assert all(int(n) <= 5000 for line in examples for n in re.findall(r"--n_samples (\d+)", line))


def test_same_seed_same_output(capsys, fast_run):
    """A second run in the same process (fast_run's was the first) prints the same, character for character."""
    assert run_main(capsys, *FAST) == fast_run


def test_long_tables_are_cut_at_max_rows(capsys):
    _, out = run_main(capsys, "--n_samples", "100", "--n_vocab", "4", "--n_tokens", "2", "--max_rows", "5")
    assert "11 rarer outcomes" in section(out, 1)  # 4^2 = 16 outcomes, 5 shown (4^3 took 2 s to enumerate)


@pytest.mark.parametrize("argv, message", [
    (["--n_samples", "0"], "--n_samples"),
    (["--K", "-1"], "--K"),
    (["--n_tokens", "x"], "--n_tokens"),
    (["--temperature", "0"], "temperature must be > 0"),
    (["--temperature", "-1"], "temperature must be"),
    (["--top_p", "1.5"], "top_p must be in (0, 1]"),
    (["--n_vocab", "27"], "--n_vocab must be between 2 and 8"),
    (["--n_vocab", "8", "--n_tokens", "5"], "too many to enumerate"),
    (["--alpha", "1"], "--alpha must be in (0, 1)"),
    (["--broken", "nonsense"], "--broken"),
    (["--no_such_flag"], "unrecognized arguments"),
    (["--seed", "-1"], "--seed: must be an integer >= 0, got -1"),  # was numpy's ValueError, in a traceback
    (["--model_seed", "-3"], "--model_seed: must be an integer >= 0, got -3"),
    (["--drafter", "ngram", "--broken", "greedy_draft"], "--broken greedy_draft needs the draft model"),  # before
    # any work: it used to come after the real sampler's experiment had run and printed
    # every outcome pooled into one bin: this ran and printed "consistent with the target distribution"
    (["--n_vocab", "8", "--n_tokens", "4", "--n_samples", "100"],
     "no test possible: with --n_samples 100 every outcome pools into one bin (expected counts below 20); "
     "use --n_samples 1184 or more"),
    (["--n_samples", "1"], "no test possible: with --n_samples 1 every outcome pools into one bin"),
    (["--top_k", "1"], "the target has one possible outcome here (B B B): nothing random to test"),
    (["--top_p", "0.5"], "the target has one possible outcome here"),
    # max(probs) rounds to 1 below --temperature 0.01: samples_for_a_test divided by 1 - 1.0 (ZeroDivisionError)
    (["--temperature", "1e-3"], "the target is nearly deterministic here (all its outcomes but one have 4.6e-64 "
                                "of the probability): a test needs 4.3e+64 samples; raise --temperature"),
    (["--temperature", "5e-4"], "the target is nearly deterministic here"),
    (["--temperature", "1e-2"], "use --n_samples 23101609 or more"),  # nearly, but a test within reach
])
def test_bad_input_is_one_line_on_stderr_and_exit_status_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ["--n_samples", "--seed", "--n_tokens", "--K", "--n_vocab", "--order", "--model_seed",
                 "--temperature", "--top_k", "--top_p", "--alpha", "--broken", "--max_rows"]:
        assert re.search(rf"{flag} \S+\s+\S", help_text), f"{flag} has no help text"


def test_python_dash_m_entry_point_runs():
    completed = subprocess.run([sys.executable, "-m", "gpt2np.classroom", "--n_samples", "100"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "1. The real speculative sampler" in completed.stdout and "REJECTED" in completed.stdout
    bad = subprocess.run([sys.executable, "-m", "gpt2np.classroom", "--K", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stdout == ""


def test_a_closed_pipe_and_ctrl_c_end_the_command_without_a_traceback(monkeypatch, capsys):
    """`python -m gpt2np.classroom | head -1` printed a BrokenPipeError traceback (status 1), and Ctrl-C a
    KeyboardInterrupt one: the command now runs through report.run_command, as every other."""
    reader = subprocess.Popen([sys.executable, "-m", "gpt2np.classroom", "--n_samples", "2000"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = reader.stdout.readline()
    reader.stdout.close()  # the reader leaves, as head -1 does
    err = reader.stderr.read()
    reader.stderr.close()
    assert reader.wait(timeout=120) == 0 and first.startswith("Speculative decoding in the classroom"), first
    assert "Traceback" not in err, err
    from gpt2np import classroom

    def interrupted(argv=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(classroom, "main", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        classroom.run([])
    assert exit_info.value.code == 130


def test_unnormalised_residual_kernel_puts_the_missing_mass_on_the_last_token():
    """Our extra broken kernel, exactly: K = 1 and the draft always proposes token 0, which the
    target never emits, so it is always rejected and the residual is max(0, p - q) = p - q where
    positive. Its sum is 1 - sum min(p, q); the rest lands on the last token."""
    p = np.array([[0.0, 0.5, 0.3, 0.2], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.5, 0.4, 0.1, 0.0]])
    emitted = exact_distribution(lambda rng: unnormalised_residual_kernel([0], q, p, rng).next_token)
    residual = np.maximum(0.0, p[0] - q[0])  # [0, 0.1, 0.2, 0.2], sum 0.5
    np.testing.assert_allclose([emitted.get(t, 0.0) for t in range(4)], residual + [0, 0, 0, 0.5], atol=1e-15)
