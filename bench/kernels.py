"""The verification curve and the decode step once per OpenBLAS kernel this CPU runs, side by side.

OpenBLAS picks a kernel per CPU when NumPy loads it, and gpt2np.model.fast.matmul picks its few-row method by
that kernel (its table METHODS), so one process measures one kernel. The kernels are those
gpt2np.teach.blas_curves.blas_kernel_envs finds (a child process asked under each candidate environment):
  this run's  this process's own environment (CI may set OPENBLAS_CORETYPE=Haswell)
  CPU's own   the same without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
  forced      OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=512: the kernels every x86 CPU without
              AVX-512 runs; only where /proc/cpuinfo lists avx2
one environment per distinct kernel, in that order. For each size of plan.kernel_sizes (random weights),
a worker process per kernel (kernel_worker.py) measures, at context plan.verify_context: v(M) =
t(forward over M new tokens) / t(forward over 1) for M = 1..plan.kernel_max_m, with gpt2np's methods
and with every product plain x @ w, each on the weights as stored (column-major) and made row-major (the
order a batching server takes under the Haswell kernels: gpt2np.model.fast.layout, PERFORMANCE.md), with
gpt2np's methods on the weights in panels too (the order a model is loaded in under SkylakeX), and decode
s/token against the roofline with that worker's best gemv bandwidth. The workers run one after the other, kernel by kernel, plan.kernel_rounds
times over (A, B, A, B: the host's drift reaches every kernel alike), and every number reported is
the median over the rounds. Cost at 355M: ~40 s per kernel and round (7 s of it building the model).
"""
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from gpt2np.teach.blas_curves import blas_kernel_envs

from .common import log, median, ms, print_table
from .kernel_worker import ENV_VARS

REPO = Path(__file__).resolve().parents[1]  # workers run `python -m bench.kernel_worker` from here


def env_text(env):
    return " ".join(f"{k}={env[k]}" for k in ENV_VARS if env.get(k) is not None) or "OPENBLAS_CORETYPE unset"


def source(env):
    """Where an environment of blas_kernel_envs comes from, for the table's notes."""
    if all(env.get(k) == os.environ.get(k) for k in ENV_VARS):
        return "this run's"
    return "CPU's own" if not any(env.get(k) for k in ENV_VARS) else "forced"


def distinct_kernels():
    """[{name, source, env}]: one environment per kernel (gpt2np.teach.blas_curves.blas_kernel_envs)."""
    return [{"name": name, "source": source(env), "env": env} for name, env in blas_kernel_envs().items()]


def run_worker(kernel, size, config, plan, threads):
    """One kernel_worker process for this kernel and size: its JSON."""
    cmd = [sys.executable, "-m", "bench.kernel_worker", "--config", json.dumps(asdict(config)),
           "--max-m", str(plan.kernel_max_m), "--repeats", str(plan.repeats),
           "--context", str(plan.verify_context), "--bandwidth-mib", str(plan.bandwidth_mib)]
    cmd += ["--threads", str(threads)] if threads else []
    done = subprocess.run(cmd, cwd=REPO, env=kernel["env"], stdout=subprocess.PIPE, text=True)  # stderr: ours
    if done.returncode != 0:
        raise RuntimeError(f"kernels: the {size} worker under {kernel['name']} ({env_text(kernel['env'])}) "
                           f"exited with code {done.returncode}; its stderr is above")
    result = json.loads(done.stdout)
    if result["kernel"] != kernel["name"]:
        raise RuntimeError(f"kernels: the {size} worker for {kernel['name']} ran {result['kernel']}")
    return result


def summarise(name, runs):
    """A kernel's entry for one size: medians over its rounds (runs: the workers' JSON)."""
    def over_runs(get):
        return median([get(r) for r in runs])

    keys = list(runs[0]["verify"]["gpt2np"]["ratio"])
    return {"name": name, "methods": runs[0]["methods"], "methods_row_major": runs[0]["methods_row_major"],
            "ratio": {m: over_runs(lambda r: r["verify"]["gpt2np"]["ratio"][m]) for m in keys},
            "ratio_row_major": {m: over_runs(lambda r: r["verify"]["gpt2np_row_major"]["ratio"][m]) for m in keys},
            "ratio_panels": {m: over_runs(lambda r: r["verify"]["gpt2np_panels"]["ratio"][m]) for m in keys}
            if "gpt2np_panels" in runs[0]["verify"] else None,
            "one_token_panels_s": over_runs(lambda r: r["verify"]["gpt2np_panels"]["seconds"]["1"])
            if "gpt2np_panels" in runs[0]["verify"] else None,
            "ratio_plain": {m: over_runs(lambda r: r["verify"]["plain"]["ratio"][m]) for m in keys},
            "ratio_plain_row_major": {m: over_runs(lambda r: r["verify"]["plain_row_major"]["ratio"][m]) for m in keys},
            "one_token_row_major_s": over_runs(lambda r: r["verify"]["gpt2np_row_major"]["seconds"]["1"]),
            "one_token_s": over_runs(lambda r: r["verify"]["gpt2np"]["seconds"]["1"]),
            "decode_s": over_runs(lambda r: r["decode"]["s_per_token"]),
            "roofline_s": over_runs(lambda r: r["decode"]["roofline_s"]),
            "vs_roofline": over_runs(lambda r: r["decode"]["vs_roofline"]),
            "vs_roofline_paired": over_runs(lambda r: r["decode"]["vs_roofline_paired"]),
            "bandwidth_gbps": over_runs(lambda r: r["bandwidth_gbps"]), "runs": runs}


