"""Section "trees", the numbers: the rates used, the predictions, a cell's summary, the targets, the tables.

Pure functions of what trees.py measured (each side's runs: seconds, tokens, target calls), so tests
can feed them made-up runs. A side is "plain", a chain "K=k", a fixed tree "(3,2,1)" or "auto".

Rates. PROFILES holds acceptance by sibling rank measured on real pairs (python -m bench.trees
prints them; the docs note records the numbers): per rank r, the pooled rate
a_r = accepted / tried over every depth, and RATIOS[r] = a_r / a_0. The bench scales a profile
to each alpha of the table: rates[d][r] = min(1, alpha * RATIOS[r]) at every depth d, so rank 0 is
accepted with probability alpha (the chain's alpha, i.i.d. as forced_draft.py's) and each later
sibling in the measured proportion to it.

Predictions (tree_shape.py, the model AutoTree plans with): tokens per target call =
expected_tokens(widths, rates); speedup over plain decoding = tree_speedup(widths, rates, c, v)
with this run's c (a one-token draft call over a one-token target call) and v(M) (an M-token
target call over a one-token one), measured after the prompt before the cell's runs; auto: the
shape best_shape picks among AutoTree's candidates at the true rates, and its numbers (the
targets hold auto's measurement to simulated_auto, its learning included: targets). Every
"/best chain" ratio is against the best chain of the table (measured: the best median tokens/s;
tokens/s ratios paired run by run, tokens per call as medians; predicted: the chain with the best
predicted speedup).
"""
import statistics

import numpy as np

from gpt2np.decoding.tree_policy import AutoTree
from gpt2np.decoding.tree_shape import best_shape, candidate_shapes, expected_tokens, tree_size, tree_speedup  # noqa: F401 (candidate_shapes: shape_bound's doctest)
from gpt2np.teach.tree_simulation import FixedShape, simulate_tree_policy

from .common import log, print_table

PROFILES = {  # name -> (where it was measured, a_r / a_0 per rank r, pooled over depths): python -m bench.trees
    "bundled-t0": ("shakespeare-260K -> shakespeare-2.6M, temperature 0, tree (4,3,2,2), 8 x 120 tokens; "
                   "rank 0 accepted 585/811", (1.0, 0.662, 0.786, 0.308)),
    "bundled-t0.8": ("shakespeare-260K -> shakespeare-2.6M, temperature 0.8, tree (4,3,2,2), 8 x 120 tokens; "
                     "rank 0 accepted 628/809", (1.0, 0.576, 0.386, 0.271)),
    "fixtures-t0": ("gpt2-tiny-a -> gpt2-tiny-b, temperature 0, tree (4,3,2), 40 x 20 tokens; "
                    "rank 0 accepted 54/759", (1.0, 0.538, 0.36, 0.418)),
    "fixtures-t0.8": ("gpt2-tiny-a -> gpt2-tiny-b, temperature 0.8, tree (4,3,2), 40 x 20 tokens; "
                      "rank 0 accepted 549/605", (1.0, 0.394, 0.192, 0.276)),
}
DEFAULT_PROFILE = "bundled-t0"
AUTO_GOAL = 0.97      # auto / best chain, measured, every alpha
PAYS = 1.05           # a tree predicted to beat the best chain by this much ...
CONFIRM_GOAL = 0.97   # ... must measure at least this fraction of its predicted ratio
SIMULATED_SEEDS = 100  # coin seeds of auto's simulated ratio to the best chain, its learning included (simulated_auto)


def scaled_rates(alpha, ratios, depth):  # -> rates[d][r] for d < depth (module docstring)
    return tuple(tuple(min(1.0, alpha * ratio) for ratio in ratios) for _ in range(depth))


def label(shape):
    if shape in ("plain", "auto"):
        return shape
    if max(shape) == 1:
        return f"K={len(shape)}"
    return "(" + ",".join(map(str, shape)) + ")"


def is_chain(name):
    return name.startswith("K=")


