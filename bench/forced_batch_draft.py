"""forced_draft.py's drafter for a batch: a real draft model's packed cost, every sequence's proposals forced.

Why: speculative_generate_batch drafts for all its sequences in one packed forward pass per draft
step (model/batch.py). A benchmark of where drafting stops paying in a batch needs a draft whose
cost is that packed pass of the real draft model and whose acceptance rate is fixed, sequence by
sequence, by construction (forced_draft.py's module docstring says how the forcing works).

ForcedBatchDraft wraps one real model and holds one ForcedChoices per sequence (its own coins, its
own greedy continuation). It tells the sequences apart by their caches: speculative_generate_batch
asks the draft for one cache per sequence, in the order of the prompts, so the i-th new_cache() of
an object is sequence i's. Build a fresh object for every run (a seventh cache for six sequences
is a one-line error, never a silent reuse).

Packing. speculative_generate_batch packs a draft's calls into one pass only when the draft is a
GPT2; any other model of the interface is called once per sequence (forward_separately), which would
charge this draft B one-sequence passes per step instead of one B-row pass. packed_draft_calls()
routes the batch loop's calls for one ForcedBatchDraft to its forward_packed (one forward_packed of
the real model, its logits replaced), and restores the loop as it was when the block ends.

>>> import gpt2np
>>> model = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=50, n_ctx=16, n_embd=8, n_head=2, n_layer=1))
>>> draft = ForcedBatchDraft(model, [[1, 2, 3, 4], [5, 6, 7]], alpha=1.0, seeds=[0, 1])
>>> a, b = draft.new_cache(), draft.new_cache()
>>> [int(rows[-1].argmax()) for rows in draft.forward_packed([([1, 2], a), ([5], b)], 1)]  # positions 2, 1
[3, 6]
"""
from contextlib import contextmanager

import numpy as np

from gpt2np.decoding import batched_speculative
from gpt2np.model.batch import forward_packed

from .forced_draft import ForcedChoices

FORCED_LOGIT = 10.0  # the wanted token's logit; every other token's is 0 (forced_draft.py uses the same)


def forced_rows(choices, end, n_logits, n_vocab):  # -> [n_logits, n_vocab]
    """The logits of the last n_logits rows of a call that left `end` tokens in the cache: row j
    predicts position end - n_logits + 1 + j, and puts FORCED_LOGIT on the token to propose there."""
    logits = np.zeros((n_logits, n_vocab), dtype=np.float32)
    for row, position in enumerate(range(end - n_logits + 1, end + 1)):
        logits[row, choices.wanted(position)] = FORCED_LOGIT
    return logits


class ForcedBatchDraft:
    """The model interface (n_vocab, n_ctx, eot_id, config, new_cache, forward, forward_packed)
    around a real GPT2; sequence i proposes the token of `sequences[i]` (its prompt + the target's
    greedy continuation) with probability alpha, from coins drawn with seeds[i]."""

    def __init__(self, model, sequences, alpha, seeds):
        if len(seeds) != len(sequences):
            raise ValueError(f"one seed per sequence: {len(sequences)} sequences, {len(seeds)} seeds")
        self.model, self.alpha, self.config = model, alpha, model.config  # config: the policy's c prior
        self.n_vocab, self.n_ctx, self.eot_id = model.n_vocab, model.n_ctx, model.eot_id
        self.choices = [ForcedChoices(seq, alpha, model.n_vocab, seed) for seq, seed in zip(sequences, seeds)]
        self.lengths = [len(seq) for seq in sequences]
        self.by_cache = {}  # id(cache) -> the ForcedChoices of the sequence it belongs to
        self.name = f"forced alpha={alpha} around {getattr(model, 'name', 'a model')}, {len(sequences)} sequences"

    def new_cache(self, n_ctx=None):
        """Sequence i's cache, for the i-th call: sized as the batch loop sizes the target's (its
        prompt + tokens - 1 positions, the last token is never fed) unless n_ctx says otherwise."""
        i = len(self.by_cache)
        if i == len(self.choices):
            raise ValueError(f"ForcedBatchDraft: a cache for sequence {i}, but it was built for {i} sequences; "
                             "build a new one for every run")
        cache = self.model.new_cache(n_ctx or max(1, self.lengths[i] - 1))
        self.by_cache[id(cache)] = self.choices[i]
        return cache

    def owner(self, cache):
        choices = self.by_cache.get(id(cache))
        if choices is None:
            raise ValueError("ForcedBatchDraft: this cache is not one of this draft's new_cache()")
        return choices

    def forward(self, ids, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        """One sequence alone: the real model's pass (its logits discarded), then the forced rows."""
        choices = self.owner(cache)
        self.model.forward(ids, cache, n_logits)
        return forced_rows(choices, len(cache), n_logits, self.n_vocab)

    def forward_packed(self, calls, n_logits=1):  # [(ids_i [n_i], cache_i)] -> B x [n_logits_i, n_vocab]
        """Every sequence's call in ONE packed pass of the real model (its logits discarded), then
        each sequence's forced rows, as model/batch.forward_packed returns them."""
        owners = [self.owner(cache) for _, cache in calls]
        n_outs = list(n_logits) if isinstance(n_logits, (list, tuple)) else [n_logits] * len(calls)
        forward_packed(self.model, calls, n_outs)  # the real cost: one read of the weights for all rows
        return [forced_rows(choices, len(cache), n, self.n_vocab)
                for choices, (_, cache), n in zip(owners, calls, n_outs)]


@contextmanager
def packed_draft_calls(draft):
    """Inside the block, speculative_generate_batch calls draft.forward_packed for `draft`'s packed
    calls (module docstring); every other model's calls go where they went before."""
    before = batched_speculative.packed_call

    def packed_call(model, calls, n_logits):
        return model.forward_packed(calls, n_logits) if model is draft else before(model, calls, n_logits)

    batched_speculative.packed_call = packed_call
    try:
        yield draft
    finally:
        batched_speculative.packed_call = before
