"""Speculative decoding: a cheap draft model proposes K tokens, the target checks them in one call.

Leviathan et al. 2023 (Algorithm 1) = Chen et al. 2023 (Algorithm 2); the verification rule, the
notation (p = target, q = draft) and the proof sketch are in speculative_kernel.py. This file is
the loop around it: two models, two KV caches, and the bookkeeping that makes the output exact.

Cache invariant. Let `context` be the prompt plus every token emitted so far. Between rounds:
  * the target cache holds context[:-1] exactly: the newest token has not been fed yet;
  * the draft cache holds a prefix of context[:-1], and catches up at the start of its next call
    (after a round in which all K drafts were accepted it lacks x_K and the bonus token).
    Both caches start empty: the first round feeds each model the whole prompt.
One round (the step numbers of Algorithm 1):
  Step 1    the draft is fed what it lacks, then its own proposals one at a time: x_1..x_k, q_1..q_k
  Step 2    the target is fed the newest token plus x_1..x_k in ONE call: p_1..p_{k+1}
  Step 3-4  the kernel accepts x_1..x_n and adds one target token t
  then both caches are truncated to the new context[:-1], which forgets every rejected draft.
k = min(K, tokens still wanted - 1): a round emits at most k + 1 tokens, so we never overshoot N,
and the target never looks past position len(prompt) + N: the context check is the same as
generate's, prompt + N <= n_ctx, whatever K is.

>>> from gpt2np.toy_models import random_toy_model
>>> rng = np.random.default_rng(0)
>>> target, draft = random_toy_model(rng, order=3), random_toy_model(rng)
>>> result = speculative_generate(target, draft, [0], n_tokens=6, K=3, temperature=0)
>>> from gpt2np.autoregressive import generate
>>> result.tokens == generate(target, [0], n_tokens=6, temperature=0)
True
>>> len(result.provenance), set(result.provenance) <= {"draft", "resample", "bonus"}
(6, True)
"""
import time
from dataclasses import dataclass

import numpy as np

from .autoregressive import check_generation_request, check_rng
from .sampling import check_sampling_options, sample, sampling_distribution
from .speculative_kernel import verify_round
from .theory import alpha, predicted_speedup


CALIBRATION_CALLS = 5  # one-token target calls timed after a run that made fewer (for c and v)


@dataclass(frozen=True)
class RoundRecord:
    """One round, as the notebooks see it (speculative_generate(..., trace=True))."""
    drafts: list              # x_1..x_k proposed by the draft (k = K except near the end)
    q_at_drafts: list         # q_i(x_i): the draft's probability of each of its proposals
    p_at_drafts: list         # p_i(x_i): the target's probability of the same token
    decisions: list           # True (accepted) / False (rejected) per draft the kernel looked at
    overlaps: list            # beta_i = sum_x min(p_i, q_i) at each of those positions (Thm 3.5)
    emitted: list             # tokens this round added: accepted drafts, then the target's token
    provenance: list          # "draft" / "resample" / "bonus", one per emitted token
    q: np.ndarray | None      # [k, n_vocab] draft distributions (trace=True only, else None)
    p: np.ndarray | None      # [k+1, n_vocab] target distributions (trace=True only, else None)


@dataclass(frozen=True)
class SpeculativeStats:
    """Counts, acceptance rates, timings and the predictions of theory.py for one run.

    Two acceptance rates, because "acceptance rate" means different things in different places:
    alpha_hat is Leviathan's alpha, the expected acceptance probability of a draft token, estimated
    as the mean of beta = sum_x min(p, q) over the positions the kernel examined (it uses the full
    distributions, so it is less noisy); alpha_empirical = accepted / (accepted + rejections) is
    the fraction of examined drafts this run actually kept. Both estimate the same alpha.

    c and v are measured in this run: c = draft / target seconds per one-token call, v = target
    seconds per (K+1)-token call / per one-token call, each the median over the run's calls of
    that size. A run has a one-token target call only if its last round had no room for drafts;
    with fewer than CALIBRATION_CALLS, we time that many extra target calls after the run
    (calibration_seconds, excluded from target_calls and target_seconds). Ratios are None where the run made no call
    of the size needed (e.g. no one-token draft call when K = 1).
    """
    K: int
    rounds: int                              # target verification calls
    drafted: int                             # draft tokens proposed
    accepted: int                            # draft tokens accepted
    rejections: int                          # rounds that ended with a rejected draft
    alpha_hat: float | None                  # mean beta over examined positions (Thm 3.5)
    alpha_empirical: float | None            # accepted / (accepted + rejections)
    tokens_per_target_call: float            # tokens emitted / target calls (plain decoding: 1)
    draft_calls: int
    draft_seconds: float
    target_calls: int
    target_seconds: float
    draft_timings: dict                      # tokens fed per call -> (calls, seconds)
    target_timings: dict
    calibration_seconds: float               # the extra one-token target calls (0.0 if not needed)
    c: float | None                          # draft / target seconds per one-token call
    v: float | None                          # target seconds per (K+1)-token / one-token call
    predicted_speedup: float | None          # Thm 3.8 with alpha_hat and c (assumes v = 1)
    predicted_speedup_refined: float | None  # the same with the measured v


