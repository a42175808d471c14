"""speculative_generate_batch (decoding/batched_speculative.py): every sequence of a batch gets what
speculative_generate gives it alone (greedy: the target's own greedy tokens; sampled: the same draws from
an identically seeded rng), the batch's joint law is the product of the target's laws (exact enumeration,
1e-12), each broken batch variant (teach/broken_batch_kernels.py) is caught, one packed target call per
round, and every bad request is a one-line error naming the sequence before any work.
"""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2np
from conftest import random_params
from gpt2np.decoding import batched_speculative
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.batch_policy import BatchAutoK
from gpt2np.decoding.batched_speculative import speculative_batch_stream, speculative_generate_batch
from gpt2np.decoding.drafters import CountingNgramDrafter
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2
from gpt2np.teach.broken_batch_kernels import BROKEN_BATCH_VARIANTS
from gpt2np.teach.exact import exact_distribution, exact_target_distribution, max_abs_difference, total_variation
from gpt2np.teach.toy_models import random_toy_model
from test_autoregressive import NoWork
from test_drafters_policies import ScriptedClock

EXACT = 1e-12
SMALL = GPT2Config(n_vocab=37, n_ctx=64, n_embd=12, n_head=3, n_layer=2)
PROMPTS = ["ROMEO:\nBut soft", "First Citizen:\nBefore we proceed any further, hear me speak.", "O", "JULIET:\n"]


@pytest.fixture(scope="module")
def pair():
    names = gpt2np.bundled_models()
    if not {"shakespeare-2.6M", "shakespeare-260K"} <= set(names):
        pytest.skip(f"the bundled pair is not installed (found {names})")
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def rng_of(seed):
    return None if seed is None else np.random.default_rng(seed)


def alone(target, draft, prompts, n_tokens, Ks, options, seeds, stops):  # each sequence by itself
    return [generate(target, p, n, rng=rng_of(s), stop_tokens=stop, **o) if K == 0 else
            speculative_generate(target, draft, p, n, K, rng=rng_of(s), stop_tokens=stop, **o).tokens
            for p, n, K, o, s, stop in zip(prompts, n_tokens, Ks, options, seeds, stops)]


def together(target, draft, prompts, n_tokens, Ks, options, seeds, stops):  # the same requests in one batch
    per = {key: [o.get(key) for o in options] for key in ("temperature", "top_k", "top_p")}
    return speculative_generate_batch(target, draft, prompts, n_tokens, K=Ks, rng=[rng_of(s) for s in seeds],
                                      stop_tokens=stops, **per)


def assert_same(batch, solo, what):
    for i, (b, s) in enumerate(zip(batch, solo)):
        first = next((j for j, (x, y) in enumerate(zip(b, s)) if x != y), min(len(b), len(s)))
        assert b == s, f"{what}: sequence {i} differs from its solo run at token {first} of {len(s)}"


# ---- (1) greedy: the target's own greedy tokens ------------------------------------------------------

def test_greedy_batch_equals_the_targets_greedy_generate_on_the_bundled_pair(pair):
    target, draft = pair
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    newline, space = target.tokenizer.encode("\n"), target.tokenizer.encode(" ")
    requests = (prompts, [60, 25, 80, 40], [4, 2, 0, 3], [{}] * 4, [None] * 4, [None, newline, space, None])
    solo = [generate(target, p, n, stop_tokens=stop) for p, n, stop in zip(*requests[:2], requests[-1])]
    assert len({len(s) for s in solo}) > 1, "the sequences should finish at different rounds"
    assert_same(together(target, draft, *requests), solo, "greedy, bundled pair")