def predictions(shapes, rates, c, v, auto_shapes):
    """{side: {"shape", "tokens_per_call", "speedup"}} predicted, for plain, every shape and auto."""
    out = {"plain": {"shape": None, "tokens_per_call": 1.0, "speedup": 1.0}}
    for shape in shapes:
        if shape != "auto":
            out[label(shape)] = {"shape": list(shape), "tokens_per_call": expected_tokens(shape, rates),
                                 "speedup": tree_speedup(shape, rates, c, v)}
    if "auto" in shapes:
        best, speedup = best_shape(rates, c, v, auto_shapes)
        out["auto"] = {"shape": list(best), "tokens_per_call": expected_tokens(best, rates), "speedup": speedup}
    return out


def shape_bound(rates, c, v, shapes):
    """The best chain and the best of `shapes` (chains included) by tree_speedup with o = 0, and the
    most tokens per call: what any shape could give a target of this c and v(M), at these rates.

    o = 0 leaves out every round's work besides the two models' calls (a tree's is larger: a softmax
    row of q and of p per node, the kernel's tries), and a level's draft call costs c whatever its
    rows: both in trees' favour, so a measured tree / chain ratio lies at or under `ratio`.

    >>> flat = {M: 1.0 for M in range(1, 17)}  # rows free: a second child that passes half the time pays
    >>> bound = shape_bound([[0.5, 0.5]] * 2, 0.1, flat, candidate_shapes(2, 2, 6))
    >>> bound["chain"], bound["shape"], round(bound["ratio"], 3)  # (1 + 0.75 + 0.5625) / (1 + 0.5 + 0.25)
    ((1, 1), (2, 2), 1.321)
    """
    chains = [w for w in shapes if max(w) == 1]
    chain, chain_speedup = best_shape(rates, c, v, chains)
    shape, speedup = best_shape(rates, c, v, shapes)
    most = max(shapes, key=lambda w: (expected_tokens(w, rates), -tree_size(w)))  # the most tokens per call
    return {"chain": chain, "chain_speedup": chain_speedup, "shape": shape, "speedup": speedup,
            "ratio": speedup / chain_speedup, "most_tokens": most,
            "most_tokens_per_call": expected_tokens(most, rates) / expected_tokens(chain, rates),
            "most_tokens_speedup": tree_speedup(most, rates, c, v) / chain_speedup}


def mismatch(tokens, reference):  # -> None, or where the run's tokens leave the baseline's
    if list(tokens) == list(reference):
        return None
    at = next((i for i, (x, y) in enumerate(zip(tokens, reference)) if x != y), min(len(tokens), len(reference)))
    return f"differs from the target's greedy baseline at token {at} of {len(reference)}"


def side_summary(runs, reference):
    """One side's repeats: median tokens/s and tokens per target call, per-repeat rates, shapes used."""
    rates = [len(r["tokens"]) / r["seconds"] for r in runs]
    errors = [e for e in (mismatch(r["tokens"], reference) for r in runs) if e]
    shapes = {}
    for r in runs:
        for shape, n in r.get("shapes_used", {}).items():
            name = "plain" if shape == "plain" else label(tuple(shape))
            shapes[name] = shapes.get(name, 0) + n
    return {"tokens_per_s": statistics.median(rates), "runs_tokens_per_s": rates,
            "tokens_per_call": statistics.median(len(r["tokens"]) / r["target_calls"] for r in runs),
            "runs_target_calls": [r["target_calls"] for r in runs],
            "seconds": [r["seconds"] for r in runs], "shapes_used": shapes, "by_rank": runs[0].get("by_rank"),
            "exact": not errors, "mismatch": errors[0] if errors else None}


def paired(sides, num, den):  # median over repeats of num's tokens/s / den's, the same repeat's
    return statistics.median(a / b for a, b in zip(sides[num]["runs_tokens_per_s"], sides[den]["runs_tokens_per_s"]))


