"""The benchmark suite (bench/) runs end to end on tiny configs and writes well-formed JSON.

No timing assertions: on a shared machine any speed can happen. We check that every section
ran, that the JSON has the keys issue 5 asks for (per size: bandwidth, roofline, decode s/token,
the M = 1..9 ratios, measured vs predicted speculative speedups) and issue 14's (prefill per prompt
length, a verification curve per context, forced-acceptance runs after a long prompt), and that the
numbers are finite and positive where they must be. The prefill pair's worker processes are tested
in test_bench_prefill_pair.py.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpt2np
from gpt2np.teach.blas_curves import cpu_flags
from gpt2np.model.config import PRESETS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

from bench import SECTIONS, kernels  # noqa: E402
from bench.__main__ import selected_sections  # noqa: E402
from bench.common import tiny_plan, weight_bytes_per_token  # noqa: E402
from bench.compare import headline  # noqa: E402
from bench.forced_draft import ForcedAcceptanceDraft  # noqa: E402
from bench.spec import run_baseline  # noqa: E402

NO_HF = ",".join(s for s in SECTIONS if s != "hf")  # hf is optional and slow to import: tested apart


def positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """`python -m bench --tiny` in a subprocess, exactly as a user runs it; (the parsed JSON, its stdout)."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--tiny", "--sections", NO_HF, "--json", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "## Verification curve" in done.stdout and "## Speculative decoding" in done.stdout
    return json.loads(path.read_text()), done.stdout


@pytest.fixture(scope="module")
def results(bench_run):
    return bench_run[0]


def test_top_level_sections(results):
    assert set(results) >= {"meta", "bandwidth", "sizes", "reference", "overhead", "memory", "kernels", "targets"}
    meta = results["meta"]
    assert meta["plan"]["tiny"] is True and set(meta["sections"]) == set(NO_HF.split(","))
    assert isinstance(meta["blas"], list) and positive(meta["wall_seconds"])
    assert set(meta["env"]) >= {"OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS"}


def test_bandwidth(results):
    bw = results["bandwidth"]
    assert set(bw["methods"]) == {"sum", "gemv", "row_matmul"}
    assert positive(bw["best_gbps"]) and bw["best_gbps"] == bw["methods"][bw["best_method"]]["best_gbps"]
    assert positive(bw["gemm"]["gflops"])
    assert list(bw["small_m"]["ratio"]) == [str(m) for m in range(1, 10)]


def test_per_size_keys(results):
    plan = tiny_plan()
    assert list(results["sizes"]) == list(plan.sizes)
    for size, s in results["sizes"].items():
        assert positive(s["bandwidth_gbps"]) and positive(s["roofline_s_per_token"])
        assert s["weight_bytes_per_token"] == weight_bytes_per_token(plan.config(size))
        assert list(s["prefill"]) == [str(n) for n in plan.prefill_lens]  # issue 14: one per prompt length
        for n, p in s["prefill"].items():
            assert p["n_tokens"] == int(n) and positive(p["seconds"]) and positive(p["gflops"])
            assert positive(p["tokens_per_s"]) and p["seconds_min"] <= p["seconds"]
        assert list(s["decode"]) == [str(c) for c in plan.contexts]
        for d in s["decode"].values():
            assert positive(d["s_per_token"]) and positive(d["roofline_s"]) and positive(d["vs_roofline"])
            assert positive(d["vs_roofline_paired"])
        assert list(s["verify"]) == [str(c) for c in plan.verify_contexts]  # issue 14: one curve per context
        for ctx, curve in s["verify"].items():
            assert curve["context"] == int(ctx)
            assert list(curve["ratio"]) == [str(m) for m in range(1, 10)]
            assert curve["ratio"]["1"] == 1.0
            assert all(positive(r) for r in curve["ratio"].values())


def check_speculative_run(run, K):
    assert run["K"] == K and run["tokens_match_baseline"] is True  # greedy: exactly the baseline's tokens
    for key in ("speedup", "speedup_end_to_end", "predicted_thm38", "predicted_refined", "c", "v",
                "tokens_per_round", "round_cost_t1", "predicted_round_cost_t1"):
        assert positive(run[key]), key
    assert 0 <= run["alpha_hat"] <= 1 and isinstance(run["refined_error"], float)


