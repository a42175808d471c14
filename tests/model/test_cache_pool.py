"""model.new_cache() lends the arrays of caches nobody holds (kv_cache.CachePool): never while a cache or a
view of its arrays is held, never to two caches at once, no more arrays than were in use at once, and a
lent cache, whatever an earlier run left in it, gives the logits a new one gives, bit for bit."""
import threading
import weakref

import numpy as np

from conftest import random_params
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.model import rows
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.model.kv_cache import KVCache

SMALL = GPT2Config(n_vocab=37, n_ctx=40, n_embd=12, n_head=3, n_layer=2)


def model(seed=0):
    return GPT2(SMALL, random_params(SMALL, seed))


def test_a_cache_s_arrays_are_lent_again_only_once_nothing_holds_them():
    m = model()
    a = m.new_cache(20)
    keys = a.k
    b = m.new_cache(20)
    assert not np.shares_memory(a.k, b.k) and not np.shares_memory(a.v, b.v)  # a is held
    del a
    c = m.new_cache(20)
    assert not np.shares_memory(c.k, keys)  # a is gone, but a view of its keys is held
    del keys
    d = m.new_cache(20)
    assert not any(np.shares_memory(d.k, x.k) for x in (b, c))  # b and c are held
    assert len(m.cache_pool.pairs) == 3 and sum(np.shares_memory(d.k, p[0]) for p in m.cache_pool.pairs) == 1
    values = c.v
    del c
    assert not np.shares_memory(m.new_cache(20).v, values)  # c is gone, but a view of its values is held
    del values
    e = m.new_cache(12)  # c's arrays (20 positions), the smallest idle pair, lent as 12
    assert e.n_ctx == 12 and e.k.shape == e.v.shape == (2, 3, 12, 4) and len(e) == 0
    assert len(m.cache_pool.pairs) == 4 and not any(np.shares_memory(e.k, x.k) for x in (b, d))
    assert sum(np.shares_memory(e.v, p[1]) and p[0].shape[2] == 20 for p in m.cache_pool.pairs) == 1


def test_the_pool_keeps_no_more_arrays_than_were_in_use_at_once_and_clear_lets_them_go():
    m = model()
    held = [m.new_cache(n) for n in (5, 10, 15)]
    del held
    for n in (30, 35, 40, 8, 39):  # one at a time, each dropped at once; no idle pair fits the first three
        cache = m.new_cache(n)
        assert len(m.cache_pool.pairs) <= 3, [p[0].shape for p in m.cache_pool.pairs]
        del cache
    assert sorted(p[0].shape[2] for p in m.cache_pool.pairs) == [30, 35, 40]  # 8 and 39 were lent 30 and 40
    kept = m.new_cache(8)
    m.cache_pool.clear()
    assert len(m.cache_pool.pairs) == 1 and np.shares_memory(kept.k, m.cache_pool.pairs[0][0])


def test_a_lent_cache_gives_a_new_cache_s_logits_bit_for_bit():
    """An earlier run's keys and values are left past the new cache's length: attention never reads them."""
    m = model(1)
    rng = np.random.default_rng(0)
    used = m.new_cache()
    m.forward(rng.integers(0, SMALL.n_vocab, 30), used, 30)
    used.k[...], used.v[...] = 1e6, -1e6  # past every later length too
    pair = next(p for p in m.cache_pool.pairs if np.shares_memory(p[0], used.k))
    del used
    ids = rng.integers(0, SMALL.n_vocab, 9)
    lent, new = m.new_cache(25), KVCache.allocate(SMALL.n_layer, SMALL.n_head, 25, SMALL.d_head)
    assert np.shares_memory(lent.k, pair[0])
    for cache in (lent, new):  # a prefill, two single tokens, a rolled-back chain, a tree's rows
        cache.logits = [m.forward(ids[:5], cache, 5), m.forward(ids[5:6], cache), m.forward(ids[6:7], cache)]
        cache.logits.append(m.forward(ids[7:9], cache, 2))
        cache.truncate(7)
        parents = [-1, 0, 0, 1]
        cache.logits.append(m.forward_rows(ids[5:9], rows.tree_positions(parents, 7), rows.tree_scope(parents), cache))
    for got, want in zip(lent.logits, new.logits):
        assert np.array_equal(got, want), float(np.abs(got - want).max())


def test_runs_after_runs_on_lent_caches_give_what_runs_on_new_arrays_give():
    """Greedy and seeded sampling, chains and trees, speculative and plain: each on a model that has run before
    (its caches lent) equals the same on a new model (new arrays); the pool stops growing after the first runs."""
    def runs(target, draft):
        out = [generate(target, [1, 2, 3, 4, 5], 20, temperature=0)]
        for tree in (None, (2, 1)):
            for temperature in (0, 1.0):
                out.append(speculative_generate(target, draft, [1, 2, 3, 4, 5], 20, temperature=temperature,
                                                tree=tree, rng=np.random.default_rng(7)).tokens)
        return out

    target, draft = model(2), model(3)
    first = runs(target, draft)
    sizes = len(target.cache_pool.pairs), len(draft.cache_pool.pairs)
    for _ in range(3):
        assert runs(target, draft) == runs(model(2), model(3)) == first
    assert (len(target.cache_pool.pairs), len(draft.cache_pool.pairs)) == sizes, sizes
    assert first[1] == first[0]  # greedy speculative = greedy


def test_threads_never_hold_one_array_at_once():
    """Four threads take and drop caches of random sizes: no cache is ever lent arrays a live one holds."""
    m, lock, held, clashes = model(), threading.Lock(), [], []  # held: weak references to every cache taken

    def work(seed):
        rng, mine = np.random.default_rng(seed), []
        try:
            for _ in range(200):
                if mine and rng.random() < 0.5:
                    mine.pop(int(rng.integers(len(mine))))
                    continue
                cache = m.new_cache(int(rng.integers(1, SMALL.n_ctx + 1)))
                with lock:
                    live = [c for c in (ref() for ref in held) if c is not None]
                    clashes.extend(1 for other in live if np.shares_memory(other.k, cache.k))
                    held.append(weakref.ref(cache))
                mine.append(cache)
        except Exception as e:  # a thread's exception would only be a warning
            clashes.append(repr(e))

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clashes, (len(clashes), clashes[:3])
    assert len(m.cache_pool.pairs) < 4 * 200  # lent again, not only allocated
