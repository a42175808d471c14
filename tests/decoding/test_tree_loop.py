"""Token trees in the speculative loop are exactly right (issue 28, items 1, 2 and the loop's part of 4 and 6).

The whole loop (speculative_generate with tree= or a tree drafter: drafting one level per call,
the target's one forward_rows call per round, verify_tree, keep_rows on both caches, the stop
tokens) under exact enumeration on toy models (toy_models.py has forward_rows and keep_rows), so
the tolerance is float rounding (EXACT); the broken tree kernels miss by a stated total variation
through the very same loop. At temperature 0 trees give the target's greedy tokens, token for
token (toy pairs, random GPT-2s, the fixtures' Hugging Face reference, the bundled pair). Caches
equal a recomputation after any number of tree rounds. A chain still makes exactly the calls it
made before trees existed (the plain forward, never forward_rows).
"""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import gpt2np
from conftest import FIXTURES, random_params
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.drafters import CountingNgramDrafter, NgramDrafter
from gpt2np.decoding.run_stats import drafted_depth, is_branching
from gpt2np.decoding.speculative import speculative_generate, speculative_stream
from gpt2np.decoding.tree_drafters import ModelTreeDrafter, NgramTreeDrafter
from gpt2np.model import rows
from gpt2np.model.forward import GPT2
from gpt2np.teach.broken_tree_kernels import BROKEN_TREE_KERNELS
from gpt2np.teach.exact import exact_distribution, max_abs_difference, total_variation
from gpt2np.teach.toy_models import ToyModel
from test_speculative_exact import (EXACT, assert_caches_match_recomputation, eot_in_second_draft_pair,
                                   target_distribution, toy_pair)
from test_speculative_gpt2 import SMALL, fixture_pair  # noqa: F401  (a pytest fixture)

DENSE = dict(seed=1, n_vocab=3)                     # every draft row has 3 tokens: the hard case
SPARSE = dict(seed=4, n_vocab=3, zero_fraction=0.3)  # 2 tokens per draft row: (3, 1) i.i.d. enumerates fast
OPTIONS = [{}, dict(temperature=0.6), dict(top_k=2)]


def tree_law(target, draft, prompt, n_tokens, widths, replacement, **options):
    """Exact {tokens: probability} of the loop with a tree drafter (a fresh one per path)."""
    return exact_distribution(lambda rng: tuple(speculative_generate(
        target, ModelTreeDrafter(draft, widths, replacement), prompt, n_tokens, rng=rng, **options).tokens))


# ---- the output law through the whole loop ------------------------------------------------------

@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("widths, replacement, pair", [
    ((2,), False, DENSE), ((2,), True, DENSE), ((2, 1), False, DENSE), ((2, 1), True, DENSE),
    ((3, 1), False, DENSE), ((3, 1), True, SPARSE),
], ids=str)
def test_tree_rounds_sample_exactly_the_target(widths, replacement, pair, options):
    """N = 3: the first round drafts the whole shape (depth 2), the next ones what is left."""
    target, draft = toy_pair(**pair)
    want = target_distribution(target, [0], 3, **options)
    got = tree_law(target, draft, [0], 3, widths, replacement, **options)
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)


@pytest.mark.parametrize("stop_tokens", [None, [1]])
def test_end_of_text_and_stop_tokens_end_tree_runs_as_plain_decoding(stop_tokens):
    target, draft = toy_pair(seed=1, n_vocab=3, eot_id=2)
    want = exact_distribution(lambda rng: tuple(generate(target, [0], 4, rng=rng, stop_tokens=stop_tokens)))
    got = exact_distribution(lambda rng: tuple(speculative_generate(
        target, draft, [0], 4, rng=rng, tree=(2, 1), stop_tokens=stop_tokens).tokens))
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)


@pytest.mark.parametrize("options", [{}, dict(temperature=0.6, top_k=3)], ids=str)
@pytest.mark.parametrize("prompt", [[1, 2, 1, 0, 1, 2, 1], [0, 0, 1, 0, 2, 0]], ids=str)
def test_prompt_lookup_tries_are_exact_through_the_loop(prompt, options):
    """tree= with prompt lookup: up to 2 * 1 earlier matches of up to 2 tokens, as a trie."""
    target, _ = toy_pair(seed=1, n_vocab=4, zero_fraction=0.3)
    want = target_distribution(target, prompt, 3, **options)
    got = exact_distribution(lambda rng: tuple(speculative_generate(
        target, NgramDrafter(n_max=2), prompt, 3, rng=rng, tree=(2, 1), **options).tokens))
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)


