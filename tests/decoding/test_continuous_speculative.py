"""ContinuousSpeculativeBatch: drafting sequences join and leave a running batch, each exactly as alone.

(1) greedy and seeded sampling with fixed K: every sequence equals speculative_generate alone (K = 0:
generate), whatever joins, finishes or is cancelled around it, on toy pairs, a small GPT-2 pair and
the bundled pair; (2) the exact joint law of two sequences, the second joining a round late, with
K="auto" for both (a scripted clock, fresh on every enumerated path; the policy's K varies), equals the
product of the target's laws, and the broken verifiers that couple the sequences' coins
(teach/broken_batch_kernels.py) fail that check; (3) one packed target call per round; (4) one-line
errors: bad requests, a prompt too long for the draft, handles that are not ints.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2np
from conftest import random_params
from gpt2np.decoding import batched_speculative
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.batch_policy import BatchAutoK
from gpt2np.decoding.policies import HeuristicK
from gpt2np.decoding.continuous_speculative import ContinuousSpeculativeBatch
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.model.forward import GPT2
from gpt2np.teach.broken_batch_kernels import BROKEN_BATCH_VARIANTS
from gpt2np.teach.exact import exact_distribution, exact_target_distribution, max_abs_difference, total_variation
from gpt2np.teach.toy_models import random_toy_model
from test_batched_speculative import EXACT, PROMPTS, SMALL, RngView, recording_choices, rng_of
from test_continuous import steps_through_interrupts
from test_drafters_policies import ScriptedClock


@pytest.fixture(scope="module")
def pair():
    if not {"shakespeare-2.6M", "shakespeare-260K"} <= set(gpt2np.bundled_models()):
        pytest.skip("the bundled pair is not installed")
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


def solo(target, draft, r):  # r: dict(prompt, n, K, options, seed, stops, join[, cancel])
    if r["K"] == 0:
        return generate(target, r["prompt"], r["n"], rng=rng_of(r["seed"]), stop_tokens=r["stops"], **r["options"])
    return speculative_generate(target, draft, r["prompt"], r["n"], r["K"], rng=rng_of(r["seed"]),
                                stop_tokens=r["stops"], **r["options"]).tokens


def run_schedule(target, draft, requests, K_max=8, prefill_chunk=None):
    """Request i joins before round r["join"] and is cancelled before round r.get("cancel"); returns
    each request's tokens, the batch's size at each round, and each request's RoundEvents."""
    batch = ContinuousSpeculativeBatch(target, draft, K_max, prefill_chunk=prefill_chunk)
    handles, tokens, sizes, step = {}, {}, [], 0
    events = {i: [] for i in range(len(requests))}
    while step == 0 or batch or any(r["join"] >= step for r in requests):
        for i, r in enumerate(requests):
            if r["join"] == step:
                handles[i] = batch.add(r["prompt"], r["n"], r["K"], rng=rng_of(r["seed"]), stop_tokens=r["stops"],
                                       **r["options"])
            if r.get("cancel") == step and handles[i] in batch:
                tokens[i] = batch.tokens_of(handles[i])
                assert batch.cancel(handles[i]) and handles[i] not in batch
        sizes.append(len(batch))
        for handle, event in batch.step():
            i = next(i for i, h in handles.items() if h == handle)
            events[i].append(event)
            assert event.n_emitted == len(batch.tokens_of(handle)), "n_emitted counts the sequence's tokens"
            if handle not in batch:
                tokens[i] = batch.pop_tokens(handle)
        step += 1
    return [tokens[i] for i in range(len(requests))], sizes, [events[i] for i in range(len(requests))]


def assert_each_as_alone(target, draft, requests, got, what):
    for i, (r, tokens) in enumerate(zip(requests, got)):
        expected = solo(target, draft, r)
        if "cancel" in r:  # cancelled mid-way: what it emitted so far is a prefix of its solo run
            expected = expected[:len(tokens)]
            assert len(tokens) < r["n"], f"{what}: request {i} was not cancelled mid-way ({len(tokens)} tokens)"
        first = next((j for j, (x, y) in enumerate(zip(tokens, expected)) if x != y), min(len(tokens), len(expected)))
        assert tokens == expected, (f"{what}: request {i} differs from its solo run at token {first} of "
                                    f"{len(expected)} ({len(tokens)} emitted)")


# ---- (1) each sequence as alone ----------------------------------------------------------------------

def bundled_schedule(target):  # four requests: joining at rounds 0-5, greedy and sampled, one stopped, one cancelled
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    newline = target.tokenizer.encode("\n")
    return [dict(prompt=ids[0], n=60, K=4, options={}, seed=None, stops=None, join=0),
            dict(prompt=ids[1], n=30, K=2, options=dict(temperature=0.8), seed=7, stops=None, join=2),
            dict(prompt=ids[2], n=40, K=0, options=dict(temperature=1.0, top_k=20), seed=3, stops=newline, join=3),
            dict(prompt=ids[3], n=50, K=3, options=dict(temperature=0.9, top_p=0.9), seed=11, stops=None, join=5,
                 cancel=9)]


def test_bundled_pair_requests_joining_finishing_and_cancelled_each_equal_their_solo_runs(pair):
    target, draft = pair
    requests = bundled_schedule(target)
    got, sizes, _ = run_schedule(target, draft, requests)
    assert max(sizes) >= 3 and sizes[0] == 1, f"the batch should grow from 1 to 3 or 4 sequences, got sizes {sizes}"
    assert_each_as_alone(target, draft, requests, got, "bundled pair")


