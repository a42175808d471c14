"""main.py's flags: gpt2np's own, the spellings of two other repositories, and their checks.

Two speculative-decoding repositories taught many users their flags; main.py accepts those
spellings as aliases of its own (`--help` lists them under "compatible spellings"):
  * LLMSpeculativeSampling: --input, --target_model_name, --approx_model_name, -M/--max_tokens,
    -g/--gamma, -s. With its spellings its defaults apply too: it always samples, at temperature 1
    with top_k 20 and top_p 0.9, 20 tokens (LLMSS_DEFAULTS). Its modes -b/--benchmark and
    -p/--profiling work with any flags;
  * speculative-sampling (GPT-2): --target-model, --draft-model, --input-str, --num-runs, --N,
    --top-k, --top-p. With its spellings main.py prints that repository's table (compat.py).
An error names the flag as the user spelled it (args.spelled). One option given two values under two
of its names (--gamma 3 --K 4, --input hi --prompt ho) is refused, not settled by the last one
(args.given), as the server refuses gamma and K that disagree.
"""
import argparse
import math

import gpt2np
from gpt2np import K_MAX_LIMIT, POLICIES
from gpt2np.report import (TREE_MAX_NODES, TREE_MAX_WIDTH, DefaultsHelpFormatter, K_from_text, OneLineErrorParser,
                           add_loading_flags, check_drafts_given, check_json_path,
                           check_model_names, check_tree_drafter, check_typed_tree, chosen_drafter,
                           default_n_tokens, seed_error, tree_from_text)

DESCRIPTION = "Generate text with GPT-2 in NumPy, autoregressively and with speculative decoding."
DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"  # gpt2np/bundled/
DEFAULT_PROMPT = "ROMEO:\nWhat light through yonder window breaks?"
WARMUP_TOKENS = 16  # a short untimed run first: the first calls of each size pay one-time costs
                    # (helper threads, BLAS buffers, cold pages) that are not decoding
LLMSS, SS = "LLMSpeculativeSampling", "speculative-sampling"
LLMSS_DEFAULTS = dict(n_tokens_to_generate=20, temperature=1.0, top_k=20, top_p=0.9)  # its generate()
METAVARS = dict(prompt="TEXT", target_model_size="NAME", draft_model_size="NAME", n_tokens_to_generate="N",
                K="K", seed="N", num_runs="N", top_k="K", top_p="P")
BENCHMARK_RUNS = 10  # -b without --num_runs: LLMSpeculativeSampling's benchmark runs each decoder 10 times


