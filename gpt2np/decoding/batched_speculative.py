"""Speculative decoding of several sequences at once: packed draft calls, ONE packed target call per round.

Leviathan et al. 2023 (Algorithm 1), the single-sequence loop of speculative.py, run for a batch the
way batched.py runs plain decoding (Orca's selective batching, model/batch.py). One round, for every
sequence still running (the step numbers of Algorithm 1):
  Step 0    k_i = min(K_i, tokens still wanted - 1), as speculative.py clamps K (K_i = 0: a plain step;
            every k_i = 0: the round is batched.py's plain step, one packed call and next_token each);
            K="auto": one K from BatchAutoK, told the rows the draft caches lack (draft_debt)
  Step 1    draft step j = 1..max k_i: ONE packed draft call for the sequences with k_i >= j, each
            feeding what its draft cache lacks (its first step: the prompt, or the 1-2 tokens it is
            behind), then x_j ~ q_j from its own rng
  Step 2    ONE packed target call: sequence i feeds the newest token (the prompt in its first round)
            and its k_i drafts, and gets its k_i + 1 rows p_1..p_{k_i+1}
  Step 3-4  each sequence's verify_round (speculative_kernel.py), with its own rng and options
  then each sequence rolls back its own target and draft caches to its own new context[:-1].

Exactness. The rng of sequence i is drawn only for sequence i, and in the order speculative.py draws
it: x_1..x_k, then the coins, then the target's token. So with an identically seeded rng each
sequence gets exactly what speculative_generate(target, draft, prompts[i], n_tokens[i], K_i, ...)
gives it alone (with K_i = 0: what generate gives it), and the sequences are independent: the joint
law of the batch is the product of the target's laws (tests/decoding/test_batched_speculative.py
enumerates it). As in batched.py, a GPT2's packed logits differ from the solo run's only by float32
rounding (~1e-5): a draw flips only at a near tie. Toy models (teach/toy_models.py) run one forward
call per sequence (forward_separately): the solo run, bit for bit.

Both caches are sized prompt + n_tokens - 1 (batched.request_cache): the target holds context[:-1]
plus at most k drafts, and k <= tokens still wanted - 1, so it never needs more than plain decoding.
A sequence's RoundEvent is speculative.py's (no q and p rows); its seconds and propose_seconds are
the whole batch round's, shared by the sequences in it.

>>> from gpt2np.decoding.autoregressive import generate
>>> from gpt2np.teach.toy_models import random_toy_model
>>> rng = np.random.default_rng(0)
>>> target, draft = random_toy_model(rng, n_vocab=4, order=3), random_toy_model(rng, n_vocab=4)
>>> out = speculative_generate_batch(target, draft, [[0], [1, 2]], n_tokens=[5, 3], K=[2, 0])
>>> out == [generate(target, [0], 5), generate(target, [1, 2], 3)]
True
"""
import copy
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..model.batch import forward_packed, forward_separately
from ..model.fast.layout import all_small, weights_order
from ..model.fast.matmul import PANEL_PADDED_ROWS
from ..model.forward import GPT2
from .autoregressive import MODEL_INTERFACE, check_generation_request, check_model
from .batch_policy import FEW_ROWS, BatchAutoK
from .policies import HeuristicK, checked_K_max
from .batched import BatchStep, BatchStream, check_batch, each_checked, per_sequence, request_cache
from .drafters import ModelDrafter, NgramDrafter, check_same_vocabulary, one_hot_rows, parameter_ratio
from .sampling import distribution, is_greedy, next_token, sample
from .speculative import DEFAULT_K, round_tokens, tree_view
from .speculative_kernel import verify_round
from .stream import RoundEvent
from .tree_drafters import NgramTreeDrafter
from .tree_kernel import chain_round_result

USAGE = "speculative_generate_batch(target, draft, prompts, n_tokens, ...)"


