"""Section "trees": the best chain, fixed token trees and tree="auto", predicted beside measured.

Issue 28's table: random --tree-pair DRAFT,TARGET models (default 124M,1558M), greedy, every run
--tree-tokens new tokens after the same 8-token random prompt. The draft is a
forced_tree_draft.ForcedTreeDrafter around the pair's draft model: the real draft's calls (one per
tree level, over that level's rows), its children forced so that acceptance by depth and sibling rank
is rates[d][r] = min(1, alpha * ratio_r): rank 0 is accepted with probability alpha at every depth,
later ranks in the proportion to rank 0 measured on a real pair (--tree-rates names the profile:
trees_report.PROFILES; `python -m bench.trees` measures them). The sides of each alpha:
  plain      gpt2np.generate on the target alone
  K=k        a chain of k drafts (the tree (1,) * k: ModelTreeDrafter drafts it in plain calls)
  (3,2,1)    a fixed tree: widths per depth
  auto       tree="auto": tree_policy.AutoTree picks each round's shape from the run's own counts
             and timings (forced_auto_tree: the forced drafter in the drafter auto_tree builds)
One repeat runs every side once on the coins of seed = the repeat (the same coins for every side
and alpha). By default (--tree-lockstep) a repeat's sides decode together, a round at a time, the side
furthest behind in tokens first (common.lockstep, as the policies and batching sections do): each
stretch of the output is decoded by every side within seconds of the others, so the machine's drift
(10-40 % within a minute at 1558M) slows them alike. That needs caches sized to the run (the loop's
since 2026-11-28): a dozen whole-context 1558M caches, 629 MB each and zeroed when first touched, made
the sides that stepped first late pay 1-2 s each on a VM (PERFORMANCE.md, "Token trees on panels").
--no-tree-lockstep runs the sides back to back, odd repeats in reverse order, so that a linear drift
cancels over two repeats. tokens/s = new tokens / the run's wall seconds (its rounds', prefill included);
tokens per target call = new tokens / target forward calls. Ratios (x plain, / best chain) are per
repeat, then the median. Every run's tokens must equal the target's greedy baseline; a mismatch is
printed as an error and makes python -m bench exit non-zero after the JSON is written.
Predictions (trees_report.py) use tree_shape's formulas with the rates used and c, v(M) measured
here, before the runs (measure_costs: plain forward calls of M tokens after the prompt, every M
timed COST_REPEATS times, interleaved, medians). auto's predicted columns are its shape at the true
rates; under each table, auto over the best chain as teach/tree_simulation.py plays it with these
costs, learning as the run does (trees_report.simulated_auto): over many coin seeds, and on this
run's own (seed s replays repeat s), so that a measured ratio reads against what its seeds' coins allow;
issue 28's confirmation target holds auto's measurement to the first (trees_report.targets).
"""
import argparse
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np

import gpt2np
from gpt2np.decoding.autoregressive import plain_stream
from gpt2np.decoding.speculative import speculative_stream
from gpt2np.decoding.tree_drafts import check_widths
from gpt2np.decoding.tree_policy import MAX_NODES, AutoTree
from gpt2np.decoding.tree_shape import tree_size
from gpt2np.model.config import PRESETS

from . import trees_report
from .common import TINY_CONFIGS, StreamSide, add_section, blas_limits, lockstep, log, median, numbers, random_ids
from .forced_draft import wanted_sequence  # the target's greedy token at each position: prompt, then baseline
from .forced_tree_draft import ForcedTreeDrafter, forced_auto_tree
from .trees_report import DEFAULT_PROFILE, PROFILES, label, predictions, scaled_rates, simulated_auto, summarise_cell

K_MAX = 8  # auto's bound, speculative_generate's default
COST_REPEATS = 5  # timings of every call size for c and v(M) (medians)
RANKS = 4  # sibling ranks the rates cover (AutoTree tries up to 4 children a node)
DEFAULT_SHAPES = "K=1-6;2,1;2,2,1;3,2,1;3,2,2,1;auto"
TINY_PAIR = {name: replace(TINY_CONFIGS[name], n_ctx=128) for name in ("tiny", "tiny2")}  # room for the trees
exit_on_mismatch = trees_report.exit_on_mismatch  # python -m bench's last step, after the JSON is written


