"""Drafters and K policies keep speculative decoding exact (issue 10, item 5).

The same proofs as for the draft-model loop (test_speculative_exact.py), for what is new:
  * prompt lookup (NgramDrafter, one-hot q) by exact enumeration of every random path;
  * K policies that change K between rounds (heuristic; auto, with a scripted clock so that its
    timing-driven choices replay identically on every path) by exact enumeration;
  * a negative control: K chosen by peeking at the round's own p (broken_kernels.PeekingDrafter)
    misses the target's distribution by a wide margin, under the very same comparison;
  * temperature 0 == the target's greedy tokens, for every drafter and policy;
  * caches == recomputation after any number of rounds of varying K;
  * the n-gram index against its slow oracle, the heuristic schedule against HF's rule, auto's
    choice against theory.
"""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from gpt2np.decoding import drafters

from gpt2np.decoding import speculative

from gpt2np.decoding import run_stats as speculative_stats
from gpt2np.decoding.autoregressive import generate
from gpt2np.teach.broken_kernels import PeekingDrafter
from gpt2np.decoding.drafters import CountingNgramDrafter, ModelDrafter, NgramDrafter, ngram_lookup_reference
from gpt2np.teach.exact import exact_distribution, max_abs_difference, total_variation
from gpt2np.decoding.policies import (WINDOW, AutoK, HeuristicK,
                                      Measurements, least_squares_slope, make_policy, prior_v_curve, t1_estimate,
                                      v_curve)
from gpt2np.decoding.speculative import speculative_generate, speculative_stream
from gpt2np.decoding.tree_drafters import ModelTreeDrafter
from gpt2np.decoding.tree_policy import AutoTree
from gpt2np.decoding.stream import RoundEvent
from gpt2np.decoding.theory import predicted_speedup, predicted_speedups
from test_speculative_exact import (EXACT, PAIRS, assert_caches_match_recomputation, target_distribution,
                                    toy_pair)


class ScriptedClock:
    """time.perf_counter's stand-in: every reading advances by the next of a fixed, uneven series,
    so durations differ from call to call (auto's K varies) yet replay identically on every path."""

    def __init__(self):
        self.now, self.readings = 0.0, 0

    def perf_counter(self):
        self.readings += 1
        self.now += 1e-3 * (1 + (self.readings * 7919) % 13)  # uneven, deterministic
        return self.now


@pytest.fixture
def scripted_clock(monkeypatch):
    """Install a fresh ScriptedClock per call of the returned function (one per enumerated path)."""
    def install():
        clock = ScriptedClock()
        for module in (drafters, speculative, speculative_stats):
            monkeypatch.setattr(module, "time", clock)
        return clock
    return install


def speculative_distribution(target, make_draft, prompt, n_tokens, K, before_each=None, **options):
    def run(rng):
        if before_each:
            before_each()
        return tuple(speculative_generate(target, make_draft(), prompt, n_tokens, K, rng=rng, K_max=3,
                                          **options).tokens)
    return exact_distribution(run)


NGRAM_PROMPTS = [[0, 1, 0], [1, 1, 0, 1]]  # something to look up from the first round


# ---- exact enumeration ---------------------------------------------------------------------------

@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("K", [1, 2, 3])
@pytest.mark.parametrize("prompt", NGRAM_PROMPTS, ids=str)
def test_prompt_lookup_samples_exactly_the_target_distribution(pair, K, prompt):
    target, _ = toy_pair(**PAIRS[pair])
    expected = target_distribution(target, prompt, 4)
    got = speculative_distribution(target, lambda: NgramDrafter(n_max=2), prompt, 4, K)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("options", [{}, dict(temperature=0.6, top_k=2)], ids=str)
def test_counting_ngram_drafter_with_a_real_q_is_exact(K, options):
    """Its drafts are random (x ~ q), unlike prompt lookup's: a different path through the proof."""
    target, _ = toy_pair(**PAIRS["3 tokens, eot=2"])
    expected = target_distribution(target, [0, 1, 0, 0], 3, **options)
    got = speculative_distribution(target, lambda: CountingNgramDrafter(n_max=2, eps=0.2), [0, 1, 0, 0], 3, K,
                                   **options)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)


