"""Section "batching": where drafting stops paying in a batch (plain vs fixed K vs auto K, tokens/s).

For each (draft, target) pair of random models (--batch-pairs, e.g. 124M,355M;124M,1558M), each batch
size B (--batch-sizes) and each forced acceptance rate alpha (--batch-alphas), greedy, every sequence
wanting --batch-tokens tokens after its own --batch-prompt-len-token random prompt:
  plain    gpt2np.generate_batch: one packed target pass per step, B rows
  K=k      gpt2np.speculative_generate_batch with every sequence drafting k a round (--batch-Ks)
  auto     the same with K="auto" (decoding/batch_policy.BatchAutoK, at most K_MAX a round): one K
           for the round's running sequences from the batch's measured costs, 0 where drafting
           cannot pay
Both models take the weights' order a batching server gives them under this BLAS kernel
(gpt2np.order_for_batches: row-major under the Haswell kernels, panels under SkylakeX, as stored elsewhere).
The draft is forced_batch_draft.ForcedBatchDraft around the pair's draft model: one packed pass of
the real draft per draft step (its cost), each sequence's proposals agreeing with the target's
greedy token with probability alpha (its acceptance rate), coins seeded by (repeat, sequence) and
the same for every side of a repeat. The speculative sides run through speculative_batch_stream,
the loop speculative_generate_batch drives, to count auto's K per round.

One repeat of a cell runs every side once, in one process. By default (--batch-lockstep) the sides
of a repeat decode together, a packed step or round at a time, the side whose sequences have emitted
the fewest tokens first (common.lockstep): the machine's drift within the repeat then slows every side
alike. With --no-batch-lockstep (the default before 2026-11-28) they run back to back, odd repeats in
the reverse order, so which side goes first alternates and a linear drift of the machine's speed
cancels over two repeats (a drift that is not linear lands on whichever side was running). tokens/s = all
of the batch's new tokens / the side's wall seconds (its own steps' only, in lockstep), prompt prefill
included (the same prompts for every side). Ratios are per repeat (sides timed side
by side), then the median over --batch-repeats. Every side's tokens must equal plain decoding's
(the reference run before the cell, which is also the warm-up): a mismatch is printed as an error
and makes `python -m bench` exit non-zero after writing the JSON (batching_report.py).
"""
import argparse
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field

import gpt2np
from gpt2np.model.config import PRESETS

from . import batching_report
from .batching_report import crossover, print_report, summarise_cell, targets
from .common import TINY_CONFIGS, add_section, blas_limits, lockstep, log, numbers, random_ids
from .forced_batch_draft import ForcedBatchDraft, packed_draft_calls

K_MAX = 8  # auto's bound, as speculative_generate_batch's default
exit_on_mismatch = batching_report.exit_on_mismatch  # python -m bench's last step, after the JSON is written


@dataclass(frozen=True)
class BatchPlan:
    """The knobs of the section; plan_from_args builds it from the --batch-* flags."""
    pairs: tuple = (("124M", "355M"),)  # (draft, target) sizes, random weights
    batch_sizes: tuple = (1, 2, 4, 8)   # B
    alphas: tuple = (0.5, 0.8)          # forced acceptance rates
    Ks: tuple = (1, 2, 4)               # the fixed Ks
    n_tokens: int = 32                  # new tokens per sequence
    prompt_len: int = 16                # each sequence's random prompt
    repeats: int = 3                    # repeats of every cell (median; order reversed on odd ones)
    lockstep: bool = False              # a repeat's sides decode in lockstep (common.lockstep), not back to back
    tiny: bool = False
    configs: dict = field(default_factory=lambda: dict(PRESETS), compare=False)

    def as_dict(self):
        return {"pairs": [list(p) for p in self.pairs], "batch_sizes": list(self.batch_sizes),
                "alphas": list(self.alphas), "Ks": list(self.Ks), "K_max": K_MAX, "n_tokens": self.n_tokens,
                "prompt_len": self.prompt_len, "repeats": self.repeats, "lockstep": self.lockstep, "tiny": self.tiny}


