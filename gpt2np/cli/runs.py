"""main.py's runs: load the models, time each decoder over its runs, print the text as it comes."""
import sys
import time
from dataclasses import dataclass

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/model/fast)
import numpy as np

from gpt2np import check_generation_request
from gpt2np.report import (TokenTexts, check_tokenizer, colour_allowed, drafter_errors, marked, mean_std,
                           provenance_legend, rejected_draft)

from .flags import DEFAULT_TARGET, WARMUP_TOKENS, drafter_name, flag


@dataclass
class Runs:
    """The timed runs of one decoder: the seconds of each (decoding only) and each run's Stream."""
    label: str
    seconds: list
    streams: list

    @property
    def n_tokens(self):  # of the last run (every run of a decoder asks for the same number)
        return len(self.streams[-1].tokens)

    @property
    def results(self):  # the decoders' return values: token lists, or SpeculativeResults
        return [s.result for s in self.streams]


def load(args):
    """(target, drafter or None, prompt ids), every check made before any generation."""
    sources = dict(base_url=args.mirror, hf_endpoint=args.hf_endpoint)
    name = args.target_model_size or DEFAULT_TARGET
    check_tokenizer(name, args.models_dir, "to encode the prompt with")  # before the weights are built
    target = gpt2np.load_model(name, args.models_dir, **sources)
    drafter = load_drafter(args, target, sources)
    # an empty prompt means unconditional sampling, which GPT-2 starts from <|endoftext|>
    prompt_ids = target.tokenizer.encode(args.prompt) or [target.eot_id]
    check_context(args, target, drafter, prompt_ids)
    check_generation_request(target, prompt_ids, args.n_tokens_to_generate)
    if drafter is not None:
        drafter.check(target, prompt_ids, args.n_tokens_to_generate)
    return target, drafter, prompt_ids


def check_context(args, target, drafter, prompt_ids):
    """The prompt and the tokens asked for fit the target's context (and a draft model's), named as typed."""
    n_ctx, whose, n = target.n_ctx, "the context", args.n_tokens_to_generate
    draft_ctx = getattr(getattr(drafter, "model", None), "n_ctx", n_ctx)  # a draft model's (ModelDrafter) too
    if draft_ctx < n_ctx:
        n_ctx, whose = draft_ctx, "the draft model's context"
    if len(prompt_ids) + n > n_ctx:
        raise ValueError(f"the prompt ({len(prompt_ids)} tokens) + {flag(args, 'n_tokens_to_generate')} ({n}) = "
                         f"{len(prompt_ids) + n} exceeds {whose} of {n_ctx} tokens; shorten {flag(args, 'prompt')} "
                         f"or ask for fewer tokens")


def load_drafter(args, target, sources):
    """The drafter named by --draft_model_size (None: target-only), checked against the target.

    The target's own name drafts with the target itself (the sanity check: every draft accepted),
    loaded once: random:1558M twice would be 12 GB. An unknown name's error lists ngram and none too."""
    target_name = args.target_model_size or DEFAULT_TARGET
    draft_name = drafter_name(args)
    if draft_name is None:
        return None
    if draft_name == target_name:
        return gpt2np.ModelDrafter(target)
    with drafter_errors():
        return gpt2np.load_drafter(draft_name, args.models_dir, n_max=args.ngram_max, target=target, **sources)


def display_style(args):
    """How -v shows provenance: colours on a terminal, labelled spans in a pipe, a file, under NO_COLOR or
    TERM=dumb (report.colour_allowed)."""
    if not args.verbose:
        return "plain"
    return "colour" if colour_allowed(sys.stdout) else "markers"


def timed_runs(make_stream, n_tokens, num_runs, show, untimed=lambda result: 0.0):
    """One short untimed warm-up (num_runs > 1: a whole one), then num_runs timed runs of a stream.

    make_stream(n_tokens) starts a stream; show(stream) consumes it while printing its tokens as
    they come, for the last run (with num_runs > 1 the earlier runs are not printed). Returns the
    streams and the seconds of each run, less untimed(result): seconds of measurement, not of
    decoding.
    """
    make_stream(n_tokens if num_runs > 1 else min(n_tokens, WARMUP_TOKENS)).run()
    seconds, streams = [], []
    for i in range(num_runs):
        stream = make_stream(n_tokens)
        start = time.perf_counter()
        show(stream) if i == num_runs - 1 else stream.run()
        seconds.append(time.perf_counter() - start - untimed(stream.result))
        streams.append(stream)
    return streams, seconds