@settings(deadline=None, max_examples=30)
@given(data=st.data(), n_seqs=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_greedy_batch_on_random_toy_and_small_gpt2_pairs(data, n_seqs, seed):
    rng = np.random.default_rng(seed)
    if data.draw(st.booleans(), "gpt2"):
        target, draft = GPT2(SMALL, random_params(SMALL, seed=seed % 5)), GPT2(SMALL, random_params(SMALL, seed=9))
    else:
        n_vocab = data.draw(st.integers(2, 6), "n_vocab")
        target, draft = random_toy_model(rng, n_vocab, order=3), random_toy_model(rng, n_vocab, order=2)
    prompts = [rng.integers(0, target.n_vocab, data.draw(st.integers(1, 8))).tolist() for _ in range(n_seqs)]
    n_tokens = [data.draw(st.integers(1, 20)) for _ in range(n_seqs)]
    Ks = [data.draw(st.integers(0, 5)) for _ in range(n_seqs)]
    stops = [data.draw(st.none() | st.lists(st.integers(0, target.n_vocab - 1), max_size=2)) for _ in range(n_seqs)]
    batch = speculative_generate_batch(target, draft, prompts, n_tokens, K=Ks, stop_tokens=stops)
    assert_same(batch, [generate(target, p, n, stop_tokens=s) for p, n, s in zip(prompts, n_tokens, stops)],
                "greedy, random pair")


# ---- (2) seeded sampling: the solo run's draws ------------------------------------------------------

def test_sampled_batch_draws_what_each_sequence_draws_alone_on_the_bundled_pair(pair):
    target, draft = pair
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    options = [dict(temperature=0.8), dict(temperature=1.2, top_k=20), dict(temperature=0), dict(top_p=0.9)]
    requests = (prompts, [50, 70, 30, 45], [4, 0, 2, 3], options, [11, 12, None, 13], [None, None, None, [10]])
    assert_same(together(target, draft, *requests), alone(target, draft, *requests), "sampled, bundled pair")


@settings(deadline=None, max_examples=30)
@given(data=st.data(), n_seqs=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_sampled_batch_on_random_toy_pairs_equals_each_solo_run(data, n_seqs, seed):
    rng = np.random.default_rng(seed)
    n_vocab = data.draw(st.integers(2, 6), "n_vocab")
    eot = data.draw(st.none() | st.just(n_vocab - 1), "eot")
    target = random_toy_model(rng, n_vocab, order=3, zero_fraction=0.3, eot_id=eot)
    draft = random_toy_model(rng, n_vocab, order=2, eot_id=eot)
    prompts = [rng.integers(0, n_vocab, data.draw(st.integers(1, 5))).tolist() for _ in range(n_seqs)]
    n_tokens = [data.draw(st.integers(1, 15)) for _ in range(n_seqs)]
    Ks = [data.draw(st.integers(0, 4)) for _ in range(n_seqs)]
    options = [data.draw(st.sampled_from([{}, dict(temperature=0.6), dict(top_k=2), dict(top_p=0.8)]))
               for _ in range(n_seqs)]
    seeds = [data.draw(st.none() | st.integers(0, 99)) for _ in range(n_seqs)]
    options = [o if s is not None else {} for o, s in zip(options, seeds)]  # greedy where no generator
    requests = (prompts, n_tokens, Ks, options, seeds, [None] * n_seqs)
    assert_same(together(target, draft, *requests), alone(target, draft, *requests), "sampled, toy pair")


# ---- (3) and (4): the exact joint law of a 2-sequence batch, and the broken variants -----------------

class RngView:
    """One sequence's generator, drawing from the ScriptedRng of the enumeration: every draw of either
    sequence is one enumerated random outcome, independent of all the others (as with two generators)."""

    def __init__(self, rng):
        self.rng = rng

    def choice(self, a, p):
        return self.rng.choice(a, p=p)


BATCHES = {  # two sequences: other prompts, lengths, K, options; end-of-text in the first pair
    "3 tokens, eot=2": dict(seed=1, n_vocab=3, eot_id=2, prompts=[[0], [1, 0]], n_tokens=[3, 2], K=[2, 1],
                            options=[dict(temperature=1.0), dict(temperature=0.7)]),
    "4 tokens, zeros, K=0": dict(seed=2, n_vocab=4, zero_fraction=0.3, prompts=[[1], [2]], n_tokens=[2, 3],
                                 K=[3, 0], options=[dict(top_k=3), dict(temperature=1.4, top_p=0.9)]),
    "2 tokens, both K=3": dict(seed=3, n_vocab=2, prompts=[[1], [0]], n_tokens=[3, 3], K=[3, 3],
                               options=[dict(temperature=1.0), dict(temperature=1.0)]),
}


def toy_batch(seed, n_vocab, prompts, n_tokens, K, options, zero_fraction=0.0, eot_id=None):
    rng = np.random.default_rng(seed)
    target = random_toy_model(rng, n_vocab, order=3, zero_fraction=zero_fraction, eot_id=eot_id)
    draft = random_toy_model(rng, n_vocab, order=2, zero_fraction=zero_fraction, eot_id=eot_id)
    return target, draft, prompts, n_tokens, K, options


def batch_law(target, draft, prompts, n_tokens, K, options, **teaching):  # {(tokens_0, tokens_1): P}
    per = {key: [o.get(key, 1.0 if key == "temperature" else None) for o in options]
           for key in ("temperature", "top_k", "top_p")}

    def run(rng):
        out = speculative_generate_batch(target, draft, prompts, n_tokens, K=K, rng=[RngView(rng), RngView(rng)],
                                         **per, **teaching)
        return tuple(tuple(tokens) for tokens in out)
    return exact_distribution(run)


def product_of_target_laws(target, prompts, n_tokens, options):  # independent sequences: P_0(a) P_1(b)
    first, second = (exact_target_distribution(target, p, n, **o) for p, n, o in zip(prompts, n_tokens, options))
    return {(a, b): pa * pb for a, pa in first.items() for b, pb in second.items()}


@pytest.mark.parametrize("name", BATCHES)
def test_the_joint_law_of_a_two_sequence_batch_is_the_product_of_the_targets_laws(name):
    target, draft, prompts, n_tokens, K, options = toy_batch(**BATCHES[name])
    expected = product_of_target_laws(target, prompts, n_tokens, options)
    got = batch_law(target, draft, prompts, n_tokens, K, options)
    assert max_abs_difference(got, expected) <= EXACT, f"max |difference| {max_abs_difference(got, expected):.3g}"


def test_the_joint_law_with_heuristic_K_is_the_product_of_the_targets_laws():
    """K="heuristic" for both (each its own schedule, within 1..2 so that it moves in a few tokens): enumerated.
    A schedule that followed the other sequence's rounds would keep this law too (any K from the past does); what
    catches it is each sequence drawing what it draws alone (test_continuous_speculative's shared-schedule test)."""
    target, draft, prompts, _, _, options = toy_batch(**BATCHES["3 tokens, eot=2"])
    n_tokens = [4, 3]
    expected = product_of_target_laws(target, prompts, n_tokens, options)
    got = batch_law(target, draft, prompts, n_tokens, "heuristic", options, K_max=2)
    assert max_abs_difference(got, expected) <= EXACT, f"max |difference| {max_abs_difference(got, expected):.3g}"


def test_heuristic_K_draws_what_each_sequence_draws_alone_beside_fixed_and_plain_ones(pair):
    """speculative_generate_batch(K=[...]) with "heuristic" beside a fixed K and K 0, sampled: each sequence's
    tokens are its solo speculative_generate's with the same K and seed."""
    target, draft = pair
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    options = [dict(temperature=0.8), dict(temperature=1.2, top_k=20), dict(temperature=0), dict(top_p=0.9)]
    requests = (prompts, [50, 70, 30, 45], ["heuristic", 0, "heuristic", 3], options, [11, 12, None, 13],
                [None, None, None, [10]])
    assert_same(together(target, draft, *requests), alone(target, draft, *requests), "heuristic, bundled pair")


@pytest.mark.parametrize("variant", sorted(BROKEN_BATCH_VARIANTS))
def test_the_exact_check_rejects_each_broken_batch_variant(variant):
    # the negative control: the same comparison, which passes above, must fail for every known bug
    target, draft, prompts, n_tokens, K, options = toy_batch(**BATCHES["3 tokens, eot=2"])
    expected = product_of_target_laws(target, prompts, n_tokens, options)
    assert max_abs_difference(batch_law(target, draft, prompts, n_tokens, K, options), expected) <= EXACT
    try:
        broken = batch_law(target, draft, prompts, n_tokens, K, options, **BROKEN_BATCH_VARIANTS[variant])
    except ValueError as error:  # a cache kept too long: some round has nothing left to feed
        print(f"{variant}: the model refused a call: {error}")
        assert variant == "next_sequence_length", f"{variant} raised {error}"
        return
    tv = total_variation(broken, expected)
    print(f"{variant}: total variation from the target's joint law {tv:.4f}")
    assert tv > 0.01, f"{variant} was not caught: total variation {tv:.3g}"


def test_the_shared_uniform_keeps_each_sequences_own_law_only_the_joint_law_catches_it():
    target, draft, prompts, n_tokens, K, options = toy_batch(**BATCHES["2 tokens, both K=3"])
    broken = batch_law(target, draft, prompts, n_tokens, K, options, **BROKEN_BATCH_VARIANTS["shared_uniform"])
    for i in (0, 1):
        marginal = {}
        for outcome, probability in broken.items():
            marginal[outcome[i]] = marginal.get(outcome[i], 0.0) + probability
        expected = exact_target_distribution(target, prompts[i], n_tokens[i], **options[i])
        assert max_abs_difference(marginal, expected) <= EXACT, f"sequence {i}'s own law is off"
    tv = total_variation(broken, product_of_target_laws(target, prompts, n_tokens, options))
    print(f"shared uniform, joint law: total variation {tv:.4f}")
    assert tv > 0.01


# ---- the rounds: one packed target call each; events; caches ------------------------------------------

def test_one_packed_target_call_per_round_and_draft_calls_only_for_drafting_sequences(monkeypatch):
    rng = np.random.default_rng(4)
    target, draft = GPT2(SMALL, random_params(SMALL, seed=1)), GPT2(SMALL, random_params(SMALL, seed=2))
    calls = []

    def recording(model, pairs, n_logits):  # (which model, [(n_ids, n_logits, cache.n_ctx)])
        calls.append((model is target, [(len(ids), n, cache.n_ctx) for (ids, cache), n in
                                        zip(pairs, n_logits if isinstance(n_logits, list) else [1] * len(pairs))]))
        return packed_call(model, pairs, n_logits)
    packed_call = batched_speculative.packed_call
    monkeypatch.setattr(batched_speculative, "packed_call", recording)
    prompts = [rng.integers(0, 37, n).tolist() for n in (3, 1, 2)]
    steps = list(speculative_batch_stream(target, draft, prompts, [6, 1, 4], K=[2, 3, 0]))
    target_calls = [c for is_target, c in calls if is_target]
    assert len(target_calls) == len(steps), f"{len(target_calls)} target calls for {len(steps)} rounds"
    assert target_calls[0] == [(3 + 2, 3, 3 + 6 - 1), (1, 1, 1 + 1 - 1), (2, 1, 2 + 4 - 1)]  # K clamped: 1 token
    assert [len(c) for is_target, c in calls[:3]] == [1, 1, 3]  # draft steps: sequence 0 only (K 3 clamped, K 0)
    for step in steps:
        for i, event in step:
            assert len(event.tokens) == len(event.provenance) <= event.K + 1
    assert [event.n_emitted for step in steps for i, event in step if i == 0][-1] == 6


def test_stream_events_add_up_to_the_tokens_and_sequences_leave_when_done():
    rng = np.random.default_rng(5)
    target, draft = random_toy_model(rng, 4, order=3), random_toy_model(rng, 4)
    stream = speculative_batch_stream(target, draft, [[0], [1], [2]], [9, 2, 5], K=[3, 1, 2],
                                      rng=[np.random.default_rng(s) for s in range(3)])
    seen, rounds = [[], [], []], []
    while True:
        try:
            step = next(stream)
        except StopIteration as done:
            result = done.value
            break
        rounds.append([i for i, _ in step])
        for i, event in step:
            seen[i] += event.tokens
    assert seen == result and [len(t) for t in result] == [9, 2, 5]
    assert all(rounds[r + 1] == [i for i in rounds[r] if i in rounds[r + 1]] for r in range(len(rounds) - 1))


# ---- (5) bad input: one-line errors naming the sequence, before any work ------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[1, 2, 3]), "for one prompt pass \\[prompt_ids\\]"),
    (dict(prompts=np.zeros((0, 2), dtype=int)), "non-empty list of prompts .* got ndarray of shape \\(0, 2\\)"),
    (dict(K=[1, 2]), "K must be one value for every sequence or a list of one per prompt \\(3\\)"),
    (dict(K=[1, -1, 2]), "sequence 1: K \\(draft tokens per round\\) must be an integer >= 0"),
    (dict(K=[1, 2, True]), "sequence 2: K .* got True"),
    (dict(K="fancy"), "^K .* got 'fancy'"),  # given once, for all: said once, no sequence named
    (dict(temperature=[0, 0, 0.5]), "sequence 2: sampling \\(temperature 0.5 > 0\\) needs rng"),
    (dict(n_tokens=[3, 3, 9]), "sequence 2: prompt \\(2 tokens\\) \\+ n_tokens \\(9\\) = 11 exceeds"),
    (dict(n_tokens=[3, 7, 3]), "sequence 1: draft: prompt \\(2 tokens\\) \\+ n_tokens \\(7\\) = 9 exceeds .* of 8 .*"
                               "or pass K=0"),
    (dict(prompts=[[1], [7], [2]]), "sequence 1: prompt token ids must be in \\[0, 5\\): 7 at position 0"),
    (dict(stop_tokens=[None, [9], 2]), "sequence 1: stop_tokens must be in \\[0, 5\\)"),
    (dict(rng="shared"), "sequences 0 and 1 share one generator"),
])
def test_bad_requests_are_one_line_errors_naming_the_sequence(kwargs, message):
    class SmallDraft(NoWork):
        n_ctx = 8
    arguments = dict(prompts=[[1], [2, 3], [4, 0]], n_tokens=3) | kwargs
    if arguments.get("rng") == "shared":
        arguments["rng"] = np.random.default_rng(0)
    with pytest.raises(ValueError, match=message) as info:
        speculative_generate_batch(NoWork(), SmallDraft(), arguments.pop("prompts"), arguments.pop("n_tokens"),
                                   **arguments)
    assert "\n" not in str(info.value)