def test_speculative(results):
    plan = tiny_plan()
    for size, s in results["sizes"].items():
        self_run = s["speculative"]["self"]
        check_speculative_run(self_run, plan.K)
        assert self_run["alpha_hat"] == 1.0  # draft = target at temperature 0: every draft accepted
        assert self_run["tokens_per_round"] > 1
    forced = results["sizes"][plan.pair[1]]["speculative"]["forced"]
    assert [r["alpha_nominal"] for r in forced["runs"]] == results["meta"]["plan"]["alphas"]
    for run in forced["runs"]:
        check_speculative_run(run, plan.K)
    assert forced["runs"][-1]["alpha_hat"] == 1.0  # alpha = 1: the drafter always proposes the target's token
    long = results["sizes"][plan.pair[1]]["speculative"]["forced_long"]  # issue 14: the same after a long prompt
    assert [r["alpha_nominal"] for r in long["runs"]] == results["meta"]["plan"]["alphas"]
    for run in long["runs"]:
        check_speculative_run(run, plan.K)
        assert run["prompt_len"] == plan.spec_long_prompt > plan.spec_prompt_len
    assert long["runs"][-1]["alpha_hat"] == 1.0
    assert all(r["prompt_len"] == plan.spec_prompt_len for r in forced["runs"])


def test_policy_sweep_and_bundled_prompt_lookup(results):
    plan = tiny_plan()
    sweep = results["sizes"][plan.pair[1]]["policies"]
    Ks = [str(K) for K in range(1, plan.policy_K_max + 1)] + ["heuristic", "auto"]
    got = {(r["drafter"], r["alpha_nominal"], str(r["K"])) for r in sweep["rows"]}
    assert got == {(d, a, K) for d in ("model", "lookup") for a in plan.policy_alphas for K in Ks} | \
        {("self", 1.0, K) for K in Ks}  # the target drafting for itself: once per repeat, alpha 1 by nature
    for row in sweep["rows"]:
        drafted = set(map(str, row["K_counts"])) != {"0"}  # auto may stay plain throughout (self): no alpha_hat to predict with
        assert row["exact"] is True and positive(row["speedup"]) and (positive(row["predicted_refined"]) or not drafted)
        assert sum(row["K_counts"].values()) == row["rounds"]
    for row in (r for r in sweep["rows"] if r["drafter"] == "self" and r["K"] != "auto"):
        assert row["alpha_hat"] == 1.0 and row["c"] > 0.3, row  # every draft accepted; a draft costs a target call
    for row in sweep["rows"]:  # each forced drafter's run replayed on its coins and its group's costs; self has no coins
        replays = row.get("replays")
        assert (replays is None) == (row["drafter"] == "self"), row
        assert replays is None or (len(replays) == plan.policy_repeats and all(positive(x) for x in replays)), row
        if row["K"] == "auto" and replays is not None:  # what auto's replay charged, seed by seed (the JSON: keys str)
            assert [sorted(map(int, costs["v"])) for costs in row["replay_costs"]] == [list(range(1, plan.policy_K_max + 2))] * \
                plan.policy_repeats and all(positive(costs["c"]) for costs in row["replay_costs"]), row["replay_costs"]
            assert len(row["bayes_replays"]) == plan.policy_repeats and all(map(positive, row["bayes_replays"])), row
    at_one = [r for r in sweep["rows"] if r["alpha_nominal"] == 1.0 and r["K"] == 2]
    assert all(r["alpha_hat"] == 1.0 for r in at_one)  # forced alpha = 1: every draft accepted
    bundled = results["bundled_lookup"]
    if "skipped" not in bundled:
        assert {r["drafter"] for r in bundled["rows"]} == {"ngram", "model"}
        assert all(r["exact"] and 0 < r["alpha_hat"] < 1 for r in bundled["rows"])
    names = [t["target"] for t in results["targets"]]
    assert any("K-policy sweep" in n for n in names)
    groups = len(plan.policy_alphas) + 1  # one per alpha, one for the target drafting for itself
    assert len(sweep["drifts"]) == groups * plan.policy_repeats and all(positive(d) for d in sweep["drifts"])


