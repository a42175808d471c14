"""python -m bench: parse the flags, run the sections, write the JSON (see bench/__init__.py)."""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gpt2np.model.config import PRESETS
from gpt2np.checkpoints.download import DownloadError
from gpt2np.checkpoints.loading import read_config, resolve_model_dir

from . import SECTIONS, batching, trees
from .common import full_plan, log, tiny_plan
from .compare import print_comparison
from .run import run

DEFAULT_JSON = Path(__file__).parent / "results" / "bench.json"
LONG_SECTIONS = {"batching", "trees"}  # left out of "all": name them


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # what to measure
    ap.add_argument("--sizes", default="124M,355M",
                    help="comma-separated model sizes (random weights), or model names as main.py takes them: a "
                         "folder in either layout or hf:owner/name (its real weights; downloaded if missing)")
    ap.add_argument("--pair", default="124M,355M", help="DRAFT,TARGET of the speculative section, from --sizes")
    ap.add_argument("--large", action="store_true", help="also 774M and 1558M (several more minutes)")
    ap.add_argument("--sections", default="all",
                    help=f"comma-separated subset of: {', '.join(SECTIONS)}; 'decode' adds 'bandwidth' "
                         "(the roofline needs it); 'all' leaves out batching and trees (long: name them)")
    ap.add_argument("--kernel-sizes", default="355M",
                    help="comma-separated sizes (or model names: their shape, random weights) of the kernels "
                         "section, which measures every OpenBLAS kernel this CPU runs, each in its own process")
    ap.add_argument("--kernel-rounds", type=int, default=1,
                    help="the kernels section's worker per kernel, kernel after kernel, this many times over "
                         "(~40 s a worker at 355M); medians over the rounds")
    ap.add_argument("--tiny", action="store_true", help="tiny configs, a few seconds: checks the suite runs, "
                                                          "its numbers mean nothing")
    # how
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement, after a warm-up "
                                                           "(speculative runs use min(repeats, 3))")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (threadpoolctl); default: BLAS's own")
    ap.add_argument("--K", type=int, default=4, help="draft tokens per speculative round")
    ap.add_argument("--alphas", default="0.5,0.8,1.0", help="forced acceptance rates of the benchmark drafter")
    ap.add_argument("--policy-repeats", type=int, default=1,
                    help="coin seeds of the K-policy sweep, one repeat each (20 runs per alpha; ~10 minutes at 355M)")
    ap.add_argument("--policy-runs", type=int, default=1,
                    help="runs per coin seed of the K-policy sweep, each between its own baselines: a seed's speedup "
                         "is their median (identical runs differ by up to 17 %% on a shared host)")
    ap.add_argument("--policy-lockstep", action=argparse.BooleanOptionalAction, default=True,
                    help="the K-policy sweep's runs of a group and plain decoding advance a round at a time, the run "
                         "furthest behind first, so the host's drift slows them alike (default: on; "
                         "--no-policy-lockstep: back to back between two baselines, the default before 2026-11-28)")
    ap.add_argument("--policy-fresh-probe", action="store_true",
                    help="every auto run of the K-policy sweep reads the target's cost shape before it starts, as "
                         "in a fresh process (default: the first does, and the model remembers it)")
    ap.add_argument("--policy-read", action="store_true",
                    help="one more side in every group of the K-policy sweep: auto reading the prompt's overlaps "
                         "before its first round (policies.READ_PROMPT set for it), beside auto as it is")
    ap.add_argument("--policy-prompt", type=int, default=0,
                    help="the K-policy sweep's prompt length in tokens (default: the speculative section's, 8; "
                         "17 or more give --policy-read all its 16 positions)")
    ap.add_argument("--policy-alphas", default="0.3,0.6,0.8,1.0", help="forced acceptance rates of the K-policy sweep")
    ap.add_argument("--policy-Ks", default="", help="fixed Ks of the K-policy sweep (default: 1..8)")
    ap.add_argument("--policy-tokens", type=int, default=100, help="tokens per run of the K-policy sweep")
    ap.add_argument("--policy-drafters", default="model,lookup",
                    help="the sweep's drafters: model (the pair's draft, forced acceptance), lookup (prompt lookup's cost), "
                         "self (the target drafting for itself: alpha 1, c ~ 1; once per repeat)")
    ap.add_argument("--spec-tokens", type=int, default=None,
                    help="tokens per speculative/baseline run; default 6 (K+1), so that alpha = 1 runs end on a "
                         "full round (a clamped last round would bias tokens per round low)")
    ap.add_argument("--spec-long-prompt", type=int, default=896,
                    help="prompt length of the forced-acceptance runs' second, long-prompt set (0: leave them out)")
    ap.add_argument("--reference-tokens", type=int, default=8,
                    help="steps the slow reference really runs (of 64; the rest is extrapolated)")
    batching.add_arguments(ap)
    trees.add_arguments(ap)
    # output
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    ap.add_argument("--compare", default=None, metavar="OLD_JSON", help="print headline numbers beside this older run")
    return ap.parse_args(argv)