def test_options_the_batch_does_not_take_are_refused_under_its_own_name():
    """trace, tree, calibrate: speculative_generate's; the batch once passed them on to speculative_batch_stream,
    whose name the TypeError then gave."""
    target, draft, prompts, n_tokens, K, _ = toy_batch(**BATCHES["3 tokens, eot=2"])
    for option in ("trace", "tree", "calibrate"):
        with pytest.raises(TypeError, match=f"^speculative_generate_batch\\(\\) got an unexpected keyword "
                                            f"argument '{option}'$"):
            speculative_generate_batch(target, draft, prompts, n_tokens, K=K, **{option: True})


def test_n_tokens_past_the_draft_is_fine_for_a_plain_sequence():
    rng = np.random.default_rng(6)
    target, draft = random_toy_model(rng, 3, n_ctx=20), random_toy_model(rng, 3, n_ctx=4)
    assert speculative_generate_batch(target, draft, [[0], [1]], [3, 10], K=[1, 0]) == \
        [generate(target, [0], 3), generate(target, [1], 10)]


@pytest.mark.parametrize("args, message", [
    ("draft_first", "target must be a model"),
    ("drafter", "draft must be a model .* or prompt lookup .* got ModelDrafter: pass its model"),
    ("vocabulary", "draft and target must share a vocabulary: n_vocab 4 vs 3"),
])
def test_the_models_are_checked_first(args, message):
    rng = np.random.default_rng(0)
    target, draft = random_toy_model(rng, 3), random_toy_model(rng, 3)
    calls = {"draft_first": ([[1, 2]], target, draft), "drafter": (target, gpt2np.ModelDrafter(draft), [[1]]),
             "vocabulary": (target, random_toy_model(rng, 4), [[1]])}
    with pytest.raises(ValueError, match=message) as info:
        speculative_generate_batch(*calls[args], 3)
    assert "\n" not in str(info.value)


