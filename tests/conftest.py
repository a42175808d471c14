"""Shared test fixtures: where the reference data lives, and small models to test on.

tests/ mirrors the package's folders (tests/model/, tests/decoding/, ...); the helpers shared
between them (this file, serve_helpers.py, browser.py, http_fixture_server.py) stay here, and
this folder goes on sys.path so that a test in any subfolder imports them by name."""
import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: `from conftest import ...` in subfolders
FIXTURES = REPO / "tests" / "fixtures"          # tiny TF checkpoints + HF reference logits (copied from shared/)
SHARED = REPO.parent / "shared"                 # present on developers' machines and CI, not in users' clones


def load_tool(name):  # -> tools/<name>.py as a module (tools/ is not a package)
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpt2_bpe_dir():
    """A folder with OpenAI's exact encoder.json + vocab.bpe (third-party: never committed), or None."""
    from gpt2np.tokenizer.bpe import OPENAI_SHA256
    for folder in [SHARED / "data" / "gpt2-bpe", *sorted((REPO / "weights").glob("*"))]:
        files = [folder / name for name in OPENAI_SHA256]
        if all(f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == OPENAI_SHA256[f.name]
               for f in files):
            return folder
    return None


@pytest.fixture(scope="session")
def bpe_dir():
    folder = gpt2_bpe_dir()
    if folder is None:
        pytest.skip("needs OpenAI's encoder.json/vocab.bpe: not in ../shared/data/gpt2-bpe or weights/<size>/")
    return folder


def run_with_ctrl_c_at_import(is_interrupted, run):  # -> the CompletedProcess
    """A Python that raises KeyboardInterrupt where `is_interrupted` (an expression over an import's name and
    level) is true, as a Ctrl-C during NumPy's import would, then runs `run` (a line of code) from REPO."""
    hook = ("import builtins, runpy, sys\nreal = builtins.__import__\n"
            "def fake(name, globals=None, locals=None, fromlist=(), level=0):\n"
            f"    if {is_interrupted}:\n        raise KeyboardInterrupt\n"
            "    return real(name, globals, locals, fromlist, level)\n"
            f"builtins.__import__ = fake\n{run}\n")
    return subprocess.run([sys.executable, "-c", hook], cwd=REPO, capture_output=True, text=True, timeout=60)


def copy_fixture(source, folder, ignore=()):  # -> folder
    """shutil.copytree of a fixture folder, leaving out a weight cache (.gpt2np-cache) that a script
    loading tests/fixtures/<name> in place would have written there: tests expect none."""
    import shutil
    from gpt2np.checkpoints.weights import CACHE_DIR
    return Path(shutil.copytree(source, folder, ignore=shutil.ignore_patterns(CACHE_DIR, *ignore)))


@pytest.fixture(scope="session")
def tiny_fixture_dir(tmp_path_factory):
    """Returns f(name) -> a writable copy of tests/fixtures/<name> (so caches are not written into the repo)."""
    copies = {}

    def copy(name):
        if name not in copies:
            copies[name] = copy_fixture(FIXTURES / name, tmp_path_factory.mktemp(name) / name)
        return copies[name]
    return copy


def random_params(config, seed, std=0.3):
    """Random GPT-2 weights with every bias and layer-norm term non-trivial, and a large init
    scale so that next-token distributions are peaked rather than uniform."""
    from gpt2np.checkpoints.weights import init_params
    rng = np.random.default_rng(seed)
    params = init_params(config, rng, std=std)

    def perturb(tree):
        for key, value in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
            if isinstance(value, (dict, list)):
                perturb(value)
            elif key in ("b", "g"):
                value += np.float32(0.1) * rng.standard_normal(value.shape, dtype=np.float32)
    perturb(params)
    return params


@pytest.fixture
def main_here(capfd, monkeypatch):
    """A function of main.py's arguments -> the CompletedProcess `python main.py ARGS` would give, from
    gpt2np.cli.run() called in this process (from REPO, stdout and stderr captured at the file descriptors):
    for refusals, which stop before any run. That both write the same is test_cli.py's
    test_a_refusal_in_process_is_what_the_process_writes; the other tests keep real processes."""
    from gpt2np import cli
    monkeypatch.chdir(REPO)

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["main.py", *args])
        try:
            cli.run()
            status = 0
        except SystemExit as e:
            status = e.code
        out = capfd.readouterr()
        return subprocess.CompletedProcess(["main.py", *args], status, out.out, out.err)
    return run


@pytest.fixture
def no_random_init(monkeypatch):
    """Building random weights (checkpoints.loading's init_params) fails the test: for refusals that must come
    before the init (random:1558M's takes about 30 s)."""
    from gpt2np.checkpoints import loading

    def init_params(*args, **kwargs):
        raise AssertionError("the weights were built before the refusal")
    monkeypatch.setattr(loading, "init_params", init_params)