@dataclass
class Sequence:
    """One request of the batch and where it stands: its context grows by each round's tokens."""
    prompt: list
    n_tokens: int
    K: int
    options: dict         # temperature, top_k, top_p (checked)
    rng: object
    stops: frozenset      # eot_id and its stop tokens
    target_cache: object
    draft_cache: object   # None with prompt lookup: it reads the context, no model
    context: list = field(default_factory=list)     # prompt + tokens emitted so far
    provenance: list = field(default_factory=list)  # one per emitted token
    drafter: object = None  # prompt lookup: this sequence's own NgramDrafter (its own index of its own context)
    schedule: object = None  # K="heuristic": this sequence's own HeuristicK (K follows its own rounds only)

    def running(self):  # speculative_rounds' loop condition
        return len(self.provenance) < self.n_tokens and not (self.provenance and self.context[-1] in self.stops)

    def k(self):  # Step 0: K clamped, never more tokens than asked for
        return min(self.K, self.n_tokens - len(self.provenance) - 1)


def packed_call(model, calls, n_logits):  # [(ids_i, cache_i)], [B] -> B x [n_logits_i, n_vocab]
    """A GPT2 in one packed forward pass; any other model of the interface one forward call each."""
    if isinstance(model, GPT2):
        return forward_packed(model, calls, n_logits)
    return forward_separately(model, calls, n_logits)


def check_Ks(K, n, K_max):  # -> [n] ints >= 0 or "heuristic" (K="auto": K_max each, the most the policy may ask)
    """K: one int >= 0 or "heuristic" for every sequence or one per prompt (0: that sequence decodes plainly;
    "heuristic": its own HeuristicK, within 1..K_max), or "auto" for all (batch_policy.BatchAutoK, at most
    K_max drafts a round)."""
    K_max = checked_K_max(K_max)  # checked whatever K is, as speculative_generate checks it
    if isinstance(K, str) and K == "auto":
        return [K_max] * n
    Ks = per_sequence(K, n, "K")

    def checked(i):
        if isinstance(Ks[i], str) and Ks[i] == "heuristic":
            return Ks[i]
        if isinstance(Ks[i], bool) or not isinstance(Ks[i], (int, np.integer)) or Ks[i] < 0:
            raise ValueError(f"K (draft tokens per round) must be an integer >= 0 (0: plain decoding) or "
                             f"'heuristic', or 'auto' for every sequence, got {Ks[i]!r}")
        return int(Ks[i])
    return each_checked(n, checked)


def looks_up(draft):
    """Prompt lookup (NgramDrafter and its counting kind, chains): each sequence drafts from its own context,
    with no model call to pack; only the target's pass is shared. A tree drafter is not (a batch drafts chains)."""
    return isinstance(draft, NgramDrafter) and not isinstance(draft, NgramTreeDrafter)


def own_drafter(draft, target):  # -> a fresh copy of a lookup drafter for one sequence, nothing indexed yet
    """target: what reset reads, the vocabulary's size (n_vocab): the target, or a drafter already reset."""
    mine = copy.copy(draft)
    mine.reset(target)  # its own index (and counts): sequences never see each other's contexts
    return mine


def check_draft_model(target, draft, usage=USAGE):
    """The draft is a model (the batches pack its calls) of the target's vocabulary, or prompt lookup."""
    if looks_up(draft):
        return
    if not all(hasattr(draft, name) for name in MODEL_INTERFACE):
        raise ValueError(f"draft must be a model (gpt2np.load_model, gpt2np.random_model) or prompt lookup "
                         f"(gpt2np.NgramDrafter), {not_batched(draft)}: {usage}")
    check_same_vocabulary(target, draft)


def not_batched(draft):  # -> what the refusal says of the draft that was given
    """A drafter is refused for what it is: a draft model's drafter is a model the batch could pack (pass
    its model)."""
    if isinstance(draft, ModelDrafter):
        return f"got {type(draft).__name__}: pass its model, draft.model (the batch packs the draft model's calls)"
    if isinstance(draft, NgramTreeDrafter):
        return f"got {type(draft).__name__}: a batch drafts chains (token trees run one prompt at a time)"
    return f"got {type(draft).__name__}"


