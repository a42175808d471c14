"""Generate text with GPT-2 in NumPy, autoregressively and with speculative decoding.

    python main.py                                   # offline: the bundled Shakespeare pair
    python main.py --draft_model_size 124M --target_model_size 355M --prompt "Alan Turing" -v
    python main.py --target_model_size gpt2          # one model, no draft: plain generation
    python main.py --target_model_size 355M --draft_model_size ngram --K auto   # prompt lookup
    python main.py --draft_model_size distilgpt2 --target_model_size gpt2-medium   # from the Hub
    python main.py --target_model_size random:1558M --draft_model_size random:124M   # random weights: GPT-2's
                                                     # encoder.json + vocab.bpe in a folder of --models_dir

With a drafter (a draft model, or "ngram" prompt lookup), main.py runs target-only decoding, then
speculative decoding with the same sampling settings, printing each text as it is generated, then
their speed, the acceptance statistics and the measured against the predicted speedup. Bad input
exits with status 2 and one line on stderr. Other repositories' flags work too (flags.py):

    python main.py --input "The quick brown fox jumps over the lazy " --target_model_name gpt2-xl \
                   --approx_model_name gpt2 -b -p                      # LLMSpeculativeSampling's
    python main.py --target-model gpt2-xl --draft-model gpt2 --num-runs 50 --N 40 --K 4   # speculative-sampling's table

The command: flags.py (its flags and checks), runs.py (loading, timed runs, the text as it
comes), compat.py (-b's lines, the table, --json), profile.py (-p). It only calls the public API.
"""

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/model/fast)
import numpy as np
from threadpoolctl import threadpool_limits

from gpt2np import POLICIES
from gpt2np.report import NO_DRAFTER, format_stats, mean_std, run_command

from .compat import benchmark_lines, rejection_lines, table, write_json
from .flags import LLMSS, check_args, parse_args
from .profile import format_profile, plain_profile, speculative_profile
from .runs import drafts_label, load, run_plain, run_speculative, sampling, speculative_streams


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    gpt2np.make_policy(args.K, args.K_max)  # a bad K policy is refused before anything loads
    target, drafter, prompt_ids = load(args)
    threads = args.threads or (1 if target.config.n_embd < 512 else None)  # small products: 1 is faster
    if threads:
        threadpool_limits(limits=threads, user_api="blas")
    drafts = dict(K=args.K) if args.tree is None else dict(tree=list(args.tree) if args.tree != "auto" else "auto")
    if args.K in POLICIES[1:] or args.tree == "auto":
        drafts["K_max"] = args.K_max  # what bounds them
    blas = gpt2np.blas_kernel()
    header = dict(target=target.name, drafter=drafter.name if drafter else None, prompt_tokens=len(prompt_ids),
                  n_tokens=args.n_tokens_to_generate, **drafts, seed=args.seed, **sampling(args), blas=blas)
    print(header_line(args, target, drafter, prompt_ids))
    if args.style_defaults:  # only those it applied: a default the user overrode is not in force
        print(f"({LLMSS}'s spellings: its defaults apply where not given: "
              + ", ".join(f"{k} {v}" for k, v in args.style_defaults.items()) + ")")
    print(f"BLAS: {blas}")
    plain = run_plain(args, target, prompt_ids)
    spec = run_speculative(args, target, drafter, prompt_ids) if drafter is not None else None
    print()
    if spec is not None and args.table:
        print(f"{table(plain, spec)}\n{rejection_lines(spec)}")
    elif spec is not None:
        print(format_stats(spec.results[-1].stats, measured_speedup=mean_std(plain.seconds)[0] / mean_std(spec.seconds)[0]))
    if args.benchmark:
        print("\n" + benchmark_lines([plain] + ([spec] if spec else [])))
    if args.profiling:
        print_profiles(args, target, drafter, prompt_ids)
    if args.json:
        write_json(args.json, header, plain, spec)


def header_line(args, target, drafter, prompt_ids):
    """What runs, on what: the models, the prompt (an empty one is GPT-2's <|endoftext|>) and the sampling."""
    if drafter is not None:
        drafting = drafter.name
    else:
        drafting = "none (target-only decoding; no speculative run)" if args.draft_model_size == NO_DRAFTER else "none"
    prompt = ("empty, conditioned on <|endoftext|>" if not args.prompt else
              f"{len(prompt_ids)} token{'s' * (len(prompt_ids) != 1)}")
    off = lambda value: "off" if value is None else value  # noqa: E731  (None: every token kept)
    return (f"target: {target.name}, drafter: {drafting}, prompt: {prompt}, temperature {args.temperature}, "
            f"top_k {off(args.top_k)}, top_p {off(args.top_p)}, seed {args.seed}")


def print_profiles(args, target, drafter, prompt_ids):
    """-p: one more run of each decoder, and where its time went (profile.py)."""
    def plain(model):
        return gpt2np.plain_stream(model, prompt_ids, args.n_tokens_to_generate,
                                   rng=np.random.default_rng(args.seed), **sampling(args))

    print("\n=== profile: one more run of each decoder ===\n"
          + format_profile(f"autoregressive ({target.name})", *plain_profile(target, plain)))
    if drafter is not None:
        stream = speculative_streams(args, target, drafter, prompt_ids, calibrate=False)(args.n_tokens_to_generate)
        title = f"speculative (drafter {drafter.name}, {drafts_label(args, fixed_K='K {}')})"
        print(format_profile(title, *speculative_profile(stream)))


def run():
    """main() as a command (report.run_command): Ctrl-C, a closed pipe and bad input end it with a
    status and at most one line, never a traceback."""
    run_command(main)
