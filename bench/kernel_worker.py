"""One OpenBLAS kernel's run of the kernels section (kernels.py): a process that measures one model once.

    python -m bench.kernel_worker --config '{"n_vocab": 50257, ...}' [--threads N] [--max-m 16]
                                  [--repeats R] [--context 128] [--bandwidth-mib 1024]

OpenBLAS picks its kernel when NumPy loads it (OPENBLAS_CORETYPE forces one), so the parent starts
one of these per kernel, with that kernel's environment. The worker builds
gpt2np.random_model(config, seed=0), fills its cache to --context random tokens, and measures:
  bandwidth  best gemv pass over a --bandwidth-mib buffer (bench.bandwidth.Probe: larger than L3)
  decode     bench.decode.measure_decode at the context: s/token, over the roofline (weight bytes
             per token + KV bytes at the context) / that bandwidth, and paired with a gemv pass
  verify     bench.decode.measure_verify, M = 1..--max-m new tokens at the context, twice: with
             gpt2np's few-row methods ("gpt2np"), then with gpt2np.model.fast.matmul.METHODS emptied so that
             every product is plain x @ w on the weights as stored ("plain"), and plain again with every
             weight copied row-major ("plain_row_major": its own one-token pass is its M = 1)
  methods    per M, the method gpt2np.model.fast.matmul.method_for picks for a column-major [n_embd, 4 n_embd]
             weight (c_fc's shape), which names what the "gpt2np" curve ran
It prints one JSON object on stdout (with the kernel's threadpoolctl name and gpt2np.blas_kernel()
line); progress and everything else goes to stderr. --threads limits BLAS through threadpoolctl.
"""
import gpt2np  # noqa: F401,I001  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)

import argparse
import json
import os

import numpy as np

import gpt2np.model.fast.matmul
from gpt2np.model.config import GPT2Config

from .bandwidth import Probe, best_rate
from .common import blas_limits, log, random_ids
from .decode import fill_cache, measure_decode, measure_verify
from .prefill_worker import blas_threads, protocol_stdout

ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # what chose the kernel, as this process saw it


def methods_by_m(config, max_m):
    """{str(m): method} gpt2np.model.fast.matmul picks for m rows times a column-major c_fc-shaped weight."""
    w = np.asfortranarray(np.empty((config.n_embd, 4 * config.n_embd), np.float32))
    return {str(m): gpt2np.model.fast.matmul.method_for(m, w) for m in range(1, max_m + 1)}


def gemv_bandwidth(n_bytes, repeats):
    """(best gemv GB/s, the Probe for decode's paired ratios) over a buffer of n_bytes."""
    probe = Probe(n_bytes)
    rate = best_rate(lambda: probe.A @ probe.x, probe.A.nbytes, repeats)
    return rate["best_gbps"], probe


def measure(config, context, max_m, repeats, bandwidth_bytes):
    kernel = gpt2np.model.fast.matmul.KERNEL
    log(f"{kernel}: building a random model ({config.n_layer} layers, n_embd {config.n_embd})")
    model = gpt2np.random_model(config, seed=0, tokenizer=None)
    cache = model.new_cache()
    fill_cache(model, cache, random_ids(context, config.n_vocab))
    extra = random_ids(max_m, config.n_vocab, seed=2)
    log(f"{kernel}: gemv bandwidth and decode at context {context}")
    gbps, probe = gemv_bandwidth(bandwidth_bytes, max(repeats, 5))
    decode = measure_decode(model, cache, context, extra[0], repeats, gbps, probe)
    del probe  # the verification curves need no buffer beside the model
    out = {"kernel": kernel, "blas_kernel": gpt2np.blas_kernel(), "measured": kernel in gpt2np.model.fast.matmul.METHODS,
           "methods": methods_by_m(config, max_m), "bandwidth_gbps": gbps, "decode": decode, "verify": {}}
    log(f"{kernel}: verification curve M = 1..{max_m}, gpt2np's methods")
    out["verify"]["gpt2np"] = measure_verify(model, cache, context, extra, max_m, repeats)
    log(f"{kernel}: verification curve M = 1..{max_m}, plain x @ w")
    gpt2np.model.fast.matmul.METHODS = {}  # method_for now answers "plain" for every product (this process ends next)
    out["verify"]["plain"] = measure_verify(model, cache, context, extra, max_m, repeats)
    log(f"{kernel}: verification curve M = 1..{max_m}, plain x @ w on row-major copies of the weights")
    make_row_major(model.params)
    out["verify"]["plain_row_major"] = measure_verify(model, cache, context, extra, max_m, repeats)
    return out


def make_row_major(node):  # params, in place: every array replaced by a C-contiguous copy
    """The layout question (PERFORMANCE.md, Batching): gpt2np stores weights of 2 MiB and more column-major,
    which its few-row methods need; plain sgemm under some kernels packs row-major weights faster. One
    array at a time, each column-major one freed as its copy replaces it: at 1558M a second copy of
    every weight at once would take another 6 GB."""
    for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
        if isinstance(value, (dict, list)):
            make_row_major(value)
        else:
            node[key] = np.ascontiguousarray(value)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.kernel_worker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="GPT2Config fields as a JSON object")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads; default: BLAS's own")
    ap.add_argument("--max-m", type=int, default=16, help="the verification curve's largest M")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement, after a warm-up")
    ap.add_argument("--context", type=int, default=128, help="tokens cached before each measured forward")
    ap.add_argument("--bandwidth-mib", type=int, default=1024, help="the gemv bandwidth buffer, MiB")
    args = ap.parse_args(argv)
    out = protocol_stdout()  # stdout carries the JSON alone
    config = GPT2Config(**json.loads(args.config))
    if args.context + args.max_m > config.n_ctx:
        raise SystemExit(f"context {args.context} + M {args.max_m} exceeds n_ctx {config.n_ctx}")
    limits = blas_limits(args.threads)  # noqa: F841  kept for the worker's lifetime
    result = measure(config, args.context, args.max_m, args.repeats, args.bandwidth_mib << 20)
    result.update({"env": {k: os.environ.get(k) for k in ENV_VARS}, "pid": os.getpid(),
                   "threads_requested": args.threads, "blas_threads": blas_threads()})
    out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
