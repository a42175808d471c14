"""Continuous batching with drafting: speculative sequences join and leave a running batch at any round.

continuous.py does this for plain decoding; batched_speculative.py drafts for a fixed list of prompts.
A server has neither: requests that ask for drafting arrive while others are half done. Here every
`step` is one round of batched_speculative.batch_round over the sequences running then, so it keeps
that file's promises: the draft model's calls packed (one per draft step), ONE packed target call for
every sequence's newest token and k_i drafts, each sequence verified with its own rng and rolled back
on its own caches. A sequence added since the last step feeds its whole prompt in that round (to the
target in the packed call, to the draft in the first draft step): prefill joins the round. With
prefill_chunk=n a longer prompt is fed n rows a round instead, to the target and (if it drafts with the
model) to the draft, in the calls the round makes for the others; it draws nothing until its prompt is in,
so the others' rounds stay short (a 355M pass over 1,000 prompt rows takes ~4 s on a 2-core EPYC).

    round r      target rows [prompt of c | a's newest + 4 drafts | b's newest + 4 drafts]
    round r + 1  target rows [c's newest + 4 drafts | b's newest + 4 drafts]     a finished in round r

K per sequence: an int (that many drafts a round, clamped to what it still wants; 0 is plain
decoding), "heuristic" (its own HeuristicK, moved by its own rounds only, as speculative_generate's) or
"auto": then batch_policy.BatchAutoK picks one K a round for every "auto" sequence from the batch's
measured costs, so drafting stops as the batch fills (the goodput rule); sequences that draft by their own prompt
lookup in a draft model's batch have a BatchAutoK of their own (AutoKForSome). A round in which a sequence
joined carries prompts, so its timing is not shown to the policy.

Exactness is batched_speculative's: a sequence with a fixed K (or "heuristic") gets exactly what speculative_generate
gives it alone with an identically seeded rng (greedy: the target's own greedy tokens), whatever
joins or leaves around it, up to the float32 rounding of packed products (~1e-5, a flip only at a
near tie). With K="auto" its K depends on the batch, so it gets the target's law, not the solo run's
draws.

>>> from gpt2np.decoding.speculative import speculative_generate
>>> from gpt2np.teach.toy_models import random_toy_model
>>> rng = np.random.default_rng(0)
>>> target, draft = random_toy_model(rng, n_vocab=4, order=3), random_toy_model(rng, n_vocab=4)
>>> batch = ContinuousSpeculativeBatch(target, draft)
>>> a = batch.add([0], 6, K=2)
>>> first = batch.step()                     # a alone: its prompt, its first round
>>> b = batch.add([1, 2], 4, K=3)            # b joins the running batch
>>> while batch:
...     _ = batch.step()
>>> [batch.pop_tokens(h) == speculative_generate(target, draft, p, n, K=k).tokens
...  for h, p, n, k in ((a, [0], 6, 2), (b, [1, 2], 4, 3))]
[True, True]
"""
import numpy as np

from .autoregressive import check_model
from .batched import check_sequence
from .batched_speculative import (batch_auto_K, batch_round, check_draft_model, check_draft_room, draft_debt,
                                  looks_up, new_sequence, not_batched, own_drafter, roll_back_each, verify_each)
from .continuous import Handles, check_prefill_chunk, check_rng_unshared, generator_state, set_generator_state
from .policies import HeuristicK, checked_K_max
from .speculative import DEFAULT_K

USAGE = "ContinuousSpeculativeBatch(target, draft).add(prompt_ids, n_tokens, K, ...)"


def check_K(K, K_max):  # -> (K for the Sequence, whether the batch's policy chooses it)
    """An int >= 0 (0: plain decoding), "heuristic" (the sequence's own schedule, batched_speculative.new_sequence)
    or "auto" (at most K_max, chosen each round by the policy)."""
    if isinstance(K, str) and K in ("auto", "heuristic"):
        return (K_max, True) if K == "auto" else (K, False)
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 0:
        raise ValueError(f"K (draft tokens per round) must be an integer >= 0 (0: plain decoding), 'heuristic' or "
                         f"'auto', got {K!r}")
    return int(K), False


