"""main.py as a new user meets it in the first minutes (audit 60): options given twice under two names,
--draft_model_size none, the statistics' counts, the header, default token counts, Ctrl-C, the
installed command's name. Flag checks run in-process (check_args loads nothing); runs are subprocesses."""
import json
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO, run_with_ctrl_c_at_import
from gpt2np.cli.flags import check_args, parse_args
from gpt2np.report import command_name, format_stats, run_command


def run_main(*args):
    return subprocess.run([sys.executable, "main.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def checked(*argv):
    args = parse_args(list(argv))
    check_args(args)
    return args


@pytest.mark.parametrize("argv, names", [
    (["--gamma", "3", "--K", "4"], "--gamma and --K"),
    (["-g", "3", "--K", "4"], "-g and --K"),
    (["--K", "3", "--gamma", "4"], "--K and --gamma"),
    (["--input", "hi", "--prompt", "ho"], "--input and --prompt"),
    (["--prompt", "ho", "--input-str", "hi"], "--prompt and --input-str"),
    (["--top-k", "5", "--top_k", "6"], "--top-k and --top_k"),
    (["--N", "5", "--n_tokens_to_generate", "6"], "--N and --n_tokens_to_generate"),
    (["--target_model_name", "gpt2", "--target_model_size", "124M"], "--target_model_name and --target_model_size"),
])
def test_one_option_given_two_values_under_two_names_is_refused_naming_both(argv, names):
    """The last one used to win without a word (--gamma 3 --K 4 ran K=4)."""
    first, second = names.split(" and ")
    with pytest.raises(ValueError, match=f"^{first} \\(.+\\) and {second} \\(.+\\) are two names of one option "
                                         "and disagree: give one of them$"):
        checked(*argv)


def test_two_names_of_one_option_exit_2_with_one_line_before_any_work():
    out = run_main("--gamma", "3", "--K", "4")
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr == "error: --gamma (3) and --K (4) are two names of one option and disagree: give one of them\n"


@pytest.mark.parametrize("argv, K", [(["--K", "3", "--K", "5"], 5), (["-g", "3", "--gamma", "5"], 5),
                                     (["--gamma", "3", "--K", "3"], 3)])
def test_one_name_twice_is_argparse_s_last_one_wins_and_two_names_may_agree(argv, K):
    """-g and --gamma are one flag of LLMSpeculativeSampling's, as --K is gpt2np's: the last value counts.
    --gamma 3 --K 3 says one thing twice (as the server takes gamma and K that agree)."""
    assert checked(*argv).K == K


def test_draft_model_size_none_runs_the_target_alone_and_says_so():
    """As the server takes it (and README's class setup uses it): no draft model, plain decoding only."""
    out = run_main("--draft_model_size", "none", "--n_tokens_to_generate", "10")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "drafter: none (target-only decoding; no speculative run)" in out.stdout.splitlines()[0]
    assert "=== autoregressive (shakespeare-2.6M) ===" in out.stdout
    assert "speculative" not in out.stdout.split("\n", 1)[1] and "speedup" not in out.stdout


def test_draft_model_size_none_refuses_drafting_flags_and_defaults_to_the_bundled_count():
    with pytest.raises(ValueError, match="--K needs a drafter"):
        checked("--draft_model_size", "none", "--K", "3")
    assert checked("--draft_model_size", "none").n_tokens_to_generate == 200


def test_an_unknown_drafter_lists_ngram_and_none_and_the_closest_name():
    out = run_main("--draft_model_size", "ngarm")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "unknown model 'ngarm' (did you mean ngram?)" in out.stderr
    assert "ngram (prompt lookup, no model), or none (no drafter: the target alone)" in out.stderr
    target = run_main("--target_model_size", "nosuch")  # a target can be neither
    assert target.returncode == 2 and "ngram" not in target.stderr and "none (" not in target.stderr


def test_statistics_give_alpha_empirical_s_own_numerator_and_denominator():
    """accepted / proposed (136 / 255) is not alpha_empirical (0.751): drafts after a rejection are never
    examined, so its denominator is accepted + rejected (181), and the line says so with the counts."""
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    ids = target.tokenizer.encode("ROMEO:")
    stats = gpt2np.speculative_generate(target, draft, ids, 60, K=4, temperature=1.0,
                                        rng=np.random.default_rng(0)).stats
    assert stats.rejections > 0 and stats.drafted > stats.accepted + stats.rejections  # the case that misled
    examined = stats.accepted + stats.rejections
    text = format_stats(stats)
    assert "accepted / verified" not in text
    line = next(line for line in text.splitlines() if "alpha_empirical" in line)
    assert line.startswith("  alpha_empirical = accepted / examined")
    assert f"{stats.accepted / examined:.3f}   ({stats.accepted} / {examined} examined, {stats.rejections} " \
           f"rejected: what this run saw)" in line


@pytest.mark.parametrize("argv, n_tokens", [
    ([], 200),
    (["--draft_model_size", "shakespeare-260K"], 200),
    (["--target_model_size", "shakespeare-2.6M", "--draft_model_size", "shakespeare-260K"], 200),  # was 40
    (["--target_model_size", "shakespeare-2.6M"], 200),
    (["--target_model_size", "random:tiny"], 40),
    (["--target_model_size", "124M"], 40),
    (["--target_model_name", "shakespeare-2.6M"], 20),  # LLMSpeculativeSampling's spellings: its default
])
def test_the_bundled_target_generates_200_tokens_however_it_is_named(argv, n_tokens):
    assert checked(*argv).n_tokens_to_generate == n_tokens


def test_help_states_the_default_token_count_rule():
    out = run_main("--help")
    help_text = " ".join(out.stdout.split())
    assert "200 when the target is a bundled model (shakespeare-2.6M, shakespeare-260K), named or not; 40 for " \
           "any other target" in help_text
    assert "'none' for target-only generation" in help_text


def test_the_note_on_other_defaults_lists_only_those_not_given_and_json_records_blas(tmp_path):
    path = tmp_path / "run.json"
    out = run_main("--gamma", "3", "--temperature", "0", "--max_tokens", "8", "--json", str(path))
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()
    assert head[1] == "(LLMSpeculativeSampling's spellings: its defaults apply where not given: top_k 20, top_p 0.9)"
    assert "temperature 0.0, top_k 20, top_p 0.9" in head[0]
    blas = head[2].removeprefix("BLAS: ")
    assert json.loads(path.read_text())["blas"] == blas  # the kernel and threads the run had (1 on this pair)
    assert blas.split(",")[0] == gpt2np.blas_kernel().split(",")[0]
    all_given = run_main("--gamma", "3", "--temperature", "0", "--max_tokens", "8", "--top-k", "5", "--top-p", "1")
    assert all_given.returncode == 0 and "its defaults apply" not in all_given.stdout, all_given.stderr


def test_the_header_says_off_for_sampling_options_not_set():
    out = run_main("--n_tokens_to_generate", "5")
    assert "top_k off, top_p off" in out.stdout.splitlines()[0] and "None" not in out.stdout.splitlines()[0]


def test_ctrl_c_mid_line_ends_the_line_and_exits_130(capsys):
    def interrupted():
        print("ROMEO: half a li", end="")
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as exit_:
        run_command(interrupted)
    assert exit_.value.code == 130 and capsys.readouterr().out == "ROMEO: half a li\n"


def test_ctrl_c_while_main_py_imports_exits_130_without_a_traceback():
    """KeyboardInterrupt raised by `import gpt2np.cli` itself, as a Ctrl-C in NumPy's import would."""
    out = run_with_ctrl_c_at_import("name == 'gpt2np.cli'",
                                    "sys.argv = ['main.py']; runpy.run_path('main.py', run_name='__main__')")
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("argv0, name", [
    ("/venv/bin/gpt2np", "gpt2np"), ("gpt2np-console", "gpt2np-console"), ("main.py", "python main.py"),
    ("/x/gpt2np/console/__main__.py", "python main.py"), ("-c", "python main.py")])
def test_an_installed_command_names_itself_in_usage(argv0, name):
    assert command_name("python main.py", argv0) == name


def test_the_gpt2np_command_s_usage_and_errors_say_gpt2np(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/gpt2np", "--tmperature", "1"])
    with pytest.raises(SystemExit) as exit_:
        parse_args(sys.argv[1:])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("gpt2np: error: unrecognized arguments: --tmperature"), err
    monkeypatch.setattr(sys, "argv", ["main.py"])
    with pytest.raises(SystemExit):
        parse_args(["--tmperature", "1"])
    assert capsys.readouterr().err.startswith("python main.py: error:")


@pytest.mark.parametrize("argv, hint", [
    (["--traget_model_size", "x"], "(did you mean --target_model_size?)"),
    (["--traget_model_size", "x", "--promt", "y"],
     "(did you mean --target_model_size for --traget_model_size, --prompt for --promt?)"),
    (["--zzz"], None),  # nothing close: no hint
])
def test_a_mistyped_flag_gets_the_closest_known_one(monkeypatch, capsys, argv, hint):
    monkeypatch.setattr(sys, "argv", ["main.py"])
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "unrecognized arguments" in err, err
    assert (hint in err) if hint else ("did you mean" not in err), err


@pytest.mark.parametrize("args", [["--K", "auto"], ["--K", "heuristic"], ["--tree", "auto"]])
@pytest.mark.parametrize("K_max", ["0", "33", "999999999999"])
def test_K_max_outside_its_bounds_is_refused_before_any_run(args, K_max, main_here):
    """--K auto --K_max 999999999999 hung after the target-only run (AutoK's prior curve, built K by K), and
    --tree auto with it ran out of memory: one line naming the flag, before anything runs."""
    out = main_here(*args, "--K_max", K_max, "--n_tokens_to_generate", "3")
    assert out.returncode == 2 and out.stdout == "", (out.returncode, out.stdout[:200])
    assert out.stderr == f"error: --K_max must be an integer from 1 to 32, got {K_max}\n", out.stderr  # as the console
