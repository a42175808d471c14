"""The GPT-2 speculative-sampling repositories' table, on random weights of the release shapes.

    python -m bench.seed_table                      # gpt2 (124M) drafting for gpt2-xl (1558M), alpha 0.7
    python -m bench.seed_table --target 355M --draft 124M --alpha 0.8 --num-runs 10 --N 40 --K 4

Those repositories time autoregressive and speculative sampling of N = 40 tokens with K = 4
(after one warm-up run) and print: method | num_runs | time | +/- std | speedup, with the sanity
check that the target drafting for itself is never rejected. Random weights agree on nothing, so
the draft here is bench's forced-acceptance drafter (forced_draft.py): the real draft model's
cost, and its proposals equal the target's greedy token with probability alpha. Greedy decoding,
as the forced drafter needs; the runs of the two methods alternate, and the speedup is the ratio
of their mean times. No download: the models are gpt2np.random_model of each shape.
"""
import argparse
import statistics
import time

import gpt2np
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.report import DefaultsHelpFormatter

from .common import log, random_ids
from .forced_draft import ForcedAcceptanceDraft


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def seed_table(target, draft, prompt, N, K, alpha, num_runs, seed=0):
    """{method: [seconds per run]}, the rejections of each speculative run, and whether every run was exact."""
    baseline = generate(target, prompt, N, temperature=0)  # also the warm-up of the target
    forced = ForcedAcceptanceDraft(draft, prompt + baseline, alpha, seed=seed)
    speculative_generate(target, forced, prompt, N, K, temperature=0)  # the warm-up of the pair
    times, rejections, exact = {"autoregressive": [], "speculative": []}, [], True
    for _ in range(num_runs):
        seconds, tokens = timed(lambda: generate(target, prompt, N, temperature=0))
        times["autoregressive"].append(seconds)
        seconds, result = timed(lambda: speculative_generate(target, forced, prompt, N, K, temperature=0))
        times["speculative"].append(seconds)
        rejections.append(sum(1 for p in result.provenance if p == "resample"))
        exact &= tokens == baseline and result.tokens == baseline
    return times, rejections, exact


def sanity(target, prompt, N, K):
    """The target drafting for itself (the repositories' check): rejections of one greedy run."""
    result = speculative_generate(target, target, prompt, N, K, temperature=0)
    return sum(1 for p in result.provenance if p == "resample")


def print_seed_table(times, rejections, label):
    mean = {m: statistics.mean(t) for m, t in times.items()}
    print(f"\n{label}")
    print(f"{'method':<24}| num_runs |    time | +/- std | speedup")
    print("-" * 24 + "+----------+---------+---------+--------")
    for method, t in times.items():
        std = statistics.stdev(t) if len(t) > 1 else 0.0
        speedup = mean["autoregressive"] / mean[method]
        print(f"{method + ' sampling':<24}| {len(t):>8} | {mean[method]:6.3f}s | {std:6.3f}s | {speedup:6.2f}x")
    print(f"speculative sampling: {sum(rejections)} rejections in {len(rejections)} runs")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.seed_table", description=__doc__.split("\n")[0],
                                 formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--target", default="1558M", help="target shape (a size of gpt2np.PRESETS)")
    ap.add_argument("--draft", default="124M", help="draft shape")
    ap.add_argument("--alpha", type=float, default=0.7, help="forced acceptance rate of the draft")
    ap.add_argument("--num-runs", type=int, default=5, help="timed runs of each method, after one warm-up run")
    ap.add_argument("--N", type=int, default=40, help="tokens per run")
    ap.add_argument("--K", type=int, default=4, help="draft tokens per round")
    ap.add_argument("--seed", type=int, default=0, help="seed of the forced drafter's coins")
    args = ap.parse_args(argv)
    for size in (args.target, args.draft):
        if size not in gpt2np.PRESETS:
            raise SystemExit(f"unknown shape {size!r}: use one of {', '.join(gpt2np.PRESETS)}")
    if args.num_runs < 1 or args.N < 1 or args.K < 1 or not 0 <= args.alpha <= 1:
        raise SystemExit("--num-runs, --N and --K must be >= 1, --alpha in [0, 1]")
    log(f"building random {args.target} and {args.draft} models")
    target = gpt2np.random_model(gpt2np.PRESETS[args.target], seed=0, tokenizer=None)
    draft = gpt2np.random_model(gpt2np.PRESETS[args.draft], seed=1, tokenizer=None)
    prompt = random_ids(8, target.n_vocab, seed=3)
    print(f"# BLAS kernel: {gpt2np.blas_kernel()}")
    times, rejections, exact = seed_table(target, draft, prompt, args.N, args.K, args.alpha, args.num_runs, args.seed)
    print_seed_table(times, rejections, f"{args.draft} (forced alpha {args.alpha}) drafting for {args.target}, "
                                        f"N = {args.N}, K = {args.K}, greedy, random weights; every run exact: {exact}")
    print(f"sanity check, {args.target} drafting for itself: {sanity(target, prompt, args.N, args.K)} rejections")


if __name__ == "__main__":
    main()