@pytest.mark.parametrize("name", sorted(BROKEN_TREE_KERNELS))
def test_the_loop_check_rejects_each_broken_tree_kernel(name):
    """(2, 2) trees drawn without replacement on 3 tokens, N = 3, through speculative_generate(...,
    tree_kernel=broken): deep enough for a node where two tokens have p > q (test_tree_kernel.py's
    note). (Trees drawn with replacement: the round-level controls of test_tree_kernel.py.)"""
    target, draft = toy_pair(**DENSE)
    want = target_distribution(target, [0], 3)
    broken = exact_distribution(lambda rng: tuple(speculative_generate(
        target, draft, [0], 3, rng=rng, tree=(2, 2), tree_kernel=BROKEN_TREE_KERNELS[name]).tokens))
    tv = total_variation(broken, want)
    # measured: any_child_passes 0.080, siblings_see_unmodified_p 0.051, with_replacement_rule_on_any_tree 0.104
    assert tv > 0.03, f"{name}: TV only {tv:.4f}"


# ---- temperature 0: the target's greedy tokens --------------------------------------------------

SHAPES = [(2,), (3, 1), (2, 2), (3, 2, 1), (1, 1, 1)]


@hypothesis.settings(deadline=None, max_examples=60)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n_vocab=st.integers(2, 6), widths=st.sampled_from(SHAPES),
                  n_tokens=st.integers(1, 14), zero_fraction=st.sampled_from([0.0, 0.5]),
                  stops=st.sampled_from([None, [0], [1], [0, 1]]),
                  prompt=st.lists(st.integers(0, 1), min_size=1, max_size=3))
def test_greedy_trees_give_the_target_greedy_tokens_on_toy_pairs(seed, n_vocab, widths, n_tokens, zero_fraction,
                                                                 stops, prompt):
    target, draft = toy_pair(seed, n_vocab, zero_fraction, eot_id=n_vocab - 1 if seed % 2 else None)
    want = generate(target, prompt, n_tokens, temperature=0, stop_tokens=stops)
    assert speculative_generate(target, draft, prompt, n_tokens, tree=widths, stop_tokens=stops).tokens == want
    lookup = speculative_generate(target, NgramDrafter(), prompt, n_tokens, tree=widths, stop_tokens=stops)
    assert lookup.tokens == want


@hypothesis.settings(deadline=None, max_examples=15)
@hypothesis.given(seed=st.integers(0, 10_000), widths=st.sampled_from(SHAPES), n_tokens=st.integers(1, 20))
def test_greedy_trees_give_the_target_greedy_tokens_on_random_gpt2s(seed, widths, n_tokens):
    target, draft = GPT2(SMALL, random_params(SMALL, seed)), GPT2(SMALL, random_params(SMALL, seed + 1))
    prompt = [seed % SMALL.n_vocab, 3]
    result = speculative_generate(target, draft, prompt, n_tokens, tree=widths)
    assert result.tokens == generate(target, prompt, n_tokens, temperature=0)


@pytest.mark.parametrize("widths", [(2,), (3, 2, 1), (4, 1, 1, 1)], ids=str)
def test_greedy_trees_equal_hugging_face_greedy_on_the_fixture(fixture_pair, widths):  # noqa: F811
    target, draft = fixture_pair
    ref = np.load(FIXTURES / "gpt2-tiny-b" / "reference.npz")
    result = speculative_generate(target, draft, ref["tokens"], len(ref["greedy_tokens"]), tree=widths)
    np.testing.assert_array_equal(result.tokens, ref["greedy_tokens"])


@pytest.fixture(scope="module")
def bundled_pair():
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


@pytest.mark.parametrize("widths", [(3, 2, 1), (2, 2, 2, 1), (4,)], ids=str)
def test_greedy_trees_on_the_bundled_pair_equal_the_target_token_for_token(bundled_pair, widths):
    target, draft = bundled_pair
    prompt = target.tokenizer.encode("ROMEO:\nBut soft, what light")
    result = speculative_generate(target, draft, prompt, 80, tree=widths)
    assert result.tokens == generate(target, prompt, 80, temperature=0)
    assert result.stats.accepted > 0 and result.stats.tokens_per_target_call > 1.5  # the trees were used


