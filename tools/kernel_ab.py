"""Whole forward passes with this BLAS kernel's few-row methods against plain x @ w, alternated in one process.

    python tools/kernel_ab.py                                        # random 355M, the running kernel's METHODS
    OPENBLAS_CORETYPE=Nehalem python tools/kernel_ab.py --rows 1,2,5,8 --pairs 8
    python tools/kernel_ab.py --size bundled --threads 1             # the bundled 2.6M target, as main.py runs it
    python tools/kernel_ab.py --try Haswell                          # another kernel's table on this one
    python tools/kernel_ab.py --order panels --rows 1,2,5,8          # the curve of a model loaded under SkylakeX

gpt2np/model/fast/matmul.py picks a few-row product's method from METHODS, a table of measurements keyed by
OpenBLAS's kernel name; a kernel nobody has measured gets plain x @ w. This is the measurement an entry
needs: a pass over M new tokens after --context cached ones (the large weights column-major, as stored, or
in --order), with the table's methods ("table") and with
every product plain ("plain", the kernel's entry removed), the two alternated --pairs times (which goes
first alternates too), the cache rolled back after every pass. OpenBLAS picks its kernel when NumPy loads
it, so another kernel is measured by starting this tool again with OPENBLAS_CORETYPE set (and, for
Haswell, OPENBLAS_L2_SIZE=512), never from inside. --try KERNEL measures that kernel's table on the running
one (a candidate entry for a kernel METHODS lacks). Reported per M: each side's median milliseconds, its
v(M) against its own one-row pass, the median and quartiles of table / plain over the pairs (readings a
fraction of a second apart, so this VM's drift between runs cancels), and the largest difference between
the two sides' logits (float32 sums in another order: ~1e-6 of the logits' scale, never more than 1e-4).
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gpt2np from this checkout
import gpt2np  # noqa: E402  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)
import numpy as np  # noqa: E402
from gpt2np.model.fast import matmul as mm  # noqa: E402
from gpt2np.model.fast.layout import ORDERS, panels_fit  # noqa: E402
from gpt2np.report import DefaultsHelpFormatter, OneLineErrorParser, seed_error  # noqa: E402


def with_table(table, run):  # -> run()'s result with METHODS[the running kernel] = table (None: no entry, plain)
    saved = mm.METHODS.get(mm.KERNEL)
    if table is None:
        mm.METHODS.pop(mm.KERNEL, None)
    else:
        mm.METHODS[mm.KERNEL] = table
    try:
        return run()
    finally:
        if saved is None:
            mm.METHODS.pop(mm.KERNEL, None)
        else:
            mm.METHODS[mm.KERNEL] = saved


def compare(model, table, rows, context, pairs, rng):  # -> {M: {"table": [s], "plain": [s], "logit_gap": float}}
    """Each M's passes with table and plain, alternated `pairs` times, after `context` random cached tokens."""
    cache = model.new_cache(n_ctx=context + max(rows))
    model.forward(rng.integers(0, model.n_vocab, context), cache)  # [context] cached

    def a_pass(M, ids):  # -> (seconds, logits [M, n_vocab]); the cache rolled back after it
        start = time.perf_counter()
        logits = model.forward(ids, cache, n_logits=M)
        seconds = time.perf_counter() - start
        cache.truncate(context)
        return seconds, logits

    results = {}
    for M in rows:
        ids = rng.integers(0, model.n_vocab, M)                    # [M] the same tokens on both sides
        sides = {"table": table, "plain": None}
        first = {name: with_table(t, lambda: a_pass(M, ids))[1] for name, t in sides.items()}  # warm-up; logits
        scale = float(np.abs(first["plain"]).max()) or 1.0
        seconds = {name: [] for name in sides}
        for pair in range(pairs):
            for name in (list(sides) if pair % 2 == 0 else list(sides)[::-1]):
                seconds[name].append(with_table(sides[name], lambda: a_pass(M, ids))[0])
        results[M] = {**seconds, "logit_gap": float(np.abs(first["table"] - first["plain"]).max()) / scale}
    return results


