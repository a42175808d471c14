"""A model with a stopwatch per call size: how the loop measures c and v without asking for extra work.

Every forward call the loop makes anyway is timed by the number of tokens it feeds; c (the
drafter's cost per token) and v (a (K+1)-token call over a one-token call) are medians of those.
"""
import time

import numpy as np

from .autoregressive import request_cache


class TimedModel:
    """One model in the loop: its cache, and a stopwatch per call size (tokens fed per call)."""

    def __init__(self, model, n_fed=None):  # n_fed: the positions the run will feed (None: the whole context)
        self.model = model
        self.cache = model.new_cache() if n_fed is None else request_cache(model, n_fed)
        self.durations = {}  # n_seq -> [seconds of each call]: medians resist one slow call

    def feed(self, ids, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        start = time.perf_counter()
        logits = self.model.forward(np.asarray(ids), self.cache, n_logits)
        self.durations.setdefault(len(ids), []).append(time.perf_counter() - start)
        return logits

    def roll_back(self, n):
        """Forget everything after the first n tokens (nothing to do if the cache is shorter)."""
        self.cache.truncate(min(n, len(self.cache)))

    @property
    def timings(self):  # n_seq -> (calls, seconds)
        return {n: (len(d), sum(d)) for n, d in self.durations.items()}

    @property
    def calls(self):
        return sum(len(d) for d in self.durations.values())

    @property
    def seconds(self):
        return sum(sum(d) for d in self.durations.values())


def seconds_per_call(durations, n_seq):
    """Median seconds of the calls that fed n_seq tokens (None if there were none)."""
    return float(np.median(durations[n_seq])) if durations.get(n_seq) else None
