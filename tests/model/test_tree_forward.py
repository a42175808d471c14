"""Token trees in one forward pass (issue 28, item 2): rows with explicit positions and scope (rows.py).

Each node's logits from one GPT2.forward_rows call over the whole tree must equal a plain forward of
its own path (prefix + root..node), on the bundled target and a small random model; forward_rows
must equal its slow reference (reference.gpt2_rows_reference) for any scope, and the chain (the
special case) must give GPT2.forward's numbers bit for bit. After KVCache.keep_rows keeps the
accepted path, decoding goes on exactly as from the path fed plainly.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2np
from conftest import random_params
from gpt2np.model import rows
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.model.reference import gpt2_rows_reference

SMALL = GPT2Config(n_vocab=37, n_ctx=40, n_embd=12, n_head=3, n_layer=2)
SHAPES = [(2,), (3,), (2, 2), (3, 1), (1, 1, 1), (4, 2, 1)]  # widths per depth
# A node's logits from the tree pass against a plain pass over its path: the same arithmetic, but
# products of other shapes (more rows) round differently in float32. Measured max |difference| over
# SHAPES (tree pass, and decoding after keep_rows): random small model 4.8e-7 to 1.5e-6; bundled
# shakespeare-2.6M 2.6e-6 to 8.1e-6 (logits up to ~5), where the plain chain itself, fed one token at
# a time against one call, already differs by up to 1.1e-5 (20 random 12-token inputs).
PATH_ATOL = {"random small": 1e-5, "bundled shakespeare-2.6M": 3e-5}


@pytest.fixture(scope="module")
def small_model():
    return GPT2(SMALL, random_params(SMALL, seed=0))


@pytest.fixture(scope="module")
def bundled_target():
    return gpt2np.load_model("shakespeare-2.6M")


def random_tree(rng, widths, n_vocab):  # -> parents [n], tokens [n]
    parents = rows.widths_parents(widths)
    return parents, rng.integers(0, n_vocab, len(parents))


def tree_logits(model, prefix, parents, tokens):  # -> [n, n_vocab], and the cache after the pass
    cache = model.new_cache()
    model.forward(prefix, cache, n_logits=1)
    logits = model.forward_rows(tokens, rows.tree_positions(parents, len(prefix)), rows.tree_scope(parents), cache)
    return logits, cache


def path_logits(model, prefix, parents, tokens, node):  # -> [n_vocab]: a plain forward of prefix + root..node
    path = list(prefix) + [int(tokens[i]) for i in rows.tree_path(parents, node)]
    return model.forward(path, model.new_cache(), n_logits=1)[0]


@pytest.mark.parametrize("widths", SHAPES, ids=str)
@pytest.mark.parametrize("which", ["random small", "bundled shakespeare-2.6M"])
def test_each_node_equals_a_plain_forward_of_its_path(small_model, bundled_target, which, widths):
    model = small_model if which == "random small" else bundled_target
    rng = np.random.default_rng(len(widths) * 10 + sum(widths))
    prefix = rng.integers(0, model.n_vocab, 7).tolist()
    parents, tokens = random_tree(rng, widths, model.n_vocab)
    logits, cache = tree_logits(model, prefix, parents, tokens)
    assert logits.shape == (len(parents), model.n_vocab) and logits.dtype == np.float32
    assert len(cache) == len(prefix) + len(parents)
    want = np.stack([path_logits(model, prefix, parents, tokens, node) for node in range(len(parents))])
    diff = float(np.abs(logits - want).max())
    print(f"{which} {widths}: max |tree node - plain path| = {diff:.2e}")
    assert diff <= PATH_ATOL[which], f"{which} {widths}: max |tree node - plain path| = {diff:.2e} > {PATH_ATOL[which]}"


def test_positions_or_scope_of_a_chain_would_miss_by_far(bundled_target):
    """The negative control: the tree with the chain's consecutive positions, or with the chain's
    scope (a node sees its earlier siblings), is far from the plain paths (measured: 1.3 and 5.5)."""
    prefix, parents = [10, 20, 30], rows.widths_parents((2, 2))
    tokens = np.arange(40, 47)
    want = np.stack([path_logits(bundled_target, prefix, parents, tokens, node) for node in range(7)])
    for positions, scope in [(np.arange(3, 10), rows.tree_scope(parents)),
                             (rows.tree_positions(parents, 3), rows.chain_scope(7))]:
        cache = bundled_target.new_cache()
        bundled_target.forward(prefix, cache)
        diff = np.abs(bundled_target.forward_rows(tokens, positions, scope, cache) - want).max()
        assert diff > 0.5, f"a wrong layout came within {diff:.2e} of the paths: the test could not fail"


@st.composite
def rows_call(draw):
    """A prefix and new rows with random (valid) scope and positions: trees, chains, packed blocks."""
    n_past = draw(st.integers(0, 6))
    n_seq = draw(st.integers(1, 8))
    scope = np.array(draw(st.lists(st.lists(st.booleans(), min_size=n_seq, max_size=n_seq),
                                   min_size=n_seq, max_size=n_seq)), dtype=bool).reshape(n_seq, n_seq)
    np.fill_diagonal(scope, True)
    positions = draw(st.lists(st.integers(0, SMALL.n_ctx - 1), min_size=n_seq, max_size=n_seq))
    ids = draw(st.lists(st.integers(0, SMALL.n_vocab - 1), min_size=n_past + n_seq, max_size=n_past + n_seq))
    return ids[:n_past], ids[n_past:], positions, scope


@settings(deadline=None, max_examples=60)
@given(call=rows_call())
def test_forward_rows_equals_its_slow_reference_for_any_scope(small_model, call):
    prefix, ids, positions, scope = call
    cache = small_model.new_cache()
    if prefix:
        small_model.forward(prefix, cache, n_logits=1)
    fast = small_model.forward_rows(ids, positions, scope, cache)
    slow = gpt2_rows_reference(prefix, ids, positions, scope, small_model.params, SMALL)
    # measured max diff 4e-7 (float32 fast path against float32 reference, other summation order)
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-5)


@settings(deadline=None, max_examples=40)
@given(n_past=st.integers(0, 10), n_seq=st.integers(1, 10), n_logits=st.integers(1, 10), seed=st.integers(0, 99))
def test_the_chain_is_the_special_case_bit_for_bit(small_model, n_past, n_seq, n_logits, seed):
    n_logits = min(n_logits, n_seq)
    ids = np.random.default_rng(seed).integers(0, SMALL.n_vocab, n_past + n_seq)
    plain, by_rows = small_model.new_cache(), small_model.new_cache()
    for cache in (plain, by_rows):
        if n_past:
            small_model.forward(ids[:n_past], cache)
    want = small_model.forward(ids[n_past:], plain, n_logits=n_logits)
    got = small_model.forward_rows(ids[n_past:], np.arange(n_past, n_past + n_seq), rows.chain_scope(n_seq),
                                   by_rows, n_logits=n_logits)
    np.testing.assert_array_equal(got, want)  # same products, same mask values: the same bits
    np.testing.assert_array_equal(by_rows.k[:, :, :n_past + n_seq], plain.k[:, :, :n_past + n_seq])


def test_sequences_packed_over_one_shared_prefix_each_get_their_own_logits(small_model):
    """Two continuations of one prefix packed in one call (block-diagonal scope, each at its own
    positions): each equals its own plain forward. The batching issue packs the same way."""
    prefix, a, b = [5, 6, 7], [1, 2, 3], [4, 8]
    cache = small_model.new_cache()
    small_model.forward(prefix, cache)
    positions = [3, 4, 5, 3, 4]
    got = small_model.forward_rows(a + b, positions, rows.packed_scope([rows.chain_scope(3), rows.chain_scope(2)]),
                                   cache)
    for block, tokens in ((got[:3], a), (got[3:], b)):
        want = small_model.forward(prefix + tokens, small_model.new_cache(), n_logits=len(tokens))
        np.testing.assert_allclose(block, want, rtol=0, atol=PATH_ATOL["random small"])


@pytest.mark.parametrize("widths", SHAPES, ids=str)
@pytest.mark.parametrize("which", ["random small", "bundled shakespeare-2.6M"])
def test_after_keep_rows_decoding_equals_decoding_from_the_path_fed_plainly(small_model, bundled_target,
                                                                            which, widths):
    model = small_model if which == "random small" else bundled_target
    rng = np.random.default_rng(sum(widths))
    prefix = rng.integers(0, model.n_vocab, 5).tolist()
    parents, tokens = random_tree(rng, widths, model.n_vocab)
    _, cache = tree_logits(model, prefix, parents, tokens)
    path = rows.tree_path(parents, len(parents) - 1)  # the last node: the deepest, rightmost branch
    cache.keep_rows(len(prefix), path)
    sequence = prefix + [int(tokens[i]) for i in path]
    assert len(cache) == len(sequence)
    later = rng.integers(0, model.n_vocab, 4).tolist()  # decoding goes on: one token, then three
    got = np.concatenate([model.forward(later[:1], cache), model.forward(later[1:], cache, n_logits=3)])
    want = model.forward(sequence + later, model.new_cache(), n_logits=4)
    diff = float(np.abs(got - want).max())
    print(f"{which} {widths}: max |after keep_rows - plain| = {diff:.2e}")
    assert diff <= PATH_ATOL[which], f"{which} {widths}: after keep_rows, max diff {diff:.2e} > {PATH_ATOL[which]}"


@pytest.mark.parametrize("widths", [(2, 2), (3, 1), (2, 2, 2)], ids=str)
@pytest.mark.parametrize("which", ["random small", "bundled shakespeare-2.6M"])
def test_a_tree_grown_one_level_per_call_equals_its_paths(small_model, bundled_target, which, widths):
    """How a draft model drafts a tree: one call per level, its earlier levels already cached and
    seen only along each node's own path (n_shared: the context; scope: tree_scope_for)."""
    model = small_model if which == "random small" else bundled_target
    rng = np.random.default_rng(len(widths))
    context = rng.integers(0, model.n_vocab, 6).tolist()      # context[-1] is the root
    parents, tokens = random_tree(rng, widths, model.n_vocab)
    tokens[0] = context[-1]
    cache, depths, cached, worst = model.new_cache(), rows.tree_depths(parents), [], 0.0
    model.forward(context, cache)
    for depth in range(1, len(widths) + 1):
        level = np.flatnonzero(depths == depth).tolist()
        logits = model.forward_rows(tokens[level], len(context) - 1 + depths[level],
                                    rows.tree_scope_for(parents, cached, level), cache, n_shared=len(context))
        for node, row in zip(level, logits):
            worst = max(worst, float(np.abs(row - path_logits(model, context[:-1], parents, tokens, node)).max()))
        cached += level
    print(f"{which} {widths}: max |level by level - plain path| = {worst:.2e}")
    assert worst <= PATH_ATOL[which], f"{which} {widths}: {worst:.2e} > {PATH_ATOL[which]}"
    path = rows.tree_path(parents, len(parents) - 1)
    cache.keep_rows(len(context), [cached.index(node) for node in path[1:]])  # cache row of each path node
    want = model.forward(context + [int(tokens[i]) for i in path[1:]] + [1], model.new_cache())
    diff = float(np.abs(model.forward([1], cache) - want).max())
    assert diff <= PATH_ATOL[which], f"{which} {widths}: after keep_rows {diff:.2e}"