@dataclass(frozen=True)
class TreePlan:
    """The knobs of the section; plan_from_args builds it from the --tree-* flags."""
    pair: tuple = ("124M", "1558M")        # (draft, target) sizes, random weights
    alphas: tuple = (0.3, 0.5, 0.8, 1.0)   # rank 0's forced acceptance rate
    shapes: tuple = ()                     # widths tuples and "auto" (parse_shapes(DEFAULT_SHAPES))
    n_tokens: int = 32                     # new tokens per run
    prompt_len: int = 8
    repeats: int = 2                       # repeats of every side (medians; order reversed on odd ones)
    lockstep: bool = True                  # a repeat's sides decode in lockstep (common.lockstep), not back to back
    profile: str = DEFAULT_PROFILE         # trees_report.PROFILES: the rank ratios measured on a real pair
    tiny: bool = False
    configs: dict = field(default_factory=lambda: dict(PRESETS), compare=False)

    def as_dict(self):
        return {"pair": list(self.pair), "alphas": list(self.alphas), "shapes": [label(s) for s in self.shapes],
                "n_tokens": self.n_tokens, "prompt_len": self.prompt_len, "repeats": self.repeats,
                "profile": self.profile, "K_max": K_MAX, "tiny": self.tiny, "lockstep": self.lockstep}


def add_arguments(ap):
    """The section's flags, on python -m bench's parser."""
    d = TreePlan()
    ap.add_argument("--tree-pair", default=",".join(d.pair), help="section trees: DRAFT,TARGET sizes (random weights)")
    ap.add_argument("--tree-alphas", default=",".join(map(str, d.alphas)),
                    help="section trees: rank 0's forced acceptance rates (later ranks: --tree-rates' ratios)")
    ap.add_argument("--tree-shapes", default=DEFAULT_SHAPES,
                    help="section trees: ';'-separated shapes: K=a-b (chains of a..b drafts), K=k, widths per "
                         "depth (3,2,1), auto; plain decoding is always measured")
    ap.add_argument("--tree-tokens", type=int, default=d.n_tokens, help="section trees: new tokens per run")
    ap.add_argument("--tree-repeats", type=int, default=d.repeats,
                    help="section trees: repeats of every side (medians; the sides' order reversed every other one)")
    ap.add_argument("--tree-lockstep", action=argparse.BooleanOptionalAction, default=d.lockstep,
                    help="section trees: a repeat's sides decode together, a round at a time, the side furthest "
                         "behind first (default: on; --no-tree-lockstep: back to back, odd repeats reversed)")
    ap.add_argument("--tree-rates", default=d.profile, choices=sorted(PROFILES),
                    help="section trees: the measured rank ratios the forced rates follow (trees_report.PROFILES)")


def parse_shapes(text):  # "K=1-3;2,1;auto" -> ((1,), (1, 1), (1, 1, 1), (2, 1), "auto"), or a one-line SystemExit
    shapes = []
    try:
        for item in (s.strip() for s in text.split(";") if s.strip()):
            if item == "auto":
                shapes.append("auto")
            elif item.startswith("K="):
                low, _, high = item[2:].partition("-")
                low, high = int(low), int(high or low)
                if not 1 <= low <= high:
                    raise ValueError(f"{item!r} names no chain: K=a-b needs 1 <= a <= b")
                shapes += [(1,) * K for K in range(low, high + 1)]
            else:
                shapes.append(check_widths([int(w) for w in item.strip("()").split(",")]))
    except ValueError as e:
        raise SystemExit(f"--tree-shapes: K=a-b, K=k, widths such as 3,2,1, or auto, separated by ';': {e}") from None
    shapes = tuple(dict.fromkeys(shapes))
    if not any(s != "auto" and max(s) == 1 for s in shapes):
        raise SystemExit(f"--tree-shapes needs at least one chain (K=k): the table is relative to the best one, "
                         f"got {text!r}")
    if any(s != "auto" and max(s) > RANKS for s in shapes):
        raise SystemExit(f"--tree-shapes: at most {RANKS} children a node (the measured rates cover {RANKS} ranks)")
    return shapes


def nodes_at_most(plan):  # the most nodes a round drafts: the largest fixed tree, or auto's bound
    return max(MAX_NODES if s == "auto" else tree_size(s) for s in plan.shapes)


