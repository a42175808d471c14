"""From logits to the distribution we sample from, and the one place randomness is drawn.

The transforms and their order are Hugging Face's (`TemperatureLogitsWarper`, then
`TopKLogitsWarper`, then `TopPLogitsWarper`):

    1. temperature t:  logits / t  (t = 0 is not a division: it is greedy decoding, an argmax)
    2. top-k:          keep the tokens whose logit is >= the k-th largest logit (ties are kept)
    3. top-p (nucleus): keep the smallest set of most probable tokens whose total probability
                       reaches top_p (at least one token); renormalise.

Speculative decoding applies this same transform to the target's logits (giving p) and to the
draft's logits (giving q); its guarantee is about these transformed distributions.

`sample(probs, rng)` is the only function in gpt2np that draws a random number. Tests exploit
that: a fake rng whose `.choice(n, p=...)` follows a script can enumerate every random outcome
of `generate` or `speculative_generate` (see exact.py).

>>> probs = sampling_distribution(np.log([0.5, 0.3, 0.2]), top_p=0.6)
>>> probs.round(3).tolist()
[0.625, 0.375, 0.0]
"""
import math

import numpy as np


def is_greedy(temperature):
    """Temperature 0 means greedy decoding: the argmax, no randomness drawn. The one place that says so
    (sampling, the drafters and the speculative kernel all ask here)."""
    return temperature == 0


def check_sampling_options(temperature=1.0, top_k=None, top_p=None):
    """Raise a one-line ValueError naming the first bad option and what is allowed.

    >>> check_sampling_options(0.7, top_k=40, top_p=0.9)  # fine: returns None
    >>> check_sampling_options(top_p=0)
    Traceback (most recent call last):
    ValueError: top_p must be in (0, 1] (1 or None keeps every token), got 0
    """
    if isinstance(temperature, bool) or not (isinstance(temperature, (int, float, np.number))  # True: not 1.0
                                             and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None to keep every token), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or  # True is 1 to Python, never a top_p
                              not (isinstance(top_p, (int, float, np.number)) and 0 < top_p <= 1)):
        raise ValueError(f"top_p must be in (0, 1] (1 or None keeps every token), got {top_p!r}")


def softmax(z):  # [..., n_vocab] -> [..., n_vocab]
    """Softmax over the last axis; -inf logits get probability exactly 0."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # subtracting the max prevents overflow
    return e / e.sum(axis=-1, keepdims=True)


def greedy_distribution(logits):  # [..., n_vocab] -> [..., n_vocab]
    """One-hot at the argmax (the first one on ties, as np.argmax): temperature 0's distribution.

    >>> greedy_distribution(np.array([1.0, 3.0, 3.0])).tolist()
    [0.0, 1.0, 0.0]
    """
    one_hot = np.zeros(logits.shape, dtype=np.float64)
    rows = one_hot.reshape(-1, logits.shape[-1])  # [n, n_vocab], a view (put_along_axis took 4x as long)
    rows[np.arange(len(rows)), np.argmax(logits, axis=-1).reshape(-1)] = 1.0
    return one_hot


def top_k_filter(z, k):  # [..., n_vocab] -> [..., n_vocab]
    """Set every logit below the k-th largest to -inf; logits tied with the k-th are all kept.

    >>> top_k_filter(np.array([1.0, 3.0, 2.0, 2.0]), 2).tolist()
    [-inf, 3.0, 2.0, 2.0]
    """
    k = min(k, z.shape[-1])                          # as HF: top_k larger than the vocabulary is a no-op
    kth_largest = np.sort(z, axis=-1)[..., -k, None]  # [..., 1]
    return np.where(z >= kth_largest, z, -np.inf)


def top_p_filter(probs, top_p):  # [..., n_vocab] -> [..., n_vocab]
    """Keep the smallest set of most probable tokens whose total reaches top_p, and renormalise.

    A token tied in probability with the least probable kept token is kept too, so the result
    depends only on the probabilities, never on token order (HF keeps an arbitrary subset of ties).

    >>> top_p_filter(np.array([0.2, 0.5, 0.3]), 0.8).round(3).tolist()  # 0.5 + 0.3 reaches 0.8
    [0.0, 0.625, 0.375]
    """
    sorted_probs = -np.sort(-probs, axis=-1)                        # most probable first
    cumulative = np.cumsum(sorted_probs, axis=-1)                   # mass of the i+1 most probable
    n_keep = 1 + np.sum(cumulative < top_p, axis=-1, keepdims=True)  # smallest prefix reaching top_p
    n_keep = np.minimum(n_keep, probs.shape[-1])  # rounding can leave the total a hair under top_p
    smallest_kept = np.take_along_axis(sorted_probs, n_keep - 1, axis=-1)  # [..., 1]
    kept = np.where(probs >= smallest_kept, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def sampling_distribution(logits, temperature=1.0, top_k=None, top_p=None):  # [..., n_vocab] -> same
    """The distribution to sample the next token from: float64, each row sums to 1.

    Works on one row [n_vocab] or many [n, n_vocab] (the target scores K+1 positions at once).

    >>> sampling_distribution(np.array([2.0, 1.0, 0.0]), temperature=0).tolist()
    [1.0, 0.0, 0.0]
    >>> sampling_distribution(np.log([0.1, 0.6, 0.3]), top_k=2).round(3).tolist()
    [0.0, 0.667, 0.333]
    """
    check_sampling_options(temperature, top_k, top_p)
    return distribution(logits, temperature, top_k, top_p)


def distribution(logits, temperature=1.0, top_k=None, top_p=None):  # [..., n_vocab] -> same
    """sampling_distribution without checking the options: for the decoding loops, which check them
    once where they come in (generate, plain_stream, speculative_stream), not for every row of
    every token."""
    if is_greedy(temperature):  # a named branch: never divide by a tiny number (and the argmax needs no
        return greedy_distribution(np.asarray(logits))  # float64 copy: float32 -> float64 is exact)
    z = np.asarray(logits, dtype=np.float64)  # float32 logits from GPT-2 -> exact float64 maths
    # the largest logit to 0 first (softmax does not change): a tiny temperature then sends the
    # others to -inf, never a finite logit to +inf (inf - inf is NaN), so T -> 0 approaches greedy
    with np.errstate(over="ignore"):  # -inf for what a tiny temperature pushes below any float
        z = (z - z.max(axis=-1, keepdims=True)) / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    probs = softmax(z)
    if top_p is not None and top_p < 1:
        probs = top_p_filter(probs, top_p)
    return probs


def sample(probs, rng):
    """Draw one token id from probs [n_vocab]. The ONLY place gpt2np draws randomness.

    Yes/no decisions (speculative decoding's accept test) are drawn here too, as a two-outcome
    "token" with probabilities [1 - a, a]; so a fake rng can enumerate every random outcome.

    >>> sample(np.array([0.0, 1.0, 0.0]), np.random.default_rng(0))
    1
    """
    return int(rng.choice(len(probs), p=probs))


def next_token(logits, temperature=1.0, top_k=None, top_p=None, rng=None):  # [n_vocab] -> int
    """Pick the next token from one row of logits: argmax when temperature is 0, else sample.

    >>> next_token(np.array([0.1, 2.0, 0.3]), temperature=0)  # greedy needs no rng
    1
    """
    if is_greedy(temperature):
        return int(np.argmax(logits))  # no randomness drawn, no rng needed
    return sample(distribution(logits, temperature, top_k, top_p), rng)  # the options: checked by the caller
