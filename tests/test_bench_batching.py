"""The bench section "batching" (bench/batching.py, batching_report.py, forced_batch_draft.py).

`python -m bench --tiny --sections batching` runs in seconds on the tiny pair; we check the table's
structure, the JSON's, that every side reproduced plain decoding, and that the forced drafter's
acceptance is what it was built to be. No timing assertions: on a shared machine any speed can happen.
"""
import doctest
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding import batched_speculative
from gpt2np.model.config import PRESETS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

from bench import batching, batching_report, forced_batch_draft  # noqa: E402
from bench.__main__ import parse_args, selected_sections  # noqa: E402
from bench.forced_batch_draft import ForcedBatchDraft, packed_draft_calls  # noqa: E402

SIZES, ALPHAS, KS = (1, 3), (0.0, 1.0), (1, 2)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The section as a user runs it, on the tiny pair: (its JSON section, its stdout)."""
    path = tmp_path_factory.mktemp("batching") / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--tiny", "--sections", "batching", "--json", str(path),
                           "--batch-sizes", ",".join(map(str, SIZES)), "--batch-alphas", ",".join(map(str, ALPHAS)),
                           "--batch-Ks", ",".join(map(str, KS))],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(path.read_text())["batching"], done.stdout


def test_every_cell_has_every_side_and_matches_plain_decoding(tiny_run):
    section, _ = tiny_run
    assert [(p["draft"], p["target"]) for p in section["pairs"]] == [("tiny", "tiny2")]
    cells = section["pairs"][0]["cells"]
    assert [(c["B"], c["alpha"]) for c in cells] == [(B, a) for B in SIZES for a in ALPHAS]
    for c in cells:
        assert list(c["sides"]) == ["plain", *[f"K={K}" for K in KS], "auto"], c["sides"].keys()
        assert c["exact"] and not c["mismatched"], c["mismatched"]
        for name, side in c["sides"].items():
            assert len(side["runs_tokens_per_s"]) == section["plan"]["repeats"] == 2, (name, side)
            assert side["tokens_per_s"] > 0 and all(r > 0 for r in side["runs_tokens_per_s"])
        fixed = {k: s["tokens_per_s"] for k, s in c["sides"].items() if k != "auto"}
        assert c["best"] == max(fixed, key=fixed.get) and c["best_tokens_per_s"] == fixed[c["best"]]
        assert c["drafting_pays"] == (c["best"] != "plain")
        assert all(x > 0 for x in (c["best_over_plain"], c["auto_over_best"], c["auto_over_plain"]))


def test_forced_acceptance_is_what_the_drafter_was_built_for(tiny_run):
    """alpha 0: no draft accepted; alpha 1: every one (each fixed K side drafted, so something was examined)."""
    for c in tiny_run[0]["pairs"][0]["cells"]:
        for K in KS:
            side = c["sides"][f"K={K}"]
            assert side["examined"] > 0 and side["alpha_hat"] == c["alpha"], (c["B"], K, side["alpha_hat"])
            assert set(side["K_counts"]) <= {str(k) for k in range(K + 1)}, side["K_counts"]  # clamped, never more
        assert set(c["sides"]["plain"]["K_counts"]) == {"0"}


def test_the_table_and_the_crossover_lines(tiny_run):
    section, stdout = tiny_run
    assert "## Batched decoding, tiny draft (forced acceptance) -> tiny2 target" in stdout
    header = next(line for line in stdout.splitlines() if line.strip().startswith("B  alpha"))
    assert header.split() == ["B", "alpha", "plain", "K=1", "K=2", "auto", "best", "best", "is", "best/plain",
                              "auto/best", "auto/best", "range", "auto/plain", "plain/B1", "auto", "K:rounds", "a_hat",
                              "exact"]
    assert "BLAS: " + section["blas_kernel"] in stdout
    assert section["pairs"][0]["weights_order"] == "row-major" and "weights row-major; BLAS" in stdout  # tiny: small
    lines = stdout.split("where drafting stops paying, tiny -> tiny2:\n")[1].splitlines()
    assert [line.strip() for line in lines[:len(ALPHAS)]] == section["pairs"][0]["crossover"]
    assert [line.strip().split(":")[0] for line in lines[:len(ALPHAS)]] == [f"alpha {a}" for a in ALPHAS]
    stops = section["pairs"][0]["stops_paying"]
    assert list(stops) == [str(a) for a in ALPHAS] and all(B is None or B in SIZES for B in stops.values()), stops
    assert "## Batching targets (this run)" in stdout and "!!! ERROR" not in stdout
    n_off = len(batching_report.switched_off_cells(section["pairs"][0]["cells"]))
    assert len(section["targets"]) == len(SIZES) * len(ALPHAS) + n_off


def test_all_leaves_batching_out_and_naming_it_runs_only_it():
    assert "batching" not in selected_sections("all") and selected_sections("batching") == {"batching"}


@pytest.mark.parametrize("flags, says", [
    (["--batch-sizes", "0,2"], "--batch-sizes must lie in 1..64"),
    (["--batch-sizes", "two"], "--batch-sizes: comma-separated ints"),
    (["--batch-alphas", "1.5"], "--batch-alphas must lie in [0, 1]"),
    (["--batch-Ks", "0"], "--batch-Ks must be >= 1"),
    (["--batch-pairs", "124M"], "--batch-pairs: DRAFT,TARGET pairs"),
    (["--batch-pairs", "124M,999M"], "unknown size(s) 999M"),
    (["--batch-tokens", "1020"], "does not fit the context of 124M,355M (1024)"),
])
def test_bad_flags_are_one_line_errors(flags, says):
    with pytest.raises(SystemExit) as error:
        batching.plan_from_args(parse_args(["--sections", "batching", *flags]))
    message = str(error.value)
    assert says in message and "\n" not in message, message


def test_a_bad_flag_exits_before_any_work(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "--sections", "batching", "--batch-sizes", "0",
                           "--json", str(tmp_path / "b.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]  # as argparse's own errors
    assert "--batch-sizes must lie in 1..64" in done.stderr and "## " not in done.stdout


def test_the_default_pairs_are_preset_shapes():
    plan = batching.plan_from_args(parse_args(["--batch-pairs", "124M,355M;124M,1558M"]))
    assert plan.pairs == (("124M", "355M"), ("124M", "1558M")) and plan.configs["1558M"] == PRESETS["1558M"]


# ---- the drafter --------------------------------------------------------------------------------

class Counting(ForcedBatchDraft):
    calls = packed = 0

    def forward(self, ids, cache, n_logits=1):
        self.calls += 1
        return super().forward(ids, cache, n_logits)

    def forward_packed(self, calls, n_logits=1):
        self.packed += 1
        return super().forward_packed(calls, n_logits)


@pytest.fixture(scope="module")
def pair():
    target = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=32, n_embd=32, n_head=2, n_layer=2), seed=0,
                                 tokenizer=None)
    draft = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=32, n_embd=16, n_head=2, n_layer=1), seed=1,
                                tokenizer=None)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]  # different lengths: different positions per sequence
    return target, draft, prompts, gpt2np.generate_batch(target, prompts, 10, temperature=0)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_forced_batch_draft_keeps_the_target_exact_and_packs_its_calls(pair, alpha):
    target, draft_model, prompts, reference = pair
    draft = Counting(draft_model, [p + r for p, r in zip(prompts, reference)], alpha, seeds=[0, 1, 2])
    before = batched_speculative.packed_call
    with packed_draft_calls(draft):
        side = batching.CellSide(gpt2np.speculative_batch_stream(target, draft, prompts, 10, K=3, temperature=0))
        while side.step():  # to the stream's end, counting
            pass
    tokens, Ks, accepted, examined = side.tokens, side.Ks, side.accepted, side.examined
    assert batched_speculative.packed_call is before  # restored after the block
    assert tokens == reference, batching_report.mismatch(tokens, reference)
    assert draft.calls == 0 and draft.packed >= max(Ks), (draft.calls, draft.packed)  # one packed pass a draft step
    expected = {0.0: 0, 1.0: examined}.get(alpha)
    assert examined > 0 and (expected is None or accepted == expected), (accepted, examined)


def test_without_the_block_the_batch_loop_calls_the_draft_once_per_sequence(pair):
    target, draft_model, prompts, reference = pair
    draft = Counting(draft_model, [p + r for p, r in zip(prompts, reference)], 1.0, seeds=[0, 1, 2])
    assert gpt2np.speculative_generate_batch(target, draft, prompts, 10, K=2, temperature=0) == reference
    assert draft.packed == 0 and draft.calls >= len(prompts)


def test_a_draft_built_for_n_sequences_refuses_more(pair):
    draft = ForcedBatchDraft(pair[1], [[1, 2], [3, 4]], 0.5, seeds=[0, 1])
    draft.new_cache(), draft.new_cache()
    with pytest.raises(ValueError, match="built for 2 sequences"):
        draft.new_cache()
    with pytest.raises(ValueError, match="one seed per sequence"):
        ForcedBatchDraft(pair[1], [[1, 2]], 0.5, seeds=[0, 1])


def test_forced_batch_draft_docstring_example():
    assert doctest.testmod(forced_batch_draft).failed == 0


def test_the_reports_docstring_examples():  # bench/ is not collected for doctests (pytest.ini): spread's, here
    result = doctest.testmod(batching_report)
    assert result.attempted > 0 and result.failed == 0, result


# ---- the numbers --------------------------------------------------------------------------------

def run(seconds, tokens, Ks=(0,)):
    return {"seconds": seconds, "tokens": tokens, "Ks": list(Ks), "accepted": 0, "examined": 0}


def test_a_side_that_differs_from_plain_decoding_is_an_error_that_says_where():
    reference = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    bad = [[1, 2, 3, 4, 5], [6, 7, 8, 0, 10]]
    cell = batching_report.summarise_cell({"plain": [run(1.0, reference)], 2: [run(0.5, bad, [2, 2])],
                                           "auto": [run(0.8, reference, [1])]}, reference, 2, 0.5)
    assert not cell["exact"] and cell["mismatched"] == {"K=2": "1 of 2 sequences differ (first: sequence 1 at "
                                                                "token 3 of 5)"}
    section = {"pairs": [{"draft": "a", "target": "b", "cells": [cell]}]}
    with pytest.raises(SystemExit, match="1 side"):
        batching_report.exit_on_mismatch(section)
    cell["mismatched"] = {}
    batching_report.exit_on_mismatch(section)  # nothing to say: no exit


def test_best_and_paired_ratios():
    reference = [[1, 2]]
    runs = {"plain": [run(1.0, reference), run(2.0, reference)], 1: [run(0.5, reference), run(1.5, reference)],
            "auto": [run(0.6, reference), run(1.5, reference)]}
    cell = batching_report.summarise_cell(runs, reference, 1, 0.8)
    assert cell["best"] == "K=1" and cell["drafting_pays"]
    assert cell["best_over_plain"] == pytest.approx(np.median([2.0, 2.0 / 1.5]))      # per repeat, then median
    assert cell["auto_over_best"] == pytest.approx(np.median([0.5 / 0.6, 1.0]))
    assert cell["auto_over_best_runs"] == pytest.approx([0.5 / 0.6, 1.0])  # in repeat order (the range's)
    assert cell["sides"]["plain"]["tokens_per_s"] == pytest.approx(np.median([2.0, 1.0]))


def cells(pays, alpha=0.5, sizes=(1, 2, 4, 8)):
    return [{"B": B, "alpha": alpha, "drafting_pays": p, "best": "K=2" if p else "plain", "best_over_plain": 1.2}
            for B, p in zip(sizes, pays)]


def test_the_switched_off_goal_is_for_the_largest_batch_where_no_fixed_K_beats_plain():
    """SWITCHED_OFF_GOAL (auto / plain) where drafting cannot pay: the largest B's cells where plain decoding is
    the best side, near ties included; drafting_over_plain is the best fixed K's paired ratio, printed beside."""
    reference = [[1, 2]]

    def cell(B, alpha, K1, K2):  # per repeat: plain 1 s; K = 1 and K = 2 at K1 and K2 of its tokens/s
        runs = {"plain": [run(1.0, reference)] * 3, 1: [run(1 / K1, reference)] * 3, 2: [run(1 / K2, reference)] * 3,
                "auto": [run(1.0, reference)] * 3}
        return batching_report.summarise_cell(runs, reference, B, alpha)
    cells_ = [cell(8, 0.5, 0.90, 0.80), cell(8, 0.8, 0.97, 0.90), cell(8, 0.9, 1.1, 1.2), cell(2, 0.5, 0.85, 0.7)]
    assert [c["drafting_over_plain"] for c in cells_] == pytest.approx([0.90, 0.97, 1.2, 0.85])
    assert [(c["B"], c["alpha"]) for c in batching_report.switched_off_cells(cells_)] == [(8, 0.5), (8, 0.8)]
    section = {"pairs": [{"draft": "a", "target": "b", "cells": cells_}]}
    rows = [t["target"] for t in batching_report.targets(section)]
    assert len(rows) == 6 and rows[-1] == "batch a->b B=8 a=0.8, drafting cannot pay: auto / plain", rows


