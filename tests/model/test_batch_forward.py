"""Several sequences in one forward pass (model/batch.py): forward_packed against its reference,
forward_separately (each sequence alone through GPT2.forward), on random small models and the bundled
target; the caches afterwards; caches sized for one request (GPT2.new_cache(n_ctx)); the checks.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2np
from conftest import random_params
from gpt2np.model.batch import forward_packed, forward_separately, packed_forward
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2

SMALL = GPT2Config(n_vocab=37, n_ctx=200, n_embd=12, n_head=3, n_layer=2)
# A sequence's logits packed against alone: the same arithmetic, but products over more rows sum in
# another order in float32. Measured max |difference|: random small models 2.4e-7 to 4.8e-7 (logits ~1)
# under SkylakeX, up to 2.5e-6 under the Haswell kernels (whose `rows` multiplies 2-7 rows one gemv each:
# another order again; 40 hypothesis examples, 2026-11-27); bundled shakespeare-2.6M 4.3e-6 to 8.6e-6
# (logits up to ~5), decode, prefill and 120-row prefills alike, where one sequence fed a token at a time
# against in one call already differs by up to 1.1e-5 (test_tree_forward.py). Keys and values in the
# caches: 0 (small, SkylakeX), up to 2.2e-6 (small, Haswell), up to 4.8e-6 (bundled).
ATOL = {"random small": 1e-5, "bundled shakespeare-2.6M": 3e-5}


@pytest.fixture(scope="module")
def models():
    return {"random small": GPT2(SMALL, random_params(SMALL, seed=0)),
            "bundled shakespeare-2.6M": gpt2np.load_model("shakespeare-2.6M")}


def caches_after(model, prefixes, sizes=None):  # one cache per prefix, the prefix already fed
    caches = []
    for i, prefix in enumerate(prefixes):
        cache = model.new_cache(None if sizes is None else sizes[i])
        if len(prefix):
            model.forward(prefix, cache)
        caches.append(cache)
    return caches


def packed_against_alone(model, prefixes, new_ids, n_logits, which):  # -> max |diff| of logits, of k/v
    packed_caches, alone_caches = caches_after(model, prefixes), caches_after(model, prefixes)
    packed = forward_packed(model, list(zip(new_ids, packed_caches)), n_logits)
    alone = forward_separately(model, list(zip(new_ids, alone_caches)), n_logits)
    assert [p.shape for p in packed] == [a.shape for a in alone] and all(p.dtype == np.float32 for p in packed)
    assert [len(c) for c in packed_caches] == [len(c) for c in alone_caches] == \
        [len(p) + len(n) for p, n in zip(prefixes, new_ids)]
    diff = max(float(np.abs(p - a).max()) for p, a in zip(packed, alone))
    kv_diff = max(float(np.abs(getattr(p, kv)[:, :, :len(p)] - getattr(a, kv)[:, :, :len(a)]).max())
                  for p, a in zip(packed_caches, alone_caches) for kv in "kv")
    print(f"{which}: max |packed - alone| logits {diff:.2e}, keys/values {kv_diff:.2e}")
    assert diff <= ATOL[which], f"{which}: max |packed - alone| logits = {diff:.2e} > {ATOL[which]}"
    assert kv_diff <= ATOL[which], f"{which}: max |packed - alone| keys/values = {kv_diff:.2e} > {ATOL[which]}"
    return diff


LAYOUTS = {  # prefix lengths, new rows, n_logits
    "decode, 1 row each": ([3, 0, 17, 30], [1, 1, 1, 1], 1),
    "prefill, several rows each": ([0, 0, 0], [5, 12, 2], [1, 3, 2]),
    "mixed: prefill beside decode": ([9, 0, 25, 4], [1, 7, 1, 3], [1, 7, 1, 2]),
    "long prefills (blocked attention)": ([0, 1, 0], [120, 40, 100], [1, 40, 2]),
    "one sequence": ([6], [4], 2),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("which", ["random small", "bundled shakespeare-2.6M"])
def test_each_sequence_gets_what_it_gets_alone(models, which, layout):
    model = models[which]
    rng = np.random.default_rng(len(layout))
    n_prefix, n_new, n_logits = LAYOUTS[layout]
    prefixes = [rng.integers(0, model.n_vocab, n) for n in n_prefix]
    packed_against_alone(model, prefixes, [rng.integers(0, model.n_vocab, n) for n in n_new], n_logits, which)


@settings(deadline=None, max_examples=40)
@given(data=st.data(), n_seqs=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_any_packing_on_a_random_model(models, data, n_seqs, seed):
    rng = np.random.default_rng(seed)
    n_prefix = data.draw(st.lists(st.integers(0, 12), min_size=n_seqs, max_size=n_seqs))
    n_new = data.draw(st.lists(st.integers(1, 8), min_size=n_seqs, max_size=n_seqs))
    n_logits = [data.draw(st.integers(1, n)) for n in n_new]
    packed_against_alone(models["random small"], [rng.integers(0, SMALL.n_vocab, n) for n in n_prefix],
                         [rng.integers(0, SMALL.n_vocab, n) for n in n_new], n_logits, "random small")


def test_one_sequence_packed_is_its_forward_bit_for_bit(models):
    """The packed layers over a single block (packed_forward) are forward's arithmetic exactly, and
    forward_packed sends one sequence to forward itself (the same numbers, without the blocks' bookkeeping)."""
    model = models["bundled shakespeare-2.6M"]
    ids = np.random.default_rng(1).integers(0, model.n_vocab, 50)
    for n_past, n_logits in [(0, 1), (10, 3), (30, 20)]:
        (a,), (b,), (c,) = (caches_after(model, [ids[:n_past]]) for _ in range(3))
        new = ids[n_past:]
        packed = packed_forward(new, [len(new)], [a], model.params, model.config.n_head, [n_logits])
        np.testing.assert_array_equal(packed, model.forward(new, b, n_logits))
        np.testing.assert_array_equal(forward_packed(model, [(new, c)], n_logits)[0], packed)
        assert len(a) == len(b) == len(c) == len(ids)


def test_decoding_goes_on_from_the_packed_caches(models):
    """Three sequences decoded 12 steps, packed every step, against each fed alone: the caches a packed
    call leaves are ones the next call (packed or alone) can build on."""
    model, which = models["bundled shakespeare-2.6M"], "bundled shakespeare-2.6M"
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, model.n_vocab, n) for n in (4, 11, 1)]
    packed, alone = caches_after(model, [[], [], []]), caches_after(model, [[], [], []])
    feeds, worst = prompts, 0.0
    for _ in range(12):
        p = forward_packed(model, list(zip(feeds, packed)))
        a = forward_separately(model, list(zip(feeds, alone)))
        worst = max(worst, max(float(np.abs(x - y).max()) for x, y in zip(p, a)))
        feeds = [np.array([int(np.argmax(x[-1]))]) for x in a]  # the same next tokens for both
    print(f"12 packed decode steps: max |packed - alone| = {worst:.2e}")
    assert worst <= ATOL[which], f"max |packed - alone| over 12 steps = {worst:.2e} > {ATOL[which]}"


