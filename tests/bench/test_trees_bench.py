"""The bench section "trees" (bench/trees.py, trees_report.py, forced_tree_draft.py).

The forced tree drafter must produce the acceptance by depth and sibling rank it is given (checked
through the loop's own counts, with a negative control that must fail), keep the target's greedy
output exact, and grow its trees with the real draft's calls; `python -m bench --tiny --sections
trees` runs in seconds, and its predicted columns are tree_shape's formulas for the rates it used.
No timing assertions: on a shared machine any speed can happen.
"""
import doctest
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2

import gpt2np
from gpt2np.decoding import speculative
from gpt2np.decoding.tree_policy import AutoTree
from gpt2np.decoding.tree_shape import best_shape, expected_tokens, tree_speedup
from gpt2np.teach.tree_simulation import FixedShape, simulate_tree_policy

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

from bench import forced_tree_draft, trees, trees_report  # noqa: E402
from bench.__main__ import parse_args, selected_sections  # noqa: E402
from bench.forced_tree_draft import ForcedTreeChoices, ForcedTreeDrafter, forced_auto_tree  # noqa: E402

FALSE_ALARM = 1e-3  # of the chi-square check below, for a drafter that does what it is told
RATES = ((0.6, 0.4, 0.3), (0.3, 0.5, 0.2), (0.8, 0.3, 0.5))  # rates[d][r]: depth d + 1, sibling rank r


# ---- the drafter --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair():
    """Small random models with room for long runs; the target's greedy continuation (the baseline)."""
    target = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=1024, n_embd=32, n_head=2, n_layer=2), seed=0,
                                 tokenizer=None)
    draft = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=1024, n_embd=16, n_head=2, n_layer=1), seed=1,
                                tokenizer=None)
    prompt = [1, 2, 3, 4]
    return target, draft, prompt, gpt2np.generate(target, prompt, 700, temperature=0)


def by_rank_counts(pair, widths, rates, seeds, n_tokens=700):
    """{(depth index, rank): [tried, accepted]} from stats.by_rank over one run per coin seed; every run exact."""
    target, draft, prompt, baseline = pair
    counts = {}
    for seed in seeds:
        drafter = ForcedTreeDrafter(draft, prompt + baseline, rates, widths, seed=seed)
        result = gpt2np.speculative_generate(target, drafter, prompt, n_tokens, temperature=0)
        assert result.tokens == baseline[:n_tokens], trees_report.mismatch(result.tokens, baseline[:n_tokens])
        for d, row in enumerate(result.stats.by_rank):
            for r, (tried, accepted) in enumerate(row):
                count = counts.setdefault((d, r), [0, 0])
                count[0], count[1] = count[0] + tried, count[1] + accepted
    return counts


def rate_check(counts, rates, min_tried=20):
    """Chi-square of accepted vs tried x rates[d][r] over every (depth, rank) tried >= min_tried times
    (binomial cells, one degree of freedom each): (passes at FALSE_ALARM, statistic, df, worst cell)."""
    stat, df, worst = 0.0, 0, (0.0, None)
    for (d, r), (tried, accepted) in sorted(counts.items()):
        a = rates[min(d, len(rates) - 1)][r]  # past the last row: its rates (ForcedTreeChoices)
        if tried < min_tried or a in (0.0, 1.0):
            assert a not in (0.0, 1.0) or accepted == a * tried, (d, r, tried, accepted)  # certain: exact
            continue
        z2 = (accepted - a * tried) ** 2 / (tried * a * (1 - a))
        stat, df = stat + z2, df + 1
        worst = max(worst, (z2, f"depth {d + 1} rank {r}: {accepted}/{tried} = {accepted / tried:.3f} vs {a}"))
    return chi2.sf(stat, df) >= FALSE_ALARM, stat, df, worst[1]


@pytest.mark.parametrize("widths", [(3, 2, 2), (1, 1, 1, 1)])
def test_acceptance_by_depth_and_rank_follows_the_rates_given(pair, widths):
    counts = by_rank_counts(pair, widths, RATES, seeds=range(3))
    ok, stat, df, worst = rate_check(counts, RATES)
    assert df >= (7 if max(widths) > 1 else 3), counts  # every (depth, rank) the shape tries was checked
    assert ok, f"chi-square {stat:.1f} on {df} df (false alarm {FALSE_ALARM}); worst cell {worst}"


