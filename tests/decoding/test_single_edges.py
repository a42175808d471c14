"""Single-sequence decoding at the API's edges (audit 60): each test is one reported defect.

A np.uint64 prompt crashing generate_without_cache at its second step (float64 ids); a plain stream
decoding whatever the caller's list held when it was iterated, not when it was opened; random.Random
taken as an rng and failing at the first draw; a small NumPy integer n_tokens wrapping around inside
the context check; a draft's context error worded as the target's; unchecked n_min, ModelDrafter
models and NgramTreeDrafter widths; draft_sampler=, kernel= and tree_kernel= ignored by runs that never
call them, and a ModelDrafter's c_prior dropped by tree=; K_counts counting the K asked for where the
loop drafted fewer; docstrings naming K_max positional and a provenance comment missing "target".
"""
import inspect
import random
from collections import Counter

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding import autoregressive, speculative
from gpt2np.decoding.drafters import ModelDrafter, NgramDrafter
from gpt2np.decoding.sampling import sample
from gpt2np.decoding.speculative_kernel import verify_round
from gpt2np.decoding.tree_drafters import ModelTreeDrafter, NgramTreeDrafter, as_tree_drafter
from gpt2np.decoding.tree_kernel import verify_tree
from gpt2np.decoding.theory import predicted_speedup_mixed


@pytest.fixture(scope="module")
def pair():
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    return target, draft, target.tokenizer.encode("ROMEO:\nWhat light")


@pytest.fixture(scope="module")
def small():  # n_ctx 128, no tokenizer: the n_tokens overflow cases
    config = gpt2np.GPT2Config(n_vocab=50, n_ctx=128, n_embd=32, n_head=2, n_layer=1)
    return gpt2np.random_model(config, seed=0, tokenizer=None)


def one_line(info):
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    return message


class NoForward:
    """Wraps a model; fails the test if a forward pass or a cache is asked for (checks come first)."""

    def __init__(self, model):
        self.n_vocab, self.n_ctx, self.eot_id = model.n_vocab, model.n_ctx, model.eot_id

    def new_cache(self, *args):
        raise AssertionError("new_cache() called before the request was checked")

    def forward(self, *args, **kwargs):
        raise AssertionError("forward() called before the request was checked")


# ---- 1. prompts of any integer dtype, with or without the cache ---------------------------------------

@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.uint16, np.int32])
def test_an_integer_array_prompt_of_any_dtype_decodes_without_the_cache(pair, dtype):
    target, _, ids = pair
    expected = gpt2np.generate(target, ids, 3)
    prompt = np.array(ids, dtype=dtype)
    assert gpt2np.generate_without_cache(target, prompt, 3) == expected
    assert gpt2np.plain_stream(target, prompt, 3, use_cache=False).run() == expected
    assert gpt2np.generate(target, prompt, 3) == expected


# ---- 2. a plain stream decodes the prompt it was opened with ------------------------------------------

def test_a_plain_stream_decodes_the_prompt_it_was_opened_with(pair):
    target, draft, ids = pair
    expected = gpt2np.generate(target, ids, 10)
    buf = list(ids)
    plain, cacheless = gpt2np.plain_stream(target, buf, 10), gpt2np.plain_stream(target, buf, 10, use_cache=False)
    spec = gpt2np.speculative_stream(target, draft, buf, 10)
    buf[:] = target.tokenizer.encode("JULIET:\nO Romeo")
    assert plain.run() == cacheless.run() == spec.run().tokens == expected


def test_a_prompt_grown_past_the_context_after_the_checks_changes_nothing(pair):
    target, _, ids = pair
    buf = list(ids)
    stream = gpt2np.plain_stream(target, buf, 10)
    buf.extend([5] * 240)  # 257 tokens: the checks ran on 17
    assert stream.run() == gpt2np.generate(target, ids, 10)


# ---- 3. an rng is a np.random.Generator ---------------------------------------------------------------

RUNS = {
    "generate": lambda t, d, ids, rng: gpt2np.generate(t, ids, 3, rng=rng),
    "generate_without_cache": lambda t, d, ids, rng: gpt2np.generate_without_cache(t, ids, 3, rng=rng),
    "plain_stream": lambda t, d, ids, rng: gpt2np.plain_stream(t, ids, 3, rng=rng),
    "speculative_generate": lambda t, d, ids, rng: gpt2np.speculative_generate(t, d, ids, 3, rng=rng),
    "speculative_stream": lambda t, d, ids, rng: gpt2np.speculative_stream(t, d, ids, 3, rng=rng),
    "generate_batch": lambda t, d, ids, rng: gpt2np.generate_batch(t, [ids], 3, rng=rng),
}


