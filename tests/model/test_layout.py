"""model/fast/layout.py: the weights' order changes how products are cut, never what a model computes.

A model made row-major or cut into panels for batches gives the logits of the stored, column-major one
within float32 rounding (one row, a verification's rows, a batch's packed rows), and made column-major
again it is the stored model bit for bit. Which kernels get which order is matmul.BATCH_LAYOUT's (test_matmul.py).
"""
import numpy as np
import pytest

from conftest import random_params
from gpt2np.model.fast import layout
from gpt2np.model.batch import forward_packed
from gpt2np.model.config import GPT2Config
from gpt2np.model.fast import matmul as mm
from gpt2np.model.forward import GPT2

CONFIG = GPT2Config(n_vocab=300, n_ctx=32, n_embd=64, n_head=4, n_layer=2)


@pytest.fixture
def model(monkeypatch):
    """A small model whose every Conv1D weight counts as large (stored column-major, cut by the methods)."""
    monkeypatch.setattr(mm, "COLUMN_MAJOR_MIN", 64 * 64)
    return GPT2(CONFIG, random_params(CONFIG, seed=5))


def logits(model, m):  # m new rows after 6 cached: [m, n_vocab]
    ids = np.random.default_rng(m).integers(0, CONFIG.n_vocab, 6 + m)
    cache = model.new_cache()
    model.forward(ids[:6], cache)
    return model.forward(ids[6:], cache, n_logits=m)


def weights(model):
    return [node[key] for node, key in layout.conv1d_weights(model.params)]


def in_order(model, order):  # -> whether every (large) Conv1D weight of model is in `order`
    return all(w.ndim == 3 and w.flags.c_contiguous if order == "panels" else
               w.ndim == 2 and (w.flags.c_contiguous if order == "row-major" else w.T.flags.c_contiguous)
               for w in weights(model))


def as_stored(w):  # [k, n] whatever w's order
    return mm.from_panels(w) if w.ndim == 3 else w


@pytest.mark.parametrize("order", ["row-major", "panels"])
def test_another_order_gives_the_same_logits_and_back_gives_the_same_bits(model, order):
    stored = {m: logits(model, m) for m in (1, 5, 9, 16, 20)}          # 20: past by_panels' small-kernel rows
    wte = model.params["wte"]
    before = [w.copy() for w in weights(model)]
    assert layout.weights_order(model) == "column-major" and in_order(model, "column-major")

    layout.set_weights_order(model, order)
    assert layout.weights_order(model) == order and in_order(model, order)
    assert model.params["wte"] is wte                                # the tied head keeps its order
    assert all(np.array_equal(a, as_stored(b)) for a, b in zip(before, weights(model)))
    for m, want in stored.items():
        got = logits(model, m)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        print(f"M = {m}: max |{order} - stored| = {err:.2e} of max |logits|")
        # float32 sums in another order, 256 terms at most: measured <= 1.3e-6 of the largest logit
        assert err <= 5e-6, f"M = {m}: {order} logits differ from the stored order's by {err:.2e} of the largest"

    layout.set_weights_order(model, "column-major")
    assert in_order(model, "column-major")
    for m, want in stored.items():
        np.testing.assert_array_equal(logits(model, m), want)


def test_panels_and_row_major_convert_into_each_other(model):
    before = [w.copy() for w in weights(model)]
    for order in ("panels", "row-major", "panels", "column-major"):
        layout.set_weights_order(model, order)
        assert layout.weights_order(model) == order and in_order(model, order)
        assert all(np.array_equal(a, as_stored(b)) for a, b in zip(before, weights(model)))


@pytest.mark.parametrize("order", ["row-major", "panels"])
def test_a_batch_in_another_order_gives_each_sequence_its_stored_logits(model, order):
    prompts = [[1, 2, 3, 4, 5], [9], [7, 7, 8]]
    stored = [model.forward(ids, model.new_cache()) for ids in prompts]
    layout.set_weights_order(model, order)
    packed = forward_packed(model, [(ids, model.new_cache()) for ids in prompts])
    errs = [float(np.abs(got - want).max() / np.abs(want).max()) for got, want in zip(packed, stored)]
    assert max(errs) <= 5e-6, f"packed {order} logits differ from each sequence's stored ones: {errs} of the largest"


