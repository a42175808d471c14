"""Which tree (issue 28, item 5): tree_shape's prediction and tree="auto" (tree_policy.AutoTree).

The prediction is checked against the chain's formula (a chain is a tree) and against the real tree
kernel: with the same p and q at every node, acceptance by depth and rank is a constant (one node's
exact law gives it), and expected_tokens at those rates must give whole trees' tokens per round. tree="auto"
is checked as every K policy is: exact by enumeration under a scripted clock (its shapes really
vary there), the target's greedy tokens on real models, one-line errors.
"""
import numpy as np
import pytest

import gpt2np
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.drafters import ModelDrafter, NgramDrafter
from gpt2np.decoding.run_stats import is_branching
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.decoding.theory import expected_tokens_per_round, predicted_speedup
from gpt2np.decoding.tree_drafts import draft_tree
from gpt2np.decoding.tree_kernel import verify_tree
from gpt2np.decoding.tree_policy import AutoTree
from gpt2np.decoding.tree_shape import best_shape, candidate_shapes, expected_tokens, tree_size, tree_speedup
from gpt2np.teach.exact import exact_distribution, max_abs_difference
from test_drafters_policies import scripted_clock  # noqa: F401  (a pytest fixture)
from test_speculative_exact import EXACT, target_distribution, toy_pair

FLAT_V = {M: 1.0 + 0.02 * (M - 1) for M in range(1, 17)}    # rows nearly free (SkylakeX-like, flatter)
STEEP_V = {M: 1.0 + 1.5 * (M - 1) for M in range(1, 17)}    # every row costs more than a token is worth


# ---- the prediction -----------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("K", [1, 3, 6])
def test_a_chain_is_predicted_as_the_chain_formula_predicts_it(alpha, K):
    rates = [[alpha]] * K
    assert expected_tokens((1,) * K, rates) == pytest.approx(expected_tokens_per_round(alpha, K), rel=1e-12)
    v = {K + 1: 1.7}
    assert tree_speedup((1,) * K, rates, 0.1, v) == pytest.approx(predicted_speedup(alpha, K, 0.1, 1.7), rel=1e-12)


P, Q = np.array([0.45, 0.3, 0.15, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])  # the same at every node


def constant_tree_round(widths, replacement, rng):  # -> (DraftTree, TreeRoundResult): P and Q at every node
    tree = draft_tree([0], widths, lambda tokens, parents, nodes: np.tile(Q, (len(nodes), 1)), rng, replacement)
    return tree, verify_tree(tree, np.tile(P, (len(tree.tokens), 1)), rng)


def exact_rank_rates(width, replacement):  # -> [a_0, ..., a_{width-1}]: one node's children, enumerated
    """P(the child of rank r passes | it is tried), from the exact law of which child of one node passes."""
    def passing_rank(rng):
        _, result = constant_tree_round((width,), replacement, rng)
        return len(result.tried) - 1 if result.path else -1  # -1: every child rejected
    law = exact_distribution(passing_rank)
    tried, rates = 1.0, []
    for r in range(width):
        rates.append(law.get(r, 0.0) / tried)
        tried -= law.get(r, 0.0)
    return rates


@pytest.mark.parametrize("widths, replacement", [((2, 1), False), ((3, 2), False), ((2, 2, 1), True), ((1, 1, 1), False)],
                         ids=str)
def test_expected_tokens_at_the_exact_rates_is_the_kernels_tokens_per_round(widths, replacement):
    """The prediction's one assumption, that a reached node's children pass with rates that depend
    on depth and rank only, holds in the kernel: rates from one node's exact law, tokens per round
    of whole trees measured (Monte Carlo). A control: rank 0's rate for every rank misses."""
    rates = [exact_rank_rates(max(widths), replacement)] * len(widths)
    rng = np.random.default_rng(sum(widths))
    tokens = np.array([len(constant_tree_round(widths, replacement, rng)[1].tokens) for _ in range(6000)])
    predicted, limit = expected_tokens(widths, rates), 4 * tokens.std() / np.sqrt(len(tokens))
    assert abs(predicted - tokens.mean()) <= limit, (predicted, tokens.mean(), limit)  # 4 s.e.: false alarm ~6e-5
    if max(widths) > 1:
        rank_0_only = expected_tokens(widths, [[rates[0][0]] * max(widths)] * len(widths))
        assert abs(rank_0_only - tokens.mean()) > limit, (rank_0_only, tokens.mean(), limit)


def test_candidate_shapes_respect_their_bounds_and_start_with_the_chains():
    shapes = candidate_shapes(8, 4, 15)
    assert shapes[:8] == [(1,) * k for k in range(1, 9)]
    assert all(len(w) <= 8 and max(w) <= 4 and tree_size(w) <= 15 for w in shapes)
    assert {(2, 1), (3, 2, 1), (4, 2), (2, 2, 2)} <= set(shapes) and (4, 4) not in shapes  # 4 + 16 nodes
    assert len(shapes) == len(set(shapes))


