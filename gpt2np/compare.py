"""python -m gpt2np.compare TARGET DRAFT: target-only and speculative decoding of one prompt, side by side.

    python -m gpt2np.compare shakespeare-2.6M shakespeare-260K          # offline: the bundled pair
    python -m gpt2np.compare 355M 124M --prompt "Alan Turing theorized that" --n_tokens 60
    python -m gpt2np.compare 355M ngram --K auto                         # prompt lookup as the drafter

llama-ssp's "compare" mode (`python llamassp.py compare 30B 7B`): the same prompt continued by
the target alone and speculatively, shown as they are written. On a terminal the two texts grow
in two columns, each headed by its tokens and tokens/s; into a pipe or a file both texts are
printed at the end. Either way it ends with a table of both runs (tokens, seconds, tokens/s,
speedup) and the speculative run's statistics (report.stats_summary).

Two decoders cannot share this machine's cores without slowing each other, so they take turns,
one round at a time, and each is timed on its own clock (the sum of its rounds' seconds, as the
decoders measure them): the one whose clock is behind goes next. So at every moment the columns
show what each had written after the same amount of its own decoding time; a race, replayed
fairly. The wall time is the two runs' sum. Both first run WARMUP_TOKENS untimed tokens.
Outer ring: imports only gpt2np's public API and report.py.
"""
import json
import os
import shutil
import sys
import time
from dataclasses import asdict

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/model/fast)
import numpy as np
from threadpoolctl import threadpool_limits

from gpt2np.report import (K_from_text, OneLineErrorParser, TokenTexts, add_loading_flags, by_position, check_json_path,
                           check_model_names, check_tokenizer, colour_allowed, coloured, drafter_errors,
                           provenance_legend, run_command, seed_error, stats_summary, target_help, write_flag_file)

DEFAULT_PROMPT = "The night train left the city a little after ten, and"  # written for this command
WARMUP_TOKENS = 16   # untimed first: the first calls of each size pay one-time costs (threads, buffers)
REDRAW_SECONDS = 0.04  # the live columns are redrawn at most this often


def parse_args(argv):
    p = OneLineErrorParser(prog="python -m gpt2np.compare", description=__doc__.split("\n")[0])
    p.add_argument("target", help=target_help())
    p.add_argument("draft", help="drafter: a model named like the target, or 'ngram' (prompt lookup)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to continue (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--n_tokens", type=int, default=100, help="new tokens per run (default: 100)")
    p.add_argument("--K", default="4", help="draft tokens per round, or a K policy: 'heuristic' or 'auto' (default: 4)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 means greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of each run's np.random.Generator (default: 0)")
    add_loading_flags(p)
    p.add_argument("--json", metavar="PATH", default=None, help="also write the runs and statistics to PATH (default: none)")
    return p.parse_args(argv)


def K_value(text):
    """--K: a policy name as is, else an integer (make_policy checks the range)."""
    try:
        return K_from_text(text)
    except ValueError:
        raise ValueError(f"--K must be an integer >= 1, 'heuristic' or 'auto', got {text!r}") from None


def check_args(args):
    """Every flag's range, before anything loads (one-line ValueError)."""
    check_model_names(args, str.upper, ("target", "draft"))  # "" would read the current folder
    if args.n_tokens < 1:
        raise ValueError(f"--n_tokens must be at least 1, got {args.n_tokens}")
    if message := seed_error(args.seed):
        raise ValueError(message)
    typed, args.K = args.K, K_value(args.K)
    try:
        gpt2np.make_policy(args.K)
    except ValueError:  # its words name K, not the flag as typed
        raise ValueError(f"--K must be an integer >= 1, 'heuristic' or 'auto', got {typed!r}") from None
    gpt2np.check_sampling_options(args.temperature)
    if args.json:
        check_json_path(args.json, example="compare.json")