def test_long_prompts_fed_a_chunk_a_round_each_equal_their_solo_runs(pair):
    """prefill_chunk=3: the bundled schedule's prompts of 15, 60 and 8 tokens enter their caches 3 rows a round
    while the others decode; each request still gets its solo run, greedy and sampled, K 0-4, stopped and
    cancelled."""
    target, draft = pair
    requests = bundled_schedule(target)
    assert sum(len(r["prompt"]) > 3 for r in requests) >= 3, "three prompts should take more than one chunk"
    got, _, _ = run_schedule(target, draft, requests, prefill_chunk=3)
    assert_each_as_alone(target, draft, requests, got, "bundled pair, prefill_chunk=3")


@settings(deadline=None, max_examples=25)
@given(data=st.data(), n_seqs=st.integers(1, 4), seed=st.integers(0, 2**31), gpt=st.booleans())
def test_random_schedules_on_toy_and_small_gpt2_pairs(data, n_seqs, seed, gpt):
    rng = np.random.default_rng(seed)
    if gpt:
        target, draft = GPT2(SMALL, random_params(SMALL, rng)), GPT2(SMALL, random_params(SMALL, rng))
        n_vocab = SMALL.n_vocab
    else:
        n_vocab = 5
        target, draft = random_toy_model(rng, n_vocab, order=3), random_toy_model(rng, n_vocab, order=2)
    requests = []
    for _ in range(n_seqs):
        prompt = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=1, max_size=7))
        sampled = data.draw(st.booleans())
        K = data.draw(st.one_of(st.integers(0, 4), st.just("heuristic")))
        requests.append(dict(prompt=prompt, n=data.draw(st.integers(1, 12)), K=K,
                             options=dict(temperature=data.draw(st.sampled_from([0.7, 1.0]))) if sampled else {},
                             seed=data.draw(st.integers(0, 1000)) if sampled else None,
                             stops=data.draw(st.sampled_from([None, [0]])), join=data.draw(st.integers(0, 4))))
    chunk = data.draw(st.none() | st.integers(1, 4))
    got, _, _ = run_schedule(target, draft, requests, prefill_chunk=chunk)
    assert_each_as_alone(target, draft, requests, got,
                         f"{'small GPT-2' if gpt else 'toy'} pair, seed {seed}, prefill_chunk {chunk}")


def test_the_policy_chooses_for_the_auto_sequences_told_the_others_K(pair, monkeypatch):
    """Two "auto" sequences beside a plain one (K 0, as a server's plain request rides along) and a K = 3 one: the
    policy is asked for the two (their number, what their draft lacks, the tokens they want) and told the others'
    K (their rows share the pass, their tokens count), not asked as if all four drafted."""
    target, draft = pair
    calls, choose = [], BatchAutoK.choose
    monkeypatch.setattr(BatchAutoK, "choose", lambda self, B, lag=0, horizon=None, fixed=(): calls.append(
        (B, lag, horizon, sorted(fixed))) or choose(self, B, lag, horizon, fixed))
    batch = ContinuousSpeculativeBatch(target, draft, K_max=4)
    ids = [target.tokenizer.encode(p) for p in PROMPTS[:4]]
    for prompt, n, K in zip(ids, (20, 16, 12, 10), ("auto", "auto", 0, 3)):
        batch.add(prompt, n, K)
    batch.step()
    B, lag, horizon, fixed = calls[0]
    assert (B, horizon, fixed) == (2, 36, [0, 3]), calls[0]
    assert lag == len(ids[0]) + len(ids[1]) - 2, (lag, [len(i) for i in ids])  # each auto one's prompt but a row


class CostModelClock:
    """time.perf_counter's stand-in for the batch's rounds: time passes only in model calls, by a cost model (a target
    call 1 ms + 0.05 ms a row, a draft call a tenth of that, about the pair's parameter ratio). Under the real clock
    the policy's choices follow the machine's load: a fresh-clone CI run on two busy test processes timed this
    pair's draft calls dear enough that auto never drafted."""

    def __init__(self, target):
        self.now, self.target = 0.0, target

    def perf_counter(self):
        return self.now

    def install(self, monkeypatch):
        packed_call = batched_speculative.packed_call

        def timed_call(model, calls, n_logits):
            self.now += (1.0 if model is self.target else 0.1) * 1e-3 * (1 + 0.05 * sum(len(ids) for ids, _ in calls))
            return packed_call(model, calls, n_logits)
        monkeypatch.setattr(batched_speculative, "packed_call", timed_call)
        monkeypatch.setattr(batched_speculative, "time", self)


def test_auto_K_sequences_get_the_targets_greedy_tokens_and_fixed_ones_keep_their_K(pair, monkeypatch):
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    requests = [dict(prompt=ids[i], n=n, K=K, options={}, seed=None, stops=None, join=j)
                for i, (n, K, j) in enumerate([(40, "auto", 0), (30, "auto", 1), (35, 3, 2), (20, "auto", 4)])]
    chosen = recording_choices(monkeypatch)  # the K the policy gives the "auto" requests, round by round
    CostModelClock(target).install(monkeypatch)  # the pair chooses K, not the load of the machine the suite runs on
    got, _, events = run_schedule(target, draft, requests, K_max=4)
    for i, (r, tokens) in enumerate(zip(requests, got)):
        assert tokens == generate(target, r["prompt"], r["n"], temperature=0), f"request {i} (K={r['K']!r})"
    assert max(chosen) <= 4 and len(set(chosen)) >= 2, f"auto's K should vary within K_max 4, got {sorted(set(chosen))}"
    fixed = [(e.K, min(3, requests[2]["n"] - (e.n_emitted - len(e.tokens)) - 1)) for e in events[2]]
    assert all(K == wanted for K, wanted in fixed), f"the K=3 request's (K, min(3, tokens left - 1)): {fixed}"


