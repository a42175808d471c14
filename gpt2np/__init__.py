"""gpt2np: GPT-2 from scratch in NumPy, built to teach and measure speculative decoding.

The public API (everything the notebooks, tests, benchmarks and main.py use):

    model = gpt2np.load_model("124M")                  # size name, bundled name, or folder
    ids = model.tokenizer.encode("Alan Turing theorized that")
    out = gpt2np.generate(model, ids, n_tokens=20, temperature=0)
    print(model.tokenizer.decode(out))

    cache = model.new_cache()                          # preallocated KV cache
    logits = model.forward(ids, cache, n_logits=1)     # [1, n_vocab]; cache.truncate(n) rolls back

    result = gpt2np.speculative_generate(target, draft, ids, n_tokens=40, K=4,
                                         temperature=0.8, rng=np.random.default_rng(0))
    result.tokens, result.provenance, result.stats

    drafter = gpt2np.load_drafter("ngram")             # prompt lookup; or a model name
    stream = gpt2np.speculative_stream(target, drafter, ids, n_tokens=40, K="auto", temperature=0)
    for event in stream:                               # one RoundEvent per round, as it happens
        print(event.tokens, event.provenance)
    stream.result.stats
"""
import os

# OpenBLAS's idle threads spin for 2^28 cycles (~0.1 s) after every threaded product, holding the
# core that matmul.py's second thread then needs: a 355M verification pass right after one-token
# calls cost 2.45 one-token passes instead of ~1.7. 2^20 cycles (~0.4 ms) still spans the gaps
# inside a decode step. OpenBLAS reads this once, when NumPy loads it, so it only applies if
# gpt2np is imported before NumPy (main.py and bench do that); otherwise everything works the
# same, verification just runs slower.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from .autoregressive import generate, plain_stream  # noqa: E402  (after the line above)
from .config import PRESETS, GPT2Config
from .drafters import ModelDrafter, NgramDrafter
from .kv_cache import KVCache
from .matmul import blas_kernel
from .loading import RELEASE_SIZES, bundled_models, load_drafter, load_model, random_model
from .model import GPT2
from .policies import make_policy
from .sampling import check_sampling_options, sample, sampling_distribution
from .speculative import speculative_generate, speculative_stream
from .stream import RoundEvent, Stream

__all__ = [
    "GPT2", "GPT2Config", "KVCache", "ModelDrafter", "NgramDrafter", "PRESETS", "RELEASE_SIZES",
    "RoundEvent", "Stream", "blas_kernel", "bundled_models", "check_sampling_options", "generate", "load_drafter",
    "load_model", "make_policy", "plain_stream", "random_model", "sample", "sampling_distribution",
    "speculative_generate", "speculative_stream",
]
