"""Generate text with GPT-2 in NumPy, autoregressively and with speculative decoding.

    python main.py                                   # offline: the bundled Shakespeare pair
    python main.py --draft_model_size 124M --target_model_size 355M --prompt "Alan Turing" -v
    python main.py --target_model_size 124M          # one model, no draft: plain generation

With a draft model, main.py runs target-only decoding, then speculative decoding with the same
sampling settings, and prints both texts, their speed, the acceptance statistics and the measured
against the predicted speedup. Bad input exits with status 2 and one line on stderr.
"""
import argparse
import os
import sys
import time

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/__init__.py)
import numpy as np
from threadpoolctl import threadpool_limits

from gpt2np.autoregressive import check_generation_request
from gpt2np.download import DownloadError
from gpt2np.report import OneLineErrorParser, colour_by_provenance, format_stats, mean_std
from gpt2np.speculative import check_same_vocabulary

DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"  # gpt2np/bundled/
DEFAULT_PROMPT = "ROMEO:\nWhat light through yonder window breaks?"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # "(default: None)" says nothing: those helps say it in words
        return action.help if action.default is None else super()._get_help_string(action)


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    p = OneLineErrorParser(prog="python main.py", description=__doc__.split("\n")[0],
                      formatter_class=HelpFormatter)
    bundled = ", ".join(gpt2np.bundled_models()) or "none"
    # what to generate
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to continue")
    p.add_argument("--n_tokens_to_generate", type=int, default=None,
                   help="new tokens, exactly this many unless <|endoftext|> comes first "
                        "(default: 200 with the bundled byte-level pair, 40 otherwise)")
    # which models
    p.add_argument("--target_model_size", default=None,
                   help=f"target model: 124M, 355M, 774M, 1558M, a bundled name ({bundled}) or a "
                        f"folder in the release layout (default: {DEFAULT_TARGET})")
    p.add_argument("--draft_model_size", default=None,
                   help="draft model, named like the target; omit for target-only generation "
                        f"(default with the default target: {DEFAULT_DRAFT})")
    p.add_argument("--models_dir", default="weights", help="where OpenAI's release sizes are downloaded to")
    p.add_argument("--mirror", default=None,
                   help="base URL of a mirror of OpenAI's release (default: $GPT2NP_MIRROR, else OpenAI's own)")
    # speculative decoding and sampling
    p.add_argument("--K", type=int, default=4, help="draft tokens per speculative round (Leviathan et al.'s gamma)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 means greedy (argmax)")
    p.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens (Hugging Face meaning; default: all)")
    p.add_argument("--top_p", type=float, default=None,
                   help="nucleus sampling: keep the smallest set of most likely tokens with probability >= top_p (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the np.random.Generator used for sampling")
    # measurement and output
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads (default: 1 for models narrower than n_embd 512, where waking threads "
                        "costs more than it saves, as measured on the bundled pair; else the BLAS default)")
    p.add_argument("--num_runs", type=int, default=1,
                   help="with N > 1: one warm-up, then N timed runs of each decoder, reported as mean ± std")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="colour every speculative token by where it came from "
                        "(accepted draft / target resample / target bonus)")
    return p.parse_args(argv)


def check_args(args):
    if args.n_tokens_to_generate is None:
        args.n_tokens_to_generate = 200 if args.target_model_size is None else 40
    if args.n_tokens_to_generate <= 0:
        raise ValueError(f"--n_tokens_to_generate must be positive, got {args.n_tokens_to_generate}")
    if args.K < 1:
        raise ValueError(f"--K must be at least 1, got {args.K}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.num_runs < 1:
        raise ValueError(f"--num_runs must be at least 1, got {args.num_runs}")
    if args.seed < 0:  # np.random.default_rng refuses it too, but only after the models are loaded
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    for flag in ("target_model_size", "draft_model_size"):
        if getattr(args, flag) is not None and not getattr(args, flag).strip():  # "" is not the default
            raise ValueError(f"--{flag} is empty: name a model (a size, a bundled name or a folder), "
                             f"or leave the flag out")
    gpt2np.check_sampling_options(args.temperature, args.top_k, args.top_p)


def timed_runs(fn, num_runs, untimed=lambda result: 0.0):
    """Run fn once (or, for num_runs > 1, one warm-up then num_runs times); return last result and seconds.

    untimed(result): seconds inside fn that are measurement, not decoding, and are subtracted.
    """
    if num_runs > 1:
        fn()
    seconds, result = [], None
    for _ in range(num_runs):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start - untimed(result))
    return result, seconds


def print_run(header, text, n_tokens, seconds):
    mean, std = mean_std(seconds)
    spread = f" ± {std:.3f}" if len(seconds) > 1 else ""
    print(f"\n=== {header} ===")
    print(f"time: {mean:.3f}{spread} s for {n_tokens} tokens ({n_tokens / mean:.1f} tokens/s)")
    print(text)


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    target_name = args.target_model_size or DEFAULT_TARGET
    draft_name = args.draft_model_size or (DEFAULT_DRAFT if args.target_model_size is None else None)
    target = gpt2np.load_model(target_name, args.models_dir, base_url=args.mirror)
    draft = gpt2np.load_model(draft_name, args.models_dir, base_url=args.mirror) if draft_name else None
    # an empty prompt means unconditional sampling, which GPT-2 starts from <|endoftext|>
    prompt_ids = target.tokenizer.encode(args.prompt) or [target.eot_id]
    if draft is not None:  # every check before any work
        check_same_vocabulary(target, draft)
    for model in (target, draft) if draft else (target,):
        check_generation_request(model, prompt_ids, args.n_tokens_to_generate)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    threads = args.threads or (1 if target.config.n_embd < 512 else None)  # small products: 1 is faster
    if threads:
        threadpool_limits(limits=threads, user_api="blas")
    print(f"target: {target.name}, draft: {draft.name if draft else 'none'}, prompt: {len(prompt_ids)} tokens, "
          f"temperature {args.temperature}, top_k {args.top_k}, top_p {args.top_p}, seed {args.seed}")

    def run_target():
        rng = np.random.default_rng(args.seed)
        return gpt2np.generate(target, prompt_ids, args.n_tokens_to_generate, rng=rng, **sampling)

    tokens, ar_seconds = timed_runs(run_target, args.num_runs)
    print_run(f"autoregressive ({target.name})", args.prompt + target.tokenizer.decode(tokens), len(tokens), ar_seconds)
    if draft is None:
        return

    def run_speculative():
        rng = np.random.default_rng(args.seed)
        return gpt2np.speculative_generate(target, draft, prompt_ids, args.n_tokens_to_generate, args.K, rng=rng, **sampling)

    # the one-token target calls that calibrate c and v (when the run made too few) are not decoding
    result, sd_seconds = timed_runs(run_speculative, args.num_runs, lambda r: r.stats.calibration_seconds)
    colour = args.verbose and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    text = colour_by_provenance(target.tokenizer, result.tokens, result.provenance, colour) if args.verbose \
        else target.tokenizer.decode(result.tokens)
    print_run(f"speculative (draft {draft.name}, K={args.K})", args.prompt + text, len(result.tokens), sd_seconds)
    print()
    print(format_stats(result.stats, measured_speedup=mean_std(ar_seconds)[0] / mean_std(sd_seconds)[0]))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # e.g. `python main.py | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (ValueError, OSError, DownloadError) as e:  # bad input, missing or corrupt files, HTTP
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
