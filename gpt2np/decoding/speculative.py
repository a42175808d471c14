"""Speculative decoding: a cheap drafter proposes K tokens, the target checks them in one call.

Leviathan et al. 2023 (Algorithm 1) = Chen et al. 2023 (Algorithm 2); the verification rule, the
notation (p = target, q = draft) and the proof sketch are in speculative_kernel.py. This file is
the loop around it: the target and its KV cache, a drafter (drafters.py: a draft model, or prompt
lookup), a K policy (policies.py), and the bookkeeping that makes the output exact. The loop is a
generator of rounds (stream.py): `speculative_stream` yields each round as it happens,
`speculative_generate` runs it to the end.

Cache invariant. Let `context` be the prompt plus every token emitted so far. Between rounds:
  * the target cache holds context[:-1] exactly: the newest token has not been fed yet;
  * a draft model's cache holds a prefix of context[:-1], and catches up at the start of its next
    call (after a round in which all K drafts were accepted it lacks x_K and the bonus token).
    Both caches start empty: the first round feeds each model the whole prompt.
One round (the step numbers of Algorithm 1):
  Step 0    the K policy picks K from what earlier rounds measured (never from this round)
  Step 1    the drafter proposes up to k tokens x_1..x_k with their distributions q_1..q_k
  Step 2    the target is fed the newest token plus x_1..x_k in ONE call: p_1..p_{k+1}
  Step 3-4  the kernel accepts x_1..x_n and adds one target token t
  then the target cache (and the drafter) roll back to the new context[:-1], forgetting every
  rejected draft.
k = min(K, tokens still wanted - 1): a round emits at most k + 1 tokens, so we never overshoot N,
and the target never looks past position len(prompt) + N: the context check is the same as
generate's, prompt + N <= n_ctx, whatever K is. A round with no drafts (K = 0, or a drafter
with nothing to propose) is a plain target step; its token's provenance is "target".

>>> from gpt2np.teach.toy_models import random_toy_model
>>> rng = np.random.default_rng(0)
>>> target, draft = random_toy_model(rng, order=3), random_toy_model(rng)
>>> result = speculative_generate(target, draft, [0], n_tokens=6, K=3, temperature=0)
>>> from gpt2np.decoding.autoregressive import generate
>>> result.tokens == generate(target, [0], n_tokens=6, temperature=0)
True
>>> len(result.provenance), set(result.provenance) <= {"draft", "resample", "bonus", "target"}
(6, True)
"""
import time
from dataclasses import dataclass, replace

import numpy as np  # noqa: F401  (the module doctest draws its toy models with np.random)

from .autoregressive import check_generation_request, check_model, check_rng, default_temperature, stop_set
from .drafters import as_drafter
from .policies import Measurements, make_policy
from .sampling import check_sampling_options, distribution, is_greedy, sample
from .stopwatch import TimedModel
from .speculative_kernel import verify_round
from .run_stats import CALIBRATION_CALLS, SpeculativeStats, summarise, time_one_token_calls  # noqa: F401
from .stream import RoundEvent, Stream
from .theory import alpha


@dataclass(frozen=True)
class SpeculativeResult:
    tokens: list            # new tokens: exactly n_tokens, unless eot_id or a stop token came first (it ends them)
    provenance: list        # per token: "draft" (accepted), "resample" (after a rejection), "bonus"
    stats: SpeculativeStats
    trace: list | None      # one RoundEvent per round (with q and p) if trace=True, else None


def check_speculative_request(target, drafter, prompt_ids, n_tokens, temperature, top_k, top_p, rng):
    """Every check speculative_stream makes before its first forward pass, after the arguments'
    types (check_model, as_drafter) and K (make_policy)."""
    check_sampling_options(temperature, top_k, top_p)
    check_rng(rng, temperature)
    drafter.check(target, prompt_ids, n_tokens)
    check_generation_request(target, prompt_ids, n_tokens)