# ---- caches, calls and the round's record -------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("widths", [(2,), (3, 2), (2, 1, 2)], ids=str)
def test_caches_after_tree_rounds_equal_a_recomputation(widths, temperature):
    target, draft = toy_pair(2, n_vocab=4, zero_fraction=0.3)
    for n_tokens in range(1, 11):
        rng = np.random.default_rng(n_tokens)
        assert_caches_match_recomputation(target, draft, [3, 1], n_tokens, 4, tree=widths,
                                          temperature=temperature, rng=rng)


@pytest.mark.parametrize("widths", [(2, 2), (1, 3, 1)], ids=str)
def test_caches_match_when_end_of_text_stops_inside_an_accepted_path(widths):
    target, draft = eot_in_second_draft_pair()  # greedy path 0 -> 1 -> 2 (eot): both accepted drafts
    result = speculative_generate(target, draft, [0], 10, tree=widths, trace=True)
    assert result.tokens == [1, 2] and result.provenance == ["draft", "draft"] and len(result.trace) == 1
    assert_caches_match_recomputation(target, draft, [0], 10, 4, tree=widths, temperature=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gpt2_caches_after_tree_rounds_equal_a_recomputation(fixture_pair, temperature):  # noqa: F811
    target, draft = fixture_pair
    assert_caches_match_recomputation(target, draft, [464, 3290, 318], 13, 4, atol=2e-5, tree=(3, 2),
                                      temperature=temperature, top_k=50, rng=np.random.default_rng(1))


class RowsSpy:
    """A model that counts its plain and rows calls."""

    def __init__(self, model):
        self.model, self.calls = model, {"forward": 0, "forward_rows": 0}

    def __getattr__(self, name):
        attribute = getattr(self.model, name)
        if name not in self.calls:
            return attribute

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attribute(*args, **kwargs)
        return counted


def test_a_chain_calls_only_the_plain_forward_and_a_tree_one_rows_call_per_round(bundled_pair):
    target, draft = bundled_pair
    prompt = target.tokenizer.encode("ROMEO:\nBut soft")
    chain_target, chain_draft = RowsSpy(target), RowsSpy(draft)
    chain = speculative_generate(chain_target, chain_draft, prompt, 30, K=4)
    assert chain_target.calls == {"forward": chain.stats.rounds, "forward_rows": 0}
    assert chain_draft.calls["forward_rows"] == 0
    tree_target = RowsSpy(target)
    tree = speculative_generate(tree_target, draft, prompt, 30, tree=(3, 2), trace=True)
    chains = sum(not is_branching(r.parents) for r in tree.trace)  # a last round asked for 0 or 1 tokens
    assert tree_target.calls == {"forward": chains, "forward_rows": tree.stats.rounds - chains} and chains <= 2
    assert tree.stats.draft_calls == sum(drafted_depth(r) for r in tree.trace)  # one draft call per level


@hypothesis.settings(deadline=None, max_examples=40)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), widths=st.sampled_from(SHAPES), n_tokens=st.integers(1, 20),
                  replacement=st.booleans())
def test_each_round_records_its_tree_its_path_and_what_was_tried(seed, widths, n_tokens, replacement):
    target, draft = toy_pair(seed, n_vocab=4, zero_fraction=0.3)
    result = speculative_generate(target, ModelTreeDrafter(draft, widths, replacement), [0], n_tokens,
                                  rng=np.random.default_rng(seed), trace=True)
    s = result.stats
    for r in result.trace:
        tokens = (None, *r.drafts)  # node i is drafts[i - 1]
        assert r.K == len(r.drafts) == len(r.parents) - 1 if r.drafts else r.parents in ((), (-1,))
        assert [0, *r.path] == rows.tree_path(r.parents, r.path[-1] if r.path else 0)
        assert r.tokens[:len(r.path)] == [tokens[i] for i in r.path] and len(r.tokens) == len(r.path) + 1
        assert [node for node, ok in r.tried if ok] == list(r.path)
        assert r.decisions == [True] * len(r.path) + [False] * (r.provenance[-1] == "resample")
        assert r.q.shape == r.p.shape == (len(r.parents) or 1, 4) and len(r.overlaps) == len(r.decisions)
        assert r.p_at_drafts == [r.p[r.parents[i], tokens[i]] for i in range(1, len(tokens))]
    assert s.accepted == sum(len(r.path) for r in result.trace) and len(result.tokens) == n_tokens
    assert s.tokens_per_target_call == n_tokens / s.rounds and s.K_counts == count([r.K for r in result.trace])
    tried = [(int(rows.tree_depths(r.parents)[node]), ok) for r in result.trace for node, ok in r.tried]
    assert [sum(c[0] for c in depth) for depth in s.by_rank] == [count([d for d, _ in tried]).get(d, 0)
                                                               for d in range(1, len(s.by_rank) + 1)]
    assert sum(c[1] for depth in s.by_rank for c in depth) == s.accepted
    assert s.predicted_speedup is None or all(len(set(r.parents[1:])) == len(r.parents[1:]) for r in result.trace)


