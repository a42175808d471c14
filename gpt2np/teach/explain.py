"""Show-your-work helpers for the notebooks: every step of the forward pass, and small measurements.

Nothing here is a second implementation. `forward_trace` calls gpt2np/model/forward.py's own functions
(layer_norm, linear, split_heads, causal_mask, attention, merge_heads, gelu) in the order
`forward.gpt2_forward` does, keeping each intermediate array; tests/teach/test_explain.py checks that its
logits equal `GPT2.forward`'s. The other helpers only call the public API (generate,
speculative_generate, exact.exact_distribution) and time or count what comes back.
The notebooks in notebooks/ use these, so that no algorithm is defined in a notebook: a helper a
notebook needs lives in gpt2np/ (usually here), where the tests can reach it.

>>> from gpt2np.model.config import PRESETS
>>> from gpt2np.checkpoints.loading import random_model
>>> trace = forward_trace(random_model(PRESETS["tiny"]), [1, 2, 3])
>>> trace.logits.shape, trace.layers[0].attention_weights.shape  # [n_seq, n_vocab], [n_head, n_seq, n_seq]
((3, 64), (2, 3, 3))
"""
import os
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from ..decoding.autoregressive import generate, generate_without_cache  # noqa: F401  (generate_without_cache: the notebooks' name)
from .exact import exact_distribution, exact_target_distribution  # noqa: F401  (the notebooks' name)
from ..checkpoints.loading import bundled_models, load_model
from ..model.forward import attention, causal_mask, gelu, layer_norm, linear, merge_heads, split_heads
from ..decoding.sampling import sample
from ..decoding.speculative import speculative_generate
from ..decoding.speculative_kernel import residual_distribution
from ..decoding.theory import alpha

REPO = Path(__file__).resolve().parents[2]  # the clone: gpt2np/teach/ is two folders down


# ---- the forward pass, one named array per step -------------------------------------------------

@dataclass(frozen=True)
class LayerTrace:
    """One transformer block's intermediates (no KV cache: all n_seq tokens at once, n_kv = n_seq)."""
    ln_1: np.ndarray               # [n_seq, n_embd]         layer_norm(x) before attention
    q: np.ndarray                  # [n_head, n_seq, d_head] queries, one slice per head
    k: np.ndarray                  # [n_head, n_seq, d_head] keys
    v: np.ndarray                  # [n_head, n_seq, d_head] values
    mask: np.ndarray               # [n_seq, n_seq]          0 or -1e10 (causal_mask)
    attention_weights: np.ndarray  # [n_head, n_seq, n_seq]  softmax(q k^T / sqrt(d_head) + mask)
    heads: np.ndarray              # [n_head, n_seq, d_head] attention_weights @ v
    attn_out: np.ndarray           # [n_seq, n_embd]         heads merged, then c_proj
    after_attn: np.ndarray         # [n_seq, n_embd]         x + attn_out (first residual)
    ln_2: np.ndarray               # [n_seq, n_embd]         layer_norm before the MLP
    mlp_hidden: np.ndarray         # [n_seq, 4*n_embd]       c_fc(ln_2), before GELU
    mlp_out: np.ndarray            # [n_seq, n_embd]         c_proj(gelu(mlp_hidden))
    after_mlp: np.ndarray          # [n_seq, n_embd]         after_attn + mlp_out: the block's output


@dataclass(frozen=True)
class ForwardTrace:
    ids: np.ndarray                  # [n_seq]
    token_embeddings: np.ndarray     # [n_seq, n_embd]  wte[ids]
    position_embeddings: np.ndarray  # [n_seq, n_embd]  wpe[0:n_seq]
    x0: np.ndarray                   # [n_seq, n_embd]  their sum: the residual stream enters block 0
    layers: list                     # one LayerTrace per block
    ln_f: np.ndarray                 # [n_seq, n_embd]  final layer norm
    logits: np.ndarray               # [n_seq, n_vocab] ln_f @ wte.T (the head is tied to wte)

    def shapes(self):
        """{name: shape} of every array, block 0 standing for all blocks: for a table in a notebook."""
        top = {name: getattr(self, name).shape for name in
               ("ids", "token_embeddings", "position_embeddings", "x0")}
        block = {f"layers[0].{name}": getattr(self.layers[0], name).shape
                 for name in LayerTrace.__dataclass_fields__}
        return {**top, **block, "ln_f": self.ln_f.shape, "logits": self.logits.shape}


