"""tools/prompt_overlap.py: a prompt's overlaps against the run's acceptance on the bundled pair (PROMPT_WEIGHT's basis)."""
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO, load_tool

TOOL = REPO / "tools" / "prompt_overlap.py"
OVERLAP = load_tool("prompt_overlap")


def test_a_prompt_position_s_worth_is_the_squared_ratio_of_the_two_errors():
    rows = np.array([[0.5, 0.7, 0.6], [0.9, 0.7, 0.8]])  # prompt's, run's, run's first 16: errors 0.2 and 0.1
    s = OVERLAP.summary(rows)
    assert s["prompt"] == pytest.approx(0.7) and s["err_prompt"] == pytest.approx(0.2)
    assert s["err_first"] == pytest.approx(0.1) and s["worth"] == pytest.approx(0.25)


def test_a_prompt_that_reads_its_run_exactly_has_no_worth_to_state():
    """--temperatures 1e308: every overlap is 1, both errors 0, and (0 / 0) ** 2 was a ZeroDivisionError."""
    s = OVERLAP.summary(np.ones((2, 3)))
    assert s["err_prompt"] == 0.0 and s["worth"] is None and OVERLAP.worth_text(s["worth"]) == "n/a", s
    assert OVERLAP.worth_text(0.25) == "0.25"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_prompt_s_overlaps_and_its_run_s_on_the_bundled_pair(temperature):
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    ids = target.tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    prompt, run, first = OVERLAP.prompt_and_run(target, draft, ids, 24, temperature, seed=0)
    assert all(0.0 <= x <= 1.0 for x in (prompt, run, first)), (prompt, run, first)
    if temperature == 0.0:  # greedy: beta is 1 or 0, so the means are multiples of 1/16 and 1/n
        assert (prompt * 16) == pytest.approx(round(prompt * 16)), prompt


def test_bad_flags_are_one_line_errors(tmp_path, capfd):
    """Each refusal from main() in this process, the first also from the real `python tools/prompt_overlap.py`."""
    (tmp_path / "short.txt").write_text("To be, or not to be.\n")  # under 200 characters: no prompt can be drawn
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "long.txt").write_text("To be, or not to be, that is the question.\n" * 30)
    long = ["--corpus", str(tmp_path / "long.txt")]
    for argv, says in ((["--prompts", "1"], "--prompts"), (["--tokens", "3"], "--tokens"),
                       (["--corpus", str(tmp_path / "none.txt")], "none.txt"), (["--temperatures", "warm"], "warm"),
                       # each of these was a traceback, the last two after the models had loaded
                       ([*long, "--temperatures", "-1"], "--temperatures must be finite numbers >= 0"),
                       ([*long, "--temperatures", "0,nan"], "--temperatures must be finite numbers >= 0"),
                       (["--corpus", str(tmp_path / "short.txt")], "short.txt: 21 characters"),
                       (["--corpus", str(tmp_path / "empty.txt")], "empty.txt: 0 characters"),
                       ([*long, "--tokens", "5000"], "--tokens 5000 is too many")):
        with pytest.raises(SystemExit) as exit_info:
            OVERLAP.main(argv)
        out = capfd.readouterr()
        assert exit_info.value.code == 2 and out.err.count("\n") == 1 and says in out.err, (argv, out.err)
        assert out.err.startswith("python tools/prompt_overlap.py: error: "), (argv, out.err)  # no usage line
        assert "Traceback" not in out.err and out.out == "", (argv, out.err)
    real = subprocess.run([sys.executable, str(TOOL), "--prompts", "1"], capture_output=True, text=True, timeout=120)
    assert real.returncode == 2 and real.stdout == "" and "Traceback" not in real.stderr, real.stderr
    assert real.stderr.startswith("python tools/prompt_overlap.py: error: --prompts") and real.stderr.count("\n") == 1