def score(target, context, drafts, options):  # Step 2 -> p [k+1, n_vocab]
    """One target call over the newest token and the k drafts gives p_1..p_{k+1}."""
    new_ids = context[len(target.cache):] + drafts  # [1 + k] ([prompt + k] in the first round)
    logits = target.feed(new_ids, n_logits=len(drafts) + 1)  # [k+1, n_vocab]
    return distribution(logits, **options)  # checked once, in check_speculative_request


def round_tokens(drafts, result, stops):
    """The tokens a kernel result adds, with provenance, cut just after the first stop token
    (end-of-text or one of stop_tokens), as plain decoding stops there."""
    emitted = drafts[:result.n_accepted] + [result.next_token]
    provenance = ["draft"] * result.n_accepted + [result.kind if drafts else "target"]
    end = next((i + 1 for i, token in enumerate(emitted) if token in stops), len(emitted))
    return emitted[:end], provenance[:end]  # a stop can be an accepted draft: keep it, drop what follows


def speculative_round(target, drafter, context, k, options, rng, kernel, keep_rows, stops):
    """Steps 1-4 and the roll-back; returns the round's RoundEvent (the loop adds K, n_emitted, seconds)."""
    start = time.perf_counter()
    drafts, q = drafter.propose(context, k, options, rng)                # Step 1
    propose_seconds = time.perf_counter() - start
    p = score(target, context, drafts, options)                          # Step 2
    result = kernel(drafts, q, p, rng, greedy=is_greedy(options["temperature"]))  # Steps 3-4
    emitted, provenance = round_tokens(drafts, result, stops)
    target.roll_back(len(context) + len(emitted) - 1)  # the invariant: new context[:-1]
    drafter.roll_back(len(context) + len(emitted) - 1)
    decisions = [True] * result.n_accepted + [False] * (result.kind == "resample")
    return RoundEvent(
        tokens=emitted, provenance=provenance, K=len(drafts), n_emitted=0, drafts=drafts,
        q_at_drafts=[float(q[i, x]) for i, x in enumerate(drafts)],
        p_at_drafts=[float(p[i, x]) for i, x in enumerate(drafts)], decisions=decisions,
        overlaps=alpha(p[:len(decisions)], q[:len(decisions)]).tolist(),
        q=q if keep_rows else None, p=p if keep_rows else None, propose_seconds=propose_seconds)


def observe(past, event, target, first_round):
    """What the K policy may use next: this round's overlaps, its target call and the drafter's
    wall time per drafted token (both without the first round, whose calls carry the prompt)."""
    past.overlaps += event.overlaps
    if first_round:
        return
    n_seq = 1 + len(event.drafts)
    past.add_target_call(n_seq, target.durations[n_seq][-1])
    if event.drafts:
        past.add_draft_cost(event.propose_seconds / len(event.drafts))


def speculative_rounds(target, drafter, policy, prompt, n_tokens, options, rng, kernel, trace, calibrate,
                       stops):
    """The loop, one yield per round (a RoundEvent); returns the SpeculativeResult. It ends after
    n_tokens, or after the first token in `stops` (eot_id and the stop tokens), as plain decoding."""
    timed_target = TimedModel(target)
    drafter.reset(target)
    policy.reset()
    past = Measurements(c_prior=drafter.c_prior)
    context, provenance, records, Ks = list(prompt), [], [], []
    while len(provenance) < n_tokens and not (provenance and context[-1] in stops):
        start = time.perf_counter()
        K = policy.choose(past)                                          # Step 0: from the past only
        k = min(K, n_tokens - len(provenance) - 1)  # K clamped: never emit more than asked for
        event = speculative_round(timed_target, drafter, context, k, options, rng, kernel, trace, stops)
        context += event.tokens
        provenance += event.provenance
        event = replace(event, n_emitted=len(provenance), seconds=time.perf_counter() - start)
        records.append(event)
        Ks.append(K)
        policy.update(event)
        observe(past, event, timed_target, first_round=len(records) == 1)
        yield event
    enough = len(timed_target.durations.get(1, [])) >= CALIBRATION_CALLS
    calibration = time_one_token_calls(timed_target, context, CALIBRATION_CALLS) if calibrate and not enough else []
    stats = summarise(records, Ks, timed_target, drafter, policy.name, len(provenance), calibration)
    return SpeculativeResult(context[len(prompt):], provenance, stats, records if trace else None)