# ---- K="auto": one K for the batch from its measured costs (batch_policy.BatchAutoK) -----------------

def recording_choices(monkeypatch):  # -> the list of every K BatchAutoK.choose returns from now on
    """The policy's own choices: a round's event.K is also clamped to the tokens left, and a fixed K
    sequence's K is its own, so the events' Ks vary even under a policy that always answers the same."""
    chosen, choose = [], BatchAutoK.choose
    monkeypatch.setattr(BatchAutoK, "choose", lambda self, *a, **k: chosen.append(choose(self, *a, **k)) or chosen[-1])
    return chosen


def assert_auto_K_keeps_the_joint_law(monkeypatch, target, draft, prompts, n_tokens, options):
    """K='auto' for a 2-sequence batch under a scripted clock (prior c 0.5): every outcome enumerated, the joint law
    the product of the target's laws, and the policy's K really varied (not the fixed case again)."""
    monkeypatch.setattr(batched_speculative, "batch_auto_K", lambda target, draft, K_max: BatchAutoK(K_max, 0.5))
    expected = product_of_target_laws(target, prompts, n_tokens, options)
    per = {key: [o.get(key, 1.0 if key == "temperature" else None) for o in options]
           for key in ("temperature", "top_k", "top_p")}
    chosen = recording_choices(monkeypatch)

    def run(rng):
        # a fresh clock on every path: each replays the same timings (real time would change the policy's
        # choices between the runs that enumerate one path's prefix)
        monkeypatch.setattr(batched_speculative, "time", ScriptedClock())
        stream = speculative_batch_stream(target, draft, prompts, n_tokens, K="auto", K_max=3,
                                          rng=[RngView(rng), RngView(rng)], **per)
        return tuple(tuple(tokens) for tokens in stream.run())
    got = exact_distribution(run)
    assert max_abs_difference(got, expected) <= EXACT, f"max |difference| {max_abs_difference(got, expected):.3g}"
    assert len(set(chosen)) >= 2, set(chosen)


