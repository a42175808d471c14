"""python -m gpt2np.latency TARGET [DRAFT]: ms per token over a fixed set of prompts, with 95 % intervals.

    python -m gpt2np.latency shakespeare-2.6M                        # offline: target-only latency
    python -m gpt2np.latency shakespeare-2.6M shakespeare-260K       # + speculative latency and speedup
    python -m gpt2np.latency 1558M 124M --n_tokens 64 --json latency.json

llama-ssp's timing mode (`python llamassp.py TARGET [DRAFT]`): PROMPTS, 15 one-sentence prompts
written for this command, each continued by --n_tokens tokens after one untimed warm-up prompt;
the latency of a run is its seconds / its tokens, in ms/token (lower is better). Per prompt it
prints the target-only latency and, with a draft, the speculative latency of the same prompt with
the same seed; then the mean over prompts with a 95 % confidence interval (Student's t over the
prompts), and the speedup: the geometric mean of the per-prompt ratios target / speculative, its
interval a t-interval on their logarithms (paired: each ratio compares two runs of one prompt,
so the prompts' own differences in difficulty cancel). An interval says how much the numbers
would move on another set of prompts like these; it does not cover a busier or quieter machine.
Outer ring: imports only gpt2np's public API and report.py.
"""
import json
import math
import time

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/model/fast)
import numpy as np
from threadpoolctl import threadpool_limits

from gpt2np.report import (OneLineErrorParser, add_loading_flags, by_position, check_json_path, check_model_names,
                           check_tokenizer, drafter_errors, run_command, seed_error, target_help, write_flag_file)

WARMUP_PROMPT = "Before the bakery opened, the street smelled of bread and rain, and"
PROMPTS = (  # written for this command: ordinary sentences, cut where a continuation is natural
    "The lighthouse keeper wrote in his log that the fog had lifted just before",
    "When the river froze that winter, the children of the village learned to",
    "Our new kitchen timer beeps three times, waits a moment, and then",
    "She opened the old piano and found, tucked between the strings, a letter that",
    "The committee met on Tuesday to decide whether the footbridge should be",
    "Every morning the cat sits on the windowsill and watches the",
    "To make a good pot of tea, first warm the pot, then",
    "The train to the coast was late again, so the passengers",
    "In the margin of the library book, someone had drawn a small map of",
    "After three days of walking through the hills, the travellers finally saw",
    "The recipe asks for two eggs, a cup of flour and a pinch of",
    "My grandfather kept every letter he ever received in a wooden box under",
    "The storm knocked out the power, so we lit candles and told stories about",
    "At the end of the market day, the fishmonger gave the last of his catch to",
    "The teacher asked the class to describe, in one sentence, what they would do if",
)


def parse_args(argv):
    p = OneLineErrorParser(prog="python -m gpt2np.latency", description=__doc__.split("\n")[0])
    p.add_argument("target", help=target_help())
    p.add_argument("draft", nargs="?", default=None,
                   help="drafter: a model named like the target, or 'ngram'; omit for target-only latency")
    p.add_argument("--n_tokens", type=int, default=64, help="new tokens per prompt (default: 64, llama-ssp's)")
    p.add_argument("--K", default=None, help="draft tokens per round, or 'heuristic' / 'auto' (default: 4)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 means greedy (default)")
    p.add_argument("--seed", type=int, default=0,
                   help="prompt i samples from np.random.default_rng([seed, i]) (default: %(default)s)")
    add_loading_flags(p)
    p.add_argument("--json", metavar="PATH", default=None, help="also write every measurement to PATH (default: none)")
    return p.parse_args(argv)


def check_args(args):
    """Every flag's range, before anything loads (one-line ValueError)."""
    check_model_names(args, str.upper, ("target", "draft"))  # "" would read the current folder
    if args.n_tokens < 1:
        raise ValueError(f"--n_tokens must be at least 1, got {args.n_tokens}")
    if message := seed_error(args.seed):
        raise ValueError(message)
    if args.draft is None and args.K is not None:
        raise ValueError("--K needs a drafter: name a DRAFT after the TARGET")
    typed = args.K or "4"
    args.K = typed if typed in gpt2np.POLICIES[1:] else int(typed) if typed.lstrip("-").isdigit() else typed
    try:
        gpt2np.make_policy(args.K)
    except ValueError:  # its words name K, not the flag as typed
        raise ValueError(f"--K must be an integer >= 1, 'heuristic' or 'auto', got {typed!r}") from None
    gpt2np.check_sampling_options(args.temperature)
    if args.json:
        check_json_path(args.json, example="latency.json")






