"""The console's adapter to the decoders: the ONE place the console calls them.

Each generator a prompt runs (target-only, draft-only, speculative; plain runs also without the
KV cache) gets its own np.random.default_rng(seed), so every run is reproducible on its own and
none depends on which others ran. Throughput is tokens per second from the decoders' own
clocks: the sum of the stream's per-round seconds (RoundEvent.seconds), which leaves out the
time spent printing between rounds and the speculative run's calibration calls; a run without
the cache is one call, timed around it.
"""
import time
from dataclasses import dataclass

import numpy as np

from gpt2np import generate_without_cache, plain_stream, speculative_stream


@dataclass(frozen=True)
class Run:
    """One generator's run on one prompt, as the summary table shows it."""
    label: str            # "target-only", "speculative", "target-only, no KV cache", ...
    model: str            # what produced the tokens: a model's name, or the target + drafter
    tokens: list          # the new tokens
    seconds: float        # decoding time (the decoders' own clocks)
    stats: object = None  # SpeculativeStats (speculative runs)

    @property
    def tokens_per_second(self):
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")


def generator_rng(settings):
    """A fresh generator from the seed setting (never the global one), one per run."""
    return np.random.default_rng(settings.seed)


def open_stream(generator, target, drafter, prompt_ids, settings):
    """A Stream for generator "target" / "draft" / "speculative"; every check runs here, before any work."""
    rng = generator_rng(settings)
    if generator == "speculative":
        return speculative_stream(target, drafter, prompt_ids, settings.n_tokens, settings.K, settings.K_max,
                                  rng=rng, calibrate=True, **settings.sampling)  # the summary shows c, v
    model = target if generator == "target" else drafter.model
    return plain_stream(model, prompt_ids, settings.n_tokens, rng=rng, **settings.sampling)


def consume(stream, show):
    """Run a stream to its end, calling show(event) after each round; returns the decoding seconds."""
    seconds = 0.0
    for event in stream:
        seconds += event.seconds
        show(event)
    return seconds


def without_cache(model, prompt_ids, settings):
    """(tokens, seconds) of plain decoding recomputing the whole context at every step."""
    start = time.perf_counter()
    tokens = generate_without_cache(model, prompt_ids, settings.n_tokens, rng=generator_rng(settings),
                                    **settings.sampling)
    return tokens, time.perf_counter() - start
