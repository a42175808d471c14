"""What a product over M rows costs against one row, under each OpenBLAS kernel this CPU can run.

Verifying K draft tokens is one forward pass over M = K + 1 rows, and its cost relative to a
one-row pass is the v in theory.predicted_speedup. Most of a pass is products x @ w, so the
product-level curve t(M) / t(1) shows where v comes from (notebook 07 plots it):

    product_curve(max_m, repeats)      t(M) / t(1), M = 1..max_m, in this process: plain x @ w on a
                                       row-major w, and gpt2np's matmul on a column-major w
    blas_kernel_envs()                 {kernel name: environment}: the OpenBLAS kernels this CPU runs
    product_curve_in_child(env, ...)   product_curve in a child process with that environment
    gemv_rates()                       GB/s of gemv reading weights from memory and from cache

OpenBLAS picks its kernel once, when NumPy loads it (OPENBLAS_CORETYPE forces one), so a second
kernel can only be measured in a second process. Times on a shared machine are noisy; the ratios,
taken within one process and one repeat, are what these functions are for.

>>> curve = product_curve(max_m=2, repeats=1, shape=(64, 256), cold_bytes=1 << 20)
>>> curve["m"], curve["ratio"]["plain"][0], curve["ratio"]["gpt2np"][0]
([1, 2], 1.0, 1.0)
"""
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from statistics import median

import numpy as np
from threadpoolctl import threadpool_limits

from ..model.fast.matmul import KERNEL, blas_kernel, matmul
from ..decoding.theory import predicted_speedup
from ..model.fast.threads import blas_single_threaded, cpu_flags  # noqa: F401  (cpu_flags: notebook 07's and the tests' name)