def attention_weights(q, k, mask):  # [n_head, n_seq, d_head], [n_head, n_kv, d_head] -> [n_head, n_seq, n_kv]
    """softmax(q k^T / sqrt(d_head) + mask), taken from forward.attention itself.

    attention() returns weights @ v; with v = the identity matrix that product IS the weights,
    so the notebook's heat maps come from the very function the model runs.
    """
    n_head, n_kv = k.shape[0], k.shape[1]
    identity = np.broadcast_to(np.eye(n_kv, dtype=q.dtype), (n_head, n_kv, n_kv))
    return attention(q, k, identity, mask)


def block_trace(x, block, n_head):  # [n_seq, n_embd] -> LayerTrace
    """transformer_block + mha + ffn of gpt2np/model/forward.py, unrolled, with no cache (n_past = 0)."""
    ln_1 = layer_norm(x, **block["ln_1"])
    qkv = linear(ln_1, **block["attn"]["c_attn"])                         # [n_seq, 3*n_embd]
    q, k, v = split_heads(qkv, n_head)                                    # 3 x [n_head, n_seq, d_head]
    mask = causal_mask(len(x), len(x))                                    # [n_seq, n_seq]
    heads = attention(q, k, v, mask)                                      # [n_head, n_seq, d_head]
    attn_out = linear(merge_heads(heads), **block["attn"]["c_proj"])      # [n_seq, n_embd]
    after_attn = x + attn_out
    ln_2 = layer_norm(after_attn, **block["ln_2"])
    mlp_hidden = linear(ln_2, **block["mlp"]["c_fc"])                     # [n_seq, 4*n_embd]
    mlp_out = linear(gelu(mlp_hidden), **block["mlp"]["c_proj"])          # [n_seq, n_embd]
    return LayerTrace(ln_1, q, k, v, mask, attention_weights(q, k, mask), heads, attn_out,
                      after_attn, ln_2, mlp_hidden, mlp_out, after_attn + mlp_out)


def forward_trace(model, ids):  # [n_seq] -> ForwardTrace
    """gpt2_forward on a fresh context, returning every intermediate and the logits of every position."""
    params, ids = model.params, np.asarray(ids)
    if not 1 <= len(ids) <= model.n_ctx:
        raise ValueError(f"forward_trace needs 1 to n_ctx={model.n_ctx} token ids, got {len(ids)}")
    token_embeddings = params["wte"][ids]                # [n_seq, n_embd]
    position_embeddings = params["wpe"][:len(ids)]       # [n_seq, n_embd]
    x = x0 = token_embeddings + position_embeddings
    layers = []
    for block in params["blocks"]:
        layers.append(block_trace(x, block, model.config.n_head))
        x = layers[-1].after_mlp                         # the residual stream flows on
    ln_f = layer_norm(x, **params["ln_f"])
    return ForwardTrace(ids, token_embeddings, position_embeddings, x0, layers, ln_f,
                        ln_f @ params["wte"].T)           # [n_seq, n_vocab]


def mean_attention_distance(trace):  # ForwardTrace -> [n_layer, n_head]
    """How far back each head looks: sum_j weights[i, j] (i - j), averaged over the query positions i.

    0 means "only itself", 1 "the previous token"; a head that reads a fixed early token scores high.
    """
    n_seq = len(trace.ids)
    offsets = np.arange(n_seq)[:, None] - np.arange(n_seq)[None, :]  # [n_seq, n_seq]: i - j
    return np.array([(layer.attention_weights * offsets).sum(axis=-1).mean(axis=-1) for layer in trace.layers])


# ---- the KV cache changes nothing but speed -------------------------------------------------------

def incremental_logits(model, ids):  # [n_seq] -> [n_seq, n_vocab]
    """Feed ids one token at a time through ONE cache: row i = logits after ids[:i+1]."""
    cache = model.new_cache()
    return np.concatenate([model.forward(ids[i:i + 1], cache) for i in range(len(ids))])


CHECK_RUN = "GPT2NP_NOTEBOOK_CHECK"  # "1" in tests/test_notebooks.py's run of the notebooks


def repeats(n):  # -> n, or 1 in the test suite's run
    """How many times a notebook repeats a measurement: n, the number its figures and prose come from; 1
    when GPT2NP_NOTEBOOK_CHECK=1, the test suite's run, which checks that every cell runs and reads no time."""
    return 1 if os.environ.get(CHECK_RUN) == "1" else n


def best_time(fn, repeats=3, clock=time.perf_counter):
    """(result, seconds): the fastest of `repeats` calls, the usual way to time on a busy machine.

    clock: the timer read before and after each call (tests pass a scripted one)."""
    seconds, result = [], None
    for _ in range(repeats):
        start = clock()
        result = fn()
        seconds.append(clock() - start)
    return result, min(seconds)


