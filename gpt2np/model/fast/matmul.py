"""x @ w for products with a few rows, by the method that is fastest for NumPy's BLAS kernel (PERFORMANCE.md).

Decoding one token multiplies one row by every weight matrix, and BLAS's gemv streams the weights
at memory speed. Verifying K draft tokens multiplies M = K+1 rows, and OpenBLAS's general sgemm
first copies ("packs") the whole weight matrix into its own tile layout: plain x @ w on 355M's
shapes costs 2-4 one-row products, whichever kernel runs. Speculative decoding only pays if it
costs nearly one. How to get there depends on the kernel OpenBLAS chose for this CPU (threadpoolctl
reports its name), so the method comes from a table of measurements, `METHODS`, never from a timing
run of our own:

  pieces   (SkylakeX: CPUs with AVX-512; also Cooperlake and SapphireRapids, OpenBLAS's names for some
           of them in builds with every target, which run SkylakeX's kernel files.) OpenBLAS sends some
           products to a "small matrix" kernel that reads the operands where they are, without
           packing: measured (OpenBLAS 0.3.31) for m * n * k <= 10^6 and m * n <= 1200, n counting w's
           columns. With w column-major that kernel streams w at ~12 GB/s per core, so w's columns are
           cut into such products.
  rows     (Haswell: every x86 CPU without AVX-512; Zen uses Haswell's kernels. Also Sandybridge and
           Nehalem, NumPy's OpenBLAS's kernels for x86 CPUs without AVX2: older Core i, today's
           Celeron, Pentium Silver and Atom.) There is no such kernel: every sgemm packs.
           Matrix-vector products never pack, so w is cut into blocks of ~512 KB of output weights
           and each block is multiplied by the M rows one at a time (M gemv calls): the first reads
           the block from memory, the other M - 1 from the core's cache, which reads several times
           faster. Not free: an extra row costs ~0.15-0.25 of the first, so plain sgemm is level at
           M = 8 (its micro-kernel's rows come out even) and ahead from M ~ 13. A row-major w is cut
           into blocks of its rows instead (each block's partial sums added at the end).
  padded   (Haswell, 13-15 rows.) Plain sgemm's cost steps with its micro-kernel's tiles: 16 rows
           cost less than 13-15 (a partial tile runs a slower edge kernel), so x gets zero rows up
           to a multiple of 8 and the added rows' outputs are dropped (an Intel Xeon, passes over
           13-15 rows: 3.8-3.9 one-row passes against 4.4-4.9 plain at 355M). The bundled models'
           small weights step the same way at 7 and 15 rows (their products over 7 rows 0.72-0.83 of
           `rows`', over 15 0.82-0.88 of plain, one and two threads; a whole 7- or 15-row pass of the
           2.6M target 0.915x).
  plain    x @ w: one row (gemv already streams), many rows (packing pays for itself), and every
           kernel nobody has measured (ARM, Apple's Accelerate, MKL, other x86 kernels).

Both cut methods share their calls between as many Python threads as BLAS may use (threads.py),
each taking the next call when it is free. Two facts make that work: OpenBLAS runs a small-kernel
product on the thread that calls it, and `rows` sets OpenBLAS to one thread while it runs, so our
threads never compete with OpenBLAS's; and NumPy releases the GIL inside matmul only when the
output has more than ~500 elements, so every call writes more than that (pieces: several small
products stacked in one np.matmul; rows: blocks of at least 500 / M + 1 outputs).

The layout: the weights are stored column-major (weights.py), which `pieces` needs and which suits
few rows under every kernel measured. Under the Haswell kernels plain sgemm packs a row-major w much
faster (8 rows: 2.3 one-row products against 3.1 on column-major), so a model that decodes batches of
many rows (the server's) can be given row-major weights (layout.py; `BATCH_LAYOUT` below), with rows
of their own in METHODS: `rows` cut by blocks of w's rows, plain at 8-9 rows, `padded` from 10. A pass
over 2-7 rows then costs up to 16 % more (mostly 4-10 %) and one row up to 7 % (PERFORMANCE.md,
Batching, "Row-major weights for batches"), so nothing else gets them. Under SkylakeX every loaded
model's weights are cut into panels (LOADED_LAYOUT below; to_panels: [n / 32, k, 32], each panel's
block contiguous), where the small-matrix kernel takes each panel's product over up to 16 rows as it
lies and streams it at nearly one row's rate (by_panels: 355M's products over 8 rows ~1.0 one-row
products against `pieces`' 1.4, a verification pass over 5 rows 1.28 one-token passes against 1.52,
one token level; a long prompt's prefill up to a third dearer: PERFORMANCE.md, Batching, "Panels" and
"Panels for every model"). `pieces` and the column-major table rows serve the weights as stored
wherever they are not cut (a model built from params directly, GPT2(config, params)).

Every method equals x @ w up to float32 rounding (the sums run in another order); tests compare
each with x @ w under the kernel they run with, and once more in a process with the other kernel.
"""
import contextlib
import functools

