"""python -m gpt2np.console, driven as a user or a script drives it: lines on stdin through a real
pipe (and a pseudo-terminal for what only a terminal gets), output checked against the package.

Every run uses the bundled pair (byte-level Shakespeare, offline) with few tokens. The texts the
console prints are compared with what gpt2np.generate / speculative_generate give for the same
model, seed and sampling options, decoded with the tokenizer; the command table itself is tested
in-process (parse_command is pure).
"""
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gpt2np
from conftest import REPO
from gpt2np.console.repl import main
from gpt2np.console.commands import CommandError, Settings, help_text, parse_command

PROMPT = "ROMEO:"


def run_console(script, *args, env=None):
    """The console as `printf script | python -m gpt2np.console args`; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "gpt2np.console", *args], input=script, capture_output=True,
                          text=True, cwd=REPO, timeout=300, env=env)


def sections(stdout):
    """{run label: [printed text (prompt + continuation), ...]} for every run in the output."""
    found = {}
    pattern = r"^=== (?P<label>[^(\n]+) \([^\n]*\) ===\n(?P<text>.*?)\n(?:trace .*?\n|legend:.*?\n)?(?P=label): \d+ tokens in "
    for m in re.finditer(pattern, stdout, flags=re.M | re.S):
        found.setdefault(m["label"], []).append(m["text"])
    return found


@pytest.fixture(scope="module")
def pair():
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def text_of(model, tokens, prompt=PROMPT):
    return prompt + model.tokenizer.decode(tokens)


def test_greedy_runs_print_what_generate_gives_for_each_model(pair):
    """Target-only, draft-only, speculative, and each again without the KV cache, at temperature 0."""
    target, draft = pair
    out = run_console(f":temperature 0\n:tokens 30\n:target on\n:draft on\n:cache off\n{PROMPT}\n:quit\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    ids = target.tokenizer.encode(PROMPT)
    want_target = text_of(target, gpt2np.generate(target, ids, 30, temperature=0))
    want_draft = text_of(draft, gpt2np.generate(draft, ids, 30, temperature=0))
    assert want_target != want_draft  # otherwise the draft-only check below proves little
    assert sections(out.stdout) == {"target-only": [want_target], "target-only, no KV cache": [want_target],
                                    "draft-only": [want_draft], "draft-only, no KV cache": [want_draft],
                                    "speculative": [want_target], "speculative, no KV cache": [want_target]}
    table = out.stdout.split("\ngenerator ")[1].splitlines()  # the side-by-side table, one row per run
    assert [row.split("  ")[0] for row in table[1:]] == ["target-only", "target-only, no KV cache", "draft-only",
                                                         "draft-only, no KV cache", "speculative",
                                                         "speculative, no KV cache"]
    assert "DIFFERS" not in out.stdout and table[-1].endswith("= target-only")
    assert re.search(r"^speculative: 30 tokens in [\d.]+ s, [\d.]+ tokens/s \| drafter shakespeare-260K, "
                     r"fixed K=4, alpha_hat [\d.]+, .* measured [\d.]+x$", out.stdout, flags=re.M), out.stdout
    assert re.search(r"^target-only, no KV cache: 30 tokens .* the KV cache is [\d.]+x faster$", out.stdout, re.M)


SEEDED = f":sampling top_k 20 0.9\n:seed 7\n:tokens 25\n:compare on\n:draft on\n{PROMPT}\n{PROMPT}\n"


@pytest.fixture(scope="module")
def seeded_runs():
    return [run_console(SEEDED) for _ in range(2)]


def test_seeded_sampling_is_reproducible_across_invocations(seeded_runs):
    first, second = (sections(run.stdout) for run in seeded_runs)
    assert all(run.returncode == 0 and run.stderr == "" for run in seeded_runs)
    assert set(first) == {"target-only", "draft-only", "speculative"}
    assert first == second
    for label, (a, b) in first.items():  # each run draws from a fresh default_rng(seed): prompts repeat too
        assert a == b, label


def test_each_generator_draws_from_its_own_seeded_generator(pair, seeded_runs):
    """The texts are exactly the package's with np.random.default_rng(seed), one per generator."""
    target, draft = pair
    ids, options = target.tokenizer.encode(PROMPT), dict(temperature=0.9, top_k=20)
    rng = lambda: np.random.default_rng(7)  # noqa: E731
    printed = sections(seeded_runs[0].stdout)
    assert printed["target-only"][0] == text_of(target, gpt2np.generate(target, ids, 25, rng=rng(), **options))
    assert printed["draft-only"][0] == text_of(draft, gpt2np.generate(draft, ids, 25, rng=rng(), **options))
    spec = gpt2np.speculative_generate(target, draft, ids, 25, K=4, rng=rng(), **options)
    assert printed["speculative"][0] == text_of(target, spec.tokens)


