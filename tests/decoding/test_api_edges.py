"""The public API at its edges: arguments that used to crash deep inside, or be taken silently.

Each test is one reported defect: tree="auto" pricing chains past its cost table (KeyError: 17) and
never checking K_max; a finished Stream losing its result when iterated again; a drafter shared by
two open runs (a KV-cache ValueError mid-run); batch checks that disagreed with the single-sequence
ones; options taken by position in one order by a stream and another by generate; bools and dicts
and a legacy RandomState taken as options; bare KeyError / AttributeError for a handle or a config.
"""
import copy
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding import tree_policy
from gpt2np.decoding.policies import Measurements
from gpt2np.decoding.tree_policy import AutoTree
from gpt2np.teach.toy_models import random_toy_model


@pytest.fixture(scope="module")
def pair():
    target, draft = gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")
    return target, draft, target.tokenizer.encode("ROMEO:\nWhat light")


def one_line(info):
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    return message


# ---- 1. tree="auto" prices every chain up to K_max ------------------------------------------------

@pytest.mark.parametrize("K_max", [16, 32])
def test_auto_tree_prices_every_chain_up_to_K_max(K_max, monkeypatch):
    """A tree that wins at the mean is checked against every chain of 1..K_max drafts (holds_if_higher):
    the cost table must reach K_max + 1 rows, not only a whole tree's 16 (it asked v[17])."""
    priced = []
    holds = tree_policy.holds_if_higher
    monkeypatch.setattr(tree_policy, "holds_if_higher", lambda *args: priced.append(args[-1]) or holds(*args))
    policy = AutoTree(K_max=K_max)
    policy.t = 1  # the first round is behind it: the next one may branch
    for _ in range(40):  # a first child passes half the time, its sibling always: a tree wins at the mean
        policy.update(SimpleNamespace(tried=((1, False), (2, True)), parents=(-1, 0, 0), drafts=[5, 6],
                                      propose_seconds=0.001, seconds=0.01))
    past = Measurements(c_prior=0.01, overlaps=[0.5] * 40, target_durations={1: [1.0], 2: [1.02], 3: [1.04]})
    assert policy.choose(past) >= 1
    assert priced == [K_max], priced  # the tree was checked against every chain, up to K_max drafts
    assert set(range(1, K_max + 2)) <= set(policy.costs(past)[1])


def test_auto_tree_with_a_long_K_max_gives_the_target_greedy_tokens(pair):
    target, draft, ids = pair
    result = gpt2np.speculative_generate(target, draft, ids, 20, tree="auto", K_max=32)
    assert result.tokens == gpt2np.generate(target, ids, 20)


# ---- 2. tree="auto" checks K_max as K="auto" does --------------------------------------------------

@pytest.mark.parametrize("K_max", [0, -1, 33, 10**12, 2.5, "x", None, True])  # 10^12: a MemoryError, before the bound
def test_auto_tree_refuses_a_bad_K_max_in_one_line(pair, K_max):
    target, draft, ids = pair
    with pytest.raises(ValueError) as info:
        gpt2np.speculative_generate(target, draft, ids, 5, tree="auto", K_max=K_max)
    assert one_line(info) == f"K_max must be an integer from 1 to 32, got {K_max!r}"


@pytest.mark.parametrize("K", ["auto", "heuristic"])
def test_a_K_policy_refuses_a_K_max_past_the_bound_at_once(pair, K):
    """K="auto" with K_max 10^12 hung in AutoK's prior curve, built K by K up to K_max."""
    target, draft, ids = pair
    with pytest.raises(ValueError) as info:
        gpt2np.speculative_generate(target, draft, ids, 5, K=K, K_max=10**12)
    assert one_line(info) == "K_max must be an integer from 1 to 32, got 1000000000000"


# ---- 3. a finished Stream keeps its result ---------------------------------------------------------

def test_a_finished_stream_iterated_again_keeps_its_result(pair):
    target, draft, ids = pair
    stream = gpt2np.speculative_stream(target, draft, ids, 10)
    events = list(stream)
    result = stream.result
    assert result is not None and list(stream) == [] and stream.result is result and stream.run() is result
    assert sum(len(e.tokens) for e in events) == len(stream.tokens) == 10  # nothing counted twice
    plain = gpt2np.plain_stream(target, ids, 5)
    assert plain.run() == plain.run() == gpt2np.generate(target, ids, 5)


# ---- 6. bare KeyError / AttributeError ------------------------------------------------------------