import numpy as np

from .threads import BLAS, blas_single_threaded, cpu_flags, helpers, share, threads_allowed  # noqa: F401  (helpers: bench's and the tests' name)

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
PANEL = 32             # panels: columns of w per panel (64: one row's product 1.14 one-row gemv; 32: 1.02)
PANEL_DEPTH = 1024     # panels: rows of w per small product at most: the kernel sums k's terms one after the
                       # other, which over 4096 of them strayed 2.4e-6 of the largest output from x @ w (slices
                       # of 1024, summed, ran as fast on 355M's MLP)
PANEL_PADDED_ROWS = {1: 2, 5: 6}  # panels: m rows run as this many, the rest zeros. NumPy hands [1, k] @ [k, 32]
                       # to gemv, which reads a narrow panel slower than the small kernel does 2 rows; and the
                       # small kernel takes 5 rows dearer than 6 (24 of a layer's products in turn, alternated,
                       # Zen 4: 1.40 -> 1.18 one-row products at 1558M's shapes, 1.17 -> 1.13 at 355M's, 1.10 ->
                       # 1.00 at 124M's; 3, 7, 9, 13 and 15 rows padded to even gained nothing, 11 to 12 0-5 %)
BLOCK_BYTES = 512 << 10  # rows: weights per block, read from memory once and from cache M - 1 times
                         # (256 KB and 512 KB measured alike on 355M's shapes; 128 KB: more calls, slower)

_BLAS = BLAS  # NumPy's OpenBLAS (threads.py), or None: then every product is plain x @ w
KERNEL = BLAS.architecture if BLAS is not None else None  # OpenBLAS's name for its kernel: "Haswell", ...

# The method for m rows, by kernel and by w's layout: ((largest m, method), ...) in increasing m; beyond the last,
# or for a kernel not in the table, plain. "large": weights of 2 MiB and more stored column-major (GPT-2's, and the
# tied output head wte.T); "row-major": such weights made row-major for batches (layout.py); "small": the bundled
# models' weights, row-major. Measured on an AVX-512 AMD EPYC with OpenBLAS 0.3.31, each kernel in its own process
# (PERFORMANCE.md, "Every CPU"), Haswell's padded rows and row-major rows on an Intel Xeon (Sapphire Rapids); Zen
# runs Haswell's kernel files. Cooperlake and SapphireRapids, the names an OpenBLAS built with every target
# (Debian's, conda-forge's; NumPy's wheels have neither and say SkylakeX) gives CPUs with AVX-512 BF16 (Intel's
# since Cooper Lake, AMD's Zen 4), run SkylakeX's sgemm kernel files, its small-matrix kernel included (OpenBLAS's
# KERNEL.COOPERLAKE includes KERNEL.SKYLAKEX and adds bfloat16 kernels only; KERNEL.SAPPHIRERAPIDS includes
# KERNEL.COOPERLAKE). Measured on the Xeon under Debian 12's OpenBLAS 0.3.21, Cooperlake forced, [M, 1024] x [1024,
# 4096] products from memory: pieces 1.23 / 1.63 / 1.70 one-row products at M = 2 / 5 / 8 against plain's 3.01 /
# 4.04 / 4.11 (PERFORMANCE.md, "Every CPU": "Other OpenBLAS builds"). Sandybridge and Nehalem (x86 without AVX2),
# forced on the Xeon (OpenBLAS 0.3.31): `rows` against plain over 355M's two MLP shapes from memory, M = 2 / 5 / 8,
# 1.7 / 2.8 / 4.1 against 4.0-4.4 / 4.5-4.7 / 5.7-5.8 one-row products (Sandybridge), 1.8 / 2.7-2.9 / 3.8-4.5
# against 3.4-3.6 / 4.4-4.5 / 5.8-5.9 (Nehalem); plain ahead or level from 14 and 16 rows. Small weights (the
# bundled models', one thread): `rows` ahead at 2-5 rows under Sandybridge (level at 6-7, behind from 8), at every
# count to 16 under Nehalem. Row-major weights: `rows` ahead to 6 rows (Sandybridge) and 12 (Nehalem). Batches keep
# the stored order (plain sgemm on row-major weights at 8 rows is no cheaper than `rows` there).
_SKYLAKEX = {"large": ((1, "plain"), (MAX_ROWS, "pieces")), "row-major": (), "small": ()}
_HASWELL = {"large": ((1, "plain"), (7, "rows"), (8, "plain"), (12, "rows"), (15, "padded")),
            "row-major": ((1, "plain"), (7, "rows"), (9, "plain"), (15, "padded")),
            "small": ((1, "plain"), (6, "rows"), (7, "padded"), (14, "plain"), (15, "padded"))}
