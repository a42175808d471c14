"""Headline numbers of a benchmark JSON, and two of them side by side (before/after a change).

    python -m bench.compare bench/results/before.json bench/results/after.json

Only numbers present in both files are compared, so a run of one section compares with a full run.
Older files (prefill a single dict, verify a single curve) are read as results
at their one length / context, so their numbers line up with the same ones of a newer run.
Absolute times drift on a shared host; prefer ratios (x roofline, M=5/M=1, speedups), or run the
before and after back to back.
"""
import argparse
import json
import sys

from gpt2np.report import OneLineErrorParser

from .common import print_table
from .decode import hf_prefill, prefill_by_length, verify_by_context
from .spec import all_runs, long_prompt

LOWER_IS_BETTER = ("s_per_token", "seconds", "x_roofline", "verify_M", "overhead", "peak_over", "numpy_over_hf")


def headline(r):
    """{metric name: value} for the numbers a before/after comparison cares about."""
    h = {}
    if "bandwidth" in r:
        h["bandwidth best GB/s"] = r["bandwidth"]["best_gbps"]
        h["gemm GFLOP/s"] = r["bandwidth"]["gemm"]["gflops"]
        h["product verify_M5 ratio"] = r["bandwidth"]["small_m"]["ratio"].get("5")
        h["product verify_M5 ratio, gpt2np matmul"] = r["bandwidth"]["small_m"].get("pieces", {}).get("ratio", {}).get("5")
    for size, s in r.get("sizes", {}).items():
        for n, p in prefill_by_length(s).items():
            h[f"{size} prefill@{n} seconds"] = p["seconds"]
        for n, p in hf_prefill(s).items():
            h[f"{size} prefill@{n} numpy_over_hf"] = p.get("numpy_over_hf")
        for ctx, d in s.get("decode", {}).items():
            h[f"{size} decode@{ctx} s_per_token"] = d["s_per_token"]
            h[f"{size} decode@{ctx} x_roofline"] = d["vs_roofline"]
            h[f"{size} decode@{ctx} x_roofline_paired"] = d.get("vs_roofline_paired")
        for ctx, curve in verify_by_context(s).items():
            for m in ("2", "5", "9"):
                if m in curve.get("ratio", {}):
                    h[f"{size} verify_M{m}@{ctx} ratio"] = curve["ratio"][m]
        spec = s.get("speculative", {})
        for run in all_runs(spec):
            prompt = f" prompt {run['prompt_len']}" if long_prompt(spec, run) else ""
            name = f"{size} spec {run['draft']} a={run['alpha_nominal']}{prompt}"
            h[f"{name} speedup"] = run["speedup"]
            h[f"{name} refined prediction"] = run["predicted_refined"]
        if isinstance(s.get("hf"), dict) and "numpy_over_hf" in s["hf"]:
            h[f"{size} numpy_over_hf"] = s["hf"]["numpy_over_hf"]
    if "reference" in r:
        h["reference fast speedup"] = r["reference"]["speedup_vs_reference"]
    for size, v in r.get("overhead", {}).get("per_call", {}).get("estimated_s_per_call", {}).items():
        h[f"{size} python overhead s/call"] = v
    for size, entries in r.get("kernels", {}).get("sizes", {}).items():
        for e in entries:
            for m in ("2", "5", "9"):
                h[f"{size} {e['name']} verify_M{m}@{r['kernels']['context']} ratio"] = e["ratio"].get(m)
            h[f"{size} {e['name']} decode@{r['kernels']['context']} x_roofline"] = e["vs_roofline"]
    for load in ("first_load", "cached_load"):
        if load in r.get("memory", {}):
            h[f"memory {load} peak_over_weights"] = r["memory"][load]["peak_over_weights"]
            h[f"memory {load} seconds"] = r["memory"][load]["load_seconds_total"]
    return {k: v for k, v in h.items() if v is not None}


def better(name, old, new):
    lower = any(key in name for key in LOWER_IS_BETTER)
    if new == old:
        return "="
    return "better" if (new < old) == lower else "worse"


def print_comparison(old, new, old_name="old", new_name="new"):
    a, b = headline(old), headline(new)
    rows = [[k, a[k], b[k], b[k] / a[k] if a[k] else None, better(k, a[k], b[k])] for k in a if k in b]
    print_table(f"Comparison: {old_name} -> {new_name}", ["metric", "old", "new", "new/old", ""], rows,
                note=None if rows else "no metric in common")


def load_results(path, name):
    """A benchmark JSON read and checked (headline reads it), or a one-line SystemExit naming it as `name`."""
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except OSError as e:
        raise SystemExit(f"{name} {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError: a truncated or foreign file
        raise SystemExit(f"{name} {path}: not JSON ({e})") from None
    try:
        headline(results)
    except (AttributeError, KeyError, TypeError, IndexError, ValueError) as e:
        raise SystemExit(f"{name} {path}: not a python -m bench results file ({type(e).__name__}: {e})") from None
    return results


def main(argv=None):
    ap = OneLineErrorParser(prog="python -m bench.compare", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", metavar="OLD_JSON", help="the earlier run's JSON (python -m bench --json)")
    ap.add_argument("new", metavar="NEW_JSON", help="the later run's JSON")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        old, new = load_results(args.old, "OLD_JSON"), load_results(args.new, "NEW_JSON")
    except SystemExit as e:
        ap.error(e.code)
    print_comparison(old, new, args.old, args.new)


if __name__ == "__main__":
    main()