def test_keep_rows_moves_exactly_the_rows_asked_for(small_model):
    cache = small_model.new_cache()
    small_model.forward(list(range(9)), cache, n_logits=1)
    before = cache.copy()
    cache.keep_rows(3, [1, 4, 5])
    assert len(cache) == 6
    np.testing.assert_array_equal(cache.k[:, :, :3], before.k[:, :, :3])
    np.testing.assert_array_equal(cache.k[:, :, 3:6], before.k[:, :, [4, 7, 8]])
    np.testing.assert_array_equal(cache.v[:, :, 3:6], before.v[:, :, [4, 7, 8]])
    cache.keep_rows(4, [])
    assert len(cache) == 4  # keep nothing: truncate


@pytest.mark.parametrize("n_past, kept, message", [
    (10, [0], "n_past <= 9"), (-1, [0], "n_past"), (2.0, [0], "n_past"),
    (3, [6], r"rows in \[0, 6\)"), (3, [1, 1], "distinct"), (3, [0.5], "rows"), (3, [[0]], "rows"),
])
def test_keep_rows_refuses_bad_arguments(small_model, n_past, kept, message):
    cache = small_model.new_cache()
    small_model.forward(list(range(9)), cache)
    with pytest.raises(ValueError, match=message):
        cache.keep_rows(n_past, kept)
    assert len(cache) == 9


