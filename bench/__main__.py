"""python -m bench: parse the flags, run the sections, write the JSON (see bench/__init__.py)."""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from gpt2np.model.config import PRESETS
from gpt2np.checkpoints.download import DownloadError
from gpt2np.checkpoints.loading import read_config, resolve_model_dir
from gpt2np.report import DefaultsHelpFormatter, OneLineErrorParser, write_atomically

from . import SECTIONS, batching, trees
from . import __doc__ as SUITE_DOC
from .common import full_plan, log, numbers, tiny_plan
from .compare import load_results, print_comparison
from .run import run

DEFAULT_JSON = Path(__file__).parent / "results" / "bench.json"
LONG_SECTIONS = {"batching", "trees"}  # left out of "all": name them
TINY_FIXES = ("sizes", "pair", "large", "kernel_sizes", "kernel_rounds", "K", "policy_repeats", "policy_runs",
              "policy_lockstep", "policy_fresh_probe", "policy_read", "policy_prompt", "policy_alphas", "policy_Ks",
              "policy_tokens", "policy_drafters", "spec_tokens", "spec_long_prompt", "reference_tokens",
              "batch_pairs", "batch_tokens", "batch_prompt_len", "tree_pair", "tree_tokens")  # --tiny's own values


def parse_args(argv):
    return parser().parse_args(argv)


def parser():
    ap = OneLineErrorParser(prog="python -m bench", formatter_class=DefaultsHelpFormatter,
                            description=f"{SUITE_DOC.splitlines()[0].rstrip('.')} "
                                        f"(each section's file and the JSON: bench/__init__.py)")
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
    ap.add_argument("--tiny", action="store_true",
                    help="tiny configs, a few seconds: checks the suite runs, its numbers mean nothing. It fixes "
                         "its own sizes, pairs, K, token counts and prompts: --sizes, --large, --pair, "
                         "--kernel-sizes, --kernel-rounds, --K, every --policy-* and --spec-* flag, "
                         "--reference-tokens, --batch-pairs, --batch-tokens, --batch-prompt-len, --tree-pair and "
                         "--tree-tokens are ignored (a note names those given), and at most 2 repeats "
                         "(--repeats, --batch-repeats, --tree-repeats)")
    # how
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement, after a warm-up "
                                                           "(speculative runs use min(repeats, 3))")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (threadpoolctl) (default: BLAS's own)")
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
                    help="tokens per speculative/baseline run (default: 6 x (K + 1), 30 at --K 4), so that alpha = 1 "
                         "runs end on a full round (a clamped last round would bias tokens per round low)")
    ap.add_argument("--spec-long-prompt", type=int, default=896,
                    help="prompt length of the forced-acceptance runs' second, long-prompt set (0: leave them out)")
    ap.add_argument("--reference-tokens", type=int, default=8,
                    help="steps the slow reference really runs (of 64; the rest is extrapolated)")
    batching.add_arguments(ap)
    trees.add_arguments(ap)
    # output
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    ap.add_argument("--compare", default=None, metavar="OLD_JSON",
                    help="print headline numbers beside this older run (read before the run starts)")
    return ap


def selected_sections(text):
    names = set(SECTIONS) - LONG_SECTIONS if text == "all" else {s.strip() for s in text.split(",") if s.strip()}
    unknown = names - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(sorted(unknown))}: choose from {', '.join(SECTIONS)}")
    if not names:
        raise SystemExit(f"--sections: at least one section, got {text!r}: choose from all, {', '.join(SECTIONS)}")
    if "decode" in names:
        names.add("bandwidth")
    return names


def check_counts(args):
    """One-line SystemExits for counts out of range, whatever the sections (--tiny's own values included)."""
    at_least = [("--repeats", args.repeats, 1), ("--kernel-rounds", args.kernel_rounds, 1),
                ("--policy-repeats", args.policy_repeats, 1), ("--policy-runs", args.policy_runs, 1),
                ("--K", args.K, 1), ("--reference-tokens", args.reference_tokens, 1)]
    at_least += [("--threads", args.threads, 1)] if args.threads is not None else []
    at_least += [("--spec-tokens", args.spec_tokens, 2)] if args.spec_tokens is not None else []
    for flag, value, low in at_least:
        if value < low:
            raise SystemExit(f"{flag} must be >= {low}, got {value}")
    if args.spec_long_prompt != 0 and args.spec_long_prompt < 3:
        raise SystemExit(f"--spec-long-prompt must be 0 (leave the long-prompt runs out) or >= 3, "
                         f"got {args.spec_long_prompt}")


