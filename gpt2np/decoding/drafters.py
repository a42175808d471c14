"""Drafters: whatever proposes the K tokens a speculative round verifies.

The loop (speculative.py) sees a drafter only through this interface:

    drafter.name                                   # for the statistics
    drafter.check(target, prompt_ids, n_tokens)    # one-line ValueError before any work
    drafter.reset(target)                          # a new run starts (caches, indexes, clocks)
    drafts, q = drafter.propose(context, k, options, rng)   # Step 1: up to k tokens, q [len, n_vocab]
    drafter.roll_back(n)                           # after the round: context[:n] is accepted so far
    drafter.calls, drafter.seconds, drafter.timings   # its cost, for c in the statistics
    drafter.cost_per_token()                       # seconds per drafted token (None until known)
    drafter.c_prior                                # c to assume before anything is measured
    drafter.caught_up                              # optional: tokens its last propose fed before drafting
    drafter.fit_cache(n_positions)                 # optional, after reset: the positions the run's target cache
                                                   # holds; a draft model sizes its own cache to them, a tree
                                                   # drafter its trees

A tree drafter (tree_drafts.py: ModelTreeDrafter, NgramTreeDrafter; speculative_generate's tree=)
returns a DraftTree from propose (depth <= k: the round still emits at most k + 1 tokens), has a
`depth` (each round's K policy: its depth, fixed), and is rolled back with the accepted path:
drafter.roll_back(n, path), path = the accepted nodes of its tree.

Exactness needs only this of a drafter: each draft x_i is a sample of the q_i it returns (or its
argmax at temperature 0, as the kernel's greedy rule assumes nothing else), q_i(x_i) > 0, and
both depend only on the context and the drafter's own randomness. The kernel then emits exactly
the target's distribution whatever q is (speculative_kernel.py): a bad drafter costs speed, never
correctness. A drafter may propose fewer than k tokens, or none (the round is a plain target step).

Two drafters:
  * ModelDrafter: a smaller GPT-2 with its own KV cache (Leviathan et al.'s M_q);
  * NgramDrafter: prompt lookup (Saxena 2023, "Prompt Lookup Decoding"; Hugging Face's
    `prompt_lookup_num_tokens`, vLLM's n-gram speculator): find the most recent earlier
    occurrence of the context's last n tokens and propose what followed it. q is one-hot, so the
    kernel accepts x with probability min(1, p(x) / 1) = p(x), and after a rejection samples the
    residual norm(max(0, p - onehot(x))) = p without x, renormalised. No model, c ~ 0.

>>> drafter = NgramDrafter(n_max=2)
>>> drafter.reset(target=None)
>>> context = [5, 6, 7, 8, 5, 6]            # "5 6" occurred before, followed by 7 8 5
>>> drafter.propose(context, 3, {}, rng=None)[0]
[7, 8, 5]
"""
import time

import numpy as np

from .autoregressive import MODEL_INTERFACE, check_generation_request
from .sampling import distribution, is_greedy, sample
from .stopwatch import TimedModel, seconds_per_call


def one_hot_rows(tokens, n_vocab):  # [k] -> [k, n_vocab]
    """q for a drafter that proposes tokens with certainty."""
    q = np.zeros((len(tokens), n_vocab), dtype=np.float64)
    q[np.arange(len(tokens)), tokens] = 1.0
    return q


def check_same_vocabulary(target, draft):
    """Draft tokens are fed to the target as ids, so both models must mean the same thing by each id.

    We compare n_vocab and eot_id, and, when both models carry a tokenizer, their fingerprints: the
    sha256 of the whole vocabulary, merges and special tokens (`Tokenizer.fingerprint`, computed
    once per tokenizer), so any difference at all is caught, whichever files each was read from.
    The message names the one thing that differs (draft's value first).
    """
    check_vocabulary_size(target.n_vocab, draft.n_vocab)
    tokenizers = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if target.eot_id != draft.eot_id:
        raise ValueError(f"draft and target must share a vocabulary: {eot_difference(target, draft, tokenizers)}")
    if None in tokenizers or tokenizers[0] is tokenizers[1]:
        return
    target_print, draft_print = (t.fingerprint for t in tokenizers)
    if draft_print != target_print:
        raise ValueError(f"draft and target tokenizers differ (fingerprints: draft {draft_print[:12]}, "
                         f"target {target_print[:12]}); use a draft trained with the target's encoder.json "
                         "and vocab.bpe")