def test_a_cache_sized_for_the_request_gives_the_same_numbers(models):
    model = models["bundled shakespeare-2.6M"]
    ids = np.random.default_rng(2).integers(0, model.n_vocab, 20)
    full, sized = model.new_cache(), model.new_cache(n_ctx=21)
    assert sized.k.shape == (8, 5, 21, 32) and sized.k.nbytes * 256 == full.k.nbytes * 21
    for cache in (full, sized):
        model.forward(ids[:15], cache)
    np.testing.assert_array_equal(model.forward(ids[15:], sized, 5), model.forward(ids[15:], full, 5))
    assert model.new_cache().k.shape == (8, 5, 256, 32)  # the default is unchanged: the whole context
    with pytest.raises(ValueError, match="20 cached \\+ 2 new tokens exceed this cache's 21 positions"):
        model.forward([1, 2], sized)
    with pytest.raises(ValueError, match=r"\(sequence 1\) exceed this cache's 21 positions"):
        forward_packed(model, [([1], model.new_cache()), ([1, 2], sized)])


@pytest.mark.parametrize("n_ctx", [0, 257, 2.0, True, "8"])
def test_new_cache_refuses_sizes_outside_the_context(models, n_ctx):
    with pytest.raises(ValueError, match=r"new_cache needs an integer n_ctx in \[1, 256\]"):
        models["bundled shakespeare-2.6M"].new_cache(n_ctx)


