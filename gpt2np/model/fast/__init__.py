"""The forward pass's speed code: what makes it fast on a CPU, kept apart so forward.py reads as
the equations and reference.py as the textbook.

    matmul.py              x @ w for a verification pass's few rows, by the BLAS kernel that runs
    layout.py              the weights' memory order: column-major as stored, or another for batches
    blocked_attention.py   causal attention for long inputs, in blocks of queries on every core
    threads.py             the helper thread, work shared between cores, row-block passes

And one setting, made here, first thing in gpt2np, because OpenBLAS reads it on load: its idle
threads spin for 2^28 cycles (~0.1 s) after every threaded product, holding the core that
matmul.py's second thread then needs: a 355M verification pass right after one-token calls cost
2.45 one-token passes instead of ~1.7. 2^20 cycles (~0.4 ms) still spans the gaps inside a decode
step. OpenBLAS reads it when NumPy loads it, and again only when its thread pool starts. So when
NumPy was imported first (a notebook, a user's script), the setting is made and then the pool is
restarted to take it (threads.restart_blas_threads): the import order does not decide the speed.
Where that is impossible (an OpenBLAS that hides the functions) a one-line RuntimeWarning says so,
with the fix. A user's own OPENBLAS_THREAD_TIMEOUT is left as it is, and nothing else OpenBLAS
reads (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE, thread counts) changes.

May import: NumPy, threadpoolctl, and each other. Nothing else of gpt2np.
"""
import os
import sys

THREAD_TIMEOUT = "20"  # log2 of the cycles an idle OpenBLAS thread spins before it sleeps

NUMPY_WAS_FIRST = "numpy" in sys.modules and "OPENBLAS_THREAD_TIMEOUT" not in os.environ
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)
if NUMPY_WAS_FIRST:  # OpenBLAS is loaded already, with its default timeout: apply ours now
    from .threads import hold_thread_timeout
    hold_thread_timeout()  # or one warning, once: this module runs once