def add_arguments(ap):
    """The section's flags, on python -m bench's parser."""
    d = BatchPlan()
    ap.add_argument("--batch-pairs", default="124M,355M",
                    help="section batching: DRAFT,TARGET sizes, pairs separated by ';' (e.g. 124M,355M;124M,1558M)")
    ap.add_argument("--batch-sizes", default=",".join(map(str, d.batch_sizes)), help="section batching: batch sizes B")
    ap.add_argument("--batch-alphas", default=",".join(map(str, d.alphas)),
                    help="section batching: forced acceptance rates of the drafter")
    ap.add_argument("--batch-Ks", default=",".join(map(str, d.Ks)),
                    help="section batching: fixed Ks beside plain and auto")
    ap.add_argument("--batch-tokens", type=int, default=d.n_tokens, help="section batching: new tokens per sequence")
    ap.add_argument("--batch-prompt-len", type=int, default=d.prompt_len,
                    help="section batching: prompt tokens per sequence")
    ap.add_argument("--batch-repeats", type=int, default=d.repeats,
                    help="section batching: repeats of every cell (medians; the sides' order reversed every other one)")
    ap.add_argument("--batch-lockstep", action=argparse.BooleanOptionalAction, default=True,
                    help="section batching: a repeat's sides decode in lockstep, a packed step or round at a time, "
                         "the side furthest behind first (default: on; --no-batch-lockstep: back to back, the default "
                         "before 2026-11-28)")


def parse_pairs(text, configs):  # "124M,355M;124M,1558M" -> (("124M", "355M"), ("124M", "1558M"))
    pairs = tuple(tuple(s.strip() for s in pair.split(",")) for pair in text.split(";") if pair.strip())
    if not pairs or any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--batch-pairs: DRAFT,TARGET pairs separated by ';', got {text!r}")
    unknown = sorted({s for p in pairs for s in p} - set(configs))
    if unknown:
        raise SystemExit(f"--batch-pairs: unknown size(s) {', '.join(unknown)}: choose from {', '.join(configs)}")
    return pairs


def check_plan(plan):
    """One-line SystemExits for values the runs cannot take."""
    if not all(1 <= B <= 64 for B in plan.batch_sizes):
        raise SystemExit(f"--batch-sizes must lie in 1..64, got {plan.batch_sizes}")
    if not all(0 <= a <= 1 for a in plan.alphas):
        raise SystemExit(f"--batch-alphas must lie in [0, 1], got {plan.alphas}")
    if not all(K >= 1 for K in plan.Ks):
        raise SystemExit(f"--batch-Ks must be >= 1 (plain decoding is always measured), got {plan.Ks}")
    if plan.n_tokens < 2 or plan.prompt_len < 1 or plan.repeats < 1:
        raise SystemExit("--batch-tokens must be >= 2, --batch-prompt-len >= 1, --batch-repeats >= 1")
    for pair in plan.pairs:
        room = min(plan.configs[size].n_ctx for size in pair)
        if plan.prompt_len + plan.n_tokens > room:
            raise SystemExit(f"--batch-prompt-len + --batch-tokens = {plan.prompt_len + plan.n_tokens} does not "
                             f"fit the context of {','.join(pair)} ({room})")
    return plan


def plan_from_args(args):
    """BatchPlan from the flags; --tiny: the tiny pair, 8 tokens after 4, at most 2 repeats."""
    configs = dict(TINY_CONFIGS) if args.tiny else dict(PRESETS)
    pairs = (("tiny", "tiny2"),) if args.tiny else parse_pairs(args.batch_pairs, configs)
    tiny = dict(n_tokens=8, prompt_len=4, repeats=min(args.batch_repeats, 2)) if args.tiny else {}
    kw = dict(pairs=pairs, batch_sizes=numbers(args.batch_sizes, int, "--batch-sizes"),
              alphas=numbers(args.batch_alphas, float, "--batch-alphas"), Ks=numbers(args.batch_Ks, int, "--batch-Ks"),
              n_tokens=args.batch_tokens, prompt_len=args.batch_prompt_len, repeats=args.batch_repeats,
              lockstep=args.batch_lockstep, tiny=args.tiny, configs=configs)
    return check_plan(BatchPlan(**{**kw, **tiny}))


# ---- measuring ------------------------------------------------------------------------------------

class CellSide:
    """One side of a cell as common.lockstep runs it: its stream advanced one packed step (plain) or one
    round (drafting) at a time, counting what run_side reports."""

    def __init__(self, stream, plain=False):
        self.stream, self.plain, self.tokens, self.Ks, self.accepted, self.examined = stream, plain, None, [], 0, 0
        self.emitted = 0
        self.by_sequence = {}  # sequence -> tokens it has emitted

    def step(self):  # -> False once the stream has ended (self.tokens: every sequence's)
        try:
            step = next(self.stream)
        except StopIteration as done:
            self.tokens = done.value
            return False
        self.by_sequence.update({i: event.n_emitted for i, event in step})
        self.emitted = sum(self.by_sequence.values())
        self.Ks.append(max(event.K for _, event in step))
        self.accepted += sum(sum(event.decisions) for _, event in step)  # greedy: True per accepted draft
        self.examined += sum(len(event.decisions) for _, event in step)
        return True

    def record(self, seconds):
        return {"seconds": seconds, "tokens": self.tokens, "Ks": [0] if self.plain else self.Ks,
                "accepted": self.accepted, "examined": self.examined}