_SANDYBRIDGE = {"large": ((1, "plain"), (13, "rows")), "row-major": ((1, "plain"), (6, "rows")),
                "small": ((1, "plain"), (5, "rows"))}
_NEHALEM = {"large": ((1, "plain"), (15, "rows")), "row-major": ((1, "plain"), (12, "rows")),
            "small": ((1, "plain"), (MAX_ROWS, "rows"))}
METHODS = {"SkylakeX": _SKYLAKEX, "Cooperlake": _SKYLAKEX, "SapphireRapids": _SKYLAKEX, "Haswell": _HASWELL,
           "Zen": _HASWELL, "Sandybridge": _SANDYBRIDGE, "Nehalem": _NEHALEM}

# The layout for a model that decodes batches (layout.py), by kernel; column-major (as stored) elsewhere.
# Under Haswell, random 355M, a pass over 8 new rows: 150.0 -> 123.6 ms row-major; over four runs one row
# -1 to +7 %, 2-7 rows -1 to +16 % (PERFORMANCE.md). Under SkylakeX (and the two names that run its kernel
# files), panels (by_panels): random 355M on a Zen 4 EPYC, a packed decode step of 8 sequences 0.79x the
# same step on column-major weights, of 2 sequences 0.80x, one sequence's step 0.99x (1.08x before one row
# was padded to two) (PERFORMANCE.md, Batching, "Panels"). The order a model is loaded in already.
BATCH_LAYOUT = {"Haswell": "row-major", "Zen": "row-major",
                "SkylakeX": "panels", "Cooperlake": "panels", "SapphireRapids": "panels"}

# The layout a loaded model's weights take under each kernel (layout.order_as_loaded; column-major, as
# weights.py stores them, elsewhere). Under SkylakeX, panels: a chain's verification over M rows, random
# 355M on the Zen 4 EPYC, v(2 / 5 / 8) 1.32 / 1.52 / 1.85 -> 0.96 / 1.28 / 1.31 of the stored one-token
# pass; one token level within this VM's noise (0.99-1.04); a prefill of 128-512 rows' products 1.0-1.3x
# (PERFORMANCE.md, "Panels for every model").
LOADED_LAYOUT = {"SkylakeX": "panels", "Cooperlake": "panels", "SapphireRapids": "panels"}


