"""gpt2np: GPT-2 from scratch in NumPy, built to teach and measure speculative decoding.

The public API (everything the notebooks, tests, benchmarks and main.py use):

    import gpt2np                                      # before NumPy, or after it: either order is as fast
    model = gpt2np.load_model("124M")                  # size name, bundled name, or folder
    ids = model.tokenizer.encode("Alan Turing theorized that")
    out = gpt2np.generate(model, ids, 20)              # greedy: no temperature and no rng given
    print(model.tokenizer.decode(out))
    gpt2np.generate(model, ids, 20, temperature=0.8, rng=np.random.default_rng(0))   # sampling
    gpt2np.generate(model, ids, 20, stop_tokens=model.tokenizer.encode("\\n"))      # ends at a newline

    cache = model.new_cache()                          # preallocated KV cache
    logits = model.forward(ids, cache, n_logits=1)     # [1, n_vocab]; cache.truncate(n) rolls back

    gpt2np.order_for_batches(model)                    # the weights' memory order for many rows a pass, by BLAS kernel
    outs = gpt2np.generate_batch(model, [ids, ids[:3]], 20)   # several prompts, one forward pass per step

    result = gpt2np.speculative_generate(target, draft, ids, n_tokens=40, K=4,
                                         temperature=0.8, rng=np.random.default_rng(0))
    result.tokens, result.provenance, result.stats

    drafter = gpt2np.load_drafter("ngram")             # prompt lookup; or a model name
    stream = gpt2np.speculative_stream(target, drafter, ids, n_tokens=40, K="auto", temperature=0)
    for event in stream:                               # one RoundEvent per round, as it happens
        print(event.tokens, event.provenance)
    stream.result.stats

Every generation function (generate, plain_stream, generate_without_cache, speculative_generate,
speculative_stream) takes (model or target, [draft,] prompt_ids, n_tokens) in that order, checked
first (another order is a one-line ValueError naming the argument); the options after them are
keywords (speculative_stream's K, generate's and generate_without_cache's temperature, and
speculative_generate's K and temperature may still come by position; K_max is keyword-only
everywhere), with these defaults:

    argument      default  meaning
    temperature   None     0 (greedy: the argmax, no randomness) when no rng is given; 1.0 when one is
    top_k, top_p  None     keep every token (Hugging Face's meanings)
    rng           None     greedy needs none; sampling (temperature > 0) needs your np.random.Generator,
                           np.random.default_rng(seed): never a hidden or global one
    stop_tokens   None     ids that end generation like <|endoftext|> (one id or a list); the stop
                           token is kept as the last one, and eot_id always stops
    K             4        drafts per round, or "heuristic" / "auto" (speculative only)
    K_max         8        the most drafts "heuristic" and "auto" may ask for (speculative only)

A speculative run gives exactly what plain decoding gives with the same arguments: the same tokens
at temperature 0, the same distribution when sampling, stop tokens included.

The package is layered; each folder is a chapter, and imports only go downwards (import-linter
checks it: pyproject.toml):

    console/  serve/  cli/            the outer ring: commands that only call the layers below: the console,
    classroom.py  compare.py          the server, main.py (cli/), the classroom, and llama-ssp's two modes
    latency.py                        (python -m gpt2np.compare, python -m gpt2np.latency)
    teach/                            classroom experiments, exact enumeration, chi-square, notebooks' helpers
    report.py                         coloured tokens and statistics tables
    decoding/   checkpoints/          sampling, plain and speculative decoding | files -> a ready model
    model/      tokenizer/            the forward pass (model/fast/: its speed code) | text <-> token ids
"""
from .model import fast  # noqa: F401,I001  first: sets OpenBLAS's thread timeout before NumPy loads (model/fast)

from .checkpoints.download import DownloadError
from .checkpoints.loading import RELEASE_SIZES, bundled_models, has_tokenizer, known_n_vocab, load_model, random_model
from .decoding.batched import batch_stream, generate_batch
from .decoding.batched_speculative import speculative_batch_stream, speculative_generate_batch
from .decoding.continuous import ContinuousBatch
from .decoding.continuous_speculative import ContinuousSpeculativeBatch
from .decoding.autoregressive import (check_generation_request, generate, generate_without_cache, plain_stream,
                                     request_cache)
from .decoding.drafters import ModelDrafter, NgramDrafter, check_same_vocabulary, check_vocabulary_size
from .decoding.policies import K_MAX_LIMIT, POLICIES, make_policy
from .decoding.sampling import check_sampling_options, is_greedy, sample, sampling_distribution
from .decoding.speculative import SpeculativeResult, speculative_generate, speculative_stream
from .decoding.stream import RoundEvent, Stream
from .model.config import PRESETS, GPT2Config
from .model.fast.matmul import blas_kernel
from .model.fast.layout import order_for_batches, set_weights_order, weights_order
from .model.forward import GPT2
from .model.kv_cache import KVCache

__all__ = [
    "ContinuousBatch", "ContinuousSpeculativeBatch",
    "DownloadError", "GPT2", "GPT2Config", "KVCache", "K_MAX_LIMIT", "ModelDrafter", "NgramDrafter", "POLICIES", "PRESETS",
    "RELEASE_SIZES", "RoundEvent", "SpeculativeResult", "Stream", "batch_stream", "blas_kernel", "bundled_models",
    "check_generation_request", "check_same_vocabulary", "check_sampling_options", "generate",
    "generate_batch", "generate_without_cache", "has_tokenizer", "is_greedy", "load_drafter", "load_model", "make_policy", "plain_stream",
    "order_for_batches", "random_model", "request_cache", "sample", "sampling_distribution", "set_weights_order",
    "speculative_batch_stream", "speculative_generate", "speculative_generate_batch", "speculative_stream",
    "weights_order",
]


def load_drafter(name_or_dir, models_dir="weights", base_url=None, n_max=3, hf_endpoint=None, target=None):
    """"ngram" -> prompt lookup (NgramDrafter(n_max)); any model name -> ModelDrafter(load_model(...)).
    target: where given, a draft model must share its vocabulary (check_same_vocabulary), a size the name
    says (random:<size>) refused before the weights are built (random:1558M's take about 30 s).

    Here, at the top, because it joins two layers that know nothing of each other: decoding (the
    drafters) and checkpoints (loading a model by name)."""
    if str(name_or_dir) == "ngram":
        return NgramDrafter(n_max=n_max)
    if target is not None:
        check_vocabulary_size(target.n_vocab, known_n_vocab(name_or_dir))
    model = load_model(name_or_dir, models_dir, base_url, hf_endpoint=hf_endpoint)
    if target is not None:
        check_same_vocabulary(target, model)
    return ModelDrafter(model)
