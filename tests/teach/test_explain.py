"""gpt2np.teach.explain: the notebooks' show-your-work helpers are thin, and agree with the fast path.

The central claim is that forward_trace is the model's own forward pass, unrolled: its logits,
and each block's output, equal what GPT2.forward and forward.transformer_block compute.
"""
import numpy as np
import pytest

import gpt2np
from gpt2np.teach import explain
from gpt2np.teach.broken_kernels import BROKEN_VARIANTS
from gpt2np.model.config import GPT2Config
from gpt2np.teach.exact import max_abs_difference
from gpt2np.model.forward import GPT2, ffn, layer_norm, transformer_block
from gpt2np.decoding.speculative_kernel import output_distribution
from gpt2np.teach.toy_models import random_toy_model

from conftest import random_params

CONFIG = GPT2Config(n_vocab=50, n_ctx=24, n_embd=32, n_head=4, n_layer=3)


@pytest.fixture(scope="module")
def model():
    return GPT2(CONFIG, random_params(CONFIG, seed=0))  # non-trivial biases and peaked logits


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(1).integers(0, CONFIG.n_vocab, size=17)


def test_trace_logits_equal_forward(model, ids):
    trace = explain.forward_trace(model, ids)
    expected = model.forward(ids, model.new_cache(), n_logits=len(ids))  # [n_seq, n_vocab]
    # The same functions in the same order: measured max |difference| 0.0 (float32); the
    # tolerance only allows BLAS to sum a strided cache view in another order.
    np.testing.assert_allclose(trace.logits, expected, atol=1e-5, rtol=1e-5)
    assert trace.logits.dtype == np.float32