def blas_kernel():
    """One line naming NumPy's BLAS kernel and the few-row methods METHODS gives it (plain x @ w
    elsewhere), for headers and benchmark tables: "OpenBLAS 0.3.31 Haswell, 2 threads, few-row
    products: rows (M 2-7), rows (M 9-12), padded (M 13-15); small row-major weights: rows (M 2-6),
    padded (M 7), padded (M 15); row-major weights (batches): rows (M 2-7), padded (M 10-15)"."""
    if BLAS is None:
        return "not OpenBLAS (or no threadpoolctl): few-row products are plain x @ w"
    threads = BLAS.get_num_threads()
    name = f"OpenBLAS {BLAS.version} {KERNEL}, {threads} thread{'s' if threads > 1 else ''}"
    table = METHODS.get(KERNEL)
    if table is None:
        return f"{name}: kernel not measured, few-row products are plain x @ w" + older_than_the_cpu(cpu_flags())

    def spans(rows):  # ((largest m, method), ...) -> "rows (M 2-8)"
        said, low = [], 1
        for largest_m, method in rows:
            if method != "plain":
                said.append(f"{method} (M {low}-{largest_m})" if largest_m > low else f"{method} (M {low})")
            low = largest_m + 1
        return ", ".join(said) or "plain"
    large, small = spans(table["large"]), spans(table["small"])
    batches = f"; row-major weights (batches): {spans(table['row-major'])}" if batch_layout() == "row-major" else ""
    in_panels = [who for who, order in (("loaded models", loaded_layout()), ("batches", batch_layout())) if order == "panels"]
    if in_panels:
        batches += f"; weights in panels ({' and '.join(in_panels)}): small-kernel products (M 1-{panel_rows(1024)})"
    return f"{name}, few-row products: {large}" + (f"; small row-major weights: {small}" if small != large else "") \
        + batches


SSE_KERNELS = {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn", "Dunnington",
               "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat", "Unknown"}  # OpenBLAS's pre-AVX kernels


def older_than_the_cpu(flags, kernel=None):  # flags: cpu_flags() -> "" or a clause for blas_kernel's line
    """What to say where OpenBLAS runs one of its pre-AVX kernels on a CPU with AVX2: an OpenBLAS older than
    its CPU falls back to one (Debian 12's 0.3.21 runs Prescott on a 2023 Xeon, whose products then cost
    1.5-2x SkylakeX's), and NumPy's own wheel knows newer CPUs.

    >>> older_than_the_cpu({"avx2"}, "Haswell"), older_than_the_cpu({"sse3"}, "Prescott")
    ('', '')
    >>> older_than_the_cpu({"avx2", "avx512f"}, "Prescott")[:48]
    '; Prescott is a kernel for CPUs without AVX, but'
    """
    kernel = KERNEL if kernel is None else kernel
    if kernel not in SSE_KERNELS or "avx2" not in flags:
        return ""
    return (f"; {kernel} is a kernel for CPUs without AVX, but this one has AVX2: an OpenBLAS that knows it "
            "(NumPy's own wheel: pip install -U numpy) runs faster ones")


def stored_column_major(shape):
    """Whether weights.py keeps a Conv1D weight of this shape column-major (for the cut methods)."""
    return shape[-2] * shape[-1] >= COLUMN_MAJOR_MIN


def weight_shape(w):  # -> (k, n): w's [in, out] whatever its layout
    """The [in, out] shape of a Conv1D weight: w.shape, or for panels [n / PANEL, k, PANEL] (k, n)."""
    return (w.shape[1], w.shape[0] * w.shape[2]) if w.ndim == 3 else w.shape


def layout(w):  # -> "large" | "row-major" | "small" | "panels" | None
    """Which rows of a kernel's METHODS table w takes: "large" (column-major, 2 MiB and more), "row-major"
    (as large, C order), "small"; "panels" for w in panels (by_panels, any kernel); None for a large w that
    is neither (a column slice of a row-major w)."""
    if w.ndim == 3:
        return "panels"
    if not stored_column_major(w.shape):
        return "small"
    if w.T.flags.c_contiguous:
        return "large"
    return "row-major" if w.flags.c_contiguous else None


def loaded_layout(kernel=None):  # -> "panels" | "column-major"
    """The layout LOADED_LAYOUT gives a loaded model's weights under this kernel."""
    if BLAS is None:
        return "column-major"
    return LOADED_LAYOUT.get(KERNEL if kernel is None else kernel, "column-major")


def batch_layout(kernel=None):  # -> "row-major" | "panels" | "column-major"
    """The layout BATCH_LAYOUT gives weights of a model that decodes batches under this kernel."""
    if BLAS is None:
        return "column-major"
    return BATCH_LAYOUT.get(KERNEL if kernel is None else kernel, "column-major")


