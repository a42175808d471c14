"""Generate text with GPT-2 in NumPy, autoregressively and with speculative decoding.

    python main.py                                   # offline: the bundled Shakespeare pair
    python main.py --draft_model_size 124M --target_model_size 355M --prompt "Alan Turing" -v
    python main.py --target_model_size 124M          # one model, no draft: plain generation
    python main.py --target_model_size 355M --draft_model_size ngram --K auto   # prompt lookup
    python main.py --draft_model_size hf:distilbert/distilgpt2 --target_model_size 355M   # from the Hub

With a drafter (a draft model, or "ngram" prompt lookup), main.py runs target-only decoding, then
speculative decoding with the same sampling settings, printing each text as it is generated, then
their speed, the acceptance statistics and the measured against the predicted speedup. Bad input
exits with status 2 and one line on stderr.
"""
import argparse
import os
import sys
import time

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/model/fast)
import numpy as np
from threadpoolctl import threadpool_limits

from gpt2np import POLICIES, DownloadError, check_generation_request
from gpt2np.report import (OneLineErrorParser, TokenTexts, coloured, format_stats, mean_std,
                           provenance_legend)

DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"  # gpt2np/bundled/
DEFAULT_PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
WARMUP_TOKENS = 16  # a short untimed run first: the first calls of each size pay one-time costs
                    # (helper threads, BLAS buffers, cold pages) that are not decoding


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # "(default: None)" says nothing: those helps say it in words
        return action.help if action.default is None else super()._get_help_string(action)


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    p = OneLineErrorParser(prog="python main.py", description=__doc__.split("\n")[0],
                           formatter_class=HelpFormatter)
    model_flags(p)
    decoding_flags(p)
    output_flags(p)
    return p.parse_args(argv)


def model_flags(p):
    """What to generate from, and with which models."""
    bundled = ", ".join(gpt2np.bundled_models()) or "none"
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to continue")
    p.add_argument("--n_tokens_to_generate", type=int, default=None,
                   help="new tokens, exactly this many unless <|endoftext|> comes first "
                        "(default: 200 with the bundled byte-level pair, 40 otherwise)")
    p.add_argument("--target_model_size", default=None,
                   help=f"target model: 124M, 355M, 774M, 1558M, a bundled name ({bundled}), a Hub name "
                        f"hf:owner/name[@revision], or a folder in the release or Hugging Face layout "
                        f"(default: {DEFAULT_TARGET})")
    p.add_argument("--draft_model_size", default=None,
                   help="drafter: a draft model named like the target, or 'ngram' (prompt lookup: propose "
                        "what followed the last n tokens' latest earlier occurrence, no model); omit for "
                        f"target-only generation (default with the default target: {DEFAULT_DRAFT})")
    p.add_argument("--ngram_max", type=int, default=None,
                   help="with --draft_model_size ngram: the longest n-gram looked up, then shorter ones down to 1 "
                        "(default: 3)")
    p.add_argument("--models_dir", default="weights",
                   help="where OpenAI's release sizes (<dir>/<size>/) and Hub models (<dir>/<owner>/<name>/) "
                        "are downloaded to")
    p.add_argument("--mirror", default=None,
                   help="base URL of a mirror of OpenAI's release (default: $GPT2NP_MIRROR, else OpenAI's own)")
    p.add_argument("--hf_endpoint", default=None,
                   help="Hugging Face Hub endpoint for hf: names (default: $HF_ENDPOINT, else "
                        "https://huggingface.co; $HF_TOKEN, if set, is sent as a bearer token)")


def decoding_flags(p):
    """Speculative decoding and sampling."""
    p.add_argument("--K", type=K_value, default=None,
                   help="draft tokens per speculative round (Leviathan et al.'s gamma), or a K policy: 'heuristic' "
                        "(Hugging Face's: +2 after a fully accepted round, -1 otherwise) or 'auto' (each round, the K "
                        "with the best predicted speedup from this run's measured alpha, c and v; 0 = plain step) "
                        "(default: 4)")
    p.add_argument("--K_max", type=int, default=None,
                   help="the largest K the heuristic and auto policies may use (default: 8)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 means greedy (argmax)")
    p.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens (Hugging Face meaning; default: all)")
    p.add_argument("--top_p", type=float, default=None,
                   help="nucleus sampling: keep the smallest set of most likely tokens with probability >= top_p (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the np.random.Generator used for sampling")