def test_counting_ngram_q_is_the_smoothed_follower_frequency():
    d = CountingNgramDrafter(n_max=1, eps=0.1)
    d.reset(random_target(n_vocab=4))
    d.update_index([0, 1, 0, 1, 0, 2, 0])  # after 0: 1, 1, 2
    np.testing.assert_allclose(d.q_after([0]), [0.025, 0.025 + 0.9 * 2 / 3, 0.025 + 0.9 / 3, 0.025])
    assert d.q_after([3]) is None


def random_target(n_vocab):
    return toy_pair(0, n_vocab=n_vocab)[0]


@pytest.mark.parametrize("options", [dict(temperature=0.6), dict(top_k=2), dict(top_p=0.7)], ids=str)
def test_prompt_lookup_is_exact_with_temperature_top_k_and_top_p(options):
    target, _ = toy_pair(**PAIRS["4 tokens, 30% zeros"])
    expected = target_distribution(target, [0, 1, 0], 3, **options)
    got = speculative_distribution(target, lambda: NgramDrafter(n_max=2), [0, 1, 0], 3, 2, **options)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)


@pytest.mark.parametrize("policy", ["heuristic", "auto"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("pair", PAIRS)
def test_policies_that_change_K_between_rounds_stay_exact(pair, drafter, policy, scripted_clock):
    target, draft = toy_pair(**PAIRS[pair])
    prompt = [0, 1, 0]
    # c_prior 0.1: auto drafts from the first round (with the toy models' default 0.5 it would not)
    make_draft = (lambda: NgramDrafter(n_max=2)) if drafter == "ngram" else (lambda: ModelDrafter(draft, c_prior=0.1))
    expected = target_distribution(target, prompt, 4)
    got = speculative_distribution(target, make_draft, prompt, 4, policy, before_each=scripted_clock)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)


def test_auto_really_varies_K_under_the_scripted_clock(scripted_clock):
    """Otherwise the enumeration above would only prove the fixed case again."""
    target, draft = toy_pair(**PAIRS["4 tokens, 30% zeros"])
    used = set()
    for seed in range(20):
        scripted_clock()
        stats = speculative_generate(target, ModelDrafter(draft, c_prior=0.1), [0, 1, 0], 12, "auto",
                                     rng=np.random.default_rng(seed),
                                     K_max=3).stats
        used |= set(stats.K_counts)
    assert len(used) >= 2, used


@pytest.mark.parametrize("pair", ["3 tokens, eot=2", "4 tokens, 30% zeros"])
def test_auto_with_the_target_drafting_for_itself_stays_exact(pair, scripted_clock):
    """q = p at every position: every overlap is 1, so auto's weight on a draft never rejected rises round by
    round (policies.perfect_draft_weight) and its plan with it; the law of the output is still the target's.
    c_prior 0.3 caps the first round at 2 drafts, so a second round plans with the weight (checked on one run of
    the pair without an end of text)."""
    target, _ = toy_pair(**PAIRS[pair])
    prompt = [0, 1, 0]
    make_draft = lambda: ModelDrafter(target, c_prior=0.3)  # noqa: E731
    expected = target_distribution(target, prompt, 6)
    got = speculative_distribution(target, make_draft, prompt, 6, "auto", before_each=scripted_clock)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)
    if target.eot_id is None:  # no end of text to stop the run after its first round
        scripted_clock()
        result = speculative_generate(target, make_draft(), prompt, 6, "auto", rng=np.random.default_rng(0), K_max=3,
                                      trace=True)
        assert [event.K for event in result.trace] == [2, 2] and all(b > 1 - 1e-6 for event in result.trace
                                                                     for b in event.overlaps), result.trace


class ShapedTarget:
    """A toy target that reads a cost shape as a GPT2 does (row_cost_shape), here a fixed one: flat to 3 rows, then
    steep, so that auto's K differs from its plan without one. Counts the calls and what they asked for."""

    def __init__(self, model, shape=None):
        self.model, self.asked = model, []
        self.shape = shape or {1: 1.0, 2: 1.05, 3: 1.05, 4: 2.5}

    def __getattr__(self, name):
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def row_cost_shape(self, M_max, passes):
        self.asked.append((M_max, passes))
        return {M: self.shape.get(M, 3.0) for M in range(1, M_max + 1)}


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("pair", PAIRS)
def test_auto_planning_with_the_target_s_cost_shape_stays_exact(pair, drafter, scripted_clock):
    """The shape is read once, before the first round, from the past only; every path replays it."""
    target, draft = toy_pair(**PAIRS[pair])
    prompt = [0, 1, 0]
    make_draft = (lambda: NgramDrafter(n_max=2)) if drafter == "ngram" else (lambda: ModelDrafter(draft, c_prior=0.1))
    expected = target_distribution(target, prompt, 4)
    got = speculative_distribution(ShapedTarget(target), make_draft, prompt, 4, "auto", before_each=scripted_clock)
    assert max_abs_difference(got, expected) <= EXACT, max_abs_difference(got, expected)