def test_every_setting_command_answers_with_what_changed_and_help_shows_it():
    commands = [(":K 3", "K: 3"), (":k auto 12", "K: auto <= 12"), (":K heuristic", "K: heuristic <= 12"),
                (":temperature 0.7", "temperature: 0.7, sampling: plain T=0.7"), (":top_k 40", "top_k: 40, "
                 "sampling: top_k 40 T=0.7"), (":top_p 0.9", "top_p: 0.9, sampling: top_k 40 + nucleus 0.9 T=0.7"),
                (":top_k off", "top_k: off, sampling: nucleus 0.9 T=0.7"),
                (":sampling greedy", "temperature: 0, top_p: off, sampling: greedy"),
                (":sampling plain", "temperature: 1, sampling: plain T=1"),
                (":sampling top_k 5 0.5", "temperature: 0.5, top_k: 5, sampling: top_k 5 T=0.5"),
                (":processor nucleus 0.8", "temperature: 1, top_k: off, top_p: 0.8, sampling: nucleus 0.8 T=1"),
                (":seed 3", "seed: 3"), (":tokens 17", "tokens: 17"), (":target on", "target: on"),
                (":draft", "draft: on"), (":speculative off", "speculative: off"),
                (":compare on", "compare: on"), (":compare off", "compare: off"),
                (":trace on", "trace: on"), (":cache off", "cache: off"), (":seed 3", "seed: already 3")]
    script = "\n".join(c for c, _ in commands) + "\n:drafter ngram\n:help\n:clear\n:quit\nnever run\n"
    out = run_console(script)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[:len(commands)] == [answer for _, answer in commands]
    assert lines[len(commands)] == ("drafter: ngram (draft-only off: prompt lookup has no model to write alone) "
                                    "(speculative off: :speculative on)")  # :speculative off above: said
    now = {line.split()[0]: line for line in lines[len(commands) + 2:]}  # help: command, value now, what
    for command, value in [(":K", "heuristic <= 12"), (":temperature", "1"), (":top_p", "0.8"), (":seed", "3"),
                           (":sampling", "nucleus 0.8 T=1"), (":tokens", "17"), (":trace", "on"),
                           (":cache", "off"), (":draft", "off"), (":drafter", "ngram"), (":speculative", "off"),
                           (":target", "on"), (":compare", "off")]:
        assert re.search(rf"\s{re.escape(value)}\s", now[command]), (command, value, now[command])
    assert set(now) >= {":target", ":compare", ":top_k", ":clear", ":help", ":quit"}
    assert "\033" not in out.stdout and "never run" not in out.stdout  # no escapes into a pipe; quit quits


BAD = [(":bogus", "unknown command :bogus"), (":", "empty command"), (":K 0", ":K must be an integer >= 1"),
       (":K three", ":K must be an integer >= 1"), (":K 3 5", "K_max bounds"), (":K auto 0", "K_max must be"),
       (":temperature -1", "temperature must be a finite number >= 0"), (":temperature hot", "must be a number"),
       (":top_k 0", "top_k must be an integer >= 1"), (":top_p 1.5", "top_p must be in (0, 1]"),
       (":top_p nan", "finite"), (":sampling", "usage: :sampling"), (":sampling top_k", "usage: :sampling"),
       (":sampling plain 0", "needs a temperature > 0"), (":sampling nucleus 0 1", "top_p must be in"),
       (":seed -1", "seed must be an integer >= 0"), (":tokens 0", "tokens must be an integer >= 1"),
       (":tokens", "usage: :tokens"), (":trace maybe", ":trace takes on or off"), (":help me", "usage: :help"),
       (":drafter", "usage: :drafter"), (":drafter nonsense", "drafter 'nonsense' not loaded: unknown model"),
       (":drafter ngram", None), (":draft on", "draft-only is not available with the ngram drafter"),
       (":tokens 300", ":tokens 300: at most 255 new tokens fit the target's context of 256 tokens"),
       (":tokens 255", None), (PROMPT, "prompt (6 tokens) + :tokens (255) = 261 exceeds the context of 256 tokens"),
       (":target off\n:speculative off", None), (PROMPT, "every generator is off")]


def test_bad_commands_print_one_line_each_and_the_console_carries_on_until_end_of_input(pair):
    prompts = ["ROMEO:\\nWhat", "::ROMEO:"]  # typed: '\n' is a newline, '::' starts a prompt with ':'
    script = "\n".join(line for line, _ in BAD) + "\n:speculative on\n:tokens 10\n" + "\n".join(prompts)  # no :quit
    out = run_console(script)
    assert out.returncode == 0, out.stderr
    errors = out.stderr.splitlines()
    expected = [message for _, message in BAD if message]
    assert len(errors) == len(expected), out.stderr
    for line, message in zip(errors, expected):
        assert line.startswith("error: ") and message in line, (line, message)
    target = pair[0]
    want = [text_of(target, gpt2np.generate(target, target.tokenizer.encode(p), 10, temperature=0), p)
            for p in ("ROMEO:\nWhat", ":ROMEO:")]
    assert sections(out.stdout) == {"speculative": want}  # still working (with the ngram drafter)


