"""Plain decoding of B sequences packed into one forward pass per step, against the same B one at a time.

    python tools/batch_bench.py                                  # 124M and 355M random weights, B = 1 2 4 8
    python tools/batch_bench.py --sizes 124M --batches 1,8 --repeats 3 --context 64 --n_tokens 16 --threads 1
    python tools/batch_bench.py --sizes 355M --batches 8 --repeats 1 --step-pairs 40    # + adjacent decode steps
    python tools/batch_bench.py --sizes 355M --batches 8 --repeats 5 --no-lockstep      # whole runs back to back

For each size and B: B random prompts of --context tokens, --n_tokens greedy tokens each (random
weights, no tokenizer: nothing stops early). "together" is generate_batch over the B prompts; "alone"
is generate's loop (plain_stream) for each prompt in turn. The two run --repeats times in this one
process (in lockstep, below; which goes first alternates), after an untimed warm-up of each. As the
server runs them: "together" on weights in the order batches want under this BLAS kernel
(gpt2np/model/fast/layout.py: row-major under the Haswell kernels, panels under SkylakeX), "alone" on
the weights as loaded (panels under SkylakeX, column-major elsewhere) (--together-order stored: both as
loaded). Reported: tokens/s over the whole run (the
prefill steps included) and decode tokens/s (the steps after each sequence's first token, which feed one
token each), medians, and the together/alone ratio of each repeat (median and range): on a shared, noisy
machine ratios measured side by side are the numbers to trust. The header names NumPy's BLAS kernel, on
which a few-row product's cost depends.

Whole runs of each side take seconds, and this VM's speed drifts by 10-20 % between them (two runs of
one comparison read 3.77 -> 4.15x and 3.94 -> 3.72x; 9 repeats on a Zen 4 EPYC 3.53-5.36x). So by default a
repeat's two sides run in lockstep (bench/common.py's lockstep, as python -m bench's policies and batching
sections): a packed step of "together", then one step of each "alone" sequence in turn (the one with the
fewest tokens; its prompt's prefill the first time), always the side with fewer tokens emitted, every step
timed on its own, so both sides decode each stretch of the output within a second of each other. Each side
runs on its own model where the two orders differ (the same weights twice). --no-lockstep gives the runs
back to back, one after the other, one model re-ordered untimed before each run (the default before
2026-11-28; 7 repeats of 355M, B = 8 in lockstep on that EPYC: 4.18-4.44x).

--step-pairs N measures the decode step alone, side by side: one packed step of the B sequences at the
prompts' context against the same B sequences' steps one at a time, each with its greedy pick,
alternated N times (which goes first alternates too), the caches put back after every step; the two
sides' weights in the orders above (two copies of the model where the orders differ). Reported: the
step's ratio B x (one sequence's step) / (the packed step), median and quartiles over the pairs,
readings a fraction of a second apart.

--anatomy N takes the same two steps apart, alternated N times: each whole, their weight products alone
(every Conv1D weight and the output head, over the step's rows, by matmul's method for that many rows),
their attention alone (every layer's, against the caches), and the rest by difference (layer norms,
GELU, residual adds, the embedding, the greedy pick, Python). It says what bounds the step's ratio: the
products' own v(B), or what a packed step does B times (each sequence's attention) where one does it once.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gpt2np and bench from this checkout
import gpt2np  # noqa: E402  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)
import numpy as np  # noqa: E402
from gpt2np.decoding.batched import batch_stream  # noqa: E402
from gpt2np import set_weights_order  # noqa: E402
from gpt2np.report import DefaultsHelpFormatter, OneLineErrorParser, seed_error  # noqa: E402
from gpt2np.model.batch import cached_attention, forward_packed  # noqa: E402
from gpt2np.model.fast.layout import conv1d_weights  # noqa: E402
from gpt2np.model.fast.layout import fitting  # noqa: E402
from gpt2np.model.fast.matmul import batch_layout, loaded_layout, matmul, weight_shape  # noqa: E402
from bench.common import lockstep  # noqa: E402


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


class Together:
    """A lockstep side (--lockstep): generate_batch, one packed step per step(); its seconds, the first step's
    apart (the packed prefill, which gives every sequence its first token)."""

    def __init__(self, model, prompts, n_tokens):
        self.steps, self.emitted, self.first, self.total = batch_stream(model, prompts, n_tokens), 0, 0.0, 0.0
        self.outputs = None

    def step(self):  # -> False once every sequence has ended
        start = time.perf_counter()
        try:
            events = next(self.steps)
        except StopIteration as done:
            self.outputs = done.value
            return False
        seconds = time.perf_counter() - start
        self.first += seconds if self.emitted == 0 else 0.0
        self.total += seconds
        self.emitted += len(events)
        return True


class Alone:
    """A lockstep side (--lockstep): the same prompts one at a time (plain_stream each), one step of the
    sequence with the fewest tokens per step() (its prompt's prefill, its first token, the first time)."""

    def __init__(self, model, prompts, n_tokens):
        self.streams = [gpt2np.plain_stream(model, prompt, n_tokens) for prompt in prompts]
        self.emitted, self.first, self.total = 0, 0.0, 0.0

    def step(self):  # -> False once every sequence has ended
        for stream in sorted((s for s in self.streams if not s.done), key=lambda s: len(s.tokens)):
            start, fresh = time.perf_counter(), not stream.tokens
            try:
                next(stream)
            except StopIteration:
                continue  # that one has ended (an untimed check): the next one steps instead
            seconds = time.perf_counter() - start
            self.first += seconds if fresh else 0.0
            self.total += seconds
            self.emitted += 1
            return True
        return False


def measure_in_lockstep(models, batch, context, n_tokens, repeats, rng):  # -> {"together": [...], "alone": [...]}
    """measure's results, each repeat's two sides in lockstep (module docstring); models: step_models'."""
    prompts = [rng.integers(0, models["alone"].n_vocab, context).tolist() for _ in range(batch)]
    together(models["together"], prompts[:1], 2), alone(models["alone"], prompts[:1], 2)  # first calls, BLAS threads
    results = {"together": [], "alone": []}
    for repeat in range(repeats):
        sides = {"together": Together(models["together"], prompts, n_tokens),
                 "alone": Alone(models["alone"], prompts, n_tokens)}
        lockstep(list(sides.values()) if repeat % 2 == 0 else list(sides.values())[::-1])  # who goes first alternates
        for name, side in sides.items():
            results[name].append((side.total, side.total - side.first, side.emitted, side.emitted - batch))
    return results


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


def prefilled(model, prompts):  # -> one cache per prompt, the prompt fed, room for one more token
    caches = [model.new_cache(n_ctx=len(prompt) + 1) for prompt in prompts]
    for prompt, cache in zip(prompts, caches):
        model.forward(prompt, cache)
    return caches


def packed_step(model, caches, token):  # -> each sequence's greedy pick; one pass for all, caches put back
    picks = [int(np.argmax(logits[-1])) for logits in forward_packed(model, [([token], cache) for cache in caches])]
    for cache in caches:
        cache.truncate(len(cache) - 1)
    return picks


def steps_one_at_a_time(model, caches, token):  # -> the same picks, one forward call per sequence
    picks = []
    for cache in caches:
        picks.append(int(np.argmax(model.forward([token], cache)[-1])))
        cache.truncate(len(cache) - 1)
    return picks


def step_models(model, orders):  # -> {"together": model in its order, "alone": model in its order}
    """The two sides' models for --step-pairs and --anatomy: one model where the orders agree, else a second
    random model of the same config and seed (the same weights) for the packed side, each in its order."""
    models = {name: model for name in orders}
    if orders["together"] != orders["alone"]:
        models["together"] = gpt2np.random_model(model.config, tokenizer=None)  # random_model's seed 0, as main's
    for name, order in orders.items():
        set_weights_order(models[name], order)
    return models


def step_ratios(models, batch, context, pairs, rng):  # -> [B x one-at-a-time step seconds / packed step seconds]
    """The decode step alone (module docstring, --step-pairs): models {"together": ..., "alone": ...}."""
    prompts = [rng.integers(0, models["alone"].n_vocab, context) for _ in range(batch)]
    caches = {name: prefilled(model, prompts) for name, model in models.items()}
    token = int(prompts[0][-1])
    steps = {"together": lambda: packed_step(models["together"], caches["together"], token),
             "alone": lambda: steps_one_at_a_time(models["alone"], caches["alone"], token)}
    for step in steps.values():  # first calls, BLAS threads
        step()
    seconds = {name: [] for name in steps}
    for pair in range(pairs):
        for name in (("together", "alone") if pair % 2 == 0 else ("alone", "together")):
            start = time.perf_counter()
            steps[name]()
            seconds[name].append(time.perf_counter() - start)
    return [alone / together for together, alone in zip(seconds["together"], seconds["alone"])]


def anatomy(models, batch, context, rounds, rng):  # -> {part: median seconds}
    """The parts of a packed step of B sequences ("together") and one sequence's step ("alone"), --anatomy."""
    prompts = [rng.integers(0, models["alone"].n_vocab, context) for _ in range(batch)]
    caches = {"together": prefilled(models["together"], prompts), "alone": prefilled(models["alone"], prompts[:1])}
    token, config = int(prompts[0][-1]), models["alone"].config
    q = rng.standard_normal((config.n_head, 1, config.d_head), dtype=np.float32)  # [n_head, 1, d_head]

    def products(name, n_rows):  # every weight product of a step over n_rows rows
        params = models[name].params
        weights = [node[key] for node, key in conv1d_weights(params)] + [params["wte"].T]
        xs = {k: rng.standard_normal((n_rows, k), dtype=np.float32)                    # [n_rows, k] per k
              for k in {weight_shape(w)[0] for w in weights}}
        return lambda: [matmul(xs[weight_shape(w)[0]], w) for w in weights]

    def attention(name):  # every layer's attention of one new row per sequence (written past the caches' lengths)
        return lambda: [cached_attention(q, q, q, cache, layer) for layer in range(config.n_layer)
                        for cache in caches[name]]
    parts = {"together step": lambda: packed_step(models["together"], caches["together"], token),
             "alone step": lambda: steps_one_at_a_time(models["alone"], caches["alone"], token),
             "together products": products("together", batch), "alone products": products("alone", 1),
             "together attention": attention("together"), "alone attention": attention("alone")}
    for part in parts.values():  # first calls
        part()
    seconds = {name: [] for name in parts}
    for r in range(rounds):
        for name in (list(parts) if r % 2 == 0 else list(parts)[::-1]):
            start = time.perf_counter()
            parts[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def anatomy_row(size, batch, part):  # one markdown table row; ms, and the packed side in one-sequence steps
    t1, tb = part["alone step"], part["together step"]
    rest = {name: part[f"{name} step"] - part[f"{name} products"] - part[f"{name} attention"]
            for name in ("together", "alone")}
    as_one = tb - part["together attention"] - rest["together"] + part["alone attention"] + rest["alone"]
    return (f"| {size} | {batch} | {t1 * 1e3:.1f} | {tb * 1e3:.1f} ({tb / t1:.2f}) | "
            f"{part['alone products'] * 1e3:.1f} → {part['together products'] * 1e3:.1f} "
            f"(v {part['together products'] / part['alone products']:.2f}) | "
            f"{part['alone attention'] * 1e3:.1f} → {part['together attention'] * 1e3:.1f} | "
            f"{rest['alone'] * 1e3:.1f} → {rest['together'] * 1e3:.1f} | **{batch * t1 / tb:.2f}×** | "
            f"{batch * t1 / as_one:.2f}× |")


def step_row(size, batch, ratios):  # one markdown table row
    q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"| {size} | {batch} | {len(ratios)} | **{q2:.2f}×** ({q1:.2f}–{q3:.2f}) |"


def integers(text):  # "1,2,4" -> [1, 2, 4]; argparse turns a ValueError into a one-line usage error
    return [int(b) for b in text.split(",")]


def check_args(args, sizes):  # -> the first problem, naming its flag as typed, or None; before any work
    unknown = [s for s in sizes if s not in gpt2np.PRESETS]
    if unknown:
        return f"--sizes {args.sizes}: {unknown[0]!r} is not one of {', '.join(sorted(gpt2np.PRESETS))}"
    if min(args.batches) < 1:
        return f"--batches must be integers >= 1, got {','.join(map(str, args.batches))}"
    for flag in ("context", "n_tokens", "repeats") + (("threads",) if args.threads is not None else ()):
        if getattr(args, flag) < 1:
            return f"--{flag} must be at least 1, got {getattr(args, flag)}"
    if message := seed_error(args.seed):  # np.random.default_rng's ValueError, in a traceback
        return message
    for flag in ("step_pairs", "anatomy"):
        if getattr(args, flag) < 0:
            return f"--{flag.replace('_', '-')} must be at least 0, got {getattr(args, flag)}"
    for size in sizes:
        n_ctx = gpt2np.PRESETS[size].n_ctx
        if args.context + args.n_tokens > n_ctx:
            return (f"--context {args.context} + --n_tokens {args.n_tokens} exceeds the context of {size}, "
                    f"{n_ctx} tokens")
    return None


def main(argv=None):
    parser = OneLineErrorParser(prog="python tools/batch_bench.py", description=__doc__.splitlines()[0],
                                formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--sizes", default="124M,355M", help="gpt2np.PRESETS names, comma-separated (random weights)")
    parser.add_argument("--batches", default="1,2,4,8", type=integers, help="batch sizes B, comma-separated")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--n_tokens", type=int, default=16, help="new tokens per sequence")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts' np.random.Generator")
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: the BLAS default)")
    parser.add_argument("--step-pairs", type=int, default=0,
                        help="also alternate this many single decode steps, packed against one at a time (0: none)")
    parser.add_argument("--anatomy", type=int, default=0,
                        help="also take a decode step apart, this many alternating rounds (0: not)")
    parser.add_argument("--lockstep", action=argparse.BooleanOptionalAction, default=True,
                        help="run a repeat's two sides in lockstep, a step at a time (--no-lockstep: back to back)")
    parser.add_argument("--together-order", choices=("batches", "stored"), default="batches",
                        help="the weights' order for the packed runs: the one batches want under this BLAS kernel "
                             "(as the server with --max_batch above 1), or as stored")
    args = parser.parse_args(argv)
    sizes, batches = args.sizes.split(","), args.batches
    problem = check_args(args, sizes)
    if problem:
        parser.error(problem)
    if args.threads is not None:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=args.threads, user_api="blas")
    loaded = loaded_layout()  # every GPT-2 size's n_embd cuts into panels
    orders = {"together": batch_layout() if args.together_order == "batches" else loaded, "alone": loaded}
    print(f"{gpt2np.blas_kernel()}; context {args.context}, {args.n_tokens} new tokens per sequence, greedy, "
          f"{args.repeats} repeats{' in lockstep' if args.lockstep else ', back to back, alternating'}; "
          f"weights {orders['together']} together, {orders['alone']} alone")
    print("| size | B | alone tok/s | together tok/s | ratio (range) | alone decode tok/s | together decode "
          "tok/s | decode ratio (range) |\n|" + " --- |" * 8)
    rng = np.random.default_rng(args.seed)
    steps, parts = [], []  # (size, batch, ratios), (size, batch, {part: seconds})
    for size in sizes:
        model = gpt2np.random_model(gpt2np.PRESETS[size], tokenizer=None)
        fitted = {name: fitting(order, model) for name, order in orders.items()}  # tiny's 16 wide: no panels
        if fitted != orders:
            print(f"| ({size}: n_embd {model.config.n_embd} does not cut into panels: weights {fitted['together']} "
                  f"together, {fitted['alone']} alone) |" + " |" * 7)
        models = step_models(model, fitted) if args.lockstep else None  # each side's model in its order
        for batch in batches:
            results = measure_in_lockstep(models, batch, args.context, args.n_tokens, args.repeats, rng) \
                if args.lockstep else measure(model, batch, args.context, args.n_tokens, args.repeats, rng, fitted)
            print(summary_row(size, batch, results), flush=True)
        if args.step_pairs or args.anatomy:
            models = models or step_models(model, fitted)  # back to back, measure left model in either order
            steps += [(size, batch, step_ratios(models, batch, args.context, args.step_pairs, rng))
                      for batch in batches if args.step_pairs]
            parts += [(size, batch, anatomy(models, batch, args.context, args.anatomy, rng))
                      for batch in batches if args.anatomy]
        del model, models
    if steps:
        print(f"\nThe decode step alone, at context {args.context}: B sequences' steps one at a time over one packed "
              f"step, {args.step_pairs} adjacent pairs\n| size | B | pairs | ratio, median (quartiles) |\n|"
              + " --- |" * 4)
        for size, batch, ratios in steps:
            print(step_row(size, batch, ratios), flush=True)
    if parts:
        print(f"\nA decode step taken apart, at context {args.context}, {args.anatomy} alternating rounds, medians in "
              f"ms: one sequence's step → the packed step of B\n| size | B | one sequence's step | packed step "
              f"(in one sequence's steps) | products (v(B)) | attention | the rest | B x step ratio | with "
              f"attention and rest as one sequence's |\n|" + " --- |" * 9)
        for size, batch, part in parts:
            print(anatomy_row(size, batch, part), flush=True)


if __name__ == "__main__":
    main()