def make_plan(args, sections=None):
    """The Plan of the flags (--tiny: tiny_plan); every value checked before any work (one-line SystemExits)."""
    sections = selected_sections(args.sections) if sections is None else sections
    check_counts(args)
    policy = policy_options(args)
    alphas = numbers(args.alphas, float, "--alphas")
    if not all(0 <= a <= 1 for a in alphas):
        raise SystemExit(f"--alphas must lie in [0, 1], got {args.alphas!r}")
    if args.tiny:
        return tiny_plan(repeats=min(args.repeats, 2), alphas=alphas)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if args.large:
        sizes += [s for s in ("774M", "1558M") if s not in sizes]
    if not sizes:
        raise SystemExit(f"--sizes: at least one size or model name, got {args.sizes!r}")
    pair = tuple(s.strip() for s in args.pair.split(","))
    if len(pair) != 2 or not all(pair):
        raise SystemExit(f"--pair must be DRAFT,TARGET, got {args.pair!r}")
    kernel_sizes = tuple(s.strip() for s in args.kernel_sizes.split(",") if s.strip())
    if not kernel_sizes:
        raise SystemExit(f"--kernel-sizes: at least one size or model name, got {args.kernel_sizes!r}")
    named = tuple(s for s in dict.fromkeys(sizes + list(pair) + list(kernel_sizes)) if s not in PRESETS)
    try:
        plan = full_plan(sizes, args.repeats, K=args.K, alphas=alphas,
                         spec_tokens=args.spec_tokens or 6 * (args.K + 1),
                         policy_repeats=args.policy_repeats, policy_runs=args.policy_runs,
                         policy_lockstep=args.policy_lockstep, policy_fresh_probe=args.policy_fresh_probe,
                         policy_read=args.policy_read, policy_prompt_len=args.policy_prompt,
                         spec_long_prompt=args.spec_long_prompt,
                         reference_tokens=args.reference_tokens, pair=pair, named=named, kernel_sizes=kernel_sizes,
                         kernel_rounds=args.kernel_rounds, **policy,
                         configs={**PRESETS, **{name: named_config(name) for name in named}})
    except ValueError as e:  # Plan's own checks
        raise SystemExit(str(e)) from None
    check_contexts(plan, sections, args)
    return plan


def check_contexts(plan, sections, args):
    """A run's prompt + tokens within the context of every model it runs on (generate's own check, made up front)."""
    def room(sizes):  # -> (the smallest n_ctx, its sizes as text)
        return min(plan.config(s).n_ctx for s in sizes), ",".join(dict.fromkeys(sizes))

    if "speculative" in sections:  # every size drafting for itself, and the pair
        n_ctx, where = room([*plan.sizes, *plan.pair])
        if plan.spec_prompt_len + plan.spec_tokens > n_ctx:
            how = " (6 x (--K + 1))" if args.spec_tokens is None else ""
            raise SystemExit(f"--spec-tokens {plan.spec_tokens}{how} + the prompt ({plan.spec_prompt_len}) do not fit "
                             f"the context of {where} ({n_ctx})")
    if "policies" in sections:
        n_ctx, where = room(plan.pair)
        n_prompt = plan.policy_prompt_len or plan.spec_prompt_len
        if n_prompt + plan.policy_tokens > n_ctx:
            prompt = f"--policy-prompt {n_prompt}" if plan.policy_prompt_len else f"the prompt ({n_prompt})"
            raise SystemExit(f"--policy-tokens {plan.policy_tokens} + {prompt} = {n_prompt + plan.policy_tokens} "
                             f"does not fit the context of {where} ({n_ctx})")
    for section, flag, sizes, need, what in section_contexts(plan):
        small = [s for s in dict.fromkeys(sizes) if plan.config(s).n_ctx < need]
        if section in sections and small:
            raise SystemExit(f"--sections {section}: {what} need a context of {need} tokens; {flag} "
                             f"{','.join(small)} {'has' if len(small) == 1 else 'have'} "
                             f"{min(plan.config(s).n_ctx for s in small)}: larger sizes, or leave {section} out")