def summarise_cell(runs, reference, alpha, rates, predicted):
    """{side: runs} of one alpha -> its rows, measured beside predicted, each against the best chain."""
    sides = {name: side_summary(rs, reference) for name, rs in runs.items()}
    chains = [name for name in sides if is_chain(name)]
    best = max(chains, key=lambda k: sides[k]["tokens_per_s"])
    best_predicted = max(chains, key=lambda k: predicted[k]["speedup"])
    rows = []
    for name, side in sides.items():
        p = predicted[name]
        rows.append({"side": name, "shape": p["shape"], **side,
                     "speedup": paired(sides, name, "plain"), "over_best_chain": paired(sides, name, best),
                     "predicted_tokens_per_call": p["tokens_per_call"], "predicted_speedup": p["speedup"],
                     "predicted_over_best_chain": p["speedup"] / predicted[best_predicted]["speedup"],
                     "tokens_per_call_over_best_chain": side["tokens_per_call"] / sides[best]["tokens_per_call"],
                     "predicted_tokens_per_call_over_best_chain":
                         p["tokens_per_call"] / predicted[best_predicted]["tokens_per_call"]})
    mismatched = {r["side"]: r["mismatch"] for r in rows if not r["exact"]}
    for name, text in mismatched.items():
        log(f"ERROR: trees alpha {alpha}, side {name}: {text}")
    return {"alpha": alpha, "rates": [list(row) for row in rates[:1]], "best_chain": best,
            "best_chain_predicted": best_predicted, "rows": rows, "exact": not mismatched, "mismatched": mismatched}


def simulated_auto(alpha, ratios, c, v, n_tokens, prompt_len, n_layer, chain, repeats, K_max, seeds=SIMULATED_SEEDS):
    """auto over the chain of `chain` drafts as teach/tree_simulation.py plays them with this run's rates, c
    and v (and the cost shape a target of n_layer blocks reads in the run's budget): AutoTree learning the
    rates and the curve from its own rounds, as in the run. The predicted
    columns are auto's shape at the true rates, known from the start; this is what the learning leaves of
    it. Per seed, the ratio of the two speedups on that seed's coins (seed s: the coins of repeat s);
    {"seeds": the median over `seeds` seeds, "this_run": over the run's repeats, "per_repeat": theirs}."""
    def speedup(policy, seed):
        return simulate_tree_policy(policy, alpha, c, v, n_tokens, seed, ratios, prompt_len=prompt_len,
                                    n_layer=n_layer)["speedup"]
    by_seed = [speedup(AutoTree(K_max), s) / speedup(FixedShape((1,) * chain), s) for s in range(max(seeds, repeats))]
    return {"seeds": statistics.median(by_seed[:seeds]), "n_seeds": seeds,
            "this_run": statistics.median(by_seed[:repeats]), "per_repeat": by_seed[:repeats]}


def is_tree(shape):  # widths per depth -> whether some node has more than one child (a chain's are all 1)
    return bool(shape) and max(shape) > 1


def targets(section):
    """Issue 28's goals for this table, per alpha: auto >= 0.97 x the best chain (measured); and
    wherever a prediction says a tree beats the best chain by >= 5 %, the measured ratio is at least
    0.97 x the predicted one. A fixed tree's prediction is tree_shape's at the rates used. auto's is
    what it gets with its learning (simulated_auto, over SIMULATED_SEEDS coin seeds): it plays the
    rounds it learns from, not its shape at the true rates from the first round, which the table's
    pred columns show (at 1558M and 48 tokens that shape's gain came out 0.90-0.92 of itself where the
    simulated learning read within 0.01-0.03 of the measurement). And only where that shape is a tree:
    a longer chain than the table's, ahead of its best chain, says nothing about trees."""
    out = []
    for cell in section["cells"]:
        for row in cell["rows"]:
            name = f"{section['draft']}->{section['target']} a={cell['alpha']} {row['side']}"
            if row["side"] == "auto":
                out.append([f"{name} / best chain ({cell['best_chain']}), measured", row["over_best_chain"],
                            f">= {AUTO_GOAL}"])
                predicted = cell.get("auto_simulated", {}).get("seeds")
                if predicted is not None and is_tree(row["shape"]) and predicted >= PAYS:
                    out.append([f"{name}: measured / predicted gain over the best chain, its learning included "
                                f"(predicted {predicted:.3f}; its shape {label(tuple(row['shape']))} at the true "
                                f"rates: {row['predicted_over_best_chain']:.3f})",
                                row["over_best_chain"] / predicted, f">= {CONFIRM_GOAL}"])
            elif row["side"] != "plain" and is_tree(row["shape"]) and row["predicted_over_best_chain"] >= PAYS:
                out.append([f"{name}: measured / predicted gain over the best chain (predicted "
                            f"{row['predicted_over_best_chain']:.3f})",
                            row["over_best_chain"] / row["predicted_over_best_chain"], f">= {CONFIRM_GOAL}"])
    return [{"target": t, "measured": m, "goal": g, "met": m >= float(g.split()[-1])} for t, m, g in out]


