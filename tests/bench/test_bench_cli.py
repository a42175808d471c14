"""The command lines of the benchmark tool: python -m bench, python -m bench.compare, python -m bench.trees.

Bad input is one line on stderr, "<prog>: error: ..." naming the flag, and exit status 2, before any work (as
argparse's own errors): the measuring functions are replaced here by ones that fail the test if they are reached.
The results file is written whole after the run, and --json / --compare are checked before it. No benchmark runs.
"""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

import bench.__main__ as cli  # noqa: E402
from bench import compare, trees, trees_report  # noqa: E402


class Measured(Exception):
    """A run reached the measuring code: what a bad flag must never do."""


@pytest.fixture
def no_work(monkeypatch):
    def measure(*args, **kwargs):
        raise Measured("the flags were accepted and the run started")
    monkeypatch.setattr(cli, "run", measure)
    monkeypatch.setattr(cli.batching, "run_section", measure)
    monkeypatch.setattr(cli.trees, "run_section", measure)


def refused(argv, capsys):  # -> the one line python -m bench printed, after checking its status
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2, (argv, done.value.code, err)
    assert err.count("\n") == 1 and err.startswith("python -m bench: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flags, says", [
    (["--alphas", "x"], "--alphas: comma-separated floats"),
    (["--alphas", ""], "--alphas: at least one value"),
    (["--alphas", "1.5"], "--alphas must lie in [0, 1]"),
    (["--alphas", "-1"], "--alphas must lie in [0, 1]"),
    (["--K", "0"], "--K must be >= 1"),
    (["--K", "-3"], "--K must be >= 1"),
    (["--K", "200"], "--spec-tokens 1206 (6 x (--K + 1)) + the prompt (8) do not fit the context of 124M,355M"),
    (["--spec-tokens", "-5"], "--spec-tokens must be >= 2"),
    (["--spec-tokens", "1020"], "--spec-tokens 1020 + the prompt (8) do not fit the context"),
    (["--spec-long-prompt", "2"], "--spec-long-prompt must be 0"),
    (["--policy-prompt", "2000"], "--policy-tokens 100 + --policy-prompt 2000 = 2100 does not fit the context of 124M"),
    (["--policy-tokens", "5000"], "--policy-tokens 5000 + the prompt (8) = 5008 does not fit the context"),
    (["--policy-Ks", "0"], "--policy-Ks in 1..8"),
    (["--policy-alphas", ""], "--policy-alphas: at least one value"),
    (["--reference-tokens", "0"], "--reference-tokens must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--threads", "-1"], "--threads must be >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--pair", "124M"], "--pair must be DRAFT,TARGET"),
    (["--sections", ""], "--sections: at least one section"),
    (["--sections", ","], "--sections: at least one section"),
    (["--sections", "nope"], "unknown section(s) nope"),
    (["--sizes", ""], "--sizes: at least one size"),
    (["--kernel-sizes", ","], "--kernel-sizes: at least one size"),
    (["--sections", "batching", "--batch-sizes", "0"], "--batch-sizes must lie in 1..64"),
    (["--sections", "trees", "--tree-pair", "124M"], "--tree-pair: DRAFT,TARGET"),
    (["--sections", "trees", "--tree-shapes", "K=0"], "--tree-shapes"),
    (["--tiny", "--alphas", "2"], "--alphas must lie in [0, 1]"),  # what --tiny honours is checked too
    (["--tiny", "--K", "0"], "--K must be >= 1"),                   # and what it fixes: bad input all the same
])
def test_a_bad_flag_is_one_line_and_status_2_before_any_work(flags, says, no_work, capsys, tmp_path):
    err = refused([*flags, "--json", str(tmp_path / "b.json")], capsys)
    assert says in err, err
    assert not (tmp_path / "b.json").exists()


def test_the_policy_context_check_follows_the_sections(no_work, capsys, tmp_path):
    """A prompt + tokens beyond the pair's context is refused only where the section that runs them is selected."""
    with pytest.raises(Measured):
        cli.main(["--sections", "decode", "--policy-tokens", "5000", "--json", str(tmp_path / "b.json")])
    refused(["--sections", "policies", "--policy-tokens", "5000", "--json", str(tmp_path / "b.json")], capsys)


def test_json_and_compare_are_checked_before_the_run(no_work, capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for where, says in [(tmp_path, "not a file (a folder)"), (a_file / "b.json", "cannot write a file there"),
                        (tmp_path / "typo" / "b.json", f"the folder {tmp_path / 'typo'} does not exist")]:
        assert f"--json {where}: {says}" in refused(["--sections", "decode", "--json", str(where)], capsys)
    assert not (tmp_path / "typo").exists()  # a mistyped folder is not made (only the default's, bench/results/)
    truncated = tmp_path / "old.json"
    truncated.write_text('{"meta": {')
    foreign = tmp_path / "list.json"
    foreign.write_text("[1, 2]")
    for old, says in [(tmp_path / "absent.json", "cannot read it"), (truncated, "not JSON"),
                      (foreign, "not a python -m bench results file")]:
        err = refused(["--sections", "decode", "--json", str(tmp_path / "b.json"), "--compare", str(old)], capsys)
        assert f"--compare {old}: {says}" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "list.json", "old.json"]  # nothing written


