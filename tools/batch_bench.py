"""Plain decoding of B sequences packed into one forward pass per step, against the same B one at a time.

    python tools/batch_bench.py                                  # 124M and 355M random weights, B = 1 2 4 8
    python tools/batch_bench.py --sizes 124M --batches 1,8 --repeats 3 --context 64 --n_tokens 16 --threads 1

For each size and B: B random prompts of --context tokens, --n_tokens greedy tokens each (random
weights, no tokenizer: nothing stops early). "together" is generate_batch over the B prompts; "alone"
is generate's loop (plain_stream) for each prompt in turn. The two alternate (which goes first
alternates too), --repeats times, in this one process, after an untimed warm-up of each. As the
server runs them: "together" on weights in the order batches want under this BLAS kernel
(gpt2np/model/fast/layout.py: row-major under the Haswell kernels), "alone" on the weights as stored
(column-major), each re-ordered untimed before its run (--together-order stored: both as stored). Reported:
tokens/s over the whole run (the prefill step included) and decode tokens/s (the steps after each
sequence's first token, which feed one token each), medians, and the together/alone ratio of each
alternating pair (median and range): on a shared, noisy machine ratios measured side by side are the
numbers to trust. The header names NumPy's BLAS kernel, on which a few-row product's cost depends.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gpt2np from this checkout
import gpt2np  # noqa: E402  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)
import numpy as np  # noqa: E402
from gpt2np.decoding.batched import batch_stream  # noqa: E402
from gpt2np import set_weights_order  # noqa: E402
from gpt2np.model.fast.matmul import batch_layout  # noqa: E402


def timed(run):  # run() -> (seconds to the first token of every sequence, tokens, decode tokens); -> + total
    start = time.perf_counter()
    first_seconds, n_tokens, n_decoded = run()
    total = time.perf_counter() - start
    return total, total - first_seconds, n_tokens, n_decoded


def together(model, prompts, n_tokens):  # generate_batch, step by step: the first step is the packed prefill
    steps, start = batch_stream(model, prompts, n_tokens), time.perf_counter()
    next(steps)
    first = time.perf_counter() - start
    try:
        while True:
            next(steps)
    except StopIteration as done:
        outputs = done.value
    return first, sum(map(len, outputs)), sum(len(o) - 1 for o in outputs)


def alone(model, prompts, n_tokens):  # one sequence after the other; first: each one's prefill step
    first, n_total, n_decoded = 0.0, 0, 0
    for prompt in prompts:
        start = time.perf_counter()
        stream = gpt2np.plain_stream(model, prompt, n_tokens)
        next(stream)
        first += time.perf_counter() - start
        tokens = stream.run()
        n_total, n_decoded = n_total + len(tokens), n_decoded + len(tokens) - 1
    return first, n_total, n_decoded


def measure(model, batch, context, n_tokens, repeats, rng, orders):  # -> {"together": [...], "alone": [...]}
    """orders: {"together": order, "alone": order}, the weights' order for each (set untimed before each run)."""
    prompts = [rng.integers(0, model.n_vocab, context).tolist() for _ in range(batch)]
    runs = {"together": lambda: together(model, prompts, n_tokens), "alone": lambda: alone(model, prompts, n_tokens)}
    for name, warm_up in (("together", together), ("alone", alone)):  # first calls, BLAS threads
        set_weights_order(model, orders[name])
        warm_up(model, prompts[:1], 2)
    results = {name: [] for name in runs}
    for repeat in range(repeats):
        for name in (("together", "alone") if repeat % 2 == 0 else ("alone", "together")):
            set_weights_order(model, orders[name])
            results[name].append(timed(runs[name]))
    return results


def summary_row(size, batch, results):  # one markdown table row
    def rates(name, decode):  # tokens/s per repeat
        return [(r[3] / r[1]) if decode else (r[2] / r[0]) for r in results[name]]

    cells = [size, str(batch)]
    for decode in (False, True):
        t, a = rates("together", decode), rates("alone", decode)
        ratios = [x / y for x, y in zip(t, a)]
        cells += [f"{statistics.median(a):.1f}", f"{statistics.median(t):.1f}",
                  f"**{statistics.median(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f})"]
    return "| " + " | ".join(cells) + " |"


def integers(text):  # "1,2,4" -> [1, 2, 4]; argparse turns a ValueError into a one-line usage error
    return [int(b) for b in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes", default="124M,355M", help="gpt2np.PRESETS names, comma-separated (random weights)")
    parser.add_argument("--batches", default="1,2,4,8", type=integers, help="batch sizes B, comma-separated")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--n_tokens", type=int, default=16, help="new tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts' np.random.Generator")
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: the BLAS default)")
    parser.add_argument("--together-order", choices=("batches", "stored"), default="batches",
                        help="the weights' order for the packed runs: the one batches want under this BLAS kernel "
                             "(as the server with --max_batch above 1), or as stored")
    args = parser.parse_args(argv)
    sizes, batches = args.sizes.split(","), args.batches
    unknown = [s for s in sizes if s not in gpt2np.PRESETS]
    if unknown or any(b < 1 for b in batches) or min(args.context, args.n_tokens, args.repeats) < 1 \
            or (args.threads is not None and args.threads < 1):
        parser.error(f"sizes must be in {sorted(gpt2np.PRESETS)}; batches, context, n_tokens, repeats, threads >= 1")
    if args.threads is not None:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=args.threads, user_api="blas")
    orders = {"together": batch_layout() if args.together_order == "batches" else "column-major",
              "alone": "column-major"}
    print(f"{gpt2np.blas_kernel()}; context {args.context}, {args.n_tokens} new tokens per sequence, greedy, "
          f"{args.repeats} alternating repeats; weights {orders['together']} together, {orders['alone']} alone")
    print("| size | B | alone tok/s | together tok/s | ratio (range) | alone decode tok/s | together decode "
          "tok/s | decode ratio (range) |\n|" + " --- |" * 8)
    rng = np.random.default_rng(args.seed)
    for size in sizes:
        model = gpt2np.random_model(gpt2np.PRESETS[size], tokenizer=None)
        for batch in batches:
            print(summary_row(size, batch, measure(model, batch, args.context, args.n_tokens, args.repeats, rng,
                                                   orders)), flush=True)


if __name__ == "__main__":
    main()