# ---- finding models and vocabularies --------------------------------------------------------------

def load_bundled_pair():
    """(target, draft): the largest and the smallest bundled model (see gpt2np/bundled/)."""
    names = bundled_models()
    if len(names) < 2:
        raise FileNotFoundError("the bundled draft/target pair is missing from gpt2np/bundled/: "
                                "train it with python tools/train_pair.py")
    models = sorted((load_model(name) for name in names), key=lambda m: m.config.n_params())
    return models[-1], models[0]


def openai_vocab_dir():
    """A folder with OpenAI's encoder.json + vocab.bpe (never committed here), or None.

    Looked for in ../shared/data/gpt2-bpe beside the repository, then in a downloaded weights/<size>/.
    """
    candidates = [REPO.parent / "shared" / "data" / "gpt2-bpe", *sorted((REPO / "weights").glob("*M"))]
    return next((d for d in candidates if (d / "encoder.json").is_file() and (d / "vocab.bpe").is_file()), None)


# ---- reading distributions ------------------------------------------------------------------------

def top_tokens(probs, tokenizer, n=10):
    """[(token id, its text, probability)] for the n most probable tokens, most probable first."""
    ids = np.argsort(-probs, kind="stable")[:n]
    return [(int(i), tokenizer.decode([int(i)]), float(probs[i])) for i in ids]


VISIBLE = {"\n": "⏎", " ": "␣", "\t": "⇥"}  # whitespace drawn as a visible symbol in labels


def token_labels(tokenizer, ids):
    """One visible label per token, for plot axes and aligned printing.

    >>> from gpt2np.tokenizer.bpe import Tokenizer, bytes_to_unicode
    >>> token_labels(Tokenizer({s: i for i, s in enumerate(bytes_to_unicode().values())}, []), [71, 220, 198])
    ['h', '␣', '⏎']
    """
    labels = []
    for i in ids:
        text = tokenizer.decode_bytes([int(i)]).decode("utf-8", errors="backslashreplace")
        labels.append("".join(VISIBLE.get(c, c if c.isprintable() else repr(c)[1:-1]) for c in text))
    return labels


def entropy_bits(probs):  # [..., n_vocab] -> [...]
    """Shannon entropy in bits; tokens with probability 0 contribute 0."""
    p = np.asarray(probs, dtype=np.float64)
    return 0.0 - np.sum(p * np.log2(np.where(p > 0, p, 1.0)), axis=-1)  # 0.0 - x: never print "-0.00"


def sample_counts(probs, n_samples, rng):  # [n_vocab] -> [n_vocab] ints
    """How often each token comes up in n_samples draws of sampling.sample (the package's only sampler)."""
    return np.bincount([sample(probs, rng) for _ in range(n_samples)], minlength=len(probs))


# ---- speculative decoding: measured against the theory --------------------------------------------

def speculative_sweep(target, draft, prompt_ids, n_tokens, Ks, temperature=1.0, seed=0, repeats=3, **options):
    """Time target-only `generate` against `speculative_generate` at each K, same options and seed.

    Returns {"autoregressive_seconds": s, "rows": [{"K", "seconds", "measured_speedup", "stats"}, ...]}:
    the fastest of `repeats` runs of each, and the SpeculativeStats of the last run at each K (with
    the alpha_hat, c, v and Thm 3.8 predictions the notebooks plot against the measurement). The
    runs are interleaved (plain, K_1, K_2, ..., then again), so that a busy spell on a shared
    machine slows all of them rather than one. The speculative runs are asked to calibrate c and v
    (a few one-token target calls after the run); their seconds count generation alone.
    """
    def plain():
        return generate(target, prompt_ids, n_tokens, temperature, rng=np.random.default_rng(seed), **options)

    def speculative(K):
        return speculative_generate(target, draft, prompt_ids, n_tokens, K, temperature,
                                    rng=np.random.default_rng(seed), calibrate=True, **options)
    ar_seconds, seconds, results = float("inf"), {K: float("inf") for K in Ks}, {}
    for _ in range(repeats):
        ar_seconds = min(ar_seconds, best_time(plain, 1)[1])
        for K in Ks:
            results[K], run_seconds = best_time(partial(speculative, K), 1)
            seconds[K] = min(seconds[K], run_seconds - results[K].stats.calibration_seconds)  # generation alone
    rows = [{"K": K, "seconds": seconds[K], "measured_speedup": ar_seconds / seconds[K], "stats": results[K].stats}
            for K in Ks]
    return {"autoregressive_seconds": ar_seconds, "rows": rows}


# ---- distribution recovery: exact and sampled -----------------------------------------------------