def test_auto_K_for_the_batch_keeps_the_joint_law_under_a_scripted_clock(monkeypatch):
    target, draft, prompts, n_tokens, _, options = toy_batch(**BATCHES["3 tokens, eot=2"])
    assert_auto_K_keeps_the_joint_law(monkeypatch, target, draft, prompts, n_tokens, options)


def test_auto_K_batch_gives_the_targets_greedy_tokens_on_the_bundled_pair(pair):
    target, draft = pair
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    out = speculative_generate_batch(target, draft, prompts, [40, 25, 60, 10], K="auto")
    assert out == [generate(target, p, n, temperature=0) for p, n in zip(prompts, [40, 25, 60, 10])]


def scripted_policy(rows_seconds, draft_step_seconds, alpha, B, rounds=60):
    """A BatchAutoK run for `rounds` rounds of B sequences against these costs (noise-free), each
    examined position's overlap alpha: the K it asks for after them."""
    policy = BatchAutoK(K_max=8, c_prior=0.05)
    for t in range(rounds):
        k = policy.choose(B)
        policy.update([alpha] * (B * k), B * (k + 1), rows_seconds(B * (k + 1)), [(B, draft_step_seconds(B))] * k,
                      first_round=t == 0)
    return policy.choose(B)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_auto_K_drafts_less_as_the_batch_fills_and_stops_where_rows_cannot_pay(alpha):
    """Rows nearly free up to 16, then each costs a tenth of a one-row pass (this CPU's shape):
    a lone sequence drafts long rounds, a full batch none."""
    rows = lambda M: 0.03 * (1 + 0.05 * min(M - 1, 15) + 0.1 * max(M - 16, 0))  # noqa: E731
    step = lambda B: 0.1 * rows(B)  # noqa: E731  (a draft 10x cheaper, rows priced alike)
    from gpt2np.decoding.batch_policy import goodputs
    tokens = [sum(alpha ** j for j in range(K + 1)) for K in range(9)]
    for B in (1, 2, 4, 8, 16):
        K, truth = scripted_policy(rows, step, alpha, B), goodputs(tokens, B, step(B), rows)
        assert truth[K] >= 0.97 * max(truth), (B, K, [round(g, 1) for g in truth])  # the rule with the true costs
    Ks = [scripted_policy(rows, step, alpha, B) for B in (1, 2, 4, 8, 16)]
    assert Ks[0] >= 2 and Ks[-1] == 0 and all(a >= b for a, b in zip(Ks, Ks[1:])), Ks


