"""`python -m bench` on models named as main.py names them (a folder in the HF layout here): the
named model's own weights are loaded and timed, and a name that is no model is one line."""
import json
import subprocess
import sys

import numpy as np

from gpt2np.checkpoints.safetensors import read_safetensors, write_safetensors
from conftest import FIXTURES, REPO, copy_fixture

sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package
import bench.__main__ as cli  # noqa: E402
from bench import policies  # noqa: E402


def long_context_copy(tmp_path, name):
    """hf-tiny-<name> with n_positions 1024: the bench's 128-token prompts need that context."""
    folder = copy_fixture(FIXTURES / name, tmp_path / name)
    config = json.loads((folder / "config.json").read_text()) | {"n_positions": 1024}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: np.array(x) for k, x in read_safetensors(folder / "model.safetensors").items()}
    key = next(k for k in tensors if k.endswith("wpe.weight"))
    tensors[key] = np.random.default_rng(0).standard_normal((1024, 32), np.float32)
    write_safetensors(folder / "model.safetensors", tensors)
    return str(folder)


def bench(*args):
    return subprocess.run([sys.executable, "-m", "bench", "--repeats", "1", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_bench_times_hf_folders_as_sizes_and_as_the_speculative_pair(tmp_path, capfd, monkeypatch):
    """bench's main() in this process (the real `python -m bench` is the test below's), without the speculative
    section's prompt lookup on the bundled pair: bundled_lookup runs the bundled models whatever --sizes names
    (4 s of this test's 5), and test_bench.py's run checks it."""
    monkeypatch.setattr(policies, "bundled_lookup", lambda plan: {"skipped": "test_bench.py's run checks it"})
    target, draft = long_context_copy(tmp_path, "hf-tiny-f32"), long_context_copy(tmp_path, "hf-tiny-noprefix")
    cli.main(["--repeats", "1", "--sizes", target, "--pair", f"{draft},{target}", "--sections",
              "prefill,verify,speculative", "--json", str(tmp_path / "b.json")])
    err = capfd.readouterr().err
    results = json.loads((tmp_path / "b.json").read_text())
    assert results["meta"]["plan"]["named"] == [target, draft]
    entry = results["sizes"][target]
    assert entry["config"]["n_vocab"] == 267 and entry["prefill"]["128"]["seconds"] > 0
    assert entry["speculative"]["self"]["alpha_hat"] == 1.0  # draft = target: every draft accepted
    assert f"loading {target}" in err and f"loading {draft}" in err


def test_bench_refuses_a_name_that_is_no_model_in_one_line(tmp_path):
    out = bench("--sizes", str(tmp_path / "absent"), "--sections", "prefill")  # a path that is not there
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"no such folder: {tmp_path / 'absent'}" in out.stderr, out.stderr
    out = bench("--sizes", "no-such-model", "--sections", "prefill")                 # a name no model has
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unknown model" in out.stderr, out.stderr