# ---- (2) the exact joint law, K="auto", the second sequence joining a round late ------------------------

def joint_law(monkeypatch, target, draft, prompts, n_tokens, **teaching):  # {(tokens_0, tokens_1): P}
    def run(rng):
        monkeypatch.setattr(batched_speculative, "time", ScriptedClock())  # a fresh clock: every path the same timings
        batch_ = ContinuousSpeculativeBatch(target, draft, K_max=3, **teaching)
        first = batch_.add(prompts[0], n_tokens[0], "auto", temperature=1.0, rng=RngView(rng))
        batch_.step()
        second = batch_.add(prompts[1], n_tokens[1], "auto", temperature=1.0, rng=RngView(rng))
        while batch_:
            batch_.step()
        return tuple(batch_.pop_tokens(first)), tuple(batch_.pop_tokens(second))
    return exact_distribution(run)


def product_law(target, prompts, n_tokens):
    first, second = (exact_target_distribution(target, p, n, temperature=1.0) for p, n in zip(prompts, n_tokens))
    return {(a, b): pa * pb for a, pa in first.items() for b, pb in second.items()}


def toy_pair():
    rng = np.random.default_rng(3)
    return random_toy_model(rng, 2, order=3), random_toy_model(rng, 2, order=2), [[1], [0, 1]], [3, 3]


def test_the_joint_law_with_auto_K_and_a_late_joiner_is_the_product_of_the_targets_laws(monkeypatch):
    target, draft, prompts, n_tokens = toy_pair()
    chosen = recording_choices(monkeypatch)
    got, expected = joint_law(monkeypatch, target, draft, prompts, n_tokens), product_law(target, prompts, n_tokens)
    assert max_abs_difference(got, expected) <= EXACT, f"max |difference| {max_abs_difference(got, expected):.3g}"
    assert len(set(chosen)) >= 2, set(chosen)  # the policy's K really varied: not one fixed K again


@pytest.mark.parametrize("variant", ["shared_uniform", "copied_decision"])
def test_the_joint_law_check_catches_the_broken_batch_verifiers(monkeypatch, variant):
    """The negative control: the same check, with a verifier that couples the sequences' coins
    (teach/broken_batch_kernels.py), must fail."""
    target, draft, prompts, n_tokens = toy_pair()
    broken = joint_law(monkeypatch, target, draft, prompts, n_tokens, **BROKEN_BATCH_VARIANTS[variant])
    tv = total_variation(broken, product_law(target, prompts, n_tokens))
    print(f"{variant}: total variation from the product of the target's laws {tv:.4f}")
    assert tv > 0.01, f"{variant} was not caught: total variation {tv:.3g}"


# ---- (3) one packed target call per round -------------------------------------------------------------

def test_one_packed_target_call_per_round(monkeypatch):
    rng = np.random.default_rng(0)
    target, draft = GPT2(SMALL, random_params(SMALL, rng)), GPT2(SMALL, random_params(SMALL, rng))
    calls = []
    real = batched_speculative.forward_packed
    monkeypatch.setattr(batched_speculative, "forward_packed",
                        lambda model, c, n: calls.append((model, len(c))) or real(model, c, n))
    batch = ContinuousSpeculativeBatch(target, draft)
    batch.add([1, 2, 3], 6, K=2)
    batch.step()
    batch.add([4], 6, K=0)
    calls.clear()
    batch.step()
    target_calls = [n for model, n in calls if model is target]
    draft_calls = [n for model, n in calls if model is draft]
    assert target_calls == [2], f"one target call over both sequences, got {target_calls}"
    assert draft_calls == [1, 1], f"two draft steps for the drafting sequence only, got {draft_calls}"


def rows_per_call(monkeypatch, models):  # -> [(model's name, [rows of each sequence's call])], one per packed call
    calls, real = [], batched_speculative.forward_packed
    names = {id(m): name for name, m in models.items()}
    monkeypatch.setattr(batched_speculative, "forward_packed", lambda model, c, n: calls.append(
        (names[id(model)], [len(ids) for ids, _ in c])) or real(model, c, n))
    return calls


def test_a_long_prompt_joins_a_chunk_a_round_in_the_calls_the_others_make(monkeypatch):
    """prefill_chunk=4: a drafting newcomer with a 13-token prompt joins a running K = 2 sequence. Each round stays
    ONE target call; the newcomer feeds 4 prompt rows a round to the target and in the first draft step's call (no
    draft call of its own), draws nothing until its prompt is in, and the other sequence emits every round."""
    rng = np.random.default_rng(0)
    target, draft = GPT2(SMALL, random_params(SMALL, rng)), GPT2(SMALL, random_params(SMALL, rng))
    batch = ContinuousSpeculativeBatch(target, draft, prefill_chunk=4)
    old = batch.add([1, 2, 3], 20, K=2)
    batch.step()
    calls = rows_per_call(monkeypatch, {"target": target, "draft": draft})
    new = batch.add(list(range(5, 18)), 6, K=3)
    rounds = []
    while new in batch:
        calls.clear()
        events = dict(batch.step())
        rounds.append((sorted(events), [c for c in calls if c[0] == "target"], [c for c in calls if c[0] == "draft"]))
    emitting = [handles for handles, _, _ in rounds]
    assert emitting[:3] == [[old]] * 3 and new in emitting[3], f"who emitted, round by round: {emitting}"
    for i, (_, target_calls, draft_calls) in enumerate(rounds[:3]):
        assert len(target_calls) == 1 and target_calls[0][1][1:] == [4], f"round {i}: target calls {target_calls}"
        assert draft_calls[0][1][1:] == [4] and all(len(rows) == 1 for _, rows in draft_calls[1:]), \
            f"round {i}: the newcomer's chunk rides in the first draft step only: {draft_calls}"
    assert rounds[3][1] == [("target", [1 + 2, 1 + 3])], \
        f"round 3: the other's token and 2 drafts, the newcomer's last prompt row and 3 drafts: {rounds[3][1]}"
    assert batch.pop_tokens(new) == speculative_generate(target, draft, list(range(5, 18)), 6, K=3).tokens


