"""tools/train_pair.py is deterministic: a shortened run reproduces known bytes (issue 13, item 6).

The full run (25 minutes on 2 idle cores) is too long for a test, so this trains the same
pipeline, shrunk: the first 60,000 bytes of Tiny Shakespeare, a 2-layer target and a 1-layer
draft 16 wide, a few steps each. Every byte of the exported checkpoints depends on every step
(initialisation, batches, AdamW, distillation, export), so one changed bit anywhere changes the
hash. Runs in its own process: the trainer switches torch to deterministic mode globally.
torch is a tool-only dependency (tools/requirements-train.txt): without it the test skips.
"""
import hashlib
import os
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "tinyshakespeare.txt"
TORCH = "2.13.0"  # the hashes below were made with this torch (CPU build, 2 threads)
SHORT_RUN = ["--target", "16", "2", "2", "--draft", "16", "2", "1", "--target_steps", "4", "--draft_steps", "3",
             "--n_ctx", "64", "--batch_size", "2", "--alpha_blocks", "2", "--log_every", "1000"]
PINNED_SHA256 = {  # model.ckpt.data-00000-of-00001 of each exported model, by the host that wrote them: the same
    # script and torch sum differently on another CPU (torch picks its kernels by CPU), and reproduce on each
    "x86-64 AVX-512, the host of 2026-11-24, whose full run wrote the shipped pair": {
        "shakespeare-12K": "6ccdf207dcbfed7e94ca5e5c5cd546f8e27aabe37a262870a0dab64a85dc1fe5",
        "shakespeare-8.4K": "a389e93b1a9313c797389916b203b062153d2d11a7122d37c4d066704a9a3eef",
    },
    "AMD EPYC, family 26 (Zen 5), 2026-11-27 (12 runs, every one alike)": {
        "shakespeare-12K": "160e2643fe593643cb158c6abdccf20b1df4049201e221c5f360ed8f9ac16e4a",
        "shakespeare-8.4K": "f6c4ac2e00abbc5facbd6d869a41b601662daa6e13761d9af9455835693843fa",
    },
}


SHIPPED_SHA256 = {  # what the full run (tools/train_pair.py on all of Tiny Shakespeare) wrote, 2026-11-24
    "shakespeare-2.6M": "52557a588cf704bc382b82695824e6bfb1692ebf5e136d76d5a4a778f69d6e14",
    "shakespeare-260K": "86cf8eb063e0b95db14e2127263cd41f4d9fddba48e3faf06e192effbd42d046",
}


def test_shipped_pair_is_the_full_deterministic_run_that_bundled_readme_names():
    """The bytes in gpt2np/bundled are the ones the documented full run reproduces: weights swapped
    without retraining (or a retrain without updating the README) fail here."""
    bundled = ROOT / "gpt2np" / "bundled"
    shipped = {name: hashlib.sha256((bundled / name / "model.ckpt.data-00000-of-00001").read_bytes()).hexdigest()
               for name in SHIPPED_SHA256}
    assert shipped == SHIPPED_SHA256, shipped
    readme = (bundled / "README.md").read_text()
    assert all(h in readme for h in SHIPPED_SHA256.values()), "gpt2np/bundled/README.md lists other hashes"


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
    assert produced in PINNED_SHA256.values(), (
        f"the shortened run reproduces none of its pinned bytes: {produced} (a change in tools/train_pair.py or in "
        f"the checkpoint writer; or a CPU none of {list(PINNED_SHA256)} had: then a second run that writes the "
        f"same bytes, with nothing else changed, is a new host's entry)")