def test_every_timing_table_names_the_blas_kernel(bench_run):
    """The K-policy table names the BLAS kernel in its title, as the batching and trees tables do (and the JSON)."""
    results, stdout = bench_run
    title = next(line for line in stdout.splitlines() if line.startswith("## K policies"))
    kernel = results["sizes"][tiny_plan().pair[1]]["policies"]["blas_kernel"]
    assert kernel and title.endswith(f"; BLAS: {kernel}"), title


def test_a_run_is_measured_against_the_baseline_at_its_own_time():
    """baseline_at: the line between the plain runs before and after a group, at the run's midpoint
    (clamped to the two ends), so that a drifting machine does not favour the runs nearest the first."""
    from bench.policies import baseline_at
    before = {"tokens": [1, 2], "t1": 1.0, "steady": 10.0, "prefill": 2.0, "when": 100.0}
    after = {"tokens": [1, 2], "t1": 1.2, "steady": 12.0, "prefill": 3.0, "when": 200.0}
    assert baseline_at(before, after, 150.0) == {"tokens": [1, 2], "t1": 1.1, "steady": 11.0, "prefill": 2.5}
    assert baseline_at(before, after, 175.0)["steady"] == pytest.approx(11.5)
    assert baseline_at(before, after, 50.0)["steady"] == 10.0 and baseline_at(before, after, 250.0)["steady"] == 12.0


def test_reference_overhead_memory(results):
    ref = results["reference"]
    assert ref["tokens_match"] is True and positive(ref["speedup_vs_reference"])
    assert ref["extrapolated"] is True and len(ref["reference_steps"]) == ref["reference_tokens_measured"] + 1
    pc = results["overhead"]["per_call"]
    assert set(pc["estimated_s_per_call"]) == set(tiny_plan().sizes)
    bundled = results["overhead"]["bundled"]
    assert "skipped" in bundled or positive(bundled["plain"]["s_per_token"])
    mem = results["memory"]
    for load in ("first_load", "cached_load"):
        assert positive(mem[load]["peak_rss"]) and positive(mem[load]["peak_over_weights"])
        assert set(mem[load]["load_seconds"]) == set(tiny_plan().memory_sizes)


def test_targets_and_headline(results):
    plan = tiny_plan()
    assert all(set(t) == {"target", "measured", "goal", "met"} for t in results["targets"])
    names = [t["target"] for t in results["targets"]]
    long_ctx, long_verify = max(plan.contexts), max(plan.verify_contexts)
    assert f"tiny2 decode@{plan.verify_context} / roofline" in names and f"tiny2 decode@{long_ctx} / roofline" in names
    assert "tiny2 forward M=5 / M=1" in names and f"tiny2 forward M=5 / M=1 at context {long_verify}" in names
    assert any(f"prompt {plan.spec_long_prompt}: speedup / refined" in n for n in names)
    h = headline(results)
    assert f"tiny2 verify_M5@{plan.verify_context} ratio" in h and f"tiny2 verify_M5@{long_verify} ratio" in h
    assert all(f"tiny2 prefill@{n} seconds" in h for n in plan.prefill_lens) and "reference fast speedup" in h
    assert f"tiny2 spec tiny forced a=1.0 prompt {plan.spec_long_prompt} speedup" in h
    assert all(positive(v) or v == 0 or isinstance(v, float) for v in h.values())


def test_compare_reads_json_from_before_issue_14(results, capsys):
    """Old files had prefill as one dict and verify as one curve: read as their one length / context."""
    from bench.compare import print_comparison
    from bench.decode import print_report
    old = json.loads(json.dumps(results))
    for s in old["sizes"].values():
        s["prefill"] = s["prefill"][str(tiny_plan().prefill_lens[0])]
        s["verify"] = s["verify"][str(tiny_plan().verify_context)]
        s["speculative"].pop("forced_long", None)  # only the pair's target has it
    h_old, h_new = headline(old), headline(results)
    assert set(h_old) < set(h_new)
    assert h_old["tiny2 verify_M5@8 ratio"] == h_new["tiny2 verify_M5@8 ratio"]
    assert h_old["tiny2 prefill@8 seconds"] == h_new["tiny2 prefill@8 seconds"]
    print_comparison(old, results)
    print_report(old["sizes"])
    out = capsys.readouterr().out
    assert "tiny2 prefill@8 seconds" in out and "## Verification curve" in out