@pytest.mark.parametrize("change, message", [
    (dict(scope=np.ones((2, 2), bool)), r"scope must be a bool array .* = \[3, 3\], got bool \(2, 2\)"),
    (dict(scope=np.zeros((3, 3), bool)), "every row must see itself"),
    (dict(scope=np.eye(3)), "bool array"),
    (dict(positions=[0, 1]), "one integer position per row"),
    (dict(positions=[0.0, 1.0, 1.0]), "one integer position per row"),
    (dict(positions=[0, 1, 40]), r"positions must be in \[0, 40\), got 0..40"),
    (dict(ids=[0, 1, 37]), r"token ids must be in \[0, 37\)"),
    (dict(n_logits=4), "n_logits"),
    (dict(n_shared=3), r"n_shared must be an integer in \[0, 2\]"),
    (dict(n_shared=0), r"\[3, 5\], got bool \(3, 3\)"),   # 2 cached rows not shared: 2 more columns
])
def test_forward_rows_refuses_bad_input_in_one_line(small_model, change, message):
    call = dict(ids=[0, 1, 2], positions=[2, 3, 3], scope=rows.tree_scope([-1, 0, 0]), n_logits=None, n_shared=None)
    call.update(change)
    cache = small_model.new_cache()
    small_model.forward([5, 6], cache)
    with pytest.raises(ValueError, match=message):
        small_model.forward_rows(call["ids"], call["positions"], call["scope"], cache, n_logits=call["n_logits"],
                                 n_shared=call["n_shared"])
    assert len(cache) == 2  # refused before anything was written