def open_speculative(name, target, draft, prompt_ids, n_tokens, K, K_max, temperature, top_k, top_p, rng,
                     trace, kernel, draft_sampler, calibrate, stop_tokens):
    """The Stream behind speculative_stream and speculative_generate (`name`, for the errors), after
    every check: the arguments' types first, so that another repository's order is named as such."""
    usage = f"{name}(target, draft, prompt_ids, n_tokens, ...)"
    check_model(target, "target", usage)
    drafter = as_drafter(draft, draft_sampler, usage)
    policy, temperature = make_policy(K, K_max), default_temperature(temperature, rng)
    check_speculative_request(target, drafter, prompt_ids, n_tokens, temperature, top_k, top_p, rng)
    options, stops = dict(temperature=temperature, top_k=top_k, top_p=top_p), stop_set(target, stop_tokens)
    prompt = [int(t) for t in prompt_ids]
    return Stream(speculative_rounds(target, drafter, policy, prompt, n_tokens, options, rng, kernel, trace,
                                     calibrate, stops))


def speculative_stream(target, draft, prompt_ids, n_tokens, K=4, K_max=8, temperature=None, top_k=None,
                       top_p=None, rng=None, trace=False, kernel=verify_round, draft_sampler=sample,
                       calibrate=False, *, stop_tokens=None):
    """Speculative decoding as a Stream of RoundEvents; `.result` is speculative_generate's result.

    draft: a drafter (drafters.py) or a model (wrapped as a ModelDrafter). K: an int (the same K
    every round), "heuristic" or "auto" (policies.py; both at most K_max). The defaults are
    generate's: greedy unless an rng is passed (temperature None is 1.0 then); stop_tokens end
    the stream where plain decoding would stop. Every check runs here, before the first forward
    pass. calibrate=True: if the run made fewer than CALIBRATION_CALLS one-token target calls,
    time that many more after it, so that c and v are measured (the stats' calibration_seconds);
    by default the run makes only the calls its rounds need, and c and v are None where it made
    no call to measure them by.
    """
    return open_speculative("speculative_stream", target, draft, prompt_ids, n_tokens, K, K_max, temperature,
                            top_k, top_p, rng, trace, kernel, draft_sampler, calibrate, stop_tokens)


def speculative_generate(target, draft, prompt_ids, n_tokens, K=4, temperature=None, top_k=None,
                         top_p=None, rng=None, trace=False, kernel=verify_round, draft_sampler=sample,
                         K_max=8, calibrate=False, *, stop_tokens=None):
    """Sample n_tokens from `target` (exactly its distribution), using `draft` to go faster.

    Same sampling options, defaults and output distribution as generate(target, ...); stops early
    only at target.eot_id or one of stop_tokens (kept as the last token). draft: a model or a
    drafter; K: drafts per round, or a K policy name ("heuristic", "auto"). trace=True keeps one
    RoundEvent per round, with the full p and q rows. kernel and draft_sampler exist for teaching:
    pass a broken one (broken_kernels.py) and watch the exact tests fail. calibrate: see
    speculative_stream. Returns a SpeculativeResult.
    """
    return open_speculative("speculative_generate", target, draft, prompt_ids, n_tokens, K, K_max, temperature,
                            top_k, top_p, rng, trace, kernel, draft_sampler, calibrate, stop_tokens).run()
