"""matmul.py's few-row products: every method gives the numbers of x @ w, under this process's BLAS
kernel and (one test) in a process running another kernel; the pieces fit OpenBLAS's fast paths.

Timing is measured by `python -m bench`, never here; these tests check what can be wrong silently:
a piece or block missed or done twice, a piece too big for the small-matrix kernel, a call too small
to free the GIL, BLAS threads not restored, a kernel given a method nobody measured for it.
"""
import functools
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_params
from gpt2np.model.fast import matmul as mm
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.model.fast.layout import set_weights_order
from gpt2np.model.reference import gpt2_reference


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


@given(m=st.integers(1, 20), k=st.integers(1, 100_000), n=st.integers(1, 60_000))
@settings(max_examples=200, deadline=None)
def test_row_blocks_cover_whole_blocks_once_and_free_the_gil(m, k, n):
    width, calls = mm.row_blocks(m, k, n)
    assert width >= 8 and (width == 8 or 4 * k * width <= mm.BLOCK_BYTES)  # a block stays cache-sized
    covered = np.zeros(n // width, np.int8)
    for i, (b0, b1) in enumerate(calls):
        covered[b0:b1] += 1
        if i < len(calls) - 1:  # every call but the last writes enough output for NumPy to drop the GIL
            assert m * (b1 - b0) * width > mm.GIL_FREE_OUTPUT
    assert (covered == 1).all(), f"{(covered != 1).sum()} of {len(covered)} blocks covered other than once"


SHAPES = [(2, 1024, 4096), (5, 1024, 3072), (5, 4096, 1024), (9, 768, 2304), (16, 1024, 1024), (5, 768, 50257),
          (3, 1500, 700), (8, 1600, 6400), (2, 6400, 1600), (13, 1024, 1024)]


@given(k=st.integers(1, 20_000), n=st.integers(1, 60_000))
@settings(max_examples=200, deadline=None)
def test_height_blocks_are_cache_sized_and_leave_less_than_a_block(k, n):
    height, n_blocks = mm.height_blocks(k, n)
    assert 1 <= height <= k and n_blocks == k // height and k - height * n_blocks < height
    assert height == k or height == 8 or 4 * height * n <= mm.BLOCK_BYTES  # a block stays cache-sized


@functools.lru_cache(maxsize=None)  # each shape is tested by 7 method-order pairs: one draw, one float64 product
def product_case(m, k, n):  # -> x [m, k], w [k, n] column-major (read-only), x @ w in float64
    rng = np.random.default_rng(m * k + n)
    x, w = rng.standard_normal((m, k), dtype=np.float32), column_major(rng, k, n)
    x.flags.writeable = w.flags.writeable = False
    return x, w, x.astype(np.float64) @ w.astype(np.float64)


CUTS = [(method, "column-major") for method in sorted(mm.BY_NAME) if method != "panels"] + \
    [(method, "row-major") for method in sorted(mm.BY_NAME) if method not in ("pieces", "panels")]  # pieces: column-
CASES = [(method, order, *shape) for method, order in CUTS for shape in SHAPES] + \
    [("panels", "panels", *shape) for shape in SHAPES if shape[2] % mm.PANEL == 0]  # major w only, else x @ w


@pytest.mark.parametrize("method, order, m, k, n", CASES)
def test_every_method_equals_numpy(method, order, m, k, n):
    """Each method, whatever this kernel's table picks, against x @ w in float64: on GPT-2's weights as
    stored (column-major), and made row-major or cut into panels for batches (model/fast/layout.py)."""
    x, w, want = product_case(m, k, n)
    if order == "row-major":
        w = np.ascontiguousarray(w)
        assert mm.layout(w) == "row-major"
    if order == "panels":
        w = mm.to_panels(w)
        assert mm.layout(w) == "panels" and mm.method_for(m, w) == "panels"
    if method == "pieces":
        assert mm.pieces(m, k, n) is not None  # these shapes are really cut
    got = mm.BY_NAME[method](x, w)
    err = max_relative_error(got, want)
    assert got.shape == (m, n) and got.dtype == np.float32
    # float32 sums of up to 6400 terms in another order: measured <= 6e-7 of the largest entry
    assert err <= 2e-6, f"{method} on {order} w under {mm.KERNEL}: max |product - x @ w| = {err:.2e} of max |x @ w|"



@pytest.mark.parametrize("method, order", CUTS + [("panels", "panels"), ("matmul", "column-major"),
                                                  ("matmul", "row-major"), ("matmul", "panels")])
def test_no_rows_give_the_empty_product(method, order):
    """[0, k] @ [k, n] is x @ w's empty [0, n] on every method and layout (by_rows' blocks and by_panels'
    slices once divided by the row count, or reshaped by it)."""
    _, w, _ = product_case(2, 1024, 4096)
    w = {"row-major": np.ascontiguousarray(w), "panels": mm.to_panels(w)}.get(order, w)
    x = np.zeros((0, 1024), np.float32)
    got = (mm.matmul if method == "matmul" else mm.BY_NAME[method])(x, w)
    assert got.shape == (0, 4096) and got.dtype == np.float32


@pytest.fixture(scope="module")
def kernel_weights():  # -> [(w as stored, w row-major, w in float64)]: drawn once for every row count
    rng = np.random.default_rng(0)
    found = []
    for k, n in ((1024, 4096), (4096, 1024), (160, 640)):  # GPT-2's column-major weights, a bundled row-major one
        w = column_major(rng, k, n) if k * n >= mm.COLUMN_MAJOR_MIN else rng.standard_normal((k, n), dtype=np.float32)
        found.append((w, np.ascontiguousarray(w), w.astype(np.float64)))
        for v in found[-1]:
            v.flags.writeable = False
    return found


@pytest.mark.parametrize("m", [1, 2, 5, 7, 8, 9, 15, 16])  # 7, 15: padded small weights under Haswell
def test_matmul_equals_numpy_with_the_method_this_kernel_gets(m, kernel_weights):
    rng = np.random.default_rng(m)
    for stored, row_major, w64 in kernel_weights:
        k, n = stored.shape
        x = rng.standard_normal((m, k), dtype=np.float32)
        full = x.astype(np.float64) @ w64  # [m, n]: the float64 product, its columns sliced for the slice
        for w, want in ((stored, full), (row_major, full), (row_major[:, n // 4:], full[:, n // 4:])):  # stored,
            err = max_relative_error(mm.matmul(x, w), want)                  # for batches, a column slice
            assert err <= 2e-6, f"{mm.method_for(m, w)} under {mm.KERNEL}, [{m}, {k}] @ {list(w.shape)}: {err:.2e}"


def test_the_table_gives_measured_kernels_their_methods_and_others_plain():
    rng = np.random.default_rng(0)
    large, small = column_major(rng, 1024, 1024), rng.standard_normal((160, 640), dtype=np.float32)
    if mm.BLAS is None:
        assert all(mm.method_for(m, large, kernel) == "plain" for m in range(1, 17) for kernel in mm.METHODS)
        return
    assert [mm.method_for(m, large, "SkylakeX") for m in (1, 2, 16, 17)] == ["plain", "pieces", "pieces", "plain"]
    assert [mm.method_for(m, large, "Haswell") for m in (1, 2, 7, 8, 9, 12, 13, 15, 16)] == \
        ["plain", "rows", "rows", "plain", "rows", "rows", "padded", "padded", "plain"]
    assert mm.method_for(5, large, "Zen") == "rows"                 # Zen runs Haswell's kernel files
    for kernel in ("Cooperlake", "SapphireRapids"):                 # they run SkylakeX's sgemm kernel files
        assert [mm.method_for(m, w, kernel) for w in (large, small, np.ascontiguousarray(large)) for m in (1, 2, 16, 17)] \
            == ["plain", "pieces", "pieces", "plain"] + ["plain"] * 8, kernel
        assert mm.batch_layout(kernel) == "panels"                    # the small-matrix kernel, as SkylakeX
    assert [mm.method_for(m, small, "Haswell") for m in (1, 6, 7, 8, 14, 15, 16)] == \
        ["plain", "rows", "padded", "plain", "plain", "padded", "plain"]
    assert mm.method_for(5, small, "SkylakeX") == "plain"
    row_major = np.ascontiguousarray(large)                          # made row-major for batches (layout.py)
    assert [mm.method_for(m, row_major, "Haswell") for m in (1, 2, 7, 8, 9, 10, 15, 16)] == \
        ["plain", "rows", "rows", "plain", "plain", "padded", "padded", "plain"]
    assert all(mm.method_for(m, row_major, "SkylakeX") == "plain" for m in range(1, 17))  # pieces: column-major only
    assert all(mm.method_for(m, row_major[:, 100:], "Haswell") == "plain" for m in range(1, 17))  # strided: plain
    assert (mm.batch_layout("Haswell"), mm.batch_layout("Zen"), mm.batch_layout("SkylakeX")) == \
        ("row-major", "row-major", "panels")
    panels = mm.to_panels(large)                                     # panels are their own method, any kernel
    assert all(mm.method_for(m, panels, kernel) == "panels" for m in (1, 2, 17) for kernel in ("SkylakeX", "armv8"))
    assert [mm.method_for(m, large, "Sandybridge") for m in (1, 2, 13, 14)] == ["plain", "rows", "rows", "plain"]
    assert [mm.method_for(m, large, "Nehalem") for m in (1, 2, 15, 16)] == ["plain", "rows", "rows", "plain"]
    assert [mm.method_for(m, small, "Sandybridge") for m in (1, 5, 6)] == ["plain", "rows", "plain"]
    assert [mm.method_for(m, small, "Nehalem") for m in (1, 2, 16)] == ["plain", "rows", "rows"]
    assert [mm.method_for(m, row_major, kernel) for kernel in ("Sandybridge", "Nehalem") for m in (6, 7, 12, 13)] == \
        ["rows", "plain", "plain", "plain", "rows", "rows", "rows", "plain"]
    assert mm.batch_layout("Sandybridge") == mm.batch_layout("Nehalem") == "column-major"  # rows: as stored
    for kernel in ("Katmai", "neoversen1", "armv8", "Prescott"):  # nobody measured these: plain
        assert all(mm.method_for(m, w, kernel) == "plain" for m in range(1, 17) for w in (large, small, row_major))
        assert mm.batch_layout(kernel) == "column-major"
    assert mm.KERNEL in mm.blas_kernel()


@pytest.mark.skipif(mm.BLAS is None, reason="needs NumPy's OpenBLAS and threadpoolctl")
def test_the_header_says_when_openblas_is_older_than_the_cpu(monkeypatch):
    monkeypatch.setattr(mm, "KERNEL", "Prescott")                    # Debian 12's OpenBLAS on a 2023 Xeon
    monkeypatch.setattr(mm, "cpu_flags", lambda: {"sse3", "avx", "avx2", "avx512f"})
    assert mm.blas_kernel().endswith("plain x @ w; Prescott is a kernel for CPUs without AVX, but this one has AVX2: "
                                     "an OpenBLAS that knows it (NumPy's own wheel: pip install -U numpy) runs faster ones")
    monkeypatch.setattr(mm, "cpu_flags", lambda: {"sse3"})            # a CPU that old: nothing to say
    assert mm.blas_kernel().endswith("kernel not measured, few-row products are plain x @ w")
    monkeypatch.setattr(mm, "KERNEL", "neoversen1")                  # not an x86 kernel: nothing to say
    assert mm.blas_kernel().endswith("kernel not measured, few-row products are plain x @ w")


def test_one_row_and_unmeasured_cases_are_plain_products():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((9, 1024), dtype=np.float32), rng.standard_normal((1024, 2048), dtype=np.float32)
    wf = np.asfortranarray(w)
    np.testing.assert_array_equal(mm.matmul(x[:1], wf), x[:1] @ wf)  # one row: gemv already streams
    for m, weights in ((16, w), (17, wf)):  # beyond every kernel's table: plain, the same numbers exactly
        assert mm.method_for(m, weights) == "plain"
        np.testing.assert_array_equal(mm.matmul(x[:1].repeat(m, 0), weights), x[:1].repeat(m, 0) @ weights)


@given(m=st.integers(1, 40), k=st.integers(1, 20_000))
@settings(max_examples=200, deadline=None)
def test_panel_slices_divide_k_fit_the_small_kernel_and_are_the_deepest_that_do(m, k):
    depth = mm.panel_depth(m, k)
    if depth is None:  # many rows: one row-major copy of w, then plain sgemm
        assert m > mm.panel_rows(k) and mm.panel_rows(k) <= mm.MAX_ROWS
        return
    assert k % depth == 0 and depth <= mm.PANEL_DEPTH and (m * mm.PANEL * depth <= mm.SMALL_MNK or depth == 1)
    assert all(k % d or m * mm.PANEL * d > mm.SMALL_MNK for d in range(depth + 1, min(k, mm.PANEL_DEPTH) + 1))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 3, 5, 8, 17])                      # 1 and 5: run as 2 and 6 rows
def test_panels_in_slices_and_threads_equal_numpy(monkeypatch, threads, m):
    """by_panels with k cut into slices (a small-kernel limit shrunk to force them), the panels shared between
    up to 3 threads and every call small enough to hold the GIL, against x @ w in float64; column ranges of
    panels (c_attn's q, k, v) are the panels of those columns."""
    monkeypatch.setattr(mm, "SMALL_MNK", 32 * 32 * 64)              # k = 768 in slices (2 of 384 at 3 rows) ...
    monkeypatch.setattr(mm, "GIL_FREE_OUTPUT", 64)                  # ... and more calls free the GIL
    monkeypatch.setattr(mm, "threads_allowed", lambda: threads)
    rng = np.random.default_rng(m)
    x, w = rng.standard_normal((m, 768), dtype=np.float32), column_major(rng, 768, 384)
    panels = mm.to_panels(w)
    assert panels.shape == (12, 768, 32) and np.array_equal(mm.from_panels(panels), w)
    assert (mm.panel_depth(1, 768), mm.panel_depth(3, 768), mm.panel_depth(8, 768), mm.panel_depth(17, 768)) == \
        (768, 384, 256, None)
    got, want = mm.matmul(x, panels), x.astype(np.float64) @ w.astype(np.float64)
    err = max_relative_error(got, want)
    assert got.shape == (m, 384) and err <= 2e-6, f"panels, {m} rows, {threads} threads: {err:.2e} of max |x @ w|"
    np.testing.assert_array_equal(mm.from_panels(mm.columns(panels, 64, 192)), w[:, 64:192])
    with pytest.raises(ValueError, match="columns 64..100 do not fall on panels of 32"):
        mm.columns(panels, 64, 100)
    with pytest.raises(ValueError, match="a weight of 100 columns does not cut into panels of 32"):
        mm.to_panels(w[:, :100])


@pytest.mark.parametrize("m", sorted(mm.PANEL_PADDED_ROWS))
def test_panel_rows_padded_with_zeros_give_the_unpadded_rows(monkeypatch, m):
    """The rows by_panels pads (one to two: NumPy's gemv; five to six: the small kernel's dearer five) come out
    as the same m rows, and as every row of the padded product: zeros added change the cost, not the sums."""
    rng = np.random.default_rng(m)
    x, panels = rng.standard_normal((m, 1600), dtype=np.float32), mm.to_panels(column_major(rng, 1600, 256))
    rows = mm.PANEL_PADDED_ROWS[m]
    assert rows > m and mm.panel_depth(rows, 1600) is not None       # still one small product per slice
    padded = mm.by_panels(x, panels)
    monkeypatch.setattr(mm, "PANEL_PADDED_ROWS", {})
    unpadded = mm.by_panels(x, panels)
    with_zeros = mm.by_panels(np.concatenate([x, np.zeros((rows - m, 1600), np.float32)]), panels)
    assert padded.shape == (m, 256) and not np.any(with_zeros[m:])
    np.testing.assert_array_equal(padded, with_zeros[:m])
    err = max_relative_error(padded, unpadded)
    assert err <= 2e-6, f"{m} rows padded to {rows} against unpadded: {err:.2e} of max |x @ w|"


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


@pytest.mark.parametrize("method", ["pieces", "rows", "padded", "rows, row-major"])
def test_model_through_many_pieces_or_blocks_equals_reference(monkeypatch, method):
    """Shrink the thresholds so a small model's every product goes through the method: for pieces,
    several products in one call, one, and a narrower rest; for rows, several blocks and a rest (on
    row-major weights: blocks of w's rows and a rest); padded: the 8 rows padded to 10."""
    config = GPT2Config(n_vocab=50, n_ctx=16, n_embd=24, n_head=3, n_layer=2)
    monkeypatch.setattr(mm, "COLUMN_MAJOR_MIN", 1)  # column-major weights, shared between threads
    model = GPT2(config, random_params(config, seed=3))
    assert model.params["blocks"][0]["mlp"]["c_proj"]["w"].T.flags.c_contiguous
    if method == "rows, row-major":
        set_weights_order(model, "row-major")
        assert model.params["blocks"][0]["mlp"]["c_proj"]["w"].flags.c_contiguous
    ids = np.random.default_rng(4).integers(0, 50, 12)
    plain = model.forward(ids[4:], cache_after(model, ids[:4]), n_logits=8)
    monkeypatch.setattr(mm, "method_for", lambda m, w, kernel=None: method.split(",")[0])
    monkeypatch.setattr(mm, "GIL_FREE_OUTPUT", 100)
    if method == "pieces":
        monkeypatch.setattr(mm, "SMALL_MNK", 8 * 96 * 5)
        monkeypatch.setattr(mm, "SMALL_MN", 40)
        assert mm.pieces(8, 4 * 24, 24) == ((0, 15, 5), (15, 24, 5))  # MLP down-projection: 3 products, 1, a rest
    elif method == "rows":
        monkeypatch.setattr(mm, "BLOCK_BYTES", 4 * 96 * 8)
        assert mm.row_blocks(8, 4 * 24, 50) == (8, ((0, 2), (2, 4), (4, 6)))  # head: 6 blocks of 8, a rest of 2
    elif method == "rows, row-major":
        monkeypatch.setattr(mm, "BLOCK_BYTES", 4 * 24 * 10)
        assert mm.height_blocks(4 * 24, 24) == (10, 9)  # MLP down-projection: 9 blocks of 10 rows, a rest of 6
    else:
        monkeypatch.setattr(mm, "PAD_ROWS", 5)
    cut = model.forward(ids[4:], cache_after(model, ids[:4]), n_logits=8)  # [8, n_vocab]
    slow = gpt2_reference(ids, model.params, config)[4:]
    print(f"{method}: max |cut - plain| = {np.abs(cut - plain).max():.2e}, vs reference {np.abs(cut - slow).max():.2e}")
    np.testing.assert_allclose(cut, plain, rtol=0, atol=1e-5)
    np.testing.assert_allclose(cut, slow, rtol=0, atol=1e-5)


def test_model_in_panels_equals_reference(monkeypatch):
    """A small model whose every Conv1D weight is cut into panels (n_embd 64: c_attn's q, k, v two panels each),
    shared between threads, against the reference on the stored weights: a prefill (whose last layer takes
    c_attn's column ranges), 8 verified rows, and 20 (past the small kernel: one row-major copy, then sgemm)."""
    config = GPT2Config(n_vocab=50, n_ctx=40, n_embd=64, n_head=4, n_layer=2)
    monkeypatch.setattr(mm, "COLUMN_MAJOR_MIN", 1)
    monkeypatch.setattr(mm, "GIL_FREE_OUTPUT", 100)
    model = GPT2(config, random_params(config, seed=3))
    ids = np.random.default_rng(4).integers(0, 50, 24)
    slow = gpt2_reference(ids, model.params, config)                 # on the stored weights
    set_weights_order(model, "panels")
    assert model.params["blocks"][0]["attn"]["c_attn"]["w"].shape == (6, 64, 32)
    for n_past in (16, 4):
        got = model.forward(ids[n_past:], cache_after(model, ids[:n_past]), n_logits=len(ids) - n_past)
        err = float(np.abs(got - slow[n_past:]).max())
        print(f"panels, {len(ids) - n_past} rows: max |panels - reference| = {err:.2e}")
        np.testing.assert_allclose(got, slow[n_past:], rtol=0, atol=1e-5)


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


def other_kernel():
    """(environment, kernel name) for a child process whose OpenBLAS runs another kernel than this one's
    (blas_curves.blas_kernel_envs: the CPU's own, or Haswell's), or None where the CPU runs no other."""
    if mm.BLAS is None:
        return None
    from gpt2np.teach.blas_curves import blas_kernel_envs
    return next(((env, name) for name, env in blas_kernel_envs().items() if name != mm.KERNEL), None)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS_FILE_AGAIN = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__]  # in a child


@pytest.mark.skipif(os.environ.get("GPT2NP_OTHER_KERNEL") == "1", reason="already the other kernel's run")
def test_the_products_agree_under_another_blas_kernel():
    """This file's tests again in a process running another OpenBLAS kernel: the CPU's own where this
    process runs a forced one (OPENBLAS_CORETYPE set, as on CI), else Haswell's (or Sandybridge's)."""
    found = other_kernel()
    if found is None:
        pytest.skip(f"no other OpenBLAS kernel runs on this CPU (this one: {mm.KERNEL})")
    env, name = found
    run = subprocess.run(THIS_FILE_AGAIN, env={**env, "GPT2NP_OTHER_KERNEL": "1"}, capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    tail = "\n".join(run.stdout.splitlines()[-15:])
    assert run.returncode == 0, f"tests/model/test_matmul.py under {name} (this process: {mm.KERNEL}) failed:\n{tail}"
    print(f"{name}: {tail.splitlines()[-1]}")


@pytest.mark.parametrize("kernel", ["Sandybridge", "Nehalem"])  # x86 CPUs without AVX2: any x86 CPU runs them
@pytest.mark.skipif(os.environ.get("GPT2NP_OTHER_KERNEL") == "1", reason="already another kernel's run")
def test_the_methods_older_x86_kernels_get_equal_numpy_there(kernel):
    """The products by each row count's method, against float64 x @ w, in a process that forces one of the older
    x86 kernels METHODS measured (NumPy's own OpenBLAS has both; a CPU of another architecture runs neither)."""
    if mm.BLAS is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"needs OpenBLAS on x86-64 (this: {mm.KERNEL}, {platform.machine()})")
    from gpt2np.teach.blas_curves import child_kernel, kernel_env
    env = {**kernel_env(), "OPENBLAS_CORETYPE": kernel, "GPT2NP_OTHER_KERNEL": "1"}
    if child_kernel(env) != kernel:
        pytest.skip(f"this NumPy's OpenBLAS cannot be made to run {kernel}")
    run = subprocess.run([*THIS_FILE_AGAIN, "-k", "this_kernel_gets"], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    tail = "\n".join(run.stdout.splitlines()[-15:])
    assert run.returncode == 0 and " passed" in tail, f"under {kernel}:\n{tail}"