def test_a_plain_round_feeds_the_chunk_to_the_draft_in_a_call_of_its_own(monkeypatch):
    """When no sequence drafts with the model this round (a K = 0 one only), a drafting newcomer's chunk still
    reaches its draft cache (one call over its chunk), so its first drafting round owes the draft one chunk at
    most; a K = 0 newcomer's prompt never reaches the draft."""
    rng = np.random.default_rng(1)
    target, draft = GPT2(SMALL, random_params(SMALL, rng)), GPT2(SMALL, random_params(SMALL, rng))
    batch = ContinuousSpeculativeBatch(target, draft, prefill_chunk=5)
    batch.add([1], 30, K=0)
    batch.step()
    calls = rows_per_call(monkeypatch, {"target": target, "draft": draft})
    batch.add(list(range(2, 14)), 4, K=2)   # 12 prompt rows: 5, 5, then the last 2 in its first round
    batch.add(list(range(20, 31)), 4, K=0)  # 11: 5, 5, then 1
    batch.step()
    batch.step()
    assert calls[:2] == [("draft", [5]), ("target", [1, 5, 5])] and calls[2:4] == [("draft", [5]), ("target", [1, 5, 5])],\
        f"two chunk rounds: {calls}"
    calls.clear()
    batch.step()
    assert calls[0] == ("draft", [2]), f"the drafting newcomer's first draft step owes its last 2 rows: {calls}"


def test_the_policy_neither_times_nor_counts_a_round_that_feeds_a_chunk(pair, monkeypatch):
    """An "auto" sequence feeding its prompt a chunk a round is not among the sequences the policy chooses for
    (it drafts nothing yet), and no round that feeds prompt rows is timed for the policy, up to and including the
    round that feeds its last rows."""
    target, draft = pair
    asked, updates = [], []
    choose, update = BatchAutoK.choose, BatchAutoK.update
    monkeypatch.setattr(BatchAutoK, "choose", lambda self, B, lag=0, horizon=None, fixed=(): asked.append(
        (B, sorted(fixed))) or choose(self, B, lag, horizon, fixed))
    monkeypatch.setattr(BatchAutoK, "update", lambda self, *a, first_round: updates.append(first_round) or update(
        self, *a, first_round=first_round))
    batch = ContinuousSpeculativeBatch(target, draft, K_max=4, prefill_chunk=4)
    ids = [target.tokenizer.encode(p) for p in PROMPTS[:2]]
    assert len(ids[1]) > 8, "the newcomer's prompt should take more than two chunks"
    batch.add(ids[0][:4], 150, "auto")
    for _ in range(3):
        batch.step()
    asked.clear(), updates.clear()
    batch.add(ids[1], 20, "auto")
    chunks = -(-len(ids[1]) // 4)  # rounds that feed its prompt, the last one included
    for _ in range(chunks + 1):
        batch.step()
    assert [B for B, _ in asked] == [1] * (chunks - 1) + [2, 2], f"the policy's B, round by round: {asked}"
    assert updates == [True] * chunks + [False], f"rounds shown to the policy as timed (False): {updates}"


# ---- (4) errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(K="fancy"), r"K \(draft tokens per round\) must be an integer >= 0 .* got 'fancy'"),
    (dict(K=-1), r"K \(draft tokens per round\) must be an integer >= 0"),
    (dict(K=True), r"K \(draft tokens per round\) must be an integer >= 0"),
    (dict(temperature=-1.0), "temperature must be"),
    (dict(n_tokens=0), "n_tokens"),
])
def test_bad_requests_are_one_line_errors(kwargs, message):
    rng = np.random.default_rng(0)
    target, draft = random_toy_model(rng, 4), random_toy_model(rng, 4)
    batch = ContinuousSpeculativeBatch(target, draft)
    args = dict(prompt_ids=[0], n_tokens=3, K=2) | kwargs
    with pytest.raises(ValueError, match=message) as error:
        batch.add(**args)
    assert "\n" not in str(error.value) and len(batch) == 0


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True, "8"])
def test_a_bad_prefill_chunk_is_a_one_line_error(chunk):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"prefill_chunk must be None \(whole prompts\) or an integer >= 1") as e:
        ContinuousSpeculativeBatch(random_toy_model(rng, 4), random_toy_model(rng, 4), prefill_chunk=chunk)
    assert "\n" not in str(e.value)


def test_a_prompt_too_long_for_the_draft_alone_names_the_draft():
    """The target's context is 64: a message about "the context of 8 tokens" read as a wrong one."""
    rng = np.random.default_rng(0)
    batch = ContinuousSpeculativeBatch(random_toy_model(rng, 4, n_ctx=64), random_toy_model(rng, 4, n_ctx=8))
    with pytest.raises(ValueError, match=r"^draft: prompt \(6 tokens\) \+ n_tokens \(5\) = 11 exceeds .* of 8 "
                                         r"tokens; .*, or pass K=0") as error:
        batch.add([1] * 6, 5, K=2)
    assert "\n" not in str(error.value) and len(batch) == 0
    assert batch.add([1] * 6, 5, K=0) in batch and len(batch) == 1  # K = 0: the draft never sees it