@pytest.mark.parametrize("config", ["124M", "large", None])
def test_random_model_names_the_config_it_wants(config):
    with pytest.raises(ValueError) as info:
        gpt2np.random_model(config)
    message = one_line(info)
    assert message.startswith("config must be a GPT2Config, e.g. gpt2np.PRESETS[") and repr(config) in message
    assert "gpt2np.PRESETS['124M']" in message  # a name of the presets is told which one to pass


@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_a_handle_from_another_batch_reads_nothing_there(kind):
    """Handles counted from 0 in every batch, so batch a's pop_tokens(handle from b) returned a's own sequence's
    tokens (and cancel would have cancelled it): handles are unique in the process now, and a foreign one finds
    nothing, in a one-line error."""
    rng = np.random.default_rng(0)
    model, draft = random_toy_model(rng, n_vocab=4), random_toy_model(rng, n_vocab=4)

    def new_batch():
        return gpt2np.ContinuousBatch(model) if kind == "plain" else gpt2np.ContinuousSpeculativeBatch(model, draft)
    a, b = new_batch(), new_batch()
    mine, theirs = a.add([0], 3), b.add([1], 2)
    for batch in (a, b):
        while batch:
            batch.step()
    assert mine != theirs and theirs not in a and mine not in b and not a.cancel(theirs)
    for read in (a.pop_tokens, a.tokens_of):
        with pytest.raises(ValueError, match=rf"\({theirs}\): no tokens to read") as info:
            read(theirs)
        one_line(info)
    assert len(a.pop_tokens(mine)) == 3 and len(b.pop_tokens(theirs)) == 2


@pytest.mark.parametrize("kind", ["plain", "speculative"])
def test_a_handle_without_tokens_is_a_one_line_error_saying_why(kind):
    rng = np.random.default_rng(0)
    model = random_toy_model(rng, n_vocab=4)
    batch = gpt2np.ContinuousBatch(model) if kind == "plain" else gpt2np.ContinuousSpeculativeBatch(
        model, random_toy_model(rng, n_vocab=4))
    running, cancelled = batch.add([0], 3), batch.add([1], 3)
    batch.cancel(cancelled)
    with pytest.raises(ValueError, match=rf"pop_tokens\({running}\): that sequence is still running") as info:
        batch.pop_tokens(running)
    one_line(info)
    assert batch.tokens_of(running) == []  # a running sequence is read with tokens_of
    for read in (batch.pop_tokens, batch.tokens_of):
        with pytest.raises(ValueError, match=rf"\({cancelled}\): no tokens to read: it was cancelled, or its tokens "
                                             r"were already popped"):
            read(cancelled)
        for unknown in (cancelled + 5, -1, [0], True):
            with pytest.raises(ValueError, match="this batch never gave that handle") as info:
                read(unknown)
            one_line(info)
    while batch:
        batch.step()
    tokens = batch.tokens_of(running)
    assert batch.pop_tokens(running) == tokens and len(tokens) == 3
    with pytest.raises(ValueError, match="already popped"):
        batch.pop_tokens(running)


# ---- 7. batch checks as the single-sequence ones --------------------------------------------------

def test_greedy_sequences_may_share_an_rng_as_generate_accepts_one(pair):
    target, draft, ids = pair
    shared = np.random.default_rng(0)
    greedy = gpt2np.generate(target, ids, 5)
    assert gpt2np.generate_batch(target, [ids, ids], 5, temperature=0, rng=shared) == [greedy, greedy]
    assert gpt2np.speculative_generate_batch(target, draft, [ids, ids], 5, K=2, temperature=0, rng=shared) \
        == [greedy, greedy]
    mixed = gpt2np.generate_batch(target, [ids, ids], 5, temperature=[0, 1.0], rng=shared)  # one sampler: fine
    assert mixed[0] == greedy
    with pytest.raises(ValueError, match="rng: sequences 0 and 1 share one generator"):
        gpt2np.generate_batch(target, [ids, ids], 5, rng=shared)  # two samplers: their draws would interleave
    batch = gpt2np.ContinuousBatch(target)
    batch.add(ids, 3, temperature=0, rng=shared)
    batch.add(ids, 3, temperature=0, rng=shared)
    batch.add(ids, 3, rng=shared)
    with pytest.raises(ValueError, match="a running sequence already draws from this generator"):
        batch.add(ids, 3, rng=shared)


def test_a_batch_checks_K_max_whatever_K_is(pair):
    target, draft, ids = pair
    with pytest.raises(ValueError) as info:
        gpt2np.speculative_generate_batch(target, draft, [ids], 3, K=2, K_max=-5)
    assert one_line(info) == "K_max must be an integer from 1 to 32, got -5"