def load_pair(args):
    """(target, drafter), their vocabularies checked, BLAS threads set for the target's width."""
    sources = dict(base_url=args.mirror, hf_endpoint=args.hf_endpoint)
    check_tokenizer(args.target, args.models_dir, "to encode the prompt with")  # before the weights are built
    target = gpt2np.load_model(args.target, args.models_dir, **sources)
    with drafter_errors(none=False):  # an unknown name's error lists ngram (none is no choice: nothing to race)
        drafter = gpt2np.load_drafter(args.draft, args.models_dir, target=target, **sources)  # the same vocabulary
    if target.config.n_embd < 512:  # small products: one thread is faster (main.py's rule)
        threadpool_limits(limits=1, user_api="blas")
    return target, drafter


class Lane:
    """One decoder in the race: its stream, its text so far, its own clock."""

    def __init__(self, label, stream, tokenizer, prompt):
        self.label, self.stream, self.texts = label, stream, TokenTexts(tokenizer)
        self.text, self.pieces, self.tail, self.seconds, self.done = prompt, [], "", 0.0, False

    def step(self):
        """Run one round (or notice the end)."""
        try:
            event = next(self.stream)
        except StopIteration:
            self.done, self.tail = True, self.texts.flush()  # an unfinished character at the very end
            self.text += self.tail
            return
        self.seconds += event.seconds
        self.pieces += self.texts.pieces(event.tokens)
        self.text += "".join(self.pieces[-len(event.tokens):])

    @property
    def tokens_per_second(self):
        return len(self.stream.tokens) / self.seconds if self.seconds > 0 else 0.0


def race(lanes, on_step=lambda lanes: None):
    """Step the unfinished lane whose clock is behind, one round at a time, until all are done."""
    while not all(lane.done for lane in lanes):
        min((lane for lane in lanes if not lane.done), key=lambda lane: lane.seconds).step()
        on_step(lanes)


def screen_rows(text, width):
    """text cut into rows of at most width characters (newlines start rows; control characters shown as '.')."""
    rows = []
    for line in "".join(c if c == "\n" or c.isprintable() else "." for c in text).split("\n"):
        rows += [line[i:i + width] for i in range(0, len(line), width)] or [""]
    return rows