def check_plan(plan):
    """One-line SystemExits for values the runs cannot take."""
    if len(plan.pair) != 2 or any(s not in plan.configs for s in plan.pair):
        raise SystemExit(f"--tree-pair: DRAFT,TARGET from {', '.join(plan.configs)}, got {','.join(plan.pair)!r}")
    if not all(0 <= a <= 1 for a in plan.alphas):
        raise SystemExit(f"--tree-alphas must lie in [0, 1], got {plan.alphas}")
    if plan.n_tokens < 2 or plan.repeats < 1:
        raise SystemExit("--tree-tokens must be >= 2, --tree-repeats >= 1")
    room = min(plan.configs[s].n_ctx for s in plan.pair)
    if plan.prompt_len + plan.n_tokens + nodes_at_most(plan) > room:
        raise SystemExit(f"--tree-tokens {plan.n_tokens} + the prompt ({plan.prompt_len}) + the largest tree "
                         f"({nodes_at_most(plan)} nodes) do not fit the context of {','.join(plan.pair)} ({room})")
    return plan


def plan_from_args(args):
    """TreePlan from the flags; --tiny: the tiny pair (n_ctx 128), 12 tokens after 4, at most 2 repeats."""
    configs = dict(TINY_PAIR) if args.tiny else dict(PRESETS)
    pair = ("tiny", "tiny2") if args.tiny else tuple(s.strip() for s in args.tree_pair.split(","))
    tiny = dict(n_tokens=12, prompt_len=4, repeats=min(args.tree_repeats, 2)) if args.tiny else {}
    kw = dict(pair=pair, alphas=numbers(args.tree_alphas, float, "--tree-alphas"),
              shapes=parse_shapes(args.tree_shapes), n_tokens=args.tree_tokens, repeats=args.tree_repeats,
              profile=args.tree_rates, lockstep=args.tree_lockstep, tiny=args.tiny, configs=configs)
    return check_plan(TreePlan(**{**kw, **tiny}))


# ---- measuring ------------------------------------------------------------------------------------

def timed_call(model, ids, cache, n_past):  # -> seconds of one forward call over ids, then rolled back
    start = time.perf_counter()
    model.forward(np.asarray(ids), cache, len(ids))  # logits for every row, as a verification call
    seconds = time.perf_counter() - start
    cache.truncate(n_past)
    return seconds


def measure_costs(target, draft, prompt, sizes, repeats):
    """t1 (a one-token target call), c (a one-token draft call / t1) and v(M) (an M-token target call
    with M rows of logits, as the loop's verification call, / t1) after the prompt; every size timed
    `repeats` times, sizes interleaved; medians. (A tree's forward_rows call of M rows costs what a
    plain M-token call costs: the same products; its mask is the only difference.)"""
    caches = target.new_cache(), draft.new_cache()
    target.forward(np.asarray(prompt), caches[0], 1)
    draft.forward(np.asarray(prompt), caches[1], 1)
    ids = random_ids(max(sizes), target.n_vocab, seed=5)
    times, draft_times = {M: [] for M in sizes}, []
    for _ in range(repeats):
        for M in sizes:
            times[M].append(timed_call(target, ids[:M], caches[0], len(prompt)))
        draft_times.append(timed_call(draft, ids[:1], caches[1], len(prompt)))
    t1 = median(times[1])
    return {"t1": t1, "c": median(draft_times) / t1, "v": {M: median(times[M]) / t1 for M in sizes}}


def open_side(side, target, draft, prompt, sequence, rates, plan, seed):
    """One run of one side ("plain", a widths tuple, "auto") as a StreamSide, not yet started; its
    record(seconds): {"seconds", "tokens", "target_calls"[, "shapes_used", "by_rank"]}."""
    N = plan.n_tokens
    if side == "plain":
        stream = plain_stream(target, prompt, N, temperature=0)
        return StreamSide(stream, lambda seconds: {"seconds": seconds, "tokens": stream.result,
                                                   "target_calls": len(stream.result)})
    if side == "auto":
        with forced_auto_tree(sequence, rates, seed) as made:  # the drafter is built as the stream opens
            stream = speculative_stream(target, draft, prompt, N, K_max=K_MAX, temperature=0, tree="auto")
        drafter = made[0]
    else:
        drafter = ForcedTreeDrafter(draft, sequence, rates, side, seed)
        stream = speculative_stream(target, drafter, prompt, N, K_max=K_MAX, temperature=0)

    def record(seconds):
        result = stream.result
        return {"seconds": seconds, "tokens": result.tokens, "target_calls": result.stats.target_calls,
                "shapes_used": drafter.shapes_used, "by_rank": result.stats.by_rank}
    return StreamSide(stream, record)