def table_rows(results):  # -> markdown rows, one per M
    one = {name: statistics.median(results[min(results)][name]) for name in ("table", "plain")}
    rows = []
    for M, r in results.items():
        ratios = [t / p for t, p in zip(r["table"], r["plain"])]
        q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        t, p = statistics.median(r["table"]), statistics.median(r["plain"])
        rows.append(f"| {M} | {t * 1e3:.2f} | {t / one['table']:.2f} | {p * 1e3:.2f} | {p / one['plain']:.2f} | "
                    f"**{q2:.3f}** ({q1:.3f}–{q3:.3f}) | {r['logit_gap']:.1e} |")
    return rows


def integers(text):  # "1,2,5" -> [1, 2, 5]; argparse turns a ValueError into a one-line usage error
    return [int(m) for m in text.split(",")]


def main(argv=None):
    parser = OneLineErrorParser(prog="python tools/kernel_ab.py", description=__doc__.splitlines()[0],
                                formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--size", default="355M", help="a gpt2np.PRESETS name (random weights) or 'bundled' "
                                                       "(the bundled 2.6M target, its real weights)")
    parser.add_argument("--rows", type=integers, default=[1, 2, 3, 5, 8, 12, 16],
                        help="new tokens per pass, comma-separated; the smallest is each side's v denominator")
    parser.add_argument("--context", type=int, default=128, help="tokens cached before each pass")
    parser.add_argument("--pairs", type=int, default=6, help="alternated pairs of passes per row count")
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: the BLAS default)")
    parser.add_argument("--try", dest="candidate", default=None, metavar="KERNEL",
                        help="measure METHODS[KERNEL] on the running kernel instead of its own entry "
                             "(default: its own)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tokens' np.random.Generator")
    parser.add_argument("--order", choices=ORDERS, default="column-major",
                        help="the large weights' order (METHODS' rows are for column-major and row-major ones; in "
                             "panels both sides run by_panels, as a model loads under SkylakeX, and differ only in "
                             "the output head)")
    args = parser.parse_args(argv)
    if args.size != "bundled" and args.size not in gpt2np.PRESETS:
        parser.error(f"--size must be 'bundled' or one of {sorted(gpt2np.PRESETS)}, got {args.size!r}")
    if min(args.rows) < 1 or args.context < 1 or args.pairs < 1 or (args.threads is not None and args.threads < 1):
        parser.error("rows, context, pairs and threads must be at least 1")
    if message := seed_error(args.seed):  # np.random.default_rng's ValueError, in a traceback
        parser.error(message)
    if mm.BLAS is None:
        parser.error("NumPy's BLAS is not OpenBLAS (or threadpoolctl is missing): every product is plain x @ w here")
    name = args.candidate or mm.KERNEL
    if name not in mm.METHODS:
        parser.error(f"METHODS has no entry for {name!r} (entries: {', '.join(mm.METHODS)}): "
                     f"give --try KERNEL to measure one of them on this kernel ({mm.KERNEL})")
    if args.threads is not None:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=args.threads, user_api="blas")
    model = (gpt2np.load_model("shakespeare-2.6M") if args.size == "bundled"
             else gpt2np.random_model(gpt2np.PRESETS[args.size], tokenizer=None))
    if args.order == "panels" and not panels_fit(model):
        parser.error(f"--order panels: {model.name}'s n_embd {model.config.n_embd} does not cut into panels")
    gpt2np.set_weights_order(model, args.order)
    if args.context + max(args.rows) > model.n_ctx:
        parser.error(f"--context {args.context} + {max(args.rows)} rows exceed the model's {model.n_ctx} positions")
    rows = sorted(set(args.rows))
    print(f"{model.name} ({gpt2np.weights_order(model)}), context {args.context}, {args.pairs} alternated pairs; the running kernel: "
          f"{with_table(mm.METHODS[name], gpt2np.blas_kernel)}" + (f" (METHODS[{name!r}] tried on it)" if args.candidate else ""))
    print("| M | table ms | table v | plain ms | plain v | table / plain (quartiles) | largest logit gap |\n|"
          + " --- |" * 7)
    for row in table_rows(compare(model, mm.METHODS[name], rows, args.context, args.pairs,
                                  np.random.default_rng(args.seed))):
        print(row, flush=True)


if __name__ == "__main__":
    main()