def method_for(m, w, kernel=None):  # -> "plain" | "pieces" | "rows" | "padded" | "panels"
    """The method for [m, k] @ w under this kernel (default: the one running), from METHODS.
    Read on every call (about 1 us): the bench and the tests may swap the table."""
    rows = layout(w)
    if rows == "panels":
        return "panels"  # the layout is the method, under every kernel (correct anywhere, fast under SkylakeX)
    table = METHODS.get(KERNEL if kernel is None else kernel)
    if table is None or BLAS is None or rows is None:
        return "plain"
    for largest_m, method in table.get(rows, ()):
        if m <= largest_m:
            return method
    return "plain"


def matmul(x, w):  # [m, k] @ [k, n] -> [m, n]
    """x @ w, by the method METHODS gives this kernel for this many rows (see the module docstring)."""
    if len(x) == 1 and w.ndim == 2:  # a decoding step asks ~150 times: one row is gemv (panels: by_panels)
        return x @ w
    return BY_NAME[method_for(len(x), w)](x, w)


def columns(w, j0, j1):  # [k, n] -> [k, j1 - j0]: w's columns j0..j1 (c_attn's q, k and v blocks)
    """w[:, j0:j1] in w's own layout: for panels, the panels of those columns (j0, j1 multiples of PANEL)."""
    if w.ndim == 2:
        return w[:, j0:j1]
    if j0 % w.shape[2] or j1 % w.shape[2]:
        raise ValueError(f"columns {j0}..{j1} do not fall on panels of {w.shape[2]}")
    return w[j0 // w.shape[2]:j1 // w.shape[2]]


def plain(x, w):  # [m, k] @ [k, n] -> [m, n]
    return x @ w


# ---- pieces: OpenBLAS's small-matrix kernel (SkylakeX) ----

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


def in_pieces(x, w):  # [m, k] @ [k, n] -> [m, n]; w column-major
    """x @ w in small-kernel products shared between threads, or x @ w where pieces() says no."""
    m, k = x.shape
    n = w.shape[1]
    todo = pieces(m, k, n) if w.T.flags.c_contiguous else None
    if todo is None:
        return x @ w
    x = np.ascontiguousarray(x)
    out = np.empty((m, n), dtype=np.result_type(x, w))
    n_threads = threads_allowed() if stored_column_major(w.shape) else 1  # small w: not worth a wake-up
    share(lambda call: _call(x, w.T, out, call), todo, n_threads)  # each thread takes the next call when free
    return out


# ---- rows: one matrix-vector product per row, a cache-sized block of w at a time (Haswell) ----

def row_blocks(m, k, n):  # -> (width, ((b0, b1), ...)): blocks of w's columns, and calls
    """Cut w's n columns into blocks of `width` columns, about BLOCK_BYTES of weights each, and group
    whole blocks into calls of blocks [b0, b1): enough blocks per call that its m x (b1 - b0) x width
    outputs free the GIL. Columns past the last whole block are left to the caller."""
    return _blocks(m, k, n, BLOCK_BYTES, GIL_FREE_OUTPUT)


@functools.lru_cache(maxsize=None)  # a model has a handful of shapes
def _blocks(m, k, n, block_bytes, gil_free_output):
    width = max(8, block_bytes // (4 * k))
    n_blocks = n // width
    per_call = gil_free_output // (m * width) + 1
    return width, tuple((b0, min(n_blocks, b0 + per_call)) for b0 in range(0, n_blocks, per_call))


def by_rows(x, w):  # [m, k] @ [k, n] -> [m, n]
    """x @ w as m matrix-vector products per block of w's columns (see the module docstring).

    Column-major w (each output's weights contiguous): calls of a few blocks each, shared between
    threads, OpenBLAS held at one thread meanwhile; inside a call NumPy runs the m products of one
    block, then the next block's (the output is laid out [block, row, column] for that, then put in
    [row, column] order: a copy of m x n floats). A large row-major w: by_row_blocks. A small row-major w:
    m products in one call."""
    w_layout = layout(w)
    if w_layout == "row-major":
        return by_row_blocks(x, w)
    if w_layout != "large" or not len(x):                     # no rows: row_blocks would divide by m
        return np.matmul(x[:, None, :], w)[:, 0]              # [m, 1, k] @ [k, n] -> [m, 1, n] -> [m, n]
    m, k = x.shape
    n = w.shape[1]
    width, calls = row_blocks(m, k, n)
    n_cut = width * calls[-1][1] if calls else 0              # columns in whole blocks
    w_t = w.T                                                 # [n, k] C-contiguous
    blocks = w_t[:n_cut].reshape(-1, 1, width, k).transpose(0, 1, 3, 2)  # [n_blocks, 1, k, width] views
    xs = x[None, :, None, :]                                  # [1, m, 1, k]: m row vectors
    by_block = np.empty((len(blocks), m, 1, width), dtype=np.result_type(x, w))  # [n_blocks, m, 1, width]

    def call(b):                                              # blocks [b0, b1): m gemv calls each
        b0, b1 = b
        np.matmul(xs, blocks[b0:b1], out=by_block[b0:b1])     # [1, m, 1, k] @ [b, 1, k, width] -> [b, m, 1, width]

    n_threads = threads_allowed()                             # read before OpenBLAS is set to one thread
    with blas_single_threaded():
        share(call, calls, n_threads)
    out = np.empty((m, n), dtype=by_block.dtype)
    out[:, :n_cut] = by_block.reshape(-1, m, width).transpose(1, 0, 2).reshape(m, n_cut)  # [m, n_blocks * width]
    if n_cut < n:
        out[:, n_cut:] = x @ w[:, n_cut:]                     # the columns past the last whole block
    return out


def height_blocks(k, n):  # -> (height, n_blocks): blocks of `height` of w's k rows, about BLOCK_BYTES each
    """Cut a row-major w's k rows into n_blocks blocks of `height` rows (at least 8), about BLOCK_BYTES of
    weights each; rows past the last whole block are left to the caller."""
    height = min(k, max(8, BLOCK_BYTES // (4 * n)))
    return height, k // height


def by_row_blocks(x, w):  # [m, k] @ [k, n] -> [m, n]; w row-major
    """x @ w for a row-major w as m matrix-vector products per block of w's rows: x[:, rows of the block]
    times the block, read from memory once and from cache m - 1 times, gives the block's share of every
    output; the blocks' shares are added. The blocks are split between threads (one call each, OpenBLAS
    held at one thread meanwhile). The shares cost an addition of n_blocks x m x n floats: at 355M's
    shapes 5-10 % of the product, and no cut by w's columns avoids it (a column block of a row-major
    w is strided, and gemv on it measured 1.6-2.3x slower)."""
    m, k = x.shape
    n = w.shape[1]
    height, n_blocks = height_blocks(k, n)
    k_cut = height * n_blocks                                 # w's rows in whole blocks
    blocks = w[:k_cut].reshape(n_blocks, 1, height, n)        # [n_blocks, 1, height, n] views
    xs = x[:, :k_cut].reshape(m, n_blocks, height).transpose(1, 0, 2)[:, :, None, :]  # [n_blocks, m, 1, height]
    shares = np.empty((n_blocks, m, 1, n), dtype=np.result_type(x, w))  # block b's share of every output

    def call(b):                                              # blocks [b0, b1): m gemv calls each
        b0, b1 = b
        np.matmul(xs[b0:b1], blocks[b0:b1], out=shares[b0:b1])  # [b, m, 1, height] @ [b, 1, height, n] -> [b, m, 1, n]

    n_threads = threads_allowed()                             # read before OpenBLAS is set to one thread
    calls = [(i * n_blocks // n_threads, (i + 1) * n_blocks // n_threads) for i in range(n_threads)]
    with blas_single_threaded():
        share(call, [c for c in calls if c[1] > c[0]], n_threads)
    out = shares.sum(axis=0)[:, 0]                            # [n_blocks, m, 1, n] -> [m, 1, n] -> [m, n]
    if k_cut < k:
        out += x[:, k_cut:] @ w[k_cut:]                       # w's rows past the last whole block
    return out


# ---- padded: plain sgemm over rows rounded up to its micro-kernel's multiple (Haswell) ----

PAD_ROWS = 8  # Haswell's sgemm costs least per row at multiples of 8 rows (355M passes, plain: 16 rows 3.9-4.2
              # one-row passes, 13-15 rows 4.4-5.2; 8 rows 2.7-3.1, below 7 rows' 3.4-3.7)


def padded(x, w):  # [m, k] @ [k, n] -> [m, n]
    """x @ w over x with zero rows added up to a multiple of PAD_ROWS, the added rows' outputs dropped:
    where plain sgemm runs a partial micro-kernel tile slower than a whole one, the whole one is cheaper."""
    m, k = x.shape
    rows = -(-m // PAD_ROWS) * PAD_ROWS
    if rows == m:
        return x @ w
    x_pad = np.zeros((rows, k), dtype=x.dtype)                # [rows, k]
    x_pad[:m] = x
    return (x_pad @ w)[:m]                                    # [rows, n] -> [m, n], its first m rows


# ---- panels: w cut into panels of PANEL columns, each contiguous, for the small-matrix kernel (SkylakeX) ----

def to_panels(w, width=PANEL):  # [k, n] -> [n / width, k, width]
    """w's columns in panels of `width`, each panel's [k, width] block contiguous (row-major inside)."""
    k, n = w.shape
    if n % width:
        raise ValueError(f"a weight of {n} columns does not cut into panels of {width}")
    if w.T.flags.c_contiguous:  # column-major, as stored: one copy (a row-major reshape first would make two)
        return np.ascontiguousarray(w.T.reshape(n // width, width, k).transpose(0, 2, 1))  # [n/width, width, k] -> [n/width, k, width]
    return np.ascontiguousarray(w.reshape(k, n // width, width).transpose(1, 0, 2))  # [k, n/width, width] -> [n/width, k, width]


def from_panels(panels):  # [n / width, k, width] -> [k, n], row-major
    """The [k, n] weight the panels were cut from (a copy, row-major)."""
    n_panels, k, width = panels.shape
    return panels.transpose(1, 0, 2).reshape(k, n_panels * width)


def as_matrix(w):  # -> [k, n]
    """A Conv1D weight as its [k, n] matrix whatever its layout: w itself, or the matrix its panels were cut
    from (a copy), for code that reads the weights outside the forward pass (the reference, checkpoints)."""
    return from_panels(w) if w.ndim == 3 else w


def panel_rows(k, width=PANEL):  # -> the most rows of one small-kernel product per panel (and slice)
    """Rows up to which a panel's product goes to the small-matrix kernel in one call a slice of k (m * width
    * depth <= SMALL_MNK with depth >= 256, at most MAX_ROWS); past them by_panels runs plain sgemm per panel."""
    return min(MAX_ROWS, SMALL_MNK // (width * min(k, 256)))


def panel_depth(m, k, width=PANEL):  # -> rows of w per slice, or None past panel_rows
    """The largest divisor of k of at most PANEL_DEPTH with m * width * depth <= SMALL_MNK (the small kernel's
    limit), so that a panel's product over m rows is one small-kernel call per slice; None past panel_rows.
    The slices' products are summed (k = 4096 at 355M's MLP: 4 slices; 1558M's k = 1600: 2 of 800).

    >>> panel_depth(1, 4096), panel_depth(16, 4096), panel_depth(8, 1600), panel_depth(40, 1024)
    (1024, 1024, 800, None)
    """
    return None if m > panel_rows(k, width) else _depth(m, k, width, SMALL_MNK, PANEL_DEPTH)


@functools.lru_cache(maxsize=None)  # a model has a handful of shapes
def _depth(m, k, width, small_mnk, most):
    return max([1] + [d for d in range(1, min(k, most) + 1) if k % d == 0 and m * width * d <= small_mnk])


def by_panels(x, panels):  # [m, k] @ panels [n / width, k, width] -> [m, n]
    """x @ w for w in panels (to_panels): each panel's [m, k] @ [k, width] product is one call of OpenBLAS's
    small-matrix kernel (SkylakeX), which reads a contiguous panel as it lies, without packing it: where
    `pieces` gives that kernel w's columns as dot products over k (column-major w), a panel gives it rows of
    `width` outputs to update at once, which it streams at nearly gemv's rate for one row and several (355M's
    weights, 8 rows: ~1.0 one-row products against pieces' 1.4). Past panel_rows rows, each panel is one
    sgemm over every row (panel_sgemm), which packs x once per panel: level with plain sgemm on the stored,
    column-major w up to ~100 rows, slower past them (355M's weights, 24 in turn, ms, alternated, Zen 4:

        M              1     8    17    24    64    96   128   256   512
        column-major  12.1  20.6  60.1  58.1  119   105   131   277   457
        panels        13.2  15.3  28.7  34.2  88.3  113   150   351   608

    M = 1 before one row was padded to two; so a long prompt's prefill costs up to a third more in panels)."""
    m, k = x.shape
    if 0 < m <= panel_rows(k, panels.shape[2]):  # no rows: panel_sgemm's empty product (panel_products slices by m)
        return panel_products(x, panels)
    return panel_sgemm(x, panels)


def panel_products(x, panels):  # [m, k] @ panels -> [m, n], m <= panel_rows(k)
    """by_panels' small-kernel products: the panels shared between threads (OpenBLAS at one thread
    meanwhile); where k is too deep for m rows, k cut into slices (panel_depth) whose products are summed; m rows
    run as PANEL_PADDED_ROWS[m] where that names more, the added rows zeros and their outputs dropped."""
    m, k = x.shape
    rows = PANEL_PADDED_ROWS.get(m, m)                        # zero rows added where fewer cost more
    n_panels, _, width = panels.shape
    n_slices = k // panel_depth(rows, k, width)
    xs = (np.zeros if rows > m else np.empty)((n_slices, rows, k // n_slices), dtype=x.dtype)  # [n_slices, rows, depth]
    xs[:, :m] = x.reshape(m, n_slices, -1).transpose(1, 0, 2)  # [m, k] -> [n_slices, m, depth], the rest zeros
    sliced = panels.reshape(n_panels, n_slices, -1, width)   # [n_panels, n_slices, depth, width] view
    out = np.empty((n_panels, n_slices, rows, width), dtype=np.result_type(x, panels))  # each panel's, by slice

    def call(span):                                           # panels [p0, p1): one small product per slice
        p0, p1 = span
        np.matmul(xs, sliced[p0:p1], out=out[p0:p1])          # [n_slices, rows, depth] @ [b, n_slices, depth, width]

    in_panel_spans(call, n_panels, n_slices * rows * width)
    summed = out[:, 0, :m] if n_slices == 1 else out[:, :, :m].sum(axis=1)  # [n_panels, m, width]
    return summed.transpose(1, 0, 2).reshape(m, n_panels * width)  # [m, n]


def panel_sgemm(x, panels):  # [m, k] @ panels -> [m, n], any m
    """Each panel's [m, k] @ [k, width] by plain sgemm (it packs both), the panels shared between threads."""
    m = len(x)
    n_panels, _, width = panels.shape
    x = np.ascontiguousarray(x)
    out = np.empty((n_panels, m, width), dtype=np.result_type(x, panels))  # [n_panels, m, width]

    def call(span):
        p0, p1 = span
        np.matmul(x, panels[p0:p1], out=out[p0:p1])           # [m, k] @ [b, k, width] -> [b, m, width]

    in_panel_spans(call, n_panels, m * width)
    return out.transpose(1, 0, 2).reshape(m, n_panels * width)  # [m, n]


def in_panel_spans(call, n_panels, outputs_per_panel):
    """call((p0, p1)) over spans of panels covering them once, one span per thread allowed (OpenBLAS at one
    thread meanwhile), no more threads than the panels' outputs free the GIL for."""
    n_threads = max(1, min(threads_allowed(), n_panels, n_panels * outputs_per_panel // (GIL_FREE_OUTPUT + 1)))
    spans = [(i * n_panels // n_threads, (i + 1) * n_panels // n_threads) for i in range(n_threads)]
    with blas_single_threaded() if n_threads > 1 else contextlib.nullcontext():
        share(call, spans, n_threads)


BY_NAME = {"plain": plain, "pieces": in_pieces, "rows": by_rows, "padded": padded, "panels": by_panels}
