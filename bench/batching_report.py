"""Section "batching", the numbers: a cell's summary, where drafting stops paying, targets, tables.

Pure functions of what batching.py measured (runs of each side: seconds, tokens, K per round), so
tests can feed them made-up runs. Names: a side is "plain", "K=k" or "auto"; `best` is the fastest
of plain and the fixed Ks by median tokens/s ("the better of with and without drafting"); ratios
between two sides are per repeat (timed side by side), then the median.
"""
import statistics
from collections import Counter

from .common import log, print_table

AUTO_GOAL = 0.95       # auto / best, every cell
SWITCHED_OFF_GOAL = 0.98  # auto / plain where drafting cannot pay on the largest batch (switched_off_cells)


def label(side):
    return side if isinstance(side, str) else f"K={side}"


def mismatch(tokens, reference):  # -> None, or how far the run's tokens are from plain decoding's
    """'2 of 4 sequences differ (first: sequence 1 at token 17 of 32)' or None if all are equal."""
    bad = [i for i, (t, r) in enumerate(zip(tokens, reference)) if list(t) != list(r)]
    if not bad and len(tokens) == len(reference):
        return None
    if not bad:
        return f"{len(tokens)} sequences returned, {len(reference)} expected"
    t, r = list(tokens[bad[0]]), list(reference[bad[0]])
    at = next((j for j, (x, y) in enumerate(zip(t, r)) if x != y), min(len(t), len(r)))
    return f"{len(bad)} of {len(reference)} sequences differ (first: sequence {bad[0]} at token {at} of {len(r)})"


def side_summary(runs, reference):
    """One side's repeats: median tokens/s (all new tokens / wall seconds), per-repeat rates, K:rounds
    summed over repeats, alpha_hat (accepted / examined drafts), and whether every run matched."""
    rates = [sum(len(t) for t in r["tokens"]) / r["seconds"] for r in runs]
    accepted, examined = sum(r["accepted"] for r in runs), sum(r["examined"] for r in runs)
    errors = [e for e in (mismatch(r["tokens"], reference) for r in runs) if e]
    return {"tokens_per_s": statistics.median(rates), "runs_tokens_per_s": rates,
            "seconds": [r["seconds"] for r in runs],
            "K_counts": dict(sorted(Counter(K for r in runs for K in r["Ks"]).items())),
            "accepted": accepted, "examined": examined, "alpha_hat": accepted / examined if examined else None,
            "exact": not errors, "mismatch": errors[0] if errors else None}


def per_repeat(sides, num, den):  # -> [num's tokens/s / den's], a ratio per repeat (the two timed side by side)
    return [a / b for a, b in zip(sides[num]["runs_tokens_per_s"], sides[den]["runs_tokens_per_s"])]


def paired(sides, num, den):  # median over repeats of num's tokens/s / den's, the same repeat's
    return statistics.median(per_repeat(sides, num, den))


def spread(ratios):  # -> "lowest-highest", 3 significant digits each: how far one repeat's ratio strays
    """The range of a cell's per-repeat ratios, so a median by a goal reads as settled or as a coin toss.

    >>> spread([0.9141, 1.0563, 0.975]), spread([0.95])
    ('0.914-1.06', '0.95-0.95')
    """
    return f"{min(ratios):.3g}-{max(ratios):.3g}"


def summarise_cell(runs, reference, B, alpha):
    """{side: runs} of one (B, alpha) cell -> its row: every side, the best, the paired ratios."""
    sides = {label(s): side_summary(rs, reference) for s, rs in runs.items()}
    best = max((k for k in sides if k != "auto"), key=lambda k: sides[k]["tokens_per_s"])
    fixed = [k for k in sides if k.startswith("K=")]
    examined = sum(s["examined"] for k, s in sides.items() if k.startswith("K="))
    accepted = sum(s["accepted"] for k, s in sides.items() if k.startswith("K="))
    mismatched = {k: s["mismatch"] for k, s in sides.items() if not s["exact"]}
    for k, text in mismatched.items():
        log(f"ERROR: batching B {B} alpha {alpha}, side {k}: tokens differ from plain decoding's: {text}")
    return {"B": B, "alpha": alpha, "sides": sides, "best": best, "best_tokens_per_s": sides[best]["tokens_per_s"],
            "drafting_pays": best != "plain", "best_over_plain": paired(sides, best, "plain"),
            "drafting_over_plain": max((paired(sides, k, "plain") for k in fixed), default=None),
            "auto_over_best": paired(sides, "auto", best), "auto_over_best_runs": per_repeat(sides, "auto", best),
            "auto_over_plain": paired(sides, "auto", "plain"),
            "alpha_hat": accepted / examined if examined else None, "exact": not mismatched,
            "mismatched": mismatched}


