"""gpt2np.teach.blas_curves: the product-level curve t(M) / t(1) behind notebook 07, measured in this process
and in a child process running another OpenBLAS kernel.

Times are never asserted (a shared machine makes them anything): only the curve's shape, its ratio at
M = 1 (1 by definition), and which kernel a child process really ran.
"""
import json

import pytest

from gpt2np.teach import blas_curves
from gpt2np.model.fast.matmul import KERNEL
from gpt2np.decoding.theory import predicted_speedup

# Two 2 MiB weights: the smallest that gpt2np keeps column-major (matmul.COLUMN_MAJOR_MIN), so gpt2np's
# product takes the path the notebook measures, in milliseconds.
SMALL = {"shape": (256, 2048), "cold_bytes": 4 << 20}

needs_haswell = pytest.mark.skipif(KERNEL is None or "avx2" not in blas_curves.cpu_flags(),
                                   reason="forcing OpenBLAS's Haswell kernel needs OpenBLAS on a CPU with AVX2")


def test_product_curve_shape_and_one_row():
    curve = blas_curves.product_curve(max_m=4, repeats=2, **SMALL)
    assert curve["m"] == [1, 2, 3, 4] and curve["kernel"] == blas_curves.kernel_name()
    assert curve["shape"] == [256, 2048] and curve["n_weights"] == 2
    assert set(curve["seconds"]) == set(curve["ratio"]) == set(blas_curves.PRODUCTS)
    for name in blas_curves.PRODUCTS:
        assert len(curve["seconds"][name]) == len(curve["ratio"][name]) == 4
        assert curve["ratio"][name][0] == 1.0                      # t(1) / t(1), in every repeat
        assert all(s > 0 for s in curve["seconds"][name]) and all(r > 0 for r in curve["ratio"][name])
    assert json.loads(json.dumps(curve)) == curve                  # plain data: what a child prints


def test_ratios_are_taken_within_each_repeat():
    times = {1: [1.0, 2.0, 4.0], 2: [3.0, 6.0, 4.0]}                  # repeat 2 ran twice as slow throughout
    assert blas_curves.ratios_to_one_row(times) == [1.0, 3.0]          # medians of [1, 1, 1] and [3, 3, 1]


def test_kernel_env_drops_the_kernel_variables_or_forces_one(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Sandybridge")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "256")
    own = blas_curves.kernel_env()
    assert not set(blas_curves.KERNEL_VARIABLES) & set(own) and own["PATH"]
    forced = blas_curves.kernel_env("Haswell")
    assert forced["OPENBLAS_CORETYPE"] == "Haswell" and forced["OPENBLAS_L2_SIZE"] == "512"


@needs_haswell
def test_a_child_runs_the_kernel_its_environment_asks_for():
    curve = blas_curves.product_curve_in_child(blas_curves.kernel_env("Haswell"), max_m=2, repeats=1, **SMALL)
    assert curve["kernel"] == "Haswell" and "Haswell" in curve["blas"]
    assert curve["ratio"]["plain"][0] == curve["ratio"]["gpt2np"][0] == 1.0


@needs_haswell
def test_blas_kernel_envs_lists_this_process_kernel_first_then_the_cpus_own_then_haswell():
    envs = blas_curves.blas_kernel_envs()
    names = list(envs)
    assert names[0] == blas_curves.kernel_name()  # this process's environment, forced or not
    assert len(set(names)) == len(names)
    own = [name for name, env in envs.items() if not any(env.get(v) for v in blas_curves.KERNEL_VARIABLES)]
    assert len(own) <= 1 and (own or "OPENBLAS_CORETYPE" in envs[names[0]])  # the CPU's own kernel, unless it is
    if "avx2" in blas_curves.cpu_flags():                                  # this process's, forced to itself
        assert "Haswell" in envs
        assert envs["Haswell"].get("OPENBLAS_CORETYPE", "Haswell") == "Haswell"  # on a Haswell-kernel CPU: its own


def test_a_failing_child_says_why():
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        blas_curves.run_child("1 / 0", blas_curves.kernel_env())


def test_gemv_rates_and_the_rows_bound():
    rates = blas_curves.gemv_rates(cold_bytes=4 << 20, repeats=1)
    assert rates["block_bytes"] == 512 << 10 and rates["n_blocks"] == 8
    assert all(rates[f"{name}_gbps"] > 0 for name in ("memory", "cache", "copy"))
    assert blas_curves.rows_ratio(1, 20, 80) == 1 and blas_curves.rows_ratio(5, 20, 80) == 2


def test_refined_speedups_put_the_ratio_at_k_plus_one_rows_into_theory():
    ratios = [1.0, 1.5, 2.0]
    assert blas_curves.refined_speedups(ratios, 0.8, 0.1) == [predicted_speedup(0.8, 1, 0.1, 1.5),
                                                              predicted_speedup(0.8, 2, 0.1, 2.0)]
    assert blas_curves.refined_speedups([1.0] * 3, 0.8, 0.1) == [predicted_speedup(0.8, K, 0.1) for K in (1, 2)]