REPO = Path(__file__).resolve().parents[2]  # the clone: gpt2np/teach/ is two folders down
KERNEL_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # read by OpenBLAS once, when NumPy loads it
# Kernels a child process can be made to run: {name: (the CPU flag it needs, the variables that force it)}
FORCED = {"Haswell": ("avx2", {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"})}
SHAPE = (1024, 4096)     # [in, out]: GPT-2 355M's MLP up-projection, 16 MiB of float32
COLD_BYTES = 96 << 20    # weights cycled through, 3x this machine's 32 MiB L3: each product reads its w from memory
BLOCK_BYTES = 512 << 10  # the weights matmul's "rows" method multiplies by every row before moving on
PRODUCTS = {"plain": "x @ w, w row-major", "gpt2np": "gpt2np.model.fast.matmul, w column-major"}


def kernel_name():
    """OpenBLAS's name for the kernel running in this process ("SkylakeX", "Haswell", ...)."""
    return KERNEL or "not OpenBLAS"


def weight_stack(shape, n_bytes):  # -> ([n, in, out] row-major, [n, in, out] column-major)
    """n distinct [in, out] weights filling n_bytes (at least one), as two views of ONE buffer: row-major
    (each input's weights contiguous, as x @ w wants them) and column-major (each output's, as gpt2np
    stores GPT-2's weights). Non-zero values: pages of zeros could be shared and never read."""
    n_in, n_out = shape
    n = max(1, n_bytes // (4 * n_in * n_out))
    flat = np.full(n * n_in * n_out, 0.5, dtype=np.float32)
    return flat.reshape(n, n_in, n_out), flat.reshape(n, n_out, n_in).transpose(0, 2, 1)


def pass_seconds(product, x, weights):  # x [m, in], weights [n, in, out] -> seconds per product
    """product(x, w) for every w in weights, in turn: the mean seconds of one product. The weights are
    distinct and fill more than the last-level cache, so each read comes from memory."""
    start = time.perf_counter()
    for w in weights:
        product(x, w)                                                     # [m, in] @ [in, out] -> [m, out]
    return (time.perf_counter() - start) / len(weights)


def ratios_to_one_row(times):  # {m: [seconds, one per repeat]} -> [median t(M) / t(1), by M]
    """t(M) / t(1) within each repeat, then the median over repeats: a busy spell on a shared machine
    slows the numerator and the denominator of one repeat alike."""
    return [median(t / t1 for t, t1 in zip(times[m], times[1])) for m in sorted(times)]


def product_curve(max_m=12, repeats=5, shape=SHAPE, cold_bytes=COLD_BYTES, threads=None):
    """Seconds per [M, in] x [in, out] product and t(M) / t(1), M = 1..max_m, for each of PRODUCTS.

    Each timing is one pass over a stack of distinct weights (cold_bytes of them, so they come from
    memory, as in a forward pass). Within a repeat every M is timed with both products one after the
    other, their order flipping every repeat. threads: BLAS threads while measuring (default: as set).
    Returns {"kernel", "blas", "shape", "n_weights", "m", "seconds": {product: [...]}, "ratio": {...}}
    with lists indexed by M - 1: seconds are medians, ratios those of ratios_to_one_row.
    """
    row_major, column_major = weight_stack(shape, cold_bytes)
    calls = {"plain": (np.matmul, row_major), "gpt2np": (matmul, column_major)}
    ms = list(range(1, max_m + 1))
    xs = {m: np.full((m, shape[0]), 0.5, dtype=np.float32) for m in ms}   # [m, in]
    times = {name: {m: [] for m in ms} for name in PRODUCTS}
    with threadpool_limits(threads, user_api="blas") if threads else nullcontext():
        blas = blas_kernel()
        for r in range(-1, repeats):
            for m in ms:
                for name in list(PRODUCTS)[::-1 if r % 2 else 1]:
                    seconds = pass_seconds(calls[name][0], xs[m], calls[name][1])
                    if r >= 0:  # r = -1 is a warm-up: pages faulted in, helper threads started
                        times[name][m].append(seconds)
    return {"kernel": kernel_name(), "blas": blas, "shape": list(shape), "n_weights": len(row_major), "m": ms,
            "seconds": {name: [median(by_m[m]) for m in ms] for name, by_m in times.items()},
            "ratio": {name: ratios_to_one_row(by_m) for name, by_m in times.items()}}


# ---- other kernels, in child processes ----

def kernel_env(forced=None):
    """This process's environment without OpenBLAS's kernel variables (so a child runs the CPU's own
    kernel, even where CI forces one), plus those of FORCED[forced]. The library never sets them for
    itself: OpenBLAS would ignore them once NumPy is loaded."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    return {**env, **FORCED[forced][1]} if forced else env


def run_child(code, env, *args, timeout=300):  # -> the child's stdout
    """python -c code *args, in the repository (so it imports this gpt2np), with env; raises on failure."""
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"child process failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def child_kernel(env):
    """The kernel name a child process with env runs (a child's import takes ~0.3 s)."""
    return run_child("from gpt2np.teach.blas_curves import kernel_name; print(kernel_name())", env).strip()


def blas_kernel_envs():
    """{kernel name: environment} for the distinct OpenBLAS kernels this CPU can run: this process's
    environment first (which may force one, as CI's does), then the CPU's own kernel, then each of
    FORCED whose CPU flag it has. Forcing a kernel already found, or OpenBLAS ignoring the variable,
    gives a name already found, which is dropped."""
    flags = cpu_flags()
    envs = [dict(os.environ), kernel_env()] + [kernel_env(name) for name, (flag, _) in FORCED.items() if flag in flags]
    found = {}
    for env in envs:
        found.setdefault(child_kernel(env), env)
    return found


def product_curve_in_child(env, **options):
    """product_curve(**options) in a child process with environment env (from blas_kernel_envs),
    returned as the child printed it: plain data, the kernel the child really ran included."""
    code = ("import json, sys; from gpt2np.teach.blas_curves import product_curve; "
            "print(json.dumps(product_curve(**json.loads(sys.argv[1]))))")
    return json.loads(run_child(code, env, json.dumps(options)))


# ---- why gemv streams and sgemm pays to pack ----

def gemv_rates(block_bytes=BLOCK_BYTES, n_in=SHAPE[0], cold_bytes=COLD_BYTES, repeats=5):
    """GB/s of one core's matrix-vector products over block_bytes blocks of weights, and of a copy.

    memory: every block of a cold_bytes stack once (each read comes from memory, as in a one-row pass);
    cache:  one block as many times (after the first, each read comes from the core's cache: what
            matmul's "rows" method gets for rows 2..M);
    copy:   the whole stack copied once, the least that packing it would cost (a read and a write).
    Medians over repeats, each timing the three in turn.
    """
    width = max(1, block_bytes // (4 * n_in))                                # outputs per block
    blocks = np.full((max(1, cold_bytes // (4 * n_in * width)), width, n_in), 0.5, np.float32)
    again = np.broadcast_to(blocks[0], blocks.shape)                         # one block, len(blocks) times
    x = np.full(n_in, 0.5, np.float32)
    out, packed = np.empty(blocks.shape[:2], np.float32), np.empty_like(blocks)

    runs = {"memory": lambda: np.matmul(blocks, x, out=out),               # [b, width, in] @ [in] -> [b, width]
            "cache": lambda: np.matmul(again, x, out=out),
            "copy": lambda: np.copyto(packed, blocks)}
    with blas_single_threaded():
        for run in runs.values():  # warm-up: pages faulted in
            run()
        times = {name: [] for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    return {"block_bytes": width * n_in * 4, "n_blocks": len(blocks),
            **{f"{name}_gbps": blocks.nbytes / median(t) / 1e9 for name, t in times.items()}}


def rows_ratio(m, memory_gbps, cache_gbps):
    """t(M) / t(1) if every block is read once from memory and M - 1 times from cache, nothing else:
    1 + (M - 1) * memory_gbps / cache_gbps. What matmul's "rows" method could reach at best."""
    return 1 + (m - 1) * memory_gbps / cache_gbps


def refined_speedups(ratios, alpha, c):  # [t(M)/t(1) for M = 1..] -> [speedup for K = 1..len - 1]
    """theory.predicted_speedup at each K, with v = the ratio at M = K + 1 (ratios[K])."""
    return [predicted_speedup(alpha, K, c, ratios[K]) for K in range(1, len(ratios))]