def test_only_auto_reads_the_cost_shape_and_it_changes_auto_s_choices(scripted_clock):
    """A fixed K asked for no measuring: the shape is never read. auto reads it once a run, for K_max + 1 rows within
    PROBE_SHARE of the run's plain passes, and plans with it: over 20 seeds, a shape that steps past 3 rows keeps
    K <= 2 where the prior's line tried 3, and a flat one (rows for free) drafts K_max."""
    target, draft = toy_pair(**PAIRS["3 tokens, eot=2"])
    steep, flat = ShapedTarget(target), ShapedTarget(target, {M: 1.0 for M in range(1, 7)})
    speculative_generate(steep, ModelDrafter(draft, c_prior=0.1), [0, 1, 0], 12, 3, rng=np.random.default_rng(0))
    assert steep.asked == []
    used = {}
    for name, model in [("steep", steep), ("flat", flat), ("no shape", target)]:
        used[name] = set()
        for seed in range(20):
            scripted_clock()
            stats = speculative_generate(model, ModelDrafter(draft, c_prior=0.1), [0, 1, 0], 12, "auto",
                                         rng=np.random.default_rng(seed), K_max=5).stats
            used[name] |= set(stats.K_counts)
            assert (stats.probe_seconds > 0) == (model is not target), (name, stats.probe_seconds)
    assert steep.asked == [(6, speculative.PROBE_SHARE * 12)] * 20, steep.asked
    assert max(used["steep"]) <= 2 < max(used["no shape"]) < max(used["flat"]) == 5, used


class BudgetedTarget(ShapedTarget):
    """A toy target whose probe, as a GPT2's, reads nothing where one reading of every size asked for does not fit
    the passes granted: here, more than `fits` sizes."""

    def __init__(self, model, shape, fits):
        super().__init__(model, shape)
        self.fits = fits

    def row_cost_shape(self, M_max, passes):
        if M_max <= self.fits:
            return super().row_cost_shape(M_max, passes)
        self.asked.append((M_max, passes))
        return None


def test_a_tree_policy_in_a_short_run_reads_its_chains_sizes_and_carries_them_on():
    """AutoTree plans with up to 16 rows; where the run's budget reads only 9 sizes it reads those (its chains', K_max
    + 1) and carries the shape on along their slope, where a policy with no fewer sizes to plan with reads nothing."""
    target, _ = toy_pair(**PAIRS["3 tokens, eot=2"])
    shape = {M: 1.0 + 0.05 * (M - 1) + (0.4 if M >= 7 else 0.0) for M in range(1, 17)}  # a step at 7 rows
    policy = AutoTree(K_max=8)
    short, roomy = BudgetedTarget(target, shape, fits=9), BudgetedTarget(target, shape, fits=16)
    read, _ = speculative.read_cost_shape(short, policy, 48)
    budget = speculative.PROBE_SHARE * 48
    assert short.asked == [(16, budget), (9, budget)], short.asked
    assert {M: read[M] for M in range(1, 10)} == {M: shape[M] for M in range(1, 10)}
    assert [round(read[M], 9) for M in (10, 16)] == [round(shape[9] + 0.05 * k, 9) for k in (1, 7)], read
    assert speculative.read_cost_shape(roomy, policy, 48)[0] == shape and roomy.asked == [(16, budget)]
    chains_only = AutoK(K_max=15)  # plans with 16 rows and no fewer
    assert speculative.read_cost_shape(BudgetedTarget(target, shape, fits=9), chains_only, 48)[0] is None


def test_peeking_at_the_round_to_choose_K_is_caught():
    """Negative control: same comparison, K cut where the round's own p says a draft would fail."""
    target, draft = toy_pair(**PAIRS["3 tokens, eot=2"])
    prompt = [0, 1, 0]
    expected = target_distribution(target, prompt, 3)
    honest = speculative_distribution(target, lambda: draft, prompt, 3, 3)
    assert max_abs_difference(honest, expected) <= EXACT
    peeking = speculative_distribution(target, lambda: PeekingDrafter(draft, target), prompt, 3, 3)
    assert total_variation(peeking, expected) > 0.02, total_variation(peeking, expected)