def test_newcomers_of_any_integer_dtype_and_handles_that_are_not_ints():
    rng = np.random.default_rng(0)
    target, draft = GPT2(SMALL, random_params(SMALL, rng)), GPT2(SMALL, random_params(SMALL, rng))
    batch = ContinuousSpeculativeBatch(target, draft)
    running = batch.add([1, 2], 8, K=2)
    batch.step()
    newcomer = batch.add(np.array([3, 4], dtype=np.uint64), 5, K=3)
    for handle in (True, [1], 1.0):
        with pytest.raises(TypeError, match=r"a handle is an int that add returned"):
            batch.cancel(handle)
        with pytest.raises(TypeError, match=r"in batch: a handle is an int that add returned"):
            handle in batch
    assert batch.running == [running, newcomer], "cancel(True) must not cancel handle 1"
    while batch:
        batch.step()
    assert [batch.pop_tokens(h) for h in (running, newcomer)] == [generate(target, [1, 2], 8),
                                                                   generate(target, [3, 4], 5)]


def test_the_models_and_shared_generators_are_refused():
    rng = np.random.default_rng(0)
    target = random_toy_model(rng, 4)
    with pytest.raises(ValueError, match="draft must be a model"):
        ContinuousSpeculativeBatch(target, "gpt2")
    with pytest.raises(ValueError, match="vocabular"):
        ContinuousSpeculativeBatch(target, random_toy_model(rng, 5))
    with pytest.raises(ValueError, match="K_max must be an integer from 1 to 32"):
        ContinuousSpeculativeBatch(target, random_toy_model(rng, 4), K_max=0)
    batch, coins = ContinuousSpeculativeBatch(target, random_toy_model(rng, 4)), np.random.default_rng(1)
    batch.add([0], 3, 2, rng=coins)
    with pytest.raises(ValueError, match="already draws from this generator"):
        batch.add([1], 3, 2, rng=coins)