def output_decomposition(p, q):  # [n_vocab], [n_vocab] -> ([n_vocab], [n_vocab])
    """The two ways one verification step emits token x, when x_draft ~ q (Leviathan Thm 3.5 / A.1):

    accepted[x]  = q(x) min(1, p(x)/q(x)) = min(p, q)(x)        the draft proposed x and it was kept
    resampled[x] = (1 - sum min(p, q)) norm(max(0, p - q))(x)   a rejection, then x from the residual
    Their sum is speculative_kernel.output_distribution(p, q), which equals p.
    """
    return np.minimum(p, q), (1.0 - alpha(p, q)) * residual_distribution(p, q)


def exact_speculative_distribution(target, draft, prompt_ids, n_tokens, K, **options):
    """The same for speculative_generate; options may include kernel= or draft_sampler= (broken variants)."""
    return exact_distribution(lambda rng: tuple(
        speculative_generate(target, draft, prompt_ids, n_tokens, K, rng=rng, **options).tokens))


def sampled_sequences(sampler, n_samples, seed=0):
    """Counter of tuple(sampler(rng)) over n_samples calls sharing one seeded generator."""
    rng = np.random.default_rng(seed)
    return Counter(tuple(sampler(rng)) for _ in range(n_samples))


def sample_target(target, prompt_ids, n_tokens, n_samples, seed=0, **options):
    """Counter of the sequences that n_samples runs of generate(target, ...) produce."""
    return sampled_sequences(lambda rng: generate(target, prompt_ids, n_tokens, rng=rng, **options),
                             n_samples, seed)


def sample_speculative(target, draft, prompt_ids, n_tokens, K, n_samples, seed=0, **options):
    """Counter of the sequences that n_samples runs of speculative_generate produce."""
    return sampled_sequences(lambda rng: speculative_generate(
        target, draft, prompt_ids, n_tokens, K, rng=rng, **options).tokens, n_samples, seed)


# ---- token trees against chains ------------------------------------------------------------------

def tree_sweep(target, draft, prompt_ids, n_tokens, shapes, temperature=0.0, seed=0, repeats=3):
    """Tokens per target call and tokens/s of speculative decoding with each shape: an int K is a
    chain of K drafts, a tuple a token tree (speculative_generate's tree=), "auto" the shape chosen
    each round (tree="auto"), "auto K" the auto K policy's chains. Runs interleaved (one of
    each shape, then again: a busy spell slows them all), the fastest of `repeats` per shape.

    Returns one row per shape: {"shape", "tokens_per_target_call", "tokens_per_second",
    "drafted_per_round", "alpha_empirical"}, the statistics from the last run of each.
    """
    def run(shape):
        kwargs = dict(tree=shape) if isinstance(shape, tuple) or shape == "auto" else \
            dict(K="auto") if shape == "auto K" else dict(K=shape)
        return speculative_generate(target, draft, prompt_ids, n_tokens, temperature=temperature,
                                    rng=np.random.default_rng(seed), **kwargs)
    seconds, stats = {shape: float("inf") for shape in shapes}, {}
    for _ in range(repeats):
        for shape in shapes:
            result, run_seconds = best_time(partial(run, shape), 1)
            seconds[shape], stats[shape] = min(seconds[shape], run_seconds), result.stats
    return [{"shape": shape, "tokens_per_target_call": stats[shape].tokens_per_target_call,
             "tokens_per_second": n_tokens / seconds[shape],
             "drafted_per_round": stats[shape].drafted / stats[shape].rounds,
             "alpha_empirical": stats[shape].alpha_empirical} for shape in shapes]


def tree_sweep_lines(rows):
    """tree_sweep's rows as a table, each against the best chain (by tokens/s)."""
    chains = [r for r in rows if isinstance(r["shape"], int)]
    best = max(chains, key=lambda r: r["tokens_per_second"]) if chains else None
    lines = [f"{'shape':<14} {'tokens/call':>11} {'tokens/s':>9} {'vs best chain':>13} {'drafted/round':>13}"]
    for r in rows:
        name = f"tree {','.join(map(str, r['shape']))}" if isinstance(r["shape"], tuple) else \
            f"chain K={r['shape']}" if isinstance(r["shape"], int) else f"{r['shape']}" if r["shape"] == "auto K" \
            else f"tree {r['shape']}"
        ratio = f"{r['tokens_per_second'] / best['tokens_per_second']:.2f}x" if best else "-"
        lines.append(f"{name:<14} {r['tokens_per_target_call']:>11.2f} {r['tokens_per_second']:>9.1f} {ratio:>13} "
                     f"{r['drafted_per_round']:>13.1f}")
    return "\n".join(lines)