def printer(tokenizer, prompt, style):
    """show() for timed_runs: the prompt, then each round's tokens as the stream yields them, each
    rejected draft (style colour / markers) before the target's replacement. Counts those in .rejected."""
    def show(stream):
        texts = TokenTexts(tokenizer)
        sys.stdout.write(prompt)
        for event in stream:
            rejected = replaced_draft(event) if style != "plain" else None
            show.rejected += rejected is not None
            sys.stdout.write(marked(texts.pieces(event.tokens), event.provenance, style,
                                    None if rejected is None else texts.alone(rejected)))
            sys.stdout.flush()
        sys.stdout.write(texts.flush() + "\n")
    show.rejected = 0
    return show


def replaced_draft(event):
    """The draft the target's token replaced (report.rejected_draft); in a token tree the first child
    tried at the node where every child was rejected, the drafter's own first choice there."""
    if len(set(event.parents[1:])) == len(event.parents[1:]):  # a chain (or no drafts)
        return rejected_draft(event)
    rejected = [node for node, ok in event.tried if not ok and event.parents[node] == ([0, *event.path])[-1]]
    cut = len(event.tokens) < len(event.path) + 1  # the round ended at a stop token before the target's
    return event.drafts[rejected[0] - 1] if rejected and event.provenance[-1] == "resample" and not cut else None


def print_time(runs):
    mean, std = mean_std(runs.seconds)
    spread = f" ± {std:.3f}" if len(runs.seconds) > 1 else ""
    print(f"time: {mean:.3f}{spread} s for {runs.n_tokens} tokens ({runs.n_tokens / mean:.1f} tokens/s)")


def sampling(args):
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def run_plain(args, target, prompt_ids):
    """Target-only decoding, printed as it goes, then its time; returns its Runs."""
    def plain(n_tokens):
        return gpt2np.plain_stream(target, prompt_ids, n_tokens, rng=np.random.default_rng(args.seed), **sampling(args))

    print(f"\n=== autoregressive ({target.name}) ===")
    streams, seconds = timed_runs(plain, args.n_tokens_to_generate, args.num_runs,
                                  printer(target.tokenizer, args.prompt, "plain"))
    runs = Runs("autoregressive", seconds, streams)
    print_time(runs)
    return runs


def speculative_streams(args, target, drafter, prompt_ids, calibrate=True):
    """make_stream for timed_runs: speculative decoding with main.py's settings (calibrate: c and v
    are printed, so they are measured; a profiled run makes only its own calls)."""
    def speculative(n_tokens):
        return gpt2np.speculative_stream(target, drafter, prompt_ids, n_tokens, args.K, K_max=args.K_max,
                                         rng=np.random.default_rng(args.seed), calibrate=calibrate,
                                         tree=args.tree, **sampling(args))
    return speculative


def tree_text(tree):  # -> "3,2,1" or "auto", as --tree takes it
    return tree if tree == "auto" else ",".join(map(str, tree))


def drafts_label(args, fixed_K="K={}"):
    """What each round drafts: "tree 3,2,1", "tree auto, depth <= 8", "K=4" or "K auto <= 8"."""
    if args.tree is not None:
        return f"tree {tree_text(args.tree)}" + (f", depth <= {args.K_max}" if args.tree == "auto" else "")
    return fixed_K.format(args.K) if isinstance(args.K, int) else f"K {args.K} <= {args.K_max}"


def run_speculative(args, target, drafter, prompt_ids):
    """Speculative decoding, printed as it goes (with -v its provenance and legend), then its time."""
    print(f"\n=== speculative (drafter {drafter.name}, {drafts_label(args)}) ===")
    style = display_style(args)
    show = printer(target.tokenizer, args.prompt, style)
    # the one-token target calls that calibrate c and v (when the run made too few) are not decoding
    streams, seconds = timed_runs(speculative_streams(args, target, drafter, prompt_ids), args.n_tokens_to_generate,
                                  args.num_runs, show, lambda r: r.stats.calibration_seconds)
    if args.verbose:
        print(provenance_legend(streams[-1].provenance, style == "colour", style == "markers", show.rejected,
                                tree=args.tree is not None))
    runs = Runs("speculative", seconds, streams)
    print_time(runs)
    return runs