def test_peeking_cannot_bias_a_deterministic_drafter_but_a_broken_kernel_does():
    """Prompt lookup's drafts are a function of the context, so cutting them by the round's p is
    a choice of K from the context alone: still exact (the bias above needs a random draft to
    select on). The broken kernels are caught with prompt lookup as with a draft model."""
    from gpt2np.teach.broken_kernels import BROKEN_VARIANTS
    target, _ = toy_pair(**PAIRS["3 tokens, eot=2"])
    prompt = [0, 1, 0]
    expected = target_distribution(target, prompt, 3)
    peeking = speculative_distribution(target, lambda: PeekingDrafter(NgramDrafter(n_max=2), target),
                                       prompt, 3, 3)
    assert max_abs_difference(peeking, expected) <= EXACT
    for name in ["softmax_residual", "first_position_only"]:
        broken = exact_distribution(lambda rng: tuple(speculative_generate(
            target, NgramDrafter(n_max=2), prompt, 3, 3, rng=rng, **BROKEN_VARIANTS[name]).tokens))
        assert total_variation(broken, expected) > 0.02, (name, total_variation(broken, expected))


# ---- temperature 0 and caches --------------------------------------------------------------------

@hypothesis.settings(deadline=None, max_examples=60)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n_vocab=st.integers(2, 6), K=st.sampled_from([1, 3, "heuristic", "auto"]),
                  drafter=st.sampled_from(["model", "ngram", "counting"]), n_tokens=st.integers(1, 16),
                  prompt=st.lists(st.integers(0, 1), min_size=1, max_size=5))
def test_greedy_equals_target_greedy_for_every_drafter_and_policy(seed, n_vocab, K, drafter, n_tokens, prompt):
    target, draft = toy_pair(seed, n_vocab, 0.3)
    draft = {"ngram": NgramDrafter(n_max=3), "counting": CountingNgramDrafter(n_max=2)}.get(drafter, draft)
    result = speculative_generate(target, draft, prompt, n_tokens, K, temperature=0, K_max=4)
    assert result.tokens == generate(target, prompt, n_tokens, temperature=0)


@pytest.mark.parametrize("K", ["heuristic", "auto"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_caches_equal_recomputation_after_rounds_of_varying_K(seed, temperature, K):
    target, draft = toy_pair(seed, n_vocab=4, zero_fraction=0.3)
    for n_tokens in range(1, 13):
        rng = np.random.default_rng(seed * 100 + n_tokens)
        assert_caches_match_recomputation(target, draft, [3, 1], n_tokens, K, temperature=temperature, rng=rng)


# ---- the n-gram index ----------------------------------------------------------------------------

def test_lookup_prefers_the_longest_then_the_most_recent_match():
    d = NgramDrafter(n_max=3)
    d.reset(target=None)
    context = [1, 2, 3, 9, 2, 3, 8, 4, 2, 3]  # "2 3" after "1" at 1, after "9" at 4: latest wins
    assert d.propose(context, 2, {}, None)[0] == [8, 4]
    assert d.propose(context + [8], 5, {}, None)[0] == [4, 2, 3, 8]  # "3 8" seen once: up to the end
    assert d.propose([5, 6, 7], 3, {}, None)[0] == []                # nothing repeats: no drafts


@hypothesis.settings(deadline=None, max_examples=200)
@hypothesis.given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), n_max=st.integers(1, 4),
                  k=st.integers(1, 6), chunks=st.lists(st.integers(1, 5), min_size=1, max_size=10))
def test_incremental_index_equals_a_full_rescan_after_every_round(tokens, n_max, k, chunks):
    d = NgramDrafter(n_max=n_max)
    d.reset(target=None)
    end = 0
    for size in chunks + [len(tokens)]:  # the context grows by a few tokens per round
        end = min(len(tokens), end + size)
        context = tokens[:end]
        assert d.propose(context, k, {}, None)[0] == ngram_lookup_reference(context, k, n_max)
        assert d.n_indexed == len(context) - 1  # each position indexed once, never rescanned