def test_debug_trace_shows_every_round_of_the_package_trace(pair):
    target, draft = pair
    out = run_console(f":trace on\n:temperature 0.8\n:K 3\n:tokens 16\n:seed 5\n{PROMPT}\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    trace = out.stdout.split("trace (p = target, q = draft")[1].split("\nspeculative: ")[0]
    rounds = re.split(r"\n  round \d+ ", trace)[1:]
    ids = target.tokenizer.encode(PROMPT)
    records = gpt2np.speculative_generate(target, draft, ids, 16, K=3, temperature=0.8,
                                          rng=np.random.default_rng(5), trace=True).trace
    assert len(rounds) == len(records)
    for text, record in zip(rounds, records):
        lines = text.splitlines()
        label = lambda t: repr(target.tokenizer.decode([t]))  # noqa: E731
        if not record.drafts:  # the last round: one token still wanted, so no drafts
            assert lines == [f"(tokens 16-16): no drafts (K=0), target token {label(record.tokens[0])}"]
            continue
        assert lines[0].endswith("drafted " + " ".join(label(t) for t in record.drafts))
        checks = lines[1:-1]
        assert len(checks) == len(record.decisions)
        for line, accepted, p, q in zip(checks, record.decisions, record.p_at_drafts, record.q_at_drafts):
            shown = dict(re.findall(r"(p\(x\)|q\(x\)|min\(1, p/q\))=([\d.]+)", line))
            assert abs(float(shown["p(x)"]) - p) <= 5e-5 and abs(float(shown["q(x)"]) - q) <= 5e-5, line
            assert abs(float(shown["min(1, p/q)"]) - min(1.0, p / q)) <= 5e-5, line
            assert line.endswith("accepted" if accepted else "rejected")
        kind, rest = lines[-1].split(maxsplit=1)  # the token's repr may hold spaces: "resample ' ' ..."
        assert kind == record.provenance[-1] and (rest + " ").startswith(label(record.tokens[-1]) + " "), lines[-1]


def test_drafter_switch_ngram_and_back_without_restarting(pair):
    target, draft = pair
    script = (f":tokens 12\n:drafter ngram\n{PROMPT}\n:drafter shakespeare-260K\n:draft on\n{PROMPT}\n"
              ":drafter ngram\n:draft on\n")
    out = run_console(script)
    assert out.returncode == 0
    ids = target.tokenizer.encode(PROMPT)
    greedy_target = text_of(target, gpt2np.generate(target, ids, 12, temperature=0))
    assert sections(out.stdout) == {"speculative": [greedy_target] * 2,
                                    "draft-only": [text_of(draft, gpt2np.generate(draft, ids, 12, temperature=0))]}
    assert "drafter ngram (n <= 3)" in out.stdout and "drafter shakespeare-260K, fixed K=4" in out.stdout
    assert "drafter: ngram (draft-only off" in out.stdout
    assert out.stderr.splitlines() == ["error: draft-only is not available with the ngram drafter (prompt lookup is "
                                       "not a model that can write alone): :drafter MODEL first"]


def read_until(fd, marker, timeout=120):
    """Bytes from a pseudo-terminal until marker appears (or the child closed it)."""
    buffer, end = b"", time.monotonic() + timeout
    while marker not in buffer and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child exited
                break
            buffer += chunk
    return buffer


@pytest.mark.parametrize("no_color", [{}, {"NO_COLOR": "1"}, {"TERM": "dumb"}], ids=["colour", "NO_COLOR", "TERM=dumb"])
def test_on_a_terminal_prompt_colours_clear_and_ctrl_d(no_color):
    """A pseudo-terminal: the prompt, provenance colours unless NO_COLOR or TERM=dumb, :clear's escape, Ctrl-D quits."""
    import pty
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm"} | no_color
    no_color = bool(no_color)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the console on the terminal
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "gpt2np.console", "--n_tokens_to_generate", "12"], env)
    try:
        assert b"gpt2np> " in read_until(fd, b"gpt2np> ")
        os.write(fd, f"{PROMPT}\n".encode())
        run = read_until(fd, b"\ngpt2np> ")
        os.write(fd, b":clear\n")
        cleared = read_until(fd, b"gpt2np> ")
        os.write(fd, b"\x04")  # Ctrl-D
        read_until(fd, b"never")
        status = os.waitpid(pid, 0)[1]
    finally:
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"speculative: 12 tokens" in run and b"Traceback" not in run
    assert (b"\033[32m" in run) is not no_color and (b"legend" in run) is not no_color
    assert b"\033[H\033[2J" in cleared


