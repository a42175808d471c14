"""-p/--profiling: where the time of one run of each decoder went, from stopwatches, not a profiler.

The speculative loop already times every forward call by size (its statistics' target_timings and
draft_timings) and each round's Step 1 (propose_seconds) and whole (seconds); the plain loop times
each round, and ClockedModel times its forward calls. What is not a forward pass is the rest of
its step: sampling (Step 1's draws, the accept/resample draws of Steps 3-4, plain decoding's
next_token), the roll-back and Python.
"""
import time

import numpy as np


class ClockedModel:
    """A model whose forward calls are timed by size (tokens fed); everything else is the model's."""

    def __init__(self, model):
        self.model, self.durations = model, {}  # n_seq -> [seconds of each call]

    def __getattr__(self, name):
        return getattr(self.model, name)

    def forward(self, ids, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        start = time.perf_counter()
        logits = self.model.forward(ids, cache, n_logits)
        self.durations.setdefault(len(ids), []).append(time.perf_counter() - start)
        return logits


def timed_events(stream):  # -> (events, wall seconds)
    start = time.perf_counter()
    events = list(stream)
    return events, time.perf_counter() - start


def forward_rows(who, timings):  # timings: n_seq -> (calls, seconds)
    return [(f"{who} forward, {n}-token calls x {calls}", seconds)
            for n, (calls, seconds) in sorted(timings.items())]


def plain_profile(model, make_stream):
    """Rows (what, seconds) of one plain run, and its wall time."""
    clocked = ClockedModel(model)
    events, wall = timed_events(make_stream(clocked))
    forward = {n: (len(d), sum(d)) for n, d in clocked.durations.items()}
    in_rounds = sum(e.seconds for e in events)
    rows = forward_rows("target", forward) + [
        ("sampling (next_token) and Python", in_rounds - sum(s for _, s in forward.values())),
        ("outside the rounds (the stream)", wall - in_rounds)]
    return rows, wall, len(events)


def speculative_profile(stream):
    """Rows (what, seconds) of one speculative run, and its wall time."""
    events, wall = timed_events(stream)
    stats = stream.result.stats
    proposing, in_rounds = sum(e.propose_seconds for e in events), sum(e.seconds for e in events)
    model_drafter = all(isinstance(n, (int, np.integer)) for n in stats.draft_timings)
    rows = forward_rows("target", stats.target_timings)
    rows += forward_rows("draft", stats.draft_timings) if model_drafter else [
        (f"drafter {stats.drafter} lookups", stats.draft_seconds)]
    rows += [("Step 1 less the draft's forward: draft sampling, Python", proposing - stats.draft_seconds),
             ("Steps 3-4 (accept / resample draws), roll-back, Python", in_rounds - proposing - stats.target_seconds),
             ("outside the rounds (the stream)", wall - in_rounds)]
    return rows, wall, len(stream.tokens)


def format_profile(title, rows, wall, n_tokens):
    width = max(len(what) for what, _ in rows)
    lines = [f"{title}: {n_tokens} tokens in {wall:.3f} s"]
    lines += [f"  {what:<{width}}  {seconds:8.4f} s  {100 * seconds / wall:5.1f} %" for what, seconds in rows]
    return "\n".join(lines)
