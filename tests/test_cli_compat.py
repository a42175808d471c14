"""main.py with the command lines of other speculative-decoding repositories, word for word.

Their model names (gpt2-xl, gpt2) are mapped to the bundled pair by a seam in the subprocess
(gpt2np.load_model looks them up as shakespeare-2.6M and shakespeare-260K); everything else,
the argument parsing first, is main.py's own. Random weights (random:<size>) run without a seam.
"""
import json
import os
import pty
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO
from gpt2np.report import rejected_draft
from test_cli import unmark

BUNDLED_AS = {"gpt2-xl": "shakespeare-2.6M", "gpt2": "shakespeare-260K"}
SEAM = (f"import sys, gpt2np, gpt2np.cli\nnames = {BUNDLED_AS!r}\nload = gpt2np.load_model\n"
        "gpt2np.load_model = lambda name, *a, **k: load(names.get(name, name), *a, **k)\ngpt2np.cli.run()\n")
LLMSS = ["--input", "The quick brown fox jumps over the lazy ", "--target_model_name", "gpt2-xl",
         "--approx_model_name", "gpt2"]
SS = ["--target-model", "gpt2-xl", "--draft-model", "gpt2", "--input-str",
      "Alan Turing theorized that computers would one day become", "--num-runs", "50", "--N", "40", "--K", "4",
      "--temperature", "0.6", "--top-k", "25", "--top-p", "0.9"]
SS_RUNS = 10  # ss_table's --num-runs