def selected_sections(text):
    names = set(SECTIONS) - LONG_SECTIONS if text == "all" else {s.strip() for s in text.split(",") if s.strip()}
    unknown = names - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(sorted(unknown))}: choose from {', '.join(SECTIONS)}")
    if "decode" in names:
        names.add("bandwidth")
    return names


def make_plan(args):
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    if args.kernel_rounds < 1:
        raise SystemExit(f"--kernel-rounds must be >= 1, got {args.kernel_rounds}")
    if args.policy_repeats < 1:
        raise SystemExit(f"--policy-repeats must be >= 1, got {args.policy_repeats}")
    if args.policy_runs < 1:
        raise SystemExit(f"--policy-runs must be >= 1, got {args.policy_runs}")
    policy = policy_options(args)
    alphas = tuple(float(a) for a in args.alphas.split(","))
    if args.tiny:
        return tiny_plan(repeats=min(args.repeats, 2), alphas=alphas)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if args.large:
        sizes += [s for s in ("774M", "1558M") if s not in sizes]
    pair = tuple(s.strip() for s in args.pair.split(","))
    if len(pair) != 2:
        raise SystemExit(f"--pair must be DRAFT,TARGET, got {args.pair!r}")
    kernel_sizes = tuple(s.strip() for s in args.kernel_sizes.split(",") if s.strip())
    named = tuple(s for s in dict.fromkeys(sizes + list(pair) + list(kernel_sizes)) if s not in PRESETS)
    plan = full_plan(sizes, args.repeats, K=args.K, alphas=alphas, spec_tokens=args.spec_tokens or 6 * (args.K + 1),
                     policy_repeats=args.policy_repeats, policy_runs=args.policy_runs,
                     policy_lockstep=args.policy_lockstep, policy_fresh_probe=args.policy_fresh_probe,
                     policy_read=args.policy_read, policy_prompt_len=args.policy_prompt,
                     spec_long_prompt=args.spec_long_prompt,
                     reference_tokens=args.reference_tokens, pair=pair, named=named, kernel_sizes=kernel_sizes,
                     kernel_rounds=args.kernel_rounds, **policy,
                     configs={**PRESETS, **{name: named_config(name) for name in named}})
    return plan


def policy_options(args):
    """--policy-*: the K-policy sweep's alphas, fixed Ks, tokens and drafters (one-line errors)."""
    try:
        alphas = tuple(float(a) for a in args.policy_alphas.split(","))
        Ks = tuple(int(K) for K in args.policy_Ks.split(",") if K.strip())
    except ValueError as e:
        raise SystemExit(f"--policy-alphas / --policy-Ks: {e}") from None
    drafters = tuple(d.strip() for d in args.policy_drafters.split(",") if d.strip())
    if not all(0 <= a <= 1 for a in alphas) or not all(1 <= K <= 8 for K in Ks) or args.policy_tokens < 2:
        raise SystemExit("--policy-alphas must lie in [0, 1], --policy-Ks in 1..8, --policy-tokens >= 2")
    if not drafters or set(drafters) - {"model", "lookup", "self"}:
        raise SystemExit(f"--policy-drafters: model, lookup and/or self, got {args.policy_drafters!r}")
    if args.policy_prompt != 0 and args.policy_prompt < 3:
        raise SystemExit(f"--policy-prompt must be 0 (the default: 8 tokens) or >= 3, got {args.policy_prompt}")
    return dict(policy_alphas=alphas, policy_Ks=Ks, policy_tokens=args.policy_tokens, policy_drafters=drafters)


def named_config(name):
    """The shape of a model named as main.py names one (folder, bundled name, hf:owner/name)."""
    try:
        return read_config(resolve_model_dir(name))
    except (ValueError, OSError, DownloadError) as e:
        raise SystemExit(f"--sizes/--pair {name!r}: {e}; use a size ({', '.join(PRESETS)}) or a model name") from None


def to_json(x):
    """json.dump's fallback for NumPy scalars and arrays."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    plan, sections = make_plan(args), selected_sections(args.sections)
    batch_plan = batching.plan_from_args(args) if "batching" in sections else None  # flags checked first
    tree_plan = trees.plan_from_args(args) if "trees" in sections else None
    results = run(plan, sections, threads=args.threads, argv=argv)
    if batch_plan:
        batching.run_section(batch_plan, results, args.threads)
    if tree_plan:
        trees.run_section(tree_plan, results, args.threads)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=to_json))
    log(f"wrote {path} ({results['meta']['wall_seconds']:.0f} s in all)")
    if args.compare:
        with open(args.compare) as f:
            print_comparison(json.load(f), results, args.compare, str(path))
    batching.exit_on_mismatch(results.get("batching"))
    trees.exit_on_mismatch(results.get("trees"))
    return results


if __name__ == "__main__":
    main()