def output_flags(p):
    """Measurement and output."""
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads (default: 1 for models narrower than n_embd 512, where waking threads "
                        "costs more than it saves, as measured on the bundled pair; else the BLAS default)")
    p.add_argument("--num_runs", type=int, default=1,
                   help=f"timed runs of each decoder, after an untimed warm-up ({WARMUP_TOKENS} tokens; with N > 1 a "
                        "whole run); with N > 1 reported as mean ± std")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="colour every speculative token by where it came from "
                        "(accepted draft / target resample / target bonus)")


def K_value(text):
    """--K: an integer, or the name of a K policy (make_policy checks the range)."""
    if text in POLICIES[1:]:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid K {text!r}: an integer >= 1, 'heuristic' or 'auto'") from None


def check_drafting_args(args):
    """--K, --K_max, --ngram_max: their ranges, and only where they mean something; then defaults."""
    drafting = args.draft_model_size is not None or args.target_model_size is None  # default: the bundled pair
    if not drafting and args.K is not None:
        raise ValueError("--K needs a drafter: add --draft_model_size (a model name, or ngram)")
    if args.ngram_max is not None and args.draft_model_size != "ngram":
        raise ValueError("--ngram_max applies to --draft_model_size ngram only")
    if args.K_max is not None and args.K not in POLICIES[1:]:
        raise ValueError("--K_max bounds --K heuristic or --K auto only (a fixed --K is its own bound)")
    for flag, value in (("K", args.K), ("K_max", args.K_max), ("ngram_max", args.ngram_max)):
        if isinstance(value, int) and value < 1:
            raise ValueError(f"--{flag} must be at least 1{' (or heuristic / auto)' if flag == 'K' else ''}, got {value}")
    args.K, args.K_max, args.ngram_max = args.K or 4, args.K_max or 8, args.ngram_max or 3


def check_args(args):
    if args.n_tokens_to_generate is None:
        args.n_tokens_to_generate = 200 if args.target_model_size is None else 40
    if args.n_tokens_to_generate <= 0:
        raise ValueError(f"--n_tokens_to_generate must be positive, got {args.n_tokens_to_generate}")
    check_drafting_args(args)
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


def timed_runs(make_stream, n_tokens, num_runs, show, untimed=lambda result: 0.0):
    """One short untimed warm-up (num_runs > 1: a whole one), then num_runs timed runs of a stream.

    make_stream(n_tokens) starts a stream; show(stream) consumes it while printing its tokens as
    they come, for the last run (with num_runs > 1 the earlier runs are not printed). Returns the
    last stream and the seconds of each run, less untimed(result): seconds of measurement, not of
    decoding.
    """
    make_stream(n_tokens if num_runs > 1 else min(n_tokens, WARMUP_TOKENS)).run()
    seconds, stream = [], None
    for i in range(num_runs):
        stream = make_stream(n_tokens)
        start = time.perf_counter()
        show(stream) if i == num_runs - 1 else stream.run()
        seconds.append(time.perf_counter() - start - untimed(stream.result))
    return stream, seconds


def printer(tokenizer, prompt, colour):
    """show() for timed_runs: the prompt, then each round's tokens as the stream yields them."""
    def show(stream):
        texts = TokenTexts(tokenizer)
        sys.stdout.write(prompt)
        for event in stream:
            sys.stdout.write(coloured(texts.pieces(event.tokens), event.provenance, colour))
            sys.stdout.flush()
        sys.stdout.write(texts.flush() + "\n")
    return show


def print_time(n_tokens, seconds):
    mean, std = mean_std(seconds)
    spread = f" ± {std:.3f}" if len(seconds) > 1 else ""
    print(f"time: {mean:.3f}{spread} s for {n_tokens} tokens ({n_tokens / mean:.1f} tokens/s)")