def test_auto_K_is_refused_per_sequence_and_K_max_is_checked():
    target, draft, prompts, n_tokens, _, options = toy_batch(**BATCHES["3 tokens, eot=2"])
    with pytest.raises(ValueError, match="or 'auto' for every sequence"):
        speculative_generate_batch(target, draft, prompts, n_tokens, K=["auto", 2])
    with pytest.raises(ValueError, match="K_max must be an integer from 1 to 32, got 0"):
        speculative_generate_batch(target, draft, prompts, n_tokens, K="auto", K_max=0)


# ---- what callers pass: any integer dtype, arrays as lists, a stream they loop over --------------------------

@pytest.mark.parametrize("dtype", [np.uint64, np.int8])
def test_prompts_of_any_integer_dtype_and_per_sequence_arrays(dtype):
    target, draft = GPT2(SMALL, random_params(SMALL, seed=1)), GPT2(SMALL, random_params(SMALL, seed=2))
    prompts = [np.array([1, 2, 3], dtype=dtype), [4, 5]]
    out = speculative_generate_batch(target, draft, prompts, np.array([6, 4]), K=np.array([2, 0]))
    assert out == [generate(target, [1, 2, 3], 6), generate(target, [4, 5], 4)]
    assert speculative_generate_batch(target, draft, np.array([[1, 2], [4, 5]], dtype=dtype), 5, K=3) == \
        [generate(target, [1, 2], 5), generate(target, [4, 5], 5)]


def test_the_stream_keeps_every_sequence_s_tokens_after_a_for_loop():
    rng = np.random.default_rng(5)
    target, draft = random_toy_model(rng, 4, order=3), random_toy_model(rng, 4)
    stream = speculative_batch_stream(target, draft, [[0], [1], [2]], [9, 2, 5], K=[3, 1, 2])
    seen = [[], [], []]
    for step in stream:
        for i, event in step:
            seen[i] += event.tokens
    assert stream.result == seen == [generate(target, [p], n) for p, n in zip(range(3), [9, 2, 5])]
    assert list(stream) == [] and stream.run() == seen, "iterated again: nothing more, the result kept"