@pytest.mark.parametrize("pays, stop", [((True, True, False, False), 4), ((True,) * 4, None),
                                        ((False,) * 4, 1), ((True, False, True, False), 8)])
def test_where_drafting_stops_paying(pays, stop):
    row = cells(pays)
    assert batching_report.stops_paying(row) == stop
    line = batching_report.crossover_line(row)
    assert line.startswith("alpha 0.5: ") and (stop is None) == ("every B measured" in line)
    if stop not in (None, 1):
        assert line.endswith(f"stops paying from B = {stop}") and "1.20x with K=2 at B = 1" in line


def test_which_side_goes_first_alternates_from_repeat_to_repeat(monkeypatch):
    order, reference = [], [[1, 2, 3]]

    def fake_side(side, target, draft_model, prompts, sequences, plan, alpha, seed):
        order.append((seed, side))
        assert sequences == [[7, 8, 1, 2, 3]]  # the forced draft knows prompt + plain decoding's tokens
        return run(1.0, reference)

    monkeypatch.setattr(batching, "run_side", fake_side)
    plan = batching.BatchPlan(Ks=(1, 4), repeats=3)
    batching.measure_cell(None, None, [[7, 8]], reference, plan, 0.5)
    sides = ["plain", 1, 4, "auto"]
    assert order == [(0, s) for s in sides] + [(1, s) for s in sides[::-1]] + [(2, s) for s in sides], order