class AutoKForSome:
    """BatchAutoK for the sequences that asked for K="auto": each round it sets their K, each capped by
    its own K_max (the others keep their own K), and hides from the policy the timing of rounds that
    carry a newcomer's prompt. The policy chooses for the "auto" sequences (their number, what their draft
    lacks, the tokens they want) and is told the others' K: their rows share the pass, their tokens count,
    whatever it chooses (a server's plain requests ride in the batch with K = 0). A sequence that only feeds a
    chunk of its prompt this round (`feeding`) is in neither: it drafts nothing and draws nothing.

    Two kinds of sequence share a draft model's batch: those the draft model drafts for, priced by `policy`, and
    those that draft by their own prompt lookup (add(lookup=)), priced by policies["lookup"] (no model call to pay,
    and an acceptance of their own): each policy learns from its own kind's rounds only and chooses for its own
    "auto" sequences, told the other kind's K (the draft model's kind first; the lookup's as it chose last round)."""

    def __init__(self, policy, seqs, auto, newcomers, feeding, own_lookup=lambda s: False):
        self.policy, self.seqs, self.auto, self.newcomers, self.feeding = policy, seqs, auto, newcomers, feeding
        self.policies = {"draft": policy, "lookup": None}  # the lookups': the batch makes it when one first joins
        self.own_lookup, self.last = own_lookup, {}  # own_lookup(sequence): whether it is the lookup's kind

    def kind(self, handle):
        return "lookup" if self.own_lookup(self.seqs[handle]) else "draft"

    def choose(self, B, lag, horizon):  # -> None: batch_round then takes each sequence's own K
        # (B, lag, horizon are the whole batch's: each policy is asked for its "auto" sequences' own)
        auto = [handle for handle in self.auto if handle not in self.feeding]
        for handle in auto:  # the lookup's kind as it chose last, until it chooses this round (after the other)
            if self.kind(handle) == "lookup":
                self.seqs[handle].K = min(self.last.get("lookup", 0), self.auto[handle])
        for kind in ("draft", "lookup"):
            mine = [handle for handle in auto if self.kind(handle) == kind]
            if mine:
                fixed = [s.k() for handle, s in self.seqs.items() if handle not in mine and handle not in self.feeding]
                K = self.last[kind] = self.policies[kind].choose(len(mine), *draft_debt(self.seqs, mine), fixed=fixed)
                for handle in mine:
                    self.seqs[handle].K = min(K, self.auto[handle])
        return None

    def update(self, overlaps, rows, target_seconds, draft_calls, first_round):  # overlaps: {handle: [overlaps]}
        # (first_round is batch_round's, the draft model's policy's: each policy's own first round is asked below)
        kinds = {self.kind(handle) for handle in self.auto}
        for kind in kinds:  # each learns from its own kind's rounds, and prices the draft model's calls or none
            seen = {handle: o for handle, o in overlaps.items() if self.kind(handle) == kind}
            policy = self.policies[kind]
            policy.update(seen, rows, target_seconds, draft_calls if kind == "draft" else [],
                          first_round=policy.t == 1 or bool(self.newcomers))
        for handle, cap in self.auto.items():  # until the next choice: what the draft would owe if they draft
            self.seqs[handle].K = cap

    @property
    def t(self):  # batch_round asks whether this is the policy's first round
        return self.policy.t

    def snapshot(self):  # -> what restore puts back (ContinuousSpeculativeBatch.step)
        return dict(self.last), {kind: p.snapshot() for kind, p in self.policies.items() if p is not None}

    def restore(self, state):
        self.last, states = dict(state[0]), state[1]
        for kind, policy_state in states.items():
            self.policies[kind].restore(policy_state)