def test_a_stream_stopped_mid_way_keeps_each_sequence_s_tokens_apart():
    """.outputs: each sequence's tokens as the rounds come (rounds emit several tokens, unevenly), a prefix of its
    whole run where the stream stops; .result at the end."""
    rng = np.random.default_rng(5)
    target, draft = random_toy_model(rng, 4, order=3), random_toy_model(rng, 4)
    whole = [generate(target, [p], n) for p, n in zip(range(3), [9, 2, 5])]
    stream = speculative_batch_stream(target, draft, [[0], [1], [2]], [9, 2, 5], K=[3, 1, 2])
    next(stream), next(stream)
    stream.close()
    assert all(out == tokens[:len(out)] for out, tokens in zip(stream.outputs, whole)), (stream.outputs, whole)
    assert sum(map(len, stream.outputs)) == len(stream.tokens) and stream.outputs != [[]] * 3
    stream = speculative_batch_stream(target, draft, [[0], [1], [2]], [9, 2, 5], K=[3, 1, 2])
    assert stream.run() == stream.outputs == whole


# ---- prompt lookup in a batch: each sequence looks up its own context, the target's pass is packed -------------

LOOKUP_PROMPTS = ["ROMEO:\nBut soft, what light, what light through yonder window", "To be, or not to be, to be",
                  "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?", "a b a b a b a"]


def test_prompt_lookup_in_a_batch_gives_each_sequence_its_solo_run(pair):
    """Greedy on the bundled target: the target's own tokens; sampled with a seed, with prompt lookup and its
    counting kind (a real q, its drafts drawn from the sequence's own generator): each sequence exactly what
    speculative_generate gives it alone with that drafter, K and generator, whatever the others do."""
    target, _ = pair
    prompts = [target.tokenizer.encode(p) for p in LOOKUP_PROMPTS]
    n_tokens, Ks = [12, 20, 5, 16], [3, 1, 4, 0]
    options, seeds = [{}] * 4, [None] * 4
    for drafter in (gpt2np.NgramDrafter(), CountingNgramDrafter()):
        requests = (prompts, n_tokens, Ks, options, seeds, [None] * 4)
        assert_same(together(target, drafter, *requests), alone(target, drafter, *requests), f"greedy, {drafter.name}")
        sampled = (prompts, n_tokens, Ks, [dict(temperature=0.8), {}, dict(top_k=20), dict(top_p=0.9)],
                   [5, 6, 7, 8], [None] * 4)
        assert_same(together(target, drafter, *sampled), alone(target, drafter, *sampled), f"sampled, {drafter.name}")
    stream = speculative_batch_stream(target, gpt2np.NgramDrafter(), prompts, n_tokens, K=Ks, temperature=0)
    drafted = [event.K for step in stream for _, event in step]
    assert max(drafted) > 0 and stream.result == [generate(target, p, n) for p, n in zip(prompts, n_tokens)]


LOOKUP_BATCHES = {  # prompts whose suffixes recur, so that the lookup proposes
    "3 tokens, K 2 and 1": dict(seed=4, n_vocab=3, prompts=[[0, 1, 0], [1, 1, 0, 1]], n_tokens=[3, 2], K=[2, 1],
                                options=[dict(temperature=1.0), dict(temperature=0.7)]),
    "2 tokens, eot=1": dict(seed=5, n_vocab=2, eot_id=1, prompts=[[0, 0], [0, 1, 0]], n_tokens=[3, 3], K=[3, 2],
                            options=[dict(temperature=1.0), dict(top_k=1)]),
}


@pytest.mark.parametrize("drafter", [gpt2np.NgramDrafter, CountingNgramDrafter])
@pytest.mark.parametrize("name", LOOKUP_BATCHES)
def test_the_joint_law_of_a_lookup_batch_is_the_product_of_the_targets_laws(name, drafter):
    """Every outcome enumerated (teach/exact.py), as for a draft model: prompt lookup's one-hot q and the
    counting drafter's smooth q alike."""
    target, _, prompts, n_tokens, K, options = toy_batch(**LOOKUP_BATCHES[name])
    expected = product_of_target_laws(target, prompts, n_tokens, options)
    got = batch_law(target, drafter(), prompts, n_tokens, K, options)
    assert max_abs_difference(got, expected) <= EXACT, f"max |difference| {max_abs_difference(got, expected):.3g}"


