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
PROBE_CONTEXT cached positions, the sizes interleaved and read `repeats` times; v_shape is the ratio
of medians. It costs M_max x repeats blocks, about M_max x repeats x ROW_GROWTH / n_layer one-row
passes: for sizes 1-9 read 3 times, 0.7 of a pass at 1558M (48 blocks), 2.7 at 124M (12).
probe_repeats fits the readings to the time a caller grants. Nothing of the model or any run's
cache is touched: the probe has its own one-layer cache, and no random generator of the run is
drawn from.
"""
import time
from statistics import median

import numpy as np

from .kv_cache import KVCache

PROBE_REPEATS = 3    # readings of each size at most (the median): one block's reading is 5-10 % noisy at 124M-1558M
PROBE_CONTEXT = 64   # cached positions each probed row attends to, as early in a short run
ROW_GROWTH = 1.3     # a block over 1-16 rows costs about this many one-row blocks, on average (for the budget)


def probe_repeats(n_layer, M_max, passes):
    """Readings of each size 1..M_max that fit in `passes` one-row passes' time, at most PROBE_REPEATS
    (0: not one). A block is 1 / n_layer of a pass, less the head's share, so this errs on the short side.

    >>> probe_repeats(48, 9, 0.8), probe_repeats(24, 9, 0.8), probe_repeats(12, 9, 2.0), probe_repeats(12, 9, 0.8)
    (3, 1, 2, 0)
    """
    return int(min(PROBE_REPEATS, passes * n_layer / (M_max * ROW_GROWTH)))


def block_readings(block, params, config, M_max, repeats=PROBE_REPEATS, clock=time.perf_counter):
    """{M: [seconds of one block over M rows]} for M = 1..M_max, `repeats` readings each.

    block(x, block_params, cache, layer, n_head) is the pass's block function (forward.transformer_block);
    the sizes are interleaved (1, 2, ..., M_max, then again), each reading on the next layer.
    """
    if isinstance(M_max, bool) or not isinstance(M_max, (int, np.integer)) or M_max < 1:
        raise ValueError(f"the cost probe needs an integer M_max >= 1 (rows of its largest reading), got {M_max!r}")
    x = np.random.default_rng(0).standard_normal((M_max, config.n_embd)).astype(np.float32)  # [M_max, n_embd]
    cache = KVCache.allocate(1, config.n_head, PROBE_CONTEXT + M_max, config.d_head)
    blocks, readings, layer = params["blocks"], {M: [] for M in range(1, M_max + 1)}, 0
    for _ in range(repeats):
        for M in readings:
            cache.length = PROBE_CONTEXT                      # the same context for every reading
            start = clock()
            block(x[:M], blocks[layer % len(blocks)], cache, 0, config.n_head)  # [M, n_embd]
            readings[M].append(clock() - start)
            layer += 1
    return readings


def row_cost_shape(block, params, config, M_max, repeats=PROBE_REPEATS, clock=time.perf_counter):
    """v_shape(M) = the median block over M rows / over one row, M = 1..M_max (v_shape(1) = 1).

    >>> from types import SimpleNamespace as Config
    >>> ticks = iter(range(1000))                  # a scripted clock: each call reads the next tick
    >>> def block(x, params, cache, layer, n_head):
    ...     for _ in range(len(x)): next(ticks)     # a block over M rows takes M - 1 ticks more than one row
    >>> config = Config(n_embd=4, n_head=1, d_head=4)
    >>> row_cost_shape(block, {"blocks": [{}, {}]}, config, 3, repeats=2, clock=lambda: next(ticks))
    {1: 1.0, 2: 1.5, 3: 2.0}
    """
    readings = block_readings(block, params, config, M_max, repeats, clock)
    one = median(readings[1])
    return {M: 1.0 if M == 1 else median(seconds) / one for M, seconds in readings.items()}