def by_alpha(cells):  # -> {alpha: cells in order of B}
    out = {}
    for c in sorted(cells, key=lambda c: c["B"]):
        out.setdefault(c["alpha"], []).append(c)
    return out


def stops_paying(row):  # cells of one alpha, by B -> the smallest B from which on plain is best, or None
    """None if drafting pays at the largest B; else the first B of the tail where plain is best."""
    stop = None
    for c in reversed(row):
        if c["drafting_pays"]:
            break
        stop = c["B"]
    return stop


def crossover_line(row):
    """One alpha's sentence: up to which B drafting pays (the best fixed K's gain) and where it stops."""
    stop = stops_paying(row)
    gains = ", ".join(f"{c['best_over_plain']:.2f}x with {c['best']} at B = {c['B']}"
                      for c in row if c["drafting_pays"] and (stop is None or c["B"] < stop))
    a = f"alpha {row[0]['alpha']}"
    if stop is None:
        return f"{a}: drafting pays at every B measured ({gains})"
    if stop == row[0]["B"]:
        return f"{a}: drafting never pays, plain decoding is the best side from B = {stop}"
    return f"{a}: drafting pays ({gains}) and stops paying from B = {stop}"


def crossover(pair):
    """The pair's JSON summary: per alpha, the B from which plain decoding is best (None: drafting pays
    at every B measured) and the sentence the report prints."""
    rows = by_alpha(pair["cells"]).values()
    return {"stops_paying": {str(row[0]["alpha"]): stops_paying(row) for row in rows},
            "crossover": [crossover_line(row) for row in rows]}


def switched_off_cells(cells):
    """The largest batch's cells where drafting cannot pay (no fixed K beats plain decoding), where the policy
    should switch drafting off and cost nothing (SWITCHED_OFF_GOAL). A near tie counts too (124M -> 1558M at
    B = 8, alpha 0.5: K = 1 reads 0.96 of plain decoding; a run of B = 2 alone): the line prints the best fixed
    K's ratio beside auto's, so a reader sees how near. (A threshold on that ratio would also drop 124M -> 355M
    at B = 8, alpha 0.8, where K = 1 reads 0.96 too and auto switches drafting off: the issue's own cell.)"""
    largest = max(c["B"] for c in cells)
    return [c for c in cells if c["B"] == largest and not c["drafting_pays"]]


def targets(section):
    """[{target, measured, goal, met}]: auto / best in every cell; auto / plain where drafting cannot
    pay on the largest batch (switched_off_cells: the policy should switch drafting off and cost nothing)."""
    rows = []
    for pair in section["pairs"]:
        name = f"{pair['draft']}->{pair['target']}"
        for c in pair["cells"]:
            rows.append((f"batch {name} B={c['B']} a={c['alpha']}: auto / best of plain and fixed K",
                         c["auto_over_best"], AUTO_GOAL))
        for c in switched_off_cells(pair["cells"]):
            rows.append((f"batch {name} B={c['B']} a={c['alpha']}, drafting cannot pay: auto / plain",
                         c["auto_over_plain"], SWITCHED_OFF_GOAL))
    return [{"target": t, "measured": m, "goal": f">= {g}", "met": m >= g} for t, m, g in rows]


def k_rounds(counts):
    return " ".join(f"{K}:{n}" for K, n in counts.items())


def rate(tokens_per_s):  # 3 significant digits, never in e-notation
    return f"{tokens_per_s:.3g}" if tokens_per_s < 100 else f"{tokens_per_s:.0f}"


