"""The machine's limits: memory bandwidth (for the roofline), GEMM throughput, and small-M products.

Bandwidth is the best of three ways of streaming one buffer larger than the last-level cache:
  sum         np.sum over the flat buffer (one thread, NumPy's pairwise sum: often compute-bound)
  gemv        A @ x with A [rows, cols] C-contiguous (BLAS sgemv, all BLAS threads)
  row_matmul  x @ W with x [1, rows]: the product a decode step makes for every weight
A naive NumPy read underestimates what the decode loop can stream (one thread's sum reads
slower than BLAS's gemv on all threads), so the
roofline uses the best of them: roofline per token = fp32 weight bytes per token / bandwidth.
With --threads, gemv and row_matmul are measured once more with every CPU as a BLAS thread, and
the best of all is still the roofline's bandwidth.

Two more numbers explain where decode and verification time goes:
  gemm_gflops  a [512, in] x [in, out] product: the arithmetic ceiling that prefill can approach
  small_m      [M, in] x [in, out] for M = 1..9, cycling through enough weight matrices to fill the
               buffer, so every product reads its weights from DRAM as a decode step does; the
               ratio t(M) / t(1) is the product-level version of the verification curve. Measured
               twice: plain `x @ w` on row-major weights, and gpt2np.model.fast.matmul.matmul on the same
               buffer viewed column-major, as the model keeps its weights (small_m.pieces).
"""
import os

import numpy as np

from .common import log, median, print_table, seconds, summary

GIB = 1 << 30