# ---- the statistics ----------------------------------------------------------------------------

def t_quantile(p, df):
    """Student's t quantile, without scipy: with T = sqrt(df) tan(theta), theta has density
    proportional to cos(theta)^(df - 1) on (-pi/2, pi/2), smooth and bounded, so its CDF is an
    accurate cumulative sum on a fine grid, and inverting it is an interpolation (p >= 0.5)."""
    theta = np.linspace(0.0, np.pi / 2, 200_001)  # [n] grid on [0, pi/2]
    density = np.cos(theta) ** (df - 1)
    mass = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2)])  # trapezoid rule
    return math.sqrt(df) * math.tan(np.interp(2 * p - 1, mass / mass[-1], theta))


def mean_interval(values, level=0.95):
    """(mean, low, high): the mean with its t-interval (the values: one per prompt)."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    half = t_quantile((1 + level) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def ratio_interval(numerators, denominators, level=0.95):
    """(geometric mean, low, high) of the paired ratios numerator_i / denominator_i: a t-interval on logs."""
    mean, low, high = mean_interval(np.log(np.asarray(numerators) / np.asarray(denominators)), level)
    return math.exp(mean), math.exp(low), math.exp(high)


# ---- the runs ----------------------------------------------------------------------------------

def load(args):
    """(target, drafter or None); BLAS threads set for the target's width."""
    sources = dict(base_url=args.mirror, hf_endpoint=args.hf_endpoint)
    check_tokenizer(args.target, args.models_dir, "to encode the prompts with")  # before the weights are built
    target = gpt2np.load_model(args.target, args.models_dir, **sources)
    drafter = None
    if args.draft is not None:
        with drafter_errors(none=False):  # an unknown name's error lists ngram (target-only: DRAFT left out)
            drafter = gpt2np.load_drafter(args.draft, args.models_dir, target=target, **sources)  # the same vocabulary
    if target.config.n_embd < 512:  # small products: one thread is faster (main.py's rule)
        threadpool_limits(limits=1, user_api="blas")
    return target, drafter


def streams(args, target, drafter, prompt_ids, i):
    """{"target": plain stream, "speculative": ... (with a drafter)}, the same seed for both: paired."""
    rng = lambda: np.random.default_rng([args.seed, i])  # noqa: E731
    runs = {"target": gpt2np.plain_stream(target, prompt_ids, args.n_tokens, temperature=args.temperature, rng=rng())}
    if drafter is not None:
        runs["speculative"] = gpt2np.speculative_stream(target, drafter, prompt_ids, args.n_tokens, args.K,
                                                        temperature=args.temperature, rng=rng())
    return runs


def timed(stream):
    """(tokens, seconds) of one run, timed around it."""
    start = time.perf_counter()
    stream.run()
    return stream.tokens, time.perf_counter() - start


def open_all(args, target, drafter):
    """The streams of the warm-up prompt, then of every prompt: every check runs here, no work yet."""
    encoded = [target.tokenizer.encode(p) for p in (WARMUP_PROMPT, *PROMPTS)]
    models = [target] + ([drafter.model] if hasattr(drafter, "model") else [])
    n_ctx, longest = min(m.n_ctx for m in models), max(map(len, encoded))
    if args.n_tokens > n_ctx - longest:  # the prompts are fixed: say the largest --n_tokens that fits
        raise ValueError(f"--n_tokens {args.n_tokens} does not fit: the longest prompt ({longest} tokens) leaves "
                         f"room for at most {n_ctx - longest} new tokens in the context of {n_ctx}")
    return [streams(args, target, drafter, ids, i) for i, ids in enumerate(encoded)]


def measure(opened):
    """One row per prompt: {"prompt", "<run>_tokens", "<run>_ms", ...}; the warm-up prompt first, untimed."""
    for stream in opened[0].values():
        stream.run()
    rows = []
    for prompt, runs in zip(PROMPTS, opened[1:]):
        row = {"prompt": prompt}
        for name, stream in runs.items():
            tokens, seconds = timed(stream)
            row |= {f"{name}_tokens": len(tokens), f"{name}_seconds": seconds,
                    f"{name}_ms": 1000 * seconds / len(tokens)}
            if name == "speculative":
                stats = stream.result.stats
                row |= {"tokens_per_call": stats.tokens_per_target_call,
                        "by_position": [list(c) for c in getattr(stats, "by_position", ())]}  # (proposed, examined, accepted)
        rows.append(row)
    return rows