def test_kernels(bench_run):
    """One worker process per OpenBLAS kernel: this run's kernel, and Haswell's where the CPU has AVX2."""
    (results, stdout), plan = bench_run, tiny_plan()
    r = results["kernels"]
    names = [k["name"] for k in r["kernels"]]
    assert all(names) and len(set(names)) == len(names)
    if gpt2np.model.fast.matmul.KERNEL is not None:  # OpenBLAS: this process's kernel, and Haswell's where it can run
        assert gpt2np.model.fast.matmul.KERNEL in names and ("Haswell" in names or "avx2" not in cpu_flags())
    assert list(r["sizes"]) == list(plan.kernel_sizes) and r["rounds"] == plan.kernel_rounds
    m_keys = [str(m) for m in range(1, plan.kernel_max_m + 1)]
    for size, entries in r["sizes"].items():
        assert [e["name"] for e in entries] == names, size
        for e in entries:
            for curve in ("ratio", "ratio_row_major", "ratio_panels", "ratio_plain", "ratio_plain_row_major"):  # tiny2:
                                                                                   # n_embd 32, one panel
                assert list(e[curve]) == m_keys and e[curve]["1"] == 1.0, (size, e["name"], curve)
                assert all(positive(v) for v in e[curve].values()), (size, e["name"], curve)
            for methods in (e["methods"], e["methods_row_major"]):
                assert list(methods) == m_keys and set(methods.values()) <= set(gpt2np.model.fast.matmul.BY_NAME)
            assert all(positive(e[k]) for k in ("one_token_s", "one_token_row_major_s", "one_token_panels_s",
                                                "decode_s", "roofline_s", "vs_roofline"))
            assert len(e["runs"]) == plan.kernel_rounds and all(run["kernel"] == e["name"] for run in e["runs"])
    assert "## Verification curve per OpenBLAS kernel" in stdout
    for k in r["kernels"]:
        assert all(f"{k['name']} v {curve}" in stdout
                   for curve in ("gpt2np", "gpt2np row-major", "gpt2np panels", "plain row-major"))
        assert k["blas_kernel"] in stdout
        assert k["measured"] == (k["name"] in gpt2np.model.fast.matmul.METHODS)


def test_kernels_report_names_an_unmeasured_kernel(results, capsys):
    r = json.loads(json.dumps(results["kernels"]))
    r["kernels"][0].update(name="Nehalem", measured=False)
    kernels.print_report(r)
    assert "kernel Nehalem: not measured, few-row products are plain x @ w" in capsys.readouterr().out


def test_kernel_environments_are_labelled_by_where_they_come_from(monkeypatch):
    """The notes say which environment ran a kernel: this run's, the CPU's own (variables removed), forced."""
    haswell = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.delenv("OPENBLAS_L2_SIZE", raising=False)
    assert [kernels.source(env) for env in ({"PATH": "/bin"}, haswell)] == ["this run's", "forced"]
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")  # as on CI
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    assert [kernels.source(env) for env in (haswell, {"PATH": "/bin"})] == ["this run's", "CPU's own"]


def test_weight_bytes_per_token_matches_perf_notes():
    # 494.6 MB (124M) and 1415.1 MB (355M) read per token, counted by hand from the checkpoints
    assert round(weight_bytes_per_token(PRESETS["124M"]) / 1e6, 1) == 494.6
    assert round(weight_bytes_per_token(PRESETS["355M"]) / 1e6, 1) == 1415.1


@pytest.mark.parametrize("flags, says", [(["--policy-prompt", "2"], "--policy-prompt must be 0"),
                                         (["--policy-prompt", "-1"], "--policy-prompt must be 0")])
def test_bad_policy_flags_are_one_line_errors(flags, says):
    from bench.__main__ import parse_args, policy_options
    with pytest.raises(SystemExit) as error:
        policy_options(parse_args(["--sections", "policies", *flags]))
    assert says in str(error.value) and "\n" not in str(error.value), error.value


