"""The cost curve's shape read from one block (model/cost_probe.py): what it runs, what it leaves alone, its budget."""
import math

import numpy as np
import pytest

from conftest import random_params
from gpt2np.model.config import GPT2Config
from gpt2np.model.cost_probe import ONE_ROW_READINGS, PROBE_CONTEXT, block_readings, probe_repeats, row_cost_shape
from gpt2np.model.forward import GPT2, transformer_block

SMALL = GPT2Config(n_vocab=37, n_ctx=24, n_embd=12, n_head=3, n_layer=4)


def test_the_probe_reads_every_size_in_turn_on_the_layers_in_turn_through_the_pass_s_own_block():
    """Each reading: the next layer's block (so no block's weights are read twice in a row), after PROBE_CONTEXT
    cached positions, over the first M rows of one fixed input; one row first (thrown away), then the sizes
    interleaved, one row ONE_ROW_READINGS times, `repeats` times over."""
    params = random_params(SMALL, seed=0)
    seen = []

    def block(x, block_params, cache, layer, n_head):
        seen.append((len(x), next(i for i, b in enumerate(params["blocks"]) if b is block_params), len(cache)))
        return transformer_block(x, block_params, cache, layer, n_head)

    readings = block_readings(block, params, SMALL, 3, repeats=2)
    order = [1] + ([1] * ONE_ROW_READINGS + [2, 3]) * 2
    assert seen == [(M, i % SMALL.n_layer, PROBE_CONTEXT) for i, M in enumerate(order)], seen
    assert sorted(readings) == [1, 2, 3] and [len(readings[M]) for M in (1, 2, 3)] == [2 * ONE_ROW_READINGS, 2, 2]
    assert all(min(r) > 0 for r in readings.values()), readings


def test_the_probe_changes_nothing_and_draws_from_no_generator_of_the_run():
    model = GPT2(SMALL, random_params(SMALL, seed=1))
    before = {"wte": np.copy(model.params["wte"]), "c_fc": np.copy(model.params["blocks"][0]["mlp"]["c_fc"]["w"])}
    state = np.random.get_state()[1].copy()
    cache = model.new_cache()
    logits = model.forward([1, 2, 3], cache, n_logits=3)
    shape = model.row_cost_shape(5)
    assert sorted(shape) == [1, 2, 3, 4, 5] and shape[1] == 1.0 and all(x > 0 for x in shape.values()), shape
    assert np.array_equal(before["wte"], model.params["wte"])
    assert np.array_equal(before["c_fc"], model.params["blocks"][0]["mlp"]["c_fc"]["w"])
    assert np.array_equal(state, np.random.get_state()[1]), "the probe drew from NumPy's global generator"
    untouched = model.new_cache()                           # the same calls without a probe between them
    np.testing.assert_array_equal(model.forward([1, 2, 3], untouched, n_logits=3), logits)
    assert len(cache) == 3 and np.array_equal(model.forward([4], cache), model.forward([4], untouched))


def test_the_probe_takes_no_more_than_the_time_granted():
    """probe_repeats: readings of M_max sizes at ROW_GROWTH one-row blocks each, the extra one-row readings (one
    thrown away, ONE_ROW_READINGS - 1 more a repeat), n_layer blocks a pass. None where not even one reading of each
    size fits; never more than PROBE_REPEATS."""
    assert probe_repeats(48, 9, 1.0) == 3 and probe_repeats(48, 9, math.inf) == 3 and probe_repeats(48, 9, 0.8) == 2
    assert probe_repeats(4, 9, 3.0) == 0 and probe_repeats(4, 9, 4.0) == 1
    model = GPT2(SMALL, random_params(SMALL, seed=2))
    assert model.row_cost_shape(9, passes=3.0) is None
    calls = []
    readings = block_readings(lambda *a: calls.append(1), model.params, SMALL, 9, repeats=probe_repeats(4, 9, 8.0))
    assert len(calls) == 1 + (ONE_ROW_READINGS + 8) * 2, len(calls)
    assert [len(readings[M]) for M in (1, 2, 9)] == [2 * ONE_ROW_READINGS, 2, 2], readings


def test_v_shape_is_the_ratio_of_the_fastest_readings_to_one_row():
    """A scripted clock: M rows take M + 1 ticks, except one slow reading of 2 rows (the fastest ignores it)."""
    ticks, slow = iter(range(10_000)), iter([0, 50, 0])

    def block(x, params, cache, layer, n_head):
        for _ in range(len(x) + (next(slow) if len(x) == 2 else 0)):
            next(ticks)

    shape = row_cost_shape(block, {"blocks": [{}]}, SMALL, 3, repeats=3, clock=lambda: next(ticks))
    assert shape == {1: 1.0, 2: 1.5, 3: 2.0}, shape


def test_slow_readings_never_make_a_size_look_cheap_nor_cost_more_than_a_larger_one():
    """One reading of each size (a 40-token run at 1558M): the first one-row reading, one of the later ones and the
    only reading of 2 rows are slowed (a busy core: noise is one-sided). The thrown-away first reading and the
    fastest of the one-row readings keep the denominator true, so no size looks cheap (a slow denominator had a
    whole curve read 30 % low: v(2) 0.93 under Haswell, and auto drafted at alpha 0.3); the slowed size is capped by
    the next one's cost (lower_envelope)."""
    ticks, slow = iter(range(10_000)), iter([50, 0, 30, 0, 30])  # M rows take M + 1 ticks, plus a delay

    def block(x, params, cache, layer, n_head):
        for _ in range(len(x) + (next(slow) if len(x) <= 2 else 0)):
            next(ticks)

    shape = row_cost_shape(block, {"blocks": [{}]}, SMALL, 4, repeats=1, clock=lambda: next(ticks))
    assert shape == {1: 1.0, 2: 2.0, 3: 2.0, 4: 2.5}, shape  # the truth: 1.5, 2.0, 2.5; 2 rows read 33 ticks
    assert next(slow, None) is None, "the clock's script was not played out"


@pytest.mark.parametrize("M_max", [0, -1])
def test_a_probe_of_no_sizes_is_refused_in_one_line(M_max):
    with pytest.raises(ValueError, match="M_max"):
        row_cost_shape(transformer_block, random_params(SMALL, seed=0), SMALL, M_max)


def test_a_model_reads_its_shape_once_and_again_only_for_more_readings(monkeypatch):
    """A server or console decodes many runs with one model: the first run's probe serves the rest, unless a later
    run may take more readings of each size (a longer run), or asks for other sizes."""
    import gpt2np.model.forward as forward
    model, calls = GPT2(SMALL, random_params(SMALL, seed=3)), []
    real = forward.row_cost_shape
    monkeypatch.setattr(forward, "row_cost_shape", lambda *a: calls.append(a[4]) or real(*a))
    first = model.row_cost_shape(5, passes=3.0)                    # 4 layers: one reading of each size fits
    assert model.row_cost_shape(5, passes=3.0) is first and model.row_cost_shape(5, passes=1.0) is first
    assert calls == [1]
    model.row_cost_shape(5, passes=100.0)                          # three readings now fit: read again
    model.row_cost_shape(7, passes=100.0)                          # other sizes: read
    assert calls == [1, 3, 3], calls
    assert GPT2(SMALL, model.params).row_cost_shape(5, passes=1.0) is None  # another model object: its own record