class ContinuousSpeculativeBatch(Handles):
    """Running speculative sequences, one batch round per step; any may join or leave between rounds.

    add(...) -> a handle (an int); step() -> [(handle, RoundEvent)], one per sequence in the round; a
    sequence that finished (n_tokens, a stop token, eot_id) has left when step returns and its tokens
    stay readable once with pop_tokens(handle). draft: a model of the target's vocabulary, or prompt lookup
    (an NgramDrafter: each sequence looks up its own context). prefill_chunk: the most prompt rows a
    sequence feeds in a round (None: its whole prompt in its first round). verify and roll_back exist for
    teaching, as in speculative_batch_stream (teach/broken_batch_kernels.py)."""

    def __init__(self, target, draft, K_max=8, *, prefill_chunk=None, verify=verify_each, roll_back=roll_back_each):
        check_model(target, "target", USAGE)
        check_draft_model(target, draft, USAGE)
        self.target, self.draft, self.K_max = target, draft, checked_K_max(K_max)
        self.prefill_chunk, self.verify, self.roll_back = check_prefill_chunk(prefill_chunk), verify, roll_back
        self._running, self._finished, self._first, self._next = {}, {}, None, 0
        self._auto, self._newcomers, self._feeding = {}, set(), {}  # _auto: handle -> its K_max ("auto" sequences)
        model_drafts = not looks_up(draft)
        self.policy = AutoKForSome(batch_auto_K(target, draft, self.K_max), self._running, self._auto,
                                   self._newcomers, self._feeding,
                                   own_lookup=lambda s: model_drafts and s.drafter is not None)

    def add(self, prompt_ids, n_tokens, K=DEFAULT_K, temperature=None, top_k=None, top_p=None, rng=None, *,
            stop_tokens=None, K_max=None, lookup=None, schedule=None):
        """Check one request as speculative_generate checks it (one-line ValueError) and put it in the
        batch; its prompt is fed in the next round. Returns its handle. K_max caps a K="auto" sequence's
        K (default, and at most: the batch's K_max) and bounds a K="heuristic" one's schedule (default: the
        batch's K_max), as speculative_generate's K_max does alone. lookup: prompt lookup (an NgramDrafter) this
        sequence drafts with instead of the batch's draft (its own copy, its own context), so that it shares the
        batch's target pass; with K="auto" a policy of the lookups' own chooses its K (AutoKForSome). schedule:
        with K="heuristic", the schedule to go on from (a HeuristicK, copied: a request that ran alone so far joins
        with the K its rounds left it at, so it drafts what it would alone)."""
        cap = self.K_max if K_max is None else checked_K_max(K_max)
        K, auto = check_K(K, min(cap, self.K_max))
        if schedule is not None and (K != "heuristic" or not isinstance(schedule, HeuristicK)):
            raise ValueError(f"schedule is a HeuristicK to go on from, for K='heuristic' only; got {schedule!r} "
                             f"with K={K!r}")
        if lookup is not None and not looks_up(lookup):
            raise ValueError(f"lookup must be prompt lookup (gpt2np.NgramDrafter), {not_batched(lookup)}")
        options, stops = check_sequence(self.target, prompt_ids, n_tokens, temperature, top_k, top_p, rng,
                                        stop_tokens)
        if K and lookup is None:
            check_draft_room(self.draft, prompt_ids, n_tokens)  # the draft sees it too
        check_rng_unshared(rng, options, self._running.values())
        handle = self._new_handle()  # the target holds context[:-1] and at most k <= wanted - 1 drafts
        self._running[handle] = new_sequence(self.target, self.draft, [int(t) for t in prompt_ids], int(n_tokens), K,
                                             options, rng, stops, cap, lookup, schedule)
        self._newcomers.add(handle)
        if auto:
            self._auto[handle] = K
        if auto and lookup is not None and self.policy.policies["lookup"] is None:  # the lookups' own policy
            self.policy.policies["lookup"] = batch_auto_K(self.target, lookup, self.K_max)
        return handle

    def cancel(self, handle):
        """Take a running sequence out now (its client left); True if it was running. A handle is an
        int add returned (anything else is a TypeError)."""
        handle = self._int_handle(handle, "cancel({})")
        self._auto.pop(handle, None)
        self._newcomers.discard(handle)
        return self._running.pop(handle, None) is not None

    def step(self):  # -> [(handle, RoundEvent)]
        """One round of every running sequence (batch_round); finished sequences leave before it returns.
        If it raises, nothing changed: every sequence's caches, context, generator and lookup index, and the K
        policy's state, are put back. (The policy once kept what the undone round showed it, so the round done
        again, drawing the same coins, chose its K from those coins: K must be a function of the past only.)"""
        if not self._running:
            return []
        newcomers, auto, seen = set(self._newcomers), dict(self._auto), self.policy.snapshot()
        try:
            return self._undoable(self._round, keep, put_back)
        except BaseException:
            self._newcomers.update(newcomers)  # their prompts are fed again: the round is not the policy's to time
            self._auto.update(auto)
            self.policy.restore(seen)
            raise

    def _round(self):
        self._feeding.clear()  # the sequences with more prompt left to feed than a chunk: a chunk this round
        chunk = self.prefill_chunk
        self._feeding.update({h: chunk for h, s in self._running.items()
                              if chunk is not None and len(s.context) - len(s.target_cache) > chunk})
        running = [h for h in self._running if h not in self._feeding]
        events = batch_round(self.target, self.draft, self._running, running, self.verify, self.roll_back,
                             self.policy, self._feeding)
        self._newcomers.intersection_update(self._feeding)  # their next round feeds prompt rows too
        for handle in [h for h, s in self._running.items() if not s.running()]:
            seq = self._running.pop(handle)  # it leaves now: its last token is never fed
            self._auto.pop(handle, None)
            self._finished[handle] = seq.context[len(seq.prompt):]
        return events

    def tokens_of(self, handle):
        """The tokens a sequence has emitted so far (running, or finished and not yet popped)."""
        seq = self._running.get(handle) if self._is_handle(handle) else None
        if seq is not None:
            return list(seq.context[len(seq.prompt):])
        return list(self._finished[self._finished_handle(handle, "tokens_of")])


def keep(seq):  # -> what put_back restores (ContinuousSpeculativeBatch.step)
    return (len(seq.target_cache), None if seq.draft_cache is None else len(seq.draft_cache), len(seq.context),
            len(seq.provenance), seq.K, generator_state(seq.rng))


def put_back(seq, kept):  # a Sequence where an undone round found it
    n_target, n_draft, n_context, n_emitted, seq.K, state = kept
    if seq.schedule is not None:  # K="heuristic": its schedule is where its K was
        seq.schedule.K = seq.K
    seq.target_cache.truncate(n_target)
    if seq.draft_cache is not None:
        seq.draft_cache.truncate(n_draft)
    if seq.drafter is not None:  # a lookup stopped mid-update (the counting kind's counts ahead of its index):
        seq.drafter = own_drafter(seq.drafter, seq.drafter)  # a fresh one, indexing the context at its next lookup
    del seq.context[n_context:], seq.provenance[n_emitted:]
    set_generator_state(seq.rng, state)