def test_a_batch_refuses_a_drafter_for_what_it_is(pair):
    target, _, ids = pair
    with pytest.raises(ValueError) as info:
        gpt2np.speculative_generate_batch(target, gpt2np.load_drafter("shakespeare-260K"), [ids], 3)
    message = one_line(info)
    assert "got ModelDrafter: pass its model, draft.model" in message
    assert gpt2np.speculative_generate_batch(target, gpt2np.load_drafter("ngram"), [ids, ids[:5]], 9, K="auto") == \
        [gpt2np.generate(target, p, 9) for p in (ids, ids[:5])], "prompt lookup is batched, K='auto' too"


# ---- 8. loose checks --------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (dict(temperature=True, rng=np.random.default_rng(0)), "temperature must be a finite number >= 0"),
    (dict(top_p=True, rng=np.random.default_rng(0)), r"top_p must be in \(0, 1\]"),
    (dict(rng=np.random.RandomState(0)), r"rng must be a np.random.Generator \(np.random.default_rng\(seed\)\), "
                                         "got RandomState"),
    (dict(temperature=0, rng=np.random.RandomState(0)), "rng must be a np.random.Generator"),
], ids=["temperature-True", "top_p-True", "RandomState", "RandomState-greedy"])
@pytest.mark.parametrize("decoder", ["generate", "speculative_generate", "generate_batch"])
def test_bools_and_a_legacy_random_state_are_refused(pair, options, message, decoder):
    target, draft, ids = pair
    run = {"generate": lambda: gpt2np.generate(target, ids, 3, **options),
           "speculative_generate": lambda: gpt2np.speculative_generate(target, draft, ids, 3, **options),
           "generate_batch": lambda: gpt2np.generate_batch(target, [ids], 3, **options)}[decoder]
    with pytest.raises(ValueError, match=message) as info:
        run()
    one_line(info)


@pytest.mark.parametrize("tree", [{2: 1}, {3, 1}, np.array(2)], ids=["dict", "set", "0-d array"])
def test_a_tree_shape_is_a_sequence(pair, tree):
    target, draft, ids = pair
    with pytest.raises(ValueError, match="tree widths must be a non-empty tuple of integers") as info:
        gpt2np.speculative_generate(target, draft, ids, 3, tree=tree)
    one_line(info)


# ---- 5. one drafter, one run at a time --------------------------------------------------------------

def test_a_drafter_in_use_by_an_open_run_refuses_a_second_one(pair):
    target, _, ids = pair
    greedy = gpt2np.generate(target, ids, 10)
    drafter = gpt2np.load_drafter("shakespeare-260K")
    first, second = (gpt2np.speculative_stream(target, drafter, ids, 10) for _ in range(2))
    next(first)
    with pytest.raises(ValueError) as info:
        next(second)  # opened before the first started: refused as it starts
    assert one_line(info) == ("this drafter is in use by an open run: a drafter serves one run at a time; close() "
                              "it or load another")
    with pytest.raises(ValueError, match="this drafter is in use by an open run"):
        gpt2np.speculative_stream(target, drafter, ids, 10)  # opened while the first runs: refused at once
    assert first.run().tokens == greedy  # the first run is untouched
    assert gpt2np.speculative_generate(target, drafter, ids, 10).tokens == greedy  # it ended: free again
    third = gpt2np.speculative_stream(target, drafter, ids, 10)
    next(third)
    third.close()  # closed: free again
    assert gpt2np.speculative_generate(target, drafter, ids, 10).tokens == greedy


def test_streams_opened_together_and_run_in_turn_share_a_drafter(pair):
    """The console opens every run of a prompt first, then runs them one after the other."""
    target, _, ids = pair
    for drafter in (gpt2np.load_drafter("shakespeare-260K"), gpt2np.load_drafter("ngram")):
        streams = [gpt2np.speculative_stream(target, drafter, ids, 10) for _ in range(2)]
        assert [s.run().tokens for s in streams] == [gpt2np.generate(target, ids, 10)] * 2


def test_copies_of_a_drafter_run_interleaved_as_the_server_runs_them(pair):
    target, _, ids = pair
    drafter = gpt2np.load_drafter("shakespeare-260K")
    streams = [gpt2np.speculative_stream(target, copy.copy(drafter), ids, 10) for _ in range(2)]
    while not all(s.done for s in streams):
        for s in streams:
            next(s, None)
    assert [s.result.tokens for s in streams] == [gpt2np.generate(target, ids, 10)] * 2


