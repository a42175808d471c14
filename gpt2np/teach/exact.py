"""Exact output distributions by enumerating every random choice a function can make.

gpt2np draws randomness in one place, `sampling.sample(probs, rng)`, which calls
`rng.choice(len(probs), p=probs)`. Hand such a function a `ScriptedRng` instead of a real
generator and we decide every outcome. Walking the tree of outcomes depth-first (skipping those
with probability 0) runs the REAL code (generate, speculative_generate, a kernel) once per path
and gives {result: probability} exactly, up to float rounding (~1e-15), with no statistics.

This is what lets the tests say "speculative decoding's output distribution equals the target's
to 1e-12" on toy models with 3-4 tokens, where the number of paths stays in the thousands.

What enumeration relies on, checked as it goes (each failure is a one-line ValueError):
  * every draw's probabilities are >= 0 and sum to 1 within numpy's own tolerance (sqrt of the
    float64 epsilon, ~1.5e-8, or of the array's dtype if coarser): code the real generator would
    refuse must not get an "exact" law. Like numpy, we then draw from p / sum(p);
  * the function is a function of its draws: replaying a path's first outcomes must offer the
    same probabilities again (within REPLAY_TOLERANCE). A clock, a counter or a global rng that
    changes what is drawn would otherwise give a law that sums to 0.6, silently;
  * the probabilities of all paths add up to 1 within TOTAL_TOLERANCE.
Draws made outside `rng` (np.random.random(), random.random()) stay invisible: no check sees them.

>>> from gpt2np.decoding.sampling import sample
>>> coin = lambda rng: sample(np.array([0.25, 0.75]), rng)
>>> exact_distribution(lambda rng: coin(rng) + coin(rng))
{0: 0.0625, 1: 0.375, 2: 0.5625}
"""
import numpy as np

from ..decoding.autoregressive import generate


TOTAL_TOLERANCE = 1e-9    # |sum of the enumerated law - 1|: rounding gives ~1e-15 per path
REPLAY_TOLERANCE = 1e-12  # largest change in a replayed draw's probabilities (float64: exact replays agree)


class TooManyPaths(RuntimeError):
    """exact_distribution gave up: the function has more random paths than max_paths."""


def sum_tolerance(p):
    """How far from 1 numpy's Generator.choice lets p's sum be: sqrt(eps) of float64, or of p's dtype."""
    dtype = p.dtype if isinstance(p, np.ndarray) and np.issubdtype(p.dtype, np.floating) else np.float64
    return max(np.sqrt(np.finfo(np.float64).eps), np.sqrt(np.finfo(dtype).eps))


def checked_probabilities(p, depth):
    """p as float64 divided by its sum, after the checks Generator.choice makes; else a ValueError.

    >>> checked_probabilities([0.5, 0.3, 0.1], depth=0)
    Traceback (most recent call last):
    ValueError: draw 1 was offered probabilities summing to 0.9, not 1: the real generator refuses them
    """
    probs = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError(f"draw {depth + 1} was offered a negative or non-finite probability: {probs}")
    if abs(probs.sum() - 1.0) > sum_tolerance(p):
        raise ValueError(f"draw {depth + 1} was offered probabilities summing to {probs.sum():.6g}, not 1: "
                         "the real generator refuses them")
    return probs / probs.sum()


def check_replay(probs, replayed, depth):
    """A scripted draw must be offered what it was offered when the script was made."""
    if replayed.shape != probs.shape or np.max(np.abs(replayed - probs)) > REPLAY_TOLERANCE:
        raise ValueError(f"draw {depth + 1} was offered other probabilities on a replay: the function must "
                         "depend only on the outcomes of rng.choice (no clock, counter or other rng)")


