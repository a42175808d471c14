"""python -m gpt2np.compare and python -m gpt2np.latency (llama-ssp's two modes), run as a user runs
them: subprocesses on the bundled pair (offline) with few tokens. Their texts are checked against
gpt2np.generate, their tables' columns and numbers against each other and the --json record, and
the 95 % intervals against scipy's Student t (an independent oracle)."""
import json
import math
import os
import re
import select
import subprocess
import sys
import time

import numpy as np
import pytest

import gpt2np
from conftest import REPO, SHARED
from gpt2np.compare import DEFAULT_PROMPT, screen_rows, side_by_side
from gpt2np.latency import PROMPTS, WARMUP_PROMPT, mean_interval, ratio_interval, t_quantile
from gpt2np.report import by_position

TARGET, DRAFT = "shakespeare-2.6M", "shakespeare-260K"
assert {TARGET, DRAFT} <= set(gpt2np.bundled_models())


def command(module, *args):
    return subprocess.run([sys.executable, "-m", f"gpt2np.{module}", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env={k: v for k, v in os.environ.items() if k != "NO_COLOR"})


def in_process(capsys, module, *args):  # -> (exit status, stdout, stderr) of the command's run() in this process
    """What `python -m gpt2np.<module> ARGS` does, without a new Python: for the refusals, which read no model
    or only the bundled ones (the subprocesses above and test_bad_input_through_the_command_line keep the
    real entry points tested)."""
    from gpt2np.report import run_command
    main = __import__(f"gpt2np.{module}", fromlist=["main"]).main
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_command(main, list(args))
    shown = capsys.readouterr()
    return exited.value.code, shown.out, shown.err


@pytest.fixture(scope="module")
def target():
    return gpt2np.load_model(TARGET)


def greedy_text(target, prompt, n):
    return prompt + target.tokenizer.decode(gpt2np.generate(target, target.tokenizer.encode(prompt), n, temperature=0))


# ---- compare ---------------------------------------------------------------------------------------

def test_compare_prints_both_texts_the_table_and_the_statistics(target, tmp_path):
    out = command("compare", TARGET, DRAFT, "--n_tokens", "24", "--json", str(tmp_path / "c.json"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    want = greedy_text(target, DEFAULT_PROMPT, 24)
    texts = re.findall(r"^=== (target-only|speculative) \((.*?)\) ===\n(.*?)(?=\n=== |\ngenerator )", out.stdout,
                       flags=re.M | re.S)
    assert [(label, text) for label, _, text in texts] == [("target-only", want), ("speculative", want)]
    assert texts[1][1] == f"{TARGET}, drafter {DRAFT}, K=4"
    table = out.stdout.split("\ngenerator ")[1].splitlines()
    assert table[0].split() == ["tokens", "seconds", "tokens/s", "speedup"]
    rows = {row.split()[0]: [float(x.rstrip("x")) for x in row.split()[1:]] for row in table[1:3]}
    assert set(rows) == {"target-only", "speculative"}
    record = json.loads((tmp_path / "c.json").read_text())
    for run in record["runs"]:
        tokens, seconds, per_second, speedup = rows[run["label"]]
        assert tokens == len(run["tokens"]) == 24 and run["text"] == want
        assert abs(seconds - run["seconds"]) <= 5e-4 and abs(per_second - run["tokens_per_second"]) <= 0.05
    assert rows["target-only"][3] == 1.0
    assert abs(rows["speculative"][3] - record["speedup"]) <= 0.005
    assert record["speedup"] == pytest.approx(record["runs"][1]["tokens_per_second"] / record["runs"][0]["tokens_per_second"])
    assert record["stats"]["drafter"] == DRAFT and record["stats"]["rounds"] > 0
    assert re.search(r"^speculative: drafter shakespeare-260K, fixed K=4, alpha_hat [\d.]+, .* measured [\d.]+x$",
                     out.stdout, flags=re.M), out.stdout
    assert out.stdout.rstrip().endswith("same text (as it must be at temperature 0)")


def test_compare_with_prompt_lookup_and_sampling_is_each_runs_own_seeded_sample(target):
    out = command("compare", TARGET, "ngram", "--n_tokens", "16", "--temperature", "0.8", "--seed", "4", "--K", "3",
                  "--prompt", "KING: KING")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    ids = target.tokenizer.encode("KING: KING")
    plain = gpt2np.generate(target, ids, 16, temperature=0.8, rng=np.random.default_rng(4))
    assert f"=== target-only ({TARGET}) ===\nKING: KING{target.tokenizer.decode(plain)}\n" in out.stdout
    spec = gpt2np.speculative_generate(target, gpt2np.NgramDrafter(3), ids, 16, K=3, temperature=0.8,
                                       rng=np.random.default_rng(4))  # (K auto: its timing-driven K moves the draws)
    assert f"drafter ngram (n <= 3), K=3) ===\nKING: KING{target.tokenizer.decode(spec.tokens)}\n" in out.stdout


def read_all(fd, timeout=120):
    buffer, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child exited
                break
            if not chunk:
                break
            buffer += chunk
    return buffer


def on_a_terminal(term):  # -> what python -m gpt2np.compare wrote to a pseudo-terminal with TERM=term
    import pty
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(REPO)
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"COLUMNS": "90", "LINES": "30",
                                                                          "TERM": term}
        os.execve(sys.executable, [sys.executable, "-m", "gpt2np.compare", TARGET, DRAFT, "--n_tokens", "60"], env)
    try:
        shown = read_all(fd).decode("utf-8", errors="replace")
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, shown[-2000:]
    return shown


def test_compare_on_a_dumb_terminal_writes_no_escape_codes():
    """TERM=dumb (Emacs' shell, some CI logs) shows neither colours nor cursor moves: the plain report."""
    shown = on_a_terminal("dumb")
    assert "\033" not in shown and "=== speculative (" in shown, shown[:2000]


def test_compare_on_a_terminal_draws_two_live_columns_then_the_report():
    shown = on_a_terminal("xterm")  # whatever TERM the tests run under
    heads = re.findall(r"target-only: (\d+) tokens, \d+ tokens/s +\| speculative: (\d+) tokens", shown)
    assert len(heads) >= 2, shown[:2000]  # redrawn as the runs go
    counts = [(int(a), int(b)) for a, b in heads]
    assert counts == sorted(counts) and counts[-1] == (60, 60)  # both grow, both finish
    assert "\033[J" in shown  # the live block is erased before the report
    report = shown.rsplit("\033[J", 1)[1]
    assert "=== speculative (" in report and "\ngenerator " in report.replace("\r\n", "\n")
    assert "\033[32m" in report and "legend" in report  # provenance colours on a terminal


def test_side_by_side_puts_each_text_in_its_own_column():
    class Lane:  # what side_by_side reads of a race lane
        def __init__(self, label, text, tokens, per_second):
            self.label, self.text, self.tokens_per_second = label, text, per_second
            self.stream = type("Stream", (), {"tokens": list(range(tokens))})()
    lanes = [Lane("target-only", "abc\ndefghijklmnop", 3, 10.0), Lane("speculative", "xyz", 5, 20.4)]
    column = (23 - 3) // 2
    lines = side_by_side(lanes, width=23, height=4)
    assert lines[:2] == ["target-onl | speculativ", "---------- | ----------"]  # headers cut to the column
    left = [line[:column].rstrip() for line in lines[2:]]
    right = [line[column + 3:] for line in lines[2:]]
    assert left == ["abc", "defghijklm", "nop"] == screen_rows("abc\ndefghijklmnop", column)
    assert right == ["xyz", "", ""]
    assert [line[:column] for line in side_by_side(lanes, width=23, height=2)[2:]] == ["defghijklm", "nop       "]
    assert screen_rows("a\tb\nc", 10) == ["a.b", "c"]  # control characters never move the cursor


# ---- latency ---------------------------------------------------------------------------------------

def latency_rows(stdout):
    return [line.split() for line in stdout.splitlines() if re.match(r"^\s*\d+  \S", line)]


def test_latency_with_a_draft_prints_each_prompt_the_intervals_and_the_speedup(tmp_path):
    out = command("latency", TARGET, DRAFT, "--n_tokens", "6", "--json", str(tmp_path / "l.json"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    header = next(line for line in out.stdout.splitlines() if line.startswith(" #  prompt"))
    assert re.split(r"\s{2,}", header.strip())[1:] == ["prompt", "tokens", "target ms/token", "speculative ms/token",
                                                        "speedup", "tokens/call"]
    rows = latency_rows(out.stdout)
    assert [int(r[0]) for r in rows] == list(range(1, len(PROMPTS) + 1))
    record = json.loads((tmp_path / "l.json").read_text())
    assert [p["prompt"] for p in record["prompts"]] == list(PROMPTS)
    for row, p in zip(rows, record["prompts"]):
        target_ms, spec_ms, speedup = float(row[-4]), float(row[-3]), float(row[-2].rstrip("x"))
        assert int(row[-5]) == p["target_tokens"] == p["speculative_tokens"] == 6
        assert abs(target_ms - p["target_ms"]) <= 5e-4 and abs(spec_ms - p["speculative_ms"]) <= 5e-4
        assert abs(speedup - p["target_ms"] / p["speculative_ms"]) <= 0.005
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy (requirements-dev.txt) is the oracle")
    n, t = len(PROMPTS), scipy_stats.t.ppf(0.975, len(PROMPTS) - 1)
    for name, label in (("target", "target-only"), ("speculative", "speculative")):
        values = np.array([p[f"{name}_ms"] for p in record["prompts"]])
        half = t * values.std(ddof=1) / math.sqrt(n)
        low, high = values.mean() - half, values.mean() + half
        got = record["intervals"][name]
        assert np.allclose([got["mean"], got["low"], got["high"]], [values.mean(), low, high], rtol=1e-9), got
        line = f"{label}: {values.mean():.3f} ms/token, 95% CI {low:.3f} - {high:.3f} (mean over {n} prompts"
        assert line in out.stdout, (line, out.stdout[-1500:])
    logs = np.log([p["target_ms"] / p["speculative_ms"] for p in record["prompts"]])
    half = t * logs.std(ddof=1) / math.sqrt(n)
    speedup = [math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)]
    got = record["intervals"]["speedup"]
    assert np.allclose([got["mean"], got["low"], got["high"]], speedup, rtol=1e-9), (got, speedup)
    assert (f"speedup: {speedup[0]:.2f}x, 95% CI {speedup[1]:.2f}x - {speedup[2]:.2f}x (geometric mean of {n} "
            "paired per-prompt ratios") in out.stdout
    positions = record["prompts"][0]["by_position"]  # per draft position: (proposed, examined, accepted)
    summed = [tuple(int(sum(p["by_position"][i][j] for p in record["prompts"])) for j in range(3))
              for i in range(len(positions))]
    assert all(len(p["by_position"]) == 4 for p in record["prompts"])  # K = 4 drafts in (almost) every round
    assert f"accepted by draft position (i: accepted / proposed): {by_position(summed)}" in out.stdout


def test_latency_without_a_draft_measures_the_target_alone():
    out = command("latency", TARGET, "--n_tokens", "4")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    rows = latency_rows(out.stdout)
    assert len(rows) == len(PROMPTS) and all(r[-2] == "4" for r in rows)
    assert "speculative" not in out.stdout and "speedup" not in out.stdout
    assert re.search(r"^target-only: [\d.]+ ms/token, 95% CI [\d.]+ - [\d.]+ \(mean over 15 prompts, t-interval\); "
                     r"total 60 tokens in [\d.]+ s = [\d.]+ ms/token$", out.stdout, flags=re.M), out.stdout


def test_t_quantile_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy (requirements-dev.txt) is the oracle")
    for df in (1, 2, 3, 4, 7, 14, 30, 120):
        for p in (0.9, 0.975, 0.995):
            ours, theirs = t_quantile(p, df), scipy_stats.t.ppf(p, df)
            assert abs(ours - theirs) <= 1e-6 * theirs, (df, p, ours, theirs)


def test_intervals_cover_the_mean_and_a_constant_ratio_has_no_width():
    rng = np.random.default_rng(0)
    mean, low, high = mean_interval(rng.normal(2.0, 0.3, size=15))
    assert low < mean < high
    assert np.allclose(ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]), (2.0, 2.0, 2.0))


def test_the_prompts_are_fifteen_sentences_not_taken_from_the_training_corpora():
    assert len(set(PROMPTS)) == len(PROMPTS) >= 15 and WARMUP_PROMPT not in PROMPTS
    corpora = sorted((SHARED / "data" / "corpus").glob("*.txt"))
    if not corpora:
        pytest.skip(f"no corpus in {SHARED / 'data' / 'corpus'} to compare the prompts with")
    text = " ".join(" ".join(c.read_text(encoding="utf-8", errors="replace").split()) for c in corpora)
    for prompt in (*PROMPTS, WARMUP_PROMPT, DEFAULT_PROMPT):
        words = prompt.split()
        runs = [" ".join(words[i:i + 8]) for i in range(len(words) - 7)]  # common phrases are shorter ("At the end of the")
        assert not [run for run in runs if run in text], prompt


# ---- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("module, args, message", [
    ("compare", [TARGET, "nonsense-model"], "unknown model 'nonsense-model'"),
    ("compare", ["nonsense-model", DRAFT], "unknown model 'nonsense-model'"),
    ("compare", [TARGET, DRAFT, "--bogus"], "unrecognized arguments: --bogus"),
    ("compare", [TARGET], "the following arguments are required: draft"),
    ("compare", [TARGET, DRAFT, "--K", "0"], "--K must be an integer >= 1, 'heuristic' or 'auto', got '0'"),
    ("compare", [TARGET, DRAFT, "--n_tokens", "0"], "--n_tokens must be at least 1"),
    ("compare", [TARGET, DRAFT, "--n_tokens", "500"], "exceeds the context of 256 tokens"),
    ("compare", [TARGET, DRAFT, "--temperature", "-1"], "temperature"),
    ("compare", [TARGET, DRAFT, "--seed", "-3"], "--seed must be a non-negative integer"),
    ("latency", ["nonsense-model"], "unknown model 'nonsense-model'"),
    ("latency", [TARGET, "nonsense-model"], "unknown model 'nonsense-model'"),
    ("latency", [TARGET, "--bogus"], "unrecognized arguments: --bogus"),
    ("latency", [TARGET, "--n_tokens", "x"], "invalid int value: 'x'"),
    ("latency", [TARGET, "--K", "3"], "--K needs a drafter"),
    ("latency", [TARGET, DRAFT, "--K", "often"], "--K must be an integer >= 1, 'heuristic' or 'auto', got 'often'"),
    ("latency", [TARGET, DRAFT, "--K", "0"], "--K must be an integer >= 1, 'heuristic' or 'auto', got '0'"),
    ("latency", [TARGET, "--n_tokens", "250"], "--n_tokens 250 does not fit: the longest prompt (79 tokens) leaves "
                                                "room for at most 177 new tokens in the context of 256"),
    ("compare", ["random:tiny", DRAFT], "random:tiny has no tokenizer to encode the prompt with"),  # 64 tokens: was
    ("latency", ["random:tiny"], "random:tiny has no tokenizer to encode the prompts with"),  # a traceback
])
def test_bad_input_is_one_line_and_status_2(capsys, module, args, message):
    status, stdout, stderr = in_process(capsys, module, *args)
    assert status == 2, (status, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and message in lines[0], stderr
    assert stdout == ""  # refused before anything runs

@pytest.mark.parametrize("module", ["compare", "latency"])
def test_a_random_draft_of_another_vocabulary_is_refused_before_its_init(capsys, module, no_random_init):
    """DRAFT random:1558M beside a bundled target (257 tokens): refused before its weights are built (about
    30 s; load_drafter's target)."""
    assert in_process(capsys, module, TARGET, "random:1558M") == (2, "", "error: draft and target must share a vocabulary: n_vocab 50257 vs 257 (draft vs target)\n")


@pytest.mark.parametrize("module, args, message", [
    ("compare", [TARGET, "nonsense-model"], "unknown model 'nonsense-model'"),   # run_command's error line
    ("latency", [TARGET, "--bogus"], "unrecognized arguments: --bogus"),         # argparse's
])
def test_bad_input_through_the_command_line(module, args, message):
    """The same refusals from `python -m gpt2np.<module>` itself: one line, status 2, nothing on stdout."""
    out = command(module, *args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], (out.returncode, out.stderr)
    assert out.stdout == ""


@pytest.mark.parametrize("module", ["compare", "latency"])
@pytest.mark.parametrize("where, message", [
    ("{tmp}/missing/run.json", "the folder {tmp}/missing does not exist"),
    ("{tmp}", "--json {tmp} is a folder: name a file in it"),
    ("{tmp}/file.txt/run.json", "{tmp}/file.txt is not a folder"),
    ("/proc/run.json", "--json /proc/run.json: cannot write in the folder /proc"),  # exists; root may "access" it
])
def test_a_json_path_that_cannot_be_written_is_refused_before_any_work(capsys, tmp_path, module, where, message):
    """--json was opened only after the whole run, which then ended in "error: [Errno 2] ...": it is tried first."""
    if where.startswith("/proc") and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    (tmp_path / "file.txt").write_text("a file\n")
    status, stdout, stderr = in_process(capsys, module, TARGET, DRAFT, "--n_tokens", "5", "--json",
                                        where.format(tmp=tmp_path))
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and message.format(tmp=tmp_path) in lines[0], stderr
    assert stdout == ""  # refused before anything runs


@pytest.mark.parametrize("module", ["compare", "latency"])
def test_the_json_record_is_written_atomically(tmp_path, module):
    """Through a temporary file and os.replace: a write that fails leaves the old file whole and no temporary
    file; one that succeeds gets open()'s mode (0666 less the umask), not mkstemp's 0600."""
    write = __import__(f"gpt2np.{module}", fromlist=["write_json_atomically"]).write_json_atomically
    path = tmp_path / "run.json"
    path.write_text('{"old": true}\n')
    with pytest.raises(TypeError):
        write(path, {"fine": 1, ("a", "tuple"): "is no JSON key"})
    assert path.read_text() == '{"old": true}\n' and [p.name for p in tmp_path.iterdir()] == ["run.json"]
    write(path, {"new": [1, 2]})
    assert json.loads(path.read_text()) == {"new": [1, 2]} and [p.name for p in tmp_path.iterdir()] == ["run.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("module", ["compare", "latency"])
def test_help_names_the_loading_flags_and_hub_names(module):
    out = command(module, "--help")
    assert out.returncode == 0
    for word in ("--n_tokens", "--K", "--temperature", "--seed", "--models_dir", "--mirror", "--hf_endpoint",
                 "--json", "hf:owner/name"):
        assert word in out.stdout, (module, word)


@pytest.mark.parametrize("module, args, says", [
    ("compare", ("", DRAFT), "TARGET is empty: name a model"),
    ("compare", (TARGET, " "), "DRAFT is empty: name a model"),
    ("latency", ("",), "TARGET is empty: name a model"),
    ("latency", (TARGET, ""), "DRAFT is empty: name a model"),
])
def test_an_empty_model_name_is_refused_in_one_line(capsys, module, args, says):
    """It read the current folder: "error: . is not a model folder: missing hparams.json, ..."."""
    status, stdout, stderr = in_process(capsys, module, *args)
    assert status == 2 and stderr.startswith(f"error: {says}") and len(stderr.splitlines()) == 1, stderr


@pytest.mark.parametrize("module", ["compare", "latency"])
def test_an_unknown_drafter_lists_ngram_among_the_choices_and_not_none(capsys, module):
    status, stdout, stderr = in_process(capsys, module, TARGET, "none")
    assert status == 2 and stderr.startswith("error: unknown model 'none'") and len(stderr.splitlines()) == 1
    assert stderr.rstrip().endswith("a model folder, or ngram (prompt lookup, no model)"), stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is Linux's")
@pytest.mark.parametrize("module, models", [("compare", (TARGET, "ngram")), ("latency", (TARGET,))])
def test_a_json_write_that_fails_names_the_flag(capsys, module, models):
    status, stdout, stderr = in_process(capsys, module, *models, "--n_tokens", "2", "--json", "/dev/full")
    assert status == 2 and stderr == "error: --json /dev/full: No space left on device\n", stderr


def test_a_closed_stdout_or_a_file_as_models_dir_is_one_line(capsys, monkeypatch, tmp_path):
    """compare >&- was an AttributeError at isatty(); --models_dir FILE was "[Errno 20] Not a directory"."""
    (tmp_path / "file").write_text("")
    status, stdout, stderr = in_process(capsys, "compare", "124M", "ngram", "--models_dir", str(tmp_path / "file"))
    assert status == 2 and stderr == f"error: --models_dir {tmp_path / 'file'} is not a folder\n", stderr
    from gpt2np import compare
    monkeypatch.setattr(sys, "argv", ["compare", TARGET, "ngram"])
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(SystemExit) as exited:
        compare.run()
    assert exited.value.code == 2 and capsys.readouterr().err.startswith("error: stdout is closed: ")
