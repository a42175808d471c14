"""The notebooks in notebooks/ run top to bottom, offline, and only call the package (issue 4).

Each notebook is executed with nbclient by tools/build_notebooks.py's own `execute` (a kernel
running this interpreter, working directory notebooks/), in memory: the committed files, with
the outputs of their real run, are left untouched. A failing cell fails the test with the cell's
source and traceback. The static checks keep the committed files honest: executed in order, no
error outputs, the same cells as the generator, outputs made with the bundled weights shipped
now, and no function or class defined in a notebook (STYLE H13: a helper a notebook needs goes
into gpt2np/, usually gpt2np/explain.py).
"""
import importlib.util
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tooling: pip install -r requirements-dev.txt")
pytest.importorskip("nbclient", reason="notebook tooling: pip install -r requirements-dev.txt")
pytest.importorskip("ipykernel", reason="notebook tooling: pip install -r requirements-dev.txt")
pytest.importorskip("matplotlib", reason="the notebooks plot: pip install -r requirements-dev.txt")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds: a whole notebook should take well under a minute on 2 cores
DEFINITION = re.compile(r"^\s*(def|class|async def)\s|\blambda\b", re.MULTILINE)


def load_builder():
    """tools/build_notebooks.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tools" / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILDER = load_builder()


def code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_every_generated_notebook_is_committed():
    assert sorted(p.name for p in NOTEBOOKS) == sorted(BUILDER.NOTEBOOK_CELLS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_outputs_of_one_clean_run(path):
    cells = code_cells(path)
    assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), \
        f"{path.name} was not executed top to bottom: python tools/build_notebooks.py {path.name[:2]}"
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was committed with an error: {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_come_from_the_bundled_models(path):
    recorded = nbformat.read(path, as_version=4).metadata.get("gpt2np", {}).get("bundled_weights")
    assert recorded == BUILDER.bundled_fingerprint(), \
        f"{path.name}'s outputs were made with other bundled weights: python tools/build_notebooks.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_cells_are_the_generators(path):
    expected = [c.source for c in BUILDER.NOTEBOOK_CELLS[path.name]]
    actual = [c.source for c in nbformat.read(path, as_version=4).cells]
    assert actual == expected, (f"{path.name} differs from tools/build_notebooks.py: edit the cells there, "
                                f"then python tools/build_notebooks.py {path.name[:2]}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_definitions_in_notebooks(path):
    defined = [c.source.splitlines()[0] for c in code_cells(path) if DEFINITION.search(c.source)]
    assert not defined, f"{path.name} defines a function or class (move it into gpt2np/): {defined}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path):
    start = time.perf_counter()
    nb, _ = BUILDER.execute(path, write=False, timeout=CELL_TIMEOUT)  # raises CellExecutionError
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} drew no plot"
