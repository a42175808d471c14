"""Watch speculative decoding recover the target's distribution, then watch broken versions fail.

    python -m gpt2np.classroom                      # defaults: about 5 seconds
    python -m gpt2np.classroom --n_samples 5000 --K 3 --temperature 0.7 --broken softmax_residual  # 10-15 s
    python -m gpt2np.classroom --drafter ngram --K auto   # prompt lookup drafts, K chosen per round: 3 s

What it does, in four steps:
  1. builds a target and a draft: tiny random n-gram models over a toy vocabulary A, B, C, ...
     (toy_models.py), with the same interface as GPT-2 (or, with --drafter ngram, prompt lookup:
     drafts copied from earlier in the context, drafters.py);
  2. computes the EXACT probability of every N-token continuation of the prompt under the target,
     by enumerating every random choice of the real `generate` (exact.py): no sampling involved;
  3. runs the real `speculative_generate` n_samples times (seeded), counts each N-token outcome,
     and compares the counts with n times the exact probabilities by Pearson's chi-square test
     (chi_square.py): a p-value below --alpha means "REJECTED: not the target's distribution".
     Outcomes expected fewer than 20 times are pooled; settings that pool everything into one
     bin leave nothing to test, and are refused before any sampling;
  4. does the same with a broken sampler (broken_kernels.py, plus one defined here), and ends
     with a one-line verdict for every broken variant, beside its EXACT distance from the target
     (total variation, TV, by enumerating the broken sampler too): a bug that cannot act in these
     settings (K = 1, no drafts) reads "identical to the target here", one too small for n
     samples says so and how many would show it; neither is a miss of the test.

Speculative decoding's promise (Leviathan et al. 2023, Appendix A.1; Chen et al. 2023, Theorem 1)
is that its output has EXACTLY the target's distribution; step 3 lets you watch it hold. The broken
variants are bugs found in public code: each still runs and accepts a plausible share of drafts.

>>> run = recovery_experiment(*toy_pair(), n_tokens=2, K=2, options={}, n_samples=200, seed=0)
>>> run.result.df > 0 and run.result.p_value > 0.001
True
"""
import argparse
import math
import string
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .broken_kernels import BROKEN_VARIANTS, unnormalised_residual_kernel
from ..decoding.drafters import NgramDrafter
from .exact import TooManyPaths, exact_distribution, exact_target_distribution, total_variation
from ..decoding.policies import POLICIES, make_policy
from ..decoding.sampling import check_sampling_options, is_greedy
from ..decoding.speculative import speculative_generate
from .chi_square import (MIN_EXPECTED, ChiSquareResult, chi_square_test, critical_value, expected_statistic,
                         pool_small_bins)
from .toy_models import random_toy_model
from ..report import OneLineErrorParser

PROMPT = [0]  # token "A": every sample continues the same one-token prompt
NGRAM_PROMPT = [0, 1, 0]  # "A B A": with prompt lookup, something to look up from the first round
MAX_PATHS = 3000  # enumeration budget for a broken sampler's exact law (~0.7 ms a path on toy models)
SAME = 1e-12      # a TV this small is float rounding: the laws are the same


# name -> keyword arguments for speculative_generate: the broken variants, and the hand-written-sampler bug
NEGATIVE_CONTROLS = {**BROKEN_VARIANTS, "unnormalised_residual": {"kernel": unnormalised_residual_kernel}}
DESCRIPTIONS = {
    "greedy_draft": "the draft proposes its argmax, but accepts with the softmax ratio p/q",
    "softmax_residual": "after a rejection, max(0, p - q) is softmaxed instead of divided by its sum",
    "first_position_only": "only the first draft of a round is tested; the rest are waved through",
    "unnormalised_residual": "max(0, p - q) is not normalised; its missing mass goes to the last token",
}


def toy_pair(n_vocab=3, order=2, model_seed=0):
    """(target, draft): two independent random n-gram models over the same toy vocabulary."""
    rng = np.random.default_rng(model_seed)
    return random_toy_model(rng, n_vocab, order), random_toy_model(rng, n_vocab, order)


@dataclass(frozen=True)
class Experiment:
    exact: dict              # outcome -> exact target probability
    counts: Counter          # outcome -> how many of the n_samples speculative runs produced it
    result: ChiSquareResult  # the chi-square test of counts against exact
    drafted: int             # draft tokens proposed over all runs
    accepted: int            # of which accepted
    law: dict | None = None  # a broken sampler's own exact distribution; None: real sampler, or not enumerable

    @property
    def tv(self):  # total variation distance of the sampler's exact law from the target's (None: unknown)
        return None if self.law is None else total_variation(self.law, self.exact)


