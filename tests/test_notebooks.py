"""The notebooks in notebooks/ run top to bottom, offline, and only call the package (issue 4).

Each notebook's source is its jupytext-paired percent script (notebooks/NN_name.py). The test
executes that script's cells with nbclient through tools/build_notebooks.py's own `execute` (a
kernel running this interpreter, working directory notebooks/), in memory: the committed .ipynb
files, with the outputs of their real run, are left untouched. A failing cell fails the test with
the cell's source and traceback. The static checks keep the committed .ipynb honest: the same cells
as its script (an edit made in one place and not synced fails), executed in order, no error
outputs, outputs made with the bundled weights shipped now, and no function or class defined in a
notebook (the project's rule: no logic lives in a notebook; a helper a notebook needs goes into gpt2np/,
usually gpt2np/teach/explain.py).
"""
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import load_tool
from gpt2np.teach.explain import CHECK_RUN

nbformat = pytest.importorskip("nbformat", reason="notebook tooling: pip install -r requirements-dev.txt")
jupytext = pytest.importorskip("jupytext", reason="notebook tooling: pip install -r requirements-dev.txt")
pytest.importorskip("nbclient", reason="notebook tooling: pip install -r requirements-dev.txt")
pytest.importorskip("ipykernel", reason="notebook tooling: pip install -r requirements-dev.txt")
pytest.importorskip("matplotlib", reason="the notebooks plot: pip install -r requirements-dev.txt")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SCRIPTS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT = 120  # seconds: a whole notebook should take well under a minute on 2 cores
WORKERS = min(2, os.cpu_count() or 1)  # notebooks executed at once: one core each
DEFINITION = re.compile(r"^\s*(def|class|async def)\s|\blambda\b", re.MULTILINE)


BUILDER = load_tool("build_notebooks")


def script_of(path):
    return path.with_suffix(".py")


def cells(nb):
    return [(c.cell_type, c.source) for c in nb.cells]


def code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_every_notebook_is_paired_with_a_percent_script():
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in SCRIPTS], \
        "each notebooks/NN_name.ipynb needs its notebooks/NN_name.py and back: python tools/build_notebooks.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_cells_are_the_scripts(path):
    script, notebook = jupytext.read(script_of(path)), nbformat.read(path, as_version=4)
    assert script.metadata["jupytext"]["text_representation"]["format_name"] == "percent"
    assert notebook.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", \
        f"{path.name} is not paired with its script: jupytext --set-formats ipynb,py:percent {path.name}"
    expected, actual = cells(script), cells(notebook)
    differ = [i for i, (e, a) in enumerate(zip(expected, actual)) if e != a]
    first = differ[0] if differ else min(len(expected), len(actual))
    assert actual == expected, (
        f"{path.name} and {path.stem}.py differ from cell {first + 1} on ({len(actual)} vs {len(expected)} "
        f"cells): one was edited without syncing; python tools/build_notebooks.py {path.name[:2]} "
        f"(runs jupytext --sync, the newer file wins, then re-executes)")


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
def test_no_definitions_in_notebooks(path):
    code = [c for c in jupytext.read(script_of(path)).cells if c.cell_type == "code"]
    defined = [c.source.splitlines()[0] for c in code if DEFINITION.search(c.source)]
    assert not defined, f"{path.name} defines a function or class (move it into gpt2np/): {defined}"


def execute_script(path, kernel):  # -> (the executed notebook, seconds), or (the exception, seconds)
    start = time.perf_counter()
    nb = jupytext.read(script_of(path))  # the source a person edits, not the committed outputs
    try:
        BUILDER.execute(nb, timeout=CELL_TIMEOUT, kernel=kernel)
    except Exception as e:  # CellExecutionError: the cell and its traceback; raised again by its own test
        return e, time.perf_counter() - start
    return nb, time.perf_counter() - start


@pytest.fixture(scope="module")
def executed(request):  # -> {notebook stem: (executed notebook or exception, seconds)}
    """The selected notebooks' scripts executed, WORKERS at a time, the slowest (highest numbers) first.

    Every notebook sets one BLAS thread (its models are tiny), so each kernel keeps one core busy:
    two at once on two cores take about half the time of one after the other (the notebooks' own
    timings move, and nothing here checks them; tools/build_notebooks.py, which writes the committed
    outputs, runs one at a time). With GPT2NP_NOTEBOOK_CHECK=1 every measurement a notebook repeats
    (explain.repeats) is taken once: the same cells on the same code paths in about half the time."""
    chosen = sorted((item.callspec.params["path"] for item in request.session.items
                     if getattr(item, "originalname", None) == "test_notebook_executes"), reverse=True)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CHECK_RUN, "1")  # each measurement taken once: this run checks that every cell runs
        with BUILDER.this_python_kernel() as kernel, ThreadPoolExecutor(WORKERS) as pool:
            results = pool.map(lambda path: execute_script(path, kernel), chosen)
            return {path.stem: result for path, result in zip(chosen, results)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, executed):
    nb, seconds = executed[path.stem]
    print(f"{script_of(path).name}: {seconds:.1f} s ({WORKERS} at a time)")
    if isinstance(nb, Exception):
        raise nb
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} drew no plot"


@pytest.mark.parametrize("only", [["zz"], ["01", "zz"], [""], ["01", " "]])  # "": every name starts with it
def test_a_prefix_that_names_no_notebook_is_an_error_before_any_build(capsys, monkeypatch, only):
    """`python tools/build_notebooks.py zz` built nothing, printed nothing and exited 0: a typo looked like success."""
    def build(*args, **kwargs):
        raise AssertionError("a notebook was built")
    monkeypatch.setattr(BUILDER, "execute", build)
    monkeypatch.setattr(BUILDER, "jupytext_cli", build)
    with pytest.raises(SystemExit) as stopped:
        BUILDER.main(only)
    err = capsys.readouterr().err
    said = "an empty notebook name" if "zz" not in only else "no notebook's name starts with 'zz'"
    assert stopped.value.code == 2 and said in err and err.count("\n") == 1, err
