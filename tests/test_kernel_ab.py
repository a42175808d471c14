"""tools/kernel_ab.py: the A/B a METHODS entry needs, on a small model and as a user types it.

compare() must time both sides at every row count, give each side its own methods (the table's, then plain
x @ w with the kernel's entry removed), put METHODS back as it found it, and roll the cache back after every
pass (else each pair would time a longer context); the two sides' logits agree to float32 rounding.
"""
import re
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO, load_tool
from gpt2np.model.fast import matmul as mm

TOOL = REPO / "tools" / "kernel_ab.py"
AB = load_tool("kernel_ab")


def test_both_sides_run_their_own_methods_and_leave_methods_and_cache_as_found(monkeypatch):
    model = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=97, n_ctx=32, n_embd=32, n_head=2, n_layer=2), tokenizer=None)
    before = dict(mm.METHODS)
    table = mm.METHODS["Nehalem"]                                    # rows at every count on small weights
    seen = []
    real_method_for = mm.method_for
    monkeypatch.setattr(mm, "method_for", lambda m, w, kernel=None: seen.append(real_method_for(m, w, kernel)) or seen[-1])
    forwards = []
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, cache, n_logits=1: forwards.append(len(cache)) or
                        real_forward(ids, cache, n_logits))
    results = AB.compare(model, table, [1, 2, 5], context=7, pairs=3, rng=np.random.default_rng(0))
    assert dict(mm.METHODS) == before, "METHODS not put back"
    assert sorted(results) == [1, 2, 5]
    assert all(len(r["table"]) == len(r["plain"]) == 3 and min(r["table"] + r["plain"]) > 0 for r in results.values())
    assert all(r["logit_gap"] <= 1e-4 for r in results.values()), {M: r["logit_gap"] for M, r in results.items()}
    assert set(forwards[1:]) == {7}, f"a pass did not start from the context: cache lengths {sorted(set(forwards))}"
    if mm.BLAS is not None:                                          # the table's side took rows, the other plain
        assert "rows" in seen and "plain" in seen, set(seen)
    rows = AB.table_rows(results)
    assert len(rows) == 3 and all(re.fullmatch(r"\| \d+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| \*\*[\d.]+\*\* "
                                                r"\([\d.]+–[\d.]+\) \| [\d.e+-]+ \|", row) for row in rows), rows


def run_tool(*args, env=None):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.skipif(mm.BLAS is None, reason="needs NumPy's OpenBLAS and threadpoolctl")
def test_the_tool_as_a_user_types_it_on_the_bundled_target():
    run = run_tool("--size", "bundled", "--rows", "1,2", "--pairs", "2", "--threads", "1",
                   *([] if mm.KERNEL in mm.METHODS else ["--try", "Haswell"]))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("shakespeare-2.6M (row-major), context 128, 2 alternated pairs; the running kernel: "
                               "OpenBLAS")  # small weights: row-major in every order
    assert [line.split("|")[1].strip() for line in lines[3:]] == ["1", "2"], run.stdout


@pytest.mark.parametrize("args, message", [
    (["--size", "2.6M"], "--size must be 'bundled' or one of"),
    (["--rows", "0,2"], "rows, context, pairs and threads must be at least 1"),
    (["--rows", "two"], "argument --rows: invalid integers value"),
    (["--try", "ARMV8"], "METHODS has no entry for 'ARMV8'"),
    (["--order", "fortran"], "argument --order: invalid choice: 'fortran'"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),  # was NumPy's, in a traceback
])
def test_bad_input_is_a_one_line_usage_error(args, message, capfd):
    if mm.BLAS is None and "--try" in args:
        pytest.skip("without OpenBLAS the tool stops before it reads --try")
    with pytest.raises(SystemExit) as exit_info:
        AB.main(args)
    err = capfd.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("python tools/kernel_ab.py: error: "), err  # no usage line


def test_the_real_command_s_error_is_one_line():
    run = run_tool("--seed", "-1")
    assert run.returncode == 2 and run.stderr == ("python tools/kernel_ab.py: error: --seed must be a non-negative "
                                                  "integer, got -1 (see --help)\n"), run.stderr