def sampler_distribution(target, draft, n_tokens, K, options, variant, exact, prompt=PROMPT):
    """{outcome: exact probability} of speculative_generate with a broken variant, by enumerating
    its random paths as for the target (exact.py). None where that cannot be done here: K "auto"
    follows the clock, and big settings have more than MAX_PATHS paths (about 10 per outcome)."""
    if K == "auto" or 10 * len(exact) > MAX_PATHS:
        return None
    def run(rng):
        return tuple(speculative_generate(target, draft, prompt, n_tokens, K, rng=rng, K_max=4, **options,
                                          **NEGATIVE_CONTROLS[variant]).tokens)
    try:
        return exact_distribution(run, max_paths=MAX_PATHS)
    except TooManyPaths:
        return None


def speculative_counts(target, draft, n_tokens, K, options, n_samples, seed, variant=None, prompt=PROMPT):
    """n_samples runs of speculative_generate from one seeded rng: (Counter of outcomes, drafted, accepted).

    variant: a name in NEGATIVE_CONTROLS, or None for the real sampler.
    """
    rng = np.random.default_rng(seed)
    broken = NEGATIVE_CONTROLS[variant] if variant else {}
    counts, drafted, accepted = Counter(), 0, 0
    for _ in range(n_samples):
        run = speculative_generate(target, draft, prompt, n_tokens, K, rng=rng, K_max=4, **options, **broken)
        counts[tuple(run.tokens)] += 1
        drafted, accepted = drafted + run.stats.drafted, accepted + run.stats.accepted
    return counts, drafted, accepted


def recovery_experiment(target, draft, n_tokens, K, options, n_samples, seed, variant=None, exact=None,
                        prompt=PROMPT):
    """Steps 2-3 of the module docstring for one sampler: exact distribution, counts, chi-square
    (and, for a broken variant, its own exact law where it can be enumerated)."""
    exact = exact if exact is not None else exact_target_distribution(target, prompt, n_tokens, **options)
    counts, drafted, accepted = speculative_counts(target, draft, n_tokens, K, options, n_samples, seed,
                                                   variant, prompt)
    law = sampler_distribution(target, draft, n_tokens, K, options, variant, exact, prompt) if variant else None
    return Experiment(exact, counts, chi_square_test(counts, exact), drafted, accepted, law)


def token_name(token):
    return string.ascii_uppercase[token]


def outcome_name(outcome):
    return " ".join(token_name(t) for t in outcome)


def format_p_value(p):
    """"= 0.759", "= 3.1e-12", or "< 1e-300" when the tail probability is that small (or underflows to 0)."""
    return "< 1e-300" if p < 1e-300 else f"= {p:.3g}" if p >= 1e-4 else f"= {p:.1e}"


def rejected(result, alpha):
    return result.impossible > 0 or (result.tested and result.p_value < alpha)


NO_TEST = ("no test possible: every outcome pooled into one bin "
           f"(expected counts below {MIN_EXPECTED:g}; use more samples or fewer tokens)")


def verdict(result, alpha):
    """One line: the test's decision at significance level alpha, and why."""
    if result.impossible:
        return f"REJECTED: {result.impossible} samples are outcomes the target can never produce"
    if not result.tested:
        return NO_TEST
    if rejected(result, alpha):
        return f"REJECTED: p < {alpha:g}, these samples do not follow the target distribution"
    return f"consistent with the target distribution (p >= {alpha:g})"


def shows_in(exact, law, n, alpha):
    """Whether n samples from `law` are rejected about 9 times in 10: an impossible outcome turns up
    with probability 0.9, or X^2's mean minus 1.28 standard deviations reaches the critical value
    (X^2 as a normal with the noncentral chi-square's mean df + L and variance 2 (df + 2 L),
    L = chi_square.expected_statistic - df)."""
    impossible = sum(p for x, p in law.items() if exact.get(x, 0.0) == 0)
    df = len(pool_small_bins([n * p for p in exact.values() if p > 0])) - 1
    if 1 - (1 - impossible) ** n >= 0.9:
        return True
    if df < 1:
        return False
    mean = expected_statistic(exact, {x: p for x, p in law.items() if exact.get(x, 0.0) > 0}, n)
    return mean - 1.28 * math.sqrt(2 * (2 * mean - df)) >= critical_value(alpha, df)


