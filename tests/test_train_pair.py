"""tools/train_pair.py is deterministic: a shortened run reproduces known bytes (issue 13, item 6).

The full run (25 minutes on 2 idle cores) is too long for a test, so this trains the same
pipeline, shrunk: the first 60,000 bytes of Tiny Shakespeare, a 2-layer target and a 1-layer
draft 16 wide, a few steps each. Every byte of the exported checkpoints depends on every step
(initialisation, batches, AdamW, distillation, export), so one changed bit anywhere changes the
hash. Runs in its own process: the trainer switches torch to deterministic mode globally.
torch is a tool-only dependency (tools/requirements-train.txt): without it the test skips.
"""
import hashlib
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "tinyshakespeare.txt"
TORCH = "2.13.0"  # the hashes below were made with this torch (CPU build, x86-64, 2 threads)
SHORT_RUN = ["--target", "16", "2", "2", "--draft", "16", "2", "1", "--target_steps", "4", "--draft_steps", "3",
             "--n_ctx", "64", "--batch_size", "2", "--alpha_blocks", "2", "--log_every", "1000"]
EXPECTED_SHA256 = {  # model.ckpt.data-00000-of-00001 of each exported model
    "shakespeare-12K": "2a9576bd91053dafa9b65bd1325c9d02b037b4591018dca64213b097b815f155",
    "shakespeare-8.4K": "0f1c809b3047257e484d78430d20c40bc28f143d1b8c272974c88cfc376f4f8d",
}


def torch_version():
    return importlib.metadata.version("torch") if importlib.util.find_spec("torch") else None


def test_shortened_training_run_reproduces_its_bytes(tmp_path):
    if torch_version() is None:
        pytest.skip("torch not installed (training only: pip install torch==2.13.0)")
    if not torch_version().startswith(TORCH):
        pytest.skip(f"the pinned hashes are torch {TORCH}'s; this is torch {torch_version()}")
    if not CORPUS.is_file():
        pytest.skip(f"corpus not found: {CORPUS}")
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(CORPUS.read_bytes()[:60_000])
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "train_pair.py"), str(corpus),
                          "--out_dir", str(tmp_path / "out"), "--work_dir", str(tmp_path / "work"), *SHORT_RUN],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    produced = {d.name: hashlib.sha256((d / "model.ckpt.data-00000-of-00001").read_bytes()).hexdigest()
                for d in sorted((tmp_path / "out").iterdir())}
    assert produced == EXPECTED_SHA256, (
        f"the shortened run no longer reproduces its pinned bytes: {produced} (a change in "
        f"tools/train_pair.py, in the checkpoint writer, or another CPU / torch build)")
