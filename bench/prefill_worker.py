"""One side of the prefill pair (prefill_pair.py): a process that builds one model once and times prefills.

    python -m bench.prefill_worker numpy|hf --config '{"n_vocab": 50257, "n_ctx": 1024, ...}' [--threads N]

  numpy  gpt2np.random_model(config, seed=0); one turn = cache.truncate(0), then
         model.forward(ids, cache, n_logits=1) (the cache is allocated once, before the first turn)
  hf     transformers.GPT2LMHeadModel of the same config (bench.hf.hf_model: fp32, eval, its own
         random initialiser), under torch.no_grad; one turn = model(input_ids, use_cache=True,
         logits_to_keep=1) (num_logits_to_keep on transformers older than 4.45; a plain call if
         the model takes neither: `hf_call` in the ready line says which)
Both apply --threads to BLAS through threadpoolctl (as `python -m bench --threads` does in the
parent), and the hf worker also to torch.set_num_threads (else torch keeps its default).

Protocol, one line each way. Once its model is built the worker prints `ready {json}` (what it
runs: impl, call, threads, versions), then answers each command read from stdin:
  prefill N   time one prefill of N tokens, bench.common.random_ids(N, n_vocab) (the same ids in
              both workers), and answer `seconds S` (the forward call alone, ids already built)
  quit        exit (end of input too)
A command it cannot run is answered `error MESSAGE` and the worker goes on. Only protocol lines go
to stdout: everything else that writes to file descriptor 1 is sent to stderr.
"""
import gpt2np  # noqa: F401,I001  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)

import argparse
import inspect
import json
import os
import sys
import time

from gpt2np.model.config import GPT2Config

from .common import blas_limits, random_ids


class NumpyPrefill:
    """gpt2np's prefill: one forward into a cache emptied by truncate(0), logits of the last row."""

    def __init__(self, config, threads):
        self.model = gpt2np.random_model(config, seed=0, tokenizer=None)
        self.cache = self.model.new_cache()
        self.info = {"impl": "gpt2np", "call": "model.forward(ids, cache, n_logits=1)"}

    def __call__(self, ids):
        self.cache.truncate(0)
        start = time.perf_counter()
        self.model.forward(ids, self.cache, n_logits=1)
        return time.perf_counter() - start


class HFPrefill:
    """Hugging Face's prefill: one call with a fresh cache, logits of the last row where the model allows."""

    def __init__(self, config, threads):
        import torch
        import transformers

        from .hf import hf_model
        if threads:
            torch.set_num_threads(threads)
        self.torch, self.model = torch, hf_model(config)
        params = inspect.signature(self.model.forward).parameters
        keyword = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.kwargs = {"use_cache": True, **({keyword: 1} if keyword else {})}
        self.info = {"impl": "hf", "hf_call": keyword or "plain", "torch_threads": torch.get_num_threads(),
                     "call": "model(input_ids, " + ", ".join(f"{k}={v}" for k, v in self.kwargs.items()) + ")",
                     "torch": torch.__version__, "transformers": transformers.__version__}

    def __call__(self, ids):
        input_ids = self.torch.tensor([ids])
        with self.torch.no_grad():
            start = time.perf_counter()
            self.model(input_ids, **self.kwargs)
            return time.perf_counter() - start


KINDS = {"numpy": NumpyPrefill, "hf": HFPrefill}


def blas_threads():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return [b.get("num_threads") for b in threadpool_info() if b.get("user_api") == "blas"]


def protocol_stdout():
    """A text stream on the real stdout for protocol lines; fd 1 itself (C libraries, print) now goes to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(prefill, n_vocab, stdin, out):
    """Answer commands until `quit` or end of input (see the module docstring)."""
    while True:
        line = stdin.readline()
        words = line.split()
        if not line or words == ["quit"]:
            return
        try:
            if len(words) != 2 or words[0] != "prefill":
                raise ValueError(f"unknown command {line.strip()!r}")
            ids = random_ids(int(words[1]), n_vocab)
            out.write(f"seconds {prefill(ids)!r}\n")
        except Exception as e:  # the parent gets the reason; this worker stays usable
            out.write(f"error {type(e).__name__}: {' '.join(str(e).split())}\n")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.prefill_worker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--config", required=True, help="GPT2Config fields as a JSON object")
    ap.add_argument("--threads", type=int, default=None, help="BLAS (and torch) threads; default: their own")
    args = ap.parse_args(argv)
    out = protocol_stdout()
    config = GPT2Config(**json.loads(args.config))
    prefill = KINDS[args.kind](config, args.threads)
    limits = blas_limits(args.threads)  # noqa: F841  kept for the worker's lifetime; after the imports,
                                       # so it covers every BLAS loaded
    info = {**prefill.info, "pid": os.getpid(), "threads_requested": args.threads, "blas_threads": blas_threads()}
    out.write(f"ready {json.dumps(info)}\n")
    serve(prefill, config.n_vocab, sys.stdin, out)


if __name__ == "__main__":
    main()