def test_the_check_fails_against_other_rates(pair):
    """Negative control: the same runs against rates that differ by 0.1 to 0.2 must fail the check."""
    counts = by_rank_counts(pair, (3, 2, 2), RATES, seeds=range(3))
    other = tuple(tuple(a + 0.15 if a < 0.5 else a - 0.15 for a in row) for row in RATES)
    ok, stat, df, worst = rate_check(counts, other)
    assert not ok, f"chi-square {stat:.1f} on {df} df passed against the wrong rates; worst cell {worst}"


def test_certain_rates_accept_every_child_of_that_rank(pair):
    """rates 1 at rank 1, 0 elsewhere: every round accepts the second child at every depth."""
    counts = by_rank_counts(pair, (2, 2), ((0.0, 1.0), (0.0, 1.0)), seeds=[0], n_tokens=60)
    assert all(accepted == (tried if r == 1 else 0) for (d, r), (tried, accepted) in counts.items()), counts


class Counting:
    """The model interface around a real model, recording the rows of every forward_rows call."""

    def __init__(self, model):
        self.model, self.rows_calls, self.calls = model, [], 0
        self.n_vocab, self.n_ctx, self.eot_id, self.config = model.n_vocab, model.n_ctx, model.eot_id, model.config

    def new_cache(self, *args):
        return self.model.new_cache(*args)

    def forward(self, ids, cache, n_logits=1):
        self.calls += 1
        return self.model.forward(ids, cache, n_logits)

    def forward_rows(self, ids, *args, **kw):
        self.rows_calls.append(len(ids))
        return self.model.forward_rows(ids, *args, **kw)


def depth_of(parents, node):
    depth = 0
    while parents[node] != -1:
        node, depth = parents[node], depth + 1
    return depth


def test_a_tree_is_the_forced_one_grown_with_the_real_drafts_calls(pair):
    target, draft, prompt, baseline = pair
    counting = Counting(draft)
    drafter = ForcedTreeDrafter(counting, prompt + baseline, RATES, (3, 2, 2), seed=4)
    drafter.reset(target)
    context = prompt + baseline[:10]
    tree = drafter.propose(context, 3, {"temperature": 0, "top_k": None, "top_p": None}, rng=None)
    assert counting.calls == 1 and counting.rows_calls == [3, 6]  # the root, then one call a level (leaves never fed)
    choices, kids = drafter.model.choices, tree.children()
    for node, children in enumerate(kids):
        if children:
            depth = depth_of(tree.parents, node)
            position = len(context) + depth
            want = choices.children(position, depth)[:len(children)]
            assert [tree.tokens[c] for c in children] == want, (node, depth, want)
            row = tree.q[node]  # greedy: one-hot at the argmax, as ModelTreeDrafter gives the kernel
            assert row.max() == 1.0 and row.sum() == 1.0 and tree.tokens[children[0]] == int(row.argmax())
        else:
            assert not tree.q[node].any()  # leaves' rows are never read


def test_the_same_coins_serve_every_alpha():
    """Common random numbers: where rank 0 holds g at alpha 0.4 it holds g at 0.7 too (same seed)."""
    sequence = list(range(50)) * 4
    low, high = (ForcedTreeChoices(sequence, ((a, 0.5),), 64, seed=2) for a in (0.4, 0.7))
    hits = [[c.children(i, 0)[0] == sequence[i] for i in range(len(sequence))] for c in (low, high)]
    assert all(h for lo, h in zip(*hits) if lo) and sum(hits[1]) > sum(hits[0]) > 0, (sum(hits[0]), sum(hits[1]))