def measure_size(size, config, kernels, plan, threads):
    if plan.verify_context + plan.kernel_max_m > config.n_ctx:
        raise ValueError(f"kernels: {size}: context {plan.verify_context} + M {plan.kernel_max_m} "
                         f"exceeds n_ctx {config.n_ctx}")
    runs = {k["name"]: [] for k in kernels}
    for r in range(plan.kernel_rounds):
        for k in kernels:  # kernel after kernel, every round in the same order
            log(f"kernels: {size} under {k['name']} ({env_text(k['env'])}), round {r + 1} of {plan.kernel_rounds}")
            runs[k["name"]].append(run_worker(k, size, config, plan, threads))
    return [summarise(name, rs) for name, rs in runs.items()]


def run(plan, threads=None):
    """results["kernels"] (see bench/__init__.py), after printing its tables."""
    kernels = distinct_kernels()
    log(f"kernels: {', '.join(k['name'] + ' (' + k['source'] + ')' for k in kernels)}")
    sizes = {size: measure_size(size, plan.config(size), kernels, plan, threads) for size in plan.kernel_sizes}
    first = next(iter(sizes.values()))  # every worker of a kernel says the same of it
    result = {"context": plan.verify_context, "max_m": plan.kernel_max_m, "rounds": plan.kernel_rounds,
              "kernels": [describe(k, entry["runs"][0]) for k, entry in zip(kernels, first)], "sizes": sizes}
    print_report(result)
    return result


def describe(kernel, worker):
    """A kernel for the JSON: its OpenBLAS variables alone (the rest of the environment is the run's)."""
    return {"name": kernel["name"], "source": kernel["source"], "env": {v: kernel["env"].get(v) for v in ENV_VARS},
            "blas_kernel": worker["blas_kernel"], "measured": worker["measured"]}


def print_report(r):
    for size, entries in r["sizes"].items():
        m_keys = list(entries[0]["ratio"])[1:]
        rows = [[int(m)] + [cell for e in entries for cell in (f"{e['methods'][m]} / {e['methods_row_major'][m]}",
                                                                  e["ratio"][m], e["ratio_row_major"][m],
                                                                  e["ratio_panels"][m] if e["ratio_panels"] else "-",
                                                                  e["ratio_plain"][m], e["ratio_plain_row_major"][m])]
                for m in m_keys]
        print_table(f"Verification curve per OpenBLAS kernel: {size}, context {r['context']}, v(M) = "
                    f"t(forward over M) / t(forward over 1), median of {r['rounds']} round(s)",
                    ["M"] + [f"{e['name']} {h}" for e in entries
                             for h in ("methods", "v gpt2np", "v gpt2np row-major", "v gpt2np panels", "v plain",
                                       "v plain row-major")],
                    rows,
                    note="methods: gpt2np's for a [n_embd, 4 n_embd] weight (c_fc), column-major as stored / "
                         "row-major as a batching server makes it under the Haswell kernels "
                         "(gpt2np.model.fast.layout); panels: the weights cut into panels, as a batching server "
                         "makes them under SkylakeX (gpt2np.model.fast.matmul.by_panels); v plain: every product "
                         "x @ w (gpt2np.model.fast.matmul.METHODS emptied); each row-major and panels curve over "
                         "its own one-token pass (M=1 ms, below)")
        rows = [[e["name"], ms(e["one_token_s"]), ms(e["one_token_row_major_s"]),
                 ms(e["one_token_panels_s"]) if e["one_token_panels_s"] else "-", ms(e["decode_s"]),
                 ms(e["roofline_s"]), e["vs_roofline"], e["vs_roofline_paired"], e["bandwidth_gbps"]] for e in entries]
        print_table(f"Decode per OpenBLAS kernel: {size}, context {r['context']} (median of {r['rounds']} round(s))",
                    ["kernel", "M=1 ms", "M=1 row-major ms", "M=1 panels ms", "decode ms", "roofline ms", "x roofline",
                     "x paired",
                     "gemv GB/s"], rows,
                    note="roofline = (weight bytes per token + KV bytes at the context) / the worker's best gemv "
                         "bandwidth; x paired: each step over a gemv pass timed right after it")
    for k in r["kernels"]:
        print(f"{k['name']}, {k['source']} environment ({env_text(k['env'])}): {k['blas_kernel']}")
    for k in r["kernels"]:
        if not k["measured"]:
            print(f"kernel {k['name']}: not measured, few-row products are plain x @ w")