class ScriptedRng:
    """Stands in for np.random.Generator: `choice` follows `script`, then takes the first
    outcome with p > 0, and records every draw so the caller can explore the alternatives.

    script: the outcomes of the first draws; offers: the probabilities those draws were offered
    when the script was made (the replay must offer the same ones).
    """

    def __init__(self, script, offers=()):
        self.script, self.offers = script, offers
        self.path = []     # the outcome taken at each draw
        self.offered = []  # the probabilities offered at each draw (normalised)

    def choice(self, a, p):
        depth = len(self.path)
        probs = checked_probabilities(p, depth)
        assert a == len(probs), "sample() passes len(probs) and probs"
        if depth < len(self.script):
            check_replay(probs, self.offers[depth], depth)
        outcome = self.script[depth] if depth < len(self.script) else int(np.flatnonzero(probs > 0)[0])
        self.path.append(outcome)
        self.offered.append(probs)
        return outcome


def path_probability(rng):
    """Probability of the path a ScriptedRng just took: the product of its outcomes' probabilities."""
    if len(rng.path) < len(rng.script):
        raise ValueError(f"a replay made {len(rng.path)} draws where the path it replays made at least "
                         f"{len(rng.script)}: the function must depend only on the outcomes of rng.choice")
    return float(np.prod([p[outcome] for p, outcome in zip(rng.offered, rng.path)]))


def unexplored_branches(rng):
    """(script, offers) for the siblings of the path just taken, below the part that was scripted.

    Unscripted draws took their first possible outcome, so the siblings are the later ones.
    """
    return [(rng.path[:depth] + [other], rng.offered[:depth + 1])
            for depth in range(len(rng.script), len(rng.path))
            for other in np.flatnonzero(rng.offered[depth] > 0)
            if other > rng.path[depth]]


def checked_total(distribution):
    """The law itself, once its probabilities are seen to add up to 1 (within TOTAL_TOLERANCE)."""
    total = sum(distribution.values())
    if abs(total - 1.0) > TOTAL_TOLERANCE:
        raise ValueError(f"the enumerated probabilities sum to {total:.12g}, not 1: the function's draws "
                         "are not a function of earlier outcomes")
    return distribution


def exact_distribution(fn, max_paths=200_000):
    """{fn(rng): probability} over every sequence of random outcomes with probability > 0.

    fn must draw randomness only through rng.choice(n, p=...) (i.e. through sampling.sample) and
    return something hashable, e.g. tuple(tokens). A ValueError names the first check that fails
    (module docstring); more than max_paths paths is TooManyPaths, a RuntimeError.
    """
    distribution, scripts, n_paths = {}, [([], [])], 0
    while scripts:
        rng = ScriptedRng(*scripts.pop())
        result = fn(rng)
        distribution[result] = distribution.get(result, 0.0) + path_probability(rng)
        scripts.extend(unexplored_branches(rng))
        n_paths += 1
        if n_paths > max_paths:
            raise TooManyPaths(f"more than {max_paths} random paths: use a smaller vocabulary or N")
    return checked_total(dict(sorted(distribution.items())))


def max_abs_difference(dist_a, dist_b):
    """Largest |P_a(x) - P_b(x)| over every outcome x of either distribution (absent = 0)."""
    outcomes = set(dist_a) | set(dist_b)
    return max(abs(dist_a.get(x, 0.0) - dist_b.get(x, 0.0)) for x in outcomes)


def total_variation(dist_a, dist_b):
    """Total variation distance: half the sum of |P_a(x) - P_b(x)|; 0 when equal, 1 when disjoint."""
    outcomes = set(dist_a) | set(dist_b)
    return 0.5 * sum(abs(dist_a.get(x, 0.0) - dist_b.get(x, 0.0)) for x in outcomes)


def exact_target_distribution(target, prompt_ids, n_tokens, **options):
    """{tuple of n_tokens tokens: probability} of generate(target, ...), by exact enumeration."""
    return exact_distribution(lambda rng: tuple(generate(target, prompt_ids, n_tokens, rng=rng, **options)))
