"""The console as a new user meets it in the first minutes (audit 60): --draft_model_size none and
:drafter none, a token count that cannot fit, the measured speedup's whereabouts, answers to a setting
that did not change, prompt lookup's empty rounds, the default token count, the installed name."""
import re
import subprocess
import sys

import gpt2np
import pytest

from conftest import REPO, run_with_ctrl_c_at_import
from gpt2np.console.commands import Settings, parse_command
from gpt2np.console.display import trace_lines
from gpt2np.console.flags import initial_settings, parse_args
from gpt2np.console.repl import main, no_drafts_why


def run_console(script, *args):
    return subprocess.run([sys.executable, "-m", "gpt2np.console", *args], input=script, capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_draft_model_size_none_starts_target_only_as_the_server_takes_it():
    out = run_console(":help\nROMEO:\n", "--draft_model_size", "none", "--n_tokens_to_generate", "5")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "=== target-only (shakespeare-2.6M) ===" in out.stdout and "=== speculative" not in out.stdout
    settings = initial_settings(parse_args(["--draft_model_size", "none"]))
    assert (settings.drafter, settings.speculative, settings.target, settings.n_tokens) == (None, False, True, 200)


def test_drafter_none_switches_to_target_only_and_an_unknown_drafter_lists_ngram_and_none():
    out = run_console(":compare on\n:drafter ngarm\n:drafter none\n:tokens 5\nROMEO:\n")
    assert out.returncode == 0, out.stderr
    assert "drafter: none (target-only on; speculative, compare and draft-only off)" in out.stdout
    assert "=== target-only" in out.stdout and "=== speculative" not in out.stdout
    error = out.stderr.strip()
    assert error.startswith("error: drafter 'ngarm' not loaded: unknown model 'ngarm' (did you mean ngram?)")
    assert error.endswith("ngram (prompt lookup, no model), or none (no drafter: the target alone)")


def test_a_token_count_past_the_context_is_refused_when_set(capsys):
    """It used to be accepted, then every prompt failed; now :tokens and the flag name the limit at once."""
    out = run_console(":tokens 100000\n:n 255\n:help\n")
    assert out.stderr == "error: :tokens 100000: at most 255 new tokens fit the target's context of 256 tokens " \
                         "(a prompt takes at least one)\n"
    assert out.stdout.startswith("tokens: 255\n")  # 255 fits a one-token prompt
    assert main(["--n_tokens_to_generate", "100000"]) == 2
    assert capsys.readouterr().err == "error: --n_tokens_to_generate 100000: at most 255 new tokens fit the " \
                                      "target's context of 256 tokens (a prompt takes at least one)\n"


def test_a_prediction_alone_points_to_compare_and_a_measured_run_does_not():
    out = run_console(":tokens 10\nROMEO:\n:compare on\nROMEO:\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    alone, compared = [line for line in out.stdout.splitlines() if line.startswith("speculative: ")]
    assert alone.endswith("x (:compare on measures it)"), alone
    assert ", measured " in compared and ":compare" not in compared, compared


@pytest.mark.parametrize("line, settings, answer", [
    (":temperature 0", Settings(), "temperature: already 0"),
    (":sampling greedy", Settings(), "sampling: already greedy"),
    (":tokens 200", Settings(), "tokens: already 200"),
    (":trace off", Settings(), "trace: already off"),
    (":temperature 0.5", Settings(), "temperature: 0.5, sampling: plain T=0.5"),
])
def test_a_setting_given_its_own_value_says_it_is_already_that(line, settings, answer):
    assert parse_command(line, settings).message == answer


@pytest.mark.parametrize("settings, why", [
    (Settings(drafter="ngram"), "prompt lookup found no match"),
    (Settings(drafter="ngram", tree=(3, 1)), "prompt lookup found no match"),
    (Settings(drafter="ngram", K="auto"), "K=0, or prompt lookup found no match"),
    (Settings(drafter="shakespeare-260K", K="auto"), "K=0"),
])
def test_an_empty_round_says_why_it_drafted_nothing(settings, why):
    tokenizer = gpt2np.load_model("shakespeare-260K").tokenizer
    event = gpt2np.RoundEvent(tokens=tokenizer.encode("A"), provenance=["target"], K=0, n_emitted=3)
    assert trace_lines(event, 3, tokenizer, no_drafts=no_drafts_why(settings)) == \
        [f"  round 3 (tokens 3-3): no drafts ({why}), target token 'A'"]


@pytest.mark.parametrize("argv, n_tokens", [
    ([], 200), (["--target_model_size", "shakespeare-2.6M", "--draft_model_size", "shakespeare-260K"], 200),
    (["--target_model_size", "shakespeare-2.6M"], 200), (["--target_model_size", "124M"], 40),
])
def test_the_bundled_target_gets_200_tokens_however_it_is_named(argv, n_tokens):
    assert initial_settings(parse_args(argv)).n_tokens == n_tokens


def test_the_help_states_the_token_rule_and_none(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "200 when the target is a bundled model (shakespeare-2.6M, shakespeare-260K), named or not; 40 for any " \
           "other target" in text
    assert "'none' (start with target-only runs until :drafter)" in text


def test_the_installed_console_names_itself(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/gpt2np-console"])
    with pytest.raises(SystemExit):
        parse_args(["--bogus"])
    assert capsys.readouterr().err.startswith("gpt2np-console: error: unrecognized arguments: --bogus")


def test_ctrl_c_while_the_console_imports_exits_130_without_a_traceback():
    """KeyboardInterrupt raised by the console's import of its loop, as a Ctrl-C in NumPy's import would."""
    out = run_with_ctrl_c_at_import("name == 'repl' and level == 1",
                                    "runpy.run_module('gpt2np.console', run_name='__main__')")
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr


def test_a_target_without_a_tokenizer_is_refused_before_its_init(tmp_path, no_random_init, capsys):
    """random:124M without GPT-2's BPE files (and random:tiny's 64 tokens) gave a traceback at the first prompt;
    now one line and status 2 at start, before the weights are built (random:1558M's take about 30 s)."""
    for name in ("random:124M", "random:tiny"):
        status = main(["--target_model_size", name, "--models_dir", str(tmp_path)])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: {name} has no tokenizer to encode prompts with"), err
    out = run_console("ROMEO:\n", "--target_model_size", "random:tiny", "--models_dir", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr

def test_a_random_draft_of_another_vocabulary_is_refused_before_its_init(no_random_init, capsys):
    """--draft_model_size random:1558M (and :drafter random:1558M, the same loader) beside the bundled target
    built the draft's weights (about 30 s) before saying the vocabularies differ: now before."""
    status = main(["--draft_model_size", "random:1558M"])
    assert (status, capsys.readouterr().err) == (2, "error: draft and target must share a vocabulary: n_vocab 50257 vs 257 (draft vs target)\n")


def test_K_max_past_the_bound_is_refused_at_start_and_at_K(capsys):
    """--K_max 999999999999 with tree auto ran out of memory at the first prompt, and :K auto 999999999999 hung
    there: refused in one line, at start (status 2) and at the command (the setting stays)."""
    assert main(["--tree", "auto", "--K_max", "999999999999"]) == 2
    assert capsys.readouterr().err == "error: --K_max must be an integer from 1 to 32, got 999999999999\n"
    out = run_console(":K auto 33\n:help\n", "--n_tokens_to_generate", "3")  # :help shows every setting
    assert out.returncode == 0 and "K_max must be an integer from 1 to 32, got 33" in out.stdout + out.stderr, out
    assert re.search(r":K N\|heuristic\|auto \[K_max\] +4 ", out.stdout), out.stdout  # still the default, K = 4