def check_draft_room(draft, prompt, n_tokens):
    """The draft's context holds the prompt and n_tokens too; the error says it is the draft's. Prompt lookup
    has no context of its own to run out of."""
    if looks_up(draft):
        return
    try:
        check_generation_request(draft, prompt, n_tokens)
    except ValueError as error:
        raise ValueError(f"draft: {error}, or pass K=0 (plain decoding: the draft never sees it)") from None


def check_draft(target, draft, prompts, n_tokens, Ks):
    """The draft is a model of the target's vocabulary with room for every sequence that drafts, or prompt
    lookup (check_draft_room)."""
    check_draft_model(target, draft)
    # K = 0: the draft never sees that sequence
    each_checked(len(Ks), lambda i: Ks[i] and check_draft_room(draft, prompts[i], n_tokens[i]))


def open_sequences(target, draft, prompts, n_tokens, K, K_max, temperature, top_k, top_p, rng, stop_tokens):
    """Every sequence's request checked (batched.check_batch, then K and the draft) before any work."""
    check_model(target, "target", USAGE)
    prompts, n_tokens, options, rngs, stops = check_batch(target, prompts, n_tokens, temperature, top_k, top_p,
                                                          rng, stop_tokens)
    Ks = check_Ks(K, len(prompts), K_max)
    check_draft(target, draft, prompts, n_tokens, Ks)
    return [new_sequence(target, draft, [int(t) for t in p], n, k, o, r, s, K_max)
            for p, n, k, o, r, s in zip(prompts, n_tokens, Ks, options, rngs, stops)]


def new_sequence(target, draft, prompt, n_tokens, K, options, rng, stops, K_max=8, lookup=None,
                 schedule=None):  # -> its Sequence
    """Both caches sized prompt + n_tokens - 1 (the module docstring); prompt lookup (the batch's draft, or
    `lookup`: this sequence's own in a batch whose draft is a model, ContinuousSpeculativeBatch.add): no draft
    cache, its own drafter instead. K "heuristic": its own schedule within 1..K_max, where speculative_generate's
    starts, or a copy of `schedule` (a HeuristicK: where a run's rounds so far left it)."""
    room, mine = len(prompt) + n_tokens - 1, draft if lookup is None else lookup
    looking = looks_up(mine)
    if K != "heuristic":
        schedule = None
    elif schedule is None:
        schedule = HeuristicK(int(K_max))
    else:
        schedule = copy.copy(schedule)  # its own: the batch moves it round by round
    return Sequence(prompt, n_tokens, K if schedule is None else schedule.K, options, rng, stops,
                    request_cache(target, room), None if looking else request_cache(draft, room),
                    context=list(prompt), drafter=own_drafter(mine, target) if looking else None, schedule=schedule)


def follow_schedules(seqs, events):  # [(i, RoundEvent)]: each "heuristic" sequence's K after its round
    """HeuristicK.update from the sequence's own round, as speculative_generate updates its policy after each
    round: K is a function of that sequence's own past only, so it drafts what it would alone."""
    for i, event in events:
        if seqs[i].schedule is not None:
            seqs[i].schedule.update(event)
            seqs[i].K = seqs[i].schedule.K
    return events


