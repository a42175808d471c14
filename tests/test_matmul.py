"""matmul.py's few-row products: the same numbers as x @ w, and pieces OpenBLAS takes its fast path for.

Timing is measured by `python -m bench`, never here; these tests check what can be wrong silently:
a piece missed or done twice, a piece too big for the small-matrix kernel, BLAS threads not restored.
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_params
from gpt2np import matmul as mm
from gpt2np.config import GPT2Config
from gpt2np.model import GPT2
from gpt2np.reference import gpt2_reference


def column_major(rng, k, n):
    return np.asfortranarray(rng.standard_normal((k, n), dtype=np.float32))


def max_relative_error(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@given(m=st.integers(1, 20), k=st.integers(1, 100_000), n=st.integers(1, 5000))
@settings(max_examples=200, deadline=None)
def test_pieces_cover_the_product_once_fit_the_small_kernel_and_free_the_gil(m, k, n):
    todo = mm.pieces(m, k, n)
    if todo is None:  # plain x @ w: one row, many rows, already small, or x too big for the kernel
        assert m == 1 or m > mm.MAX_ROWS or m * k * n <= mm.SMALL_MNK or m * k > mm.SMALL_MNK
        return
    covered = np.zeros(n, np.int8)
    for i, (j0, j1, width) in enumerate(todo):
        covered[j0:j1] += 1
        assert m * k * width <= mm.SMALL_MNK and m * width <= mm.SMALL_MN  # each product of one call
        if i < len(todo) - 1:  # every call but the last writes enough output for NumPy to drop the GIL
            assert m * (j1 - j0) > mm.GIL_FREE_OUTPUT
    assert (covered == 1).all(), f"{(covered != 1).sum()} of {n} columns covered other than once"


@pytest.mark.parametrize("m, k, n", [(2, 1024, 4096), (5, 1024, 3072), (5, 4096, 1024), (9, 768, 2304),
                                     (16, 1024, 1024), (5, 768, 50257), (3, 1500, 700)])
def test_matmul_equals_numpy(m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, w = rng.standard_normal((m, k), dtype=np.float32), column_major(rng, k, n)
    assert mm.pieces(m, k, n) is not None  # these shapes take the pieces path
    got, want = mm.matmul(x, w), x @ w
    err = max_relative_error(got, want)
    assert got.shape == (m, n) and got.dtype == np.float32
    # float32 sums of up to 4096 terms in another order: measured <= 3e-7 of the largest entry
    assert err <= 2e-6, f"max |matmul - x @ w| = {err:.2e} of max |x @ w|"


def test_row_major_weights_and_one_row_are_plain_products():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 1024), dtype=np.float32), rng.standard_normal((1024, 2048), dtype=np.float32)
    np.testing.assert_array_equal(mm.matmul(x, w), x @ w)          # C-order w: not cut
    wf = np.asfortranarray(w)
    np.testing.assert_array_equal(mm.matmul(x[:1], wf), x[:1] @ wf)  # one row: gemv already streams


@pytest.mark.skipif(mm._BLAS is None, reason="needs NumPy's OpenBLAS and threadpoolctl")
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("k, n", [(1024, 2048), (64, 256)])  # shared between threads, and not (small w)
def test_blas_threads_restored_and_any_thread_count_agrees(threads, k, n):
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(threads)
    x, w = rng.standard_normal((5, k), dtype=np.float32), column_major(rng, k, n)
    assert mm.pieces(5, k, n) is not None
    with threadpool_limits(limits=threads, user_api="blas"):
        got = mm.matmul(x, w)
        assert mm._BLAS.get_num_threads() == threads
    assert max_relative_error(got, x @ w) <= 2e-6


def test_model_through_many_pieces_equals_reference(monkeypatch):
    """Shrink the thresholds so a small model's every product goes through pieces: several products
    in one call, one, and a narrower rest."""
    config = GPT2Config(n_vocab=50, n_ctx=16, n_embd=24, n_head=3, n_layer=2)
    monkeypatch.setattr(mm, "COLUMN_MAJOR_MIN", 1)  # column-major weights, shared between threads
    model = GPT2(config, random_params(config, seed=3))
    assert model.params["blocks"][0]["mlp"]["c_proj"]["w"].T.flags.c_contiguous
    ids = np.random.default_rng(4).integers(0, 50, 12)
    plain = model.forward(ids[4:], cache_after(model, ids[:4]), n_logits=8)
    monkeypatch.setattr(mm, "SMALL_MNK", 8 * 96 * 5)
    monkeypatch.setattr(mm, "SMALL_MN", 40)
    monkeypatch.setattr(mm, "GIL_FREE_OUTPUT", 100)
    assert mm.pieces(8, 4 * 24, 24) == ((0, 15, 5), (15, 24, 5))  # MLP down-projection: 3 products, 1, a rest
    cut = model.forward(ids[4:], cache_after(model, ids[:4]), n_logits=8)  # [8, n_vocab]
    slow = gpt2_reference(ids, model.params, config)[4:]
    print(f"max |pieces - plain| = {np.abs(cut - plain).max():.2e}, vs reference {np.abs(cut - slow).max():.2e}")
    np.testing.assert_allclose(cut, plain, rtol=0, atol=1e-5)
    np.testing.assert_allclose(cut, slow, rtol=0, atol=1e-5)


def cache_after(model, ids):
    cache = model.new_cache()
    model.forward(ids, cache)
    return cache


def _product_in_child(queue):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((5, 1024), dtype=np.float32), column_major(rng, 1024, 2048)
    queue.put(max_relative_error(mm.matmul(x, w), x @ w))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_helper_threads():
    """A child forked after the parent used the helper threads has none of them: without new ones,
    its first shared product would wait forever for a helper that never runs."""
    import multiprocessing
    rng = np.random.default_rng(0)
    mm.matmul(rng.standard_normal((5, 1024), dtype=np.float32), column_major(rng, 1024, 2048))  # helpers started
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_product_in_child, args=(queue,))
    child.start()
    child.join(timeout=30)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's product never finished (no helper thread)")
    assert child.exitcode == 0 and queue.get(timeout=5) <= 2e-6


def test_a_helpers_exception_reaches_the_caller_and_the_helper_lives_on():
    def fail():
        raise ZeroDivisionError("in the helper")
    with pytest.raises(ZeroDivisionError, match="in the helper"):
        mm.helpers(1)[0].submit(fail).result()
    assert mm.helpers(1)[0].submit(sum, [1, 2, 3]).result() == 6