def check_vocabulary_size(target_n_vocab, draft_n_vocab):
    """check_same_vocabulary's first test, on sizes alone (draft_n_vocab None: not known yet, nothing to say),
    so a draft whose size is known before its weights are built is refused before they are.

    >>> check_vocabulary_size(50257, 257)
    Traceback (most recent call last):
    ValueError: draft and target must share a vocabulary: n_vocab 257 vs 50257 (draft vs target)
    """
    if draft_n_vocab is not None and target_n_vocab != draft_n_vocab:
        raise ValueError(f"draft and target must share a vocabulary: n_vocab {draft_n_vocab} vs "
                         f"{target_n_vocab} (draft vs target)")


def eot_difference(target, draft, tokenizers):
    """What differs when the end-of-text ids do: usually one model has no tokenizer at all (a
    random_model without GPT-2's files), hence no end-of-text id."""
    roles = (("draft", "target", tokenizers[1], draft.eot_id, target.eot_id),
             ("target", "draft", tokenizers[0], target.eot_id, draft.eot_id))
    for role, other, tokenizer, eot_id, other_eot_id in roles:
        if tokenizer is None and eot_id is None:
            return (f"the {role} has no tokenizer, hence no end-of-text id (the {other}'s is {other_eot_id}); "
                    f"a random model takes the {other}'s with random_model(config, tokenizer={other}.tokenizer)")
    return f"eot_id {draft.eot_id} vs {target.eot_id} (draft vs target)"


def parameter_ratio(draft, target):  # -> c before anything is timed
    """The draft's parameters over the target's (0.5 for models without a GPT2Config)."""
    sizes = [getattr(getattr(m, "config", None), "n_params", None) for m in (draft, target)]
    return sizes[0]() / sizes[1]() if all(sizes) else 0.5


class ModelDrafter:
    """A draft GPT-2 (or toy model) with its own KV cache: Step 1 of Algorithm 1, as in the papers.

    Cache invariant: between rounds the cache holds a prefix of the accepted context[:-1] and
    catches up at its next call: after a fully accepted round it lacks x_K and the bonus token,
    which are fed in one 2-token call (cheaper than feeding x_K inside every round, which would
    cost a draft call in rounds that end with a rejection too; bench/spec.py measures it).
    `sampler` exists for teaching: broken_kernels.greedy_draft_sampler breaks exactness.
    c_prior: the cost ratio c to assume before the first draft call is timed (default: the two
    models' parameter counts, since decoding reads every weight once per token; 0.5 for models
    without a config).
    """

    def __init__(self, model, sampler=sample, c_prior=None):
        check_draft_model(model)
        self.model, self.sampler, self.c_given = model, sampler, c_prior
        self.name = getattr(model, "name", None) or repr(model)
        self.timed, self.c_prior, self.caught_up = None, c_prior, 0  # reset() gives each run a fresh cache

    def check(self, target, prompt_ids, n_tokens):
        check_same_vocabulary(target, self.model)
        check_generation_request(self.model, prompt_ids, n_tokens, "the draft model's")  # as the target's

    def reset(self, target):
        self.timed = TimedModel(self.model)
        self.c_prior = self.c_given if self.c_given is not None else parameter_ratio(self.model, target)

    def fit_cache(self, n_positions):
        """A cache of the run's n_positions (the target's: the draft feeds no more) in place of the whole
        context's, before the run's first call: 75 MB at 124M, zeroed when first touched."""
        self.timed = TimedModel(self.model, n_positions)

    def propose(self, context, k, options, rng):  # -> drafts [k], q [k, n_vocab]
        """x_1..x_k autoregressively; q_i is the draft's distribution for x_i."""
        drafts, q = [], []
        new_ids = context[len(self.timed.cache):]  # what the draft has not seen: usually 1 or 2 tokens
        self.caught_up = len(new_ids)              # more after plain rounds: their debt, paid now
        greedy = is_greedy(options["temperature"])
        for _ in range(k):
            q_i = distribution(self.timed.feed(new_ids)[-1], **options)  # [n_vocab]
            drafts.append(int(np.argmax(q_i)) if greedy else self.sampler(q_i, rng))
            q.append(q_i)
            new_ids = drafts[-1:]  # x_k is never fed: the round ends before anyone needs q_{k+1}
        return drafts, np.array(q, dtype=np.float64).reshape(k, self.model.n_vocab)

    def prompt_distributions(self, ids, n, options):  # [n_seq] -> q [n, n_vocab]
        """The draft's prefill of ids (the prompt but its last token), keeping its distributions at the
        last n positions: what q would have been there (speculative.read_prompt). Off the stopwatch, as
        the target's side of it: a prefill, not a draft call."""
        return distribution(self.timed.model.forward(np.asarray(ids), self.timed.cache, n), **options)

    def roll_back(self, n):
        self.timed.roll_back(n)

    def cost_per_token(self):
        return seconds_per_call(self.timed.durations, 1)

    calls = property(lambda self: self.timed.calls)
    seconds = property(lambda self: self.timed.seconds)
    timings = property(lambda self: self.timed.timings)