def draft_all(draft, seqs, ks, feeds=()):  # Step 1 -> {i: drafts [k_i]}, {i: q [k_i, n_vocab]}, [(rows, seconds)]
    """x_1..x_{k_i} for every sequence, one packed draft call per draft step for all that still draft;
    each draws from its own q with its own rng (ModelDrafter.propose, sequence by sequence). Each
    step's rows and seconds (its call and draws): the first step's rows carry what the caches lack.
    Prompt lookup: each sequence's own drafter looks up its own context (look_up_all), the batch's draft or,
    in a batch whose draft is a model, that sequence's own. feeds: prompt chunks for draft caches (prompt_chunks),
    in the first step's call (or a call of their own where no sequence drafts with the model)."""
    looked = {i: k for i, k in ks.items() if seqs[i].drafter is not None}
    if looked:
        found, found_q, _ = look_up_all(seqs, looked)
        drafts, q, timed = draft_all(draft, seqs, {i: k for i, k in ks.items() if i not in looked}, feeds)
        return {**drafts, **found}, {**q, **found_q}, timed
    if not any(ks.values()):
        return {i: [] for i in ks}, {i: np.zeros((0, draft.n_vocab)) for i in ks}, feed_prompts(draft, feeds)
    drafts, q, timed = {i: [] for i in ks}, {i: [] for i in ks}, []
    for j in range(max(ks.values())):
        start, active = time.perf_counter(), [i for i in ks if ks[i] > j]
        calls = [(seqs[i].context[len(seqs[i].draft_cache):] if j == 0 else drafts[i][-1:], seqs[i].draft_cache)
                 for i in active]  # x_k is never fed: the round ends before anyone needs q_{k+1}
        calls += list(feeds) if j == 0 else []  # their logits are not read (zip stops at `active`)
        for i, logits in zip(active, packed_call(draft, calls, 1)):
            s, q_i = seqs[i], distribution(logits[-1], **seqs[i].options)  # [n_vocab]
            drafts[i].append(int(np.argmax(q_i)) if is_greedy(s.options["temperature"]) else sample(q_i, s.rng))
            q[i].append(q_i)
        timed.append((sum(len(ids) for ids, _ in calls), time.perf_counter() - start))
    return drafts, {i: np.array(q[i], dtype=np.float64).reshape(ks[i], draft.n_vocab) for i in ks}, timed


def look_up_all(seqs, ks):  # Step 1, prompt lookup -> {i: drafts [<= k_i]}, {i: q}, [] (no model call)
    """Each sequence's own lookup (NgramDrafter.propose on its own context, with its own rng: none for a one-hot
    q), as speculative.py's Step 1 calls it alone; it may find fewer than k_i drafts, or none."""
    drafts, q = {}, {}
    for i, k in ks.items():
        s = seqs[i]  # k = 0 (plain this round): no lookup, no drafts
        found, q[i] = (s.drafter.propose(s.context, k, s.options, s.rng) if k else
                       ([], one_hot_rows([], s.drafter.n_vocab)))
        drafts[i] = [int(x) for x in found]
    return drafts, q, []


def score_all(target, seqs, drafts, feeds=()):  # Step 2 -> {i: p [k_i+1, n_vocab]}, rows fed in all
    """ONE packed target call: each sequence's uncached tokens and drafts, its last k_i + 1 rows; and the
    prompt chunks of the sequences that only feed this round (prompt_chunks), whose logits are not read."""
    running = list(drafts)
    calls = [(seqs[i].context[len(seqs[i].target_cache):] + drafts[i], seqs[i].target_cache) for i in running]
    logits = packed_call(target, calls + list(feeds), [len(drafts[i]) + 1 for i in running] + [1] * len(feeds))
    p = {i: distribution(rows, **seqs[i].options) for i, rows in zip(running, logits)}
    return p, sum(len(ids) for ids, _ in calls + list(feeds))


def prompt_chunks(seqs, feeding):  # {i: n} -> [(ids, target cache)], [(ids, draft cache)]
    """Each feeding sequence's next n prompt rows for its target cache, and for its draft cache where it drafts
    with a model (K >= 1): a long prompt enters a chunk a round (ContinuousSpeculativeBatch's prefill_chunk), fed
    to both models in the calls the round makes anyway, while the others' rounds go on. Its last token is never in
    a chunk (the round that feeds it draws the sequence's first token: an ordinary round)."""
    def chunk(s, cache, n):
        return s.context[len(cache):len(cache) + n], cache
    fed = [(seqs[i], n) for i, n in feeding.items()]
    return ([chunk(s, s.target_cache, n) for s, n in fed],
            [chunk(s, s.draft_cache, n) for s, n in fed if s.draft_cache is not None and s.K >= 1])