@pytest.mark.parametrize("rng", [random.Random(0), random.SystemRandom()], ids=["Random", "SystemRandom"])
@pytest.mark.parametrize("run", RUNS)
def test_a_python_random_generator_is_refused_before_any_forward_pass(pair, run, rng):
    """random.Random has a choice method, which the check took for a Generator's: it failed at the first
    draw, after the prefill, with "Random.choice() got an unexpected keyword argument 'p'"."""
    target, draft, ids = pair
    with pytest.raises(ValueError, match=r"rng must be a np.random.Generator .*, got (System)?Random$") as info:
        RUNS[run](NoForward(target), NoForward(draft), ids, rng)
    one_line(info)


def test_a_stand_in_that_draws_as_a_generator_still_passes():
    """exact.ScriptedRng and the tests' stand-ins take choice(n, p=...): they are still accepted."""
    class StandIn:
        def choice(self, a, p):
            return int(np.argmax(p))

    class Any:
        def choice(self, *args, **kwargs):
            return 0

    for rng in (StandIn(), Any(), np.random.default_rng(0), None):
        autoregressive.check_rng_type(rng)


# ---- 4. a NumPy integer n_tokens is an int once checked ------------------------------------------------

SMALL_RUNS = {
    "generate": lambda m, prompt, n: gpt2np.generate(m, prompt, n),
    "plain_stream": lambda m, prompt, n: gpt2np.plain_stream(m, prompt, n),
    "generate_without_cache": lambda m, prompt, n: gpt2np.generate_without_cache(m, prompt, n),
    "speculative_generate": lambda m, prompt, n: gpt2np.speculative_generate(m, m, prompt, n, K=2),
    "speculative_stream": lambda m, prompt, n: gpt2np.speculative_stream(m, m, prompt, n, K=2),
}


@pytest.mark.parametrize("run", SMALL_RUNS)
def test_a_small_numpy_integer_n_tokens_cannot_wrap_around_the_context_check(small, run):
    with pytest.raises(ValueError, match=r"prompt \(100 tokens\) \+ n_tokens \(100\) = 200 exceeds the context "
                                         "of 128 tokens") as info:
        SMALL_RUNS[run](small, [1] * 100, np.int8(100))  # 100 + np.int8(100) is np.int8(-56) in NumPy 2
    one_line(info)


@pytest.mark.parametrize("run", ["generate", "generate_without_cache", "speculative_generate"])
def test_a_small_numpy_integer_n_tokens_that_fits_decodes_as_an_int(small, run):
    """120 + np.int8(8) = 128 wraps to -128 in np.int8: the cache sizes read it (new_cache refused -128)."""
    result = SMALL_RUNS[run](small, [1] * 120, np.int8(8))
    tokens = getattr(result, "tokens", result)
    assert tokens == gpt2np.generate(small, [1] * 120, 8)


# ---- 5. the draft's context is named as the draft's ---------------------------------------------------

def test_a_draft_context_too_short_is_named_as_the_draft_s(pair):
    target, _, ids = pair
    config = gpt2np.GPT2Config(n_vocab=257, n_ctx=16, n_embd=32, n_head=2, n_layer=1)
    short = gpt2np.random_model(config, seed=0, tokenizer=target.tokenizer)
    with pytest.raises(ValueError, match=r"= 22 exceeds the draft model's context of 16 tokens") as info:
        gpt2np.speculative_generate(NoForward(target), NoForward(short), ids, 5)
    one_line(info)


def test_a_request_too_long_for_both_models_is_named_as_the_target_s(pair):
    target, draft, ids = pair
    with pytest.raises(ValueError, match=r"exceeds the context of 256 tokens") as info:
        gpt2np.speculative_generate(NoForward(target), NoForward(draft), ids, 256 - len(ids) + 1)
    assert "draft" not in one_line(info)


# ---- 6. NgramDrafter's sizes are integers ------------------------------------------------------------

@pytest.mark.parametrize("sizes", [dict(n_min=2.7), dict(n_min=True), dict(n_min="2"), dict(n_min=None),
                                   dict(n_min=0), dict(n_min=4), dict(n_max=2.0), dict(n_max=True)],
                         ids=lambda sizes: repr(sizes))
