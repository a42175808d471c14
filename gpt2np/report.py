"""Plain-text reporting shared by main.py, the classroom command and the notebooks."""
import argparse
import codecs

import numpy as np

# ANSI colours for where each speculative token came from (see speculative.py)
PROVENANCE_COLOURS = {"draft": "\033[32m", "resample": "\033[31m", "bonus": "\033[34m"}
PROVENANCE_LABELS = {"draft": "accepted draft token", "resample": "target resample (after a rejection)",
                     "bonus": "target bonus token (all K drafts accepted)"}
RESET = "\033[0m"


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line on stderr (and exit status 2, as argparse's)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def token_texts(tokenizer, ids):
    """The text each token contributes, decoding UTF-8 incrementally so split characters survive."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [decoder.decode(tokenizer.decode_bytes([i])) for i in ids]
    pieces[-1:] = [pieces[-1] + decoder.decode(b"", final=True)] if pieces else []
    return pieces


def colour_by_provenance(tokenizer, ids, provenance, colour=True):
    """Text of ids with each token coloured by provenance (ANSI), followed by a legend with counts."""
    pieces = token_texts(tokenizer, ids)
    if colour:
        text = "".join(PROVENANCE_COLOURS[p] + s + RESET for s, p in zip(pieces, provenance))
    else:
        text = "".join(pieces)
    legend = []
    for kind, label in PROVENANCE_LABELS.items():
        swatch = f"{PROVENANCE_COLOURS[kind]}{kind}{RESET}" if colour else kind
        legend.append(f"  {swatch}: {label} ({provenance.count(kind)} tokens)")
    return text + "\nlegend" + ("" if colour else " (colour off: not a terminal, or NO_COLOR set)") + ":\n" + "\n".join(legend)


def mean_std(values):
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def format_stats(stats, measured_speedup=None):
    """The acceptance statistics of a speculative run, one labelled line each."""
    s = stats
    lines = [
        "acceptance statistics",
        f"  rounds (target verification calls)      {s.rounds}",
        f"  draft tokens proposed / accepted         {s.drafted} / {s.accepted}",
        f"  alpha_hat = mean sum_x min(p, q)         {_fmt(s.alpha_hat, '.3f')}   (Leviathan Thm 3.5; "
        "expected acceptance per draft token)",
        f"  alpha_empirical = accepted / verified    {_fmt(s.alpha_empirical, '.3f')}   (what this run saw)",
        f"  tokens per target call                   {_fmt(s.tokens_per_target_call, '.2f')}",
        f"  draft calls, time                        {s.draft_calls}, {s.draft_seconds:.3f} s",
        f"  target calls, time                       {s.target_calls}, {s.target_seconds:.3f} s",
        f"  c = draft / target time per 1-token call {_fmt(s.c, '.3f')}",
        f"  v = target (K+1)-token / 1-token call    {_fmt(s.v, '.3f')}",
        f"  predicted speedup, Thm 3.8 (v = 1)       {_fmt(s.predicted_speedup, '.2f')}x",
        f"  predicted speedup with measured v        {_fmt(s.predicted_speedup_refined, '.2f')}x",
    ]
    if measured_speedup is not None:
        lines.append(f"  measured speedup (wall clock)            {measured_speedup:.2f}x")
    return "\n".join(lines)