def open_side(side, target, draft_model, prompts, sequences, plan, alpha, seed, stack):
    """One side ("plain", a fixed K, "auto") of a cell as a CellSide, not yet started; its forced draft's
    packed calls are routed for as long as `stack` (a contextlib.ExitStack) stays open."""
    if side == "plain":
        return CellSide(gpt2np.batch_stream(target, prompts, plan.n_tokens, temperature=0), plain=True)
    draft = stack.enter_context(packed_draft_calls(
        ForcedBatchDraft(draft_model, sequences, alpha, seeds=[[seed, i] for i in range(len(prompts))])))
    return CellSide(gpt2np.speculative_batch_stream(target, draft, prompts, plan.n_tokens, K=side, temperature=0,
                                                    K_max=K_MAX))


def run_side(side, target, draft_model, prompts, sequences, plan, alpha, seed):
    """One timed run of one side ("plain", a fixed K, "auto"); its seconds, tokens and K usage."""
    with ExitStack() as stack:
        one = open_side(side, target, draft_model, prompts, sequences, plan, alpha, seed, stack)
        return one.record(lockstep([one])[0])


def run_sides_in_lockstep(sides, target, draft_model, prompts, sequences, plan, alpha, seed):
    """Every side of a cell at once, in lockstep (common.lockstep: the side furthest behind in tokens goes
    next): {side: run_side's record}."""
    with ExitStack() as stack:
        opened = [open_side(s, target, draft_model, prompts, sequences, plan, alpha, seed, stack) for s in sides]
        return {s: one.record(seconds) for s, one, seconds in zip(sides, opened, lockstep(opened))}


def sides_of(plan):
    return ["plain", *plan.Ks, "auto"]


def measure_cell(target, draft_model, prompts, reference, plan, alpha):
    """Every side of one (B, alpha) cell, --batch-repeats times, order reversed on odd repeats."""
    sequences = [list(p) + list(t) for p, t in zip(prompts, reference)]  # what the forced draft must know
    runs, args = {side: [] for side in sides_of(plan)}, (target, draft_model, prompts, sequences, plan, alpha)
    for r in range(plan.repeats):
        order = sides_of(plan) if r % 2 == 0 else sides_of(plan)[::-1]
        records = (run_sides_in_lockstep(order, *args, seed=r) if plan.lockstep
                   else {side: run_side(side, *args, seed=r) for side in order})
        for side, record in records.items():
            runs[side].append(record)
    return summarise_cell(runs, reference, len(prompts), alpha)


def run_pair(draft_size, target_size, plan):
    """Every cell of one pair, its two models built once (random weights, seed 0, as ModelPool does)."""
    log(f"batching: building random {draft_size} (draft) and {target_size} (target) models")
    target = gpt2np.random_model(plan.configs[target_size], seed=0, tokenizer=None)
    draft = gpt2np.random_model(plan.configs[draft_size], seed=0, tokenizer=None)
    orders = [gpt2np.order_for_batches(model) for model in (target, draft)]  # as a batching server runs them
    all_prompts = [random_ids(plan.prompt_len, target.n_vocab, seed=10 + i) for i in range(max(plan.batch_sizes))]
    cells = []
    for B in plan.batch_sizes:
        prompts = all_prompts[:B]
        reference = gpt2np.generate_batch(target, prompts, plan.n_tokens, temperature=0)  # warm-up too
        for alpha in plan.alphas:
            log(f"batching {draft_size}->{target_size}: B {B}, alpha {alpha}: {plan.repeats} x {sides_of(plan)}")
            cells.append(measure_cell(target, draft, prompts, reference, plan, alpha))
    pair = {"draft": draft_size, "target": target_size, "weights_order": "/".join(dict.fromkeys(orders)),
            "cells": cells}
    return {**pair, **crossover(pair)}


def run(plan, threads=None):
    """The section's results dict (module docstring; keys in bench/__init__.py); prints its tables."""
    limits = blas_limits(threads) or nullcontext()  # None: threadpoolctl missing, BLAS's own threads
    start = time.perf_counter()
    with limits:
        out = {"plan": plan.as_dict(), "blas_kernel": gpt2np.blas_kernel(),
               "pairs": [run_pair(draft, target, plan) for draft, target in plan.pairs]}
    out["seconds"] = time.perf_counter() - start
    out["targets"] = targets(out)
    print_report(out)
    return out


def run_section(plan, results, threads=None):
    """python -m bench's hook: the section into results["batching"], its seconds into meta."""
    add_section(results, "batching", run(plan, threads))
