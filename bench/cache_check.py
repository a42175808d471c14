"""What checking the .npy cache costs: cached loads with and without each tensor's CRC32C check.

    python -m bench.cache_check            # 355M: the cache check's cost at 355M
    python -m bench.cache_check --size 124M --repeats 3

Writes gpt2np.random_model(PRESETS[size])'s weights as a real-format checkpoint in a temporary
folder (bench/memory.py's write_random_checkpoint), loads it once to build the cache, then times
weights._load_cache alternately with verify_crc True and False (shape, dtype and memory order are
checked either way), and one full cached load_params. Files are page-cache-warm: the difference is
the CRC32C pass over the bytes already in memory, not disk.
"""
import argparse
import tempfile
import time
from pathlib import Path

from gpt2np.checkpoints import weights
from gpt2np.model.config import PRESETS
from gpt2np.report import DefaultsHelpFormatter

from .common import log, median
from .memory import write_random_checkpoint


def time_cached_loads(size, repeats):
    config = PRESETS[size]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / size
        log(f"writing a random {size} checkpoint")
        write_random_checkpoint(folder, config, seed=0)
        weights.load_params(folder, config)  # first load: CRC-checks the checkpoint, writes the cache
        key = weights._checkpoint_key(str(folder / "model.ckpt"))
        cache_dir = folder / weights.CACHE_DIR
        times = {True: [], False: [], "crc": []}
        for _ in range(repeats):  # alternated, so drift in the shared machine hits both alike
            for verify in (True, False):
                tensors = None  # free the last load first, or every other load competes with it for memory
                start = time.perf_counter()
                tensors = weights._load_cache(cache_dir, key, config, verify_crc=verify)
                times[verify].append(time.perf_counter() - start)
            start = time.perf_counter()  # the check alone, over the tensors just loaded
            for x in tensors.values():
                weights.tensor_crc32c(x)
            times["crc"].append(time.perf_counter() - start)
        start = time.perf_counter()
        weights.load_params(folder, config)
        full = time.perf_counter() - start
    gb = 4 * config.n_params() / 1e9
    best = {k: min(v) for k, v in times.items()}  # min: the least disturbed run on a shared machine
    print(f"{size} ({gb:.2f} GB), best of {repeats}: cached load {best[False]:.3f} s without the CRC32C "
          f"check, {best[True]:.3f} s with it; the check alone {best['crc']:.3f} s "
          f"({gb / best['crc']:.1f} GB/s); medians {median(times[False]):.3f} / {median(times[True]):.3f} / "
          f"{median(times['crc']):.3f} s; full cached load_params {full:.3f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.cache_check", description=__doc__.split("\n")[0],
                                 formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--size", default="355M", choices=list(PRESETS), help="the random checkpoint's shape")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed loads with the check and without it, alternated (the best of each is reported)")
    args = ap.parse_args()
    time_cached_loads(args.size, args.repeats)