# ---- 4. options past n_tokens by name ----------------------------------------------------------------

POSITIONAL = {  # the options each function still takes by position: the sixth is never K_max to one, temperature
    gpt2np.speculative_stream: ("K",), gpt2np.speculative_generate: ("K", "temperature"),  # to the other
    gpt2np.generate: ("temperature",), gpt2np.generate_without_cache: ("temperature",), gpt2np.plain_stream: (),
    gpt2np.batch_stream: (), gpt2np.speculative_batch_stream: (),
}


@pytest.mark.parametrize("function", POSITIONAL, ids=lambda f: f.__name__)
def test_options_past_n_tokens_are_keywords(function):
    params = list(inspect.signature(function).parameters.values())
    after = params[[p.name for p in params].index("n_tokens") + 1:]
    assert tuple(p.name for p in after if p.kind is not p.KEYWORD_ONLY) == POSITIONAL[function]


def test_a_stream_no_longer_reads_temperature_where_generate_reads_it(pair):
    target, draft, ids = pair
    with pytest.raises(TypeError):
        gpt2np.speculative_stream(target, draft, ids, 10, "auto", 2)  # generate's temperature, never K_max here
    with pytest.raises(TypeError):
        gpt2np.plain_stream(target, ids, 5, 0)


# ---- a tree run says so in its statistics ------------------------------------------------------------

def test_the_statistics_say_whether_the_run_drafted_trees(pair):
    """SpeculativeStats.tree: a tree run's K and K_counts count nodes, so a report must know which runs drafted
    trees (report.is_tree_run read it from the drafter's name before): a chain, a model's tree, tree auto and
    prompt lookup's trie."""
    from gpt2np.report import K_usage, is_tree_run
    target, draft, ids = pair
    runs = {"chain": gpt2np.speculative_generate(target, draft, ids, 12, K=3),
            "tree": gpt2np.speculative_generate(target, draft, ids, 12, tree=(3, 2)),
            "auto": gpt2np.speculative_generate(target, draft, ids, 12, tree="auto"),
            "trie": gpt2np.speculative_generate(target, gpt2np.load_drafter("ngram"), ids * 3, 12, tree=(2, 2))}
    assert {name: run.stats.tree for name, run in runs.items()} == {"chain": False, "tree": True, "auto": True,
                                                                   "trie": True}
    assert [is_tree_run(run.stats) for run in runs.values()] == [False, True, True, True]
    assert "fixed K=3" in K_usage(runs["chain"].stats) and "nodes/tree" in K_usage(runs["tree"].stats)


@pytest.mark.parametrize("how", ["closed", "interrupted"])
def test_a_stream_that_cannot_go_on_says_so_instead_of_ending_with_no_result(how):
    """A closed stream's run(), or the next run() after Ctrl-C inside a round, returned None and set done, as if
    the decoder had finished with nothing: now a one-line ValueError, .tokens kept; a finished stream's run()
    still returns its result again."""
    model = gpt2np.load_model("shakespeare-260K")
    ids = model.tokenizer.encode("ROMEO:")
    stream = gpt2np.batch_stream(model, [ids, ids], 5)
    next(stream)
    if how == "closed":
        stream.close()
    else:
        def interrupted():  # the decoder's next round raises, as Ctrl-C inside it would; then it is finished
            raise KeyboardInterrupt
            yield
        stream._rounds = interrupted()
        with pytest.raises(KeyboardInterrupt):
            stream.run()
    for again in (stream.run, lambda: next(stream)):
        with pytest.raises(ValueError) as info:
            again()
        said = "was closed" if how == "closed" else "stopped with KeyboardInterrupt"
        assert one_line(info) == (f"this stream {said} before it finished and cannot go on: start a new one (.tokens "
                                  "holds the 2 tokens it emitted)")
    assert not stream.done and stream.result is None and len(stream.tokens) == 2
    finished = gpt2np.plain_stream(model, ids, 3)
    assert finished.run() == finished.run() and finished.done  # finished: its result again


def test_a_prompt_that_fills_the_context_alone_is_told_to_shorten():
    """"Shorten the prompt or ask for fewer tokens" cannot help when the prompt alone fills the context: it says
    how long the prompt may be."""
    model = gpt2np.load_model("shakespeare-260K")  # context 256
    with pytest.raises(ValueError) as info:
        gpt2np.generate(model, [1] * 300, 5)
    assert one_line(info) == ("prompt (300 tokens) + n_tokens (5) = 305 exceeds the context of 256 tokens; the prompt "
                              "alone fills it: shorten the prompt to at most 255 tokens")
