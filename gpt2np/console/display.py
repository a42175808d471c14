"""What the console prints about its runs: one speculative round in the debug trace, and the
runs of one prompt side by side. Pure formatting: events and Runs in, text out.

The trace shows Leviathan et al.'s acceptance rule (Algorithm 1; speculative_kernel.py) at work:
draft x is accepted with probability min(1, p(x) / q(x)), p the target's distribution, q the
draft's. At temperature 0 both are one-hot (argmax), so the probability is 1 or 0. Prompt lookup
(the ngram drafter) proposes with certainty: q(x) = 1, so x is accepted with probability p(x).

A token tree (tree_kernel.py) is traced by the nodes the kernel tried (RoundEvent.tried), in the
order it tried them, never by every drafted node: a sibling tried after a rejected one is tested
against the target's residual (and, without replacement, q without the rejected tokens), not the
p(x) and q(x) shown, so its line says so instead of min(1, p/q); at temperature 0 every node is
accepted when it is the target's argmax (p one-hot: min(1, p/q) is 1 or 0 where q(x) > 0). The
round ends with a bonus only when the accepted path reached a leaf, else with the target's
resample after the last node's children were rejected.
"""


def token_label(tokenizer, token):
    """A token as the trace shows it: its text, quoted, escapes visible ('\\n')."""
    return repr(tokenizer.decode_bytes([token]).decode("utf-8", errors="replace"))


def trace_lines(event, n_round, tokenizer, greedy=False, no_drafts="K=0"):
    """One speculative round for the debug trace: the drafts, each accept / reject, the last token.
    greedy (temperature 0): a tree's later siblings face the argmax too, not a residual. no_drafts: why
    a round may draft nothing ("K=0", or "prompt lookup found no match": the stream says K 0 for both)."""
    label = lambda t: token_label(tokenizer, t)  # noqa: E731
    first = event.n_emitted - len(event.tokens) + 1
    head = f"  round {n_round} (tokens {first}-{event.n_emitted}): "
    if not event.drafts:  # a plain step: K = 0 chosen, or prompt lookup found nothing to propose
        return [head + f"no drafts ({no_drafts}), target token {label(event.tokens[-1])}"]
    if not is_chain(event.parents):
        return [head + f"tree of {len(event.drafts)} nodes, drafted "
                + " ".join(f"{i}:{label(x)}" for i, x in enumerate(event.drafts, 1)),
                *tree_trace_lines(event, label, greedy)]
    lines = [head + f"K={len(event.drafts)}, drafted " + " ".join(label(t) for t in event.drafts)]
    for x, p, q, accepted in zip(event.drafts, event.p_at_drafts, event.q_at_drafts, event.decisions):
        lines.append(f"    {label(x):<8} p(x)={p:.4f}  q(x)={q:.4f}  min(1, p/q)={min(1.0, p / q):.4f}  "
                     + ("accepted" if accepted else "rejected"))
    kind = event.provenance[-1]
    lines.append(f"    {kind} {label(event.tokens[-1])}" + ("  (all drafts accepted)" if kind == "bonus" else ""))
    return lines


def is_chain(parents):
    """A chain's parents are (-1, 0, 1, ..., k-1); an event without them (built by hand) is one too."""
    return tuple(parents) in ((), tuple(range(-1, len(parents) - 1)))


def tree_trace_lines(event, label, greedy):
    """A tree round's tried nodes, in the order the kernel tried them, then its last token."""
    lines, previous = [], None
    where = lambda node: "the root" if node == 0 else f"node {node}"  # noqa: E731  (0: the context's newest token)
    for node, accepted in event.tried:
        x, p, q, parent = event.drafts[node - 1], event.p_at_drafts[node - 1], event.q_at_drafts[node - 1], \
            event.parents[node]
        later_sibling = previous is not None and event.parents[previous] == parent  # one was rejected before it
        test = ("tested against the residual" if later_sibling and not greedy
                else f"min(1, p/q)={min(1.0, p / q):.4f}" if q > 0 else "argmax test")  # q 0: greedy's later siblings
        lines.append(f"    node {node} {label(x):<8} (under {where(parent)})  p(x)={p:.4f}  q(x)={q:.4f}  {test}  "
                     + ("accepted" if accepted else "rejected"))
        previous = node
    kind, last = event.provenance[-1], event.path[-1] if event.path else 0
    why = {"bonus": f"  ({where(last)} is a leaf: its path accepted)",
           "resample": f"  (every child of {where(last)} rejected)"}.get(kind, "")
    lines.append(f"    {kind} {label(event.tokens[-1])}{why}")
    return lines


def speedup_table(runs, greedy):
    """The generators of one prompt side by side: throughput against target-only when it ran and,
    at temperature 0, whether each text equals its model's (the draft's rows: draft-only's)."""
    by_label = {r.label: r for r in runs}
    base = by_label.get("target-only")
    width = max(len(r.label) for r in runs)
    lines = [f"{'generator':<{width}}  tokens  seconds  tokens/s" + "  vs target-only" * bool(base)
             + "  text" * greedy]
    for r in runs:
        line = f"{r.label:<{width}}  {len(r.tokens):>6}  {r.seconds:>7.3f}  {r.tokens_per_second:>8.1f}"
        line += f"  {r.tokens_per_second / base.tokens_per_second:>14.2f}x" if base else ""
        same_as = by_label.get("draft-only" if r.label.startswith("draft-only") else "target-only")
        if greedy and same_as is not None and same_as is not r:
            line += f"  = {same_as.label}" if r.tokens == same_as.tokens else f"  DIFFERS from {same_as.label}"
        lines.append(line)
    return "\n".join(lines)
