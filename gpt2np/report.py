"""Plain-text reporting shared by main.py, the classroom command and the notebooks."""
import argparse
import codecs

import numpy as np

# ANSI colours for where each speculative token came from (see speculative.py)
PROVENANCE_COLOURS = {"draft": "\033[32m", "resample": "\033[31m", "bonus": "\033[34m", "target": ""}
PROVENANCE_LABELS = {"draft": "accepted draft token", "resample": "target resample (after a rejection)",
                     "bonus": "target bonus token (all K drafts accepted)",
                     "target": "target token, no drafts this round (plain step)"}
RESET = "\033[0m"


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line on stderr (and exit status 2, as argparse's)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class TokenTexts:
    """Text of tokens as they stream in: UTF-8 decoded incrementally, so a character whose bytes
    are split across tokens (or across rounds) appears once it is complete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def pieces(self, ids):  # -> one string per id ("" while a character is incomplete)
        return [self.decoder.decode(self.tokenizer.decode_bytes([i])) for i in ids]

    def flush(self):  # -> what an unfinished character at the very end becomes
        return self.decoder.decode(b"", final=True)


def token_texts(tokenizer, ids):
    """The text each token contributes, decoding UTF-8 incrementally so split characters survive."""
    texts = TokenTexts(tokenizer)
    pieces = texts.pieces(ids)
    pieces[-1:] = [pieces[-1] + texts.flush()] if pieces else []
    return pieces


def coloured(pieces, provenance, colour=True):
    """Token texts joined, each wrapped in its provenance's ANSI colour when colour is on."""
    if not colour:
        return "".join(pieces)
    return "".join(PROVENANCE_COLOURS[p] + s + RESET if PROVENANCE_COLOURS[p] else s
                   for s, p in zip(pieces, provenance))


def provenance_legend(provenance, colour=True):
    """One line per kind of token, with its colour and how many tokens of that kind there were."""
    legend = []
    for kind, label in PROVENANCE_LABELS.items():
        if kind == "target" and kind not in provenance:
            continue  # only rounds without drafts make these: no need to explain them otherwise
        swatch = f"{PROVENANCE_COLOURS[kind]}{kind}{RESET}" if colour and PROVENANCE_COLOURS[kind] else kind
        legend.append(f"  {swatch}: {label} ({provenance.count(kind)} tokens)")
    return "legend" + ("" if colour else " (colour off: not a terminal, or NO_COLOR set)") + ":\n" + "\n".join(legend)


def colour_by_provenance(tokenizer, ids, provenance, colour=True):
    """Text of ids with each token coloured by provenance (ANSI), followed by a legend with counts."""
    return coloured(token_texts(tokenizer, ids), provenance, colour) + "\n" + provenance_legend(provenance, colour)


def mean_std(values):
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def _fmt(x, spec, unit=""):
    """x formatted, with its unit; "n/a" alone (no unit) when the run could not measure it."""
    return "n/a" if x is None else format(x, spec) + unit


def K_usage(stats):
    """"K=4" for a fixed K; "auto, K used 0:3 2:10 3:5 (rounds)" when a policy varied it."""
    if stats.policy == "fixed":
        return f"fixed K={stats.K}"
    counts = " ".join(f"{K}:{n}" for K, n in (stats.K_counts or {}).items())
    return f"{stats.policy}, K used {counts} (K:rounds)"


def stats_summary(stats, measured_speedup=None):
    """One line: drafter, K policy, alpha_hat, tokens per target call, speedups."""
    line = (f"drafter {stats.drafter}, {K_usage(stats)}, alpha_hat {_fmt(stats.alpha_hat, '.2f')}, "
            f"{stats.tokens_per_target_call:.2f} tokens/target call, "
            f"predicted {_fmt(stats.predicted_speedup_refined, '.2f', 'x')}")
    return line + ("" if measured_speedup is None else f", measured {measured_speedup:.2f}x")


def _unmeasured(value, stats):
    """Why a cost is n/a: the run made no one-token target call to divide by, and was not asked to."""
    if value is not None or stats.target_timings.get(1) or stats.calibration_seconds:
        return ""
    return "   (no one-token target call in this run; calibrate=True times a few after it)"


def format_stats(stats, measured_speedup=None):
    """The acceptance statistics of a speculative run, one labelled line each."""
    s = stats
    lines = [
        "acceptance statistics",
        f"  drafter, K policy                        {s.drafter}, {K_usage(s)}",
        f"  rounds (target verification calls)      {s.rounds}",
        f"  draft tokens proposed / accepted         {s.drafted} / {s.accepted}",
        f"  alpha_hat = mean sum_x min(p, q)         {_fmt(s.alpha_hat, '.3f')}   (Leviathan Thm 3.5; "
        "expected acceptance per draft token)",
        f"  alpha_empirical = accepted / verified    {_fmt(s.alpha_empirical, '.3f')}   (what this run saw)",
        f"  tokens per target call                   {_fmt(s.tokens_per_target_call, '.2f')}",
        f"  draft calls, time                        {s.draft_calls}, {s.draft_seconds:.3f} s",
        f"  target calls, time                       {s.target_calls}, {s.target_seconds:.3f} s",
        f"  c = drafter / target time per token      {_fmt(s.c, '.3f')}{_unmeasured(s.c, s)}",
        f"  v = target (K+1)-token / 1-token call    {_fmt(s.v, '.3f')}{_unmeasured(s.v, s)}",
        f"  predicted speedup, Thm 3.8 (v = 1)       {_fmt(s.predicted_speedup, '.2f', 'x')}",
        f"  predicted speedup with measured v        {_fmt(s.predicted_speedup_refined, '.2f', 'x')}",
    ]
    if measured_speedup is not None:
        lines.append(f"  measured speedup (wall clock)            {_fmt(measured_speedup, '.2f', 'x')}")
    return "\n".join(lines)