def samples_to_show(exact, law, alpha, limit=10**9):
    """About how many samples the test needs to reject `law` 9 times in 10 (2 digits)."""
    n = 1
    while not shows_in(exact, law, n, alpha) and n < limit:
        n *= 2
    low = n // 2
    while n - low > max(1, n // 100):  # bisect (pooling changes with n, so "about")
        middle = (low + n) // 2
        low, n = (low, middle) if shows_in(exact, law, middle, alpha) else (middle, n)
    return int(float(f"{n:.2g}"))


def why_not_detected(experiment, alpha):
    """Why a broken sampler passed, when the reason is known: the bug cannot act here, no drafts were
    made, or the difference is too small for n samples; a plain miss otherwise. None: not known."""
    n = experiment.result.n_samples
    if experiment.tv is not None and experiment.tv < SAME:
        return "identical to the target here: nothing to detect"
    if experiment.drafted == 0:
        return "no drafts made: plain decoding, the bug never acted"
    if experiment.law is None:
        return None
    needed = samples_to_show(experiment.exact, experiment.law, alpha)
    if needed > n:
        return f"too small for {n} samples (about {needed} would show it)"
    return f"missed by bad luck ({n} samples show it 9 times in 10)"


def decision(experiment, alpha):
    """The summary's last column for a broken sampler."""
    r = experiment.result
    if not r.tested:
        return "no test possible (one bin)"
    if rejected(r, alpha):
        same = experiment.tv is not None and experiment.tv < SAME
        return "REJECTED, a false alarm: its law is the target's here" if same else "REJECTED"
    why = why_not_detected(experiment, alpha)
    return "not detected" + (f": {why}" if why else "")


def format_row(outcome, p, observed, n):
    z = (observed - n * p) / math.sqrt(n * p) if p > 0 else math.inf
    flag = "  <- impossible" if p == 0 else "  <-" if abs(z) > 4 and n * p >= 1 else ""
    return (f"  {outcome_name(outcome):<10} {p:>9.4f} {n * p:>9.1f} {observed:>9d} "
            f"{observed / n:>10.4f} {z:>7.1f}{flag}")


def format_table(experiment, max_rows):
    """The outcome table: exact probability, expected and observed counts, frequency, residual z."""
    exact, counts, n = experiment.exact, experiment.counts, experiment.result.n_samples
    outcomes = sorted(set(exact) | set(counts), key=lambda x: (-exact.get(x, 0.0), x))  # likeliest first
    lines = [f"  {'outcome':<10} {'target P':>9} {'expected':>9} {'observed':>9} {'frequency':>10} {'z':>7}"]
    lines += [format_row(x, exact.get(x, 0.0), counts.get(x, 0), n) for x in outcomes[:max_rows]]
    rest = outcomes[max_rows:]
    if rest:
        lines.append(f"  ... {len(rest)} rarer outcomes not shown (target P "
                     f"{sum(exact.get(x, 0.0) for x in rest):.4f}, observed {sum(counts[x] for x in rest)})")
    lines += ["  z = (observed - expected) / sqrt(expected): if the sampler is right, mean 0 and spread sqrt(1 - P);",
              "      roughly normal where expected >= 5, far from normal below ~1 (<-: |z| > 4, expected >= 1)"]
    return "\n".join(lines)


def format_drafts(experiment):
    if not experiment.drafted:
        return "  drafts: none were made, every round was a plain target step: nothing speculative ran"
    return (f"  drafts accepted: {experiment.accepted} of {experiment.drafted} "
            f"({experiment.accepted / experiment.drafted:.1%})")


def format_test(result):
    if not result.tested:
        return "  chi-square: none, one bin and 0 degrees of freedom"
    bins = f"{len(result.bins)} bin{'s' if len(result.bins) > 1 else ''}"
    return (f"  chi-square = {result.statistic:.2f} with {result.df} degree{'s' if result.df != 1 else ''} of "
            f"freedom ({bins}; expected counts below {MIN_EXPECTED:g} pooled), "
            f"p-value {format_p_value(result.p_value)}")


def format_distance(experiment, alpha):
    """A broken sampler's exact distance from the target, and why it passed if it did."""
    if experiment.law is None:
        return []
    why = None if rejected(experiment.result, alpha) else why_not_detected(experiment, alpha)
    return [f"  its exact law: TV {format_tv(experiment.tv)} from the target" + (f"; {why}" if why else "")]


def format_experiment(title, experiment, alpha, max_rows):
    r = experiment.result
    return "\n".join([title, format_table(experiment, max_rows), format_drafts(experiment), format_test(r),
                      f"  verdict: {verdict(r, alpha)}", *format_distance(experiment, alpha), ""])


def format_tv(tv):
    return "n/a" if tv is None else "0" if tv < SAME else f"{tv:.3f}"


def format_summary(controls, alpha, K):
    lines = ["3. Every broken variant, same test (TV: its exact total-variation distance from the target):"]
    for name, experiment in controls.items():
        r = experiment.result
        p = format_p_value(r.p_value) if r.tested else "n/a"
        lines.append(f"  {name:<22} TV {format_tv(experiment.tv):<5}  chi-square {r.statistic:>8.1f}, "
                     f"df {r.df:>2}, p {p:<10} {decision(experiment, alpha)}")
    if any(experiment.law is None for experiment in controls.values()):
        lines.append("  TV n/a: " + ("with K auto each round's K follows the clock: these laws cannot be enumerated"
                                     if K == "auto" else f"more than {MAX_PATHS} random paths to enumerate"))
    return "\n".join(lines)


def format_header(args, n_outcomes):
    return "\n".join([
        "Speculative decoding in the classroom: does it sample from the target?",
        f"  vocabulary {outcome_name(range(args.n_vocab))}; target and draft: random {args.order}-gram "
        f"models (model seed {args.model_seed})",
        f"  drafter: {'prompt lookup (ngram)' if args.drafter == 'ngram' else 'the draft model'}",
        f"  sample = the {args.n_tokens} tokens after the prompt {outcome_name(prompt_of(args))}; K = {args.K}; "
        f"temperature {args.temperature}, top_k {args.top_k}, top_p {args.top_p}",
        f"  target P: exact, by enumerating every random path of generate() ({n_outcomes} outcomes)",
        f"  each sampler: {args.n_samples} runs of speculative_generate, rng seed {args.seed}", ""])


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def non_negative_int(text):  # a seed: np.random.default_rng refuses a negative one (in a traceback)
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def K_or_policy(text):
    return text if text in POLICIES[1:] else positive_int(text)


def prompt_of(args):
    return NGRAM_PROMPT if args.drafter == "ngram" else PROMPT


def build_parser():
    parser = OneLineErrorParser(
        prog="python -m gpt2np.classroom", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Speculative decoding vs the exact target distribution on a toy vocabulary, "
                    "by a chi-square test; then the same test on broken samplers.")
    add = parser.add_argument
    # what is sampled
    add("--n_samples", type=positive_int, default=2000, help="speculative runs per sampler")
    add("--seed", type=non_negative_int, default=0, help="seed of the sampling rng (same seed, same output)")
    add("--n_tokens", type=positive_int, default=3, help="tokens per sample: an outcome is this sequence")
    add("--K", type=K_or_policy, default=2,
        help="draft tokens per verification round, or a K policy: heuristic / auto (at most 4 here; auto "
             "with the draft model may draft nothing on runs this short: use it with --drafter ngram)")
    add("--drafter", default="model", choices=("model", "ngram"),
        help="model: the toy draft model; ngram: prompt lookup (no draft model; prompt A B A)")
    # the toy models
    add("--n_vocab", type=positive_int, default=3, help="toy vocabulary size, 2 to 8 (tokens A, B, ...)")
    add("--order", type=int, default=2, choices=(1, 2, 3),
        help="n-gram order of both toy models: 1 ignores the context, 2 bigram, 3 trigram")
    add("--model_seed", type=non_negative_int, default=16,
        help="seed of the random target and draft tables (16: every bug has a large effect)")
    # the sampling transform, applied to target (p) and draft (q) alike
    add("--temperature", type=float, default=1.0, help="> 0 (0 is greedy: nothing random to count)")
    add("--top_k", type=positive_int, default=None, help="keep only the k most probable tokens")
    add("--top_p", type=float, default=None, help="nucleus sampling threshold, in (0, 1]")
    # the test
    add("--alpha", type=float, default=1e-3,
        help="significance level: about the chance that a correct sampler is REJECTED by bad luck "
             "(chi_square.py measures it: 1.0-1.15 per 1000 at 0.001)")
    add("--broken", default=None, choices=sorted(NEGATIVE_CONTROLS),
        help="the broken variant shown in full (all of them get a one-line verdict at the end; "
             "default: greedy_draft, or softmax_residual with --drafter ngram)")
    add("--max_rows", type=positive_int, default=30, help="outcome rows shown per table")
    return parser


def check_args(parser, args):
    """The checks argparse's types cannot express; each failure is one line and exit status 2."""
    try:
        check_sampling_options(args.temperature, args.top_k, args.top_p)
    except ValueError as error:
        parser.error(str(error))
    if is_greedy(args.temperature):
        parser.error("temperature must be > 0: temperature 0 is greedy, every run gives the same tokens")
    if not 2 <= args.n_vocab <= 8:
        parser.error(f"--n_vocab must be between 2 and 8, got {args.n_vocab}")
    if args.n_vocab ** args.n_tokens > 4096:
        parser.error(f"{args.n_vocab}^{args.n_tokens} outcomes is too many to enumerate and count: "
                     "lower --n_tokens or --n_vocab")
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.drafter == "ngram" and args.broken == "greedy_draft":  # before any work, not after experiment 1
        parser.error(f"--broken greedy_draft needs the draft model: with --drafter ngram choose from "
                     f"{', '.join(control_names(args))}")


MAX_SAMPLES_HINT = 10 ** 8  # a test needing more samples than this is out of a classroom's reach


def check_testable(parser, args, exact):
    """Pooling depends only on the exact law and n, so an untestable run is refused before sampling."""
    probs = [p for p in exact.values() if p > 0]
    if len(probs) == 1:
        parser.error(f"the target has one possible outcome here ({outcome_name(next(iter(exact)))}): nothing "
                     "random to test; raise --top_k, --top_p or --temperature")
    if len(pool_small_bins([args.n_samples * p for p in probs])) < 2:
        n = samples_for_a_test(probs)
        if n > MAX_SAMPLES_HINT:
            parser.error(f"the target is nearly deterministic here (all its outcomes but one have "
                         f"{rest_of(probs):.2g} of the probability): a test needs {n:.2g} samples; raise "
                         f"--temperature")
        parser.error(f"no test possible: with --n_samples {args.n_samples} every outcome pools into one bin "
                     f"(expected counts below {MIN_EXPECTED:g}); use --n_samples {n} or more, or fewer --n_tokens")


def rest_of(probs):  # -> the probability of every outcome but the likeliest (not 1 - max: 0 once max rounds to 1)
    return math.fsum(sorted(probs)[:-1])


def samples_for_a_test(probs):
    """The smallest n giving two bins: the likeliest outcome and the rest each expected MIN_EXPECTED times."""
    n = math.ceil(MIN_EXPECTED / min(max(probs), rest_of(probs)))
    while n <= MAX_SAMPLES_HINT and len(pool_small_bins([n * p for p in probs])) < 2:  # float rounding
        n += 1
    return n


def control_names(args):  # the broken variants this drafter can run
    # the greedy-draft bug is in a draft model's sampler: prompt lookup has none to break
    return [n for n in sorted(NEGATIVE_CONTROLS) if not (args.drafter == "ngram" and n == "greedy_draft")]


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    target, draft = toy_pair(args.n_vocab, args.order, args.model_seed)
    K, prompt = (make_policy(args.K, 4) and args.K), prompt_of(args)
    draft = NgramDrafter(n_max=2) if args.drafter == "ngram" else draft
    exact = exact_target_distribution(target, prompt, args.n_tokens, **options)
    check_testable(parser, args, exact)
    print(format_header(args, len(exact)))

    def run(variant):
        return recovery_experiment(target, draft, args.n_tokens, K, options, args.n_samples,
                                   args.seed, variant, exact, prompt)
    print(format_experiment("1. The real speculative sampler", run(None), args.alpha, args.max_rows))
    names = control_names(args)
    args.broken = args.broken or ("softmax_residual" if args.drafter == "ngram" else "greedy_draft")
    controls = {name: run(name) for name in names}
    print(format_experiment(f"2. A broken sampler, {args.broken}: {DESCRIPTIONS[args.broken]}",
                            controls[args.broken], args.alpha, args.max_rows))
    print(format_summary(controls, args.alpha, K))
    return 0