def count(items):
    return {x: items.count(x) for x in sorted(set(items))}


def test_a_chain_round_records_its_chain():
    target, draft = toy_pair(3, n_vocab=4)
    r = speculative_generate(target, target, [0], 5, K=3, trace=True).trace[0]  # same model: all accepted
    assert (r.parents, r.path, r.tried) == ((-1, 0, 1, 2), (1, 2, 3), ((1, True), (2, True), (3, True)))


def test_the_draft_cache_after_a_round_holds_the_context_and_the_fed_accepted_nodes():
    """A (2, 2) tree at temperature 0 from the target itself: the root's best child and its best
    child are accepted; the draft fed level 1 only (the leaves never), so it holds context + 1."""
    target, _ = toy_pair(3, n_vocab=4)
    drafter = ModelTreeDrafter(target, (2, 2))
    result = speculative_generate(target, drafter, [0, 1], 3, trace=True)
    assert result.trace[0].path[0] == 1 and len(result.trace[0].path) == 2
    assert drafter.timed.cache.tokens == [0, 1] + result.tokens[:1]


# ---- prompt lookup's trie, the toy model's rows, bad input ---------------------------------------

def test_prompt_lookup_proposes_the_most_recent_matches_of_the_longest_suffix_first():
    d = NgramTreeDrafter(n_max=2, candidates=3, depth=2)
    d.reset(target=None)
    tree = d.propose([1, 2, 7, 1, 2, 8, 3, 2, 9, 1, 2], 5, {}, None)
    # "1 2" was followed by 8 3 and 7 1 (newest first); then "2" adds 9 1 (its 8 3, 7 1 are repeats)
    assert tree.tokens == (2, 8, 3, 7, 1, 9, 1) and tree.parents == (-1, 0, 1, 0, 3, 0, 5)
    d.reset(target=None)
    assert d.propose([4, 5, 6], 3, {}, None).tokens == (6,)  # nothing seen before: no drafts


def test_toy_forward_rows_gives_each_row_its_paths_distribution():
    target, _ = toy_pair(1, n_vocab=4)
    parents = rows.trunk_and_tree(rows.widths_parents((2, 2)), 2)
    ids = [3, 1, 0, 2, 1, 3, 0, 2]
    cache = target.new_cache()
    got = target.forward_rows(ids, rows.tree_positions(parents, 0), rows.tree_scope(parents), cache)
    for node in range(len(ids)):
        path = [ids[i] for i in rows.tree_path(parents, node)]
        np.testing.assert_array_equal(got[node], target.forward(path, target.new_cache(), 1)[0])
    cache.keep_rows(0, [0, 1, 3, 6])
    assert cache.tokens == [3, 1, 2, 0]
    with pytest.raises(ValueError, match="position 5 is not its context's length - 1"):
        target.forward_rows([1], [5], [[True]], cache)


def bad(**kwargs):
    target, draft = toy_pair(0, n_vocab=3)
    return speculative_generate(target, kwargs.pop("draft", draft), [0], 4, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tree=(3, 2), K=3), r"a tree fixes each round's drafts .*: leave K at its default, got K=3"),
    (dict(tree=(3, 2), K="auto"), "leave K at its default"),
    (dict(tree=(0,)), r"tree widths must be a non-empty tuple of integers >= 1 .* got \(0,\)"),
    (dict(tree=3), "tree widths must be a non-empty tuple"),
    (dict(tree="3,2"), "tree widths must be a non-empty tuple"),
    (dict(tree=()), "tree widths must be a non-empty tuple"),
    (dict(tree=(2,), draft=CountingNgramDrafter()), "tree= grows a tree from a draft model or prompt lookup, not"),
    (dict(draft=ModelTreeDrafter(ToyModel(np.eye(3)), (2,)), K=2), "leave K at its default"),
])
def test_bad_tree_requests_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        bad(**kwargs)
    assert "\n" not in str(error.value)