@pytest.mark.parametrize("chunk", [None, 3], ids=["whole prompts", "prefill_chunk 3"])
@pytest.mark.parametrize("where", ["verifying", "rolling back"])
def test_a_round_interrupted_anywhere_changes_nothing_and_the_batch_carries_on(pair, where, chunk):
    """Ctrl-C in a round (a notebook user stopping a cell) used to leave caches and generators half moved: the
    next round failed deep inside ("need 1 <= n_logits <= len(ids)"). Now a round that raises is undone, so
    after one interrupted round every sequence still gets exactly its solo run, greedy and sampled alike:
    interrupted after half the sequences drew their coins, or after the target caches were rolled back and
    before the draft caches were; with prefill_chunk 3, in a round that also fed a chunk of the longer prompts."""
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS[:4]]
    requests = [dict(prompt=p, n=14, K=k, seed=seed, stops=None, options=dict(temperature=temperature))
                for p, k, seed, temperature in zip(ids, [3, 2, 4, 0], [None, 5, 6, 7], [None, 0.9, 1.2, 0.8])]
    calls = {"verify": 0, "roll_back": 0}

    def verify(rounds, rngs):  # the third round: half the sequences verified (their coins drawn), then Ctrl-C
        calls["verify"] += 1
        if where == "verifying" and calls["verify"] == 3:
            batched_speculative.verify_each(rounds[:len(rounds) // 2], rngs[:len(rngs) // 2])
            raise KeyboardInterrupt
        return batched_speculative.verify_each(rounds, rngs)

    def roll_back(pairs):  # the third round's second roll-back (the draft caches'): Ctrl-C before it
        calls["roll_back"] += 1
        if where == "rolling back" and calls["roll_back"] == 6:
            raise KeyboardInterrupt
        batched_speculative.roll_back_each(pairs)
    batch = ContinuousSpeculativeBatch(target, draft, verify=verify, roll_back=roll_back, prefill_chunk=chunk)
    handles = [batch.add(r["prompt"], r["n"], r["K"], rng=rng_of(r["seed"]), **r["options"]) for r in requests]
    assert steps_through_interrupts(batch) == 1
    for i, (handle, r) in enumerate(zip(handles, requests)):
        assert batch.pop_tokens(handle) == solo(target, draft, r), f"request {i} differs from its solo run ({where})"


def test_prompt_lookup_requests_joining_finishing_and_cancelled_each_equal_their_solo_runs(pair):
    """A continuous batch with prompt lookup (the server packs prompt-lookup requests so): each sequence looks up
    its own context, greedy and sampled, joining, stopping and cancelled as with a draft model; a round
    interrupted half-way through verification is undone; K='auto' gives the target's greedy tokens."""
    target, _ = pair
    lookup = gpt2np.NgramDrafter()
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    requests = bundled_schedule(target)
    got, sizes, events = run_schedule(target, lookup, requests)
    assert max(sizes) >= 3 and any(e.drafts for e in events[0]), "the lookup should have drafted"
    assert_each_as_alone(target, lookup, requests, got, "prompt lookup")
    calls = {"verify": 0}

    def verify(rounds, rngs):
        calls["verify"] += 1
        if calls["verify"] == 3:
            batched_speculative.verify_each(rounds[:1], rngs[:1])
            raise KeyboardInterrupt
        return batched_speculative.verify_each(rounds, rngs)
    batch = ContinuousSpeculativeBatch(target, lookup, verify=verify)
    handles = [batch.add(r["prompt"], 14, r["K"], rng=rng_of(r["seed"]), **r["options"]) for r in requests[:2]]
    assert steps_through_interrupts(batch) == 1
    assert [batch.pop_tokens(h) for h in handles] == [solo(target, lookup, {**r, "n": 14}) for r in requests[:2]]
    auto = [batch.add(p, 12, "auto") for p in ids[:3]]
    while batch:
        batch.step()
    assert [batch.pop_tokens(h) for h in auto] == [generate(target, p, 12) for p in ids[:3]]


def heuristic_schedule(target):  # bundled_schedule with K="heuristic" for three: greedy, sampled, sampled cancelled
    requests = bundled_schedule(target)
    for i in (0, 1, 3):
        requests[i]["K"] = "heuristic"
    return requests


@pytest.mark.parametrize("lookup", [False, True], ids=["draft model", "prompt lookup"])
def test_heuristic_requests_joining_finishing_and_cancelled_each_equal_their_solo_runs(pair, lookup):
    """K="heuristic" in a batch: each sequence keeps its own schedule (K + 2 after a round whose drafts were all
    accepted, else K - 1: Hugging Face's), a function of its own rounds only, so each equals its solo run with
    K="heuristic", sampled ones too, beside a plain one, joining, stopping and cancelled; and its K moves."""
    target, draft = pair
    draft = gpt2np.NgramDrafter() if lookup else draft
    requests = heuristic_schedule(target)
    got, sizes, events = run_schedule(target, draft, requests)
    assert max(sizes) >= 3, sizes
    assert_each_as_alone(target, draft, requests, got, "K heuristic")
    proposed = [e.K for e in events[0]]
    assert len(set(proposed)) >= 3, f"the greedy heuristic request's K should move, drafted {proposed}"


def test_a_heuristic_sequence_joins_with_the_schedule_its_solo_rounds_left(pair):
    """A sampled "heuristic" run alone for 6 rounds (speculative_stream), then added to a batch beside another with
    its tokens as more prompt, its generator and a schedule moved by those 6 rounds (add(schedule=), as the server
    moves a request that started alone): its tokens are its whole solo run's. A fresh schedule in its place draws
    otherwise (the negative control), and the schedule given is the caller's still (the batch moves a copy)."""
    target, draft = pair
    prompt, n = target.tokenizer.encode(PROMPTS[0]), 60
    solo_tokens = speculative_generate(target, draft, prompt, n, "heuristic", temperature=0.9,
                                       rng=np.random.default_rng(4)).tokens

    def joined(carry):
        rng, schedule = np.random.default_rng(4), HeuristicK(8)
        stream = gpt2np.speculative_stream(target, draft, prompt, n, "heuristic", temperature=0.9, rng=rng)
        tokens = []
        for _ in range(6):
            event = next(stream)
            tokens += event.tokens
            schedule.update(event)
        stream.close()
        moved = schedule.K
        batch = ContinuousSpeculativeBatch(target, draft)
        other = batch.add(target.tokenizer.encode(PROMPTS[3]), 30, 2)
        mine = batch.add(prompt + tokens, n - len(tokens), "heuristic", temperature=0.9, rng=rng,
                         schedule=schedule if carry else None)
        while batch:
            batch.step()
        assert schedule.K == moved and batch.pop_tokens(other)
        return tokens + batch.pop_tokens(mine), moved
    carried, moved = joined(True)
    assert moved != HeuristicK(8).K, f"the 6 rounds should move the schedule from its start, K {moved}"
    assert carried == solo_tokens, "the sequence joined with its schedule differs from its solo run"
    assert joined(False)[0] != solo_tokens, "a fresh schedule should draw otherwise (else this test proves nothing)"


def test_a_schedule_is_for_heuristic_sequences_only(pair):
    target, draft = pair
    batch = ContinuousSpeculativeBatch(target, draft)
    for K, schedule in ((3, HeuristicK(8)), ("heuristic", object()), ("auto", HeuristicK(8))):
        with pytest.raises(ValueError, match="schedule is a HeuristicK to go on from, for K='heuristic' only") as e:
            batch.add([1, 2], 5, K, schedule=schedule)
        assert "\n" not in str(e.value) and len(batch) == 0


def test_a_schedule_shared_by_the_sequences_is_caught(pair, monkeypatch):
    """The negative control: one HeuristicK for every sequence (each round's K following the others' rounds too)
    and the sampled heuristic requests no longer equal their solo runs."""
    target, draft = pair
    shared = HeuristicK(8)
    monkeypatch.setattr(batched_speculative, "HeuristicK", lambda K_max: shared)
    requests = heuristic_schedule(target)
    got, _, _ = run_schedule(target, draft, requests)
    with pytest.raises(AssertionError, match="differs from its solo run"):
        assert_each_as_alone(target, draft, requests, got, "a shared schedule")


def test_a_round_interrupted_in_the_schedules_update_puts_them_back(pair, monkeypatch):
    """Ctrl-C in the third round after the first sequence's schedule moved and before the second's: the round is
    undone, the first schedule put back with its sequence's K, and both still equal their solo runs."""
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    requests = [dict(prompt=ids[1], n=30, K="heuristic", options=dict(temperature=0.8), seed=7, stops=None),
                dict(prompt=ids[0], n=30, K="heuristic", options={}, seed=None, stops=None)]
    calls, update = {"n": 0}, HeuristicK.update

    def interrupted(self, event):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        update(self, event)
    monkeypatch.setattr(HeuristicK, "update", interrupted)
    batch = ContinuousSpeculativeBatch(target, draft)
    handles = [batch.add(r["prompt"], r["n"], r["K"], rng=rng_of(r["seed"]), **r["options"]) for r in requests]
    assert steps_through_interrupts(batch) == 1
    monkeypatch.setattr(HeuristicK, "update", update)
    for i, (handle, r) in enumerate(zip(handles, requests)):
        assert batch.pop_tokens(handle) == solo(target, draft, r), f"request {i} differs from its solo run"


def test_prompt_lookup_sequences_ride_in_a_draft_model_batch_each_as_alone(pair, monkeypatch):
    """A batch whose draft is the draft model, with sequences that draft by their own prompt lookup (add(lookup=)),
    greedy and sampled, a fixed K and "heuristic", joining beside draft-model ones, a K 0 one and "auto" ones:
    each equals its solo run with its own drafter (auto: the target's greedy tokens), and the draft model is
    called for its own sequences only (none at all while only lookups draft)."""
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    drafted_rows = []
    packed = batched_speculative.packed_call
    monkeypatch.setattr(batched_speculative, "packed_call", lambda model, calls, n: (
        drafted_rows.append(sum(len(i) for i, _ in calls)) if model is draft else None) or packed(model, calls, n))
    requests = [  # prompt, n, K, lookup, temperature, seed, the round it joins
        (ids[1] * 2, 40, 3, True, 0.8, 7, 0), (ids[2] * 2, 30, "heuristic", True, 0, None, 0), (ids[3], 20, 0, False, 0,
        None, 0), (ids[0], 40, 4, False, 0.9, 3, 2), (ids[1], 30, "auto", False, 0, None, 3),
        (ids[0] * 2, 25, "heuristic", True, 1.0, 5, 4), (ids[3] * 3, 30, "auto", True, 0, None, 2)]
    batch, handles, step = ContinuousSpeculativeBatch(target, draft, K_max=4), {}, 0
    while step == 0 or batch or len(handles) < len(requests):
        for i, (prompt, n, K, lookup, temperature, seed, join) in enumerate(requests):
            if join == step:
                handles[i] = batch.add(prompt, n, K, temperature=temperature, rng=rng_of(seed),
                                       lookup=gpt2np.NgramDrafter() if lookup else None)
        if step == 1:
            assert drafted_rows == [], f"only lookups drafted in rounds 0-1, yet the draft model ran: {drafted_rows}"
        batch.step()
        step += 1
    for i, (prompt, n, K, lookup, temperature, seed, _) in enumerate(requests):
        mine = gpt2np.NgramDrafter() if lookup else draft
        want = (generate(target, prompt, n) if K in (0, "auto") and not temperature else
                speculative_generate(target, mine, prompt, n, K, temperature=temperature, rng=rng_of(seed)).tokens)
        assert batch.pop_tokens(handles[i]) == want, f"request {i} (K {K!r}, lookup {lookup}) differs from its solo run"
    assert drafted_rows, "the draft model's sequences drafted"
    with pytest.raises(ValueError, match="lookup must be prompt lookup"):
        batch.add(ids[0], 5, 2, lookup=draft)


def test_auto_lookups_in_a_draft_model_batch_have_a_policy_of_their_own(pair, monkeypatch):
    """An "auto" and a K = 3 sequence drafted by the draft model, an "auto" and a K = 2 one by their own prompt
    lookup, and a plain one: each policy is asked for its own "auto" sequence and told the 4 others' K;
    the lookups' policy prices no draft call (it is shown none) and learns from the lookups' rounds only, the draft
    model's from its own sequences' only (before, a lookup riding with a K of its own taught the draft model's
    policy its acceptance). Every sequence is greedy: the target's greedy tokens."""
    target, draft = pair
    asked, shown, choose, update = [], [], BatchAutoK.choose, BatchAutoK.update
    monkeypatch.setattr(BatchAutoK, "choose", lambda self, B, lag=0, horizon=None, fixed=(): asked.append(
        (self.c_prior == 0, B, len(fixed))) or choose(self, B, lag, horizon, fixed))
    monkeypatch.setattr(BatchAutoK, "update", lambda self, overlaps, rows, t, calls, first_round: shown.append(
        (self.c_prior == 0, sorted(overlaps), calls)) or update(self, overlaps, rows, t, calls, first_round))
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    batch = ContinuousSpeculativeBatch(target, draft, K_max=4)
    requests = [(ids[0], 30, "auto", False), (ids[1], 30, 3, False), (ids[3] * 3, 30, "auto", True),
                (ids[2] * 4, 30, 2, True), (ids[2], 30, 0, False)]
    handles = [batch.add(p, n, K, lookup=gpt2np.NgramDrafter() if lookup else None) for p, n, K, lookup in requests]
    while batch:
        batch.step()
    for i, (handle, (prompt, n, _, _)) in enumerate(zip(handles, requests)):
        assert batch.pop_tokens(handle) == generate(target, prompt, n), f"request {i} differs from greedy decoding"
    first = [(lookups, B, n_fixed) for lookups, B, n_fixed in asked[:2]]
    assert first == [(False, 1, 4), (True, 1, 4)], f"(the lookups' policy, B, sequences beside) first: {asked[:2]}"
    lookups, models = handles[2:4], [handles[0], handles[1], handles[4]]
    for is_lookup, seen, calls in shown:
        mine = lookups if is_lookup else models
        assert set(seen) <= set(mine), f"{'lookup' if is_lookup else 'draft model'} policy shown {seen}"
        assert not (is_lookup and calls), f"the lookups' policy was shown draft calls: {calls}"
    assert any(is_lookup and seen for is_lookup, seen, _ in shown) and any(calls for _, _, calls in shown)


def test_a_round_undone_puts_the_lookups_policy_back_too(pair, monkeypatch):
    """A round interrupted after both policies chose (Ctrl-C in verifying) leaves both as they were before it."""
    target, draft = pair
    ids = [target.tokenizer.encode(p) for p in PROMPTS]

    def verify(rounds, rngs):
        if calls.append(1) or len(calls) == 4:
            raise KeyboardInterrupt
        return batched_speculative.verify_each(rounds, rngs)
    calls, batch = [], ContinuousSpeculativeBatch(target, draft, K_max=4, verify=verify)
    batch.add(ids[0], 30, "auto")
    batch.add(ids[3] * 3, 30, "auto", lookup=gpt2np.NgramDrafter())
    batch.add(ids[1], 30, 2)  # a drafting round every round: verify is called in each
    for _ in range(3):
        batch.step()
    policies = batch.policy.policies
    before = {kind: p.snapshot() for kind, p in policies.items()}
    with pytest.raises(KeyboardInterrupt):
        batch.step()
    assert {kind: p.snapshot() for kind, p in policies.items()} == before, "the undone round is no policy's"


def test_the_joint_law_with_auto_lookup_beside_auto_drafting_is_the_product_of_the_targets_laws(monkeypatch):
    """Exact enumeration (toy pair, a scripted clock): one "auto" sequence drafted by the draft model, and a late
    joiner drafting by its own prompt lookup under the lookups' own policy; the joint law of their tokens is the
    product of the target's laws, and both policies' K varied."""
    target, draft, prompts, n_tokens = toy_pair()
    chosen = {True: set(), False: set()}
    choose = BatchAutoK.choose
    monkeypatch.setattr(BatchAutoK, "choose", lambda self, *a, **k: (lambda K: chosen[self.c_prior == 0].add(K) or K)(
        choose(self, *a, **k)))

    from gpt2np.decoding import continuous_speculative  # a cheap draft's prior, so that its policy drafts too
    monkeypatch.setattr(continuous_speculative, "batch_auto_K", lambda target, draft, K_max: BatchAutoK(
        K_max, 0.0 if batched_speculative.looks_up(draft) else 0.1))

    def run(rng):
        monkeypatch.setattr(batched_speculative, "time", ScriptedClock())  # a fresh clock: every path the same timings
        batch = ContinuousSpeculativeBatch(target, draft, K_max=3)
        first = batch.add(prompts[0], n_tokens[0], "auto", temperature=1.0, rng=RngView(rng),
                          lookup=gpt2np.NgramDrafter(n_max=2))
        batch.step()
        second = batch.add(prompts[1], n_tokens[1], "auto", temperature=1.0, rng=RngView(rng))
        while batch:
            batch.step()
        return tuple(batch.pop_tokens(first)), tuple(batch.pop_tokens(second))
    got, expected = exact_distribution(run), product_law(target, prompts, n_tokens)
    assert max_abs_difference(got, expected) <= EXACT, f"max |difference| {max_abs_difference(got, expected):.3g}"
    assert len(chosen[False]) >= 2 and chosen[True], f"the policies' K: {chosen}"


def test_a_round_undone_puts_the_policy_and_a_counting_lookup_back_too(pair, monkeypatch):
    """Two things an undone round left changed (an audit, interrupting every line of a round): the counting lookup's
    counts, when the interrupt came between its counting and its index's advance (the round done again counted the
    same positions twice, so a seeded sequence left its solo run), and the K policy, which kept what the undone
    round showed it (the round done again chose its K from the coins it was about to redraw: K must be a function
    of the past; and an interrupt inside its update left a timing without its round number, KeyError for ever).
    Now both are put back: every sequence equals its solo run, and the policy is as before the round."""
    from gpt2np.decoding.drafters import CountingNgramDrafter, NgramDrafter
    target, _ = pair
    ids = [target.tokenizer.encode(p + p) for p in PROMPTS[:3]]
    lookup = CountingNgramDrafter()
    index, calls = NgramDrafter.update_index, {"n": 0}

    def counted_then_stopped(self, context):  # the counting kind counts first, then calls this
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return index(self, context)
    monkeypatch.setattr(NgramDrafter, "update_index", counted_then_stopped)
    batch = ContinuousSpeculativeBatch(target, lookup)
    requests = [dict(prompt=p, n=16, K=k, seed=s, options=dict(temperature=0.9), stops=None)
                for p, k, s in zip(ids, [3, 2, 4], [1, 2, 3])]
    handles = [batch.add(r["prompt"], r["n"], r["K"], rng=rng_of(r["seed"]), **r["options"]) for r in requests]
    batch.step(), batch.step()
    with pytest.raises(KeyboardInterrupt):
        batch.step()
    monkeypatch.setattr(NgramDrafter, "update_index", index)
    for seq in batch._running.values():  # its counts as a drafter that never stopped would count this context
        fresh = CountingNgramDrafter()
        fresh.reset(target)
        for drafter in (seq.drafter, fresh):
            drafter.update_index(seq.context)
        assert seq.drafter.followers == fresh.followers, "counts left ahead of the index"
    while batch:
        batch.step()
    assert [batch.pop_tokens(h) for h in handles] == [solo(target, lookup, r) for r in requests]

    update, seen = BatchAutoK.update, []

    def stopped_inside(self, overlaps, rows, *rest, **more):  # a timing kept, its round number not yet written
        update(self, overlaps, rows, *rest, **more)
        seen.append(rows)
        if len(seen) == 3:
            self.last_timed.pop(rows, None)
            raise KeyboardInterrupt
    monkeypatch.setattr(BatchAutoK, "update", stopped_inside)
    batch = ContinuousSpeculativeBatch(target, gpt2np.NgramDrafter())
    auto = [batch.add(p, 16, "auto") for p in ids]
    batch.step(), batch.step()
    before = batch.policy.policy.snapshot()
    with pytest.raises(KeyboardInterrupt):
        batch.step()
    assert batch.policy.policy.snapshot() == before, "the undone round is not the policy's either"
    while batch:
        batch.step()
    assert [batch.pop_tokens(h) for h in auto] == [generate(target, p, 16) for p in ids]