def test_auto_runs_exact_through_the_forced_drafter_and_the_patch_is_undone(pair):
    target, draft, prompt, baseline = pair
    before = speculative.auto_tree
    with forced_auto_tree(prompt + baseline, RATES, seed=0) as made:
        result = gpt2np.speculative_generate(target, draft, prompt, 80, temperature=0, tree="auto")
    assert speculative.auto_tree is before
    assert result.tokens == baseline[:80], trees_report.mismatch(result.tokens, baseline[:80])
    assert len(made) == 1 and sum(made[0].shapes_used.values()) == result.stats.rounds, made[0].shapes_used


def test_bad_uses_are_one_line_errors(pair):
    target, draft, prompt, baseline = pair
    with pytest.raises(ValueError, match="need rates for 3 ranks"):
        ForcedTreeDrafter(draft, prompt + baseline, ((0.5, 0.5),), (3, 1))
    with pytest.raises(ValueError, match="every rate in"):
        ForcedTreeChoices([1, 2], ((0.5, 1.5),), 64)
    drafter = ForcedTreeDrafter(draft, prompt + baseline, RATES, (2, 1))
    with pytest.raises(ValueError, match="temperature 0 only"):
        gpt2np.speculative_generate(target, drafter, prompt, 5, temperature=1.0, rng=np.random.default_rng(0))


def test_forced_tree_draft_docstring_example():
    assert doctest.testmod(forced_tree_draft).failed == 0


# ---- the section, tiny ----------------------------------------------------------------------------