def table_row(r):  # one side's row of print_report's table, measured beside predicted
    name = r["side"] + (f" (pred. {label(tuple(r['shape']))})" if r["side"] == "auto" else "")
    return [name, tree_size(tuple(r["shape"])) if r["shape"] else 0,
            r["tokens_per_call"], r["predicted_tokens_per_call"],
            r["tokens_per_call_over_best_chain"], r["predicted_tokens_per_call_over_best_chain"],
            r["tokens_per_s"], r["speedup"], r["predicted_speedup"],
            r["over_best_chain"], r["predicted_over_best_chain"], r["exact"]]


def print_report(section):
    d, t = section["draft"], section["target"]
    v = section["costs"]["v"]
    print(f"\n# Token trees, {d} (forced tree drafter) -> {t}, {section['n_tokens']} tokens after "
          f"{section['prompt_len']}, {section['repeats']} repeats"
          f"{', the sides in lockstep' if section['plan'].get('lockstep') else ', back to back'}; "
          f"BLAS: {section['blas_kernel']}")
    print(f"rates: profile {section['profile']} ({section['profile_source']}), rank ratios "
          f"{section['ratios']}, rank 0 = alpha at every depth")
    print(f"costs: c = {section['costs']['c']:.3f}; v(M) = " + ", ".join(f"{M}: {x:.2f}" for M, x in v.items()))
    headers = ["side", "nodes", "tok/call", "pred", "/best chain", "pred", "tok/s", "x plain", "pred", "/best chain",
               "pred", "exact"]
    for cell in section["cells"]:
        rows = [table_row(r) for r in cell["rows"]]
        auto = next((r for r in cell["rows"] if r["side"] == "auto"), None)
        used = ", ".join(f"{s}: {n}" for s, n in auto["shapes_used"].items()) if auto else None
        sim = cell.get("auto_simulated")
        print_table(f"alpha {cell['alpha']}: rates by rank {[round(a, 3) for a in cell['rates'][0]]}", headers, rows,
                    note=f"best chain: {cell['best_chain']} measured, {cell['best_chain_predicted']} predicted"
                         + (f"; auto's rounds by shape: {used}" if used else "")
                         + (f"\nauto / best chain simulated, its learning included (teach/tree_simulation.py, this "
                            f"run's c and v): {sim['seeds']:.3f} over {sim['n_seeds']} coin seeds, "
                            f"{sim['this_run']:.3f} on this run's {len(sim['per_repeat'])} (measured "
                            f"{auto['over_best_chain']:.3f})" if sim else "")
                         + ("" if cell["exact"] else f"\n!!! ERROR: not the baseline: {cell['mismatched']}"))
    if section["targets"]:
        print_table("Token-tree targets (this run)", ["target", "measured", "goal", "met"],
                    [[x["target"], x["measured"], x["goal"], x["met"]] for x in section["targets"]])


def exit_on_mismatch(section):
    """python -m bench's last step: a non-zero exit, after the JSON is written, if any run left the baseline."""
    bad = [(c["alpha"], side) for c in (section or {}).get("cells", []) for side in c["mismatched"]]
    if bad:
        raise SystemExit(f"trees: {len(bad)} side(s) differ from the target's greedy baseline: {bad}")


# ---- the profiles: acceptance by depth and rank on real pairs (python -m bench.trees) -------------

