"""exact.py refuses to call something an exact law when what enumeration relies on fails.

Enumeration is exact only if (1) every draw's probabilities are a distribution (the real
Generator.choice would refuse them otherwise, so a crash in real runs must not become a law),
(2) the function depends on nothing but the outcomes of its draws (replays must see the same
draws), and (3) the enumerated law adds up to 1. Each failure is a one-line ValueError.
"""
import itertools

import numpy as np
import pytest

from gpt2np.teach.exact import TOTAL_TOLERANCE, checked_total, exact_distribution


def one_line(info):
    assert "\n" not in str(info.value), str(info.value)


def draw_from(p):
    return lambda rng: int(rng.choice(len(p), p=p))


@pytest.mark.parametrize("p, message", [
    (np.array([0.5, 0.3, 0.1]), "summing to 0.9, not 1"),         # was enumerated as {0: .5, 1: .3, 2: .1}
    (np.array([0.6, 0.6, -0.2]), "negative or non-finite"),
    (np.array([0.5, np.nan, 0.5]), "negative or non-finite"),
])
def test_probabilities_the_real_generator_refuses_are_refused(p, message):
    with pytest.raises(ValueError):
        np.random.default_rng(0).choice(len(p), p=p)  # numpy's own verdict, for comparison
    with pytest.raises(ValueError, match=message) as info:
        exact_distribution(draw_from(p))
    one_line(info)


@pytest.mark.parametrize("p", [np.array([0.5, 0.3, 0.2 + 1e-9]),                          # float64, within 1.5e-8
                               np.array([0.5, 0.3, 0.2 - 5e-5], dtype=np.float32)])     # float32, within 3.5e-4
def test_what_the_real_generator_accepts_is_accepted_and_drawn_normalised(p):
    np.random.default_rng(0).choice(len(p), p=p)  # numpy accepts these, and draws from p / sum(p)
    law = exact_distribution(draw_from(p))
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_allclose([law[i] for i in range(3)], p / p.sum(), rtol=1e-7)


def test_a_function_whose_draws_change_between_replays_is_refused():
    """A counter (as a clock-driven K policy could be) changes what is drawn: this gave the law
    {0: 0.5, 1: 0.1}, total 0.6, without an error."""
    calls = itertools.count()

    def counter_driven(rng):
        p = np.array([0.5, 0.5]) if next(calls) % 2 == 0 else np.array([0.9, 0.1])
        return int(rng.choice(2, p=p))
    with pytest.raises(ValueError, match="draw 1 was offered other probabilities on a replay") as info:
        exact_distribution(counter_driven)
    one_line(info)


def test_a_replay_that_draws_fewer_times_is_refused():
    calls = itertools.count()

    def second_draw_only_once(rng):
        first = int(rng.choice(2, p=np.array([0.5, 0.5])))
        return first + (2 * int(rng.choice(2, p=np.array([0.5, 0.5]))) if next(calls) == 0 else 0)
    with pytest.raises(ValueError, match="a replay made 1 draws where the path it replays made at least 2") as info:
        exact_distribution(second_draw_only_once)
    one_line(info)


def test_a_law_that_does_not_add_up_to_one_is_refused():
    assert checked_total({0: 0.5, 1: 0.5 + TOTAL_TOLERANCE / 2}) == {0: 0.5, 1: 0.5 + TOTAL_TOLERANCE / 2}
    with pytest.raises(ValueError, match="sum to 0.6, not 1") as info:
        checked_total({0: 0.5, 1: 0.1})
    one_line(info)
