"""tree="auto" (decoding/tree_policy.AutoTree) against a cost model: many coin seeds in a second.

The chain simulator (policy_simulation.py) for token trees. A round's tree is drafted and checked
the way bench's forced tree drafter makes the real loop do it (bench/forced_tree_draft.py):

  * coins: u[i, r] ~ Uniform(0, 1), one per position i and sibling rank r, drawn once per seed as
    the bench draws them (so seed s replays the coins of the trees section's repeat s: its prompt
    of PROMPT_LEN tokens first); at depth d + 1 the children of the node on the accepted path are tried in rank order, and
    the child of rank r is accepted if u[i, r] < rates[d][r] (so with probability rates[d][r] given
    that its older siblings were not: tree_shape.py's a_{d+1,r}); rates[d][r] = min(1, alpha x
    ratio_r), the ratios measured on a real pair (RATIOS);
  * the policy sees what speculative.observe shows it: each examined node's overlap beta (1 where
    its first child was the target's token, else 0), each node tried (AutoTree's counts by depth and
    rank), the target call's size and seconds, the draft's seconds (none of them in the first round,
    whose call carries the prompt);
  * costs, in one-token target calls: a draft call per tree level, c; a target call over the root
    and the n drafted nodes, v(1 + n); a drafting round after plain ones, the draft's catch-up
    (policies.catch_up_cost). Plain decoding costs 1 a token.

The same arithmetic is tree_shape.tree_speedup's (o = 0), so a fixed shape scores its predicted
speedup on average; what AutoTree loses to the best fixed chain is what it pays for learning alpha,
the siblings' rates and v, and for the shapes its beliefs choose on the way.

>>> chain = simulate_tree_policy(FixedShape((1, 1, 1, 1)), alpha=1.0, c=0.1, v=EPYC_PANELS, n_tokens=50, seed=0)
>>> chain["shapes"], round(chain["speedup"], 3)  # 10 rounds of 5 tokens at 4 x 0.1 + v(5) = 0.4 + 1.07
({(1, 1, 1, 1): 10}, 3.401)

`python -m gpt2np.teach.tree_simulation` prints, for 124M -> 1558M on this EPYC's panels curve, 48
tokens, alpha 0.3-1: the best fixed chain, a few fixed trees and AutoTree (median and 10th percentile
over the seeds of its speedup over the best chain's median); --noise spiky gives the readings AutoTree
sees the one-sided spikes measured at 1558M (batch_simulation.SPIKES), --noise 0.12 a log-normal noise.
"""
import math
from types import SimpleNamespace

import numpy as np

from ..decoding.policies import Measurements, catch_up_cost
from ..decoding.speculative import observe, read_cost_shape
from ..decoding.tree_policy import AutoTree
from ..model.cost_probe import probe_repeats
from ..report import OneLineErrorParser
from .batch_simulation import MAX_TOKENS, log_noise, noise_arg
from .policy_simulation import probed_shape

RATIOS = (1.0, 0.662, 0.786, 0.308)  # a_r / a_0 by sibling rank, the bundled pair at T 0 (bench/trees_report.py's
                                     # default profile, `python -m bench.trees`): the bench's forced tree rates
EPYC_PANELS = {1: 1.0, **dict(enumerate(  # v(M), M = 2..16: the trees section's own timing at 1558M on panels (the Zen 4
    (0.96, 1.09, 1.10, 1.07, 1.07, 1.14, 1.21, 1.38, 1.49, 1.61, 1.57, 1.66, 1.70, 1.81, 1.74), start=2))}
    # EPYC, SkylakeX, PERFORMANCE.md "Token trees on panels"), 5 rows at 6 rows' cost as they run since session 42
C_EPYC = 0.105                       # the 124M draft's call over the 1558M target's one-token call (the same timing)
PROMPT_LEN = 8                       # the trees section's prompt: its coins for the output start at this row
TARGET_LAYERS = 48                   # 1558M's blocks: how many sizes the cost probe reads in a run's budget (ProbedTarget)
FIXED_TREES = ((2, 1), (3,), (3, 1), (2, 2, 1))


class FixedShape:
    """The same shape every round (a chain: widths of 1); () is plain decoding."""

    def __init__(self, widths):
        self.widths, self.name = tuple(widths), str(tuple(widths))

    def reset(self):
        pass

    def choose(self, past):
        return len(self.widths)

    def update(self, event):
        pass


