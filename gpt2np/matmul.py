"""x @ w for products with a few rows, cut into pieces OpenBLAS computes quickly (PERFORMANCE.md).

Decoding one token multiplies one row by every weight matrix, and BLAS's gemv streams the weights
at memory speed. Verifying K draft tokens multiplies K+1 rows, and OpenBLAS's general sgemm first
copies ("packs") the whole weight matrix into its own tile layout, which made a [5, 1024] @
[1024, 4096] product cost 3.2 one-row products here. Speculative decoding only pays if it costs
nearly one. Three measured facts give most of that back (a fourth, OpenBLAS's idle threads
spinning on the second core, is handled in gpt2np/__init__.py):

  1. OpenBLAS sends some products to a "small matrix" kernel that reads the operands where they
     are, without packing: measured here (OpenBLAS 0.3.31, SkylakeX, w column-major), those with
     m * n * k <= 10^6 and m * n <= 1200, where n counts w's columns. With w stored column-major
     (each output's weights contiguous, as weights.py keeps every weight of 2 MiB or more) that
     kernel streams w at ~12 GB/s per core. So w's columns are cut into products that satisfy both.
  2. The calls are shared between as many Python threads as BLAS may use, each taking the next
     call when it is free. OpenBLAS runs a small-kernel product on the thread that calls it (that
     path never wakes its own threads), so the two threads never compete with OpenBLAS's.
  3. NumPy releases the GIL inside matmul only when the output has more than ~500 elements, so
     threads running narrower products take turns instead of running at once. The MLP's
     down-projection ([5, 4096] x [4096, 1024]) allows only 48 columns (240 outputs) per small
     product; np.matmul over a stack of 3 of them at once (720 outputs) runs them in parallel.
     (Cutting k into 1024-wide chunks instead, which frees the GIL too, reads w in 4 KB strides and
     left that product at 2.0 one-row products against 1.7 now.)

The result equals x @ w up to float32 rounding (the sums run in a different order); tests compare
the two. Anything this does not help (one row, a small product, many rows, a BLAS other than
OpenBLAS, a row-major w) is plain x @ w.
"""
import functools

import numpy as np

from .threads import BLAS, helpers, share, threads_allowed  # noqa: F401  (helpers: bench's and the tests' name)

SMALL_MNK = 1_000_000  # OpenBLAS's small-matrix kernel takes products with m * n * k up to this
SMALL_MN = 1200        # ... and m * n up to this (one more row or column: 3.3x slower per column)
GIL_FREE_OUTPUT = 500  # NumPy's matmul keeps the GIL for outputs of up to this many elements (measured:
                       # two threads on [5, 4096] x [4096, 2 x 48] ran one after the other, on 3 x 48 at once)
COLUMN_MAJOR_MIN = 1 << 19  # weights with fewer entries (2 MiB) stay row-major and unshared: the
                            # bundled models' products ran 10-25 % slower column-major, and waking a
                            # helper thread (40-85 us here) takes as long as streaming such a weight
CALLS = 32             # calls per product, about, where there are more small products than that:
                       # the output head's 258 in 32 calls took 1.27 one-row products against 1.37
MAX_ROWS = 16          # measured up to here (16 rows: 2.5-3x a one-row product, plain sgemm 3.2-3.6x)


_BLAS = BLAS  # NumPy's OpenBLAS (threads.py), or None: then every product is plain x @ w


def stored_column_major(shape):
    """Whether weights.py keeps a Conv1D weight of this shape column-major (for matmul's pieces)."""
    return shape[-2] * shape[-1] >= COLUMN_MAJOR_MIN


def pieces(m, k, n):  # -> ((j0, j1, width), ...), or None to use x @ w
    """How to cut [m, k] @ [k, n] into calls on column ranges [j0, j1) of w; None where that would
    not help. Each call computes (j1 - j0) / width small-kernel products of `width` columns."""
    return _cut(m, k, n, SMALL_MNK, SMALL_MN, GIL_FREE_OUTPUT, CALLS, MAX_ROWS)


@functools.lru_cache(maxsize=None)  # a model has a handful of shapes; cutting one took 8-15 us a call
def _cut(m, k, n, small_mnk, small_mn, gil_free_output, calls, max_rows):
    if not 2 <= m <= max_rows or (m * k * n <= small_mnk and m * n <= small_mn):
        return None  # one row (gemv streams), many rows (packing pays), or one small-kernel product
    width = min(small_mnk // (m * k), small_mn // m)  # columns of w per small-kernel product
    if width < 1:
        return None  # x alone is too big for the small kernel
    products = max(-(-(gil_free_output + 1) // (m * width)),  # per call: enough that NumPy lets go of the GIL,
                   -(-n // width) // calls)                   # and no more calls than needed
    per_call = width * products
    return tuple((j0, min(n, j0 + per_call), width) for j0 in range(0, n, per_call))


def _call(x, w_t, out, call):  # x [m, k], w_t = w.T [n, k] C-contiguous, out [m, n]; call: (j0, j1, width)
    m, k = x.shape
    j0, j1, width = call
    j = j1 - (j1 - j0) % width  # [j0, j): whole small products, [j, j1): a narrower rest
    if j > j0:  # b products in one call: [m, k] @ [b, k, width] -> [b, m, width], written into out
        b = (j - j0) // width
        np.matmul(x, w_t[j0:j].reshape(b, width, k).transpose(0, 2, 1),
                  out=out[:, j0:j].reshape(m, b, width).transpose(1, 0, 2))
    if j < j1:
        np.matmul(x, w_t[j:j1].T, out=out[:, j:j1])


def matmul(x, w):  # [m, k] @ [k, n] -> [m, n]
    """x @ w, in pieces shared between threads when that is faster (see the module docstring)."""
    m, k = x.shape
    n = w.shape[1]
    todo = pieces(m, k, n) if _BLAS is not None and w.T.flags.c_contiguous else None
    if todo is None:
        return x @ w
    x = np.ascontiguousarray(x)
    out = np.empty((m, n), dtype=np.result_type(x, w))
    n_threads = threads_allowed() if stored_column_major(w.shape) else 1  # small w: not worth a wake-up
    share(lambda call: _call(x, w.T, out, call), todo, n_threads)  # each thread takes the next call when free
    return out