@pytest.mark.parametrize("cls", [NgramDrafter, NgramTreeDrafter])
def test_n_gram_sizes_are_integers_with_one_at_most_n_min_at_most_n_max(cls, sizes):
    with pytest.raises(ValueError, match=r"n-gram sizes must be integers with 1 <= n_min <= n_max, got") as info:
        cls(**{"n_max": 3, **sizes})
    one_line(info)


def test_numpy_integer_n_gram_sizes_are_taken_as_ints():
    drafter = NgramDrafter(n_max=np.int64(3), n_min=np.int8(2))
    assert (drafter.n_min, drafter.n_max) == (2, 3) and type(drafter.n_min) is int


# ---- 7. ModelDrafter wants a model; NgramTreeDrafter names candidates and depth --------------------------

@pytest.mark.parametrize("make", [ModelDrafter, lambda model: ModelTreeDrafter(model, (2, 1))],
                         ids=["ModelDrafter", "ModelTreeDrafter"])
def test_a_model_drafter_given_a_name_says_to_load_the_model(make):
    with pytest.raises(ValueError, match=r"ModelDrafter needs a loaded model \(gpt2np.load_model\(name\)\), got "
                                         r"str 'shakespeare-260K'; gpt2np.load_drafter\(name\)") as info:
        make("shakespeare-260K")
    one_line(info)
    with pytest.raises(ValueError, match="ModelDrafter needs a loaded model .*, got NgramDrafter;"):
        make(NgramDrafter())


@pytest.mark.parametrize("widths", [dict(candidates=0), dict(depth=0), dict(candidates=1.5), dict(depth=True),
                                    dict(candidates="3")], ids=lambda widths: repr(widths))
def test_ngram_tree_drafter_names_candidates_and_depth(widths):
    with pytest.raises(ValueError, match=r"NgramTreeDrafter's candidates and depth must be integers >= 1, got "
                                         r"candidates=.*, depth=") as info:
        NgramTreeDrafter(**widths)
    one_line(info)


# ---- 8. options a tree run (or a chain run) would never call are refused ----------------------------------

def spy_sampler(q, rng):
    raise AssertionError("the spy sampler was called: the run should have been refused")


def spy_kernel(*args, **kwargs):
    raise AssertionError("the spy kernel was called: the run should have been refused")


@pytest.mark.parametrize("tree", [(1, 1), (2, 2), "auto"], ids=str)
def test_a_draft_sampler_with_tree_is_refused(pair, tree):
    """A tree draws its drafts without replacement (tree_drafts.draft_tree) and never called the sampler,
    so a broken one looked exact; likewise a ModelDrafter's own sampler=."""
    target, draft, ids = pair
    runs = [lambda: gpt2np.speculative_generate(target, NoForward(draft), ids, 5, rng=np.random.default_rng(0),
                                                draft_sampler=spy_sampler, tree=tree),
            lambda: gpt2np.speculative_stream(target, ModelDrafter(NoForward(draft), sampler=spy_sampler), ids, 5,
                                              rng=np.random.default_rng(0), tree=tree)]
    for run in runs:
        with pytest.raises(ValueError, match="draft_sampler= draws a chain's drafts, and tree= draws its trees") \
                as info:
            run()
        one_line(info)


def test_a_draft_sampler_with_a_drafter_is_refused(pair):
    """as_drafter used draft_sampler only to wrap a model: with a drafter it was silently dropped."""
    target, draft, ids = pair
    for drafter in (NgramDrafter(), ModelDrafter(draft)):
        with pytest.raises(ValueError, match=r"draft_sampler= draws a draft model's tokens, and the draft is a "
                                             rf"drafter \({type(drafter).__name__}\)") as info:
            gpt2np.speculative_generate(target, drafter, ids, 5, rng=np.random.default_rng(0),
                                        draft_sampler=spy_sampler)
        one_line(info)


@pytest.mark.parametrize("draft, tree", [("model", (1, 1)), ("model", (2, 2)), ("model", "auto"),
                                         ("ngram", (2, 2)), ("trie", None)], ids=str)