class Given(argparse.Action):
    """A flag that has other names too (compatible_spellings): stores its value, and notes under which
    name it came (args.given: dest -> {flag: (as typed, value)}), so that two names of one option are
    caught when they disagree (check_one_name_each). One name typed twice is argparse's usual: the last counts."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given.setdefault(self.dest, {})[self.option_strings[0]] = (option_string, values)


class Spelling(Given):
    """Another repository's spelling of one of main.py's flags: stores into that flag's dest and
    notes its style (args.styles) and spelling (args.spelled, for error messages)."""

    def __init__(self, option_strings, dest, style=None, **kwargs):
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)
        self.style = style

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, True if self.nargs == 0 else values, option_string)
        if self.style:
            namespace.styles.setdefault(self.style, []).append(option_string)
        namespace.spelled[self.dest] = option_string


def parse_args(argv):
    p = OneLineErrorParser(prog="python main.py", description=DESCRIPTION, formatter_class=DefaultsHelpFormatter)
    model_flags(p)
    decoding_flags(p)
    output_flags(p)
    compatible_spellings(p.add_argument_group(
        "compatible spellings", f"the flags of {LLMSS} and of {SS} (GPT-2), as aliases of the flags above"))
    return p.parse_args(argv, argparse.Namespace(styles={}, spelled={}, given={}))  # styles: style -> its flags used


def model_flags(p):
    """What to generate from, and with which models."""
    bundled = ", ".join(gpt2np.bundled_models()) or "none"
    p.add_argument("--prompt", action=Given, default=DEFAULT_PROMPT, help="text to continue")
    p.add_argument("--n_tokens_to_generate", type=int, action=Given, default=None,
                   help="new tokens, exactly this many unless <|endoftext|> comes first "
                        f"(default: 200 when the target is a bundled model ({bundled}), named or not; 40 for "
                        f"any other target; 20 with {LLMSS}'s spellings)")
    p.add_argument("--target_model_size", action=Given, default=None,
                   help=f"target model: 124M, 355M, 774M, 1558M (or the Hub's names gpt2, gpt2-medium, gpt2-large, "
                        f"gpt2-xl), distilgpt2, a bundled name ({bundled}), a Hub name hf:owner/name[@revision], "
                        f"random:<size> (random weights, e.g. random:1558M), or a folder in the release or Hugging "
                        f"Face layout (default: {DEFAULT_TARGET})")
    p.add_argument("--draft_model_size", action=Given, default=None,
                   help="drafter: a draft model named like the target, or 'ngram' (prompt lookup: propose "
                        "what followed the last n tokens' latest earlier occurrence, no model), or 'none' for "
                        f"target-only generation (default: {DEFAULT_DRAFT} with the default target, else none)")
    p.add_argument("--ngram_max", type=int, default=None,
                   help="with --draft_model_size ngram: the longest n-gram looked up, then shorter ones down to 1 "
                        "(default: 3)")
    add_loading_flags(p)


def decoding_flags(p):
    """Speculative decoding and sampling."""
    p.add_argument("--K", type=K_value, action=Given, default=None,
                   help="draft tokens per speculative round (Leviathan et al.'s gamma), or a K policy: 'heuristic' "
                        "(Hugging Face's: +2 after a fully accepted round, -1 otherwise) or 'auto' (each round, the K "
                        "with the best predicted speedup from this run's measured alpha, c and v; 0 = plain step) "
                        "(default: 4)")
    p.add_argument("--tree", type=tree_value, default=None, metavar="W1,W2,...|auto",
                   help="draft a token tree each round instead of a chain: W1 children under the newest token, W2 "
                        f"under each of those, ... (e.g. 3,2,1; at most {TREE_MAX_WIDTH} children a node and "
                        f"{TREE_MAX_NODES} nodes in all; a draft model draws them without replacement, prompt "
                        "lookup proposes up to W1*W2*... earlier matches as a trie); 'auto': each round the shape with the best "
                        "predicted speedup from this run's acceptance by depth and sibling rank and the measured "
                        "call times (a draft model only); replaces --K (default: none, a chain of --K drafts)")
    p.add_argument("--K_max", type=int, default=None,
                   help="the largest K the heuristic and auto policies may use, and the deepest tree --tree auto "
                        "may grow (default: 8)")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"sampling temperature; 0 means greedy (argmax) (default: 0; 1 with {LLMSS}'s spellings)")
    p.add_argument("--top_k", type=int, action=Given, default=None,
                   help=f"keep only the k most likely tokens (Hugging Face meaning; default: all; 20 with {LLMSS}'s "
                        "spellings)")
    p.add_argument("--top_p", type=float, action=Given, default=None,
                   help="nucleus sampling: keep the smallest set of most likely tokens with probability >= top_p "
                        f"(default: all; 0.9 with {LLMSS}'s spellings)")
    p.add_argument("--seed", type=int, action=Given, default=0,
                   help="seed of the np.random.Generator used for sampling")


def output_flags(p):
    """Measurement and output."""
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads (default: 1 for models narrower than n_embd 512, where waking threads "
                        "costs more than it saves, as measured on the bundled pair; else the BLAS default)")
    p.add_argument("--num_runs", type=int, action=Given, default=None,
                   help=f"timed runs of each decoder, after an untimed warm-up ({WARMUP_TOKENS} tokens; with N > 1 a "
                        f"whole run); with N > 1 reported as mean ± std (default: 1; {BENCHMARK_RUNS} with -b)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show every speculative token's provenance (accepted draft / target resample / target "
                        "bonus) and each rejected draft: colours and strikethrough on a terminal, [accepted: ...] "
                        "spans in a pipe or file")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write the runs' times and statistics (per-position acceptance included) as JSON to PATH "
                        "(default: none)")


def compatible_spellings(g):
    """Aliases: (flags, main.py's dest, type, style); -b and -p are modes of their own, with any flags
    (they bring no style: `python main.py -b` keeps gpt2np's defaults)."""
    aliases = [
        (["--input"], "prompt", str, LLMSS), (["--target_model_name"], "target_model_size", str, LLMSS),
        (["--approx_model_name"], "draft_model_size", str, LLMSS), (["-M", "--max_tokens"], "n_tokens_to_generate", int, LLMSS),
        (["-g", "--gamma"], "K", K_value, LLMSS), (["-s"], "seed", int, LLMSS),
        (["--input-str"], "prompt", str, SS), (["--target-model"], "target_model_size", str, SS),
        (["--draft-model"], "draft_model_size", str, SS), (["--N"], "n_tokens_to_generate", int, SS),
        (["--num-runs"], "num_runs", int, SS), (["--top-k"], "top_k", int, None), (["--top-p"], "top_p", float, None),
    ]
    for flags, dest, kind, style in aliases:
        g.add_argument(*flags, dest=dest, type=kind, action=Spelling, style=style, metavar=METAVARS[dest],
                       help=f"= --{dest}" + (f" ({style})" if style else ""))
    g.add_argument("-b", "--benchmark", dest="benchmark", action=Spelling, nargs=0,
                   help=f"time target-only and speculative decoding over --num_runs runs ({BENCHMARK_RUNS} unless "
                        "given) and print the tokens/s of each")
    g.add_argument("-p", "--profiling", dest="profiling", action=Spelling, nargs=0,
                   help="print where the time of one run of each decoder went: forward passes by model and call "
                        "size, drafting, verification and sampling, the rest")


def K_value(text):
    """--K: an integer, or the name of a K policy (make_policy checks the range)."""
    try:
        return K_from_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid K {text!r}: an integer >= 1, 'heuristic' or 'auto'") from None


def tree_value(text):
    """--tree: children per depth, comma-separated (3,2,1), or auto; within report's caps on a typed tree."""
    try:
        tree = tree_from_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid tree {text!r}: children per depth, comma-separated integers >= 1, "
                                         "e.g. 3,2,1, or auto") from None
    try:
        return tree if tree == "auto" else check_typed_tree(tree, text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def flag(args, dest):
    """The flag as the user spelled it (--max_tokens, --N, ...), else main.py's own."""
    return args.spelled.get(dest, f"--{dest}")


def check_one_name_each(args):
    """An option given two values under two of its names (--gamma 3 --K 4) is refused: the last one would
    win unseen. The same value under both (--max_tokens 20 --n_tokens_to_generate 20) is no conflict."""
    for names in args.given.values():
        (first, a), *others = names.values()
        for second, b in others:
            if b != a:
                raise ValueError(f"{first} ({a!r}) and {second} ({b!r}) are two names of one option and disagree: "
                                 f"give one of them")


def drafter_name(args):
    """The drafter main.py runs: report.chosen_drafter with the bundled draft (None: the target alone)."""
    return chosen_drafter(args, DEFAULT_DRAFT)


def apply_style_defaults(args):
    """Defaults: gpt2np's, or LLMSpeculativeSampling's where its spellings were used; one style only.
    args.style_defaults: the other repository's defaults that were applied (not given)."""
    if len(args.styles) > 1:
        mixed = " and ".join(f"{style}'s ({' '.join(flags)})" for style, flags in args.styles.items())
        raise ValueError(f"the flags mix the spellings of {mixed}: use one style (or gpt2np's own flags)")
    check_one_name_each(args)
    args.style_defaults = {}
    for dest, value in (LLMSS_DEFAULTS.items() if LLMSS in args.styles else ()):
        if getattr(args, dest) is None:
            setattr(args, dest, value)
            args.style_defaults[dest] = value
    args.benchmark, args.profiling = getattr(args, "benchmark", False), getattr(args, "profiling", False)
    args.table = SS in args.styles
    if args.n_tokens_to_generate is None:
        args.n_tokens_to_generate = default_n_tokens(args)
    if args.temperature is None:
        args.temperature = 0.0
    if args.num_runs is None:
        args.num_runs = BENCHMARK_RUNS if args.benchmark else 1


def check_drafting_args(args):
    """--K, --K_max, --ngram_max: their ranges, and only where they mean something; then defaults."""
    drafting = drafter_name(args) is not None
    K = flag(args, "K")
    check_drafts_given(args.K is not None, args.tree, drafting, flag(args, "draft_model_size"),
                       lambda dest: K if dest == "K" else f"--{dest}")
    # the library says so only after the target-only run
    check_tree_drafter(args.tree, args.draft_model_size,
                       lookup=f"prompt lookup ({flag(args, 'draft_model_size')} ngram)")
    if args.ngram_max is not None and args.draft_model_size != "ngram":
        raise ValueError("--ngram_max applies to --draft_model_size ngram only")
    if args.K_max is not None and args.K not in POLICIES[1:] and args.tree != "auto":
        raise ValueError(f"--K_max bounds {K} heuristic, {K} auto or --tree auto only "
                         f"(a fixed {K} is its own bound, and a fixed --tree's)")
    if args.K_max is not None and not 1 <= args.K_max <= K_MAX_LIMIT:  # the library's bound, said before any run
        raise ValueError(f"{flag(args, 'K_max')} must be an integer from 1 to {K_MAX_LIMIT}, got {args.K_max}")
    for dest, value in (("K", args.K), ("ngram_max", args.ngram_max)):
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{flag(args, dest)} must be at least 1{' (or heuristic / auto)' if dest == 'K' else ''}, "
                             f"got {value}")
    args.K, args.K_max, args.ngram_max = args.K or 4, args.K_max or 8, args.ngram_max or 3


def check_args(args):
    """Every check that needs no model, with the defaults filled in; a ValueError names the flag."""
    apply_style_defaults(args)
    if args.n_tokens_to_generate <= 0:
        raise ValueError(f"{flag(args, 'n_tokens_to_generate')} must be positive, got {args.n_tokens_to_generate}")
    check_drafting_args(args)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.num_runs < 1:
        raise ValueError(f"{flag(args, 'num_runs')} must be at least 1, got {args.num_runs}")
    if message := seed_error(args.seed, flag(args, "seed")):  # default_rng refuses it only after the models load
        raise ValueError(message)
    check_model_names(args, lambda dest: flag(args, dest))
    check_sampling_flags(args)
    if args.json is not None:
        check_json_path(args.json, example="runs.json")  # written after every run (compat.write_json)


def check_sampling_flags(args):
    """--temperature, --top_k, --top_p: the library's ranges (check_sampling_options), each named as typed."""
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0 (0 means greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"{flag(args, 'top_k')} must be at least 1 (leave it out to keep every token), "
                         f"got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"{flag(args, 'top_p')} must be in (0, 1] (1, or leaving it out, keeps every token), "
                         f"got {args.top_p}")
    gpt2np.check_sampling_options(args.temperature, args.top_k, args.top_p)  # anything else the library refuses