def test_bad_packed_calls_are_one_line_errors(models):
    model, other = models["random small"], models["bundled shakespeare-2.6M"]
    cache = model.new_cache()
    bad = [
        (lambda: forward_packed(model, []), "non-empty list"),
        (lambda: forward_packed(model, [([1], cache), ([2], cache)]), "sequence 1's cache is also another"),
        (lambda: forward_packed(model, [([1], cache), ([1, 40], model.new_cache())]),
         r"sequence 1's token ids must be in \[0, 37\): 40 at position 1"),
        (lambda: forward_packed(model, [([1], cache)], n_logits=[1, 1]), "one per sequence"),
        (lambda: forward_packed(model, [([1, 2], cache)], n_logits=3), "sequence 0: need 1 <= n_logits"),
        (lambda: forward_packed(model, [([1], other.new_cache())]), "this cache is"),
        (lambda: forward_packed(object(), [([1], cache)]), "needs a GPT2 model"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
    assert len(cache) == 0  # nothing ran


@pytest.mark.parametrize("layout, shared", [("decode, 1 row each", True), ("long prefills (blocked attention)", False)])
def test_short_blocks_share_the_cores_and_a_long_one_keeps_its_own_split(models, monkeypatch, layout, shared):
    """Under two BLAS threads, a step of short blocks hands its blocks' attention to two threads (the
    threshold of total scores lowered for this small model); a step with a block long enough for
    blocked attention runs the blocks one by one (each long one then splits itself between the
    cores). Either way every sequence gets what it gets alone."""
    from threadpoolctl import threadpool_limits
    from gpt2np.model import batch
    monkeypatch.setattr(batch, "SHARE_MIN_SCORES", 1)
    calls, share = [], batch.share
    monkeypatch.setattr(batch, "share", lambda work, tasks, n: calls.append(n) or share(work, tasks, n))
    model, which = models["random small"], "random small"
    rng = np.random.default_rng(7)
    n_prefix, n_new, n_logits = LAYOUTS[layout]
    with threadpool_limits(limits=2, user_api="blas"):
        if batch.threads_allowed() < 2:
            pytest.skip("needs two CPUs and NumPy's OpenBLAS (threadpoolctl): nothing to share otherwise")
        packed_against_alone(model, [rng.integers(0, model.n_vocab, n) for n in n_prefix],
                             [rng.integers(0, model.n_vocab, n) for n in n_new], n_logits, which)
    # one share per layer; with long prefills the last layer's blocks are short (only the rows whose
    # logits are wanted go on to it), so only the layers before it keep their blocks one by one
    assert calls == ([2] * SMALL.n_layer if shared else [1] * (SMALL.n_layer - 1) + [2]), calls


def test_a_small_steps_attention_stays_on_one_core():
    """Waking a helper costs more than a few short attentions (124M, 2 sequences at context 64); a long
    enough step shares them; a block long enough to split itself keeps the blocks one by one."""
    from gpt2np.model.batch import BLOCKS_MIN_SCORES, SHARE_MIN_SCORES, shares_the_cores
    assert not shares_the_cores([12 * 151] * 2)                           # 2 sequences, 12 heads, 151 keys
    assert 2 * 64 * 151 >= SHARE_MIN_SCORES and shares_the_cores([64 * 151] * 2)
    assert not shares_the_cores([64 * 151 * 2])                           # one sequence
    assert 64 * 40 * 190 >= BLOCKS_MIN_SCORES and not shares_the_cores([64 * 151, 64 * 40 * 190])  # 40 rows


TOGETHER = {  # cache lengths, new rows, queries per block
    "decode, one row each, an empty cache among them": ([0, 1, 7, 8, 9, 40, 63, 130], [1] * 8, [1] * 8),
    "verification, K + 1 rows each": ([5, 17, 30, 33], [5, 5, 5, 5], [5, 5, 5, 5]),
    "verification, K clamped for some": ([20, 21, 26, 9], [3, 1, 3, 2], [3, 1, 3, 2]),
    "a prefill's last layer: queries for the last rows only": ([0, 4, 2], [9, 6, 9], [1, 2, 9]),
}


def together_against_apart(model, layout, rng):  # -> (q, q_starts, the caches attention_together wrote)
    """attention_together and blocks_attention (one core) over the same blocks, each on its own copy of
    the caches: the same heads and the same keys and values written, bit for bit."""
    from gpt2np.model.batch import StepAttention, attention_together, blocks_attention, padded_mask
    c = model.config
    n_past, n_new, n_q = TOGETHER[layout]
    ours, theirs = (caches_after(model, [rng.integers(0, model.n_vocab, n) for n in n_past]) for _ in range(2))
    for a, b in zip(ours, theirs):  # the same prefixes in both lists
        b.k[:], b.v[:] = a.k, a.v
    starts, q_starts = np.cumsum([0, *n_new]), np.cumsum([0, *n_q])
    q = rng.standard_normal((c.n_head, q_starts[-1], c.d_head)).astype(np.float32)
    k, v = rng.standard_normal((2, c.n_head, starts[-1], c.d_head)).astype(np.float32)
    n_kvs = [p + n for p, n in zip(n_past, n_new)]
    plan = StepAttention(starts.tolist(), q_starts.tolist(), n_kvs, 1, padded_mask(n_q, n_kvs))
    heads = attention_together(q, k, v, ours, c.n_layer - 1, plan)
    apart = blocks_attention(q, k, v, theirs, c.n_layer - 1, plan._replace(mask=None))
    assert heads.shape == apart.shape == q.shape and heads.dtype == np.float32
    np.testing.assert_array_equal(heads, apart)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.k, b.k)
        np.testing.assert_array_equal(a.v, b.v)
    return q, q_starts, ours


@pytest.mark.parametrize("layout", TOGETHER)
def test_the_blocks_attention_together_is_each_blocks_own_bit_for_bit(models, layout):
    """attention_together (every block's scores in one padded array, the scale, mask and exp once for
    all) against cached_attention block by block: the same numbers, bit for bit."""
    together_against_apart(models["bundled shakespeare-2.6M"], layout, np.random.default_rng(3))


def test_the_padded_rows_sum_otherwise():
    """The control: where the lengths differ, summing the padded rows, as one softmax over the step's
    scores would, gives other numbers than each block's own sum (why those are its own calls)."""
    from gpt2np.model.batch import padded_mask
    model = GPT2(SMALL, random_params(SMALL, seed=0))
    layout = "decode, one row each, an empty cache among them"
    q, q_starts, caches = together_against_apart(model, layout, np.random.default_rng(5))
    n_q, n_kvs = TOGETHER[layout][2], [len(cache) for cache in caches]  # the caches now hold the new rows
    scores = np.zeros((len(caches), SMALL.n_head, max(n_q), max(n_kvs)), np.float32)
    for i, (cache, n_kv) in enumerate(zip(caches, n_kvs)):
        scores[i, :, :n_q[i], :n_kv] = q[:, q_starts[i]:q_starts[i + 1]] @ cache.k[-1, :, :n_kv].transpose(0, 2, 1)
    e = np.exp(scores + padded_mask(n_q, n_kvs))
    padded = e.sum(axis=-1)                                            # [B, n_head, 1]
    own = np.stack([e[i, :, :, :n_kv].sum(axis=-1) for i, n_kv in enumerate(n_kvs)])
    assert not np.array_equal(padded, own), "a padded sum equals each block's own: the control shows nothing"


def test_padding_that_would_more_than_double_many_scores_keeps_the_blocks_apart():
    """Together for a decode step (at 3 heads its padding costs nothing; at 64, sequences of one length),
    apart where one sequence is five times as long, for one sequence, and beside a long block."""
    from gpt2np.model.batch import BLOCKS_MIN_SCORES, PAD_FREE_SCORES, pads_little, step_attention
    caches = [gpt2np.random_model(SMALL, tokenizer=None).new_cache() for _ in range(4)]
    for cache, n in zip(caches, [3, 0, 17, 30]):
        cache.length = n
    plan = step_attention(3, np.arange(5), [1] * 4, caches)            # a decode step of 4 sequences
    assert plan.n_threads == 1 and plan.mask is not None and plan.mask.shape == (4, 1, 1, 31)
    assert plan.n_kvs == [4, 1, 18, 31] and plan.starts == plan.q_starts == [0, 1, 2, 3, 4]
    assert pads_little([64 * 100] * 3, 64 * 3 * 100)                   # 64 heads, three of one length
    assert 64 * 4 * 500 > max(2 * 64 * (3 * 100 + 500), PAD_FREE_SCORES)
    assert not pads_little([64 * 100] * 3 + [64 * 500], 64 * 4 * 500)  # and one five times as long
    assert not pads_little([64 * 100], 64 * 100)                       # one sequence: nothing to share
    assert 3 * 90 * 130 >= BLOCKS_MIN_SCORES and not pads_little([3 * 90 * 130, 3 * 40], 3 * 2 * 90 * 130)


def test_a_packed_step_takes_its_blocks_together_unless_padding_them_costs_too_much(models, monkeypatch):
    """Which attention a packed step runs on one core: a decode step, a verification, and (3 heads: its
    padding costs nothing) a prefill beside decode rows, attention_together; blocks long enough for
    blocked attention, each block's own cached_attention. Every sequence gets what it gets alone."""
    from gpt2np.model import batch
    seen = []
    for name in ("attention_together", "blocks_attention"):
        real = getattr(batch, name)
        monkeypatch.setattr(batch, name, lambda *a, real=real, name=name: seen.append(name) or real(*a))
    model, which = models["random small"], "random small"
    rng = np.random.default_rng(11)
    for n_prefix, n_new, n_logits, expected in [([3, 0, 17, 30], [1] * 4, 1, ["attention_together"] * 2),
                                                ([12, 14, 9], [4, 4, 4], 4, ["attention_together"] * 2),
                                                ([9, 0, 25, 4], [1, 7, 1, 3], [1, 7, 1, 2], ["attention_together"] * 2),
                                                ([0, 1, 0], [120, 40, 100], [1, 40, 2], ["blocks_attention"] * 2)]:
        seen.clear()
        packed_against_alone(model, [rng.integers(0, model.n_vocab, n) for n in n_prefix],
                             [rng.integers(0, model.n_vocab, n) for n in n_new], n_logits, which)
        assert seen == expected, (n_prefix, n_new, seen)