def test_in_lockstep_every_side_runs_at_once_and_still_matches_plain_decoding():
    """--batch-lockstep on the tiny pair: each repeat's sides decode together (common.lockstep), every
    side exact, and each side's record what the back-to-back run gives: its K usage, its acceptance."""
    plan = batching.check_plan(batching.BatchPlan(pairs=(("tiny", "tiny2"),), batch_sizes=(3,), alphas=(1.0,),
                                                  Ks=(2,), n_tokens=8, prompt_len=4, repeats=2, lockstep=True,
                                                  tiny=True, configs=dict(batching.TINY_CONFIGS)))
    (pair,) = batching.run(plan)["pairs"]
    (cell,) = pair["cells"]
    assert cell["exact"] and list(cell["sides"]) == ["plain", "K=2", "auto"], cell
    # alpha 1, 8 tokens: rounds of K = 2, 2, then 1 (clamped to the 2 tokens left), twice
    assert cell["sides"]["K=2"]["alpha_hat"] == 1.0 and cell["sides"]["K=2"]["K_counts"] == {1: 2, 2: 4}, cell
    assert cell["sides"]["plain"]["K_counts"] == {0: 2}  # one entry a run, as back to back
    assert sum(cell["sides"]["auto"]["K_counts"].values()) >= 2 * 3  # 8 tokens: 3 rounds at the least, 2 runs


def test_the_batch_lockstep_flag_reaches_the_plan():
    """Lockstep is the default (since 2026-11-28); --no-batch-lockstep runs the sides back to back."""
    assert batching.plan_from_args(parse_args(["--batch-lockstep"])).lockstep
    assert batching.plan_from_args(parse_args([])).lockstep
    assert not batching.plan_from_args(parse_args(["--no-batch-lockstep"])).lockstep


def test_the_policy_lockstep_flag_reaches_the_plan():
    """The K-policy sweep's groups run in lockstep by default; --no-policy-lockstep between two baselines."""
    from bench.__main__ import make_plan
    assert make_plan(parse_args([])).policy_lockstep
    assert not make_plan(parse_args(["--no-policy-lockstep"])).policy_lockstep
