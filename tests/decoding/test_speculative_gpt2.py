"""Speculative decoding on real GPT-2 forward passes (the tiny TF fixtures and random GPT-2s).

The exact distribution tests run on toy models (test_speculative_exact.py); here the same loop
drives the NumPy GPT-2 with its KV caches, where rollback bugs would actually bite.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, random_params
from gpt2np.decoding.autoregressive import generate
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.decoding.drafters import NgramDrafter
from gpt2np.decoding.speculative import TREE_ROOM, speculative_generate
from gpt2np.checkpoints.weights import load_params
from test_speculative_exact import assert_caches_match_recomputation

SMALL = GPT2Config(n_vocab=29, n_ctx=48, n_embd=12, n_head=3, n_layer=2)


@pytest.fixture(scope="module")
def fixture_pair(tiny_fixture_dir):
    def load(name):
        folder = tiny_fixture_dir(name)
        config = GPT2Config.from_hparams_json(folder / "hparams.json")
        return GPT2(config, load_params(folder, config))
    return load("gpt2-tiny-b"), load("gpt2-tiny-a")  # target, draft


@pytest.mark.parametrize("K", range(1, 9))
def test_greedy_speculative_equals_hugging_face_greedy_on_the_fixture(fixture_pair, K):
    target, draft = fixture_pair
    ref = np.load(FIXTURES / "gpt2-tiny-b" / "reference.npz")
    result = speculative_generate(target, draft, ref["tokens"], len(ref["greedy_tokens"]), K, temperature=0)
    np.testing.assert_array_equal(result.tokens, ref["greedy_tokens"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("K", [1, 3, 6])
def test_gpt2_caches_after_speculative_rounds_equal_a_recomputation(fixture_pair, K, temperature):
    target, draft = fixture_pair
    # float32: incremental and one-shot forward passes differ by ~1e-6 in the logits
    assert_caches_match_recomputation(target, draft, [464, 3290, 318], 13, K, atol=2e-5,
                                      temperature=temperature, top_k=50, rng=np.random.default_rng(K))


@settings(deadline=None, max_examples=15)
@given(seed=st.integers(0, 10_000), K=st.integers(1, 8), n_tokens=st.integers(1, 20))
def test_greedy_speculative_equals_target_greedy_for_any_random_draft(seed, K, n_tokens):
    """Peaked random GPT-2s (init std 0.3), so draft and target sometimes agree and sometimes not."""
    target = GPT2(SMALL, random_params(SMALL, seed))
    draft = GPT2(SMALL, random_params(SMALL, seed + 1))
    prompt = [seed % SMALL.n_vocab, 3]
    result = speculative_generate(target, draft, prompt, n_tokens, K, temperature=0)
    assert result.tokens == generate(target, prompt, n_tokens, temperature=0)


def test_draft_equal_to_target_accepts_every_draft(fixture_pair):
    target, _ = fixture_pair
    result = speculative_generate(target, target, [464, 3290], 20, 4, temperature=0.7, top_k=20,
                                  rng=np.random.default_rng(0))
    assert result.stats.accepted == result.stats.drafted and result.stats.rejections == 0
    assert result.stats.alpha_hat == pytest.approx(1.0)
    assert result.provenance.count("bonus") == result.stats.rounds  # every round ends with a bonus


def cache_sizes(model):
    """Record the positions of every cache model.new_cache hands out (an instance attribute over the method)."""
    sizes, new_cache = [], model.new_cache

    def recording(n_ctx=None):
        cache = new_cache(n_ctx)
        sizes.append(cache.n_ctx)
        return cache
    model.new_cache = recording
    return sizes


@pytest.mark.parametrize("K", [1, 4, 30])
def test_a_run_allocates_the_target_cache_it_feeds_not_the_whole_context(K):
    """generate's cache holds prompt + n_tokens - 1 positions (the last token is never fed); a chain's target
    cache one more, for the calibration call after the run. Full-context caches cost a 1558M run 629 MB,
    zeroed when first touched. A tree drafter sizes its trees by the whole context, so its target keeps it."""
    target, draft = GPT2(SMALL, random_params(SMALL, 3)), GPT2(SMALL, random_params(SMALL, 4))
    prompt, n = [1, 2, 3, 4, 5], 20
    sizes, draft_sizes = cache_sizes(target), cache_sizes(draft)
    greedy = generate(target, prompt, n, temperature=0)
    assert sizes == [len(prompt) + n - 1]
    result = speculative_generate(target, draft, prompt, n, K, temperature=0, calibrate=True)
    assert result.tokens == greedy and sizes[1:] == [len(prompt) + n], sizes
    assert draft_sizes[-1] == len(prompt) + n, draft_sizes  # the draft model's: fit_cache, after reset's
    assert result.stats.calibration_seconds >= 0 and len(result.tokens) == n
    del sizes[:]
    assert speculative_generate(target, draft, prompt, n, temperature=0, tree=(2, 1)).tokens == greedy
    assert sizes == [SMALL.n_ctx]  # prompt + n + TREE_ROOM is past the context: the context


@pytest.mark.parametrize("tree", [(4, 4, 4), (2, 1), "auto"])
def test_a_tree_run_keeps_its_rows_within_a_cache_sized_to_the_run(tree):
    """A tree run's target cache holds prompt + n_tokens + TREE_ROOM positions; (4, 4, 4) drafts 84 nodes, more
    than the room left near the end, so the drafter cuts its trees there, and the output stays the target's."""
    config = GPT2Config(n_vocab=29, n_ctx=256, n_embd=12, n_head=3, n_layer=2)
    target, draft = GPT2(config, random_params(config, 5)), GPT2(config, random_params(config, 6))
    prompt, n = [3, 1, 4, 1, 5], 40
    sizes, draft_sizes = cache_sizes(target), cache_sizes(draft)
    greedy = generate(target, prompt, n, temperature=0)
    result = speculative_generate(target, draft, prompt, n, temperature=0, tree=tree)
    assert result.tokens == greedy and sizes[1:] == [len(prompt) + n + TREE_ROOM], sizes
    assert draft_sizes[-1] == len(prompt) + n + TREE_ROOM, draft_sizes
    rng = np.random.default_rng(0)
    assert len(speculative_generate(target, draft, prompt, n, temperature=1.0, rng=rng, tree=tree).tokens) == n
    if tree != "auto":  # prompt lookup's tries: no draft model, the same room
        greedy = generate(target, prompt * 8, n, temperature=0)
        del sizes[:]
        assert speculative_generate(target, NgramDrafter(), prompt * 8, n, temperature=0, tree=tree).tokens == greedy
        assert sizes == [len(prompt) * 8 + n + TREE_ROOM], sizes
