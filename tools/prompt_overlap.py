"""How well a prompt's overlaps predict a run's acceptance: what auto's PROMPT_WEIGHT rests on.

    python tools/prompt_overlap.py                       # the bundled pair, 30 prompts from each corpus text
    python tools/prompt_overlap.py --prompts 100 --tokens 200 --corpus ../shared/data/corpus/tinyshakespeare.txt

auto reads beta = sum_x min(p, q) at the prompt's last 16 positions before its first round (policies.AutoK,
5.), and counts each as PROMPT_WEIGHT of a position the run examines. A prompt is text a user wrote, not what
the target writes, so its positions say less. For each prompt (a random stretch of a corpus, 20-80
characters), this reads the prompt's overlaps as a run does (speculative.read_prompt), then runs
speculative decoding (K = 4) for --tokens tokens and takes alpha_hat, the mean beta over the positions the run
examined. Per corpus and temperature it prints the three means, the error (root mean square over prompts) of
the prompt's mean and of the run's own first 16 examined positions as estimates of the run's alpha_hat, and
their ratio squared: what a prompt position is worth against a position of the run (1: as much).

Needs the corpus texts beside the repository (../shared/data/corpus/*.txt) or --corpus FILE: they are
third-party and never committed here.
"""
import math
import sys
from types import SimpleNamespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # gpt2np from this checkout
import gpt2np  # noqa: E402  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)
import numpy as np  # noqa: E402

from gpt2np.decoding.drafters import ModelDrafter  # noqa: E402
from gpt2np.decoding.policies import PROMPT_POSITIONS  # noqa: E402
from gpt2np.decoding.speculative import read_prompt, speculative_generate  # noqa: E402
from gpt2np.decoding.stopwatch import TimedModel  # noqa: E402
from gpt2np.report import OneLineErrorParser  # noqa: E402

CORPUS_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"
MARGIN = 200  # a prompt starts at least this many characters before the text's end: a text needs more


def prompt_and_run(target, draft, ids, n_tokens, temperature, seed):  # -> (prompt's mean beta, run's alpha_hat,
    """The prompt's overlaps as auto reads them, and one run's overlaps (K = 4)."""     # its first 16's mean)
    options = dict(temperature=temperature, top_k=None, top_p=None)
    drafter = ModelDrafter(draft)
    drafter.reset(target)
    overlaps, _ = read_prompt(TimedModel(target), drafter, ids, options, SimpleNamespace(prompt_positions=PROMPT_POSITIONS))
    rng = np.random.default_rng(seed) if temperature else None
    run = speculative_generate(target, draft, ids, n_tokens, 4, temperature=temperature or None, rng=rng,
                               trace=True)
    examined = [b for event in run.trace for b in event.overlaps]
    return float(np.mean(overlaps)), float(np.mean(examined)), float(np.mean(examined[:PROMPT_POSITIONS]))


def draw_prompts(tokenizer, text, n_prompts, rng):  # -> [n_prompts] token id lists: random stretches of text
    prompts = []
    for _ in range(n_prompts):
        start, length = int(rng.integers(0, len(text) - MARGIN)), int(rng.integers(20, 80))
        prompts.append(tokenizer.encode(text[start:start + length]))
    return prompts


def measure(target, draft, prompts, n_tokens, temperature):  # -> [n_prompts, 3]
    return np.array([prompt_and_run(target, draft, ids, n_tokens, temperature, seed=i) for i, ids in enumerate(prompts)])


def summary(rows):  # [n, 3] -> the printed figures
    prompt, run, first = rows[:, 0], rows[:, 1], rows[:, 2]
    err_prompt = float(np.sqrt(np.mean((prompt - run) ** 2)))
    err_first = float(np.sqrt(np.mean((first - run) ** 2)))
    return {"prompt": float(prompt.mean()), "run": float(run.mean()), "first": float(first.mean()),
            "err_prompt": err_prompt, "err_first": err_first,
            "worth": (err_first / err_prompt) ** 2 if err_prompt else None}  # None: every prompt read its run exactly


def worth_text(worth):  # "n/a" where the prompt's error is 0 (a temperature so high that every overlap is 1)
    return "n/a" if worth is None else f"{worth:.2f}"


def main(argv=None):
    p = OneLineErrorParser(prog="python tools/prompt_overlap.py", description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=30, help="prompts per corpus text and temperature (default 30)")
    p.add_argument("--tokens", type=int, default=100, help="tokens each run decodes (default 100)")
    p.add_argument("--corpus", action="append", help="a text file to draw prompts from (repeatable; default: "
                   "every .txt in ../shared/data/corpus)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1; 0: greedy)")
    args = p.parse_args(argv)
    if args.prompts < 2 or args.tokens < PROMPT_POSITIONS:
        p.error(f"--prompts must be at least 2 and --tokens at least {PROMPT_POSITIONS}")
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        p.error(f"--temperatures must be numbers, got {args.temperatures!r}")
    if not all(0 <= t < math.inf for t in temperatures):  # nan, inf and negatives: numpy's ValueError, late
        p.error(f"--temperatures must be finite numbers >= 0 (0: greedy), got {args.temperatures!r}")
    files = [Path(f) for f in args.corpus] if args.corpus else sorted(CORPUS_DIR.glob("*.txt"))
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        p.error(f"no corpus text: {', '.join(missing) or CORPUS_DIR} (give one with --corpus FILE)")
    texts, named = {}, "--corpus" if args.corpus else "corpus text"
    for path in files:
        try:
            texts[path] = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            p.error(f"{named} {path}: cannot read it ({e.strerror or e})")
        if len(texts[path]) <= MARGIN:
            p.error(f"{named} {path}: {len(texts[path])} characters; prompts are drawn from texts of more than "
                    f"{MARGIN}")
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    prompts = {path: draw_prompts(target.tokenizer, text, args.prompts, np.random.default_rng(0))
               for path, text in texts.items()}  # each temperature's rows draw these same prompts (seed 0)
    n_ctx, longest = min(target.n_ctx, draft.n_ctx), max(len(ids) for each in prompts.values() for ids in each)
    if longest + args.tokens > n_ctx:
        p.error(f"--tokens {args.tokens} is too many: the longest prompt drawn has {longest} tokens and the pair's "
                f"context is {n_ctx}: at most {n_ctx - longest} here")
    print(f"bundled pair, {args.prompts} prompts of 20-80 characters per row, {args.tokens} tokens a run (K = 4); "
          f"the prompt's last {PROMPT_POSITIONS} positions")
    print("| corpus | T | prompt's beta | run's alpha_hat | run's first 16 | error: prompt | error: first 16 "
          "| a prompt position's worth |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in files:
        for temperature in temperatures:
            s = summary(measure(target, draft, prompts[path], args.tokens, temperature))
            print(f"| {path.name} | {temperature:g} | {s['prompt']:.3f} | {s['run']:.3f} | {s['first']:.3f} "
                  f"| {s['err_prompt']:.3f} | {s['err_first']:.3f} | {worth_text(s['worth'])} |")


if __name__ == "__main__":
    main()