def test_unknown_section_is_an_error():
    with pytest.raises(SystemExit, match="unknown section"):
        selected_sections("decode,nope")
    assert "bandwidth" in selected_sections("decode")  # the roofline needs the bandwidth


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_forced_draft_acceptance(alpha):
    """The benchmark drafter's acceptance rate is alpha by construction (0 and 1 exactly)."""
    target = gpt2np.random_model(PRESETS["tiny"], seed=0)
    draft_shape = gpt2np.random_model(PRESETS["tiny"], seed=1)
    prompt = [1, 2, 3]
    base = run_baseline(target, prompt, 20)
    draft = ForcedAcceptanceDraft(draft_shape, prompt + base["tokens"], alpha, seed=0)
    result = gpt2np.speculative_generate(target, draft, prompt, 20, K=3, temperature=0)
    assert result.tokens == base["tokens"]
    if alpha in (0.0, 1.0):
        assert result.stats.alpha_hat == alpha
    else:
        assert 0.0 < result.stats.alpha_hat < 1.0


def test_hf_section_when_available(tmp_path):
    from bench import hf
    reason = hf.available()
    if reason:
        pytest.skip(reason)
    path = tmp_path / "hf.json"
    done = subprocess.run([sys.executable, "-m", "bench", "--tiny", "--sections", "hf", "--json", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for s in json.loads(path.read_text())["sizes"].values():
        assert positive(s["hf"]["numpy_over_hf"]) and np.isfinite(s["hf"]["hf_verify5_ratio"])
        assert list(s["hf"]["prefill"]) == [str(n) for n in tiny_plan().prefill_lens]  # worker processes
        assert all(positive(p["numpy_over_hf"]) and positive(p["hf_s"]) for p in s["hf"]["prefill"].values())
        assert s["hf"]["prefill_workers"]["hf"]["hf_call"] in ("logits_to_keep", "num_logits_to_keep", "plain")


def test_bundled_pair_measurement_on_random_models():
    """The bundled-pair part of the overhead section, on two random models (the pair may not exist yet)."""
    from bench import overhead
    from gpt2np.model.config import GPT2Config
    target = gpt2np.random_model(GPT2Config(n_vocab=64, n_ctx=64, n_embd=32, n_head=2, n_layer=2), seed=0)
    draft = gpt2np.random_model(PRESETS["tiny"], seed=1)
    r = overhead.measure_bundled(target, draft, tiny_plan(), gemm_gflops=50.0)
    assert set(r["models"]) == {"target", "draft"} and positive(r["models"]["target"]["s_per_call"])
    assert positive(r["plain"]["s_per_token"]) and positive(r["speculative"]["speedup"])
    assert 0 <= r["speculative"]["alpha_hat"] <= 1


def test_cache_check_times_loads_with_and_without_the_crc(capsys):
    """bench/cache_check.py (the cost of the .npy cache's CRC32C check, PERFORMANCE.md) runs."""
    from bench.cache_check import time_cached_loads
    time_cached_loads("tiny", repeats=1)
    out = capsys.readouterr().out
    assert "without the CRC32C check" in out and "the check alone" in out, out


def test_the_bench_speaks_for_itself(bench_run):
    """What `python -m bench` prints (stdout and its --help) names no internal issue number and no
    file outside the repository: a user has neither."""
    import re
    helped = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    for name, text in [("stdout", bench_run[1]), ("--help", helped.stdout)]:
        found = re.findall(r"(?i)\bissues? \d+|perf-notes|\.\./shared", text)
        assert not found, (name, found)


def test_no_tracked_file_points_outside_the_repository():
    """No committed file sends a reader to notes that are not in the repository (perf-notes.md),
    nor to ../shared/docs; test data under ../shared/data is looked for, and skipped without."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    offenders = []
    for name in listed.stdout.split():
        path = REPO / name
        if path.suffix in {".py", ".md", ".toml", ".txt", ".ipynb", ".cfg", ".ini"} and path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            offenders += [f"{name}: {m}" for m in ("perf-notes", "shared/docs", "-format.md in") if m in text and name != "tests/test_bench.py"]
    assert not offenders, offenders


def test_seed_table_prints_the_seed_repositories_columns_and_its_sanity_check(capsys):
    """bench.seed_table on tiny shapes: the table's columns, every run exact, and the target
    drafting for itself never rejected (the repositories' sanity check)."""
    from bench.common import TINY_CONFIGS
    from bench.seed_table import print_seed_table, sanity, seed_table
    target, draft = (gpt2np.random_model(TINY_CONFIGS[name], seed=s) for name, s in (("tiny2", 0), ("tiny", 1)))
    prompt = [1, 2, 3, 4]
    times, rejections, exact = seed_table(target, draft, prompt, N=10, K=3, alpha=0.5, num_runs=3)
    assert exact and len(times["autoregressive"]) == len(times["speculative"]) == len(rejections) == 3
    assert 0 < sum(rejections) <= 3 * 10, rejections  # alpha 0.5: some drafts fail, never more than tokens
    print_seed_table(times, rejections, "tiny")
    out = capsys.readouterr().out
    assert "method                  | num_runs |    time | +/- std | speedup" in out
    assert "autoregressive sampling |        3 |" in out and "speculative sampling    |        3 |" in out
    assert sanity(target, prompt, 10, 3) == 0


def test_policy_sweep_with_several_runs_per_seed_takes_each_seeds_median(capsys):
    """--policy-runs 2: every seed's group runs twice, each between its own baselines, and the seed's
    speedup is the median of its two runs, lying within their range; rounds count both runs."""
    from bench import policies
    plan = tiny_plan(policy_repeats=2, policy_runs=2, policy_alphas=(0.5,), policy_Ks=(1,),
                     policy_drafters=("lookup",))
    target = gpt2np.random_model(plan.config("tiny2"), tokenizer=None)
    sweep = policies.run(target, plan, gpt2np.random_model(plan.config("tiny"), tokenizer=None))
    assert sweep["runs_per_seed"] == 2 and len(sweep["drifts"]) == 2 * 2  # 2 seeds x 2 runs, one alpha
    for row in sweep["rows"]:
        assert row["exact"] and len(row["speedups"]) == 2 and len(row["spreads"]) == 2
        for speedup, (low, high) in zip(row["speedups"], row["spreads"]):
            assert low <= speedup <= high, (row["K"], speedup, low, high)
        assert sum(row["K_counts"].values()) == row["rounds"]
    fixed = next(r for r in sweep["rows"] if r["K"] == 1)
    n_tokens = plan.policy_tokens
    assert fixed["rounds"] >= 2 * 2 * -(-n_tokens // 2), fixed  # K = 1: at least n/2 rounds a run, 4 runs
    policies.print_report(sweep)
    assert "each seed the median of 2 runs" in capsys.readouterr().out


def test_policy_sweep_in_lockstep_measures_every_run_against_plain_decoding_beside_it(capsys):
    """--policy-lockstep: a group's runs and a plain run decode together, a round at a time; every run
    is exact, its speedup is over the plain run of its own group (one drift per group, from that run's
    calls), and the report says so. The scheduler itself: bench.common.lockstep's doctest."""
    from bench import policies
    plan = tiny_plan(policy_repeats=2, policy_lockstep=True, policy_alphas=(0.5, 1.0), policy_Ks=(1, 3),
                     policy_drafters=("model", "lookup"))
    target = gpt2np.random_model(plan.config("tiny2"), tokenizer=None)
    sweep = policies.run(target, plan, gpt2np.random_model(plan.config("tiny"), tokenizer=None))
    assert sweep["lockstep"] and len(sweep["drifts"]) == 2 * 2 and all(d > 0 for d in sweep["drifts"])
    assert len(sweep["rows"]) == 2 * 2 * 4  # drafters x alphas x (K = 1, 3, heuristic, auto)
    for row in sweep["rows"]:
        assert row["exact"] and len(row["speedups"]) == 2 and all(s > 0 for s in row["speedups"]), row
        assert sum(row["K_counts"].values()) == row["rounds"]
    full = next(r for r in sweep["rows"] if r["K"] == 3 and r["alpha_nominal"] == 1.0 and r["drafter"] == "lookup")
    assert full["K_counts"] == {3: 2 * -(-plan.policy_tokens // 4)}, full  # alpha 1: every round K = 3 (the
    policies.print_report(sweep)                                       # last one clamped to what is left)
    out = capsys.readouterr().out
    header = out.split("## K policies")[1].splitlines()[1]
    assert "in lockstep with plain decoding" in out and "replayed" in header and "Bayes" in header, header


def test_policy_sweep_reports_auto_s_reading_of_the_cost_shape_and_can_read_it_before_every_run(capsys, monkeypatch):
    """auto's runs read the target's cost shape (model.row_cost_shape) within their own wall time; the model remembers
    it, so a process's later runs read nothing, unless --policy-fresh-probe clears the record before each auto run.
    The report gives the reading's share of auto's runs' time either way."""
    from bench import policies
    from gpt2np.decoding.policies import PROBE_SHARE
    from gpt2np.model.cost_probe import probe_repeats
    target = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=96, n_embd=16, n_head=2, n_layer=24),
                                 tokenizer=None)  # deep enough for one reading of each size at 60 tokens
    reads, real = [], target.row_cost_shape
    monkeypatch.setattr(target, "row_cost_shape", lambda M_max, passes: reads.append(M_max) or real(M_max, passes))
    for fresh in (False, True):
        target.cost_shapes.clear()
        reads.clear()
        plan = tiny_plan(policy_repeats=2, policy_lockstep=True, policy_alphas=(0.8,), policy_Ks=(2,),
                         policy_drafters=("lookup",), policy_tokens=60, policy_fresh_probe=fresh)
        sweep = policies.run(target, plan, gpt2np.random_model(plan.config("tiny"), tokenizer=None))
        auto = next(r for r in sweep["rows"] if r["K"] == "auto")
        assert auto["exact"] and len(auto["probes"]) == 2 and all(0 < x < 1 for x in auto["probes"]), auto["probes"]
        sizes = plan.policy_K_max + 1
        assert reads == [sizes, sizes] and len(target.cost_shapes) == 1, (fresh, reads, target.cost_shapes.keys())
        want = probe_repeats(24, sizes, PROBE_SHARE * 60)
        assert want >= 1 and [n for n, _ in target.cost_shapes.values()] == [want], (want, target.cost_shapes)
        policies.print_report(sweep)
        out = capsys.readouterr().out
        assert "auto's reading of the target's cost shape" in out and ("fresh-probe" in out) == fresh, out
    monkeypatch.setattr(target, "row_cost_shape", real)
    calls, real_probe = [], gpt2np.model.forward.row_cost_shape
    monkeypatch.setattr(gpt2np.model.forward, "row_cost_shape", lambda *a: calls.append(1) or real_probe(*a))
    for fresh, probes in ((False, 1), (True, 2)):
        target.cost_shapes.clear()
        calls.clear()
        plan = tiny_plan(policy_repeats=2, policy_lockstep=True, policy_alphas=(0.8,), policy_Ks=(2,),
                         policy_drafters=("lookup",), policy_tokens=60, policy_fresh_probe=fresh)
        policies.run(target, plan, gpt2np.random_model(plan.config("tiny"), tokenizer=None))
        assert len(calls) == probes, (fresh, len(calls))


def test_lockstep_advances_the_run_furthest_behind_and_times_each_run_by_its_own_rounds():
    """Three scripted runs on a scripted clock: the order of their rounds, and each run's seconds the
    sum of its own rounds only (a run that finishes early stops being timed)."""
    from bench.common import lockstep
    now, order = [0.0], []

    class Run:
        def __init__(self, name, per_round, cost, n):
            self.name, self.per_round, self.cost, self.n, self.emitted = name, per_round, cost, n, 0

        def step(self):
            order.append(self.name)
            if self.emitted >= self.n:
                return False
            now[0] += self.cost
            self.emitted += self.per_round
            return True

    seconds = lockstep([Run("plain", 1, 1.0, 4), Run("K3", 4, 2.5, 4), Run("K1", 2, 1.5, 4)], clock=lambda: now[0])
    # emitted (plain, K3, K1) before each round: (0,0,0) (1,0,0) (1,4,0) (1,4,2) (2,4,2): a tie, the list's order
    # first; (3,4,2) (3,4,4) (4,4,4): each run's last call ends it, in the list's order
    assert order == ["plain", "K3", "K1", "plain", "plain", "K1", "plain", "plain", "K3", "K1"], order
    assert seconds == [4.0, 2.5, 3.0], seconds


def test_the_docstring_examples_of_the_sides_scheduler_and_the_policy_sweep():
    """bench/ is not collected for doctests (pytest.ini: tests, gpt2np): run common.lockstep's example
    (lockstep against back to back on a drifting clock), policies.per_seed's and run.policy_goals' here."""
    import doctest
    from bench import common, policies, run
    for module in (common, policies, run):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, (module.__name__, result)


def test_the_policy_targets_are_issue_26s_goals():
    """The sweep's targets table: 0.92 for the worst seed at alpha 0.8 in 100 tokens, 0.90 in 40, 0.95
    at alpha 1.0 and where drafting cannot pay, and auto against plain decoding at alpha 0.3 (here its
    worst seed, 0.90, misses although its median over the better side, K = 1, is 0.98)."""
    from bench.run import policy_targets

    def row(alpha, K, speedups):
        return {"drafter": "model", "alpha_nominal": alpha, "K": K, "speedup": sorted(speedups)[1],
                "speedups": speedups, "refined_error": 0.01}
    rows = [row(alpha, K, speedups) for alpha in (0.3, 0.8)
            for K, speedups in (("1", [1.05, 1.06, 1.07]), ("heuristic", [1.0, 1.0, 1.0]), ("auto", [1.04, 0.9, 1.05]))]
    for n_tokens, worst in ((100, ">= 0.92"), (40, ">= 0.9")):
        table = {name: (round(value, 3), goal) for name, value, goal in
                 policy_targets({"n_tokens": n_tokens, "K_max": 8, "Ks": [1], "rows": rows}, ("124M", "1558M"))}
        assert table["124M->1558M a=0.8: the same, worst seed"][1] == worst, table
        assert table["124M->1558M a=0.3: auto / plain decoding, worst seed"] == (0.9, ">= 0.95"), table
        assert table["124M->1558M a=0.3: auto / best of plain and fixed K, median over seeds"] == (0.981, ">= 0.95")


@pytest.mark.parametrize("n_prompt", [0, 18])
def test_policy_sweep_can_run_auto_reading_the_prompt_beside_auto_and_reports_its_reading(capsys, n_prompt):
    """--policy-read adds auto with policies.READ_PROMPT set: it reads the prompt's positions before its first round
    (its target's read counted as the baseline's prefill), a side of its own, exact, reported beside auto, which
    reads nothing (the switch is set only while that side is built). The forced draft agrees at the prompt's
    positions with the target's greedy token at alpha (tests/bench/test_forced_prompt.py): at alpha 1, every one.
    --policy-prompt sets the sweep's prompt: 18 tokens give the read its PROMPT_POSITIONS."""
    from bench import policies
    target = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=96, n_embd=16, n_head=2, n_layer=2),
                                 tokenizer=None)
    plan = tiny_plan(policy_repeats=2, policy_lockstep=True, policy_alphas=(1.0,), policy_Ks=(2,),
                     policy_drafters=("model",), policy_tokens=12 if n_prompt else 20, policy_read=True,
                     policy_prompt_len=n_prompt)  # the tiny draft's context: 32
    sweep = policies.run(target, plan, gpt2np.random_model(plan.config("tiny"), tokenizer=None))
    auto = next(r for r in sweep["rows"] if r["K"] == "auto")
    read = next(r for r in sweep["rows"] if r["K"] == policies.READ)
    assert auto["exact"] and read["exact"] and len(read["speedups"]) == 2
    positions = 16 if n_prompt else plan.spec_prompt_len - 1  # 17 prompt positions, of which PROMPT_POSITIONS read
    assert [(n, b) for n, b, _ in read["prompt_reads"]] == [(positions, 1.0)] * 2, read["prompt_reads"]
    assert all(0 < share < 1 for _, _, share in read["prompt_reads"]) and auto["prompt_reads"] == []
    from gpt2np.decoding.policies import READ_PROMPT
    assert READ_PROMPT is False  # set back
    fixed = next(r for r in sweep["rows"] if r["K"] == 2)
    assert fixed["prompt_reads"] == []  # a fixed K reads nothing
    policies.print_report(sweep)
    out = capsys.readouterr().out
    assert "read/best" in out and f"auto read's reading of the prompt before a run: {positions} positions" in out, out