def run_sides(sides, target, draft, prompt, sequence, rates, plan, seed):
    """[record] of one run of every side on the coins of `seed`: in lockstep (plan.lockstep), else back to back."""
    opened = [open_side(side, target, draft, prompt, sequence, rates, plan, seed) for side in sides]
    seconds = lockstep(opened) if plan.lockstep else [lockstep([one])[0] for one in opened]
    return [one.record(s) for one, s in zip(opened, seconds)]


def measure_cell(target, draft, prompt, sequence, plan, alpha, costs):
    """Every side of one alpha, --tree-repeats times (back to back: order reversed on odd repeats)."""
    rates = scaled_rates(alpha, PROFILES[plan.profile][1], max(K_MAX, *(len(s) for s in plan.shapes if s != "auto")))
    sides = ["plain", *plan.shapes]
    runs = {label(side): [] for side in sides}
    for r in range(plan.repeats):
        order = sides if r % 2 == 0 else sides[::-1]
        for side, record in zip(order, run_sides(order, target, draft, prompt, sequence, rates, plan, seed=r)):
            runs[label(side)].append(record)
    predicted = predictions(plan.shapes, rates, costs["c"], costs["v"], AutoTree(K_MAX).shapes)
    cell = summarise_cell(runs, sequence[len(prompt):], alpha, rates, predicted)
    if "auto" in runs:  # what auto's learning leaves of its prediction, simulated on this run's costs and coins
        cell["auto_simulated"] = simulated_auto(alpha, PROFILES[plan.profile][1], costs["c"], costs["v"],
                                                plan.n_tokens, plan.prompt_len, target.config.n_layer,
                                                int(cell["best_chain"][2:]), plan.repeats, K_MAX)
    return cell


def run(plan, threads=None):
    """The section's results dict (module docstring; keys in bench/__init__.py); prints its tables."""
    limits = blas_limits(threads) or nullcontext()  # None: threadpoolctl missing, BLAS's own threads
    start = time.perf_counter()
    draft_size, target_size = plan.pair
    with limits:
        log(f"trees: building random {draft_size} (draft) and {target_size} (target) models")
        target = gpt2np.random_model(plan.configs[target_size], seed=0, tokenizer=None)
        draft = gpt2np.random_model(plan.configs[draft_size], seed=0, tokenizer=None)
        prompt = random_ids(plan.prompt_len, target.n_vocab, seed=3)
        sequence = wanted_sequence(target, prompt, gpt2np.generate(target, prompt, plan.n_tokens, temperature=0))
        sizes = sorted({*range(1, MAX_NODES + 2), *(1 + tree_size(s) for s in plan.shapes if s != "auto")})
        log(f"trees: timing target calls of M = {sizes[0]}..{sizes[-1]} tokens and the draft's one-token call")
        costs = measure_costs(target, draft, prompt, sizes, COST_REPEATS)
        cells = []
        for alpha in plan.alphas:
            log(f"trees {draft_size}->{target_size}: alpha {alpha}: {plan.repeats} x plain + {len(plan.shapes)} shapes")
            cells.append(measure_cell(target, draft, prompt, sequence, plan, alpha, costs))
    out = {"plan": plan.as_dict(), "draft": draft_size, "target": target_size, "n_tokens": plan.n_tokens,
           "prompt_len": plan.prompt_len, "repeats": plan.repeats, "blas_kernel": gpt2np.blas_kernel(),
           "profile": plan.profile, "profile_source": PROFILES[plan.profile][0],
           "ratios": list(PROFILES[plan.profile][1]), "costs": costs, "cells": cells,
           "seconds": time.perf_counter() - start}
    out["targets"] = trees_report.targets(out)
    trees_report.print_report(out)
    return out


