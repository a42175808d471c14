"""python -m gpt2np.teach.policy_simulation: its arguments (the simulator itself: tests/decoding/test_auto_policy.py)."""
import pytest

from gpt2np.decoding.policies import PROMPT_POSITIONS
from gpt2np.teach import policy_simulation


@pytest.mark.parametrize("prompt", ["-1", str(PROMPT_POSITIONS + 1), "1000"])
def test_a_prompt_auto_cannot_read_is_a_one_line_error(capsys, prompt):
    """--prompt is "at most PROMPT_POSITIONS": above it the read was clamped silently, the table headed with a read
    that never happened."""
    with pytest.raises(SystemExit) as stopped:
        policy_simulation.main(["--prompt", prompt])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"--prompt must be 0 to {PROMPT_POSITIONS}" in err and prompt in err, err
    assert err.count("\n") == 1, err  # one line: no usage line before it


@pytest.mark.parametrize("noise", ["300", "3.5", "-1"])
def test_a_noise_beyond_a_log_deviation_of_3_is_a_one_line_error(capsys, noise):
    """--noise 300 made a reading 0: a ZeroDivisionError in a traceback."""
    with pytest.raises(SystemExit) as stopped:
        policy_simulation.main(["--seeds", "2", "--noise", noise])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m gpt2np.teach.policy_simulation: error: argument --noise: must be 'spiky' or a "
                          f"log-standard deviation from 0 to 3 (3: readings off by 20x either way), got {noise!r}"), err
