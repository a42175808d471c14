"""What main.py prints in the other repositories' modes: -b's tokens/s lines (LLMSpeculativeSampling),
speculative-sampling's table, and --json. Pure formatting of the Runs that runs.py timed."""
import json
from dataclasses import asdict

from gpt2np.report import by_position, mean_std, write_flag_file

TABLE_COLUMNS = ("method", "num_runs", "time", "+/- std", "speedup")
METHODS = {"autoregressive": "autoregressive sampling", "speculative": "speculative sampling"}


def benchmark_lines(all_runs):
    """-b: one '[benchmark]' line per decoder: tokens/s, and seconds per run for its tokens."""
    lines = []
    for runs in all_runs:
        mean, std = mean_std(runs.seconds)
        lines.append(f"[benchmark] {METHODS[runs.label]}, tokens/sec: {runs.n_tokens / mean:.1f}, "
                     f"{mean:.3f} ± {std:.3f} sec generates {runs.n_tokens} tokens (mean of {len(runs.seconds)} runs)")
    return "\n".join(lines)


def pooled(results):
    """The acceptance counts of every run of a speculative decoder, summed: rejections, drafts, by position."""
    stats = [r.stats for r in results]
    depth = max((len(s.by_position) for s in stats), default=0)
    positions = tuple(tuple(sum(s.by_position[i][j] for s in stats if len(s.by_position) > i) for j in range(3))
                      for i in range(depth))  # (proposed, examined, accepted) per draft position
    return dict(runs=len(stats), rounds=sum(s.rounds for s in stats), drafted=sum(s.drafted for s in stats),
                accepted=sum(s.accepted for s in stats), rejections=sum(s.rejections for s in stats),
                by_position=positions)


def table(plain, spec):
    """speculative-sampling's table: method | num_runs | time | +/- std | speedup (time: seconds per run)."""
    base = mean_std(plain.seconds)[0]
    rows = [TABLE_COLUMNS]
    for runs in (plain, spec):
        mean, std = mean_std(runs.seconds)
        rows.append((METHODS[runs.label], str(len(runs.seconds)), f"{mean:.3f} s", f"{std:.3f} s", f"{base / mean:.2f}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    cell = lambda i, text: text.ljust(widths[i]) if i == 0 else text.rjust(widths[i])  # noqa: E731
    lines = [" | ".join(cell(i, text) for i, text in enumerate(row)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def rejection_lines(spec):
    """Under the table: the rejections of all runs (0 when the target drafts for itself), by position."""
    total = pooled(spec.results)
    return (f"speculative sampling: {total['rejections']} rejections in {total['runs']} runs "
            f"({total['drafted']} drafts proposed, {total['accepted']} accepted)\n"
            f"accepted by draft position (i: rate): {by_position(total['by_position']) or 'no drafts'}")


def runs_json(runs, base_seconds=None):
    mean, std = mean_std(runs.seconds)
    doc = dict(num_runs=len(runs.seconds), seconds=runs.seconds, mean_seconds=mean, std_seconds=std,
               n_tokens=runs.n_tokens, tokens_per_second=runs.n_tokens / mean)
    return doc if base_seconds is None else {**doc, "speedup": base_seconds / mean}


def position_json(counts):
    return [dict(position=i, proposed=n, examined=e, accepted=a, rate=a / n if n else None)
            for i, (n, e, a) in enumerate(counts, 1)]


def write_json(path, header, plain, spec):
    """--json: the settings, each decoder's runs, and the speculative runs' pooled acceptance (per
    position) and the last run's statistics."""
    doc = {**header, "autoregressive": runs_json(plain)}
    if spec is not None:
        total = pooled(spec.results)
        doc["speculative"] = {**runs_json(spec, mean_std(plain.seconds)[0]), **total,
                              "by_position": position_json(total["by_position"]),
                              "last_run_stats": asdict(spec.results[-1].stats)}
    write_flag_file("--json", path, json.dumps(doc, indent=2, default=str) + "\n")  # a failed write names --json