BUNDLED_TEXTS = ("ROMEO:\nWhat light through yonder window breaks?\n", "JULIET:\nO Romeo, Romeo!\n",
                 "HAMLET:\nTo be, or not to be: that is the question:\n", "KING HENRY V:\nOnce more unto the breach,\n",
                 "MACBETH:\nIs this a dagger which I see before me,\n",
                 "PORTIA:\nThe quality of mercy is not strain'd,\n",
                 "JAQUES:\nAll the world's a stage,\n", "MARK ANTONY:\nFriends, Romans, countrymen,\n")


def count_by_rank(target, draft, prompts, n_tokens, widths, temperature, seed=0):
    """{(depth, rank): [tried, accepted]} summed over one speculative run per prompt (stats.by_rank)."""
    from gpt2np import speculative_generate
    counts = {}
    for i, prompt in enumerate(prompts):
        rng = np.random.default_rng([seed, i]) if temperature else None
        result = speculative_generate(target, draft, prompt, n_tokens, temperature=temperature, rng=rng, tree=widths)
        for d, row in enumerate(result.stats.by_rank):
            for r, (tried, accepted) in enumerate(row):
                count = counts.setdefault((d, r), [0, 0])
                count[0], count[1] = count[0] + tried, count[1] + accepted
    return counts


def pooled_ratios(counts):  # -> ([(tried, accepted)] per rank over every depth, [a_r / a_0] per rank)
    ranks = 1 + max(r for _, r in counts)
    pooled = [[sum(c[i] for (_, rr), c in counts.items() if rr == r) for i in (0, 1)] for r in range(ranks)]
    a0 = pooled[0][1] / pooled[0][0]
    return pooled, [round(accepted / tried / a0, 3) if tried else None for tried, accepted in pooled]


def print_profile(name, counts):
    print(f"\n{name}: accepted / tried (rate) by depth and sibling rank")
    for d in range(1 + max(d for d, _ in counts)):
        cells = [f"r{r}: {a}/{t} ({a / t:.3f})" if t else f"r{r}: -" for (dd, r), (t, a) in sorted(counts.items())
                 if dd == d]
        print(f"  depth {d + 1}  " + "  ".join(cells))
    pooled, ratios = pooled_ratios(counts)
    print("  pooled   " + "  ".join(f"r{r}: {a}/{t} ({a / t:.3f})" if t else f"r{r}: -"
                                    for r, (t, a) in enumerate(pooled)))
    print(f"  ratios to rank 0: {ratios}")


def measure_profiles(fixtures_dir):
    """Prints the profiles: the bundled pair with tree (4,3,2,2), 120 tokens after each of 8 lines, and
    the fixtures (gpt2-tiny-a -> gpt2-tiny-b) with tree (4,3,2), 20 tokens after 40 random 10-token
    prompts (n_ctx 64), each at temperature 0 and 0.8. Returns the bundled pair's counts by temperature."""
    import shutil
    import tempfile
    from pathlib import Path

    import gpt2np
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    prompts = [target.tokenizer.encode(text) for text in BUNDLED_TEXTS]
    bundled = {T: count_by_rank(target, draft, prompts, 120, (4, 3, 2, 2), T) for T in (0, 0.8)}
    for T, counts in bundled.items():
        print_profile(f"bundled, temperature {T}", counts)
    if not (Path(fixtures_dir) / "gpt2-tiny-b" / "encoder.json").is_file():
        print(f"\nfixtures skipped: no {fixtures_dir}/gpt2-tiny-a, gpt2-tiny-b with their encoder.json")
        return bundled
    with tempfile.TemporaryDirectory() as tmp:  # a copy: loading writes a cache beside the checkpoint
        models = []
        for name in ("gpt2-tiny-b", "gpt2-tiny-a"):
            shutil.copytree(Path(fixtures_dir) / name, Path(tmp) / name)
            models.append(gpt2np.load_model(str(Path(tmp) / name)))
        prompts = [np.random.default_rng(i).integers(0, models[0].n_vocab, 10).tolist() for i in range(40)]
        for T in (0, 0.8):
            print_profile(f"fixtures, temperature {T}", count_by_rank(*models, prompts, 20, (4, 3, 2), T))
    return bundled