@contextlib.contextmanager
def ctrl_c_reaches_children():
    """Children started inside get SIGINT's default action, as a program started at a terminal does.

    A command started in the background without job control (`pytest ... &` in a script, a CI step
    run that way) ignores SIGINT, and an ignored signal stays ignored across fork and exec: the
    console would then never see its Ctrl-C (Python installs KeyboardInterrupt only where SIGINT was
    not ignored when it started). With a handler installed here instead, exec gives the child the
    default action. The hang this caused was seen as "the console did not quit" in such runs."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_a_run_then_quits_at_the_prompt_without_a_traceback():
    with ctrl_c_reaches_children():
        console = subprocess.Popen([sys.executable, "-m", "gpt2np.console"], cwd=REPO, text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # SIGABRT: every thread's stack
    console.stdin.write(f":tokens 250\n:cache off\n:target on\n:speculative off\n{PROMPT}\n")  # a slow run
    console.stdin.flush()
    while "=== target-only, no KV cache" not in console.stdout.readline():
        pass  # it recomputes ~250 contexts, seconds of work: Ctrl-C lands inside it
    console.send_signal(signal.SIGINT)
    console.stdin.write(f":tokens 5\n{PROMPT}\n:help\n")  # the console is still there
    console.stdin.flush()
    output = []
    while not output or not output[-1].startswith("  :quit"):  # help's last line: now it waits for input
        output.append(console.stdout.readline())
    console.send_signal(signal.SIGINT)  # at the prompt: quit
    try:
        console.wait(timeout=60)
    except subprocess.TimeoutExpired:  # say where it hung (faulthandler's dump)
        console.send_signal(signal.SIGABRT)
        console.wait(timeout=10)
        pytest.fail(f"the console did not quit on Ctrl-C at the prompt; last output {output[-2:]}; "
                    f"stderr:\n{console.stderr.read()[-4000:]}")
    err = console.stderr.read()
    console.stdin.close(), console.stdout.close(), console.stderr.close()
    assert any(line.startswith("target-only, no KV cache: 5 tokens") for line in output), output
    assert console.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip() == "error: interrupted: back to the prompt (Ctrl-C again, Ctrl-D or :quit to leave)"


@pytest.mark.parametrize("argv, message", [
    (["--K", "0"], "--K must be an integer >= 1, 'heuristic' or 'auto', got 0"),
    (["--temperature", "-2"], "--temperature must be"),
    (["--n_tokens_to_generate", "0"], "--n_tokens_to_generate must be positive"),
    (["--target_model_size", "999M"], "unknown model '999M'"),
    (["--draft_model_size", "nonsense"], "unknown model 'nonsense'"),
])
def test_bad_flags_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("line, settings, fields", [
    (":K auto", Settings(), {"K": "auto", "K_max": 8}),
    (":sampling nucleus 0.95", Settings(top_k=7), {"temperature": 1.0, "top_k": None, "top_p": 0.95}),
    (":top_p none", Settings(top_p=0.5), {"top_p": None}),
    (":compare", Settings(drafter="d"), {"compare": True, "target": False, "speculative": True}),
    (":compare", Settings(drafter="d", target=True, speculative=False),
     {"compare": True, "target": True, "speculative": False}),
    (":compare off", Settings(drafter="d", target=True, compare=True), {"compare": False, "target": True}),
    (":target on", Settings(drafter="d"), {"compare": False, "target": True, "speculative": True}),
    (":cache", Settings(), {"cache": False}),
    (":n 9", Settings(), {"n_tokens": 9}),
])
def test_parse_command_sets_fields(line, settings, fields):
    new = parse_command(line, settings).settings
    assert {name: getattr(new, name) for name in fields} == fields


@pytest.mark.parametrize("line, settings, message", [
    (":speculative on", Settings(drafter=None, speculative=False), "needs a drafter"),
    (":draft on", Settings(drafter=None), "draft-only needs a draft model"),
    (":compare on", Settings(drafter=None), "compare needs a drafter"),
    (":top_k 5", Settings(temperature=0.5, top_p=2.0), "top_p must be in"),
])
def test_parse_command_refuses_what_cannot_run(line, settings, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        parse_command(line, settings)


def test_help_names_every_command_and_action():
    from gpt2np.console.commands import ACTIONS, COMMANDS
    text = help_text(Settings())
    for name in [*COMMANDS, *ACTIONS]:
        assert re.search(rf"^  :{name}\b", text, flags=re.M), name