def main_py(*args, seam=True):
    command = [sys.executable, "-c", SEAM] if seam else [sys.executable, "main.py"]
    out = subprocess.run(command + list(args), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def main_py_together(**runs):  # {name: main.py's args (no seam)} -> {name: stdout}, the runs started at once
    procs = {name: subprocess.Popen([sys.executable, "main.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, args in runs.items()}
    outputs = {name: proc.communicate(timeout=600) for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, outputs[name][1])
    return {name: stdout for name, (stdout, _) in outputs.items()}


def table_rows(stdout):  # -> {method: {column: cell}} of speculative-sampling's table
    lines = [line for line in stdout.splitlines() if " | " in line]
    columns = [cell.strip() for cell in lines[0].split("|")]
    assert columns == ["method", "num_runs", "time", "+/- std", "speedup"], lines[0]
    return {row["method"]: row for row in (dict(zip(columns, (c.strip() for c in line.split("|")))) for line in lines[1:])}


def profile_rows(stdout, title):  # -> [(what, seconds)] of the indented lines under one profile title
    lines = stdout.split(title, 1)[1].split("\n")[1:]
    block = "\n".join(lines[:next((i for i, line in enumerate(lines) if not line.startswith("  ")), len(lines))])
    rows = re.findall(r"^  (.+?)\s+(-?\d+\.\d+) s\s+-?\d+\.\d %$", block, flags=re.M)
    assert len(rows) == len(block.splitlines()), block
    return [(what, float(s)) for what, s in rows]


def test_llmss_command_line_uses_its_sampling_defaults():
    out = main_py(*LLMSS)
    assert "temperature 1.0, top_k 20, top_p 0.9, seed 0" in out  # LLMSpeculativeSampling samples so
    assert out.count("s for 20 tokens") == 2 and "accepted by draft position (i: rate)     1: " in out


def test_llmss_benchmark_profiling_and_verbose():
    out = main_py(*LLMSS, "-v", "-s", "1", "-M", "20", "-g", "4", "-b", "-p")
    assert "seed 1" in out and "K=4" in out and "[accepted: " in out
    bench = re.findall(r"\[benchmark\] (.+), tokens/sec: ([\d.]+), ([\d.]+) ± [\d.]+ sec generates (\d+) "
                       r"tokens \(mean of (\d+) runs\)", out)
    assert [b[0] for b in bench] == ["autoregressive sampling", "speculative sampling"], out
    for _, per_second, seconds, n, runs in bench:
        assert int(n) == 20 and int(runs) == 10  # -b: 10 runs unless --num_runs says otherwise
        # both are rounded for print (seconds to 3 decimals, tokens/s to 1): the rate must lie within what
        # the rounded seconds allow, which is wide for a run of milliseconds (0.018 s: 1081-1143 tokens/s)
        fastest, slowest = 20 / max(float(seconds) - 0.0005, 1e-9), 20 / (float(seconds) + 0.0005)
        assert slowest - 0.05 <= float(per_second) <= fastest + 0.05, (per_second, seconds, slowest, fastest)
    plain = profile_rows(out, "autoregressive (shakespeare-2.6M): 20 tokens")
    calls = sum(int(m[1]) for what, _ in plain for m in [re.search(r"calls x (\d+)", what)] if m)
    assert calls == 20, plain  # the prompt's call gives token 1, then one call per token but the last
    spec = profile_rows(out, "speculative (drafter shakespeare-260K, K 4): 20 tokens")
    kinds = {what.split(",")[0] for what, _ in spec}
    assert {"target forward", "draft forward"} <= kinds, spec
    assert min(seconds for _, seconds in plain + spec) >= 0, (plain, spec)


@pytest.fixture(scope="module")
def ss_table(tmp_path_factory):
    """SS with --num-runs 10 for its 50: the count is parsed, reported and summed alike at any number above
    one (each run has the one seed, so the sums are the runs times the last run's); 50 took 4 s."""
    path = tmp_path_factory.mktemp("json") / "ss.json"
    args = list(SS)
    args[args.index("--num-runs") + 1] = str(SS_RUNS)
    return main_py(*args, "--json", str(path)), json.loads(path.read_text())


def test_speculative_sampling_command_line_prints_its_table(ss_table):
    out, _ = ss_table
    rows = table_rows(out)
    assert list(rows) == ["autoregressive sampling", "speculative sampling"]
    assert {row["num_runs"] for row in rows.values()} == {str(SS_RUNS)}
    assert rows["autoregressive sampling"]["speedup"] == "1.00x"
    times = [rows[m]["time"].split()[0] for m in rows]
    (ar, sd), half = [float(t) for t in times], [0.5 * 10.0 ** -len(t.partition(".")[2]) for t in times]
    # the times are rounded for print (0.032 s may be 0.0315-0.0325): the speedup must lie within what they allow
    lowest, highest = (ar - half[0]) / (sd + half[1]), (ar + half[0]) / max(sd - half[1], 1e-9)
    speedup = float(rows["speculative sampling"]["speedup"][:-1])
    assert lowest - 0.006 <= speedup <= highest + 0.006, (speedup, times, lowest, highest)
    assert "temperature 0.6, top_k 25, top_p 0.9" in out and out.count("s for 40 tokens") == 2


def test_the_json_has_per_position_acceptance(ss_table):
    _, doc = ss_table
    spec = doc["speculative"]
    assert spec["num_runs"] == SS_RUNS and len(spec["seconds"]) == SS_RUNS and doc["top_k"] == 25
    positions = spec["by_position"]
    assert [p["position"] for p in positions] == list(range(1, len(positions) + 1)) and len(positions) <= 4
    assert sum(p["accepted"] for p in positions) == spec["accepted"], positions
    assert sum(p["examined"] - p["accepted"] for p in positions) == spec["rejections"], positions
    for earlier, later in zip(positions, positions[1:]):  # a draft is examined only after its predecessor's acceptance
        assert later["examined"] <= earlier["accepted"], positions
    last = spec["last_run_stats"]
    assert [p[2] for p in last["by_position"]] == [p["accepted"] // SS_RUNS for p in positions]  # one seed


def test_same_model_as_target_and_draft_has_zero_rejections():
    args = [("gpt2-xl" if arg == "gpt2" else arg) for arg in SS]  # --draft-model gpt2-xl
    args[args.index("--num-runs") + 1] = "8"  # 8 runs of 40 tokens: 0 rejections in ~64 rounds of K = 4 say it
    out = main_py(*args)
    table_rows(out)
    assert "drafter: shakespeare-2.6M" in out
    assert re.search(r"speculative sampling: 0 rejections in 8 runs \((\d+) drafts proposed, \1 accepted\)", out), out
    rates = re.findall(r"\d: ([\d.]+) \(\d+/\d+\)", out.split("accepted by draft position (i: rate):")[1])
    assert rates and set(rates) == {"1.00"}, rates


def test_verbose_into_a_pipe_keeps_the_provenance_as_text():
    out = main_py("--n_tokens_to_generate", "80", "-v", seam=False)
    sections = out.split("=== ")
    ar_text = sections[1].split("\n", 1)[1].split("\ntime:")[0]
    sd_text = sections[2].split("\n", 1)[1].split("\nlegend")[0]
    assert "\033[" not in out and "legend (plain text" in out
    assert unmark(sd_text) == ar_text  # the markers add provenance and take nothing away
    legend = dict(re.findall(r"\[(\w+): \.\.\.\]: .* \((\d+) tokens\)", out))
    assert int(legend["rejected"]) == sd_text.count("[rejected: ") > 0, legend
    assert int(legend["rejected"]) == int(legend["resampled"])  # each rejection, then the target's token


def on_a_terminal(*args, **env):  # -> what main.py wrote to a pseudo-terminal, with env over a colour terminal's
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm"} | env
    proc = subprocess.Popen([sys.executable, "main.py", *args], cwd=REPO,
                            stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return b"".join(chunks).decode("utf-8", errors="replace")


def test_verbose_on_a_terminal_strikes_rejected_drafts_through():
    out = on_a_terminal("--n_tokens_to_generate", "80", "-v")
    assert "\033[9;2m" in out and "\033[32m" in out and "[accepted: " not in out  # struck through, then coloured


def test_a_dumb_terminal_gets_the_plain_text_provenance_as_no_color_does():
    """TERM=dumb (Emacs' shell, some CI logs) shows escapes as garbage: -v writes labelled spans there."""
    out = on_a_terminal("--n_tokens_to_generate", "40", "-v", TERM="dumb")
    assert "\033[" not in out and "[accepted: " in out and "TERM=dumb" in out  # the legend says why


def test_rejected_draft_is_recovered_from_each_round():
    """RoundEvent carries drafts and decisions: the rejected draft is drafts[n] after n acceptances.
    At temperature 0 the target's replacement is its argmax, which the rejected draft was not."""
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    ids = target.tokenizer.encode("ROMEO:\nWhat light through yonder window breaks?")
    result = gpt2np.speculative_generate(target, draft, ids, 80, K=4, temperature=0, trace=True)
    rejected = [(rejected_draft(e), e) for e in result.trace]
    assert sum(x is not None for x, _ in rejected) == result.stats.rejections > 0
    for x, event in rejected:
        if x is None:
            assert all(event.decisions), event.decisions
        else:
            assert x == event.drafts[event.decisions.index(False)] and x != event.tokens[-1]


@pytest.mark.parametrize("args, message", [
    (["-M", "0"], "-M must be positive, got 0"),
    (["--N", "-3"], "--N must be positive, got -3"),
    (["--num-runs", "0"], "--num-runs must be at least 1, got 0"),
    (["-g", "0"], "-g must be at least 1"),
    (["--top-k", "0"], "--top-k must be at least 1 (leave it out to keep every token), got 0"),
    (["--top-p", "2"], "--top-p must be in (0, 1]"),
    (["--input-str", "Hi", "--N", "100000"], "the prompt (2 tokens) + --N (100000) = 100002 exceeds the context of "
                                             "256 tokens; shorten --input-str or ask for fewer tokens"),
    (["--input", "x", "--N", "3"], "mix the spellings of LLMSpeculativeSampling's (--input) and speculative-sampling's (--N)"),
    (["--target-model", "bigscience/bloom-560m"], "GPT-2 family only"),
    (["--target_model_name", "meta-llama/Llama-2-7b-hf"], "GPT-2 family only"),
])
def test_bad_input_in_other_spellings_names_the_flag_as_typed(args, message, main_here):
    out = main_here(*args)  # as `python main.py` writes it (test_cli.py's test_a_refusal_in_process_is_...)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""


def test_help_groups_the_compatible_spellings():
    out = subprocess.run([sys.executable, "main.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    compatible = out.stdout.split("compatible spellings:")[1]
    options = {flag for line in compatible.splitlines() if line.startswith("  -")
               for flag in re.findall(r"(?:^  |, )(-[\w-]+)", line)}
    assert options == {"--input", "--target_model_name", "--approx_model_name", "-M", "--max_tokens", "-g", "--gamma",
                       "-s", "-b", "--benchmark", "-p", "--profiling", "--target-model", "--draft-model",
                       "--input-str", "--num-runs", "--N", "--top-k", "--top-p"}, options
    assert "--prompt" not in compatible.split("\n  --input ")[0]  # main.py's own flags stay above


def test_offline_errors_name_each_commands_flag(tmp_path):
    """main.py names --mirror / --hf_endpoint; the library names the environment variables only."""
    release = subprocess.run([sys.executable, "main.py", "--target_model_size", "gpt2", "--models_dir", str(tmp_path),
                              "--mirror", "http://127.0.0.1:9"], cwd=REPO, capture_output=True, text=True, timeout=120)
    hub = subprocess.run([sys.executable, "main.py", "--target_model_size", "distilgpt2", "--models_dir", str(tmp_path),
                          "--hf_endpoint", "http://127.0.0.1:9"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert release.returncode == 2 and "point --mirror (or $GPT2NP_MIRROR) at a working mirror" in release.stderr
    assert hub.returncode == 2 and "/distilbert/distilgpt2/" in hub.stderr, hub.stderr
    assert "point --hf_endpoint (or $HF_ENDPOINT) at a working mirror" in hub.stderr
    for out in (release, hub):
        assert "base_url" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    with pytest.raises(gpt2np.DownloadError) as info:
        gpt2np.load_model("gpt2", tmp_path / "api", base_url="http://127.0.0.1:9")
    assert "point $GPT2NP_MIRROR at" in str(info.value) and "--mirror" not in str(info.value)


@pytest.fixture(scope="module")
def vocab_dir(bpe_dir, tmp_path_factory):
    """A models_dir where random weights of GPT-2's vocabulary find OpenAI's tokenizer files."""
    folder = tmp_path_factory.mktemp("models")
    shutil.copytree(bpe_dir, folder / "vocab")
    return str(folder)


@pytest.fixture(scope="module")
def random_runs(vocab_dir):
    """SS's table and LLMSS's profile on random weights, {"table": stdout, "profile": stdout}: the two runs
    start together, each mostly one core's work (building 124M random weights, reading the tokenizer)."""
    table = [("random:gpt2" if arg in ("gpt2", "gpt2-xl") else arg) for arg in SS]
    table[table.index("--num-runs") + 1], table[table.index("--N") + 1] = "2", "6"
    profile = [("random:gpt2" if arg in ("gpt2", "gpt2-xl") else arg) for arg in LLMSS]
    return main_py_together(table=[*table, "--draft-model", "random:gpt2", "--models_dir", vocab_dir],
                            profile=[*profile, "-M", "4", "-p", "--models_dir", vocab_dir])


def test_random_weights_run_the_table_and_the_sanity_check(random_runs):
    out = random_runs["table"]
    assert table_rows(out)["speculative sampling"]["num_runs"] == "2"
    assert "speculative sampling: 0 rejections in 2 runs" in out, out


def test_random_weights_profile(random_runs):
    out = random_runs["profile"]
    rows = profile_rows(out, "autoregressive (random:gpt2): 4 tokens")
    assert rows and all(np.isfinite(s) and s >= 0 for _, s in rows), rows


def test_benchmark_with_gpt2nps_own_flags_keeps_its_defaults():
    """-b is a mode, not a style: greedy stays greedy, and --num_runs sets the runs."""
    out = main_py("-b", "--num_runs", "2", "--n_tokens_to_generate", "10", seam=False)
    assert "temperature 0.0, top_k off, top_p off" in out
    assert out.count("(mean of 2 runs)") == 2 and "generates 10 tokens" in out
