"""The second core: helper threads that take turns at shared work, and BLAS's own thread count.

NumPy releases the GIL inside its loops over large arrays (matmul with an output of more than ~500
elements, ufuncs and reductions over more than ~500), so Python threads calling NumPy on separate
pieces of an array run at once. matmul.py uses that for few-row products; blocked_attention.py and the
row-block passes below (forward.linear's bias, GELU and residual, layer norm) for long prompts.

    share(work, tasks, n_threads)   runs work(task) for every task, on the caller and n_threads - 1
                                    helpers, each taking the next task when it is free
"""
import contextlib
import functools
import os
import queue
import threading
import warnings

import numpy as np


def _openblas():
    """threadpoolctl's handle on NumPy's OpenBLAS, or None (other BLAS, or no threadpoolctl)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    blas = [c for c in ThreadpoolController().select(user_api="blas").lib_controllers
            if c.internal_api == "openblas"]
    return blas[0] if blas else None


BLAS = _openblas()
CPUS = os.cpu_count() or 1


def cpu_flags():
    """The CPU's feature flags ("avx2", "avx512f", ...) from /proc/cpuinfo; empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split(":", 1)[1] for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


LATE_TIMEOUT_WARNING = (
    "gpt2np: NumPy was imported before gpt2np and this OpenBLAS cannot take OPENBLAS_THREAD_TIMEOUT now, "
    "so its idle threads spin ~0.1 s after each product (slower decoding on a busy machine); fix: import "
    "gpt2np before numpy, or set OPENBLAS_THREAD_TIMEOUT=20 in the environment")


def restart_blas_threads(blas=BLAS):
    """Make OpenBLAS take the environment's OPENBLAS_THREAD_TIMEOUT although it was loaded before it
    was set (NumPy imported before gpt2np): re-read the environment, stop the thread pool and start
    it again, which reads the timeout. Returns whether the setting now holds: True without a pool of
    spinning threads (another BLAS, OpenBLAS built on OpenMP), False for an OpenBLAS that does not
    export these three functions (NumPy's 0.3.x pthreads builds do).

    Its thread count (threadpoolctl limits, --threads) and kernel (OPENBLAS_CORETYPE) are kept: the
    pool restarts with as many threads as before, and the kernel is chosen once, at load. Must not
    run while another thread is inside a BLAS call (gpt2np does it on import)."""
    if blas is None or getattr(blas, "threading_layer", None) != "pthreads":
        return True  # no OpenBLAS thread pool: the setting is not this library's
    try:
        read_env, shutdown, start = (blas.dynlib.openblas_read_env, blas.dynlib.blas_thread_shutdown_,
                                     blas.dynlib.blas_thread_init)
    except AttributeError:
        return False
    read_env()   # openblas_thread_timeout() now returns the environment's value
    shutdown()   # joins the worker threads ...
    start()      # ... and starts them again: the pool's timeout is set here, from that value
    return True


def hold_thread_timeout(blas=BLAS):
    """After NumPy was imported before gpt2np: restart_blas_threads, or say once, in one line, that
    the setting could not be applied and how to apply it."""
    if not restart_blas_threads(blas):
        warnings.warn(LATE_TIMEOUT_WARNING, RuntimeWarning, stacklevel=2)


def thread_timeout_setting(blas=BLAS):
    """The OPENBLAS_THREAD_TIMEOUT OpenBLAS has read (0: its default, 2^28 cycles), or None if unknown."""
    function = getattr(getattr(blas, "dynlib", None), "openblas_thread_timeout", None)
    return None if function is None else int(function())