ALPHAS, SHAPES = (0.5, 1.0), "K=1-2;2,1;3,2,1;auto"
SIDES = ["plain", "K=1", "K=2", "(2,1)", "(3,2,1)", "auto"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The section as a user runs it, on the tiny pair: (its JSON section, its stdout)."""
    path = tmp_path_factory.mktemp("trees") / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--tiny", "--sections", "trees", "--json", str(path),
                           "--tree-alphas", ",".join(map(str, ALPHAS)), "--tree-shapes", SHAPES],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(path.read_text())["trees"], done.stdout


def test_every_alpha_has_every_side_and_every_run_is_the_baseline(tiny_run):
    section, _ = tiny_run
    assert (section["draft"], section["target"]) == ("tiny", "tiny2")
    assert [c["alpha"] for c in section["cells"]] == list(ALPHAS)
    for cell in section["cells"]:
        assert [r["side"] for r in cell["rows"]] == SIDES
        assert cell["exact"] and not cell["mismatched"], cell["mismatched"]
        for row in cell["rows"]:
            assert row["exact"] and len(row["runs_tokens_per_s"]) == section["repeats"] == 2, row
            assert row["tokens_per_s"] > 0 and row["tokens_per_call"] >= 1
        chains = {r["side"]: r["tokens_per_s"] for r in cell["rows"] if r["side"].startswith("K=")}
        assert cell["best_chain"] == max(chains, key=chains.get)
        auto = cell["rows"][-1]
        assert sum(auto["shapes_used"].values()) > 0, auto["shapes_used"]  # rounds by shape (timing-dependent)


def test_the_predicted_columns_are_tree_shapes_formulas_for_the_rates_used(tiny_run):
    section, _ = tiny_run
    ratios, costs = profile_ratios(section), section["costs"]
    c, v = costs["c"], {int(M): x for M, x in costs["v"].items()}
    for cell in section["cells"]:
        rates = [[min(1.0, cell["alpha"] * ratio) for ratio in ratios]] * 8  # rank 0 = alpha at every depth
        assert cell["rates"][0] == pytest.approx(rates[0])
        rows = {r["side"]: r for r in cell["rows"]}
        for side, row in rows.items():
            if side in ("plain", "auto"):
                continue
            shape = tuple(row["shape"])
            assert row["predicted_tokens_per_call"] == pytest.approx(expected_tokens(shape, rates), rel=1e-12)
            assert row["predicted_speedup"] == pytest.approx(tree_speedup(shape, rates, c, v), rel=1e-12)
        best, speedup = best_shape(rates, c, v, AutoTree(8).shapes)
        assert tuple(rows["auto"]["shape"]) == best and rows["auto"]["predicted_speedup"] == pytest.approx(speedup)
        best_chain = max((r for s, r in rows.items() if s.startswith("K=")), key=lambda r: r["predicted_speedup"])
        for row in rows.values():
            assert row["predicted_over_best_chain"] == pytest.approx(row["predicted_speedup"]
                                                                     / best_chain["predicted_speedup"])
            assert row["predicted_tokens_per_call_over_best_chain"] == pytest.approx(
                row["predicted_tokens_per_call"] / best_chain["predicted_tokens_per_call"])
    assert rows["(2,1)"]["predicted_tokens_per_call"] == pytest.approx(1 + 1 + 1.0)  # alpha 1: (2,1) reaches depth 2


def test_the_simulator_replays_each_repeat_on_its_coins(tiny_run):
    """teach/tree_simulation.py on seed r plays a fixed shape on the coins of the section's repeat r: run by run,
    the same target calls for every chain and tree (auto's simulated ratio rests on this replay). A seed off by
    one plays other coins (the control)."""
    section, _ = tiny_run
    ratios, costs = profile_ratios(section), section["costs"]
    v = {int(M): x for M, x in costs["v"].items()}

    def rounds(shape, alpha, seed):
        return simulate_tree_policy(FixedShape(tuple(shape)), alpha, costs["c"], v, section["n_tokens"], seed, ratios,
                                    prompt_len=section["prompt_len"])["rounds"]
    shifted = 0
    for cell in section["cells"]:
        for row in cell["rows"]:
            if row["side"] in ("plain", "auto"):
                continue
            repeats = range(section["repeats"])
            assert [rounds(row["shape"], cell["alpha"], r) for r in repeats] == row["runs_target_calls"], \
                (cell["alpha"], row["side"], row["runs_target_calls"])
            shifted += [rounds(row["shape"], cell["alpha"], r + 7) for r in repeats] != row["runs_target_calls"]
    assert shifted >= 2, "seeds 7 and 8 replay the same target calls as repeats 0 and 1 everywhere: the check is blind"


def test_auto_s_simulated_ratio_is_printed_beside_the_measured_one(tiny_run):
    section, stdout = tiny_run
    for cell in section["cells"]:
        sim = cell["auto_simulated"]
        assert len(sim["per_repeat"]) == section["repeats"] and sim["n_seeds"] == trees_report.SIMULATED_SEEDS
        assert sim["this_run"] == pytest.approx(float(np.median(sim["per_repeat"])))
        assert 0.2 < sim["seeds"] < 5, sim
    assert stdout.count("auto / best chain simulated, its learning included") == len(ALPHAS)


def profile_ratios(section):
    assert section["profile"] == "bundled-t0" and section["ratios"] == list(trees_report.PROFILES["bundled-t0"][1])
    return section["ratios"]


def test_the_tables_and_the_targets(tiny_run):
    section, stdout = tiny_run
    assert "# Token trees, tiny (forced tree drafter) -> tiny2" in stdout and "the sides in lockstep" in stdout
    assert "BLAS: " + section["blas_kernel"] in stdout
    for cell in section["cells"]:
        assert f"## alpha {cell['alpha']}: rates by rank" in stdout
    header = next(line for line in stdout.splitlines() if line.strip().startswith("side  nodes"))
    assert header.split() == ["side", "nodes", "tok/call", "pred", "/best", "chain", "pred", "tok/s", "x", "plain",
                              "pred", "/best", "chain", "pred", "exact"]
    names = [t["target"] for t in section["targets"]]
    assert sum("auto / best chain" in n for n in names) == len(ALPHAS) and "!!! ERROR" not in stdout
    for t in section["targets"]:
        assert t["met"] == (t["measured"] >= float(t["goal"].split()[-1]))


# ---- flags and the report's pure parts --------------------------------------------------------------

def test_all_leaves_trees_out_and_naming_it_runs_only_it():
    assert "trees" not in selected_sections("all") and selected_sections("trees") == {"trees"}


def test_the_default_plan_is_the_issues_table():
    plan = trees.plan_from_args(parse_args(["--sections", "trees"]))
    assert plan.pair == ("124M", "1558M") and plan.alphas == (0.3, 0.5, 0.8, 1.0)
    assert plan.shapes == tuple((1,) * K for K in range(1, 7)) + ((2, 1), (2, 2, 1), (3, 2, 1), (3, 2, 2, 1), "auto")
    assert plan.lockstep and not trees.plan_from_args(parse_args(["--sections", "trees", "--no-tree-lockstep"])).lockstep


@pytest.mark.parametrize("in_lockstep", [True, False])
def test_a_repeat_runs_its_sides_in_lockstep_or_back_to_back(pair, monkeypatch, in_lockstep):
    """In lockstep the sides take turns a round at a time (the one furthest behind first); back to back each
    runs to its end before the next starts. Either way every side's tokens are the target's greedy ones."""
    target, draft, prompt, baseline = pair
    plan, sides = trees.TreePlan(n_tokens=30, lockstep=in_lockstep), ["plain", (1, 1), (2, 1), "auto"]
    turns, step = [], trees.StreamSide.step
    monkeypatch.setattr(trees.StreamSide, "step", lambda self: turns.append(id(self)) or step(self))
    rates = trees.scaled_rates(0.8, trees.PROFILES["bundled-t0"][1], 8)
    records = trees.run_sides(sides, target, draft, prompt, prompt + baseline, rates, plan, seed=0)
    for side, record in zip(sides, records):
        assert record["tokens"] == baseline[:30], (side, trees_report.mismatch(record["tokens"], baseline[:30]))
        assert record["seconds"] > 0 and 1 <= record["target_calls"] <= 30
    assert "shapes_used" in records[-1] and "shapes_used" not in records[0]
    switches = sum(a != b for a, b in zip(turns, turns[1:]))
    assert (switches > 3 * len(sides)) if in_lockstep else (switches == len(sides) - 1), (switches, len(turns))


@pytest.mark.parametrize("flags, says", [
    (["--tree-alphas", "1.5"], "--tree-alphas must lie in [0, 1]"),
    (["--tree-alphas", "x"], "--tree-alphas: comma-separated floats"),
    (["--tree-shapes", "2,1;auto"], "needs at least one chain"),
    (["--tree-shapes", "K=1;5,1"], "at most 4 children a node"),
    (["--tree-shapes", "K=1;two"], "--tree-shapes: K=a-b"),
    (["--tree-shapes", "K=0"], "'K=0' names no chain"),
    (["--tree-shapes", "K=3-1;auto"], "'K=3-1' names no chain"),
    (["--tree-pair", "124M"], "--tree-pair: DRAFT,TARGET"),
    (["--tree-pair", "124M,999M"], "--tree-pair: DRAFT,TARGET"),
    (["--tree-tokens", "1000"], "do not fit the context of 124M,1558M (1024)"),
    (["--tree-repeats", "0"], "--tree-repeats >= 1"),
])
def test_bad_flags_are_one_line_errors(flags, says):
    with pytest.raises(SystemExit) as error:
        trees.plan_from_args(parse_args(["--sections", "trees", *flags]))
    message = str(error.value)
    assert says in message and "\n" not in message, message


def test_a_bad_flag_exits_before_any_work(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "--sections", "trees", "--tree-alphas", "2",
                           "--json", str(tmp_path / "b.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]  # as argparse's own errors
    assert "--tree-alphas must lie in [0, 1]" in done.stderr and "## " not in done.stdout


def run(seconds, tokens, calls):
    return {"seconds": seconds, "tokens": tokens, "target_calls": calls}


def test_a_cell_pairs_its_ratios_and_flags_a_run_off_the_baseline():
    reference = [5, 6, 7, 8]
    runs = {"plain": [run(2.0, reference, 4), run(4.0, reference, 4)],
            "K=1": [run(1.0, reference, 2), run(3.0, reference, 2)],
            "(2,1)": [run(0.5, [5, 6, 0, 8], 2), run(2.0, reference, 2)]}
    predicted = {"plain": {"shape": None, "tokens_per_call": 1.0, "speedup": 1.0},
                 "K=1": {"shape": [1], "tokens_per_call": 1.5, "speedup": 1.2},
                 "(2,1)": {"shape": [2, 1], "tokens_per_call": 2.0, "speedup": 1.5}}
    cell = trees_report.summarise_cell(runs, reference, 0.5, ((0.5, 0.25),), predicted)
    rows = {r["side"]: r for r in cell["rows"]}
    assert cell["best_chain"] == "K=1" and rows["K=1"]["speedup"] == pytest.approx(np.median([2.0, 4 / 3]))
    assert rows["(2,1)"]["over_best_chain"] == pytest.approx(np.median([2.0, 1.5]))  # per repeat, then median
    assert rows["(2,1)"]["tokens_per_call_over_best_chain"] == 1.0  # 4 tokens in 2 calls, as K=1
    assert rows["(2,1)"]["predicted_over_best_chain"] == pytest.approx(1.25)
    assert not cell["exact"] and cell["mismatched"] == {"(2,1)": "differs from the target's greedy baseline at "
                                                                 "token 2 of 4"}
    with pytest.raises(SystemExit, match="1 side"):
        trees_report.exit_on_mismatch({"cells": [cell]})
    section = {"draft": "a", "target": "b", "cells": [cell]}
    (confirm,) = trees_report.targets(section)  # (2,1) predicted 1.25 >= 1.05 x the best chain: confirm it
    assert confirm["measured"] == pytest.approx(np.median([2.0, 1.5]) / 1.25) and confirm["met"]


def auto_cell(shape, oracle, simulated, measured):  # a cell whose only rows are the best chain and auto
    rows = [{"side": "K=5", "shape": [1] * 5, "over_best_chain": 1.0, "predicted_over_best_chain": 1.0},
            {"side": "auto", "shape": shape, "over_best_chain": measured, "predicted_over_best_chain": oracle}]
    cell = {"alpha": 0.3, "best_chain": "K=5", "rows": rows}
    if simulated is not None:
        cell["auto_simulated"] = {"seeds": simulated, "n_seeds": 100, "this_run": simulated, "per_repeat": []}
    return cell


def test_auto_is_confirmed_against_its_learning_and_only_where_it_predicts_a_tree():
    """auto's prediction is what it gets with its learning (simulated_auto), not its shape at the true rates
    from the first round; a chain longer than the table's best one predicts nothing about trees."""
    def confirmations(cell):
        return [t for t in trees_report.targets({"draft": "a", "target": "b", "cells": [cell]})
                if "measured / predicted" in t["target"]]

    # session 49's alpha 0.3 at 1558M: the tree (4) at the true rates 1.18, with its learning 1.085, measured 1.057
    (confirm,) = confirmations(auto_cell([4], 1.18, 1.085, 1.057))
    assert confirm["measured"] == pytest.approx(1.057 / 1.085) and confirm["met"], confirm
    assert "predicted 1.085" in confirm["target"] and "(4) at the true rates: 1.180" in confirm["target"]
    (missed,) = confirmations(auto_cell([3, 1], 1.17, 1.12, 1.05))  # 0.9375 of what its learning allows
    assert missed["measured"] == pytest.approx(1.05 / 1.12) and not missed["met"], missed
    assert confirmations(auto_cell([1] * 8, 1.112, 1.075, 1.01)) == []  # alpha 1.0: K = 8, a chain
    assert confirmations(auto_cell([4], 1.18, 1.03, 0.9)) == []         # its learning leaves it under 1.05
    assert confirmations(auto_cell([4], 1.18, None, 0.9)) == []         # nothing simulated: nothing predicted
    names = [t["target"] for t in trees_report.targets({"draft": "a", "target": "b",
                                                         "cells": [auto_cell([4], 1.18, 1.085, 1.057)]})]
    assert names[0] == "a->b a=0.3 auto / best chain (K=5), measured" and len(names) == 2


def test_the_forced_drafters_caches_are_sized_to_the_run_as_a_draft_model_s(pair):
    """The loop sizes a draft model's cache to the run (fit_cache, request_cache); the forced drafters around one
    must let it, or each run allocates the whole context (75 MB at 124M) and its first step pays for fresh memory
    (150-600 ms at 1558M in the trees section). The chain's forced draft as the policies section wraps it too."""
    from bench.forced_draft import ForcedAcceptanceDraft
    from bench.spec import TimedProxy
    from gpt2np.decoding.autoregressive import request_cache
    target, draft, prompt, baseline = pair
    drafter = ForcedTreeDrafter(draft, prompt + baseline, RATES, (2, 1), seed=0)
    result = gpt2np.speculative_generate(target, drafter, prompt, 40, temperature=0)
    assert result.tokens == baseline[:40]
    assert drafter.timed.cache.n_ctx == len(prompt) + 40 + speculative.TREE_ROOM < draft.n_ctx  # the run's, not 1024
    for forced in (ForcedAcceptanceDraft(draft, prompt + baseline, 0.8, seed=0),
                   TimedProxy(ForcedAcceptanceDraft(draft, prompt + baseline, 0.8, seed=0))):
        assert request_cache(forced, 52).n_ctx == 52 and forced.new_cache().n_ctx == draft.n_ctx
        run = gpt2np.speculative_generate(target, forced, prompt, 40, K=3, temperature=0)
        assert run.tokens == baseline[:40]


# ---- the bundled pair's bound (python -m bench.trees) -------------------------------------------

def test_the_bound_is_the_best_chain_and_the_best_shape_by_tree_speedup():
    """shape_bound against tree_speedup shape by shape: on a flat curve a second child that passes half the
    time pays (a tree ahead of every chain), on a compute-bound curve (each row a fifth of a call) no tree
    does; the most tokens per call come from the largest tree, whatever its speed."""
    from gpt2np.decoding.tree_shape import candidate_shapes
    shapes = candidate_shapes(4, 3, 20)
    rates = [[0.6, 0.5, 0.4]] * 4
    flat, steep = {M: 1.0 for M in range(1, 22)}, {M: 1 + 0.2 * (M - 1) for M in range(1, 22)}
    for v, tree_wins in ((flat, True), (steep, False)):
        bound = trees_report.shape_bound(rates, 0.1, v, shapes)
        speed = {w: tree_speedup(w, rates, 0.1, v) for w in shapes}
        best_chain = max((w for w in shapes if max(w) == 1), key=speed.get)
        assert bound["chain"] == best_chain and bound["chain_speedup"] == pytest.approx(speed[best_chain])
        assert bound["speedup"] == pytest.approx(max(speed.values())), (bound, max(speed.values()))
        assert (max(bound["shape"]) > 1) == tree_wins and (bound["ratio"] > 1.05) == tree_wins, bound
        assert bound["ratio"] == pytest.approx(bound["speedup"] / bound["chain_speedup"])
        most = bound["most_tokens"]
        assert expected_tokens(most, rates) == pytest.approx(max(expected_tokens(w, rates) for w in shapes))
        assert bound["most_tokens_per_call"] == pytest.approx(expected_tokens(most, rates)
                                                             / expected_tokens(best_chain, rates))
        assert bound["most_tokens_speedup"] == pytest.approx(speed[most] / speed[best_chain])


def test_the_bundled_bound_times_the_bundled_target_and_prices_every_shape(capsys):
    """bundled_bound on made-up counts: c and v(M) of the bundled target timed up to the largest candidate's
    rows, a rank never tried left out of the shapes (no rate to price it), one line per temperature."""
    counts = {0: {(0, 0): [100, 70], (0, 1): [30, 15], (1, 0): [70, 50], (1, 1): [20, 8], (0, 2): [0, 0]}}
    out = trees.bundled_bound(counts, repeats=1)
    depth, width, nodes = trees.BOUND_SHAPES
    assert sorted(out["v"]) == list(range(1, nodes + 2)) and out["v"][1] == 1.0 and out["c"] > 0
    bound = out["bounds"][0]
    assert max(bound["most_tokens"]) == 2 and bound["ratio"] >= 1.0  # ranks 0 and 1 only; chains are shapes too
    printed = capsys.readouterr().out
    assert out["kernel"] in printed and "temperature 0: best chain" in printed, printed