def pair_rows(pair, Ks):
    plain_at_first = {a: row[0]["sides"]["plain"]["tokens_per_s"] for a, row in by_alpha(pair["cells"]).items()}
    return [[c["B"], c["alpha"], *[rate(c["sides"][k]["tokens_per_s"]) for k in ["plain", *Ks, "auto"]],
             rate(c["best_tokens_per_s"]), c["best"], c["best_over_plain"], c["auto_over_best"],
             spread(c["auto_over_best_runs"]), c["auto_over_plain"],
             c["sides"]["plain"]["tokens_per_s"] / plain_at_first[c["alpha"]], k_rounds(c["sides"]["auto"]["K_counts"]),
             c["alpha_hat"], c["exact"]] for c in pair["cells"]]


NOTE = ("tokens/s: the batch's new tokens / wall seconds of the side's own steps (prompt prefill included);\n"
        "plain: generate_batch; K=k: speculative_generate_batch, every sequence drafting k a round;\n"
        "auto: K='auto' (one K a round for the batch, 0 where drafting cannot pay); best: the fastest of\n"
        "plain and the fixed Ks; best/plain, auto/best, auto/plain: per-repeat ratios, median; auto/best\n"
        "range: the lowest repeat's and the highest (a median near the goal with a wide range wants more\n"
        "repeats); plain/B1: plain tokens/s over plain's at the smallest B (batching's own gain); auto\n"
        "K:rounds: rounds at each K over all repeats; a_hat: accepted / examined drafts of the fixed Ks;\n"
        "exact: every side's tokens equal plain decoding's")


def print_report(section):
    plan, Ks = section["plan"], [f"K={K}" for K in section["plan"]["Ks"]]
    for pair in section["pairs"]:
        print_table(f"Batched decoding, {pair['draft']} draft (forced acceptance) -> {pair['target']} target, random "
                    f"weights, greedy, {plan['n_tokens']} tokens a sequence after {plan['prompt_len']}: tokens/s, "
                    f"medians over {plan['repeats']} repeat(s)"
                    f"{', sides in lockstep' if plan.get('lockstep') else ', sides back to back'}; weights "
                    f"{pair['weights_order']}; BLAS: "
                    f"{section['blas_kernel']}",
                    ["B", "alpha", "plain", *Ks, "auto", "best", "best is", "best/plain", "auto/best",
                     "auto/best range", "auto/plain", "plain/B1", "auto K:rounds", "a_hat", "exact"],
                    pair_rows(pair, Ks), note=NOTE)
        print(f"where drafting stops paying, {pair['draft']} -> {pair['target']}:")
        for line in pair["crossover"]:
            print(f"  {line}")
        off = switched_off_cells(pair["cells"])
        for c in off:
            print(f"  auto where drafting cannot pay, B = {c['B']}, alpha {c['alpha']} (the best fixed K / plain "
                  f"{c['drafting_over_plain']:.3f}): auto / plain = {c['auto_over_plain']:.3f} (goal >= "
                  f"{SWITCHED_OFF_GOAL}), K:rounds {k_rounds(c['sides']['auto']['K_counts'])}")
        if not off:
            print(f"  (drafting pays at B = {max(c['B'] for c in pair['cells'])} at every alpha: no cell shows auto "
                  "with drafting switched off; add a larger --batch-sizes or a lower --batch-alphas)")
    if section["targets"]:
        print_table("Batching targets (this run)", ["target", "measured", "goal", "met"],
                    [[t["target"], t["measured"], t["goal"], t["met"]] for t in section["targets"]])
    for text in mismatches(section):
        print(f"!!! ERROR: {text}")


def mismatches(section):
    """One line per (pair, cell, side) whose tokens differ from plain decoding's."""
    return [f"{p['draft']}->{p['target']} B={c['B']} alpha={c['alpha']} {side}: {text}"
            for p in section["pairs"] for c in p["cells"] for side, text in c["mismatched"].items()]


def exit_on_mismatch(section):
    """A one-line SystemExit (non-zero) if any speculative side did not reproduce plain decoding."""
    bad = mismatches(section or {"pairs": []})
    if bad:
        raise SystemExit(f"batching: {len(bad)} side(s) whose tokens differ from plain decoding's, first: {bad[0]} "
                         "(their tokens/s compare different work)")