def test_each_block_equals_transformer_block(model, ids):
    trace = explain.forward_trace(model, ids)
    x = trace.x0
    for layer, (block, step) in enumerate(zip(model.params["blocks"], trace.layers)):
        cache = model.new_cache()
        expected = transformer_block(x, block, cache, layer, CONFIG.n_head)
        np.testing.assert_allclose(step.after_mlp, expected, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(step.mlp_out, ffn(layer_norm(step.after_attn, **block["ln_2"]), block["mlp"]),
                                   atol=1e-6)
        x = step.after_mlp


def test_attention_weights_are_causal_distributions(model, ids):
    step = explain.forward_trace(model, ids).layers[0]
    w = step.attention_weights                                       # [n_head, n_seq, n_seq]
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(w[:, np.triu_indices(len(ids), k=1)[0], np.triu_indices(len(ids), k=1)[1]] == 0)
    np.testing.assert_allclose(w @ step.v, step.heads, atol=1e-5)    # the weights ARE what attention used


def test_mean_attention_distance(model, ids):
    trace = explain.forward_trace(model, ids)
    distance = explain.mean_attention_distance(trace)
    assert distance.shape == (CONFIG.n_layer, CONFIG.n_head)
    assert np.all(distance >= 0) and np.all(distance <= (len(ids) - 1) / 2 + 1e-4)  # row i looks back <= i
    w = trace.layers[1].attention_weights[2]                  # one head, by hand: sum_j w_ij (i - j)
    by_hand = np.mean([sum(w[i, j] * (i - j) for j in range(i + 1)) for i in range(len(ids))])
    assert distance[1, 2] == pytest.approx(by_hand, rel=1e-5)


def test_shapes_table(model, ids):
    shapes = explain.forward_trace(model, ids).shapes()
    n_seq, E, H = len(ids), CONFIG.n_embd, CONFIG.n_head
    assert shapes["layers[0].q"] == (H, n_seq, E // H)
    assert shapes["layers[0].mlp_hidden"] == (n_seq, 4 * E)
    assert shapes["logits"] == (n_seq, CONFIG.n_vocab)


def test_trace_rejects_too_long_input(model):
    with pytest.raises(ValueError, match="n_ctx=24"):
        explain.forward_trace(model, np.zeros(CONFIG.n_ctx + 1, dtype=int))


def test_cache_changes_nothing_but_speed(model, ids):
    full = model.forward(ids, model.new_cache(), n_logits=len(ids))
    np.testing.assert_allclose(explain.incremental_logits(model, ids), full, atol=1e-5, rtol=1e-5)
    prompt = ids[:5]
    assert explain.generate_without_cache(model, prompt, 6) == gpt2np.generate(model, prompt, 6, temperature=0)


def test_without_cache_samples_exactly_what_generate_samples(model, ids):
    """Same options, identically seeded generators: the same draws, so the same tokens."""
    options = dict(temperature=0.9, top_k=20, top_p=0.95)
    sampled = explain.generate_without_cache(model, ids[:5], 8, rng=np.random.default_rng(3), **options)
    assert sampled == gpt2np.generate(model, ids[:5], 8, rng=np.random.default_rng(3), **options)
    assert len(set(sampled)) > 1  # really sampled, not one token repeated
    with pytest.raises(ValueError, match="needs rng"):
        explain.generate_without_cache(model, ids[:5], 8, temperature=0.9)


def test_best_time_returns_result_and_minimum():
    # A scripted clock: the three calls last 3, 1 and 2 ticks, so the fastest is the middle one,
    # neither the first, the last nor the slowest. No wall clock is read.
    readings = iter([10.0, 13.0, 20.0, 21.0, 30.0, 32.0])
    calls = []
    result, seconds = explain.best_time(lambda: calls.append(len(calls)) or 42, repeats=3,
                                        clock=lambda: next(readings))
    assert result == 42 and len(calls) == 3
    assert seconds == 1.0
    assert next(readings, None) is None  # the clock was read exactly twice per call


@pytest.mark.parametrize("value, expected", [(None, 7), ("1", 1), ("0", 7), ("", 7), ("yes", 7)])
def test_repeats_is_one_only_in_the_test_suite_s_run_of_the_notebooks(monkeypatch, value, expected):
    """tests/test_notebooks.py sets GPT2NP_NOTEBOOK_CHECK=1 and times nothing; any other value, or none, is a
    person's run, and gets the repeats its figures were measured with."""
    if value is None:
        monkeypatch.delenv(explain.CHECK_RUN, raising=False)
    else:
        monkeypatch.setenv(explain.CHECK_RUN, value)
    assert explain.repeats(7) == expected


def test_top_tokens_and_entropy():
    class Bytes:  # a stand-in tokenizer: id i is the letter chr(97 + i)
        def decode(self, ids):
            return "".join(chr(97 + i) for i in ids)
    probs = np.array([0.1, 0.6, 0.3])
    assert explain.top_tokens(probs, Bytes(), n=2) == [(1, "b", 0.6), (2, "c", 0.3)]
    assert explain.entropy_bits(np.array([0.5, 0.5, 0.0])) == pytest.approx(1.0)
    counts = explain.sample_counts(probs, 1000, np.random.default_rng(0))
    assert counts.sum() == 1000 and counts.argmax() == 1


def test_exact_distributions_agree_and_a_broken_kernel_does_not():
    rng = np.random.default_rng(0)
    target, draft = random_toy_model(rng, order=3), random_toy_model(rng)
    expected = explain.exact_target_distribution(target, [0], 3)
    assert max_abs_difference(expected, explain.exact_speculative_distribution(target, draft, [0], 3, K=2)) < 1e-12
    broken = explain.exact_speculative_distribution(target, draft, [0], 3, K=2, **BROKEN_VARIANTS["softmax_residual"])
    assert max_abs_difference(expected, broken) > 1e-3


def test_sampled_counters_and_speculative_sweep():
    rng = np.random.default_rng(0)
    target, draft = random_toy_model(rng, order=3), random_toy_model(rng)
    a = explain.sample_target(target, [0], 3, n_samples=50, seed=1)
    b = explain.sample_speculative(target, draft, [0], 3, K=2, n_samples=50, seed=1)
    assert sum(a.values()) == sum(b.values()) == 50 and all(len(s) == 3 for s in a | b)
    sweep = explain.speculative_sweep(target, draft, [0], 5, Ks=[1, 3], repeats=1)
    assert [row["K"] for row in sweep["rows"]] == [1, 3] and sweep["autoregressive_seconds"] > 0
    assert all(row["measured_speedup"] > 0 and row["stats"].K == row["K"] for row in sweep["rows"])


def test_output_decomposition_adds_up_to_the_kernel_and_to_p():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    accepted, resampled = explain.output_decomposition(p, q)
    np.testing.assert_allclose(accepted + resampled, output_distribution(p, q), atol=1e-15)
    np.testing.assert_allclose(accepted + resampled, p, atol=1e-12)


def test_openai_vocab_dir_has_both_files_or_is_none():
    folder = explain.openai_vocab_dir()
    assert folder is None or ((folder / "encoder.json").is_file() and (folder / "vocab.bpe").is_file())


def test_bundled_pair_target_is_the_larger():
    if len(gpt2np.bundled_models()) < 2:
        pytest.skip("the bundled pair is not in gpt2np/bundled/ (python tools/train_pair.py)")
    target, draft = explain.load_bundled_pair()
    assert target.config.n_params() > draft.config.n_params()
    assert target.n_vocab == draft.n_vocab