class ProbedTarget:
    """The target's cost probe as a GPT2 of n_layer blocks reads it (model/cost_probe.py), for read_cost_shape:
    the sizes 1..M_max only where one reading of each fits the passes granted (probe_repeats), each read as
    policy_simulation.probed_shape reads it (the seed's noise)."""

    def __init__(self, v, seed, n_layer=TARGET_LAYERS):
        self.v, self.seed, self.n_layer = v, seed, n_layer

    def row_cost_shape(self, M_max, passes):  # -> {M: v_shape(M)}, M = 1..M_max, or None
        if not probe_repeats(self.n_layer, M_max, passes):
            return None
        return {M: x for M, x in probed_shape(self.v, self.seed).items() if M <= M_max}


def full_tree(widths):  # -> parents: node 0 the root (-1), then each level's nodes, widths[d] under every node above
    """The parents of a full tree of that shape, level by level (tree_drafts.DraftTree's order).

    >>> full_tree((2, 1)), full_tree((1, 1, 1))
    ((-1, 0, 0, 1, 2), (-1, 0, 1, 2))
    """
    parents, level = [-1], [0]
    for width in widths:
        parents += [parent for parent in level for _ in range(width)]
        level = list(range(len(parents) - width * len(level), len(parents)))
    return tuple(parents)


def play_round(widths, rates, coins, position):  # -> (parents, tried, overlaps, depth reached)
    """One full tree of `widths` drafted for output positions position, position + 1, ...: down the accepted
    path, each node's children tried in rank order until one passes its coin (greedy, forced coins)."""
    parents = full_tree(widths)
    children = {}
    for node, parent in enumerate(parents[1:], start=1):
        children.setdefault(parent, []).append(node)
    tried, overlaps, node = [], [], 0
    for d in range(len(widths)):
        u = coins[position + d]                                     # [ranks]
        overlaps.append(1.0 if u[0] < rates[d][0] else 0.0)         # beta at the node examined: its first child's
        for r, child in enumerate(children[node]):
            tried.append((child, bool(u[r] < rates[d][r])))
            if tried[-1][1]:
                break
        else:
            return parents, tried, overlaps, d                      # every child rejected: d drafts accepted
        node = child
    return parents, tried, overlaps, len(widths)


def simulate_tree_policy(policy, alpha, c, v, n_tokens, seed, ratios=RATIOS, probe=True, prompt_len=PROMPT_LEN,
                         n_layer=TARGET_LAYERS, noise=None):
    """Run `policy` (AutoTree, or FixedShape) for n_tokens: {"speedup" over plain decoding, "shapes": rounds
    by shape (() plain), "rounds": target calls}. probe: the target reads its curve's shape before the run as
    a GPT2 of n_layer blocks does for a policy that asks (AutoTree's cost_sizes: read_cost_shape, on a
    ProbedTarget, within the run's budget); prompt_len: the bench's prompt, whose rows of coins its output
    skips (the trees section's repeat `seed` replayed). noise: None, every reading the policy sees is the
    true cost; a log-standard deviation, or "spiky" (batch_simulation.SPIKES: late far more often than
    early, as this EPYC's 1558M rounds read), for the target call's and the draft's reading each round,
    drawn from the seed's own second stream (the coins and the run's cost stay as they are)."""
    depth = max(getattr(policy, "K_max", 0), len(getattr(policy, "widths", ())), 1)
    rates = [[min(1.0, alpha * ratio) for ratio in ratios]] * depth  # [depth][ranks]
    coins = np.random.default_rng(seed).random((prompt_len + n_tokens + depth, len(ratios)))[prompt_len:]  # [n, R]
    readings, log = np.random.default_rng([seed, 1]), log_noise(noise)
    seen = (lambda x: x * math.exp(log(readings))) if log else (lambda x: x)  # what the policy reads of x
    past = Measurements(c_prior=c)
    past.v_shape = read_cost_shape(ProbedTarget(v, seed, n_layer), policy, n_tokens)[0] if probe else None
    policy.reset()
    emitted, cost, shapes = 0, 0.0, {}
    while emitted < n_tokens:
        past.tokens_left = n_tokens - emitted
        K = policy.choose(past)
        widths = tuple(policy.widths)[:min(K, n_tokens - emitted - 1)] if K else ()  # clamped: never past n_tokens
        parents, tried, overlaps, reached = play_round(widths, rates, coins, emitted)
        n = len(parents) - 1
        debt = catch_up_cost(c, v, past.owed) if n else 0.0
        seconds = len(widths) * c + v[1 + n] + debt
        proposed, checked = seen(len(widths) * c), seen(v[1 + n])  # as the policy reads them (noise None: as they are)
        event = SimpleNamespace(parents=parents if n else (), tried=tried, drafts=[0] * n, tokens=[0] * (reached + 1),
                                overlaps=overlaps, propose_seconds=proposed, seconds=proposed + checked + debt)
        policy.update(event)
        observe(past, event, SimpleNamespace(durations={1 + n: [checked]}), first_round=not shapes)
        shapes[widths] = shapes.get(widths, 0) + 1
        emitted, cost = emitted + reached + 1, cost + seconds
    return {"speedup": n_tokens / cost, "shapes": shapes, "rounds": sum(shapes.values())}