def check_draft_model(model):
    """A one-line ValueError unless `model` has the model interface: a name is loaded first.

    >>> ModelDrafter("shakespeare-260K")
    Traceback (most recent call last):
    ValueError: ModelDrafter needs a loaded model (gpt2np.load_model(name)), got str 'shakespeare-260K'; gpt2np.load_drafter(name) loads one and wraps it
    """
    if all(hasattr(model, name) for name in MODEL_INTERFACE):
        return
    given = f"str {model!r}" if isinstance(model, str) and len(model) < 80 else type(model).__name__
    raise ValueError(f"ModelDrafter needs a loaded model (gpt2np.load_model(name)), got {given}; "
                     "gpt2np.load_drafter(name) loads one and wraps it")


def is_integer(x):  # -> whether x is an int or a NumPy integer, not a bool
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier occurrence of the last n tokens.

    n runs from n_max down to n_min: the longest suffix that occurred before wins, and among its
    occurrences the most recent. The index maps every n-gram (n_min <= n <= n_max) of the context
    to the position just after its latest occurrence that has a following token; it is updated
    with the tokens each round adds (O(n_max) dictionary writes per token), never rebuilt, so a
    lookup costs the same at context 10 or 1,000. The accepted context only ever grows (rejected
    drafts never enter it), so roll_back has nothing to forget.
    """

    def __init__(self, n_max=3, n_min=1):
        if not (is_integer(n_min) and is_integer(n_max) and 1 <= n_min <= n_max):
            raise ValueError(f"n-gram sizes must be integers with 1 <= n_min <= n_max, got n_min={n_min!r}, "
                             f"n_max={n_max!r}")
        self.n_max, self.n_min, self.name, self.c_prior = int(n_max), int(n_min), f"ngram (n <= {n_max})", 0.0
        self.reset(target=None)

    def check(self, target, prompt_ids, n_tokens):
        pass  # it proposes tokens of the context, which are the target's own ids

    def reset(self, target):
        self.n_vocab = getattr(target, "n_vocab", None)
        self.index, self.n_indexed = {}, 0  # n-gram -> position after it; positions indexed so far
        self.calls, self.seconds, self.drafted = 0, 0.0, 0

    def update_index(self, context):
        """Index the n-grams ending at positions n_indexed .. len(context) - 2 (each has a follower)."""
        for end in range(self.n_indexed, len(context) - 1):
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                self.index[tuple(context[end - n + 1:end + 1])] = end + 1  # later occurrences overwrite
        self.n_indexed = max(self.n_indexed, len(context) - 1)

    def lookup(self, context, k):
        """Up to k tokens that followed the longest, most recent earlier match of a context suffix."""
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            follower = self.index.get(tuple(context[len(context) - n:]))
            if follower is not None:
                return list(context[follower:follower + k])
        return []

    def propose(self, context, k, options, rng):  # -> drafts [<= k], q [<= k, n_vocab]
        start = time.perf_counter()
        self.update_index(context)
        drafts = self.lookup(context, k) if k > 0 else []
        self.calls, self.drafted = self.calls + 1, self.drafted + len(drafts)
        self.seconds += time.perf_counter() - start
        return drafts, one_hot_rows(drafts, self.n_vocab or (max(context) + 1))

    def roll_back(self, n):
        pass

    def cost_per_token(self):
        return self.seconds / self.drafted if self.drafted else None

    @property
    def timings(self):
        return {"lookup": (self.calls, self.seconds)}


class CountingNgramDrafter(NgramDrafter):
    """For teaching: prompt lookup with a real q. For the longest context suffix seen before,
    q(x) = (1 - eps) * (how often x followed that suffix) / (how often it occurred) + eps / n_vocab;
    x ~ q (argmax at temperature 0), then the same for the context extended by x, up to k tokens,
    stopping where the extended suffix was never seen. eps > 0 keeps q(x) > 0 for every x, as the
    kernel needs; the kernel makes the output exact whatever q is, so this only changes speed: a
    smooth q is accepted with probability sum_x min(p, q) instead of p(x_draft).
    """

    def __init__(self, n_max=3, n_min=1, eps=0.1):
        super().__init__(n_max, n_min)
        self.eps, self.name = eps, f"counting ngram (n <= {n_max}, eps {eps})"

    def reset(self, target):
        super().reset(target)
        self.followers = {}  # n-gram -> {token: times it followed}

    def update_index(self, context):
        for end in range(self.n_indexed, len(context) - 1):
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                counts = self.followers.setdefault(tuple(context[end - n + 1:end + 1]), {})
                counts[context[end + 1]] = counts.get(context[end + 1], 0) + 1
        super().update_index(context)

    def q_after(self, context):  # -> [n_vocab] or None when no suffix was seen
        for n in range(min(self.n_max, len(context)), self.n_min - 1, -1):
            counts = self.followers.get(tuple(context[len(context) - n:]))
            if counts:
                q = np.full(self.n_vocab, self.eps / self.n_vocab)
                total = sum(counts.values())
                for token, count in counts.items():
                    q[token] += (1 - self.eps) * count / total
                return q
        return None

    def propose(self, context, k, options, rng):  # -> drafts [<= k], q [<= k, n_vocab]
        start = time.perf_counter()
        self.update_index(context)
        drafts, q, extended = [], [], list(context)
        while len(drafts) < k and (q_i := self.q_after(extended)) is not None:
            drafts.append(int(np.argmax(q_i)) if options.get("temperature") == 0 else sample(q_i, rng))
            q.append(q_i)
            extended.append(drafts[-1])
        self.calls, self.drafted = self.calls + 1, self.drafted + len(drafts)
        self.seconds += time.perf_counter() - start
        return drafts, np.array(q, dtype=np.float64).reshape(len(drafts), self.n_vocab)


def ngram_lookup_reference(context, k, n_max, n_min=1):
    """The slow oracle for NgramDrafter.lookup: rescan the whole context, newest position first."""
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        suffix = list(context[len(context) - n:])
        for start in range(len(context) - n - 1, -1, -1):  # occurrences that have a follower
            if list(context[start:start + n]) == suffix:
                return list(context[start + n:start + n + k])
    return []


def as_drafter(draft, draft_sampler=sample, usage="speculative_generate(target, draft, prompt_ids, n_tokens)"):
    """A Drafter as is; anything with the model interface wrapped as a ModelDrafter (drawing its drafts
    with draft_sampler); anything else a one-line ValueError naming what was given and the call's order
    (`usage`). A draft_sampler with a drafter is a ValueError too: the drafter would never call it."""
    if hasattr(draft, "propose") and hasattr(draft, "reset"):
        if draft_sampler is not sample:
            raise ValueError(f"draft_sampler= draws a draft model's tokens, and the draft is a drafter "
                             f"({type(draft).__name__}) that would not call it: pass the model as the draft, "
                             f"or give a ModelDrafter its sampler=")
        return draft
    if not all(hasattr(draft, name) for name in MODEL_INTERFACE):
        raise ValueError(f"draft must be a model (gpt2np.load_model, gpt2np.random_model) or a drafter "
                         f"(gpt2np.load_drafter), got {type(draft).__name__}: {usage}")
    return ModelDrafter(draft, sampler=draft_sampler)