def feed_prompts(model, feeds):  # [(ids, cache)] -> [(rows, seconds)]: one packed call that only fills caches
    """Prompt chunks for a model that is asked nothing else this round (no sequence drafts with it)."""
    if not feeds:
        return []
    start = time.perf_counter()
    packed_call(model, feeds, 1)
    return [(sum(len(ids) for ids, _ in feeds), time.perf_counter() - start)]


def verify_each(rounds, rngs):  # Steps 3-4: [(drafts, q, p, greedy)] -> [RoundResult]
    """Each sequence's own verify_round with its own rng: the batch's sequences stay independent."""
    return [verify_round(drafts, q, p, rng, greedy=greedy) for (drafts, q, p, greedy), rng in zip(rounds, rngs)]


def roll_back_each(pairs):  # [(cache, n_keep)]
    """Each cache forgets what follows its own sequence's accepted context (nothing if it is shorter)."""
    for cache, n_keep in pairs:
        cache.truncate(min(n_keep, len(cache)))


def round_event(s, drafts, q, p, result, propose_seconds):  # -> (RoundEvent, n_keep)
    """A sequence's round as speculative.speculative_round reports it, and its new context[:-1] length."""
    result = chain_round_result(drafts, result)
    emitted, provenance = round_tokens(result, s.stops)
    n_keep = len(s.context) + len(emitted) - 1
    s.context += emitted
    s.provenance += provenance
    q_at, p_at, overlaps, parents = tree_view(drafts, q, None, p, result)
    decisions = [True] * len(result.path) + [False] * (result.kind == "resample")
    return RoundEvent(
        tokens=emitted, provenance=provenance, K=len(drafts), n_emitted=len(s.provenance), drafts=drafts,
        q_at_drafts=q_at, p_at_drafts=p_at, decisions=decisions, overlaps=overlaps, propose_seconds=propose_seconds,
        parents=parents, path=result.path, tried=result.tried), n_keep


def draft_debt(seqs, running):  # -> (rows the draft lacks beyond one per sequence, tokens still wanted)
    """What drafting this round would owe (BatchAutoK prices it): the sequences that could draft
    (k >= 1) feed the draft every token since its cache's end, one of them a regular step's."""
    lag = sum(len(s.context) - len(s.draft_cache) - 1 for s in (seqs[i] for i in running)
              if s.k() >= 1 and s.draft_cache is not None)  # prompt lookup owes nothing
    return lag, sum(seqs[i].n_tokens - len(seqs[i].provenance) for i in running)


def choose_K(policy, seqs, running):  # Step 0: K for every running sequence (None: each its own K)
    """policy.choose(B, lag, horizon): the batch's size and what drafting would owe (draft_debt)."""
    return None if policy is None else policy.choose(len(running), *draft_debt(seqs, running))


def plain_round(target, seqs, running, feeds=()):  # -> [(i, token)], rows fed
    """Every k_i = 0: batched.py's step. One packed target call, each sequence's next_token from its
    own rng (verify_round with no drafts draws the same), its target cache left holding context[:-1];
    the prompt chunks of the sequences that only feed (prompt_chunks) ride in the same call."""
    calls = [(seqs[i].context[len(seqs[i].target_cache):], seqs[i].target_cache) for i in running] + list(feeds)
    tokens = [(i, next_token(rows[-1], rng=seqs[i].rng, **seqs[i].options))
              for i, rows in zip(running, packed_call(target, calls, 1))]
    for i, token in tokens:
        seqs[i].context.append(token)
        seqs[i].provenance.append("target")
    return tokens, sum(len(ids) for ids, _ in calls)