class Helper:
    """A thread that runs fn(*args) when handed it, for as long as the process lives.

    A 355M verification pass hands work over ~100 times, so this is as thin as it can be: two
    C-level queues, no futures (concurrent.futures.ThreadPoolExecutor took 6 us longer per hand-off
    here). What remains, 20-30 us in the caller to wake the sleeping thread, is the system call
    that wakes the other virtual CPU (PERFORMANCE.md)."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="gpt2np-helper").start()

    def _serve(self):
        while True:
            fn, args, reply = self._jobs.get()
            try:
                reply.put((fn(*args), None))
            except BaseException as e:  # handed back to whoever waits for the result
                reply.put((None, e))

    def submit(self, fn, *args):  # -> Reply; fn(*args) runs on this helper's thread
        reply = Reply()
        self._jobs.put((fn, args, reply))
        return reply


class Reply(queue.SimpleQueue):
    def result(self):
        """Wait for the helper to finish; its return value, or its exception raised here."""
        value, error = self.get()
        if error is not None:
            raise error
        return value


HELPERS = []  # started on first use: a process that never shares work starts none
os.register_at_fork(after_in_child=HELPERS.clear)  # a forked child has none of its parent's threads


def helpers(n):  # -> the first n helper threads, starting those not running yet
    while len(HELPERS) < n:
        HELPERS.append(Helper())
    return HELPERS[:n]


def threads_allowed():
    """How many threads shared work may use: BLAS's thread setting (main.py's --threads, threadpoolctl
    limits), at most the CPUs; 1 without OpenBLAS, whose setting is what tells us."""
    return min(BLAS.get_num_threads(), CPUS) if BLAS is not None else 1


def share(work, tasks, n_threads):
    """work(task) for every task, on the caller and n_threads - 1 helpers; returns when all are done.

    The tasks are one shared iterator: each thread takes the next when it is free (next() on a
    tuple or list iterator is atomic under the GIL), so a helper that starts late does fewer. The
    first exception, the caller's or a helper's, is raised here after every thread has stopped."""
    todo = iter(tasks)

    def run():
        for task in todo:
            work(task)

    replies = [h.submit(run) for h in helpers(n_threads - 1)]
    try:
        run()
    finally:
        for r in replies:
            r.result()


@contextlib.contextmanager
def blas_single_threaded():
    """OpenBLAS at one thread inside: shared tasks that call BLAS run side by side on their own
    threads instead of each waking OpenBLAS's. Costs ~1 us; restores the caller's setting."""
    if BLAS is None:
        yield
        return
    before = BLAS.get_num_threads()
    BLAS.set_num_threads(1)
    try:
        yield
    finally:
        BLAS.set_num_threads(before)


ROWS_MIN_BYTES = 1 << 20    # row-wise work on arrays from this size on is shared between the cores:
                            # below it, waking the helper (~50 us) costs more than it saves
ROW_BLOCK_BYTES = 1 << 18   # rows per task: a few hundred KB, so every pass over a block hits L2


def row_blocks(x):  # -> [(r0, r1), ...] covering x's rows, each about ROW_BLOCK_BYTES
    rows = max(1, ROW_BLOCK_BYTES // max(1, x[:1].nbytes))
    return [(r0, min(len(x), r0 + rows)) for r0 in range(0, len(x), rows)]


def rowwise(fn):
    """fn(x, ..., out=None) -> an array of x's shape, computed row by row: on a large x, blocks of
    rows go to every core allowed, each block's passes staying in its core's cache. fn must treat
    each row on its own (layer norm): then the blocks' results are fn(x)'s, exactly."""
    @functools.wraps(fn)
    def by_blocks(x, *args, **kwargs):
        out = np.empty_like(x)
        in_row_blocks(lambda r0, r1: fn(x[r0:r1], *args, **kwargs, out=out[r0:r1]), x)
        return out
    return by_blocks


def in_row_blocks(work, y):
    """work(r0, r1) for blocks of y's rows that cover it once: on a large y, blocks of about
    ROW_BLOCK_BYTES shared between every core allowed; otherwise one call, work(0, len(y))."""
    if y.nbytes < ROWS_MIN_BYTES or (n_threads := threads_allowed()) < 2:  # sizes first: a decoding
        work(0, len(y))                                                    # step asks ~150 times
    else:
        share(lambda rows: work(*rows), row_blocks(y), n_threads)
