"""The console's command-line flags: main.py's model, loading and sampling flags (--models_dir,
--mirror, --hf_endpoint as every command has them), and the first settings they give."""

from .commands import Settings, K_value, check_tree_drafter, checked, tree_widths
from gpt2np import bundled_models
from ..report import (THREADS_HELP, DefaultsHelpFormatter, OneLineErrorParser, add_loading_flags, check_drafts_given, chosen_drafter,
                      default_n_tokens, seed_error)

DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"  # gpt2np/bundled/


def parse_args(argv):
    p = OneLineErrorParser(prog="python -m gpt2np.console", description="An interactive console over gpt2np: "
                           "type a prompt, watch speculative decoding write it, change settings, repeat.",
                           formatter_class=DefaultsHelpFormatter)
    bundled = ", ".join(bundled_models()) or "none"
    p.add_argument("--target_model_size", default=None,
                   help=f"target: 124M, 355M, 774M, 1558M, a bundled name ({bundled}), a Hub name "
                        f"hf:owner/name[@revision], or a folder (default: {DEFAULT_TARGET})")
    p.add_argument("--draft_model_size", default=None,
                   help=f"drafter: a model named like the target, 'ngram' (prompt lookup), or 'none' (start with "
                        f"target-only runs until :drafter) (default: {DEFAULT_DRAFT} with the default target, "
                        f"else none)")
    p.add_argument("--ngram_max", type=int, default=3, help="prompt lookup's longest n-gram")
    add_loading_flags(p)
    p.add_argument("--K", default=None, help="draft tokens per round, or 'heuristic' / 'auto' (default: 4)")
    p.add_argument("--K_max", type=int, default=8, help="the bound of the heuristic and auto K policies")
    p.add_argument("--tree", default=None, metavar="W1,W2,...|auto",
                   help="draft a token tree each round instead of K drafts: children per depth (3,2,1), or 'auto' "
                        "(each round's shape from the run's acceptance and measured costs; a draft model only) "
                        "(default: none, a chain of --K drafts)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 means greedy")
    p.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens (default: all)")
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling threshold in (0, 1] (default: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of each run's np.random.Generator")
    p.add_argument("--n_tokens_to_generate", type=int, default=None,
                   help=f"new tokens per run; at most the target's context less one (default: 200 when the target "
                        f"is a bundled model ({bundled}), named or not; 40 for any other target)")
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    return p.parse_args(argv)


def flag(name):
    """A setting as the command line spells it, for errors that name what the user typed."""
    return f"--{name}"


def initial_settings(args):
    """Settings from the flags, checked like the commands that change them (one-line ValueError)."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.ngram_max < 1:
        raise ValueError(f"--ngram_max must be at least 1, got {args.ngram_max}")
    if message := seed_error(args.seed):  # np.random.default_rng refuses it only at the first prompt
        raise ValueError(message)
    drafter = chosen_drafter(args, DEFAULT_DRAFT)
    check_drafting_flags(args, drafter)
    n_tokens = args.n_tokens_to_generate
    if n_tokens is None:
        n_tokens = default_n_tokens(args)
    if n_tokens < 1:
        raise ValueError(f"--n_tokens_to_generate must be positive, got {n_tokens}")
    K = K_value(args.K, "--K") if args.K is not None else Settings.K
    tree = tree_widths(args.tree) if args.tree is not None else None
    check_tree_drafter(tree, drafter, flag)
    return checked(Settings(K=K, K_max=args.K_max, tree=tree, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, n_tokens=n_tokens, drafter=drafter,
                            speculative=drafter is not None, target=drafter is None), flag)


def check_drafting_flags(args, drafter):
    """--K and --tree as main.py takes them: each needs a drafter, and a tree fixes each round's drafts
    (a setting the run would drop is refused, not ignored). In the console, :K turns a tree off."""
    check_drafts_given(args.K is not None, args.tree, drafter is not None, "--draft_model_size")