def plain_events(seqs, tokens, seconds):  # -> [(i, RoundEvent)]: a plain step's, as batched.py's
    return [(i, RoundEvent(tokens=[t], provenance=["target"], K=0, n_emitted=len(seqs[i].provenance),
                           seconds=seconds)) for i, t in tokens]


def batch_round(target, draft, seqs, running, verify, roll_back, policy, feeding=None):  # -> [(i, RoundEvent)]
    """One round of every running sequence: Steps 0-4, then each rolls its own caches back. feeding: {i: n}, the
    sequences that only feed the next n rows of a long prompt this round (prompt_chunks), in the same calls."""
    start = time.perf_counter()
    target_feeds, draft_feeds = prompt_chunks(seqs, feeding or {})
    K = choose_K(policy, seqs, running)                                           # Step 0: from the past only
    ks = {i: seqs[i].k() if K is None else min(K, seqs[i].k()) for i in running}
    if not any(ks.values()):                                                      # a plain step for all
        draft_calls = feed_prompts(draft, draft_feeds)
        chosen = time.perf_counter()
        tokens, rows = plain_round(target, seqs, running, target_feeds)
        seconds = time.perf_counter() - start
        if policy:
            policy.update({}, rows, start + seconds - chosen, draft_calls, first_round=policy.t == 1)
        return follow_schedules(seqs, plain_events(seqs, tokens, seconds))
    drafts, q, draft_calls = draft_all(draft, seqs, ks, draft_feeds)              # Step 1
    propose_seconds = time.perf_counter() - start
    p, rows = score_all(target, seqs, drafts, target_feeds)                       # Step 2
    results = verify([(drafts[i], q[i], p[i], is_greedy(seqs[i].options["temperature"])) for i in running],
                     [seqs[i].rng for i in running])                              # Steps 3-4
    step = [(i, *round_event(seqs[i], drafts[i], q[i], p[i], r, propose_seconds)) for i, r in zip(running, results)]
    roll_back([(seqs[i].target_cache, n_keep) for i, _, n_keep in step])
    roll_back([(seqs[i].draft_cache, n_keep) for i, _, n_keep in step if seqs[i].draft_cache is not None])
    seconds = time.perf_counter() - start
    if policy:
        # the target's side of the round: its pass, and every sequence's verification, sampling and roll-back
        # (on a small model those cost what the pass does; a plain round pays them too)
        policy.update(observed(seqs, step, ks), rows, seconds - propose_seconds, draft_calls,
                      first_round=policy.t == 1)
    return follow_schedules(seqs, [(i, replace(event, seconds=seconds)) for i, event, _ in step])


def observed(seqs, step, ks):  # -> {i: overlaps}: what the K policy learns of each sequence's round
    """Each sequence's examined positions' overlaps, and its lookup's miss (lookup_misses) after them."""
    missed = set(lookup_misses(seqs, step, ks))
    return {i: list(event.overlaps) + [0.0] * (i in missed) for i, event, _ in step}


def lookup_misses(seqs, step, ks):  # -> the sequences whose chain reached a draft their lookup did not find
    """What the K policy learns from a lookup that proposed fewer than k_i drafts: the position after the last
    one found, reached when every one found was accepted, is a rejected draft (q has no mass there: its
    overlap is 0), so that alpha's belief counts a miss as E(alpha, K) counts a rejection. A draft model
    always proposes k_i: none."""
    return [i for i, event, _ in step
            if seqs[i].drafter is not None and len(event.drafts) < ks[i] and all(event.decisions)]


def batch_rounds(target, draft, seqs, verify=verify_each, roll_back=roll_back_each, policy=None):
    """The loop as a generator: per round, a BatchStep (batched.py) of (sequence, RoundEvent) for the
    sequences in it; returns every sequence's tokens. A sequence leaves after n_tokens or its first stop
    token. policy: a BatchAutoK choosing each round's K for all (K="auto"), or None for each its own K."""
    running = list(range(len(seqs)))
    while running:
        yield BatchStep(batch_round(target, draft, seqs, running, verify, roll_back, policy))
        running = [i for i in running if seqs[i].running()]
    return [s.context[len(s.prompt):] for s in seqs]


