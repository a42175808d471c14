"""Plain autoregressive decoding: one forward pass per new token, through the KV cache.

This is the baseline speculative decoding is measured against, and the distribution it must
reproduce exactly. It sees the model only through the model interface (docs/CONTRACTS.md):
`new_cache()`, `forward(ids, cache, n_logits)`, `n_ctx`, `n_vocab`, `eot_id`; so the toy models
of toy_models.py run through it unchanged.

Every generation function (generate, plain_stream, generate_without_cache, speculative_generate,
speculative_stream) has the same defaults, checked here: temperature None means greedy (0) without
an rng and 1.0 with one (passing a generator is asking to sample); sampling at any temperature > 0
needs your np.random.Generator, never a hidden one; stop_tokens (ids that end generation, like
<|endoftext|>, and kept as its last token) defaults to none beyond eot_id. Past (model, prompt_ids,
n_tokens) the options are keywords, but for the ones callers still pass by position: speculative_stream's
K, generate's and generate_without_cache's temperature, speculative_generate's K and temperature. K_max
is keyword-only everywhere. (A sixth position is temperature to speculative_generate and a TypeError to
speculative_stream, which takes temperature by name only.)

>>> from gpt2np.teach.toy_models import random_toy_model
>>> model = random_toy_model(np.random.default_rng(0), n_vocab=4)
>>> len(generate(model, [0], n_tokens=5, rng=np.random.default_rng(1)))
5
>>> generate(model, [0], 5) == generate(model, [0], 5, temperature=0)  # no rng: greedy
True
"""
import inspect
import time

import numpy as np

from ..model.forward import GPT2, token_id_array
from .sampling import check_sampling_options, next_token
from .stream import RoundEvent, Stream

MODEL_INTERFACE = ("n_vocab", "n_ctx", "eot_id", "new_cache", "forward")  # docs/CONTRACTS.md


def check_model(model, argument, usage):
    """A one-line ValueError unless `model` has the model interface, naming the argument, what was
    given and the call's order (`usage`): arguments in another repository's order fail here.

    >>> check_model([464, 2068], "model", "generate(model, prompt_ids, n_tokens)")
    Traceback (most recent call last):
    ValueError: model must be a model (gpt2np.load_model, gpt2np.random_model), got list: generate(model, prompt_ids, n_tokens)
    """
    if all(hasattr(model, name) for name in MODEL_INTERFACE):
        return
    given = type(model).__name__
    if hasattr(model, "propose"):  # a drafter where the target belongs
        given += " (a drafter: it goes second, as the draft)"
    raise ValueError(f"{argument} must be a model (gpt2np.load_model, gpt2np.random_model), got {given}: {usage}")


def default_temperature(temperature, rng):
    """temperature=None: 1.0 when an rng was passed (a generator is a request to sample), else 0
    (greedy); any other value is the caller's. The one place every generation function decides it."""
    if temperature is None:
        return 0 if rng is None else 1.0
    return temperature


def stop_set(model, stop_tokens):  # -> frozenset of the ids that end generation
    """eot_id (if the model has one) plus stop_tokens: None, one id, a set or a 1-D sequence of ids in
    the vocabulary (anything else is token_id_array's one-line ValueError).

    >>> sorted(stop_set(type("M", (), dict(n_vocab=10, eot_id=9))(), [3, 5]))
    [3, 5, 9]
    """
    if stop_tokens is None:
        stop_tokens = []
    elif isinstance(stop_tokens, (int, np.integer)) and not isinstance(stop_tokens, bool):
        stop_tokens = [stop_tokens]  # one id, as Hugging Face's eos_token_id allows
    elif isinstance(stop_tokens, (set, frozenset)):
        stop_tokens = list(stop_tokens)  # NumPy makes a set one object, not ids
    ids = token_id_array(stop_tokens, model.n_vocab, what="stop_tokens")
    eot = [] if model.eot_id is None else [model.eot_id]
    return frozenset(int(t) for t in [*ids, *eot])


