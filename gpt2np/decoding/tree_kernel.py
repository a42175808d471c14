"""One round of token-tree verification: walk down the tree, trying each node's children in turn.

SpecInfer (Miao et al. 2024, "SpecInfer: Accelerating Large Language Model Serving with Tree-based
Speculative Inference and Verification"), its stochastic verification, multi-step speculative
sampling (MSS); Multi-Candidate Speculative Decoding (Yang et al. 2024), the same rule for
candidates drawn with and without replacement; Recursive Speculative Decoding (Jeon et al. 2024),
"recursive rejection sampling" of siblings drawn without replacement. Notation as in
speculative_kernel.py (Leviathan et al.), which this file generalises:

    p          the TARGET's distribution (what we must sample from); Chen et al. and Miao et al.'s
               papers use other letters, the meaning is the same
    q          the DRAFT's distribution a node's children x_1..x_m were drawn from (tree_drafts.py)
    q_j        the law sibling x_j was drawn from: q (with replacement), or q without x_1..x_{j-1},
               renormalised (without replacement), or given per node (DraftTree.drawn_from:
               one-hot for candidates proposed with certainty, as prompt lookup's)
    p_j        the target's distribution as it stands when sibling j is tried: p_1 = p, then the
               residual after each rejection

At a node (the root first: the context's newest token) with children x_1..x_m:

    Step 3'  for j = 1..m: accept x_j with probability min(1, p_j(x_j) / q_j(x_j));
             accepted: emit x_j, move to that child, start again there with ITS p (and q)
             rejected: p_{j+1} = norm(max(0, p_j - q_j))                      (the residual)
    Step 4'  every child rejected: t ~ p_{m+1}                                ("resample")
             a leaf reached (no children): t ~ its p                          ("bonus")
    emitted: the accepted path's tokens, then t

With m = 1 at every node this is speculative_kernel.verify_round, coin for coin (tests check it).
Greedy (temperature 0): follow the child equal to argmax p as deep as it goes, then emit argmax p
there: the target's own greedy tokens, no randomness drawn.

Why it is exact, at one node (the one-node proof; `node_output_distribution` runs it). Induction
on m. Trying x_1 ~ q_1 against p_1 is one position of speculative sampling: x is accepted with
probability min(p_1, q_1)(x), and the rejection mass 1 - sum min(p_1, q_1) = sum max(0, p_1 - q_1).
The residual p_2 = norm(max(0, p_1 - q_1)) does NOT depend on which x_1 was rejected (only the
next proposal q_2 does, without replacement), and by the induction hypothesis the remaining m - 1
siblings emit exactly p_2 whatever their proposal. So
    P(emit x) = min(p_1, q_1)(x) + (sum_y max(0, p_1 - q_1)(y)) p_2(x)
              = min(p_1, q_1)(x) + max(0, p_1 - q_1)(x) = p_1(x),
and with m = 0, t ~ p_1 directly. Below the node, an accepted child x continues with the target's
distribution given x; so a round's tokens are a prefix of a sample from the target, cut where a
residual token is drawn. Two things must match the drafting: the q_j in the test must be the law
x_j was really drawn from (a without-replacement tree through the with-replacement rule is wrong:
broken_tree_kernels.py), and every sibling after a rejection must be tested against the updated
residual (testing each against the original p is wrong too).

Without replacement, a rejected x_j has p_{j+1}(x_j) = 0 (it was rejected, so p_j(x_j) < q_j(x_j)),
and x_j is out of q_{j+1} too: no probability is lost by never proposing it again (Jeon et al.).

>>> from gpt2np.decoding.tree_drafts import DraftTree
>>> p = np.array([[0.0, 0.7, 0.3], [0.9, 0.1, 0.0], [0.5, 0.5, 0.0]])   # target at nodes 0, 1, 2
>>> q = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])   # node 0's children ~ q[0]
>>> tree = DraftTree(tokens=(2, 0, 1), parents=(-1, 0, 0), q=q, replacement=False)
>>> verify_tree(tree, p, rng=None, greedy=True)    # argmax p[0] = 1 is node 2: accepted, a leaf
TreeRoundResult(path=(2,), tokens=(1, 0), kind='bonus', tried=((1, False), (2, True)))
>>> node_output_distribution(p[0], q[0], m=2, replacement=False).round(12).tolist()
[0.0, 0.7, 0.3]
"""
from dataclasses import dataclass

import numpy as np

from .speculative_kernel import accept_draft, residual_distribution, target_token
from .tree_drafts import without_tokens


@dataclass(frozen=True)
class TreeRoundResult:
    path: tuple    # the accepted nodes, the root's child first (node indices of the tree)
    tokens: tuple  # emitted: the accepted nodes' tokens, then t, the target's token
    kind: str      # "resample" (t after every child of the last node was rejected) or "bonus" (at a leaf)
    tried: tuple   # (node, accepted?) for every child tested, in order: acceptance by depth and sibling rank

    @property
    def provenance(self):  # one per emitted token, as speculative.py names them
        return ["draft"] * len(self.path) + [self.kind]


def sibling_proposals(tree, node, kids):  # -> m rows [n_vocab]: q_1..q_m of node's children
    """The law each child was drawn from: drawn_from's rows where the tree gives them, else from q."""
    if tree.drawn_from is not None:
        return [tree.drawn_from[c] for c in kids]
    return proposals_from_q(tree.q[node], [tree.tokens[c] for c in kids], tree.replacement)