def section_contexts(plan):  # -> (section, flag, sizes, tokens of context needed, what needs them) of the rest
    """The contexts the plan's other sections run at (decode.py, hf.py, kernels.py, baseline.py)."""
    return [("prefill", "--sizes", plan.sizes, max(plan.prefill_lens), f"prompts of up to {max(plan.prefill_lens)}"),
            ("decode", "--sizes", plan.sizes, max(plan.contexts) + 1, f"steps at context {max(plan.contexts)}"),
            ("verify", "--sizes", plan.sizes, max(plan.verify_contexts) + plan.verify_max_m,
             f"{plan.verify_max_m} tokens at context {max(plan.verify_contexts)}"),
            ("hf", "--sizes", plan.sizes, max(plan.verify_context + 5, *plan.prefill_lens),
             f"prompts of up to {max(plan.prefill_lens)} and 5 tokens at context {plan.verify_context}"),
            ("kernels", "--kernel-sizes", plan.kernel_sizes, plan.verify_context + plan.kernel_max_m,
             f"{plan.kernel_max_m} tokens at context {plan.verify_context}"),
            ("reference", "the reference size", (plan.reference_size,), plan.prompt_len + plan.reference_new,
             f"{plan.reference_new} tokens after {plan.prompt_len}")]


def policy_options(args):
    """--policy-*: the K-policy sweep's alphas, fixed Ks, tokens and drafters (one-line errors)."""
    alphas = numbers(args.policy_alphas, float, "--policy-alphas")
    Ks = numbers(args.policy_Ks, int, "--policy-Ks") if args.policy_Ks.strip() else ()
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


def json_path(text):
    """--json's file, checked before any work: not a folder nor a device, in a folder that takes a new file (the
    default's, bench/results/, made if missing: a fresh clone has none; any other must exist, so a mistyped
    folder is not made). A link is followed: the file it points to is replaced."""
    path = Path(text)
    path = path.resolve() if path.is_symlink() else path
    if path.exists() and not path.is_file():
        raise SystemExit(f"--json {text}: not a file ({'a folder' if path.is_dir() else 'a device or pipe'}); "
                         "name a .json file")
    if not path.parent.exists() and path.parent.resolve() != DEFAULT_JSON.parent.resolve():
        raise SystemExit(f"--json {text}: the folder {path.parent} does not exist")
    try:
        path.parent.mkdir(exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SystemExit(f"--json {text}: cannot write a file there ({e.strerror or e})") from None
    return path


def write_json(path, results):
    """The results at path whole or not at all: written to a temporary file beside it, then renamed over it."""
    write_atomically(path, json.dumps(results, indent=1, default=to_json))


def tiny_note(ap, args):  # -> "" or the one line naming the flags --tiny ignores that were given
    given = [f"--{dest.replace('_', '-')}" for dest in TINY_FIXES if getattr(args, dest) != ap.get_default(dest)]
    return f"--tiny fixes its own values: {', '.join(given)} ignored" if args.tiny and given else ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = parser()
    args = ap.parse_args(argv)
    try:  # every flag and file checked before any work: one line and status 2, as argparse's own errors
        sections = selected_sections(args.sections)
        plan = make_plan(args, sections)
        batch_plan = batching.plan_from_args(args) if "batching" in sections else None
        tree_plan = trees.plan_from_args(args) if "trees" in sections else None
        old = load_results(args.compare, "--compare") if args.compare else None
        path = json_path(args.json)  # last: it may make the folder
    except SystemExit as e:
        if isinstance(e.code, str):
            ap.error(e.code)
        raise
    if tiny_note(ap, args):
        log(f"note: {tiny_note(ap, args)}")
    results = run(plan, sections, threads=args.threads, argv=argv)
    if batch_plan:
        batching.run_section(batch_plan, results, args.threads)
    if tree_plan:
        trees.run_section(tree_plan, results, args.threads)
    write_json(path, results)
    log(f"wrote {path} ({results['meta']['wall_seconds']:.0f} s in all)")
    if old is not None:
        print_comparison(old, results, args.compare, str(path))
    batching.exit_on_mismatch(results.get("batching"))
    trees.exit_on_mismatch(results.get("trees"))
    return results


if __name__ == "__main__":
    main()