def batch_auto_K(target, draft, K_max):  # -> BatchAutoK for this pair
    """BatchAutoK with the draft's share of a target call as its prior c (prompt lookup: 0, no model call; the
    rounds show it the lookup's misses as rejections, lookup_misses), the rows where the target's products
    leave their few-row methods (FEW_ROWS), or none for a target whose weights are all small
    (model/fast/layout.all_small: the bundled models; batch_policy's docstring), and, for weights in panels, the
    sizes their products run as others (model/fast/matmul.PANEL_PADDED_ROWS; batch_policy.twin_price)."""
    small = isinstance(target, GPT2) and all_small(target.params)
    c = 0.0 if looks_up(draft) else parameter_ratio(draft, target)
    panels = isinstance(target, GPT2) and weights_order(target) == "panels"
    return BatchAutoK(K_max, c, few_rows=None if small else FEW_ROWS, runs_as=PANEL_PADDED_ROWS if panels else None)


def speculative_batch_stream(target, draft, prompts, n_tokens, *, K=DEFAULT_K, temperature=None, top_k=None,
                             top_p=None, rng=None, stop_tokens=None, K_max=8, verify=verify_each,
                             roll_back=roll_back_each):
    """speculative_generate_batch round by round: checks every sequence now, then returns a Stream
    (stream.py) that yields, per round (one packed target call), a BatchStep: a list of (sequence index,
    RoundEvent) for the sequences it served; once exhausted, .result is every sequence's tokens, and
    .outputs holds them as they come (as batched.batch_stream's). verify and roll_back exist for teaching:
    pass a broken one (teach/broken_batch_kernels.py) and watch the exact tests fail."""
    seqs = open_sequences(target, draft, prompts, n_tokens, K, K_max, temperature, top_k, top_p, rng, stop_tokens)
    auto = isinstance(K, str) and K == "auto"
    policy = batch_auto_K(target, draft, int(K_max)) if auto else None
    return BatchStream(batch_rounds(target, draft, seqs, verify, roll_back, policy), len(seqs))


def speculative_generate_batch(target, draft, prompts, n_tokens, K=DEFAULT_K, temperature=None, top_k=None,
                               top_p=None, rng=None, *, stop_tokens=None, K_max=8, verify=verify_each,
                               roll_back=roll_back_each):
    """speculative_generate for several prompts at once: a list of each sequence's new tokens, each
    exactly what speculative_generate(target, draft, prompts[i], n_tokens[i], K[i], ...).tokens returns
    with the same options and an identically seeded rng (K[i] = 0: generate's). draft: a model (the
    draft model's calls are packed too). Every argument is one value for all sequences or a list with
    one per prompt, but stop_tokens: a flat list of ids stops every sequence, [[a], [b]] is per sequence
    (batched.py's docstring); sampling needs one generator per sequence, rng=[...].
    K="heuristic" (for all, or in the list): that sequence's own HeuristicK, moved by its own rounds as
    speculative_generate moves it, so it too draws what it draws alone.
    K="auto": each round one K for every running sequence, the batch's best goodput from its measured
    costs (batch_policy.BatchAutoK, at most K_max), so that a full batch stops drafting where its
    rows cannot pay; a sequence then gets the target's law, not its solo run's draws. verify, roll_back:
    speculative_batch_stream's (teaching)."""
    return speculative_batch_stream(target, draft, prompts, n_tokens, K=K, temperature=temperature, top_k=top_k,
                                    top_p=top_p, rng=rng, stop_tokens=stop_tokens, K_max=K_max, verify=verify,
                                    roll_back=roll_back).run()
