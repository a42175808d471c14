"""The console, driven the way a test can drive it: a script of lines on stdin (issues 11 and 15).

Every command is exercised and its effect checked in the output; at temperature 0, target-only,
draft-only, target-only without the KV cache and speculative runs must print exactly what
gpt2np.generate gives for each model.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gpt2np

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^--- (?P<label>[^\n]*) ---\n(?P<text>.*?)\n» (?P<n>\d+) tokens in (?P<s>[\d.]+) s: "
                   r"(?P<rate>[\d.]+) tokens/s$", re.MULTILINE | re.DOTALL)


def console(script, *flags, timeout=120):
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "gpt2np.console", *flags], input=script, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def blocks(stdout):
    """[(label, text after the prompt line, tokens, seconds, tokens/s)] in order."""
    return [(m["label"], m["text"], int(m["n"]), float(m["s"]), float(m["rate"])) for m in BLOCK.finditer(stdout)]


@pytest.fixture(scope="module")
def pair():
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def greedy_text(model, prompt, n):
    return model.tokenizer.decode(gpt2np.generate(model, model.tokenizer.encode(prompt), n, temperature=0))


def test_every_generator_at_temperature_0_prints_what_generate_gives(pair):
    target, draft = pair
    out = console(":n 30\n:on target nocache draft speculative\nROMEO:\n").stdout
    got = {label.split(":")[0]: (text, n, rate) for label, text, n, _, rate in blocks(out)}
    assert set(got) == {"target-only", "target-only, no KV cache", "draft-only", "speculative"}, out
    expected = {"target-only": target, "target-only, no KV cache": target, "draft-only": draft, "speculative": target}
    for name, model in expected.items():
        text, n, rate = got[name]
        assert text == "ROMEO:" + greedy_text(model, "ROMEO:", 30), name
        assert n == 30 and rate > 0
    assert re.search(r"alpha_hat [\d.]+, [\d.]+ tokens/target call, .* measured [\d.]+x", out)  # vs target-only


def test_prompt_lookup_drafter_and_policies(pair):
    target, _ = pair
    out = console(":drafter ngram\n:on draft target\n:K auto\n:n 25\nROMEO: ROMEO:\n:K heuristic\nJULIET:\n").stdout
    assert "drafter: ngram (n <= 3)" in out and "draft-only: not available with ngram" in out
    spec = [(label, text) for label, text, *_ in blocks(out) if label.startswith("speculative")]
    assert [label.split(", K ")[1] for label, _ in spec] == ["auto", "heuristic"]
    assert spec[0][1] == "ROMEO: ROMEO:" + greedy_text(target, "ROMEO: ROMEO:", 25)
    assert "auto, K used" in out and "heuristic, K used" in out


def test_seeded_sampling_is_reproducible_and_the_seed_matters():
    script = ":sampling top_k 20 1.0\n:seed {}\n:on target\nROMEO:\n"
    first, again, other = (console(script.format(seed)).stdout for seed in (3, 3, 4))
    texts = lambda out: [text for _, text, *_ in blocks(out)]  # noqa: E731
    assert texts(first) == texts(again) and texts(first) != texts(other)


def test_help_shows_the_current_value_of_every_setting():
    out = console(":K auto\n:K_max 5\n:sampling nucleus 0.9 0.7\n:seed 7\n:n 11\n:cache off\n:trace on\n"
                  ":drafter ngram\n:off speculative\n:on draft\n:help\n").stdout
    help_text = out[out.index("commands"):]
    for expected in ["now auto", "now 5", "nucleus (temperature 0.7, top_p 0.9)", "now 7", "now 11",
                     "now ngram", "now nocache, draft", "now off\n", "trace on | off"]:
        assert expected in help_text, expected
    assert re.search(r":trace on \| off .* now on", help_text) and re.search(r":cache on \| off .* now off", help_text)


@pytest.mark.parametrize("command, message", [
    (":bogus", "unknown command :bogus"), (":K 0", "K (draft tokens per round) must be"),
    (":K_max 0", "K_max must be at least 1"), (":temperature -1", "temperature must be"),
    (":top_p 1.5", "top_p must be in (0, 1]"), (":top_k 0", "top_k must be"), (":seed -2", "seed must be >= 0"),
    (":n 0", "n must be at least 1"), (":n ten", "n must be an integer"), (":sampling nucleus", "nucleus P [T]"),
    (":sampling nucleus 1.5", "top_p must be"),
    (":sampling sample 0", "use :sampling greedy"), (":sampling magic", "use greedy"),
    (":on everything", "not 'everything'"), (":trace maybe", ":trace on | off"),
    (":drafter nosuchmodel", "unknown model 'nosuchmodel'"), (":drafter", ":drafter ngram | MODEL"),
])
def test_a_bad_command_is_one_line_and_the_console_goes_on(command, message):
    done = console(f"{command}\n:n 3\n:help\n")
    assert done.returncode == 0
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], done.stdout
    assert "now 3" in done.stdout  # the next command still ran


def test_sampling_command_sets_all_three_options_at_once():
    out = console(":sampling top_k 5 0.8\n:sampling sample 1.2\n:sampling greedy\n").stdout
    lines = [line for line in out.splitlines() if line.startswith("ok:")]
    assert "top-k (temperature 0.8, top_k 5)" in lines[0]
    assert "sampling (temperature 1.2)" in lines[1] and "greedy (temperature 0)" in lines[2]


def test_trace_shows_each_draft_with_p_q_and_the_decision(pair):
    target, _ = pair
    out = console(":sampling sample 1.0\n:trace on\n:n 20\nROMEO:\n").stdout
    rounds = re.findall(r"\[round: K=(\d+), (\d+) drafted\] (.*)", out)
    assert rounds and all(int(k) == 4 or int(k) < 4 for k, _, _ in rounds)
    pairs = re.findall(r"p=([\d.]+) q=([\d.]+) min\(1,p/q\)=([\d.]+) (accept|REJECT|not examined)", out)
    checked = [(float(p), float(q), float(a)) for p, q, a, _ in pairs if float(q) >= 0.05]  # 3 printed decimals
    assert checked and all(abs(a - min(1.0, p / q)) < 0.02 for p, q, a in checked)
    assert all(re.search(r"(-> |^)(resample|bonus|target) '", r[2]) for r in rounds), rounds


def test_quit_and_end_of_input_leave_cleanly():
    done = console(":n 2\n:quit\nROMEO:\n")
    assert done.returncode == 0 and "---" not in done.stdout  # nothing after :quit ran
    assert console(":n 2\n").returncode == 0                  # end of input: Ctrl-D


def test_clear_writes_no_escape_codes_into_a_pipe():
    assert "\033" not in console(":clear\n:n 2\nROMEO\n").stdout


def test_ctrl_c_stops_a_generation_and_the_console_goes_on():
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gpt2np.console"], cwd=REPO, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(":off speculative\n:cache off\n:n 200\nROMEO:\n")  # no KV cache: slow enough
    proc.stdin.flush()
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(input=":help\n", timeout=120)
    assert "[interrupted]" in out and "commands (a line" in out, out[-500:]
    assert proc.returncode == 0 and "Traceback" not in err


@pytest.mark.parametrize("flags, message", [
    (["--K", "0"], "K (draft tokens per round)"), (["--target_model_size", "nosuch"], "unknown model"),
    (["--temperature", "-1"], "temperature"), (["--draft_model_size", "nosuch"], "unknown model"),
])
def test_bad_flags_exit_2_with_one_line(flags, message):
    done = console("", *flags)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_console_only_calls_the_package():
    """No sampler of its own: the console modules import no sampling primitive but the package's API."""
    source = (REPO / "gpt2np" / "console.py").read_text() + (REPO / "gpt2np" / "console_commands.py").read_text()
    assert "np.random.default_rng(s.seed)" in source and "rng.choice" not in source and "np.argmax" not in source
    assert np.random.default_rng  # explicit generators only
