"""Plain autoregressive decoding: one forward pass per new token, through the KV cache.

This is the baseline speculative decoding is measured against, and the distribution it must
reproduce exactly. It sees the model only through the model interface (docs/CONTRACTS.md):
`new_cache()`, `forward(ids, cache, n_logits)`, `n_ctx`, `n_vocab`, `eot_id`; so the toy models
of toy_models.py run through it unchanged.

>>> from gpt2np.teach.toy_models import random_toy_model
>>> model = random_toy_model(np.random.default_rng(0), n_vocab=4)
>>> len(generate(model, [0], n_tokens=5, rng=np.random.default_rng(1)))
5
"""
import time

import numpy as np

from ..model.forward import token_id_array
from .sampling import check_sampling_options, next_token
from .stream import RoundEvent, Stream


def check_generation_request(model, prompt_ids, n_tokens):
    """Raise a one-line ValueError unless the prompt and n_tokens fit the model; does no work."""
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an integer >= 1, got {n_tokens!r}")
    prompt_ids = check_prompt_ids(prompt_ids, model.n_vocab)
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: GPT-2 needs at least one token to condition on")
    if len(prompt_ids) + n_tokens > model.n_ctx:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + n_tokens ({n_tokens}) = "
                         f"{len(prompt_ids) + n_tokens} exceeds the context of {model.n_ctx} tokens; "
                         f"shorten the prompt or ask for fewer tokens")


def check_prompt_ids(prompt_ids, n_vocab):  # -> [n_prompt] integer array
    """Float, 2-D or string prompts and ids outside the vocabulary are a one-line ValueError
    (model.token_id_array names the offending ids and their positions, never the whole prompt)."""
    return token_id_array(prompt_ids, n_vocab, what="prompt token ids")


def check_rng(rng, temperature):
    """Sampling needs an explicit generator; greedy decoding (temperature 0) does not."""
    if rng is None and temperature != 0:
        raise ValueError("sampling (temperature > 0) needs rng=np.random.default_rng(seed); "
                         "use temperature=0 for greedy decoding without one")
    check_rng_type(rng)


def check_rng_type(rng):
    """rng is None, a np.random.Generator, or a stand-in with its choice(n, p=...) (exact.ScriptedRng):
    sampling.sample is the only caller, and `rng=5` would otherwise fail deep inside the first draw."""
    if rng is not None and not callable(getattr(type(rng), "choice", None)):  # the class: draws nothing
        raise ValueError(f"rng must be a np.random.Generator (np.random.default_rng(seed)), "
                         f"got {type(rng).__name__}")


def plain_rounds(model, prompt_ids, n_tokens, options, rng, use_cache=True):
    """The decoding loop as a generator: one RoundEvent per token; returns the token list.

    use_cache=False recomputes the whole context at every step (a fresh cache per call): the same
    tokens at O(n^2) cost, to show what the KV cache buys."""
    cache, tokens = model.new_cache(), []
    new_ids = np.asarray(prompt_ids)  # the first call feeds the whole prompt (prefill)
    while True:
        start = time.perf_counter()
        if not use_cache:
            cache, new_ids = model.new_cache(), np.asarray(list(prompt_ids) + tokens)  # [prompt + so far]
        logits = model.forward(new_ids, cache, n_logits=1)  # [1, n_vocab]
        tokens.append(next_token(logits[-1], rng=rng, **options))
        yield RoundEvent(tokens=tokens[-1:], provenance=["target"], K=0, n_emitted=len(tokens),
                         seconds=time.perf_counter() - start)
        if len(tokens) == n_tokens or tokens[-1] == model.eot_id:
            return tokens  # the last token is never fed: nothing would read its logits
        new_ids = np.array(tokens[-1:])  # [1]


def plain_stream(model, prompt_ids, n_tokens, temperature=1.0, top_k=None, top_p=None, rng=None,
                 use_cache=True):
    """`generate` as a Stream of one-token rounds (provenance "target"); checks run right away.

    use_cache=False: no KV cache, the whole context recomputed each step (for teaching)."""
    check_sampling_options(temperature, top_k, top_p)
    check_generation_request(model, prompt_ids, n_tokens)
    check_rng(rng, temperature)
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    return Stream(plain_rounds(model, prompt_ids, n_tokens, options, rng, use_cache))


def generate(model, prompt_ids, n_tokens, temperature=1.0, top_k=None, top_p=None, rng=None):
    """Continue prompt_ids by n_tokens tokens, or fewer if the model emits `model.eot_id`.

    Returns the new tokens only (a list of ints); an end-of-text token is included, then we stop.
    Every check runs before the first forward pass.
    """
    return plain_stream(model, prompt_ids, n_tokens, temperature, top_k, top_p, rng).run()


def generate_without_cache(model, prompt_ids, n_tokens, temperature=0, top_k=None, top_p=None, rng=None):
    """Decoding that recomputes the whole context at every step (a fresh cache each call).

    Same tokens as generate(model, prompt_ids, n_tokens, ...) with the same options and an
    identically seeded rng (the same next_token draws), at O(n^2) cost instead of O(n): what the
    KV cache buys. Greedy (temperature 0) by default; stops after eot_id, as generate does.
    """
    check_sampling_options(temperature, top_k, top_p)
    check_generation_request(model, prompt_ids, n_tokens)
    check_rng(rng, temperature)
    ids = [int(t) for t in prompt_ids]
    for _ in range(n_tokens):
        logits = model.forward(ids, model.new_cache())  # [1, n_vocab]: every position recomputed
        ids.append(next_token(logits[-1], temperature, top_k, top_p, rng))
        if ids[-1] == model.eot_id:
            break
    return ids[len(prompt_ids):]