def proposals_from_q(q, tokens, replacement):  # [n_vocab], [m] -> m rows [n_vocab]
    """q_1..q_m, the law each sibling was drawn from: q every time (with replacement), or q without
    the siblings drawn before it, renormalised (without). q_1 is q itself either way."""
    return [q if replacement or j == 0 else without_tokens(q, tokens[:j]) for j in range(len(tokens))]


def try_children(p, proposals, tokens, rng):  # -> (j of the accepted child or None, p_{j} or p_{m+1})
    """Step 3' at one node: x_j accepted with probability min(1, p_j(x_j) / q_j(x_j)), and after
    each rejection p_{j+1} = norm(max(0, p_j - q_j)). Returns the accepted child's index (None when
    all m were rejected) and the target's distribution as it then stands."""
    for j, (x, q_j) in enumerate(zip(tokens, proposals)):
        if accept_draft(p[x], q_j[x], rng):
            return j, p
        p = residual_distribution(p, q_j)
    return None, p


def greedy_child(p, tokens):  # -> j of the first child equal to argmax p, or None
    best = int(np.argmax(p))
    return next((j for j, x in enumerate(tokens) if x == best), None)


def verify_tree(tree, p, rng, greedy=False, node_rule=try_children):  # -> TreeRoundResult
    """Steps 3'-4' over a whole tree: walk down from the root, trying each node's children in turn.

    tree: a DraftTree (tokens, parents, q, replacement); p [n, n_vocab]: the target's distribution
    after each node's path (after the same temperature / top-k / top-p as q), p[0] after the context.
    greedy=True is temperature 0: no randomness drawn, rng may be None. node_rule exists for
    teaching: pass a broken one (teach/broken_tree_kernels.py) and watch the exact tests fail.
    """
    if len(p) != len(tree.tokens):
        raise ValueError(f"need one target row per node: {len(p)} rows for {len(tree.tokens)} nodes")
    children = tree.children()
    node, path, tried = 0, [], []
    while children[node]:
        kids = children[node]
        tokens = [tree.tokens[c] for c in kids]
        if greedy:
            j, p_now = greedy_child(p[node], tokens), p[node]
        else:
            j, p_now = node_rule(p[node], sibling_proposals(tree, node, kids), tokens, rng)
        n_tried = len(kids) if j is None else j + 1
        tried += [(kids[i], i == j) for i in range(n_tried)]
        if j is None:                                    # Step 4': every child rejected
            return finish(tree, path, target_token(p_now, rng, greedy), "resample", tried)
        node = kids[j]
        path.append(node)
    return finish(tree, path, target_token(p[node], rng, greedy), "bonus", tried)  # Step 4': a leaf


def finish(tree, path, t, kind, tried):
    return TreeRoundResult(tuple(path), tuple(tree.tokens[i] for i in path) + (int(t),), kind, tuple(tried))


def chain_round_result(drafts, result):  # speculative_kernel.RoundResult -> TreeRoundResult
    """A chain's result as its tree's (node i is x_i): what verify_tree gives on that chain, coin for coin.

    >>> from gpt2np.decoding.speculative_kernel import RoundResult
    >>> chain_round_result([4, 5], RoundResult(n_accepted=1, next_token=7, kind="resample"))
    TreeRoundResult(path=(1,), tokens=(4, 7), kind='resample', tried=((1, True), (2, False)))
    """
    path = tuple(range(1, result.n_accepted + 1))
    rejected = ((result.n_accepted + 1, False),) if result.kind == "resample" and drafts else ()
    return TreeRoundResult(path, tuple(drafts[:result.n_accepted]) + (int(result.next_token),), result.kind,
                           tuple((node, True) for node in path) + rejected)


def examined_nodes(result):  # -> the nodes whose children were tried: the root, then the path (not a leaf)
    nodes = (0, *result.path)
    return nodes if result.kind == "resample" else nodes[:-1]


def node_law(tree, node):  # -> [n_vocab]: the law node was drawn from (before its earlier siblings left it)
    return tree.drawn_from[node] if tree.drawn_from is not None else tree.q[tree.parents[node]]


def node_output_distribution(p, q, m, replacement):  # [n_vocab], [n_vocab] -> [n_vocab]
    """The exact law of the token one node emits when its m children are drawn from q and tried
    in turn (the module docstring's proof, as a recursion over the first child x_1 ~ q):

        P(x) = min(p, q)(x)                                       x_1 = x, accepted
             + sum_y q(y) (1 - min(1, p(y)/q(y))) P'(x)           x_1 = y, rejected
    where P' is the law of the same node with p' = norm(max(0, p - q)), the next proposal (q, or
    q without y) and m - 1 children; P' = p' by induction, so P = p. Tests check it for random
    p, q, m, and the kernel itself by enumeration.
    """
    if m == 0 or q is None:  # no children left (or, without replacement, no token left to draw)
        return p
    accepted = np.minimum(p, q)            # q(x) min(1, p(x)/q(x)), 0 where q(x) = 0
    residual = residual_distribution(p, q)
    law = accepted.copy()
    for y in np.flatnonzero(q > accepted):  # the tokens whose draw can be rejected
        next_q = q if replacement else without_tokens(q, [y])
        law += (q[y] - accepted[y]) * node_output_distribution(residual, next_q, m - 1, replacement)
    return law
