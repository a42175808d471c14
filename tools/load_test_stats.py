"""The serving measures of tools/load_test.py, as pure functions of what each request recorded, and its tables.

Names and definitions follow vLLM's serving benchmark (benchmarks/benchmark_serving.py):
  request throughput        completed requests / the level's wall time (req/s)
  output token throughput   output tokens of the completed requests / the level's wall time (tok/s)
  TTFT   time to first token: request sent -> first chunk that carries a token (streamed requests only)
  TPOT   time per output token after the first: (E2EL - TTFT) / (n_out - 1), per streamed request, n_out > 1
  ITL    inter-token latency: the gaps between successive token-carrying chunks, pooled over requests
         (a chunk is one decoding round: with drafting it carries several tokens, as vLLM's chunks do)
  E2EL   end-to-end latency: request sent -> last byte (every completed request)
each as mean, p50 and p99 (percentiles interpolated linearly between order statistics, numpy's default).

Speculative measures, also as vLLM names them (its spec-decode metrics), from the rounds the server
reports (a round = one target call; `drafts` proposed, `decisions` accept/reject per examined draft):
  acceptance rate           accepted drafts / proposed drafts
  mean accepted length      1 + accepted drafts / drafting rounds (tokens per target call of those rounds)
  per-position acceptance   accepted i-th drafts / drafting rounds, for i = 1, 2, ...
"""
import math