def test_the_default_json_folder_is_made_where_missing(monkeypatch, tmp_path):
    """A fresh clone has no bench/results/ (git-ignored): the default --json's folder is made, no other."""
    monkeypatch.setattr(cli, "DEFAULT_JSON", tmp_path / "results" / "bench.json")
    assert cli.json_path(str(tmp_path / "results" / "bench.json")) == tmp_path / "results" / "bench.json"
    assert (tmp_path / "results").is_dir()
    with pytest.raises(SystemExit, match="the folder .* does not exist"):
        cli.json_path(str(tmp_path / "other" / "bench.json"))


def test_the_results_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "bench.json"
    path.write_text('{"old": 1}')
    umask = os.umask(0o022)
    try:
        cli.write_json(path, {"meta": {"wall_seconds": 1.0}})
    finally:
        os.umask(umask)
    assert json.loads(path.read_text()) == {"meta": {"wall_seconds": 1.0}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # as a plain open() makes it, not mkstemp's 0o600

    def interrupted(*args):
        raise OSError("disk full")
    monkeypatch.setattr(cli.os, "replace", interrupted)
    with pytest.raises(OSError, match="disk full"):
        cli.write_json(path, {"new": 2})
    assert json.loads(path.read_text()) == {"meta": {"wall_seconds": 1.0}}  # the old file as it was
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temporary file left behind


def test_tiny_names_the_flags_it_fixes(no_work, capsys, tmp_path):
    with pytest.raises(Measured):
        cli.main(["--tiny", "--K", "3", "--sizes", "124M", "--policy-read", "--batch-sizes", "1", "--repeats", "1",
                  "--json", str(tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert err.count("--tiny fixes") == 1 and "note: --tiny fixes its own values: --sizes, --K, --policy-read " \
        "ignored" in err, err
    with pytest.raises(Measured):
        cli.main(["--tiny", "--batch-sizes", "1", "--json", str(tmp_path / "b.json")])
    assert "--tiny fixes" not in capsys.readouterr().err
    helped = " ".join(cli.parser().format_help().split())
    assert "--tiny" in helped and "are ignored (a note names those given)" in helped


def test_the_help_states_each_default_once():
    """argparse's "(default: ...)" is not added where a flag's help states its own default, nor for None."""
    ap = cli.parser()
    formatter = ap.formatter_class(ap.prog)
    for action in ap._actions:
        text = formatter._expand_help(action) if action.help else ""
        assert text.count("(default") <= 1 and "(default: )" not in text and "(default: None)" not in text, text
    helped = " ".join(ap.format_help().split())
    assert "(default: 6 x (K + 1), 30 at --K 4)" in helped and "(default: on; --no-policy-lockstep" in helped
    assert "(default: True)" not in helped and "(default: 1..8)" in helped


def test_python_m_bench_exits_2_on_a_bad_flag(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "--sections", "", "--json", str(tmp_path / "b.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stderr)
    assert done.stderr.startswith("python -m bench: error: --sections") and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "b.json").exists()


# ---- python -m bench.compare ---------------------------------------------------------------------

def test_compare_has_a_help_and_one_line_errors(tmp_path, capsys):
    helped = subprocess.run([sys.executable, "-m", "bench.compare", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "OLD_JSON" in helped.stdout and "NEW_JSON" in helped.stdout, helped
    truncated = tmp_path / "new.json"
    truncated.write_text('{"sizes": {"124M": ')
    for argv, says in [([], "the following arguments are required"),
                       ([str(tmp_path / "absent.json"), str(truncated)], "OLD_JSON"),
                       ([str(truncated), str(truncated)], "OLD_JSON"),
                       ]:
        with pytest.raises(SystemExit) as done:
            compare.main(argv)
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.count("\n") == 1 and says in err, (argv, err)
        assert err.startswith("python -m bench.compare: error: "), err


def test_compare_prints_two_files_side_by_side(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"reference": {"speedup_vs_reference": 40.0}}))
    new.write_text(json.dumps({"reference": {"speedup_vs_reference": 50.0}}))
    compare.main([str(old), str(new)])
    assert "reference fast speedup" in capsys.readouterr().out


# ---- python -m bench.trees -----------------------------------------------------------------------

def test_trees_has_a_help_and_refuses_a_folder_that_does_not_exist(tmp_path):
    helped = subprocess.run([sys.executable, "-m", "bench.trees", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "FIXTURES_DIR" in helped.stdout and "usage:" in helped.stdout, helped
    absent = tmp_path / "absent"
    done = subprocess.run([sys.executable, "-m", "bench.trees", str(absent)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done
    assert done.stderr.startswith("python -m bench.trees: error: FIXTURES_DIR") and "no such folder" in done.stderr


def test_trees_measures_the_profiles_of_the_folder_given_or_the_shared_one(tmp_path, monkeypatch):
    """A folder that exists goes to measure_profiles (which skips, in one line, one without the models), and
    its counts to bundled_bound; no folder: the shared fixtures beside the repository."""
    seen = []
    monkeypatch.setattr(trees_report, "measure_profiles", lambda folder: seen.append(Path(folder)) or {"counts": 1})
    monkeypatch.setattr(trees, "bundled_bound", lambda counts: seen.append(counts))
    trees.main([str(tmp_path)])
    trees.main([])
    assert seen == [tmp_path, {"counts": 1}, REPO.parent / "shared" / "fixtures", {"counts": 1}], seen