def test_for_batches_follows_the_kernel_table(model):
    if mm.BLAS is None:
        assert layout.order_for_batches(model, "Haswell") == "column-major"  # no OpenBLAS: nothing measured
        return
    assert layout.order_for_batches(model, "Haswell") == "row-major"
    assert layout.order_for_batches(model, "SkylakeX") == "panels"
    assert layout.order_for_batches(model, "armv8") == "column-major"       # nobody measured it: as stored


def test_panels_need_n_embd_in_whole_panels(monkeypatch):
    """c_attn's q, k and v blocks are column ranges of one weight: panels must not straddle them."""
    monkeypatch.setattr(mm, "COLUMN_MAJOR_MIN", 48 * 48)
    odd = GPT2(GPT2Config(n_vocab=300, n_ctx=32, n_embd=48, n_head=4, n_layer=1), random_params(
        GPT2Config(n_vocab=300, n_ctx=32, n_embd=48, n_head=4, n_layer=1), seed=5))
    with pytest.raises(ValueError, match="panels need n_embd a multiple of 32, got 48"):
        layout.set_weights_order(odd, "panels")
    if mm.BLAS is not None:
        assert layout.order_for_batches(odd, "SkylakeX") == "column-major"  # as stored, where panels do not fit


def test_small_weights_stay_row_major_and_a_bad_order_is_refused():
    small = GPT2(CONFIG, random_params(CONFIG, seed=5))                # 64 x 256 floats: under 2 MiB
    assert layout.weights_order(small) == "row-major"
    for order in layout.ORDERS:
        layout.set_weights_order(small, order)
        assert all(w.flags.c_contiguous for w in weights(small))
    with pytest.raises(ValueError, match="order must be one of column-major, row-major, panels, got 'fortran'"):
        layout.set_weights_order(small, "fortran")


def test_all_small_is_every_product_small_the_tied_head_included():
    """BatchAutoK prices rows past the few-row methods at full cost unless all_small says there are none."""
    assert layout.all_small(random_params(CONFIG, seed=5))             # the largest: wte.T, 64 x 300 floats
    wide_vocab = GPT2Config(n_vocab=8300, n_ctx=32, n_embd=64, n_head=4, n_layer=1)  # wte.T: 64 x 8300 > 2^19
    assert mm.stored_column_major((64, 8300)) and not layout.all_small(random_params(wide_vocab, seed=5))
    wide = GPT2Config(n_vocab=300, n_ctx=32, n_embd=512, n_head=4, n_layer=1)  # c_fc: 512 x 2048 = 2^20 floats
    assert not layout.all_small(random_params(wide, seed=5))


def test_a_loaded_model_takes_the_kernel_tables_order(model):
    """load_model and random_model end in order_as_loaded: panels where LOADED_LAYOUT says so (SkylakeX and
    the names that run its kernel files), as stored everywhere else, as stored where panels do not fit."""
    if mm.BLAS is None:
        assert layout.weights_order(layout.order_as_loaded(model, "SkylakeX")) == "column-major"
        return
    assert [layout.weights_order(layout.order_as_loaded(model, kernel))
            for kernel in ("SkylakeX", "Haswell", "SapphireRapids", "armv8")] == \
        ["panels", "column-major", "panels", "column-major"]
    config = GPT2Config(n_vocab=50, n_ctx=16, n_embd=512, n_head=8, n_layer=1)  # c_fc: 512 x 2048, large
    from gpt2np.checkpoints.loading import random_model
    assert layout.weights_order(random_model(config, tokenizer=None)) == mm.loaded_layout()


def test_the_reference_and_the_checkpoint_writer_read_panels(model):
    """The slow reference multiplies the [in, out] matrix whatever the order (reference.dense), and params_to_tf
    writes the checkpoint's [1, in, out] tensors from panels as from the stored order."""
    from gpt2np.checkpoints.weights import params_to_tf
    from gpt2np.model.reference import gpt2_reference
    ids = np.random.default_rng(7).integers(0, CONFIG.n_vocab, 12)
    want, tensors = gpt2_reference(ids, model.params, CONFIG), params_to_tf(model.params)
    layout.set_weights_order(model, "panels")
    got = gpt2_reference(ids, model.params, CONFIG)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= 1e-6, f"the reference on panels differs from the reference on the stored order by {err:.2e}"
    written = params_to_tf(model.params)
    assert written.keys() == tensors.keys() and all(np.array_equal(written[k], tensors[k]) for k in tensors)
