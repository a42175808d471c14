"""tools/cost_shape.py: the probe's v_shape beside the whole pass's v, on a small model and as a user types it."""
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO, load_tool

TOOL = REPO / "tools" / "cost_shape.py"
SHAPE = load_tool("cost_shape")


def test_each_round_times_every_size_from_the_same_context_then_one_probe(monkeypatch):
    model = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=97, n_ctx=32, n_embd=32, n_head=2, n_layer=4), tokenizer=None)
    lengths, real_forward = [], model.forward
    monkeypatch.setattr(model, "forward", lambda ids, cache, n_logits=1: lengths.append((len(cache), len(ids))) or
                        real_forward(ids, cache, n_logits))
    readings, real_probe = [], gpt2np.model.forward.row_cost_shape
    monkeypatch.setattr(gpt2np.model.forward, "row_cost_shape", lambda *a: readings.append(1) or real_probe(*a))
    passes, probes = SHAPE.measure(model, 4, context=7, rounds=3, rng=np.random.default_rng(0))
    assert lengths[1:] == [(7, M) for M in (1, 2, 3, 4)] * 3, lengths
    assert len(readings) == 3, "a round's probe came from the model's record, not a reading"
    assert sorted(passes) == [1, 2, 3, 4] and all(len(s) == 3 and min(s) > 0 for s in passes.values())
    assert len(probes) == 3 and all(sorted(p) == [1, 2, 3, 4] and p[1] == 1.0 for p in probes), probes
    rows = SHAPE.table_rows(passes, probes)
    assert len(rows) == 4 and rows[0].startswith("| 1 |") and "1.00" in rows[0], rows


@pytest.mark.parametrize("argv, says", [
    (["--size", "7B"], "--size must be 'bundled' or one of"),
    (["--rounds", "0"], "--M_max, --context and --rounds must be at least 1"),
    (["--size", "bundled", "--context", "250"], "--context 250 + 9 rows exceed the model's 256 positions"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),  # was NumPy's, in a traceback
    (["--seed", "x"], "argument --seed: invalid int value"),
])
def test_bad_flags_are_one_line_errors(argv, says, capfd):
    with pytest.raises(SystemExit) as exit_info:
        SHAPE.main(argv)
    err = capfd.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_the_real_command_s_error_is_one_line():
    out = subprocess.run([sys.executable, str(TOOL), "--seed", "-1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr == ("python tools/cost_shape.py: error: --seed must be a non-negative "
                                                  "integer, got -1 (see --help)\n"), out.stderr