def side_by_side(lanes, width, height):
    """The live block: a header per lane, then the last rows of each text (at most height), two columns."""
    column = max((width - 3) // 2, 10)
    heads = [f"{lane.label}: {len(lane.stream.tokens)} tokens, {lane.tokens_per_second:.0f} tokens/s"[:column]
             for lane in lanes]
    bodies = [screen_rows(lane.text, column)[-height:] for lane in lanes]
    height = max(len(body) for body in bodies)  # the block grows with the texts, up to height
    bodies = [body + [""] * (height - len(body)) for body in bodies]
    rows = [heads, ["-" * column] * len(lanes), *zip(*bodies)]
    return [" | ".join(f"{cell:<{column}}" for cell in row).rstrip() for row in rows]


class LiveBlock:
    """The side-by-side block on a terminal, redrawn in place with ANSI cursor moves."""

    def __init__(self, out):
        size = shutil.get_terminal_size()
        self.out, self.width, self.height = out, size.columns, max(3, min(16, size.lines - 6))
        self.n_drawn, self.last = 0, 0.0

    def draw(self, lanes, force=False):
        if not force and time.perf_counter() - self.last < REDRAW_SECONDS:
            return
        lines = side_by_side(lanes, self.width, self.height)
        up = f"\033[{self.n_drawn}F" if self.n_drawn else ""  # back to the block's first line
        self.out.write(up + "".join(line + "\033[K\n" for line in lines))
        self.out.flush()
        self.n_drawn, self.last = len(lines), time.perf_counter()

    def erase(self):
        if self.n_drawn:
            self.out.write(f"\033[{self.n_drawn}F\033[J")
            self.out.flush()


def open_lanes(args, target, drafter, prompt_ids, n_tokens):
    """Target-only and speculative streams of the same prompt, each with its own default_rng(seed)."""
    rng = lambda: np.random.default_rng(args.seed)  # noqa: E731
    plain = gpt2np.plain_stream(target, prompt_ids, n_tokens, temperature=args.temperature, rng=rng())
    speculative = gpt2np.speculative_stream(target, drafter, prompt_ids, n_tokens, args.K, temperature=args.temperature,
                                            rng=rng(), calibrate=True)  # c and v are in the statistics
    return [Lane("target-only", plain, target.tokenizer, args.prompt),
            Lane("speculative", speculative, target.tokenizer, args.prompt)]


def results_table(lanes):
    """Both runs: tokens, seconds, tokens/s, and the speedup over target-only."""
    base = lanes[0].tokens_per_second
    lines = ["generator    tokens  seconds  tokens/s  speedup"]
    for lane in lanes:
        speedup = lane.tokens_per_second / base if base else float("nan")
        lines.append(f"{lane.label:<11}  {len(lane.stream.tokens):>6}  {lane.seconds:>7.3f}  "
                     f"{lane.tokens_per_second:>8.1f}  {speedup:>6.2f}x")
    return "\n".join(lines)


def final_report(args, target, drafter, lanes, colour):
    """Both texts (the speculative one coloured by provenance on a terminal), the table, the statistics."""
    plain, spec = lanes
    stats = spec.stream.result.stats
    speedup = spec.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else None
    K = f"K={args.K}" if isinstance(args.K, int) else f"K {args.K}"
    same = ("same text (as it must be at temperature 0)" if plain.stream.tokens == spec.stream.tokens
            else "the texts DIFFER" if args.temperature == 0 else "texts differ (sampling: each is a sample)")
    return "\n".join([
        f"=== target-only ({target.name}) ===", plain.text,
        f"=== speculative ({target.name}, drafter {drafter.name}, {K}) ===",
        args.prompt + coloured(spec.pieces, spec.stream.provenance, colour) + spec.tail,
        *([provenance_legend(spec.stream.provenance, colour)] if colour else []),
        results_table(lanes), f"speculative: {stats_summary(stats, measured_speedup=speedup)}",
        f"accepted by draft position (i: accepted / proposed): {by_position(getattr(stats, 'by_position', ()))}",
        same])


def write_json(path, args, target, drafter, lanes):
    """The runs, the speedup and the statistics, for scripts."""
    runs = [{"label": lane.label, "tokens": [int(t) for t in lane.stream.tokens], "text": lane.text,
             "provenance": lane.stream.provenance, "seconds": lane.seconds,
             "tokens_per_second": lane.tokens_per_second} for lane in lanes]
    record = {"target": target.name, "drafter": drafter.name, "prompt": args.prompt, "n_tokens": args.n_tokens,
              "K": args.K, "temperature": args.temperature, "seed": args.seed, "blas": gpt2np.blas_kernel(),
              "runs": runs, "speedup": lanes[1].tokens_per_second / lanes[0].tokens_per_second,
              "stats": asdict(lanes[1].stream.result.stats)}
    write_json_atomically(path, record)


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    target, drafter = load_pair(args)
    prompt_ids = target.tokenizer.encode(args.prompt) or [target.eot_id]  # empty: start from <|endoftext|>
    lanes = open_lanes(args, target, drafter, prompt_ids, args.n_tokens)  # every check; no work yet
    for lane in open_lanes(args, target, drafter, prompt_ids, min(args.n_tokens, WARMUP_TOKENS)):
        lane.stream.run()  # the warm-up, untimed
    terminal = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"  # a dumb terminal moves no cursor
    print(f"target {target.name}, drafter {drafter.name}, prompt {len(prompt_ids)} tokens, {args.n_tokens} new, "
          f"temperature {args.temperature:g}, seed {args.seed}; BLAS: {gpt2np.blas_kernel()}")
    live = LiveBlock(sys.stdout) if terminal else None
    race(lanes, live.draw if live else lambda lanes: None)
    if live:
        live.draw(lanes, force=True)
        live.erase()
    print(final_report(args, target, drafter, lanes, colour_allowed(sys.stdout)))
    if args.json:
        write_json(args.json, args, target, drafter, lanes)


def run(main=main):
    """main() as a command (report.run_command: one-line errors naming this command's flags, status 2)."""
    run_command(main)


def write_json_atomically(path, record):
    """record as JSON, written whole or not at all (report.write_atomically); a failed write names --json."""
    write_flag_file("--json", path, json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    run()

