"""Execute the notebooks from their percent scripts and save each .ipynb with its outputs.

    python tools/build_notebooks.py              # all of them
    python tools/build_notebooks.py 04 05        # only those whose file name starts with 04 / 05

Each notebook's source is a jupytext-paired percent script beside it (notebooks/NN_name.py: `# %%`
code cells, `# %% [markdown]` text cells), edited directly or through Jupyter with jupytext. The
build first runs `jupytext --sync` (the newer of the pair wins, so an edit made in either place is
kept), then executes the cells with nbclient and writes the .ipynb with their outputs, which is
what GitHub shows. A new notebook: write notebooks/NN_name.py and build it. tests/test_notebooks.py
imports `execute` from here, so CI runs the notebooks exactly as this script does.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

import jupytext
from jupytext.cli import jupytext as jupytext_cli
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "python3"
CELL_TIMEOUT = 300  # seconds; a notebook should take well under a minute


@contextmanager
def this_python_kernel():
    """A kernelspec named python3 that runs THIS interpreter (the venv's), found before any other.

    Jupyter searches JUPYTER_PATH before the user's and the environment's kernel folders, so a
    stray ~/.local/share/jupyter/kernels/python3 pointing at another Python cannot hijack the run.
    """
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "kernels" / KERNEL
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python"}))
        path = os.pathsep.join(p for p in (folder, os.environ.get("JUPYTER_PATH")) if p)
        with patch.dict(os.environ, JUPYTER_PATH=path):
            yield KERNEL


def execute(nb, timeout=CELL_TIMEOUT, kernel=None):
    """Run the notebook's cells top to bottom in notebooks/, filling in its outputs; return seconds.

    kernel: the name this_python_kernel() gave, where the caller holds one open for several
    executions (tests/test_notebooks.py runs two notebooks at a time: one this_python_kernel for
    all, since it sets JUPYTER_PATH for the whole process); None opens one for this call alone.
    Raises nbclient's CellExecutionError, naming the cell and the traceback, if any cell fails.
    """
    if kernel is None:
        with this_python_kernel() as kernel:
            return execute(nb, timeout, kernel)
    client = NotebookClient(nb, kernel_name=kernel, timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def bundled_fingerprint():
    """{bundled model: sha256 prefix of its weights}: notebook outputs depend on them, so the build
    records this in each notebook's metadata and tests/test_notebooks.py flags outputs gone stale."""
    folder = ROOT / "gpt2np" / "bundled"
    models = sorted(d for d in folder.glob("*") if (d / "hparams.json").is_file())
    return {d.name: hashlib.sha256((d / "model.ckpt.data-00000-of-00001").read_bytes()).hexdigest()[:16]
            for d in models}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("only", nargs="*", help="build only notebooks whose name starts with one of these")
    args = parser.parse_args(argv)
    every = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    if "" in [o.strip() for o in args.only]:  # an empty name starts every name: it would rebuild them all
        parser.exit(2, f"{parser.prog}: error: an empty notebook name: give a prefix such as 01, or none to build "
                       f"every notebook\n")
    unmatched = [o for o in args.only if not any(p.name.startswith(o) for p in every)]
    if unmatched:  # before any build: a typo built nothing and said nothing
        parser.exit(2, f"{parser.prog}: error: no notebook's name starts with {', '.join(map(repr, unmatched))} "
                       f"(the notebooks: {', '.join(p.stem for p in every)})\n")
    scripts = [p for p in every if not args.only or any(p.name.startswith(o) for o in args.only)]
    for script in scripts:
        notebook = script.with_suffix(".ipynb")
        if notebook.exists():  # after the sync the .ipynb holds the script's cells, with its cell ids
            jupytext_cli(["--sync", "--quiet", str(script)])
        nb = jupytext.read(notebook if notebook.exists() else script)
        nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
        seconds = execute(nb)
        nb.metadata["gpt2np"] = {"bundled_weights": bundled_fingerprint()}
        jupytext.write(nb, notebook, fmt="ipynb")
        print(f"{notebook.name}: executed in {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
