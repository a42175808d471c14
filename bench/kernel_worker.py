"""One OpenBLAS kernel's run of the kernels section (kernels.py): a process that measures one model once.

    python -m bench.kernel_worker --config '{"n_vocab": 50257, ...}' [--threads N] [--max-m 16]
                                  [--repeats R] [--context 128] [--bandwidth-mib 1024]

OpenBLAS picks its kernel when NumPy loads it (OPENBLAS_CORETYPE forces one), so the parent starts
one of these per kernel, with that kernel's environment. The worker builds
gpt2np.random_model(config, seed=0), fills its cache to --context random tokens, and measures:
  bandwidth  best gemv pass over a --bandwidth-mib buffer (bench.bandwidth.Probe: larger than L3)
  decode     bench.decode.measure_decode at the context: s/token, over the roofline (weight bytes
             per token + KV bytes at the context) / that bandwidth, and paired with a gemv pass
  verify     bench.decode.measure_verify, M = 1..--max-m new tokens at the context, five times: with
             gpt2np's few-row methods on the weights as stored on disk, column-major ("gpt2np": what a
             loaded model runs under every kernel but SkylakeX's, which loads them in panels), made row-major as a batching
             server makes them under the Haswell kernels ("gpt2np_row_major", gpt2np.model.fast.layout) and
             cut into panels as it makes them under SkylakeX ("gpt2np_panels": matmul.by_panels), then with
             gpt2np.model.fast.matmul.METHODS emptied so that every product is plain x @ w, on the
             row-major weights ("plain_row_major") and on the stored ones ("plain"); each curve's M = 1 is
             its own one-token pass
  methods    per M, the method gpt2np.model.fast.matmul.method_for picks for a [n_embd, 4 n_embd] weight
             (c_fc's shape), column-major as stored ("methods") and row-major ("methods_row_major"): what
             the two gpt2np curves ran
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
from gpt2np.model.fast.layout import panels_fit, set_weights_order

from .bandwidth import Probe, best_rate
from .common import blas_limits, log, random_ids
from .decode import fill_cache, measure_decode, measure_verify
from .prefill_worker import blas_threads, protocol_stdout

ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # what chose the kernel, as this process saw it


def methods_by_m(config, max_m, order=np.asfortranarray):
    """{str(m): method} gpt2np.model.fast.matmul picks for m rows times a c_fc-shaped weight in that order."""
    w = order(np.empty((config.n_embd, 4 * config.n_embd), np.float32))
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
           "methods": methods_by_m(config, max_m),
           "methods_row_major": methods_by_m(config, max_m, np.ascontiguousarray),
           "bandwidth_gbps": gbps, "decode": decode, "verify": {}}
    for curve, order, what in (("gpt2np", "column-major", "gpt2np's methods"),
                               ("gpt2np_row_major", "row-major", "gpt2np's methods, row-major weights"),
                               ("gpt2np_panels", "panels", "gpt2np's methods, weights in panels"),
                               ("plain_row_major", "row-major", "plain x @ w, row-major weights"),
                               ("plain", "column-major", "plain x @ w")):
        if curve.startswith("plain"):
            gpt2np.model.fast.matmul.METHODS = {}  # method_for now answers "plain" (this process ends next)
        if order == "panels" and not panels_fit(model):
            continue                           # n_embd not in whole panels (none of GPT-2's releases)
        set_weights_order(model, order)  # one weight at a time, and only where the order changes (model/fast/layout.py)
        log(f"{kernel}: verification curve M = 1..{max_m}, {what}")
        out["verify"][curve] = measure_verify(model, cache, context, extra, max_m, repeats)
    return out


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