def run_section(plan, results, threads=None):
    """python -m bench's hook: the section into results["trees"], its seconds into meta."""
    add_section(results, "trees", run(plan, threads))


# ---- the bundled pair's bound (python -m bench.trees) ------------------------------------------------

BOUND_SHAPES = (8, 4, 40)  # candidate_shapes' depth, width and nodes for the bound: past AutoTree's own (MAX_NODES)
BOUND_CONTEXT = 64         # the cached positions c and v(M) are timed at: the middle of the profiles' runs


def bundled_bound(counts, repeats=3 * COST_REPEATS, threads=1):
    """For the bundled pair (counts: {temperature: count_by_rank's counts}): c and v(M) of its 2.6M target,
    timed here with `threads` BLAS threads (main.py's default for it), and at each temperature the best
    chain, the best shape of any candidate and the shape with the most tokens per call, each at the
    pooled rate of every rank at every depth (trees_report.shape_bound: o = 0, in trees' favour).
    Prints them; returns {"kernel", "c", "v", "bounds": {temperature: shape_bound's dict}}."""
    from gpt2np.decoding.tree_shape import candidate_shapes
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    prompt = [t for text in trees_report.BUNDLED_TEXTS for t in target.tokenizer.encode(text)][:BOUND_CONTEXT]
    depth, width, nodes = BOUND_SHAPES
    with blas_limits(threads) or nullcontext():
        costs = measure_costs(target, draft, prompt, list(range(1, nodes + 2)), repeats)
        kernel = gpt2np.blas_kernel()
    out = {"kernel": kernel, "c": costs["c"], "v": costs["v"], "bounds": {}}
    print(f"\nbundled target's own costs ({kernel}; {threads} BLAS thread(s), {len(prompt)} positions cached): "
          f"c {costs['c']:.3f}, v(M) " + " ".join(f"{M}:{costs['v'][M]:.2f}" for M in (2, 4, 8, 12, 16, 24, 32, 41)))
    for T, count in counts.items():
        pooled, _ = trees_report.pooled_ratios(count)
        known = [accepted / tried for tried, accepted in pooled if tried]  # ranks tried at least once
        shapes = [w for w in candidate_shapes(depth, min(width, len(known)), nodes)]
        b = trees_report.shape_bound([known] * depth, costs["c"], costs["v"], shapes)
        out["bounds"][T] = b
        print(f"  temperature {T}: best chain {trees_report.label(b['chain'])} {b['chain_speedup']:.2f}x plain; "
              f"best shape {trees_report.label(b['shape'])} {b['speedup']:.2f}x, {b['ratio']:.3f} of the chain; "
              f"most tokens per call {trees_report.label(b['most_tokens'])}: {b['most_tokens_per_call']:.2f}x the "
              f"chain's, at {b['most_tokens_speedup']:.2f}x its speed (predicted, o = 0)")
    return out


def main(argv=None):
    """python -m bench.trees [FIXTURES_DIR]: trees_report.PROFILES' rate profiles, then the bundled pair's bound."""
    from pathlib import Path

    from gpt2np.report import OneLineErrorParser
    shared_fixtures = Path(__file__).resolve().parents[2] / "shared" / "fixtures"  # ../shared beside the repository
    ap = OneLineErrorParser(prog="python -m bench.trees",
                            description="Measures acceptance by depth and sibling rank (trees_report.PROFILES) on the "
                                        "bundled pair and on the test fixtures gpt2-tiny-a -> gpt2-tiny-b, then prices "
                                        "every tree shape on the bundled target's own costs at the bundled rates "
                                        "(bundled_bound). About half a minute.")
    ap.add_argument("fixtures", nargs="?", default=None, metavar="FIXTURES_DIR",
                    help="the folder holding gpt2-tiny-a and gpt2-tiny-b (default: shared/fixtures in the folder "
                         "above the repository; their profiles are skipped, in one line, where it lacks them)")
    args = ap.parse_args(argv)
    if args.fixtures is not None and not Path(args.fixtures).is_dir():
        ap.error(f"FIXTURES_DIR {args.fixtures}: "
                 f"{'not a folder' if Path(args.fixtures).exists() else 'no such folder'}")
    bundled_bound(trees_report.measure_profiles(shared_fixtures if args.fixtures is None else args.fixtures))


if __name__ == "__main__":
    main()
