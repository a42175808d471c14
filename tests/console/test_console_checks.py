"""The console's trace of token-tree rounds (the nodes the kernel really tried, in its order), and
the flag and command combinations it refuses in one line rather than drop a setting silently.

Trace runs go through a real pipe on the bundled pair and are compared with
speculative_generate(..., trace=True) for the same drafter, tree, seed and temperature.
"""
import re
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO
from gpt2np.console.commands import CommandError, Settings, parse_command
from gpt2np.console.display import trace_lines
from gpt2np.console.repl import main
from test_console import run_console

TREE_PROMPT = "ROMEO:\n"  # with tree 3,2 at temperature 1, seed 1: rounds that reject siblings, then accept one
NODE_LINE = re.compile(r"^    node (\d+) (.+?) +\(under (?:the root|node (\d+))\)  p\(x\)=([\d.]+)  q\(x\)=([\d.]+)  "
                       r".*  (accepted|rejected)$")


@pytest.fixture(scope="module")
def pair():
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def is_tree(record):
    return tuple(record.parents) != tuple(range(-1, len(record.parents) - 1))


def tree_rounds(stdout):
    """{round number: its trace lines} for the rounds traced as trees."""
    trace = stdout.split("trace (p = target, q = draft")[1].split("\nspeculative: ")[0]
    rounds = re.findall(r"^  round (\d+) \(tokens [\d-]+\): (tree of .*?)(?=^  round |\Z)", trace, flags=re.M | re.S)
    return {int(n): text.rstrip("\n").splitlines() for n, text in rounds}


@pytest.mark.parametrize("drafter", ["ngram", "shakespeare-260K"])
def test_a_tree_round_is_traced_by_the_nodes_tried_and_their_tokens_make_the_round(pair, drafter):
    target, draft = pair
    out = run_console(f":drafter {drafter}\n:tree 3,2\n:sampling plain 1\n:seed 1\n:tokens 30\n:trace on\n"
                      f"{TREE_PROMPT.replace(chr(10), chr(92) + 'n')}\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    drafting = gpt2np.NgramDrafter(n_max=3) if drafter == "ngram" else draft
    records = gpt2np.speculative_generate(target, drafting, target.tokenizer.encode(TREE_PROMPT), 30, temperature=1.0,
                                          rng=np.random.default_rng(1), tree=(3, 2), trace=True).trace
    traced = tree_rounds(out.stdout)
    trees = {n: r for n, r in enumerate(records, 1) if r.drafts and is_tree(r)}
    assert set(traced) == set(trees) and any(r.path and not all(a for _, a in r.tried) for r in trees.values())
    label = lambda t: repr(target.tokenizer.decode([t]))  # noqa: E731
    for n, record in trees.items():
        nodes = [NODE_LINE.match(line) for line in traced[n][1:-1]]
        assert all(nodes), traced[n]
        assert [(int(m[1]), m[6] == "accepted") for m in nodes] == list(record.tried), (traced[n], record.tried)
        for m in nodes:
            node = int(m[1])
            assert m[2] == label(record.drafts[node - 1]) and int(m[3] or 0) == record.parents[node], m[0]
            assert abs(float(m[4]) - record.p_at_drafts[node - 1]) <= 5e-5, m[0]
            assert abs(float(m[5]) - record.q_at_drafts[node - 1]) <= 5e-5, m[0]
        kind, rest = traced[n][-1].split(maxsplit=1)
        accepted = [m[2] for m in nodes if m[6] == "accepted"]
        assert accepted + [rest[:len(label(record.tokens[-1]))]] == [label(t) for t in record.tokens], traced[n]
        assert kind == record.provenance[-1] and (kind == "bonus") == (record.path[-1:] != ()
                                                                        and record.path[-1] not in record.parents)


def test_a_tree_round_traced_by_hand_says_what_the_kernel_did():
    """Node 1 'A' rejected, its sibling node 2 'B' accepted (tested against the residual), then
    node 5 under it rejected and the target resampled: never 'all drafts accepted'."""
    tokenizer = gpt2np.load_model("shakespeare-260K").tokenizer
    A, B, C, D, E, F = (tokenizer.encode(c)[0] for c in "ABCDEF")
    event = gpt2np.RoundEvent(tokens=[B, F], provenance=["draft", "resample"], K=5, n_emitted=2,
                              drafts=[A, B, C, D, E], decisions=[True, False], q_at_drafts=[0.5, 0.4, 0.1, 0.5, 0.2],
                              p_at_drafts=[0.25, 0.6, 0.1, 0.3, 0.1], parents=(-1, 0, 0, 1, 2, 2),
                              path=(2,), tried=((1, False), (2, True), (4, False)))
    assert trace_lines(event, 1, tokenizer) == [
        "  round 1 (tokens 1-2): tree of 5 nodes, drafted 1:'A' 2:'B' 3:'C' 4:'D' 5:'E'",
        "    node 1 'A'      (under the root)  p(x)=0.2500  q(x)=0.5000  min(1, p/q)=0.5000  rejected",
        "    node 2 'B'      (under the root)  p(x)=0.6000  q(x)=0.4000  tested against the residual  accepted",
        "    node 4 'D'      (under node 2)  p(x)=0.3000  q(x)=0.5000  min(1, p/q)=0.6000  rejected",
        "    resample 'F'  (every child of node 2 rejected)"]


STARTUP = [
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["--K", "3", "--tree", "3"],
     "--tree fixes each round's drafts: leave --K out (a tree round's K is the nodes it drafts)"),
    (["--target_model_size", "shakespeare-2.6M", "--tree", "3"],
     "--tree needs a drafter: add --draft_model_size (a model name, or ngram)"),
    (["--target_model_size", "shakespeare-2.6M", "--K", "3"],
     "--K needs a drafter: add --draft_model_size (a model name, or ngram)"),
]