@pytest.mark.parametrize("args, expected", [
    (["{missing}"], "no such file"),
    (["{corpus}", "--n_ctx", "0"], "--n_ctx must be at least 1"),
    (["{corpus}", "--target", "30", "4", "1"], "--target 30 4 1: N_EMBD must be a multiple of N_HEAD"),
    (["{corpus}", "--draft", "16", "0", "1"], "--draft 16 0 1"),
    (["{corpus}", "--target_steps", "-1"], "--target_steps must be at least 0"),
    (["{corpus}", "--draft_steps", "-5"], "--draft_steps must be at least 0"),
    (["{corpus}", "--log_every", "0"], "--log_every must be at least 1"),
    (["{corpus}", "--lr", "nan"], "--lr must be a positive number"),
    (["{corpus}", "--distill_mix", "1.5"], "--distill_mix must be in [0, 1]"),
    (["{corpus}", "--n_ctx", "16"], "--prompt must have 1 to --n_ctx 16 bytes"),
    (["{corpus}", "--prompt", ""], "--prompt must have 1 to --n_ctx"),
    (["{corpus}", "--n_ctx", "1024"], "too short for --n_ctx 1024"),
    (["{corpus}", "--target", "16", "2", "1"], "would both be exported as"),
    (["{corpus}", "--out_dir", "{corpus}/models"], "--out_dir"),
])
def test_bad_arguments_are_one_line_before_any_work(tmp_path, args, expected):
    """Every argument is checked before training (no torch needed): one line naming the flag, status 2,
    and nothing written. A --prompt longer than --n_ctx used to crash export() half way (issue 31)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 100)  # 4,400 bytes
    args = [a.format(corpus=corpus, missing=tmp_path / "missing.txt") for a in args]
    defaults = ["--out_dir", str(tmp_path / "out"), "--work_dir", str(tmp_path / "work"), "--n_ctx", "64",
                "--draft", "16", "2", "1"]  # a case's own flags come after these, and win
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "train_pair.py"), args[0], *defaults, *args[1:]],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and expected in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_a_failed_export_leaves_no_partial_folder_and_the_old_model_untouched(tmp_path, monkeypatch):
    """export_models writes into temporary folders and renames them into place only when every model is
    complete: a failure late in the export (reference.npz, the last file) leaves the folder as it was."""
    if torch_version() is None:
        pytest.skip("torch not installed (training only: pip install torch==2.13.0)")
    from conftest import load_tool
    tool = load_tool("train_pair")
    models = {"m-a": tool.GPT2Torch(tool.N_VOCAB, 8, 8, 2, 1), "m-b": tool.GPT2Torch(tool.N_VOCAB, 8, 8, 2, 1)}
    out = tmp_path / "out"
    (out / "m-a").mkdir(parents=True)
    (out / "m-a" / "hparams.json").write_text("the old model\n")

    def fail(*args, **kwargs):
        raise OSError("disk full")
    savez = tool.np.savez
    monkeypatch.setattr(tool.np, "savez", fail)
    with pytest.raises(OSError, match="disk full"):
        tool.export_models(models, out, [1, 2, 3])
    assert sorted(p.name for p in out.iterdir()) == ["m-a"]
    assert (out / "m-a" / "hparams.json").read_text() == "the old model\n"

    monkeypatch.setattr(tool.np, "savez", savez)
    tool.export_models(models, out, [1, 2, 3])
    assert sorted(p.name for p in out.iterdir()) == ["m-a", "m-b"]
    for name in models:
        assert {"hparams.json", "reference.npz", "model.ckpt.index"} <= {p.name for p in (out / name).iterdir()}
        assert (out / name).stat().st_mode & 0o777 == 0o777 & ~current_umask()


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_make_hf_fixtures_help_needs_no_transformers_and_never_builds(tmp_path):
    """tools/make_hf_fixtures.py (the other torch tool) had no arguments at all: --help died importing
    transformers, or, with it installed, rewrote tests/fixtures/hf-tiny-*."""
    fixtures = ROOT / "tests" / "fixtures"
    before = {p: p.stat().st_mtime_ns for p in fixtures.glob("hf-tiny-*/*")}
    tool = [sys.executable, str(ROOT / "tools" / "make_hf_fixtures.py")]
    shown = subprocess.run([*tool, "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "tools/requirements-hf.txt" in shown.stdout, shown.stderr
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        run = subprocess.run([*tool, "--out_dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and "pip install -r tools/requirements-hf.txt" in lines[0], \
            run.stderr
        assert not (tmp_path / "out").exists()
    assert {p: p.stat().st_mtime_ns for p in fixtures.glob("hf-tiny-*/*")} == before