@dataclass(frozen=True)
class SpeculativeResult:
    tokens: list            # new tokens: exactly n_tokens, unless eot_id came first (it ends them)
    provenance: list        # per token: "draft" (accepted), "resample" (after a rejection), "bonus"
    stats: SpeculativeStats
    trace: list | None      # one RoundRecord per round if trace=True, else None


class TimedModel:
    """One model in the loop: its cache, and a stopwatch per call size (tokens fed per call)."""

    def __init__(self, model):
        self.model, self.cache = model, model.new_cache()
        self.durations = {}  # n_seq -> [seconds of each call]: medians resist one slow call

    def feed(self, ids, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        start = time.perf_counter()
        logits = self.model.forward(np.asarray(ids), self.cache, n_logits)
        self.durations.setdefault(len(ids), []).append(time.perf_counter() - start)
        return logits

    def roll_back(self, n):
        """Forget everything after the first n tokens (nothing to do if the cache is shorter)."""
        self.cache.truncate(min(n, len(self.cache)))

    @property
    def timings(self):  # n_seq -> (calls, seconds)
        return {n: (len(d), sum(d)) for n, d in self.durations.items()}

    @property
    def calls(self):
        return sum(len(d) for d in self.durations.values())

    @property
    def seconds(self):
        return sum(sum(d) for d in self.durations.values())


def check_same_vocabulary(target, draft):
    """Draft tokens are fed to the target as ids, so both models must mean the same thing by each id.

    We compare n_vocab and eot_id, and, when both models carry a tokenizer, their fingerprints: the
    sha256 of the whole vocabulary, merges and special tokens (`Tokenizer.fingerprint`, computed
    once per tokenizer), so any difference at all is caught, whichever files each was read from.
    """
    if (target.n_vocab, target.eot_id) != (draft.n_vocab, draft.eot_id):
        raise ValueError(f"draft and target must share a vocabulary: n_vocab {draft.n_vocab} vs "
                         f"{target.n_vocab}, eot_id {draft.eot_id} vs {target.eot_id}")
    tokenizers = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if None in tokenizers or tokenizers[0] is tokenizers[1]:
        return
    target_print, draft_print = (t.fingerprint for t in tokenizers)
    if draft_print != target_print:
        raise ValueError(f"draft and target tokenizers differ (fingerprints: draft {draft_print[:12]}, "
                         f"target {target_print[:12]}); use a draft trained with the target's encoder.json "
                         "and vocab.bpe")


def check_speculative_request(target, draft, prompt_ids, n_tokens, K, temperature, top_k, top_p, rng):
    """Every check speculative_generate makes before its first forward pass."""
    check_sampling_options(temperature, top_k, top_p)
    check_rng(rng, temperature)
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {K!r}")
    check_same_vocabulary(target, draft)
    check_generation_request(target, prompt_ids, n_tokens)
    check_generation_request(draft, prompt_ids, n_tokens)


def propose(draft, context, k, options, rng, draft_sampler):  # Step 1 -> drafts [k], q [k, n_vocab]
    """The draft proposes x_1..x_k autoregressively; q_i is its distribution for x_i."""
    drafts, q = [], []
    new_ids = context[len(draft.cache):]  # what the draft has not seen yet: usually 1 or 2 tokens
    greedy = options["temperature"] == 0
    for _ in range(k):
        q_i = sampling_distribution(draft.feed(new_ids)[-1], **options)  # [n_vocab]
        drafts.append(int(np.argmax(q_i)) if greedy else draft_sampler(q_i, rng))
        q.append(q_i)
        new_ids = drafts[-1:]  # x_k is never fed: the round ends before anyone needs q_{k+1}
    return drafts, np.array(q, dtype=np.float64).reshape(k, draft.model.n_vocab)


def score(target, context, drafts, options):  # Step 2 -> p [k+1, n_vocab]
    """One target call over the newest token and the k drafts gives p_1..p_{k+1}."""
    new_ids = context[len(target.cache):] + drafts  # [1 + k] ([prompt + k] in the first round)
    logits = target.feed(new_ids, n_logits=len(drafts) + 1)  # [k+1, n_vocab]
    return sampling_distribution(logits, **options)


def round_tokens(drafts, result, eot_id):
    """The tokens a kernel result adds, with provenance, cut just after an end-of-text token."""
    emitted = drafts[:result.n_accepted] + [result.next_token]
    provenance = ["draft"] * result.n_accepted + [result.kind]
    if eot_id in emitted:  # eot can be an accepted draft: keep it, drop what follows
        end = emitted.index(eot_id) + 1
        emitted, provenance = emitted[:end], provenance[:end]
    return emitted, provenance


def speculative_round(target, draft, context, k, options, rng, kernel, draft_sampler, keep_rows):
    """Steps 1-4 and the cache roll-back; returns the round's RoundRecord."""
    drafts, q = propose(draft, context, k, options, rng, draft_sampler)  # Step 1
    p = score(target, context, drafts, options)                          # Step 2
    result = kernel(drafts, q, p, rng, greedy=options["temperature"] == 0)  # Steps 3-4
    emitted, provenance = round_tokens(drafts, result, target.model.eot_id)
    target.roll_back(len(context) + len(emitted) - 1)  # the invariant: new context[:-1]
    draft.roll_back(len(context) + len(emitted) - 1)
    decisions = [True] * result.n_accepted + [False] * (result.kind == "resample")
    return RoundRecord(
        drafts=drafts, q_at_drafts=[float(q[i, x]) for i, x in enumerate(drafts)],
        p_at_drafts=[float(p[i, x]) for i, x in enumerate(drafts)], decisions=decisions,
        overlaps=[alpha(p[i], q[i]) for i in range(len(decisions))], emitted=emitted,
        provenance=provenance, q=q if keep_rows else None, p=p if keep_rows else None)


def time_one_token_calls(target, context, n_calls):
    """Seconds of n_calls target calls over a single token: the unit c and v are measured in.

    Made only when the run itself had fewer than n_calls one-token target calls (one timing is
    too noisy to divide by; the median of five resists a slow call). Each feeds the newest token (the call plain decoding would make
    next) and rolls it back, so the output is unaffected; the time is reported as
    calibration_seconds, not hidden in target_seconds.
    """
    seconds = []
    for _ in range(n_calls):
        start = time.perf_counter()
        target.model.forward(np.asarray(context[-1:]), target.cache, 1)
        seconds.append(time.perf_counter() - start)
        target.roll_back(len(context) - 1)
    return seconds


def seconds_per_call(durations, n_seq):
    """Median seconds of the calls that fed n_seq tokens (None if there were none)."""
    return float(np.median(durations[n_seq])) if durations.get(n_seq) else None


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def summarise(records, target, draft, K, n_tokens, calibration):
    """SpeculativeStats from the round records and the two stopwatches."""
    decisions = [d for r in records for d in r.decisions]
    overlaps = [b for r in records for b in r.overlaps]
    accepted, rejections = decisions.count(True), decisions.count(False)
    alpha_hat = float(np.mean(overlaps)) if overlaps else None
    target_1 = seconds_per_call({1: target.durations.get(1, []) + calibration}, 1)
    c = ratio(seconds_per_call(draft.durations, 1), target_1)
    v = ratio(seconds_per_call(target.durations, K + 1), target_1)
    known = alpha_hat is not None and c is not None
    return SpeculativeStats(
        K=K, rounds=len(records), drafted=sum(len(r.drafts) for r in records), accepted=accepted,
        rejections=rejections, alpha_hat=alpha_hat, alpha_empirical=ratio(accepted, accepted + rejections),
        tokens_per_target_call=n_tokens / target.calls, draft_calls=draft.calls,
        draft_seconds=draft.seconds, target_calls=target.calls, target_seconds=target.seconds,
        draft_timings=draft.timings, target_timings=target.timings,
        calibration_seconds=sum(calibration), c=c, v=v,
        predicted_speedup=predicted_speedup(alpha_hat, K, c) if known else None,
        predicted_speedup_refined=predicted_speedup(alpha_hat, K, c, v) if known and v else None)


def speculative_generate(target, draft, prompt_ids, n_tokens, K, temperature=1.0, top_k=None,
                         top_p=None, rng=None, trace=False, kernel=verify_round, draft_sampler=sample):
    """Sample n_tokens from `target` (exactly its distribution), using `draft` to go faster.

    Same sampling options and the same output distribution as generate(target, ...); stops early
    only at target.eot_id. K: draft tokens per round. trace=True keeps one RoundRecord per round,
    with the full p and q rows. kernel and draft_sampler exist for teaching: pass a broken one
    (broken_kernels.py) and watch the exact tests fail. Returns a SpeculativeResult.
    """
    check_speculative_request(target, draft, prompt_ids, n_tokens, K, temperature, top_k, top_p, rng)
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    timed_target, timed_draft = TimedModel(target), TimedModel(draft)
    prompt = [int(t) for t in prompt_ids]
    context, provenance, records = list(prompt), [], []
    while len(provenance) < n_tokens and not (provenance and context[-1] == target.eot_id):
        k = min(K, n_tokens - len(provenance) - 1)  # K clamped: never emit more than asked for
        record = speculative_round(timed_target, timed_draft, context, k, options, rng, kernel,
                                   draft_sampler, keep_rows=trace)
        context += record.emitted
        provenance += record.provenance
        records.append(record)
    enough = len(timed_target.durations.get(1, [])) >= CALIBRATION_CALLS
    calibration = [] if enough else time_one_token_calls(timed_target, context, CALIBRATION_CALLS)
    stats = summarise(records, timed_target, timed_draft, K, len(provenance), calibration)
    return SpeculativeResult(context[len(prompt):], provenance, stats, records if trace else None)