@pytest.mark.parametrize("argv, message", STARTUP + [
    (["--tree", "auto", "--draft_model_size", "ngram"],
     "--tree auto picks the shapes a draft model grows; prompt lookup takes a fixed shape, e.g. --tree 3,1"),
    (["--K", "x"], "--K must be an integer >= 1, 'heuristic' or 'auto', got 'x'"),
    (["--K", "auto", "--K_max", "0"], "--K_max must be an integer from 1 to 32, got 0"),
    (["--top_p", "2"], "--top_p must be in (0, 1]"),
])
def test_flags_that_cannot_run_as_given_exit_2_at_startup_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("argv, message", STARTUP)
def test_the_console_refuses_these_flags_in_main_py_s_words(capsys, argv, message):
    said = subprocess.run([sys.executable, "main.py", *argv, "--n_tokens_to_generate", "1"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert main([*argv, "--n_tokens_to_generate", "1"]) == 2 == said.returncode
    assert capsys.readouterr().err == said.stderr == f"error: {message}\n", said.stderr


def test_K_turns_a_tree_off_and_the_next_run_drafts_a_chain_of_K():
    new = parse_command(":K 2", Settings(drafter="d", tree=(3, 2, 1)))
    assert (new.settings.K, new.settings.tree, new.message) == (2, None, "K: 2, tree: off")
    assert parse_command(":K auto 6", Settings(drafter="d", tree="auto")).settings.tree is None
    out = run_console(":tree 3,2,1\n:K 2\n:tokens 4\nROMEO:\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "=== speculative (shakespeare-2.6M, drafter shakespeare-260K, K=2) ===" in out.stdout, out.stdout


@pytest.mark.parametrize("line, settings", [(":tree auto", Settings(drafter="ngram")),
                                            (":drafter ngram", Settings(drafter="d", tree="auto")),
                                            (":tree auto", Settings(drafter="ngram", tree=(3, 1)))])
def test_tree_auto_and_prompt_lookup_are_refused_together_in_one_line(line, settings):
    with pytest.raises(CommandError, match=re.escape(":tree auto picks the shapes a draft model grows; prompt lookup "
                                                     "takes a fixed shape, e.g. :tree 3,1")):
        parse_command(line, settings)
    assert parse_command(":tree 3,1", Settings(drafter="ngram")).settings.tree == (3, 1)
    assert parse_command(":drafter ngram", Settings(drafter="d", tree=(3, 1))).argument == "ngram"


def test_a_console_script_refuses_tree_auto_with_prompt_lookup_and_carries_on(pair):
    out = run_console(":drafter ngram\n:tree auto\n:tokens 4\nROMEO:\n")
    assert out.returncode == 0 and out.stderr.splitlines() == [
        "error: :tree auto picks the shapes a draft model grows; prompt lookup takes a fixed shape, e.g. :tree 3,1"]
    assert "=== speculative (shakespeare-2.6M, drafter ngram, K=4) ===" in out.stdout, out.stdout


@pytest.mark.parametrize("text, got", [("8,8", "72 nodes"), ("100", "100 children a node"), ("9,1", "9 children")])
def test_a_tree_past_the_caps_is_one_line_at_startup_and_in_the_repl(capsys, text, got):
    """The console caps a typed tree as main.py does (report.TREE_MAX_WIDTH, TREE_MAX_NODES): 8 children a node,
    64 nodes, the rows the loop keeps for a tree; a bigger one would be cut every round without a word."""
    with pytest.raises(CommandError) as refused:
        parse_command(f":tree {text}", Settings(drafter="d"))
    assert "is too big: at most 8 children a node and 64 nodes in all" in str(refused.value), refused.value
    assert got in str(refused.value), refused.value
    assert parse_command(":tree 8,7", Settings(drafter="d")).settings.tree == (8, 7)  # 8 + 56 = 64 nodes: room enough
    assert main(["--tree", text, "--n_tokens_to_generate", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is too big" in err and err.count("\n") == 1, err


def test_a_closed_stdin_is_the_end_of_input(monkeypatch, capsys):
    """`python -m gpt2np.console <&-` (Python's sys.stdin is None) was an AttributeError traceback at isatty();
    it is no lines to read, as </dev/null: the models load, the console ends with status 0."""
    monkeypatch.setattr(sys, "stdin", None)
    assert main(["--n_tokens_to_generate", "3"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/dev/full is Linux's")
def test_a_full_stdout_is_one_line_and_status_2():
    """printf 'ROMEO:\\n' | python -m gpt2np.console >/dev/full was an OSError traceback at write(), and
    >&- an AttributeError; each is one line on stderr and status 2, as main.py's (report.run_command)."""
    with open("/dev/full", "w") as full:
        shown = subprocess.run([sys.executable, "-m", "gpt2np.console", "--n_tokens_to_generate", "3"],
                               input="ROMEO:\n", stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO,
                               timeout=300)
    assert shown.returncode == 2 and shown.stderr == "error: [Errno 28] No space left on device\n", shown.stderr


def test_a_closed_stdout_is_one_line_and_status_2(monkeypatch, capsys):
    """python -m gpt2np.console >&- (sys.stdout is None): one line, before any model loads."""
    from gpt2np.console.__main__ import run
    monkeypatch.setattr(sys, "argv", ["console", "--n_tokens_to_generate", "3"])
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(SystemExit) as exited:
        run()
    assert exited.value.code == 2
    assert capsys.readouterr().err == "error: stdout is closed: the command writes its text there (send it to a " \
                                      "file, or >/dev/null)\n"
