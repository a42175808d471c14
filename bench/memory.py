"""Peak memory and load time for the pair (124M + 355M by default), measured in fresh subprocesses.

A random model lives only in the memory of the process that drew it, so this section first writes
each size's random weights as an OpenAI-format checkpoint (checkpoint_writer.write_checkpoint of
weights.params_to_tf, plus hparams.json) into a temporary folder, then starts a new interpreter
(`python -m bench.memory --worker DIR...`) that loads them all with gpt2np.checkpoints.weights.load_params,
builds the models and runs one forward pass with each through its own KV cache, both caches kept
alive as speculative decoding keeps them (touching every weight), and reports:
  load_seconds      per model, for load_params alone
  rss_*             resident memory after `import gpt2np`, after a first small BLAS product (OpenBLAS
                    allocates its work buffers then), after loading, after the forward passes
  peak_rss          the process's high-water mark (VmHWM in /proc/self/status)
The worker runs twice: `first_load` reads the checkpoint (CRC-checked) and writes the .npy cache
beside it; `cached_load` reads that cache into memory, as every later load does. Both read files
the OS has just written, so they are page-cache-warm, not disk-cold. The first load's checkpoint
memory maps count in RSS once touched, which is why the forward passes are included. The KV
caches are allocated for the full n_ctx; with transparent huge pages a few writes make most of
them resident, so `kv_cache_bytes` (2 · n_layer · n_ctx · n_embd · 4 per model) is reported beside
the weights. The ratio reported is peak RSS over the fp32 weight bytes of the models loaded
(issue target: <= 1.3).
"""
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import kv_bytes, log, peak_rss_bytes, print_table, rss_bytes, weight_bytes

REPO = Path(__file__).resolve().parents[1]


def write_random_checkpoint(folder, config, seed):
    """A random model of this config in the release layout (hparams.json + model.ckpt.*)."""
    from gpt2np.checkpoints.tf_writer import write_checkpoint
    from gpt2np.checkpoints.weights import init_params, params_to_tf
    folder.mkdir(parents=True)
    (folder / "hparams.json").write_text(json.dumps(
        {k: getattr(config, k) for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")}))
    params = init_params(config, np.random.default_rng(seed))
    write_checkpoint(str(folder / "model.ckpt"), params_to_tf(params))


def worker(folders):
    """Runs in the subprocess: load every folder, one forward each, print a JSON line."""
    rss_import_before = rss_bytes()
    from gpt2np.model.config import GPT2Config
    from gpt2np.model.forward import GPT2
    from gpt2np.checkpoints.weights import load_params
    out = {"rss_start": rss_import_before, "rss_after_import": rss_bytes(), "load_seconds": {}}
    np.ones((256, 256), np.float32) @ np.ones((256, 256), np.float32)  # BLAS allocates its buffers on first use
    out["rss_after_blas_init"] = rss_bytes()
    models = []
    for folder in folders:
        config = GPT2Config.from_hparams_json(Path(folder) / "hparams.json")
        start = time.perf_counter()
        params = load_params(folder, config)
        out["load_seconds"][Path(folder).name] = time.perf_counter() - start
        models.append(GPT2(config, params))
    out["rss_after_load"] = rss_bytes()
    caches = [model.new_cache() for model in models]  # both kept, as in speculative decoding
    for model, cache in zip(models, caches):
        model.forward([0, 1, 2], cache, n_logits=1)
    out["rss_after_forward"] = rss_bytes()
    out["peak_rss"] = peak_rss_bytes()
    print(json.dumps(out))


def run_worker(folders):
    cmd = [sys.executable, "-m", "bench.memory", "--worker", *map(str, folders)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory worker failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(plan):
    sizes = list(dict.fromkeys(plan.memory_sizes))
    total = sum(weight_bytes(plan.config(s)) for s in sizes)
    tmp = Path(tempfile.mkdtemp(prefix="gpt2np-bench-memory-"))
    try:
        write_s = {}
        for i, size in enumerate(sizes):
            log(f"memory: writing a random {size} checkpoint to {tmp}")
            start = time.perf_counter()
            write_random_checkpoint(tmp / size, plan.config(size), seed=i)
            write_s[size] = time.perf_counter() - start
        folders = [tmp / s for s in sizes]
        log("memory: first load in a subprocess (reads the checkpoint, writes the .npy cache)")
        first = run_worker(folders)
        log("memory: cached load in a subprocess (reads the .npy cache)")
        cached = run_worker(folders)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in (first, cached):
        r["peak_over_weights"] = r["peak_rss"] / total
        r["load_seconds_total"] = sum(r["load_seconds"].values())
    kv = sum(kv_bytes(plan.config(s), plan.config(s).n_ctx) for s in sizes)
    result = {"sizes": sizes, "weight_bytes": total, "kv_cache_bytes": kv, "write_seconds": write_s,
              "first_load": first, "cached_load": cached}
    print_report(result)
    return result


def print_report(r):
    gib = 2**30
    rows = [[name, x["load_seconds_total"], x["rss_after_blas_init"] / gib, x["rss_after_load"] / gib,
             x["rss_after_forward"] / gib, x["peak_rss"] / gib, x["peak_over_weights"]]
            for name, x in (("first load", r["first_load"]), ("cached load", r["cached_load"]))]
    print_table(f"Loading {' + '.join(r['sizes'])} in a fresh process ({r['weight_bytes'] / gib:.2f} GiB fp32 weights, "
                f"{r['kv_cache_bytes'] / gib:.2f} GiB KV caches allocated)",
                ["load", "load s", "RSS start GiB", "RSS loaded", "RSS after fwd", "peak GiB", "peak / weights"],
                rows)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
    else:
        sys.exit("usage: python -m bench.memory --worker MODEL_DIR... (run by python -m bench)")
