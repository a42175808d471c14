"""main.py --tree: its caps, the flags it goes with, and how -v, -p, --json and the statistics name a tree run.

The tree runs themselves (exact, greedy = the target's text) are tests/decoding/test_tree_loop.py's and
test_tree_shape.py's; these are the command line's words about them.
"""
import json
import subprocess
import sys

import pytest

from conftest import REPO
from gpt2np.decoding.speculative import TREE_ROOM
from gpt2np.decoding.tree_drafts import check_widths
from gpt2np.decoding.tree_policy import MAX_NODES, MAX_WIDTH
from gpt2np.report import TREE_MAX_NODES, TREE_MAX_WIDTH, check_tree_size, tree_nodes


def run_main(*args):
    return subprocess.run([sys.executable, "main.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def refused(out, message):
    """Exit status 2, one line on stderr naming the flag, nothing run."""
    assert out.returncode == 2 and message in out.stderr, (out.returncode, out.stderr)
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr and out.stdout == "", out.stderr + out.stdout


# ---- the caps on a tree the user types (audit item 4) ----------------------------------------------

def test_the_caps_hold_what_the_loop_and_tree_auto_allow():
    """A capped tree is never cut by the rows the loop keeps for it, and tree auto's shapes fit the caps."""
    assert TREE_MAX_NODES <= TREE_ROOM and MAX_WIDTH <= TREE_MAX_WIDTH and MAX_NODES <= TREE_MAX_NODES
    assert tree_nodes((3, 2, 1)) == 15 and tree_nodes((99999999999999999999,)) == 99999999999999999999
    assert check_tree_size((8, 7)) == (8, 7) and check_tree_size((1,) * TREE_MAX_NODES) == (1,) * TREE_MAX_NODES


@pytest.mark.parametrize("widths, says", [
    ((100,), r"at most 8 children a node and 64 nodes in all \(\(3, 2, 1\) drafts 15\), got \(100,\): 100 nodes"),
    ((9,), "got \\(9,\\): 9 nodes"),
    ((8, 8), "72 nodes"),
    ((1,) * 65, "65 nodes"),
    ((99999999999999999999,), "99999999999999999999 nodes"),
])
def test_check_widths_refuses_a_tree_beyond_its_caps_in_one_line(widths, says):
    with pytest.raises(ValueError, match=says) as error:
        check_tree_size(widths)
    assert "\n" not in str(error.value)
    assert check_widths(widths) == widths  # without caps, as the library's tree drafters call it: unchanged


@pytest.mark.parametrize("tree, says", [
    ("99999999999999999999", "got 99999999999999999999 children a node"),
    ("100", "got 100 children a node"),
    ("9", "got 9 children a node"),
    ("8,8", "got 72 nodes"),
    (",".join(["1"] * 65), "got 65 nodes"),
])
def test_a_tree_beyond_the_caps_is_refused_naming_tree(tree, says, main_here):
    out = main_here("--tree", tree, "--n_tokens_to_generate", "10")
    refused(out, "argument --tree: tree '")
    assert "is too big: at most 8 children a node and 64 nodes in all (3,2,1 drafts 15), " + says in out.stderr


def test_the_largest_trees_within_the_caps_run():
    for tree in ("8,7", "4,2,2"):
        out = run_main("--tree", tree, "--n_tokens_to_generate", "10")
        assert out.returncode == 0 and f"tree {tree}" in out.stdout, out.stderr


# ---- the flags tree auto goes with (audit items 1 and 2) ---------------------------------------------

def test_tree_auto_with_prompt_lookup_is_refused_before_any_run():
    refused(run_main("--draft_model_size", "ngram", "--tree", "auto"),
            "error: --tree auto picks the shapes a draft model grows; prompt lookup (--draft_model_size ngram) "
            "takes a fixed shape, e.g. --tree 3,1")
    refused(run_main("--approx_model_name", "ngram", "--tree", "auto"), "(--approx_model_name ngram)")


def test_K_max_bounds_tree_auto_and_no_fixed_shape(main_here):
    out = run_main("--tree", "auto", "--K_max", "2", "--n_tokens_to_generate", "20")
    assert out.returncode == 0, out.stderr
    assert "=== speculative (drafter shakespeare-260K, tree auto, depth <= 2) ===" in out.stdout
    for args in (["--tree", "3,2"], ["--K", "3"], []):
        refused(main_here(*args, "--K_max", "5"), "--K_max bounds --K heuristic, --K auto or --tree auto only")


# ---- how a tree run is reported (audit items 3 and 4) ----------------------------------------------

@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("json") / "tree.json"
    out = run_main("--tree", "3,2,1", "--n_tokens_to_generate", "20", "-v", "-p", "--json", str(path))
    assert out.returncode == 0, out.stderr
    return out.stdout, json.loads(path.read_text())


def test_profile_and_json_name_the_tree_not_K(tree_run):
    out, doc = tree_run
    assert "\nspeculative (drafter shakespeare-260K, tree 3,2,1): 20 tokens in" in out, out
    assert doc["tree"] == [3, 2, 1] and "K" not in doc and "K_max" not in doc, doc


def test_statistics_and_legend_count_nodes_per_tree(tree_run):
    out, _ = tree_run
    policy = next(line for line in out.splitlines() if "drafter, K policy" in line)
    assert "tree (3, 2, 1), " in policy and "nodes/tree" in policy and "K=" not in policy, policy
    assert "bonus token (a whole path of the tree accepted, to a leaf)" in out and "all K drafts" not in out


def test_tree_auto_json_and_statistics(tmp_path):
    out = run_main("--tree", "auto", "--n_tokens_to_generate", "20", "-p", "--json", str(tmp_path / "auto.json"))
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "auto.json").read_text())
    assert doc["tree"] == "auto" and doc["K_max"] == 8 and "K" not in doc, doc
    assert "speculative (drafter shakespeare-260K, tree auto, depth <= 8): 20 tokens in" in out.stdout
    assert "auto tree, nodes/tree " in out.stdout and "(nodes:rounds)" in out.stdout
