"""The layers of gpt2np/ (gpt2np/__init__.py draws them) are enforced: import-linter's contracts in
pyproject.toml must hold, and a back-import must break them, named with its chain."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter checks the layers: pip install -r requirements-dev.txt")

REPO = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def lint(folder):
    """lint-imports over the gpt2np package found in folder, with folder's pyproject.toml."""
    return subprocess.run(LINT, cwd=folder, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})


def test_the_contracts_hold():
    done = lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("importer, imported", [
    ("decoding/theory.py", "from ..console import repl"),            # a lower layer importing the outer ring
    ("model/fast/threads.py", "from .. import forward"),             # speed code importing the equations
    ("decoding/policies.py", "from . import speculative"),           # a cycle: speculative imports policies
    ("console/runs.py", "from ..decoding import theory"),            # the outer ring past the public API
])
def test_a_back_import_breaks_a_contract(tmp_path, importer, imported):
    """The negative control: the same contracts over a copy of the package with one wrong import."""
    shutil.copytree(REPO / "gpt2np", tmp_path / "gpt2np", ignore=shutil.ignore_patterns("bundled", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    module = tmp_path / "gpt2np" / importer
    module.write_text(module.read_text() + f"\n{imported}  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode != 0, f"adding `{imported}` to {importer} broke no contract:\n{done.stdout[-2000:]}"
    leaf = Path(importer).stem  # the layers report names gpt2np.decoding.theory, the cycles one .policies
    assert "BROKEN" in done.stdout and f".{leaf} -> " in done.stdout, f"no chain from {leaf}:\n{done.stdout[-2000:]}"


def test_pyproject_commands_and_extras_point_at_what_exists():
    """`pip install -e .` gives the four commands; each names a function that exists, and the extras
    hold what requirements-serve.txt and requirements-dev.txt hold."""
    import importlib
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for command, target in project["scripts"].items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function, None)), f"{command} -> {target}"

    def names(lines):
        return {line.split("#")[0].split(">=")[0].strip() for line in lines if line.split("#")[0].strip()
                and not line.startswith("-r")}
    assert names(project["dependencies"]) == names((REPO / "requirements.txt").read_text().splitlines())
    assert names(project["optional-dependencies"]["serve"]) == \
        names((REPO / "requirements-serve.txt").read_text().splitlines())
    assert names(project["optional-dependencies"]["dev"]) - {"gpt2np[serve]"} == \
        names((REPO / "requirements-dev.txt").read_text().splitlines())