# ---- the report --------------------------------------------------------------------------------

def table(rows, width=44):
    """Per prompt: its start, tokens, ms/token of each run and, with a draft, the speedup."""
    spec = "speculative_ms" in rows[0]
    head = f" #  {'prompt':<{width}}  tokens  target ms/token" + "  speculative ms/token  speedup  tokens/call" * spec
    lines = [head]
    for i, r in enumerate(rows, 1):
        text = r["prompt"] if len(r["prompt"]) <= width else r["prompt"][:width - 3] + "..."
        line = f"{i:>2}  {text:<{width}}  {r['target_tokens']:>6}  {r['target_ms']:>15.3f}"
        if spec:
            line += (f"  {r['speculative_ms']:>20.3f}  {r['target_ms'] / r['speculative_ms']:>6.2f}x"
                     f"  {r['tokens_per_call']:>11.2f}")
        lines.append(line)
    return "\n".join(lines)


def summary(rows):
    """{"target": (mean, low, high), ...}: ms/token over prompts; "speedup": the paired ratios'."""
    out = {name: mean_interval([r[f"{name}_ms"] for r in rows]) for name in ("target", "speculative")
           if f"{name}_ms" in rows[0]}
    if "speculative" in out:
        out["speedup"] = ratio_interval([r["target_ms"] for r in rows], [r["speculative_ms"] for r in rows])
    return out


def summary_lines(rows, intervals):
    """The totals: each run's mean ms/token with its interval and its total; the speedup with its interval."""
    n, lines = len(rows), []
    for name, label in (("target", "target-only"), ("speculative", "speculative")):
        if name in intervals:
            mean, low, high = intervals[name]
            tokens, seconds = sum(r[f"{name}_tokens"] for r in rows), sum(r[f"{name}_seconds"] for r in rows)
            lines.append(f"{label}: {mean:.3f} ms/token, 95% CI {low:.3f} - {high:.3f} (mean over {n} prompts, "
                         f"t-interval); total {tokens} tokens in {seconds:.3f} s = {1000 * seconds / tokens:.3f} ms/token")
    if "speedup" in intervals:
        mean, low, high = intervals["speedup"]
        lines.append(f"speedup: {mean:.2f}x, 95% CI {low:.2f}x - {high:.2f}x (geometric mean of {n} paired "
                     "per-prompt ratios target / speculative, t-interval on their logarithms)")
        counts = summed_positions(rows)
        lines.append(f"accepted by draft position (i: accepted / proposed): {by_position(counts) or 'no drafts'}")
    return "\n".join(lines)


def summed_positions(rows):  # -> [(proposed, examined, accepted) per draft position], over every prompt
    longest = max(len(r["by_position"]) for r in rows)
    return [tuple(sum(r["by_position"][i][j] for r in rows if len(r["by_position"]) > i) for j in range(3))
            for i in range(longest)]


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    target, drafter = load(args)
    opened = open_all(args, target, drafter)
    drafted = f", drafter {drafter.name}, K {args.K}" if drafter else ""
    print(f"target {target.name}{drafted}: {len(PROMPTS)} prompts after 1 warm-up, {args.n_tokens} new tokens each, "
          f"temperature {args.temperature:g}, seed {args.seed}; BLAS: {gpt2np.blas_kernel()}", flush=True)
    rows = measure(opened)
    intervals = summary(rows)
    print(table(rows))
    print(summary_lines(rows, intervals))
    if args.json:
        record = {"target": target.name, "drafter": drafter.name if drafter else None, "K": args.K,
                  "n_tokens": args.n_tokens, "temperature": args.temperature, "seed": args.seed,
                  "blas": gpt2np.blas_kernel(), "prompts": rows,
                  "intervals": {k: dict(zip(("mean", "low", "high"), v)) for k, v in intervals.items()}}
        write_json_atomically(args.json, record)


def run(main=main):
    """main() as a command (report.run_command: one-line errors naming this command's flags, status 2)."""
    run_command(main)


def write_json_atomically(path, record):
    """record as JSON, written whole or not at all (report.write_atomically); a failed write names --json."""
    write_flag_file("--json", path, json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    run()

