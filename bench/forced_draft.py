"""A benchmark-only draft model whose proposals match the target's greedy token with probability alpha.

Why: with random weights, a real 124M draft and a real 355M target agree on almost nothing, so
they cannot show how speculative decoding behaves at a realistic acceptance rate. This drafter
keeps the *cost* of the real draft and fixes its *acceptance rate* by construction.

Construction (greedy decoding, temperature 0):
  1. Run the target alone first (the baseline): its greedy continuation g of the prompt is what
     speculative decoding must reproduce, so `sequence = prompt + g` is the context at every
     point of the speculative run. The token the target wants at position i is sequence[i].
  2. Draw one coin per position in advance, u_i ~ Uniform(0, 1) from a seeded generator, and
     let the draft "agree" at position i iff u_i < alpha: i.i.d. Bernoulli(alpha), the paper's
     assumption (Leviathan et al. 2023, section 3.1).
  3. forward() runs the wrapped real model (same FLOPs, same bytes read, same KV cache), then
     replaces its logits: each returned row predicts position i = (index of that row + 1), and
     is 0 everywhere except +10 at sequence[i] if the coin agrees, or at sequence[i] + 1 (mod
     n_vocab), a token the target does not want, if it does not.
At temperature 0 the target accepts a draft token iff it equals its argmax, so every position the
kernel examines is accepted with probability alpha, independently. speculative_generate's
alpha_hat (mean of sum_x min(p, q), here 1 or 0 per examined position) then estimates alpha
without bias in expectation: per round, E[accepted] / E[examined] = (a + ... + a^K) /
(1 + ... + a^(K-1)) = alpha. A finite run realises a slightly different rate; the benchmark
reports the measured one and predicts from it.

The prompt. auto reads the overlaps at the prompt's last positions before its first round (policies.AutoK,
5.: both models' prefill, their rows kept). There the token the target wants is its greedy token after each
prefix of the prompt, not the prompt's next token (what a user wrote): wanted_sequence() builds the
sequence so, and the draft agrees with it w.p. alpha as everywhere else (coins of their own: no
generated position's coin changes, so fixed Ks run on the same coins as before).

If the target's output ever differs from its own baseline (a float near-tie resolved differently
by a K+1-row product than by a 1-row one), the drafter's knowledge is wrong from there on; the
benchmark reports `tokens_match_baseline` so such a run is visible.
"""
import numpy as np

from gpt2np.decoding.autoregressive import sizes_caches


def wanted_sequence(target, prompt, continuation):  # -> [len(prompt) + len(continuation)] token ids
    """What the target wants at every position: at a prompt position i >= 1 its greedy token after prompt[:i]
    (one prefill with every row's logits), then its greedy `continuation` (the baseline's tokens). Position 0
    predicts nothing: the prompt's first token stands there."""
    logits = target.forward(np.asarray(prompt), target.new_cache(), len(prompt))  # [len(prompt), n_vocab]
    return [int(prompt[0])] + [int(t) for t in np.argmax(logits[:-1], axis=-1)] + [int(t) for t in continuation]


class ForcedChoices:
    """Steps 1-2: the token to propose at each position, agreeing with the target w.p. alpha."""

    def __init__(self, sequence, alpha, n_vocab, seed=0):
        self.sequence, self.n_vocab = [int(t) for t in sequence], n_vocab  # what the target wants: wanted_sequence
        self.agree = np.random.default_rng(seed).random(len(self.sequence) + 1) < alpha  # [len + 1] bool

    def wanted(self, position):
        """The token to propose for `position` (0-based index into the full sequence)."""
        if position >= len(self.sequence):
            return 0  # past the baseline: never reached when the run matches it
        token = self.sequence[position]
        return token if self.agree[position] else (token + 1) % self.n_vocab


class WrappedModelCaches:
    """new_cache for a wrapper of self.model: the wrapped model's KV cache (len() and truncate() as usual),
    sized to the run where the loop asks and the model allows (sized_caches: request_cache). Without it a
    run allocates the whole context: 75 MB at 124M where a 48-token run feeds ~60 positions."""

    @property
    def sized_caches(self):  # whether request_cache may size the cache to the run: as the wrapped model's (a GPT2)
        return sizes_caches(self.model)

    def new_cache(self, n_ctx=None):
        return self.model.new_cache() if n_ctx is None else self.model.new_cache(n_ctx)


class ForcedAcceptanceDraft(WrappedModelCaches):
    """The model interface (n_vocab, n_ctx, eot_id, new_cache, forward) around a real model."""

    def __init__(self, model, sequence, alpha, seed=0):
        self.model, self.alpha = model, alpha
        self.n_vocab, self.n_ctx, self.eot_id = model.n_vocab, model.n_ctx, model.eot_id
        self.choices = ForcedChoices(sequence, alpha, model.n_vocab, seed)
        self.wanted = self.choices.wanted
        self.name = f"forced alpha={alpha} around {getattr(model, 'name', model)}"

    def forward(self, ids, cache, n_logits=1):  # [n_seq] -> [n_logits, n_vocab]
        self.model.forward(ids, cache, n_logits)  # the real cost; its logits are discarded
        end = len(cache)                          # the last returned row predicts position `end`
        logits = np.zeros((n_logits, self.n_vocab), dtype=np.float32)
        for row, position in enumerate(range(end - n_logits + 1, end + 1)):
            logits[row, self.wanted(position)] = 10.0
        return logits