def compare(alpha, c, v, n_tokens, seeds, K_max=8, policy=lambda: AutoTree(8), trees=FIXED_TREES, noise=None):
    """{"best": the fixed chain with the best median speedup, "trees": each fixed tree's median over the best's,
    "ratios": the policy's speedup over the best chain's median, seed by seed (sorted)}; noise: the readings'
    (simulate_tree_policy: a fixed shape reads nothing, so only the policy's runs change)."""
    def medians(widths):
        return float(np.median([simulate_tree_policy(FixedShape(widths), alpha, c, v, n_tokens, s)["speedup"]
                                for s in seeds]))
    chains = {K: medians((1,) * K) for K in range(1, K_max + 1)}
    best = max(chains, key=chains.get)
    mine = [simulate_tree_policy(policy(), alpha, c, v, n_tokens, s, noise=noise)["speedup"] / chains[best]
            for s in seeds]
    return {"best": best, "best_median": chains[best], "trees": {w: medians(w) / chains[best] for w in trees},
            "ratios": sorted(mine)}


def main(argv=None):
    p = OneLineErrorParser(prog="python -m gpt2np.teach.tree_simulation", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=100, help="coin seeds per alpha (default: 100)")
    p.add_argument("--tokens", type=int, default=48, help="tokens per run (default: 48, as the trees runs in PERFORMANCE.md: "
                   "python -m bench --sections trees --tree-tokens 48; the bench's own --tree-tokens default is 32; "
                   f"at most {MAX_TOKENS})")
    p.add_argument("--noise", type=noise_arg, default=None, help="the readings auto sees: a log-standard deviation, "
                   "or 'spiky' for one-sided spikes as measured at 1558M (batch_simulation.SPIKES); default: none")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.tokens < 2:
        p.error(f"--seeds must be at least 1 and --tokens at least 2, got {args.seeds} and {args.tokens}")
    if args.tokens > MAX_TOKENS:  # 99999999999: a MemoryError
        p.error(f"--tokens {args.tokens} is too many: at most {MAX_TOKENS} (a GPT-2 run's, within its context)")
    print(f"124M -> 1558M, this EPYC's panels curve (c {C_EPYC}), {args.tokens} tokens, {args.seeds} seeds, "
          f"readings {args.noise or 'exact'}: speedups over the best fixed chain's median")
    print("| alpha | best chain | " + " | ".join(map(str, FIXED_TREES)) + " | auto: median | 10 % of seeds |")
    print("| --- " * (4 + len(FIXED_TREES)) + "|")
    for alpha in (0.3, 0.5, 0.8, 1.0):
        r = compare(alpha, C_EPYC, EPYC_PANELS, args.tokens, range(args.seeds), noise=args.noise)
        ratios = r["ratios"]
        print(f"| {alpha} | K={r['best']} ({r['best_median']:.2f}x) | "
              + " | ".join(f"{x:.2f}" for x in r["trees"].values())
              + f" | {np.median(ratios):.3f} | {ratios[len(ratios) // 10]:.3f} |")


if __name__ == "__main__":
    main()