def streaming_buffer(n_bytes):  # -> flat float32 array
    """A buffer of n_bytes of non-zero float32 (zero pages could be shared, hiding real reads)."""
    return np.full(n_bytes // 4, 0.5, dtype=np.float32)


def best_rate(fn, n_bytes, repeats):
    """Bytes per second: best and median over repeats, after one warm-up call."""
    fn()
    times = [seconds(fn) for _ in range(repeats)]
    s = summary(times)
    return {"bytes": n_bytes, "seconds": s, "best_gbps": n_bytes / s["min"] / 1e9,
            "median_gbps": n_bytes / s["median"] / 1e9}


def measure_bandwidth(buf, repeats):
    """{method: rate} for the three ways of streaming buf (see the module docstring)."""
    n = buf.size
    cols = 4096
    rows = n // cols
    A = buf[:rows * cols].reshape(rows, cols)   # [rows, cols] view, no copy
    x_cols = np.full(cols, 0.5, np.float32)
    x_rows = np.full((1, rows), 0.5, np.float32)
    return {
        "sum": best_rate(lambda: buf.sum(), buf.nbytes, repeats),
        "gemv": best_rate(lambda: A @ x_cols, A.nbytes, repeats),
        "row_matmul": best_rate(lambda: x_rows @ A, A.nbytes, repeats),
    }


class Probe:
    """A gemv pass over a buffer larger than L3, timed beside each decode step (decode.py), so that
    decode time / roofline can be taken pair by pair: the host's speed drifts within minutes, and a
    bandwidth measured at the start can be off by 30 % by the time a size is decoded."""

    def __init__(self, n_bytes, cols=4096):
        self.A = streaming_buffer(n_bytes)[:(n_bytes // 4 // cols) * cols].reshape(-1, cols)  # [rows, cols]
        self.x = np.full(cols, 0.5, np.float32)
        self.A @ self.x  # fault every page in before anything is timed

    def gbps(self):
        """Bandwidth of one pass over the buffer, in GB/s."""
        return self.A.nbytes / seconds(lambda: self.A @ self.x) / 1e9


def measure_gemm(n_in, n_out, repeats, m=512):
    """GFLOP/s of one [m, n_in] x [n_in, n_out] product (cached weights: compute-bound)."""
    a = np.full((m, n_in), 0.5, np.float32)
    w = np.full((n_in, n_out), 0.01, np.float32)
    a @ w
    s = summary([seconds(lambda: a @ w) for _ in range(repeats)])
    return {"shape": [m, n_in, n_out], "seconds": s, "gflops": 2 * m * n_in * n_out / s["median"] / 1e9}


def measure_small_m(buf, n_in, n_out, max_m, repeats, column_major=False):
    """Seconds per [M, n_in] x [n_in, n_out] product with weights streamed from DRAM, M = 1..max_m.

    The buffer is cut into n_mats weight matrices; one timed pass multiplies by each once. Ratios are
    taken within each repeat (the M passes run back to back), then the median. column_major: views
    of the same buffer with each output's weights contiguous, multiplied by gpt2np's matmul.
    """
    from gpt2np.model.fast.matmul import matmul
    n_mats = max(1, buf.size // (n_in * n_out))
    flat = buf[:n_mats * n_in * n_out]
    if column_major:
        mats, product = flat.reshape(n_mats, n_out, n_in).transpose(0, 2, 1), matmul  # same shape
    else:
        mats, product = flat.reshape(n_mats, n_in, n_out), np.matmul  # [n_mats, n_in, n_out] views
    xs = {m: np.full((m, n_in), 0.5, np.float32) for m in range(1, max_m + 1)}

    def one_pass(m):
        x = xs[m]
        for w in mats:
            product(x, w)

    for m in xs:  # warm-up
        one_pass(m)
    per_m = {m: [] for m in xs}
    for _ in range(repeats):
        for m in xs:
            per_m[m].append(seconds(lambda: one_pass(m)) / n_mats)
    ratios = {m: median([t / t1 for t, t1 in zip(per_m[m], per_m[1])]) for m in xs}
    return {"shape": [n_in, n_out], "n_matrices": n_mats,
            "seconds": {str(m): median(per_m[m]) for m in xs},
            "ratio": {str(m): ratios[m] for m in xs},
            "gflops": {str(m): 2 * m * n_in * n_out / median(per_m[m]) / 1e9 for m in xs}}


def all_threads_rates(buf, repeats):
    """gemv and row_matmul again with every CPU as a BLAS thread (under --threads the roofline is
    still the machine's limit, not the limit of the thread count chosen)."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=os.cpu_count(), user_api="blas"):
        rates = measure_bandwidth(buf, repeats)
    return {f"{name} ({os.cpu_count()} threads)": rates[name] for name in ("gemv", "row_matmul")}


def run(plan, threads=None):
    n_bytes = plan.bandwidth_mib << 20
    repeats = max(plan.repeats, 5)  # each pass is ~0.1 s: cheap to repeat more
    log(f"bandwidth: allocating a {n_bytes / GIB:.2f} GiB streaming buffer")
    buf = streaming_buffer(n_bytes)
    methods = measure_bandwidth(buf, repeats)
    if threads and threads != os.cpu_count():
        methods.update(all_threads_rates(buf, repeats))
    best_method = max(methods, key=lambda k: methods[k]["best_gbps"])
    log("bandwidth: GEMM and small-M products")
    n_in, n_out = plan.small_m_shape
    gemm = measure_gemm(n_in, n_out, repeats)
    small_m = measure_small_m(buf, n_in, n_out, plan.verify_max_m, min(plan.repeats, 3))
    small_m["pieces"] = measure_small_m(buf, n_in, n_out, plan.verify_max_m, min(plan.repeats, 3), column_major=True)
    del buf
    result = {"methods": methods, "best_method": best_method,
              "best_gbps": methods[best_method]["best_gbps"], "gemm": gemm, "small_m": small_m}
    print_report(result)
    return result


def print_report(r):
    rows = [[name, m["bytes"] / 2**20, m["best_gbps"], m["median_gbps"]] for name, m in r["methods"].items()]
    print_table("Memory bandwidth (streaming a buffer larger than L3)",
                ["method", "MiB", "best GB/s", "median GB/s"], rows,
                note=f"roofline bandwidth = best of all = {r['best_gbps']:.2f} GB/s ({r['best_method']}); "
                     f"GEMM {r['gemm']['shape']}: {r['gemm']['gflops']:.1f} GFLOP/s")
    sm = r["small_m"]
    pc = sm.get("pieces") or {"seconds": {}, "ratio": {}}
    rows = [[m, 1e3 * sm["seconds"][m], sm["ratio"][m], sm["gflops"][m],
             1e3 * pc["seconds"].get(m, float("nan")), pc["ratio"].get(m)] for m in sm["seconds"]]
    print_table(f"Product-level small-M curve: [M, {sm['shape'][0]}] x {sm['shape']}, weights from DRAM",
                ["M", "x @ w ms", "t(M)/t(1)", "GFLOP/s", "gpt2np matmul ms", "t(M)/t(1)"], rows,
                note="x @ w: NumPy on row-major weights (OpenBLAS packs them); gpt2np matmul: column-major "
                     "weights in small-kernel pieces on all BLAS threads (gpt2np/model/fast/matmul.py)")