def test_a_stream_of_tree_rounds_adds_up_to_the_result():
    target, draft = toy_pair(0, n_vocab=4)
    stream = speculative_stream(target, draft, [0], 12, tree=(2, 2), rng=np.random.default_rng(0))
    events = list(stream)
    assert [t for e in events for t in e.tokens] == stream.result.tokens and events[-1].n_emitted == 12


# ---- the end of the context: a tree shrinks to the rows the caches have room for -----------------

def test_trees_shrink_to_the_room_left_and_stay_exact():
    """prompt + N = n_ctx = 4: a (2, 2) tree (6 nodes) after a 1-token prompt has room for 3 rows."""
    target, draft = toy_pair(**DENSE)
    target.n_ctx = draft.n_ctx = 4
    want = target_distribution(target, [0], 3)
    got = tree_law(target, draft, [0], 3, (2, 2), False)
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)
    result = speculative_generate(target, draft, [0], 3, tree=(2, 2), trace=True)
    assert len(result.trace[0].drafts) == 3  # 4 - len(context): the first level, then one grandchild


def test_trees_near_the_end_of_the_bundled_models_context_give_the_greedy_tokens(bundled_pair):
    target, draft = bundled_pair
    prompt = target.tokenizer.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    n_tokens = target.n_ctx - len(prompt)  # the last round's tree would need more rows than are left
    result = speculative_generate(target, draft, prompt, n_tokens, tree=(3, 2, 1))
    assert result.tokens == generate(target, prompt, n_tokens, temperature=0)
    lookup = speculative_generate(target, NgramDrafter(), prompt, n_tokens, tree=(4, 2, 2))
    assert lookup.tokens == result.tokens


# ---- main.py --tree -----------------------------------------------------------------------------

def run_main(*args):
    import subprocess
    import sys

    from conftest import REPO
    return subprocess.run([sys.executable, "main.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_main_drafts_trees_and_prints_tokens_per_target_call():
    out = run_main("--tree", "3,2", "--n_tokens_to_generate", "40", "-v")
    assert out.returncode == 0, out.stderr
    sections = out.stdout.split("=== ")
    plain, speculative = (s.split("\n", 1)[1].split("\ntime:")[0] for s in sections[1:3])
    import re
    unmarked = re.sub(r"\[(?:accepted|resampled|bonus): (.*?)\]", r"\1",
                      re.sub(r"\[rejected: (.*?)\]", "", speculative, flags=re.S), flags=re.S)
    assert "tree 3,2" in sections[2] and unmarked.split("\nlegend")[0] == plain  # greedy: the same text
    assert re.search(r"tokens per target call\s+\d+\.\d+", out.stdout) and "tree (3, 2)" in out.stdout
    lookup = run_main("--draft_model_size", "ngram", "--target_model_size", "shakespeare-2.6M", "--tree", "2,1",
                      "--n_tokens_to_generate", "30")
    assert lookup.returncode == 0 and "ngram trie" in lookup.stdout, lookup.stderr


@pytest.mark.parametrize("args, message", [
    (["--tree", "3,x"], "argument --tree: invalid tree '3,x': children per depth, comma-separated integers >= 1"),
    (["--tree", "3,0"], "invalid tree '3,0'"),
    (["--tree", ""], "invalid tree ''"),
    (["--tree", "3,2", "--K", "4"], "--tree fixes each round's drafts: leave --K out"),
    (["--tree", "3,2", "-g", "4"], "--tree fixes each round's drafts: leave -g out"),
    (["--tree", "2", "--target_model_size", "shakespeare-2.6M"], "--tree needs a drafter: add --draft_model_size"),
])
def test_bad_tree_flags_are_one_line_and_exit_status_2(args, message):
    out = run_main(*args)
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr


def test_the_tree_sweep_measures_every_shape_against_the_best_chain():
    from gpt2np.teach.explain import tree_sweep, tree_sweep_lines
    target, draft = toy_pair(0, n_vocab=4)
    rows_ = tree_sweep(target, draft, [0], 12, [2, 3, (2, 1)], temperature=0.0, repeats=1)
    assert [r["shape"] for r in rows_] == [2, 3, (2, 1)]
    assert all(1 <= r["tokens_per_target_call"] <= 4 and r["tokens_per_second"] > 0 for r in rows_)
    assert rows_[2]["drafted_per_round"] > rows_[0]["drafted_per_round"]  # 4 nodes against 2 drafts
    table = tree_sweep_lines(rows_)
    assert "chain K=3" in table and "tree 2,1" in table and "1.00x" in table
