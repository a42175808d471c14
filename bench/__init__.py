"""gpt2np's benchmark suite: speed against the machine's own limits.

    python -m bench                                  # 124M and 355M, every section but batching and trees
                                                     # (< 10 min; name those two in --sections)
    python -m bench --large                          # adds 774M and 1558M
    python -m bench --sections decode,verify --sizes 355M --json bench/results/after.json \\
                    --compare bench/results/before.json   # one section, before/after
    python -m bench --tiny                           # seconds, tiny configs: the test suite's run
    python -m bench --sections policies --sizes 1558M --pair 124M,1558M --policy-repeats 5 \
                    --policy-Ks 2,4,6 --policy-alphas 0.3,0.8   # K policies, gpt2 drafting for gpt2-xl
    python -m bench --sections batching --batch-pairs '124M,355M;124M,1558M'   # batch size x alpha, with and
                                                     # without drafting: where drafting stops paying (~35 min)
    python -m bench --sections trees                 # chains, fixed token trees and tree="auto" at 124M -> 1558M,
                                                     # forced acceptance by depth and rank, predicted beside measured

No downloads: every model is gpt2np.random_model of a preset's shape, unless --sizes / --pair name a
model as main.py does (a folder in either layout, hf:owner/name), which is loaded with its own weights.
One file per section:
  bandwidth.py    memory bandwidth (best of a streaming sum, gemv, a one-row product), GEMM
                  GFLOP/s, and the product-level small-M curve; roofline = weight bytes / bandwidth
  decode.py       prefill at 128, 512 and 1000 tokens, decode s/token at contexts 128, 512 and 896,
                  and the verification curve t(M) / t(1) for M = 1..9 new tokens at contexts 128 and 896
  spec.py         speculative decoding with draft = target and with a forced-acceptance drafter
                  (forced_draft.py) at 124M -> 355M shapes, measured vs Thm 3.8 and its refinement;
                  the forced runs again after an 896-token prompt (do the speedups hold?)
  policies.py     section "policies": K policies (fixed Ks vs heuristic vs auto) at forced alpha with
                  the pair's draft and with a drafter of prompt lookup's cost, and the target drafting
                  for itself (--policy-drafters self), over --policy-repeats coin seeds (median and
                  worst seed; --policy-runs runs per seed, their median), each group of runs in lockstep
                  with plain decoding (--no-policy-lockstep: between two plain baselines); with "speculative":
                  the real n-gram drafter on the bundled pair
  batching.py     section "batching", only when named (not in "all"): tokens/s of a batch of B sequences
                  (--batch-sizes) at forced alpha (--batch-alphas), per --batch-pairs DRAFT,TARGET pair:
                  plain batched decoding, fixed Ks (--batch-Ks) and K="auto", sides alternated in one
                  process, in lockstep (--no-batch-lockstep: back to back); where drafting stops paying,
                  and auto against the better of the two
                  (batching_report.py: the numbers and tables; forced_batch_draft.py: the drafter,
                  one packed pass of the real draft per draft step, each sequence's proposals forced)
  trees.py        section "trees", only when named (not in "all"): per --tree-alphas alpha, plain decoding,
                  chains, fixed trees and tree="auto" (--tree-shapes) on random --tree-pair models, greedy,
                  a repeat's sides in lockstep (--no-tree-lockstep: back to back, alternated); measured tokens per target call and tokens/s beside tree_shape's
                  prediction (this run's c and v(M)), each against the best chain (trees_report.py: rates,
                  predictions, tables; forced_tree_draft.py: the drafter, the real draft's call per tree
                  level, children forced so that acceptance by depth and rank follows rates measured on
                  real pairs: python -m bench.trees prints them, then the bundled pair's bound: every
                  shape priced on the bundled target's own c and v(M) at those rates, o = 0)
  baseline.py     the slow reference path (no cache) vs the fast path, 64 tokens after 128 at 124M
  overhead.py     Python overhead per forward call and per token (bundled tiny pair if present)
  memory.py       peak RSS and load time of 124M + 355M in a fresh process, from a checkpoint
  kernels.py      per OpenBLAS kernel this CPU runs (its own, Haswell where it has AVX2, the one
                  OPENBLAS_CORETYPE sets), each in a worker process (kernel_worker.py) at
                  --kernel-sizes (355M): the verification curve for M = 1..16 at context 128 with
                  gpt2np's methods and with plain x @ w, decode vs its roofline; ~40 s a kernel
  hf.py           optional: Hugging Face transformers on PyTorch CPU, paired (if both import): decode
                  and M = 5 in this process, and prefill at every prefill length through
  prefill_pair.py   two worker processes (prefill_worker.py: gpt2np, HF) that take turns, order
                    swapped every round, each limited to --threads BLAS threads
  compare.py      headline numbers of two JSON files side by side (python -m bench.compare A B)
  cache_check.py  alone: the .npy cache's CRC32C check, cached loads with and without it
                  (python -m bench.cache_check [--size 355M])
run.py runs the sections and writes the JSON; common.py holds the Plan, timing and tables.

The JSON (default bench/results/bench.json, git-ignored, its folder made if missing; --json's folder is
checked before the run, the file written whole after it: a temporary file beside it, renamed), seconds and
bytes throughout:
  meta        plan, sections, BLAS (threadpoolctl), threads, OPENBLAS_* env, load averages, notes
  bandwidth   methods.{sum,gemv,row_matmul}.best_gbps, best_gbps, gemm.gflops, small_m.ratio["1".."9"] (x @ w),
              small_m.pieces.ratio["1".."9"] (gpt2np.model.fast.matmul, column-major weights)
  sizes[size] weight_bytes_per_token, bandwidth_gbps, roofline_s_per_token,
              prefill["128"|"512"|"1000"].{n_tokens, seconds, seconds_min, tokens_per_s, gflops},
              decode["128"|"512"|"896"].{s_per_token, roofline_s, vs_roofline, vs_roofline_paired},
              verify["128"|"896"].{context, seconds["1".."9"], ratio["1".."9"]},
              hf (or hf.skipped): {context, numpy_decode_s, hf_decode_s, numpy_over_hf, *_verify5_ratio,
                prefill["128"|"512"|"1000"].{n_tokens, numpy_s, hf_s, numpy_s_min, hf_s_min,
                numpy_over_hf, rounds}, prefill_workers.{numpy, hf} (what each ran: hf_call =
                logits_to_keep | num_logits_to_keep | plain, threads, versions) or prefill_workers.skipped},
              speculative.self, speculative.forced.runs[] and speculative.forced_long.runs[] (the
              forced runs after spec_long_prompt = 896 tokens; or forced_long.skipped): {prompt_len,
              alpha_nominal, alpha_hat, c, v, speedup, speedup_end_to_end, predicted_thm38,
              predicted_refined, refined_error, ...},
              policies.rows[]: {drafter (model|lookup), alpha_nominal, K (1..8|heuristic|auto|auto read),
              speedup, predicted_refined, refined_error, alpha_hat, c, rounds and K_counts (summed over repeats),
              exact, speedups (one per coin seed), probes (the cost shape's reading's share of each run),
              prompt_reads ([positions, mean beta, share of the run's time] of each run that read the prompt),
              replays (per seed: the chain simulator on the runs' coins and their group's costs; not for self),
              on auto's rows replay_costs ({v, c, shape} each seed's replay charged) and bayes_replays (per seed:
              the Bayes-optimal policy, told c, v and the length, replayed on the same coins and costs)},
              Ks (the fixed Ks), blas_kernel (gpt2np.blas_kernel(), named in the table's title)
  bundled_lookup  rows[] of the same shape: prompt lookup vs the bundled draft model, real alpha
  reference   reference_seconds, fast_seconds, speedup_vs_reference, extrapolated
  overhead    per_call.{fixed_s, per_layer_s, estimated_s_per_call[size]}, handoff.{latency_s[gap],
              products_per_forward[size], estimated_fraction_of_decode[size]}, bundled (or bundled.skipped)
  memory      weight_bytes, kv_cache_bytes, {first_load, cached_load}.{load_seconds, peak_rss, peak_over_weights}
  kernels     context, max_m, rounds, kernels[]: {name (threadpoolctl's), source (this run's | CPU's own |
              forced: Haswell), env (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE), blas_kernel (gpt2np.blas_kernel()),
              measured (in gpt2np.model.fast.matmul.METHODS)}, sizes[size][]: per kernel {name, methods["1".."16"],
              methods_row_major["1".."16"], ratio["1".."16"] (gpt2np), ratio_row_major["1".."16"] (gpt2np on
              row-major weights: gpt2np.model.fast.layout), ratio_panels["1".."16"] (gpt2np on weights in
              panels; null where n_embd does not cut into them), one_token_panels_s, ratio_plain["1".."16"],
              ratio_plain_row_major["1".."16"] (plain on row-major weights), one_token_row_major_s,
              one_token_s, decode_s, roofline_s, vs_roofline, vs_roofline_paired, bandwidth_gbps (gemv),
              runs[] (each worker's own JSON)}
  batching    plan, blas_kernel, seconds, pairs[]: {draft, target, weights_order (gpt2np.order_for_batches:
              column-major | row-major | panels), stops_paying{alpha: B or null (pays at
              every B)}, crossover[] (the printed sentences), cells[]: {B, alpha, best (plain | K=k),
              best_tokens_per_s, drafting_pays, best_over_plain, drafting_over_plain (the best fixed K / plain,
              paired, as the switched-off line prints it), auto_over_best, auto_over_best_runs (its
              per-repeat ratios, the table's range), auto_over_plain, alpha_hat,
              exact, mismatched, sides{plain, K=k, auto}: {tokens_per_s, runs_tokens_per_s, seconds,
              K_counts, accepted, examined, alpha_hat, exact, mismatch}}}, targets[] (as below)
  trees       plan, draft, target, profile, profile_source, ratios (a_r / a_0), costs{t1, c, v{M}}, seconds,
              cells[]: {alpha, rates[[a_r]], best_chain, best_chain_predicted, exact, mismatched, rows[]: {side
              (plain | K=k | (w,..) | auto), shape, tokens_per_s, runs_tokens_per_s, tokens_per_call, speedup
              (x plain), over_best_chain, predicted_tokens_per_call, predicted_speedup,
              predicted_over_best_chain, shapes_used, by_rank, exact, mismatch}}, targets[] (as below)
  targets     [{target, measured, goal, met}]: the project's speed targets wherever this run measured them
              (among them prefill@512 numpy / HF at 124M and 355M, decode@896 / roofline and
              forward M=5 / M=1 at context 896 at 355M, auto K against the best fixed K)
Median of `--repeats` timed runs after a warm-up everywhere; ratios are paired run by run.
Older files kept prefill as one dict (128 tokens) and verify as one curve (context 128):
compare.py reads both shapes.
"""
import gpt2np  # noqa: F401,E402  before NumPy loads OpenBLAS: sets its thread timeout (gpt2np/__init__.py)

SECTIONS = ("bandwidth", "prefill", "decode", "verify", "speculative", "policies", "reference", "overhead", "memory",
            "kernels", "hf", "batching", "trees")  # "all" leaves out batching and trees (__main__.LONG_SECTIONS)
