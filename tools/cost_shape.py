"""The cost probe's v_shape(M) beside the whole pass's v(M), alternated in one process: what auto plans with, checked.

    python tools/cost_shape.py --size 1558M                                  # random 1558M, M = 1..9, 5 rounds
    OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512 python tools/cost_shape.py --size 1558M
    python tools/cost_shape.py --size bundled --rounds 20                    # the bundled 2.6M target

A K policy that plans with v(M) ("auto") has the target read the shape of its curve before the run
(gpt2np/model/cost_probe.py: one block over M rows against one row, the layers in turn, about 0.9 of a
pass at 1558M). This measures how far that shape is from the curve it stands for. Each round: one whole
pass over M new tokens after --context cached ones for every M (the cache rolled back after each), then
one probe as a run takes it (model.row_cost_shape: each size's fastest reading, capped by larger sizes').
Reported per M: the median pass's v (median over rounds, against the median one-row pass), the median of
the probes' v_shape and their spread (lowest and highest probe), and the gap between the pass's v - 1 and
the probes' (the scale auto fits from the sizes a run times: policies.shape_scale). The kernel is named
(threadpoolctl).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gpt2np from this checkout
import gpt2np  # noqa: E402  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)
import numpy as np  # noqa: E402
from gpt2np.report import OneLineErrorParser, seed_error  # noqa: E402


def measure(model, M_max, context, rounds, rng):  # -> ({M: [pass seconds]}, [probe {M: v_shape}])
    """`rounds` times: a whole pass at each M = 1..M_max (the cache rolled back to `context`), then one probe."""
    cache = model.new_cache(n_ctx=context + M_max)
    model.forward(rng.integers(0, model.n_vocab, context), cache)  # [context] cached
    passes, probes = {M: [] for M in range(1, M_max + 1)}, []
    for _ in range(rounds):
        for M in passes:
            ids = rng.integers(0, model.n_vocab, M)                  # [M]
            start = time.perf_counter()
            model.forward(ids, cache, n_logits=M)                    # every row's logits, as a verification
            passes[M].append(time.perf_counter() - start)
            cache.truncate(context)
        model.cost_shapes.clear()                                    # a fresh reading, as a new process takes it
        probes.append(model.row_cost_shape(M_max))
    return passes, probes


def table_rows(passes, probes):  # -> markdown rows, one per M
    one = statistics.median(passes[1])
    rows = []
    for M, seconds in passes.items():
        v = statistics.median(seconds) / one
        shapes = [p[M] for p in probes]
        shape = statistics.median(shapes)
        rows.append(f"| {M} | {statistics.median(seconds) * 1e3:.2f} | {v:.2f} | **{shape:.2f}** "
                    f"({min(shapes):.2f}–{max(shapes):.2f}) | {v - shape:+.2f} |")
    return rows


def main(argv=None):
    parser = OneLineErrorParser(prog="python tools/cost_shape.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", default="1558M", help="a gpt2np.PRESETS name (random weights) or 'bundled'")
    parser.add_argument("--M_max", type=int, default=9, help="new tokens per pass up to this (auto's K_max + 1)")
    parser.add_argument("--context", type=int, default=64, help="tokens cached before each pass")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of passes and probes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tokens' np.random.Generator")
    args = parser.parse_args(argv)
    if args.size != "bundled" and args.size not in gpt2np.PRESETS:
        parser.error(f"--size must be 'bundled' or one of {sorted(gpt2np.PRESETS)}, got {args.size!r}")
    if min(args.M_max, args.context, args.rounds) < 1:
        parser.error("--M_max, --context and --rounds must be at least 1")
    if message := seed_error(args.seed):  # np.random.default_rng's ValueError, in a traceback
        parser.error(message)
    model = (gpt2np.load_model("shakespeare-2.6M") if args.size == "bundled"
             else gpt2np.random_model(gpt2np.PRESETS[args.size], tokenizer=None))
    if args.context + args.M_max > model.n_ctx:
        parser.error(f"--context {args.context} + {args.M_max} rows exceed the model's {model.n_ctx} positions")
    print(f"{model.name} ({gpt2np.weights_order(model)}), context {args.context}, {args.rounds} rounds; "
          f"the running kernel: {gpt2np.blas_kernel()}")
    print("| M | pass ms | pass v | probe v_shape (lowest–highest) | v − v_shape |\n|" + " --- |" * 5)
    for row in table_rows(*measure(model, args.M_max, args.context, args.rounds, np.random.default_rng(args.seed))):
        print(row, flush=True)


if __name__ == "__main__":
    main()
