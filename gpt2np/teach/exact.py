"""Exact output distributions by enumerating every random choice a function can make.

gpt2np draws randomness in one place, `sampling.sample(probs, rng)`, which calls
`rng.choice(len(probs), p=probs)`. Hand such a function a `ScriptedRng` instead of a real
generator and we decide every outcome. Walking the tree of outcomes depth-first (skipping those
with probability 0) runs the REAL code (generate, speculative_generate, a kernel) once per path
and gives {result: probability} exactly, up to float rounding (~1e-15), with no statistics.

This is what lets the tests say "speculative decoding's output distribution equals the target's
to 1e-12" on toy models with 3-4 tokens, where the number of paths stays in the thousands.

>>> from gpt2np.decoding.sampling import sample
>>> coin = lambda rng: sample(np.array([0.25, 0.75]), rng)
>>> exact_distribution(lambda rng: coin(rng) + coin(rng))
{0: 0.0625, 1: 0.375, 2: 0.5625}
"""
import numpy as np

from ..decoding.autoregressive import generate


class ScriptedRng:
    """Stands in for np.random.Generator: `choice` follows `script`, then takes the first
    outcome with p > 0, and records every draw so the caller can explore the alternatives."""

    def __init__(self, script):
        self.script = script
        self.path = []     # the outcome taken at each draw
        self.offered = []  # the probabilities offered at each draw

    def choice(self, a, p):
        p = np.asarray(p, dtype=np.float64)
        assert a == len(p), "sample() passes len(probs) and probs"
        depth = len(self.path)
        outcome = self.script[depth] if depth < len(self.script) else int(np.flatnonzero(p > 0)[0])
        if p[outcome] <= 0:
            raise RuntimeError("the function drew differently on a replay: it must depend only on "
                               "the outcomes of rng.choice")
        self.path.append(outcome)
        self.offered.append(p)
        return outcome


def path_probability(rng):
    """Probability of the path a ScriptedRng just took: the product of its outcomes' probabilities."""
    return float(np.prod([p[outcome] for p, outcome in zip(rng.offered, rng.path)]))


def unexplored_branches(rng):
    """Scripts for the siblings of the path just taken, below the part that was scripted.

    Unscripted draws took their first possible outcome, so the siblings are the later ones.
    """
    return [rng.path[:depth] + [other]
            for depth in range(len(rng.script), len(rng.path))
            for other in np.flatnonzero(rng.offered[depth] > 0)
            if other > rng.path[depth]]


def exact_distribution(fn, max_paths=200_000):
    """{fn(rng): probability} over every sequence of random outcomes with probability > 0.

    fn must draw randomness only through rng.choice(n, p=...) (i.e. through sampling.sample) and
    return something hashable, e.g. tuple(tokens).
    """
    distribution, scripts, n_paths = {}, [[]], 0
    while scripts:
        rng = ScriptedRng(scripts.pop())
        result = fn(rng)
        distribution[result] = distribution.get(result, 0.0) + path_probability(rng)
        scripts.extend(unexplored_branches(rng))
        n_paths += 1
        if n_paths > max_paths:
            raise RuntimeError(f"more than {max_paths} random paths: use a smaller vocabulary or N")
    return dict(sorted(distribution.items()))


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
