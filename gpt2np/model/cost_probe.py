"""The shape of this machine's cost curve, read in a fraction of one pass: v(M) of one block over M rows.

A K policy plans with v(M), the cost of a target pass over M new tokens in one-token passes. A run
times only the sizes it plays, and a line through two or three of them misprices a curve that is
flat for a while and then steps (PERFORMANCE.md, "What auto still pays for": on panels the 1558M
curve is flat from 2 to 6 rows and steps at 7 and 9). Every block of a GPT-2 has the same shapes,
and a pass is n_layer blocks plus the head, so one block's cost over M rows, against its cost over
one row, is the pass's curve up to what the blocks do not hold (the embedding, the head, Python):

    v_shape(M) = block(M) / block(1)        (the policy scales v_shape - 1 to the sizes it times)

Read with the pass's own functions and the model's own weights (the same few-row products, cut as
the running BLAS kernel cuts them), so whatever kernel NumPy loaded is what is measured: nothing is
assumed per CPU. Each reading runs one block (the layers in turn, so that no block's weights are
still in the core's cache when they are read again, as in a pass) over M rows of fixed input after
PROBE_CONTEXT cached positions, the sizes interleaved and read `repeats` times, the one-row size
ONE_ROW_READINGS times as often (it is every ratio's denominator), after one reading thrown away.

A reading of one block is 5-10 ms at 1558M, and on a shared machine the clock's noise there is
one-sided and heavy: a reading taken while the other core is busy, or the first after other work,
reads up to 2.5x its cost, never much less (PERFORMANCE.md, "The probe's noise"). So each size keeps
its fastest reading, and the curve is the lower envelope of those (a block over M rows costs no more
than over more rows): v_shape(M) = min over M' >= M of the fastest reading of M' rows, over the same
for one row. It costs M_max x repeats blocks and a few one-row ones, about
M_max x repeats x ROW_GROWTH / n_layer one-row passes: for sizes 1-9 read 3 times, 0.9 of a pass at
1558M (48 blocks), 3.5 at 124M (12). probe_repeats fits the readings to the time a caller grants.
Nothing of the model or any run's cache is touched: the probe has its own one-layer cache, and no
random generator of the run is drawn from.
"""
import time
from itertools import accumulate

import numpy as np

from .kv_cache import KVCache

PROBE_REPEATS = 3    # readings of each size at most (the fastest kept)
ONE_ROW_READINGS = 3 # readings of one row in each repeat: the denominator of every size's ratio
PROBE_CONTEXT = 64   # cached positions each probed row attends to, as early in a short run
ROW_GROWTH = 1.3     # a block over 1-16 rows costs about this many one-row blocks, on average (for the budget)


def probe_repeats(n_layer, M_max, passes):
    """Readings of each size 1..M_max that fit in `passes` one-row passes' time, at most PROBE_REPEATS
    (0: not one), with the one-row reading thrown away and the ONE_ROW_READINGS - 1 more of one row in
    each repeat. A block is 1 / n_layer of a pass, less the head's share, so this errs on the short side.

    >>> probe_repeats(48, 9, 1.0), probe_repeats(48, 9, 0.4), probe_repeats(24, 9, 0.8), probe_repeats(12, 9, 0.8)
    (3, 1, 1, 0)
    """
    per_repeat = M_max * ROW_GROWTH + ONE_ROW_READINGS - 1  # one-row blocks
    return int(min(PROBE_REPEATS, (passes * n_layer - 1) / per_repeat))


def block_readings(block, params, config, M_max, repeats=PROBE_REPEATS, clock=time.perf_counter):
    """{M: [seconds of one block over M rows]} for M = 1..M_max, `repeats` readings each (of one row,
    ONE_ROW_READINGS x repeats).

    block(x, block_params, cache, layer, n_head) is the pass's block function (forward.transformer_block);
    one reading of one row thrown away, then the sizes interleaved (1, 1, 1, 2, ..., M_max, then again),
    each reading on the next layer.
    """
    if isinstance(M_max, bool) or not isinstance(M_max, (int, np.integer)) or M_max < 1:
        raise ValueError(f"the cost probe needs an integer M_max >= 1 (rows of its largest reading), got {M_max!r}")
    x = np.random.default_rng(0).standard_normal((M_max, config.n_embd)).astype(np.float32)  # [M_max, n_embd]
    cache = KVCache.allocate(1, config.n_head, PROBE_CONTEXT + M_max, config.d_head)
    blocks, readings = params["blocks"], {M: [] for M in range(1, M_max + 1)}
    sizes = [1] + ([1] * ONE_ROW_READINGS + list(range(2, M_max + 1))) * repeats  # the first thrown away
    for layer, M in enumerate(sizes):
        cache.length = PROBE_CONTEXT                          # the same context for every reading
        start = clock()
        block(x[:M], blocks[layer % len(blocks)], cache, 0, config.n_head)  # [M, n_embd]
        readings[M].append(clock() - start)
    readings[1].pop(0)                                        # the first block after other work reads slow
    return readings


def row_cost_shape(block, params, config, M_max, repeats=PROBE_REPEATS, clock=time.perf_counter):
    """v_shape(M) = the lower envelope of each size's fastest reading (lower_envelope), over one row's,
    M = 1..M_max (v_shape(1) = 1).

    >>> from types import SimpleNamespace as Config
    >>> ticks = iter(range(1000))                  # a scripted clock: each call reads the next tick
    >>> def block(x, params, cache, layer, n_head):
    ...     for _ in range(len(x)): next(ticks)     # a block over M rows takes M - 1 ticks more than one row
    >>> config = Config(n_embd=4, n_head=1, d_head=4)
    >>> row_cost_shape(block, {"blocks": [{}, {}]}, config, 3, repeats=2, clock=lambda: next(ticks))
    {1: 1.0, 2: 1.5, 3: 2.0}
    """
    readings = block_readings(block, params, config, M_max, repeats, clock)
    fastest = lower_envelope({M: min(seconds) for M, seconds in readings.items()})
    return {M: 1.0 if M == 1 else seconds / fastest[1] for M, seconds in fastest.items()}


def carried_on(shape, M_max):  # {M: v_shape(M)}, M = 1..m -> the same for M = 1..M_max, or None for None
    """A shape read up to m rows carried on to M_max along its last two rows' slope (never falling), for a
    caller that reads fewer sizes than it plans with (speculative.read_cost_shape: a tree policy in a short
    run reads its chains' sizes only). The sizes read are kept as read.

    >>> carried_on({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5}, 6)    # (1.5 - 1.1) / 2 a row past 4
    {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.5, 5: 1.7, 6: 1.9}
    """
    if shape is None:
        return None
    m = max(shape)
    slope = max(0.0, (shape[m] - shape[max(1, m - 2)]) / max(1, min(2, m - 1)))
    return {M: shape[M] if M <= m else round(shape[m] + slope * (M - m), 12) for M in range(1, M_max + 1)}


def lower_envelope(cost):  # {M: seconds} -> {M: seconds}, non-decreasing in M
    """Each size's cost capped by every larger size's: a reading above a larger size's was slowed by
    something else, since M rows never take more work than M' > M rows.

    >>> lower_envelope({1: 1.0, 2: 2.5, 3: 1.4, 4: 1.6})
    {1: 1.0, 2: 1.4, 3: 1.4, 4: 1.6}
    """
    sizes = sorted(cost)
    capped = list(accumulate((cost[M] for M in reversed(sizes)), min))[::-1]
    return dict(zip(sizes, capped))