def test_the_best_shape_is_a_chain_when_second_children_never_pass_and_a_tree_when_they_do():
    shapes = candidate_shapes(8, 4, 15)
    no_siblings = [[0.7, 0.0, 0.0, 0.0]] * 8
    shape, _ = best_shape(no_siblings, 0.05, FLAT_V, shapes)
    assert max(shape) == 1 and len(shape) >= 4, shape
    siblings = [[0.4, 0.6, 0.5, 0.3]] * 8  # the draft's first choice is often wrong, its next ones not
    shape, speedup = best_shape(siblings, 0.05, FLAT_V, shapes)
    chain, chain_speedup = best_shape(siblings, 0.05, FLAT_V, shapes[:8])
    assert max(shape) > 1 and speedup > 1.2 * chain_speedup, (shape, speedup, chain, chain_speedup)
    _, speedup = best_shape(siblings, 0.05, STEEP_V, shapes)
    assert speedup < 1, speedup  # nothing pays: AutoTree plays plain rounds


# ---- tree="auto" ---------------------------------------------------------------------------------

def auto_tree_run(target, draft, prompt, n_tokens, rng, **options):
    return speculative_generate(target, ModelDrafter(draft, c_prior=0.05), prompt, n_tokens, rng=rng, tree="auto",
                                K_max=2, trace=True, **options)


@pytest.mark.parametrize("options", [{}, dict(temperature=0.6, top_k=2)], ids=str)
def test_auto_tree_samples_exactly_the_target_under_a_scripted_clock(scripted_clock, options):
    target, draft = toy_pair(seed=1, n_vocab=3)
    want = target_distribution(target, [0], 4, **options)

    def run(rng):
        scripted_clock()
        return tuple(auto_tree_run(target, draft, [0], 4, rng, **options).tokens)
    got = exact_distribution(run)
    assert max_abs_difference(got, want) <= EXACT, max_abs_difference(got, want)


def test_auto_tree_really_varies_its_shape_under_the_scripted_clock(scripted_clock):
    """Otherwise the enumeration above would prove one fixed shape again."""
    target, draft = toy_pair(seed=1, n_vocab=3)
    shapes = set()
    for seed in range(30):
        scripted_clock()
        result = auto_tree_run(target, draft, [0], 4, np.random.default_rng(seed))
        shapes |= {e.parents for e in result.trace}
    drafted = {s for s in shapes if len(s) > 1}
    assert len(drafted) >= 3 and any(is_branching(s) for s in drafted), shapes
    assert (-1,) in shapes, shapes  # and a plain round (the one that times a one-token call)


def test_auto_tree_gives_the_target_greedy_tokens_on_the_bundled_pair():
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    prompt = target.tokenizer.encode("ROMEO:\nBut soft, what light")
    result = speculative_generate(target, draft, prompt, 120, tree="auto")
    assert result.tokens == generate(target, prompt, 120, temperature=0)
    assert result.stats.drafted > 0, result.stats  # it drafted (how much depends on this machine's timings)


def test_auto_tree_plans_with_the_run_s_own_counts():
    policy = AutoTree(K_max=3)
    policy.t = 1
    fresh = policy.rates()
    for _ in range(50):  # rank 0 at depth 1 tried 50 times, never accepted
        policy.update(type("Round", (), dict(tried=((1, False),), parents=(-1, 0), drafts=[], propose_seconds=0,
                                             seconds=0.0)))
    planned, hopeful = policy.rates(), policy.hopeful_rates()
    assert planned[0][0] < 0.1 < fresh[0][0], (planned[0][0], fresh[0][0])
    assert planned[1][0] < fresh[1][0]  # other depths learn from the pooled rank
    assert all(h >= p for row_h, row_p in zip(hopeful, planned) for h, p in zip(row_h, row_p))  # optimism


@pytest.mark.parametrize("seed", range(5))
def test_best_shape_is_the_largest_tree_speedup_of_the_shapes(seed):
    """best_shape's table of pass chances gives what tree_speedup gives shape by shape."""
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0, 1, (8, 4)).tolist()
    v = {M: 1 + rng.uniform(0, 0.1) * (M - 1) for M in range(1, 17)}
    shapes = candidate_shapes(8, 4, 15)
    shape, speedup = best_shape(rates, 0.1, v, shapes, o=0.2, plain=1.1)
    slow = {w: tree_speedup(w, rates, 0.1, v, 0.2, 1.1) for w in shapes}
    assert speedup == pytest.approx(max(slow.values()), rel=1e-12) and slow[shape] == pytest.approx(speedup)


@pytest.mark.parametrize("kwargs, message", [
    (dict(draft=NgramDrafter(), tree="auto"), "tree='auto' picks the shapes a draft model grows"),
    (dict(tree="auto", K=3), "tree='auto' picks each round's tree: leave K at its default"),
])
def test_bad_auto_tree_requests_are_one_line_errors(kwargs, message):
    target, draft = toy_pair(seed=1, n_vocab=3)
    draft = kwargs.pop("draft", draft)
    with pytest.raises(ValueError, match=message) as error:
        speculative_generate(target, draft, [0], 3, **kwargs)
    assert "\n" not in str(error.value)


def test_main_chooses_the_tree_each_round_with_tree_auto():
    from test_tree_loop import run_main
    out = run_main("--tree", "auto", "--n_tokens_to_generate", "40")
    assert out.returncode == 0, out.stderr
    plain, speculative = (s.split("\n", 1)[1].split("\ntime:")[0] for s in out.stdout.split("=== ")[1:3])
    assert "tree auto" in out.stdout and speculative == plain, out.stdout  # greedy: the target's text
    bad = run_main("--tree", "automatic")
    assert bad.returncode == 2 and "invalid tree 'automatic'" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