def test_forward_rows_refuses_rows_past_the_context(small_model):
    cache = small_model.new_cache()
    small_model.forward([i % 37 for i in range(38)], cache)
    with pytest.raises(ValueError, match="38 cached \\+ 3 new rows exceed the context of 40"):
        small_model.forward_rows([0, 1, 2], [38, 39, 39], rows.tree_scope([-1, 0, 0]), cache)


@settings(deadline=None, max_examples=50)
@given(parents=st.lists(st.integers(0, 10**6), max_size=12).map(
    lambda draws: [-1] + [d % (i + 1) for i, d in enumerate(draws)]))
def test_tree_scope_and_positions_follow_the_parents(parents):
    scope, depths = rows.tree_scope(parents), rows.tree_depths(parents)
    for node in range(len(parents)):
        path = rows.tree_path(parents, node)
        assert scope[node].nonzero()[0].tolist() == sorted(path)  # exactly its ancestors and itself
        assert depths[node] == len(path) - 1
        assert path[0] == 0 and all(parents[b] == a for a, b in zip(path, path[1:]))


@pytest.mark.parametrize("parents, message", [
    ([0, 0], "root"), ([-1, 1], "node 1 has parent 1"), ([-1, 0, -1], "node 2 has parent -1"),
    ([], "non-empty"), ([-1.0, 0.0], "ints"),
])
def test_a_malformed_tree_is_refused_in_one_line(parents, message):
    with pytest.raises(ValueError, match=message):
        rows.tree_scope(parents)


def test_trunk_and_tree_is_one_tree_whose_logits_are_its_paths(small_model):
    """The first round feeds the prompt and the tree in one call: a trunk, then branches."""
    prompt, parents, branch_tokens = [3, 9, 4], [-1, 0, 0, 1], [11, 12, 13]
    full = rows.trunk_and_tree(parents, n_trunk=len(prompt))
    logits = small_model.forward_rows(prompt + branch_tokens, rows.tree_positions(full, 0), rows.tree_scope(full),
                                      small_model.new_cache(), n_logits=len(parents))
    for node, row in enumerate(logits):
        tokens = prompt + branch_tokens
        path = [tokens[i] for i in rows.tree_path(full, node + len(prompt) - 1)]
        want = small_model.forward(path, small_model.new_cache())[0]
        np.testing.assert_allclose(row, want, rtol=0, atol=PATH_ATOL["random small"])