def check_generation_request(model, prompt_ids, n_tokens, whose="the"):
    """Raise a one-line ValueError unless the prompt and n_tokens fit the model; does no work.

    Returns the checked prompt as an integer array. whose: the context's owner in the message
    ("the draft model's", for a drafter's check).

    >>> check_generation_request(type("M", (), dict(n_vocab=10, n_ctx=4))(), [1, 2], 3, "the draft model's")
    Traceback (most recent call last):
    ValueError: prompt (2 tokens) + n_tokens (3) = 5 exceeds the draft model's context of 4 tokens; shorten the prompt or ask for fewer tokens
    """
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an integer >= 1, got {n_tokens!r}")
    n_tokens = int(n_tokens)  # np.int8(100) + 100 would wrap around: the check below must not
    prompt_ids = check_prompt_ids(prompt_ids, model.n_vocab)
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: GPT-2 needs at least one token to condition on")
    if len(prompt_ids) + n_tokens > model.n_ctx:
        fix = ("shorten the prompt or ask for fewer tokens" if len(prompt_ids) < model.n_ctx else
               f"the prompt alone fills it: shorten the prompt to at most {model.n_ctx - 1} tokens")  # no n_tokens can
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + n_tokens ({n_tokens}) = "
                         f"{len(prompt_ids) + n_tokens} exceeds {whose} context of {model.n_ctx} tokens; {fix}")
    return prompt_ids


def check_prompt_ids(prompt_ids, n_vocab):  # -> [n_prompt] integer array
    """Float, 2-D or string prompts and ids outside the vocabulary are a one-line ValueError
    (model.token_id_array names the offending ids and their positions, never the whole prompt)."""
    return token_id_array(prompt_ids, n_vocab, what="prompt token ids")


def check_rng(rng, temperature):
    """Sampling needs an explicit generator; greedy decoding (temperature 0) does not."""
    if rng is None and temperature != 0:
        raise ValueError(f"sampling (temperature {temperature} > 0) needs rng=np.random.default_rng(seed); "
                         "leave temperature out (or 0) for greedy decoding without one")
    check_rng_type(rng)


def check_rng_type(rng):
    """rng is None, a np.random.Generator, or a stand-in with its choice(n, p=...) (exact.ScriptedRng):
    sampling.sample is the only caller, and `rng=5` would otherwise fail deep inside the first draw.
    Not a np.random.RandomState: it has choice, but the project draws from explicit Generators only.
    Not a random.Random either: its choice(seq) takes no p, and would fail at the first draw."""
    if rng is None or isinstance(rng, np.random.Generator):
        return
    legacy = isinstance(rng, np.random.RandomState)  # has choice too, but it is the legacy seeding API
    if legacy or not takes_p(getattr(type(rng), "choice", None)):  # the class's method: draws nothing
        raise ValueError(f"rng must be a np.random.Generator (np.random.default_rng(seed)), "
                         f"got {type(rng).__name__}")


def takes_p(method):  # -> whether method(self, n, p=...) can be called as Generator.choice is by sample
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # None, or not a function: no choice to call
        return False
    return any(p.name == "p" or p.kind is p.VAR_KEYWORD for p in parameters)


def request_cache(model, n_fed):
    """A KVCache for the n_fed positions one run will feed (at most the context): sized to them for a GPT2,
    or a model that says its new_cache takes n_ctx as GPT2's does (sized_caches = True: bench's
    TimedProxy); another model's new_cache() (the interface asks nothing more of it). A full 1558M cache
    is 629 MB, zeroed when first touched (50 ms on memory the process has used before; up to 3.8 s on a
    VM's fresh memory, measured on the Zen 4 EPYC), where a 100-token run after a short prompt feeds
    ~70 MB of it."""
    return model.new_cache(min(n_fed, model.n_ctx)) if sizes_caches(model) else model.new_cache()


def sizes_caches(model):  # -> whether model.new_cache takes n_ctx: a GPT2, or a model that says so
    return isinstance(model, GPT2) or getattr(model, "sized_caches", False)


