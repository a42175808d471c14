"""The NumPy GPT-2 against Hugging Face's logits, the slow reference, and its own KV cache."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, random_params
from gpt2np.model.config import PRESETS, GPT2Config
from gpt2np.model.forward import GPT2, causal_mask, gelu, layer_norm, softmax
from gpt2np.model.reference import gpt2_reference
from gpt2np.checkpoints.weights import load_params

FIXTURE_NAMES = ["gpt2-tiny-a", "gpt2-tiny-b"]
# Measured: max |ours - HF float64| = 1.8e-7 (tiny-a), 2.7e-7 (tiny-b) in float32; the issue allows 1e-4,
# the fixtures README expects ~1e-5 from a float32 implementation: 1e-5 leaves 40x headroom.
LOGITS_ATOL = 1e-5
SMALL = GPT2Config(n_vocab=37, n_ctx=24, n_embd=12, n_head=3, n_layer=2)


def fixture_model(tiny_fixture_dir, name):
    folder = tiny_fixture_dir(name)
    config = GPT2Config.from_hparams_json(folder / "hparams.json")
    return GPT2(config, load_params(folder, config)), np.load(FIXTURES / name / "reference.npz")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_logits_match_hugging_face(tiny_fixture_dir, name):
    model, ref = fixture_model(tiny_fixture_dir, name)
    logits = model.forward(ref["tokens"], model.new_cache(), n_logits=len(ref["tokens"]))
    diff = np.abs(logits - ref["logits"]).max()
    print(f"{name}: max |logits - HF| = {diff:.2e}")
    assert logits.dtype == np.float32
    assert diff <= LOGITS_ATOL, f"{name}: max abs diff {diff:.3e} > {LOGITS_ATOL}"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_greedy_continuation_matches_hugging_face(tiny_fixture_dir, name):
    from gpt2np.decoding.autoregressive import generate
    model, ref = fixture_model(tiny_fixture_dir, name)
    tokens = generate(model, list(ref["tokens"]), len(ref["greedy_tokens"]), temperature=0)
    np.testing.assert_array_equal(tokens, ref["greedy_tokens"])


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fast_path_equals_slow_reference_on_fixture(tiny_fixture_dir, name):
    model, ref = fixture_model(tiny_fixture_dir, name)
    fast = model.forward(ref["tokens"], model.new_cache(), n_logits=len(ref["tokens"]))
    slow = gpt2_reference(ref["tokens"], model.params, model.config)
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def small_model():
    return GPT2(SMALL, random_params(SMALL, seed=0))


def full_logits(model, ids):
    return model.forward(ids, model.new_cache(), n_logits=len(ids))


@settings(deadline=None, max_examples=40)
@given(ids=st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=SMALL.n_ctx),
       data=st.data())
def test_incremental_decoding_split_anywhere_equals_one_full_forward(small_model, ids, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(ids) - 1), max_size=4)) if len(ids) > 1 else [])
    cache, pieces = small_model.new_cache(), []
    for start, stop in zip([0] + cuts, cuts + [len(ids)]):
        pieces.append(small_model.forward(ids[start:stop], cache, n_logits=stop - start))
    # Measured max diff ~5e-7: the same math, but products of different shapes round differently.
    np.testing.assert_allclose(np.concatenate(pieces), full_logits(small_model, ids), rtol=0, atol=1e-5)
    assert len(cache) == len(ids)


@settings(deadline=None, max_examples=40)
@given(prefix=st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=10),
       rejected=st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=6),
       refeed=st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=6))
def test_rollback_then_refeed_equals_never_having_fed(small_model, prefix, rejected, refeed):
    cache = small_model.new_cache()
    small_model.forward(prefix, cache)
    small_model.forward(rejected, cache, n_logits=len(rejected))  # e.g. draft tokens the target rejects
    cache.truncate(len(prefix))
    after_rollback = small_model.forward(refeed, cache, n_logits=len(refeed))
    clean = small_model.new_cache()
    small_model.forward(prefix, clean)
    never_fed = small_model.forward(refeed, clean, n_logits=len(refeed))
    np.testing.assert_array_equal(after_rollback, never_fed)  # bit for bit: same ops, same inputs
    n = len(prefix) + len(refeed)
    np.testing.assert_array_equal(cache.k[:, :, :n], clean.k[:, :, :n])


@settings(deadline=None, max_examples=30)
@given(ids=st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=1, max_size=SMALL.n_ctx))
def test_fast_path_equals_slow_reference(small_model, ids):
    slow = gpt2_reference(ids, small_model.params, small_model.config)
    np.testing.assert_allclose(full_logits(small_model, ids), slow, rtol=0, atol=1e-5)


def test_changing_a_later_token_leaves_earlier_logits_unchanged(small_model):
    ids = list(range(10))
    changed = ids[:6] + [ids[6] + 1] + ids[7:]
    np.testing.assert_array_equal(full_logits(small_model, ids)[:6], full_logits(small_model, changed)[:6])
    assert not np.allclose(full_logits(small_model, ids)[6:], full_logits(small_model, changed)[6:])


def test_logits_only_for_positions_asked_for(small_model):
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    last3 = small_model.forward(ids, small_model.new_cache(), n_logits=3)
    assert last3.shape == (3, SMALL.n_vocab)
    np.testing.assert_allclose(last3, full_logits(small_model, ids)[-3:], rtol=0, atol=1e-6)


def test_activations_stay_float32(small_model, monkeypatch):
    """Every intermediate array stays float32: a float64 leak makes NumPy 2 ~10x slower."""
    import gpt2np.model.forward as m
    seen = []
    for name in ["gelu", "softmax", "layer_norm", "linear", "attention", "mha", "ffn", "transformer_block"]:
        original = getattr(m, name)

        def spy(*args, _f=original, _name=name, **kwargs):
            out = _f(*args, **kwargs)
            seen.append((_name, out.dtype))
            return out
        monkeypatch.setattr(m, name, spy)
    out = small_model.forward([1, 2, 3], small_model.new_cache(), n_logits=3)
    assert out.dtype == np.float32 and len(seen) > 10
    assert {dtype for _, dtype in seen} == {np.dtype(np.float32)}, [s for s in seen if s[1] != np.float32]


def test_forward_rejects_context_overflow_and_bad_ids(small_model):
    cache = small_model.new_cache()
    small_model.forward(list(range(20)), cache)
    with pytest.raises(ValueError, match="exceed the context of 24"):
        small_model.forward([0] * 5, cache)
    with pytest.raises(ValueError, match="token ids"):
        small_model.forward([SMALL.n_vocab], small_model.new_cache())
    with pytest.raises(ValueError, match="n_logits"):
        small_model.forward([1, 2], small_model.new_cache(), n_logits=3)


@given(n_past=st.integers(0, 8), n_seq=st.integers(1, 8))
def test_causal_mask_is_the_lower_right_corner_of_the_full_triangle(n_past, n_seq):
    full = causal_mask(n_past + n_seq, n_past + n_seq)
    np.testing.assert_array_equal(causal_mask(n_seq, n_past + n_seq), full[n_past:])
    assert (np.triu(full, k=1) < -1e9).sum() == (n_past + n_seq) * (n_past + n_seq - 1) // 2


@given(shift=st.floats(-50, 50))
def test_softmax_rows_sum_to_one_and_ignore_a_constant_shift(shift):
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    np.testing.assert_allclose(softmax(x).sum(axis=-1), 1, atol=1e-6)
    np.testing.assert_allclose(softmax(x + np.float32(shift)), softmax(x), atol=1e-5)


def test_layer_norm_gives_zero_mean_unit_variance_before_gain_and_bias():
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32) * 3 + 2
    y = layer_norm(x, np.ones(64, np.float32), np.zeros(64, np.float32))
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=-1), 1, atol=1e-3)  # eps = 1e-5 shrinks it slightly


def test_presets_have_the_published_parameter_counts():
    assert PRESETS["124M"].n_params() == 124_439_808  # 4 x this = the 497,759,232-byte data file
    assert PRESETS["355M"].n_params() == 354_823_168


def test_gelu_and_layer_norm_equal_their_formulas_in_float64_and_leave_inputs_alone():
    """Both compute in place for speed: check the arithmetic against the textbook formulas."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((5, 256)) * 4).astype(np.float32)
    g, b = rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32)
    before = x.copy()
    x64 = x.astype(np.float64)
    want_gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    centred = x64 - x64.mean(axis=-1, keepdims=True)
    want_ln = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + 1e-5) * g + b
    got_gelu, got_ln = gelu(x), layer_norm(x, g, b)
    err_gelu, err_ln = np.abs(got_gelu - want_gelu).max(), np.abs(got_ln - want_ln).max()
    assert err_gelu <= 1e-5 and err_ln <= 1e-5, f"max abs diff: gelu {err_gelu:.2e}, layer_norm {err_ln:.2e}"
    np.testing.assert_array_equal(x, before)


def test_the_cached_causal_mask_cannot_be_changed_by_a_caller():
    with pytest.raises(ValueError, match="read-only"):
        causal_mask(2, 5)[0, 0] = 1.0
