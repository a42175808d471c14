"""Generation as a stream of rounds: what main.py, the console and the server show while it happens.

A decoder (plain or speculative) is a Python generator that yields one `RoundEvent` per round;
`Stream` wraps it so a consumer can print tokens as they arrive, stop early, and read the whole
result at the end. The list-returning functions (`generate`, `speculative_generate`) are this
stream run to its end, so there is one loop per decoder, not two.

    for event in stream:       # one round at a time
        print(event.tokens, event.provenance)
    stream.result              # the decoder's return value, once the stream is exhausted

A plain decoding step is a round too: one token, provenance "target", no drafts.

>>> def rounds():
...     yield RoundEvent(tokens=[7], provenance=["target"], K=0, n_emitted=1)
...     return "done"
>>> s = Stream(rounds())
>>> [e.tokens for e in s], s.tokens, s.result
([[7]], [7], 'done')
"""
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundEvent:
    """One round: the tokens it emitted, where each came from, what the kernel decided, what it cost.

    The one round type: the stream yields it, the K policies learn from it, the run's statistics
    sum it, and speculative_generate(..., trace=True) keeps it (then with the full rows q and p).

    A round may draft a token tree (speculative.py, tree=): a chain is the tree with one child per
    node, and every field below means the same for both; parents, path and tried describe the tree.
    """
    tokens: list                  # tokens emitted this round (1 .. depth+1): accepted drafts, then the target's
    provenance: list              # per token: "draft" / "resample" / "bonus" / "target" (no drafts)
    K: int                        # drafts proposed this round: at most the K asked for (0: a plain target step,
                                  # also when prompt lookup found nothing to propose); a tree: its nodes
    n_emitted: int                # tokens emitted so far, this round included
    drafts: list = field(default_factory=list)       # x_1..x_k the drafter proposed (k <= K); a tree: its
                                                     # nodes 1..K in level order (node i is drafts[i - 1])
    decisions: list = field(default_factory=list)    # accept (True) / reject (False) per examined position
                                                     # (a tree: per depth, True if one of the children was)
    q_at_drafts: list = field(default_factory=list)  # q_i(x_i) per draft (a tree: q after the node's parent)
    p_at_drafts: list = field(default_factory=list)  # p_i(x_i) per draft (a tree: p after the node's parent)
    overlaps: list = field(default_factory=list)     # beta_i = sum_x min(p_i, q_i) per examined position (Thm 3.5;
                                                     # a tree: with q the law of the node's first child)
    q: object = None              # [k, n_vocab] draft distributions (trace=True only; a tree: [K+1], per node)
    p: object = None              # [k+1, n_vocab] target distributions (trace=True only; a tree: per node)
    propose_seconds: float = 0.0  # wall time of Step 1 (the drafter), sampling and Python included
    seconds: float = 0.0          # wall time of the round
    parents: tuple = ()           # the drafted tree: node 0 is the context's newest token (-1), node i >= 1 is
                                  # drafts[i - 1] and parents[i] its parent; a chain (-1, 0, 1, ..., k-1)
    path: tuple = ()              # the accepted nodes, the root's child first (a chain: 1, ..., n accepted)
    tried: tuple = ()             # (node, accepted?) per child the kernel tested, in order: acceptance by depth
                                  # and sibling rank (run_stats.acceptance_by_rank)


class Stream:
    """Iterate over a decoder's rounds; `.tokens` / `.provenance` so far; `.result` at the end.

    `close()` stops the decoder where it is (a client left, the user pressed Ctrl-C): nothing
    after the last yielded round runs, and `.result` stays None. Once done, iterating again yields
    nothing and keeps `.result`; run() returns it again. A stream closed, or whose decoder raised
    (Ctrl-C in a round), cannot go on: iterating or run() is a one-line ValueError saying so (it
    ended as if done, with `.result` None); `.tokens` keeps what it emitted.
    """

    def __init__(self, rounds):
        self._rounds = rounds
        self.tokens, self.provenance, self.result, self.done = [], [], None, False
        self.stopped = None  # why it cannot go on: "closed", or the exception its decoder raised

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:  # iterated again: an exhausted generator would end with None and lose the result
            raise StopIteration(self.result)
        if self.stopped is not None:
            raise ValueError(f"this stream {self.stopped} before it finished and cannot go on: start a new one "
                             f"(.tokens holds the {len(self.tokens)} tokens it emitted)")
        try:
            event = next(self._rounds)
        except StopIteration as stop:
            self.result, self.done = stop.value, True
            raise
        except BaseException as e:
            self.stopped = f"stopped with {type(e).__name__}"
            raise
        self.tokens += event.tokens
        self.provenance += event.provenance
        return event

    def close(self):
        if not self.done and self.stopped is None:
            self.stopped = "was closed"
        self._rounds.close()

    def run(self):
        """Consume every round; return the decoder's result (again, if it already ran to its end)."""
        for _ in self:
            pass
        return self.result