def load_drafter(args, sources):
    """The drafter named by --draft_model_size (None: target-only), checked against the target."""
    draft_name = args.draft_model_size or (DEFAULT_DRAFT if args.target_model_size is None else None)
    if draft_name is None:
        return None
    return gpt2np.load_drafter(draft_name, args.models_dir, n_max=args.ngram_max, **sources)


def main(argv=None):
    args = parse_args(argv)
    check_args(args)
    gpt2np.make_policy(args.K, args.K_max)  # a bad K policy is refused before anything loads
    target, drafter, prompt_ids = load(args)
    threads = args.threads or (1 if target.config.n_embd < 512 else None)  # small products: 1 is faster
    if threads:
        threadpool_limits(limits=threads, user_api="blas")
    print(f"target: {target.name}, drafter: {drafter.name if drafter else 'none'}, prompt: {len(prompt_ids)} "
          f"tokens, temperature {args.temperature}, top_k {args.top_k}, top_p {args.top_p}, seed {args.seed}")
    print(f"BLAS: {gpt2np.blas_kernel()}")
    ar_seconds = run_plain(args, target, prompt_ids)
    if drafter is not None:
        run_speculative(args, target, drafter, prompt_ids, ar_seconds)


def load(args):
    """(target, drafter or None, prompt ids), every check made before any generation."""
    sources = dict(base_url=args.mirror, hf_endpoint=args.hf_endpoint)
    target = gpt2np.load_model(args.target_model_size or DEFAULT_TARGET, args.models_dir, **sources)
    drafter = load_drafter(args, sources)
    # an empty prompt means unconditional sampling, which GPT-2 starts from <|endoftext|>
    prompt_ids = target.tokenizer.encode(args.prompt) or [target.eot_id]
    check_generation_request(target, prompt_ids, args.n_tokens_to_generate)
    if drafter is not None:
        drafter.check(target, prompt_ids, args.n_tokens_to_generate)
    return target, drafter, prompt_ids


def sampling(args):
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def run_plain(args, target, prompt_ids):
    """Target-only decoding, printed as it goes; returns the seconds of each timed run."""
    def plain(n_tokens):
        return gpt2np.plain_stream(target, prompt_ids, n_tokens, rng=np.random.default_rng(args.seed), **sampling(args))

    print(f"\n=== autoregressive ({target.name}) ===")
    stream, seconds = timed_runs(plain, args.n_tokens_to_generate, args.num_runs,
                                 printer(target.tokenizer, args.prompt, False))
    print_time(len(stream.tokens), seconds)
    return seconds


def run_speculative(args, target, drafter, prompt_ids, ar_seconds):
    """Speculative decoding, printed as it goes, then its statistics beside the plain run's time."""
    def speculative(n_tokens):
        return gpt2np.speculative_stream(target, drafter, prompt_ids, n_tokens, args.K, args.K_max,
                                         rng=np.random.default_rng(args.seed), calibrate=True,  # c, v are printed
                                         **sampling(args))

    K = f"K={args.K}" if isinstance(args.K, int) else f"K {args.K} <= {args.K_max}"
    print(f"\n=== speculative (drafter {drafter.name}, {K}) ===")
    colour = args.verbose and sys.stdout.isatty() and "NO_COLOR" not in os.environ
    show = printer(target.tokenizer, args.prompt, colour)
    # the one-token target calls that calibrate c and v (when the run made too few) are not decoding
    stream, sd_seconds = timed_runs(speculative, args.n_tokens_to_generate, args.num_runs, show,
                                    lambda r: r.stats.calibration_seconds)
    if args.verbose:
        print(provenance_legend(stream.provenance, colour))
    print_time(len(stream.tokens), sd_seconds)
    print()
    print(format_stats(stream.result.stats, measured_speedup=mean_std(ar_seconds)[0] / mean_std(sd_seconds)[0]))


def run():
    """main() as a command: Ctrl-C, a closed pipe and bad input end it with a status, not a traceback."""
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # e.g. `python main.py | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (ValueError, OSError, DownloadError) as e:  # bad input, missing or corrupt files, HTTP
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