def percentile(values, q):
    """The q-th percentile (0 <= q <= 100), linear between order statistics; None for no values.

    >>> percentile([4, 1, 3, 2], 50), round(percentile([1, 2, 3, 4], 99), 2)
    (2.5, 3.97)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)  # 0 .. n-1, fractional
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values):
    """{"n", "mean", "p50", "p99"} of a list of numbers (None where there are none).

    >>> summary([1.0, 3.0])
    {'n': 2, 'mean': 2.0, 'p50': 2.0, 'p99': 2.98}
    """
    values = [v for v in values if v is not None]
    mean = sum(values) / len(values) if values else None
    return {"n": len(values), "mean": mean, "p50": percentile(values, 50), "p99": percentile(values, 99)}


def tpot(e2e, ttft, n_out):
    """Time per output token after the first; None without a first token or with fewer than 2 tokens.

    >>> tpot(1.0, 0.2, 5)
    0.2
    """
    if ttft is None or n_out is None or n_out < 2:
        return None
    return (e2e - ttft) / (n_out - 1)


def inter_token_latencies(arrivals):
    """Gaps between successive token-carrying chunks, from their arrival times (seconds).

    >>> inter_token_latencies([0.5, 0.75, 1.5])
    [0.25, 0.75]
    """
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def request_measures(record):
    """TTFT, TPOT, E2EL and ITLs of one completed request (a dict from load_test.one_request).

    record: "start", "end" (perf_counter seconds), "stream", "n_out", "arrivals" (token-carrying
    chunks' arrival times, streamed requests only).
    """
    arrivals = record.get("arrivals") or []
    e2e = record["end"] - record["start"]
    ttft = arrivals[0] - record["start"] if record["stream"] and arrivals else None
    return {"ttft": ttft, "tpot": tpot(e2e, ttft, record["n_out"]), "e2el": e2e,
            "itl": inter_token_latencies(arrivals)}


def speculative_measures(rounds):
    """Acceptance rate, mean accepted length and per-position acceptance from the rounds' "drafts"
    and "decisions"; None when no round drafted (target only).

    >>> speculative_measures([{"drafts": [5, 6], "decisions": [True, False]}, {"drafts": [7, 8], "decisions": [False]},
    ...                       {"drafts": [], "decisions": []}])
    {'drafted': 4, 'accepted': 1, 'drafting_rounds': 2, 'acceptance_rate': 0.25, 'mean_accepted_length': 1.5, \
'per_position_acceptance': [0.5, 0.0]}
    """
    drafting = [r for r in rounds if r.get("drafts")]
    if not drafting:
        return None
    drafted = sum(len(r["drafts"]) for r in drafting)
    accepted = sum(sum(bool(d) for d in r["decisions"]) for r in drafting)
    depth = max(len(r["drafts"]) for r in drafting)
    per_position = [sum(len(r["decisions"]) > i and bool(r["decisions"][i]) for r in drafting) / len(drafting)
                    for i in range(depth)]
    return {"drafted": drafted, "accepted": accepted, "drafting_rounds": len(drafting),
            "acceptance_rate": accepted / drafted, "mean_accepted_length": 1 + accepted / len(drafting),
            "per_position_acceptance": per_position}


def outcome(record):
    """served (200, read to the end), busy (429), server_error (>= 500, or a 200 that broke off: a streamed
    error event, an unreadable body), error (another status, or no answer at all)."""
    status = record["status"]
    if status == 200 and record["message"] is None:
        return "served"
    if status == 429:
        return "busy"
    return "server_error" if status is not None and (status >= 500 or status == 200) else "error"


def count_outcomes(records, max_tokens):
    """How the level's requests ended: served, busy (429), server errors (>= 500 or a streamed error
    event), other errors (another status, a broken connection), and served with n_out != max_tokens."""
    served = [r for r in records if r["outcome"] == "served"]
    return {"sent": len(records), "served": len(served),
            "busy": sum(r["outcome"] == "busy" for r in records),
            "server_errors": sum(r["outcome"] == "server_error" for r in records),
            "errors": sum(r["outcome"] == "error" for r in records),
            "short": sum(r["n_out"] != max_tokens for r in served),
            "busy_retries": sum(r.get("busy_retries", 0) for r in records)}


def level_summary(records, duration, max_tokens):
    """Everything reported for one concurrency level: counts, throughputs, TTFT/TPOT/ITL/E2EL summaries
    and the speculative measures, over the records of its requests and its wall time (seconds)."""
    served = [r for r in records if r["outcome"] == "served"]
    measures = [request_measures(r) for r in served]
    output_tokens = sum(r["n_out"] for r in served)
    return {**count_outcomes(records, max_tokens), "duration_s": duration, "output_tokens": output_tokens,
            "request_throughput": len(served) / duration if duration > 0 else None,
            "output_token_throughput": output_tokens / duration if duration > 0 else None,
            "ttft_s": summary([m["ttft"] for m in measures]), "tpot_s": summary([m["tpot"] for m in measures]),
            "itl_s": summary([gap for m in measures for gap in m["itl"]]),
            "e2el_s": summary([m["e2el"] for m in measures]),
            "speculative": speculative_measures([x for r in served for x in r.get("rounds", [])])}


def request_row(record):
    """What the JSON keeps of one request: its outcome and measures, not the text."""
    row = {k: record[k] for k in ("client", "prompt", "stream", "outcome", "status", "n_out", "busy_retries",
                                  "message")}
    return {**row, **(request_measures(record) if record["outcome"] == "served" else {})}


def ms(x):  # seconds -> milliseconds for the tables; "-" for nothing measured
    return "-" if x is None else f"{1000 * x:.1f}"


def level_table(name, s):
    """One configuration at one concurrency (a level's summary, as measure() builds it), as lines of text."""
    retried = f" (retried {s['busy_retries']}x)" if s["busy_retries"] else ""
    lines = [f"== {name} | concurrency {s['concurrency']}: {s['sent']} requests ({s['streamed']} streamed), "
             f"{s['max_tokens']} tokens each ==",
             f"served {s['served']}, busy (429) {s['busy']}{retried}, server errors (>=500) {s['server_errors']}, "
             f"other errors {s['errors']}, not {s['max_tokens']} tokens {s['short']}, differ from alone {s['differ']}",
             f"duration {s['duration_s']:.2f} s, request throughput {s['request_throughput'] or 0:.2f} req/s, "
             f"output token throughput {s['output_token_throughput'] or 0:.1f} tok/s",
             f"{'':6}{'mean ms':>10}{'p50 ms':>10}{'p99 ms':>10}{'n':>7}"]
    for label, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2EL", "e2el_s")):
        m = s[key]
        lines.append(f"{label:6}{ms(m['mean']):>10}{ms(m['p50']):>10}{ms(m['p99']):>10}{m['n']:>7}")
    spec = s["speculative"]
    lines.append("speculative: none (no round drafted)" if spec is None else
                 f"speculative: acceptance rate {spec['acceptance_rate']:.3f}, mean accepted length "
                 f"{spec['mean_accepted_length']:.2f}, per position " +
                 " ".join(f"{a:.2f}" for a in spec["per_position_acceptance"]))
    return lines


OVERVIEW = (("conc", 5, lambda lv: lv["concurrency"]), ("served", 7, lambda lv: lv["served"]),
            ("busy", 5, lambda lv: lv["busy"]), (">=500", 6, lambda lv: lv["server_errors"]),
            ("req/s", 8, lambda lv: f"{lv['request_throughput'] or 0:.2f}"),
            ("tok/s", 8, lambda lv: f"{lv['output_token_throughput'] or 0:.1f}"),
            ("TTFT p50", 9, lambda lv: ms(lv["ttft_s"]["p50"])), ("TPOT p50", 9, lambda lv: ms(lv["tpot_s"]["p50"])),
            ("ITL p50", 8, lambda lv: ms(lv["itl_s"]["p50"])), ("E2EL p50", 9, lambda lv: ms(lv["e2el_s"]["p50"])),
            ("E2EL p99", 9, lambda lv: ms(lv["e2el_s"]["p99"])))


def overview(results):
    """One row per configuration and level (times in ms); "vs 1st": output tok/s over the first
    configuration's at the same concurrency."""
    first = {lv["concurrency"]: lv["output_token_throughput"] for lv in results[0]["levels"]} if results else {}
    width = max([len("configuration")] + [len(r["name"]) for r in results]) + 1
    lines = [f"{'configuration':<{width}}" + "".join(f"{h:>{w}}" for h, w, _ in OVERVIEW) + f"{'vs 1st':>8}"]
    for r in results:
        for lv in r["levels"]:
            base = first.get(lv["concurrency"])
            ratio = f"{lv['output_token_throughput'] / base:.2f}" if base and lv["output_token_throughput"] else "-"
            lines.append(f"{r['name']:<{width}}" + "".join(f"{cell(lv)!s:>{w}}" for _, w, cell in OVERVIEW) +
                         f"{ratio:>8}")
    return lines
