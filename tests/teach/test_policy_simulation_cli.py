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