def test_a_chain_kernel_with_a_tree_run_is_refused(pair, draft, tree):
    target, model, ids = pair
    drafter = {"model": model, "ngram": NgramDrafter(), "trie": NgramTreeDrafter()}[draft]
    with pytest.raises(ValueError, match=r"kernel= verifies chains, and this run drafts token trees") as info:
        gpt2np.speculative_generate(target, drafter, ids, 5, kernel=spy_kernel, tree=tree)
    one_line(info)


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_a_tree_kernel_with_a_chain_run_is_refused(pair, draft):
    target, model, ids = pair
    drafter = {"model": model, "ngram": NgramDrafter()}[draft]
    with pytest.raises(ValueError, match=r"tree_kernel= verifies token trees, and this run drafts chains") as info:
        gpt2np.speculative_generate(target, drafter, ids, 5, tree_kernel=spy_kernel)
    one_line(info)


def test_the_default_kernels_and_sampler_run_chains_and_trees(pair):
    """Passing the defaults by name is not a request for something unused."""
    target, draft, ids = pair
    expected = gpt2np.generate(target, ids, 6)
    for tree in (None, (2, 1)):
        result = gpt2np.speculative_generate(target, draft, ids, 6, kernel=verify_round, tree_kernel=verify_tree,
                                             draft_sampler=sample, tree=tree)
        assert result.tokens == expected


def test_tree_keeps_a_model_drafter_s_c_prior(pair):
    """as_tree_drafter dropped it (tree="auto" kept it: tree_policy.auto_tree)."""
    target, draft, _ = pair
    tree_drafter = as_tree_drafter(ModelDrafter(draft, c_prior=0.123), (2, 2))
    tree_drafter.reset(target)
    assert tree_drafter.c_prior == 0.123
    default = as_tree_drafter(ModelDrafter(draft), (2, 2))
    default.reset(target)
    assert default.c_prior == pytest.approx(draft.config.n_params() / target.config.n_params())


# ---- 9. K_counts count the K a round drafted, clamped to the tokens left ----------------------------------

def test_a_clamped_K_is_counted_as_the_K_the_round_drafted(pair):
    """K=50 with 7 tokens wanted: the first round drafts 6 (a round emits at most k + 1), and the stats
    said K 50, K_counts {50: 2}, and predicted a speedup for 50-draft rounds that never ran."""
    target, draft, ids = pair
    result = gpt2np.speculative_generate(target, draft, ids, 7, K=50, trace=True)
    stats = result.stats
    assert stats.K_counts == dict(Counter(len(event.drafts) for event in result.trace)), stats.K_counts
    assert max(stats.K_counts) == stats.K == 6 and sum(stats.K_counts.values()) == stats.rounds
    if stats.predicted_speedup is not None:
        assert stats.predicted_speedup == predicted_speedup_mixed(stats.alpha_hat, stats.K_counts, stats.c,
                                                                  lambda k: 1.0)


def test_prompt_lookup_counts_the_K_asked_for_after_clamping(pair):
    """A drafter may propose fewer than k (prompt lookup finding nothing): K_counts keeps k, `drafted` the
    drafts, so a fixed K's report still says the K it ran with."""
    target, _, ids = pair
    stats = gpt2np.speculative_generate(target, NgramDrafter(), ids, 12, K=4).stats
    assert set(stats.K_counts) <= {0, 1, 2, 3, 4} and stats.K == 4, stats.K_counts
    assert sum(stats.K_counts.values()) == stats.rounds


# ---- 10, 11. the docstrings and the provenance comment --------------------------------------------------

@pytest.mark.parametrize("module", [gpt2np, autoregressive], ids=lambda m: m.__name__)
def test_the_docstrings_say_K_max_is_keyword_only(module):
    doc = " ".join(module.__doc__.split())
    assert "K_max is keyword-only" in doc
    assert "K and K_max" not in doc and "K_max to speculative_stream" not in doc
    with pytest.raises(TypeError):
        gpt2np.speculative_stream(None, None, [1], 5, "auto", 4)  # K_max by position: a TypeError, as it says


def test_the_provenance_comment_lists_every_value_results_contain(pair):
    """ "target" (a round without drafts) was missing: here prompt lookup finds nothing at first."""
    target, draft, ids = pair
    seen = set(gpt2np.speculative_generate(target, NgramDrafter(), ids, 12).provenance)
    seen |= set(gpt2np.speculative_generate(target, draft, ids, 7, K=50).provenance)
    seen |= set(gpt2np.speculative_generate(target, draft, ids, 12, K=4, temperature=1.0,
                                            rng=np.random.default_rng(0)).provenance)
    assert "target" in seen and len(seen) >= 3, seen
    source = inspect.getsource(speculative.SpeculativeResult)
    comment = source[source.index("provenance:"):source.index("stats:")]
    assert all(f'"{value}"' in comment for value in seen), (seen, comment)