def test_auto_K_with_prompt_lookup_keeps_the_joint_law_under_a_scripted_clock(monkeypatch):
    """K='auto' with prompt lookup (its misses shown to the policy as rejections, lookup_misses): the policy's K
    varies with the scripted timings, and the joint law is still the product of the target's laws. One drafter
    serves every enumerated path: the batch gives each sequence its own copy, so no state carries over."""
    target, _, prompts, n_tokens, _, options = toy_batch(**LOOKUP_BATCHES["3 tokens, K 2 and 1"])
    assert_auto_K_keeps_the_joint_law(monkeypatch, target, CountingNgramDrafter(), prompts, n_tokens, options)


def test_a_lookup_miss_is_a_rejection_to_the_policy():
    """A lookup that found fewer drafts than asked, all accepted, shows the policy one more examined position with
    overlap 0 (as E(alpha, K) counts the round); a draft model's rounds, or a chain cut by a rejection, add none."""
    from gpt2np.decoding.stream import RoundEvent
    found_all = RoundEvent([5, 6], ["draft", "bonus"], 1, 2, drafts=[5], decisions=[True])
    missed = RoundEvent([5, 6], ["draft", "bonus"], 1, 2, drafts=[5], decisions=[True])
    rejected = RoundEvent([7], ["resample"], 1, 1, drafts=[5], decisions=[False])
    nothing = RoundEvent([7], ["target"], 0, 1, drafts=[], decisions=[])
    step = [(0, found_all, 0), (1, missed, 0), (2, rejected, 0), (3, nothing, 0)]
    ks = {0: 1, 1: 3, 2: 3, 3: 2}
    looking, drafted = SimpleNamespace(drafter=gpt2np.NgramDrafter()), SimpleNamespace(drafter=None)
    assert batched_speculative.lookup_misses([looking] * 4, step, ks) == [1, 3]
    assert batched_speculative.lookup_misses([drafted] * 4, step, ks) == []  # a draft model's sequences
    assert batched_speculative.lookup_misses([drafted, looking, looking, drafted], step, ks) == [1]  # one batch
    step = [(i, replace(event, overlaps=[1.0] * sum(event.decisions) + [0.0] * (not all(event.decisions))), 0)
            for i, event, _ in step]  # each examined position's overlap as a greedy round gives it
    assert batched_speculative.observed([looking] * 4, step, ks) == {0: [1.0], 1: [1.0, 0.0], 2: [0.0], 3: [0.0]}


@pytest.mark.parametrize("variant", ["shared_uniform", "copied_decision"])
def test_the_exact_check_rejects_broken_verifiers_with_prompt_lookup_too(variant):
    """The negative control, with the counting lookup (a smooth q, so that a shared coin can matter)."""
    target, _, prompts, n_tokens, K, options = toy_batch(**LOOKUP_BATCHES["3 tokens, K 2 and 1"])
    expected = product_of_target_laws(target, prompts, n_tokens, options)
    broken = batch_law(target, CountingNgramDrafter(), prompts, n_tokens, K, options,
                       **BROKEN_BATCH_VARIANTS[variant])
    tv = total_variation(broken, expected)
    print(f"{variant} with prompt lookup: total variation {tv:.4f}")
    assert tv > 0.01, f"{variant} was not caught: total variation {tv:.3g}"


def test_one_packed_target_call_a_round_and_no_draft_call_with_prompt_lookup(monkeypatch):
    rng = np.random.default_rng(4)
    target = GPT2(SMALL, random_params(SMALL, seed=1))
    calls = []

    def recording(model, pairs, n_logits):
        calls.append(len(pairs))
        return forward_packed(model, pairs, n_logits)
    from gpt2np.model.batch import forward_packed
    monkeypatch.setattr(batched_speculative, "forward_packed", recording)
    prompts = [list(rng.integers(0, 5, size=12)) for _ in range(3)]  # a small alphabet: lookups find matches
    stream = speculative_batch_stream(target, gpt2np.NgramDrafter(), prompts, [6, 6, 6], K=3, temperature=0)
    steps = list(stream)
    assert len(calls) == len(steps) and calls[0] == 3, (calls, len(steps))  # the target's pass only, packed
    assert stream.result == [generate(target, p, 6) for p in prompts]


def test_a_tree_drafter_is_refused_in_one_line():
    """A lookup that drafts token trees is an NgramDrafter too; the batch drafts chains, so it failed in its first
    round (cannot unpack a DraftTree): refused before any work, saying so."""
    from gpt2np.decoding.tree_drafters import NgramTreeDrafter
    target = random_toy_model(np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="got NgramTreeDrafter: a batch drafts chains") as info:
        speculative_generate_batch(target, NgramTreeDrafter(), [[0, 1, 0]], 4, K=2)
    assert "\n" not in str(info.value)
