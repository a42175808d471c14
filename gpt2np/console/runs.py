"""The console's adapter to the decoders: the ONE place the console calls them.

Each generator a prompt runs (target-only, draft-only, speculative; with `:cache off` each again
without the KV cache) gets its own np.random.default_rng(seed), so every run is reproducible on
its own and none depends on which others ran. Throughput is tokens per second from the
decoders' own clocks: the sum of the stream's per-round seconds (RoundEvent.seconds), which
leaves out the time spent printing between rounds and the speculative run's calibration calls.

Without the cache, plain decoding is plain_stream(use_cache=False); speculative decoding gets
the same models behind `Recomputing`, which has the model interface (docs/CONTRACTS.md) but no
KV cache: every call recomputes the whole context, the target's once per round and a draft
model's once per drafted token. The tokens are the same as with the cache; only the cost differs.
"""
from dataclasses import dataclass

import numpy as np

from gpt2np import ModelDrafter, plain_stream, request_cache, speculative_stream

TREE_NEEDS_CACHE = "a token tree runs with the KV cache only (its rows are kept per path)"


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


class TokenHistory:
    """What a Recomputing model is given in place of a KV cache: the token ids fed so far, no keys
    or values. len() and truncate(n) behave as a KVCache's, so the decoders roll it back alike."""

    def __init__(self):
        self.ids = []

    def __len__(self):
        return len(self.ids)

    def truncate(self, n):
        if not 0 <= n <= len(self.ids):
            raise ValueError(f"cannot truncate {len(self.ids)} cached tokens to {n}")
        del self.ids[n:]


class Recomputing:
    """A model without a KV cache: forward(ids, history) runs the whole history + ids through a
    fresh cache sized to them, so every call costs a full prefill. Anything else is the wrapped model's."""
    sized_caches = False  # new_cache() is a TokenHistory, whatever the wrapped model's caches take
    row_cost_shape = None  # every call costs a prefill of the history, whatever M: one block's curve is not its own

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):  # n_vocab, n_ctx, eot_id, name, config, tokenizer
        if name == "model":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def new_cache(self):
        return TokenHistory()

    def forward(self, ids, history, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        history.ids += [int(t) for t in np.asarray(ids).reshape(-1)]
        fresh = request_cache(self.model, len(history.ids))  # its positions only: a whole 1558M cache is 629 MB
        return self.model.forward(np.asarray(history.ids), fresh, n_logits)  # [n_kv] fed


def generator_rng(settings):
    """A fresh generator from the seed setting (never the global one), one per run."""
    return np.random.default_rng(settings.seed)


def without_cache(drafter):
    """The drafter with its model behind Recomputing; prompt lookup has no model and no cache."""
    return ModelDrafter(Recomputing(drafter.model)) if hasattr(drafter, "model") else drafter


def open_stream(generator, target, drafter, prompt_ids, settings, use_cache=True):
    """A Stream for generator "target" / "draft" / "speculative"; every check runs here, before any work."""
    rng = generator_rng(settings)
    if generator == "speculative":
        if not use_cache:
            if settings.tree is not None:
                raise ValueError(f"{TREE_NEEDS_CACHE}: :cache on, or :tree off")  # :tree and :cache refuse it first
            target, drafter = Recomputing(target), without_cache(drafter)
        K = dict(tree=settings.tree) if settings.tree is not None else dict(K=settings.K)  # a tree fixes K
        return speculative_stream(target, drafter, prompt_ids, settings.n_tokens, K_max=settings.K_max, rng=rng,
                                  calibrate=True, **K, **settings.sampling)  # the summary shows c, v
    model = target if generator == "target" else drafter.model
    return plain_stream(model, prompt_ids, settings.n_tokens, rng=rng, use_cache=use_cache, **settings.sampling)


def consume(stream, show):
    """Run a stream to its end, calling show(event) after each round; returns the decoding seconds."""
    seconds = 0.0
    for event in stream:
        seconds += event.seconds
        show(event)
    return seconds