def test_one_hot_q_and_costs_are_reported():
    target, _ = toy_pair(0, n_vocab=4)
    result = speculative_generate(target, NgramDrafter(), [0, 1, 2, 0, 1], 10, 3, temperature=0)
    s = result.stats
    assert s.drafter == "ngram (n <= 3)" and s.policy == "fixed" and s.draft_timings["lookup"][0] == s.rounds
    assert s.c is not None and s.c >= 0


@pytest.mark.parametrize("n_max, n_min", [(0, 1), (2, 3), (1.5, 1), (True, 1)])
def test_bad_ngram_sizes_are_refused(n_max, n_min):
    with pytest.raises(ValueError, match="n-gram sizes"):
        NgramDrafter(n_max=n_max, n_min=n_min)


# ---- the policies --------------------------------------------------------------------------------

def record(n_drafts, n_accepted):
    decisions = [True] * n_accepted + [False] * (n_accepted < n_drafts)
    return RoundEvent(tokens=[], provenance=[], K=n_drafts, n_emitted=0, drafts=[0] * n_drafts, decisions=decisions)


def test_heuristic_follows_hugging_faces_schedule():
    policy = HeuristicK(K_max=8)
    seen = []
    for n_accepted in [5, 7, 8, 3, 0, 0, 0, 0, 0, 1]:
        K = policy.choose(Measurements())
        seen.append(K)
        policy.update(record(K, min(n_accepted, K)))
    # start 5; +2 after all accepted (5 -> 7 -> 8, capped); -1 otherwise, never below 1
    assert seen == [5, 7, 8, 8, 7, 6, 5, 4, 3, 2]


def test_v_curve_keeps_each_timed_size_and_fits_the_rest():
    assert v_curve({}, 5) == prior_v_curve(5)
    np.testing.assert_allclose([prior_v_curve(5)[m] for m in range(1, 6)], [1.0, 1.3, 1.38, 1.46, 1.54])
    # one size of 2+ tokens: the prior slope through it; t1 measured
    curve = v_curve({1: [2.0], 5: [4.0]}, 6)
    np.testing.assert_allclose([curve[m] for m in range(1, 7)], [1.0, 1.76, 1.84, 1.92, 2.0, 2.08])
    # two or more: each keeps its own median, the others lie on the least-squares line through them
    curve = v_curve({1: [2.0, 2.0, 9.0], 2: [2.8], 4: [2.8], 6: [4.0]}, 7)
    assert curve[1] == 1.0 and curve[2] == 1.4 and curve[4] == 1.4 and curve[6] == 2.0  # medians / t1 = 2
    np.testing.assert_allclose([curve[3], curve[5], curve[7]], [1.45, 1.75, 2.05])  # line: mean 1.6 at M = 4, slope 0.15
    # no one-token call timed yet: t1 comes from the smallest size through the prior
    curve = v_curve({3: [2.76]}, 4)
    np.testing.assert_allclose([curve[1], curve[3], curve[4]], [1.0, 1.38, 1.46])
    # a fit that falls with M is held flat: a call never gets cheaper with more tokens
    curve = v_curve({1: [1.0], 2: [1.5], 3: [1.2]}, 5)
    np.testing.assert_allclose([curve[4], curve[5]], [1.35, 1.35])


def test_least_squares_slope_equals_numpys_fit():
    rng = np.random.default_rng(0)
    for n in (2, 3, 9):
        xs, ys = sorted(rng.choice(20, n, replace=False) + 1), list(rng.random(n) * 3)
        slope, reference = least_squares_slope(xs, ys), np.polyfit(xs, ys, 1)[0]
        assert abs(slope - reference) < 1e-12, (n, slope - reference)


def test_predicted_speedups_are_theorys_refined_prediction():
    v = prior_v_curve(9)
    for a, c in [(0.0, 0.0), (0.3, 0.35), (0.8, 0.05), (1.0, 0.1)]:
        fast = predicted_speedups(a, c, v, 8)
        slow = [predicted_speedup(a, K, c, v[K + 1]) for K in range(9)]
        assert max(abs(x - y) for x, y in zip(fast, slow)) < 1e-12, (a, c)