def plain_rounds(model, prompt_ids, n_tokens, options, rng, stops, use_cache=True):
    """The decoding loop as a generator: one RoundEvent per token; returns the token list.

    Stops after n_tokens, or right after a token in `stops` (eot_id and the stop tokens), which is
    kept. use_cache=False recomputes the whole context at every step (a fresh cache per call): the
    same tokens at O(n^2) cost, to show what the KV cache buys."""
    cache, tokens = request_cache(model, len(prompt_ids) + n_tokens - 1), []  # the last token is never fed
    new_ids = np.asarray(prompt_ids)  # the first call feeds the whole prompt (prefill)
    while True:
        start = time.perf_counter()
        if not use_cache:
            new_ids = np.asarray(list(prompt_ids) + tokens)                    # [prompt + so far]
            cache = request_cache(model, len(new_ids))
        logits = model.forward(new_ids, cache, n_logits=1)  # [1, n_vocab]
        tokens.append(next_token(logits[-1], rng=rng, **options))
        yield RoundEvent(tokens=tokens[-1:], provenance=["target"], K=0, n_emitted=len(tokens),
                         seconds=time.perf_counter() - start)
        if len(tokens) == n_tokens or tokens[-1] in stops:
            return tokens  # the last token is never fed: nothing would read its logits
        new_ids = np.array(tokens[-1:])  # [1]


def open_plain(name, model, prompt_ids, n_tokens, temperature, top_k, top_p, rng, stop_tokens, use_cache):
    """The Stream behind generate, plain_stream and generate_without_cache (`name`, for the errors),
    after every check: nothing runs until it is iterated. It decodes a copy of the checked prompt, taken
    now (as speculative_stream's): the caller's list may change before the first step without effect.
    The copy is Python ints: np.uint64 ids joined to the int tokens would make a float64 array."""
    check_model(model, "model", f"{name}(model, prompt_ids, n_tokens, ...)")
    temperature = default_temperature(temperature, rng)
    check_sampling_options(temperature, top_k, top_p)
    prompt = [int(t) for t in check_generation_request(model, prompt_ids, n_tokens)]  # why: the docstring
    check_rng(rng, temperature)
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    stops = stop_set(model, stop_tokens)
    return Stream(plain_rounds(model, prompt, int(n_tokens), options, rng, stops, use_cache))


def plain_stream(model, prompt_ids, n_tokens, *, temperature=None, top_k=None, top_p=None, rng=None,
                 use_cache=True, stop_tokens=None):
    """`generate` as a Stream of one-token rounds (provenance "target"); checks run right away.

    use_cache=False: no KV cache, the whole context recomputed each step (for teaching)."""
    return open_plain("plain_stream", model, prompt_ids, n_tokens, temperature, top_k, top_p, rng,
                      stop_tokens, use_cache)


def generate(model, prompt_ids, n_tokens, temperature=None, *, top_k=None, top_p=None, rng=None,
             stop_tokens=None):
    """Continue prompt_ids by n_tokens tokens, or fewer if the model emits `model.eot_id` or one of
    `stop_tokens`.

    Returns the new tokens only (a list of ints); the token that stopped it is included. Greedy
    unless you pass an rng (temperature None is 1.0 then). Every check runs before the first
    forward pass.
    """
    return open_plain("generate", model, prompt_ids, n_tokens, temperature, top_k, top_p, rng,
                      stop_tokens, True).run()


def generate_without_cache(model, prompt_ids, n_tokens, temperature=None, *, top_k=None, top_p=None, rng=None,
                           stop_tokens=None):
    """Decoding that recomputes the whole context at every step (a fresh cache each call).

    Same tokens as generate(model, prompt_ids, n_tokens, ...) with the same options and an
    identically seeded rng (the same next_token draws), at O(n^2) cost instead of O(n): what the
    KV cache buys. The same defaults as generate; stops where generate stops.
    """
    return open_plain("generate_without_cache", model, prompt_ids, n_tokens, temperature, top_k, top_p, rng,
                      stop_tokens, False).run()
