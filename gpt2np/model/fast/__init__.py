"""The forward pass's speed code: what makes it fast on a CPU, kept apart so forward.py reads as
the equations and reference.py as the textbook.

    matmul.py              x @ w for a verification pass's few rows, by the BLAS kernel that runs
    blocked_attention.py   causal attention for long inputs, in blocks of queries on every core
    threads.py             the helper thread, work shared between cores, row-block passes

And one setting, made here because it must be made before NumPy loads OpenBLAS: OpenBLAS's idle
threads spin for 2^28 cycles (~0.1 s) after every threaded product, holding the core that
matmul.py's second thread then needs: a 355M verification pass right after one-token calls cost
2.45 one-token passes instead of ~1.7. 2^20 cycles (~0.4 ms) still spans the gaps inside a decode
step. OpenBLAS reads it once, when NumPy loads it, so it only applies if gpt2np is imported before
NumPy (main.py and bench do that); otherwise everything works the same, verification just runs
slower. A user's own OPENBLAS_THREAD_TIMEOUT is left as it is.

May import: NumPy, threadpoolctl, and each other. Nothing else of gpt2np.
"""
import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")