def test_measurements_keep_the_latest_window_so_auto_follows_a_machine_that_slows_down():
    past = Measurements()
    for _ in range(3 * WINDOW):
        past.add_target_call(1, 1.0)
        past.add_draft_cost(0.1)
    for _ in range(WINDOW // 2 + 1):  # the machine halves its speed: a majority of the window now
        past.add_target_call(1, 2.0)
        past.add_draft_cost(0.2)
    assert len(past.target_durations[1]) == len(past.draft_costs) == WINDOW
    assert past.draft_cost == 0.2 and t1_estimate(past.target_durations, v_curve(past.target_durations, 2)) == 2.0
    _, c, _ = AutoK(4).estimates(past)
    assert c == 0.1, c  # 0.2 s a drafted token / 2.0 s a one-token call


@pytest.mark.parametrize("K, K_max, message", [
    (0, 8, "K"), ("sometimes", 8, "heuristic"), (2.5, 8, "K"), ("auto", 0, "K_max"), (True, 8, "K"),
])
def test_bad_K_or_K_max_is_one_line(K, K_max, message):
    with pytest.raises(ValueError, match=message):
        make_policy(K, K_max)


# ---- the stream ----------------------------------------------------------------------------------

def test_stream_yields_rounds_that_add_up_to_the_result():
    target, draft = toy_pair(1, n_vocab=4)
    stream = speculative_stream(target, draft, [0], 15, K="heuristic", rng=np.random.default_rng(3))
    events = list(stream)
    result = stream.result
    assert [t for e in events for t in e.tokens] == result.tokens == stream.tokens
    assert [p for e in events for p in e.provenance] == result.provenance
    assert [e.n_emitted for e in events] == list(np.cumsum([len(e.tokens) for e in events]))
    assert result.stats.rounds == len(events) and sum(result.stats.K_counts.values()) == len(events)
    assert all(len(e.drafts) <= e.K and e.seconds >= 0 for e in events)


def test_stream_checks_before_any_work_and_can_stop_early():
    target, draft = toy_pair(1, n_vocab=4)
    with pytest.raises(ValueError, match="rng"):
        speculative_stream(target, draft, [0], 5, K=2, temperature=1.0)  # raised at the call, not on iteration
    stream = speculative_stream(target, ModelDrafter(draft), [0], 50, K=2, rng=np.random.default_rng(0))
    first = next(stream)
    stream.close()
    assert stream.tokens == first.tokens and stream.result is None


def test_a_draft_models_catch_up_after_plain_rounds_is_not_charged_to_its_drafts():
    """After plain rounds a draft model first feeds every token it has not seen (the plain rounds'
    debt); charged to that round's one or two drafts it read c as 0.6-0.8 against 0.35 at 124M ->
    355M and kept auto plain. A round that fed at most CATCH_UP tokens is timed as before."""
    target, draft = toy_pair(**PAIRS["4 tokens, 30% zeros"])
    drafter = ModelDrafter(draft, c_prior=0.1)
    drafter.reset(target)
    options = dict(temperature=1.0, top_k=None, top_p=None)
    drafter.propose([0, 1, 0], 2, options, np.random.default_rng(0))
    assert drafter.caught_up == 3, drafter.caught_up          # the prompt
    drafter.roll_back(3)
    drafter.propose([0, 1, 0, 2, 1, 3, 0, 1], 1, options, np.random.default_rng(0))
    assert drafter.caught_up == 5, drafter.caught_up          # five plain-decoded tokens
    tree = ModelTreeDrafter(draft, (2, 1))  # a tree round after plain rounds owes the same debt
    tree.reset(target)
    tree.propose([0, 1, 0], 2, options, np.random.default_rng(0))
    tree.roll_back(3, (0,))
    tree.propose([0, 1, 0, 2, 1, 3, 0, 1], 2, options, np.random.default_rng(0))
    assert tree.caught_up == 5, tree.caught_up
    calls = {2: [1.0]}
    event = RoundEvent(tokens=[1, 2], provenance=["draft", "target"], K=1, n_emitted=2, drafts=[1],
                       overlaps=[1.0], propose_seconds=0.8)
    past = Measurements(c_prior=0.1)
    speculative.observe(past, event, type("Timed", (), {"durations": calls})(), first_round=False,
                        caught_up=drafter.caught_up)
    assert past.draft_cost is None and past.target_durations == {2: [1.0]}, (past.draft_cost, past.target_durations)
    speculative.observe(past, event, type("Timed", (), {"durations": calls})(), first_round=False,
                        caught_up=speculative.CATCH_UP)
    assert past.draft_cost == 0.8, past.draft_cost
