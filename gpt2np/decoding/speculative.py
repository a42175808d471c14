"""Speculative decoding: a cheap drafter proposes K tokens, the target checks them in one call.

Leviathan et al. 2023 (Algorithm 1) = Chen et al. 2023 (Algorithm 2); the verification rule, the
notation (p = target, q = draft) and the proof sketch are in speculative_kernel.py. This file is
the loop around it: the target and its KV cache, a drafter (drafters.py: a draft model, or prompt
lookup), a K policy (policies.py), and the bookkeeping that makes the output exact. The loop is a
generator of rounds (stream.py): `speculative_stream` yields each round as it happens,
`speculative_generate` runs it to the end.

Cache invariant. Let `context` be the prompt plus every token emitted so far. Between rounds:
  * the target cache holds context[:-1] exactly: the newest token has not been fed yet;
  * a draft model's cache holds a prefix of context[:-1], and catches up at the start of its next
    call (after a round in which all K drafts were accepted it lacks x_K and the bonus token).
    Both caches start empty: the first round feeds each model the whole prompt, unless the K policy
    asked to read the prompt first (read_prompt: both hold prompt[:-1] after it).
One round (the step numbers of Algorithm 1):
  Step 0    the K policy picks K from what earlier rounds measured (never from this round)
  Step 1    the drafter proposes up to k tokens x_1..x_k with their distributions q_1..q_k
  Step 2    the target is fed the newest token plus x_1..x_k in ONE call: p_1..p_{k+1}
  Step 3-4  the kernel accepts x_1..x_n and adds one target token t
  then the target cache (and the drafter) roll back to the new context[:-1], forgetting every
  rejected draft.
k = min(K, tokens still wanted - 1): a round emits at most k + 1 tokens, so we never overshoot N,
and the target never looks past position len(prompt) + N: the context check is the same as
generate's, prompt + N <= n_ctx, whatever K is. A round with no drafts (K = 0, or a drafter
with nothing to propose) is a plain target step; its token's provenance is "target".

Token trees (tree=(3, 2, 1), or a tree drafter: tree_drafts.py). A drafter may propose a DraftTree
instead of a chain; a chain is the tree with one child per node, and the loop is the same:
  Step 1    the drafter proposes a tree of depth <= k (k caps the depth: a round still emits at
            most k + 1 tokens); K of a tree round = the nodes it drafted
  Step 2    the target scores the tokens its cache lacks and every node in ONE call: a chain with
            the plain forward (unchanged), a tree with forward_rows, each node at its depth's
            position and seeing only its ancestors (model/rows.py)
  Step 3-4  verify_tree (tree_kernel.py) walks down the tree, trying each node's children in turn
  then the target cache keeps the trunk and the accepted path (KVCache.keep_rows; a chain's rows
  are already in place, so that is its truncation), and the drafter rolls back likewise.

>>> from gpt2np.teach.toy_models import random_toy_model
>>> rng = np.random.default_rng(0)
>>> target, draft = random_toy_model(rng, order=3), random_toy_model(rng)
>>> result = speculative_generate(target, draft, [0], n_tokens=6, K=3, temperature=0)
>>> from gpt2np.decoding.autoregressive import generate
>>> result.tokens == generate(target, [0], n_tokens=6, temperature=0)
True
>>> len(result.provenance), set(result.provenance) <= {"draft", "resample", "bonus", "target"}
(6, True)
"""
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np  # noqa: F401  (the module doctest draws its toy models with np.random)

from .autoregressive import check_generation_request, check_model, check_rng, default_temperature, stop_set
from .drafters import as_drafter
from .policies import PROBE_SHARE, Measurements, make_policy
from .sampling import check_sampling_options, distribution, is_greedy, sample
from .stopwatch import TimedModel
from .speculative_kernel import verify_round
from .run_stats import CALIBRATION_CALLS, SpeculativeStats, summarise, time_one_token_calls  # noqa: F401
from .stream import RoundEvent, Stream
from .theory import alpha
from .tree_drafters import as_tree_drafter, feed_rows, keep_path_rows
from .tree_drafts import DraftTree
from .tree_kernel import chain_round_result, examined_nodes, node_law, verify_tree
from .tree_policy import auto_tree
from ..model import rows
from ..model.cost_probe import carried_on

DEFAULT_K = 4  # speculative_generate's K; a tree (tree=, or a tree drafter) fixes its drafts instead
CATCH_UP = 2   # a draft model's usual first feed of a round: x_K and the bonus token after a full acceptance
TREE_ROOM = 64  # target cache positions past prompt + n_tokens for a tree's rows (a tree drafter cuts its trees
                # to the positions left: near the end of a run only, and exactness never depends on the cut)


@dataclass(frozen=True)
class SpeculativeResult:
    tokens: list            # new tokens: exactly n_tokens, unless eot_id or a stop token came first (it ends them)
    provenance: list        # per token: "draft" (accepted), "resample" (after a rejection), "bonus", or "target"
                            # (a round with no drafts: the clamped last round, or prompt lookup finding nothing)
    stats: SpeculativeStats
    trace: list | None      # one RoundEvent per round (with q and p) if trace=True, else None


def check_speculative_request(target, drafter, prompt_ids, n_tokens, temperature, top_k, top_p, rng):
    """Every check speculative_stream makes before its first forward pass, after the arguments'
    types (check_model, as_drafter) and K (make_policy)."""
    check_sampling_options(temperature, top_k, top_p)
    check_rng(rng, temperature)
    check_generation_request(target, prompt_ids, n_tokens)  # first: a request too long for both is the target's
    drafter.check(target, prompt_ids, n_tokens)


def propose(drafter, context, k, options, rng):  # Step 1 -> drafts [k], q, tree (None for a chain)
    """The drafter's proposal: a chain (drafts, q [k, n_vocab]) or a DraftTree (drafts: its nodes 1..K)."""
    proposal = drafter.propose(context, k, options, rng)
    if isinstance(proposal, DraftTree):
        return list(proposal.tokens[1:]), proposal.q, proposal
    return proposal[0], proposal[1], None


def score(target, context, drafts, tree, options):  # Step 2 -> p [k+1, n_vocab], one row per node
    """One target call over the tokens its cache lacks (the newest; the prompt in the first round)
    and the drafts: a chain with the plain forward, a tree's nodes each at its depth's position,
    seeing its ancestors only (rows.py)."""
    new_ids = context[len(target.cache):] + drafts  # [n_trunk + k]
    if tree is None or tree.is_chain():
        logits = target.feed(new_ids, n_logits=len(drafts) + 1)  # [k+1, n_vocab]
    else:
        parents = rows.trunk_and_tree(tree.parents, len(new_ids) - len(drafts))
        logits = feed_rows(target, new_ids, rows.tree_positions(parents, len(target.cache)), rows.tree_scope(parents),
                           n_logits=len(drafts) + 1)
    return distribution(logits, **options)  # checked once, in check_speculative_request


def verify(drafts, q, tree, p, rng, options, kernels):  # Steps 3-4 -> TreeRoundResult
    kernel, tree_kernel = kernels
    greedy = is_greedy(options["temperature"])
    if tree is None:
        return chain_round_result(drafts, kernel(drafts, q, p, rng, greedy=greedy))
    return tree_kernel(tree, p, rng, greedy=greedy)


def round_tokens(result, stops):
    """The tokens a kernel result adds, with provenance, cut just after the first stop token
    (end-of-text or one of stop_tokens), as plain decoding stops there."""
    emitted = list(result.tokens)
    provenance = result.provenance if result.tried else ["target"]  # nothing tried: a plain target step
    end = next((i + 1 for i, token in enumerate(emitted) if token in stops), len(emitted))
    return emitted[:end], provenance[:end]  # a stop can be an accepted draft: keep it, drop what follows


def keep_accepted(target, n_past, n_trunk, path, n_keep):
    """The target cache after a round: the trunk's rows and the accepted path's (a tree's nodes lie
    anywhere among its rows: keep_rows moves them down), at most n_keep positions."""
    kept = (list(range(n_trunk)) + [n_trunk - 1 + node for node in path])[:n_keep - n_past]
    keep_path_rows(target.cache, n_past, kept)
    target.roll_back(n_keep)


def tree_view(drafts, q, tree, p, result):  # -> q_at_drafts, p_at_drafts, overlaps, parents
    """What a RoundEvent says of the drafts, the same for a chain and a tree (stream.py)."""
    examined = examined_nodes(result)
    if tree is None:
        return ([float(q[i, x]) for i, x in enumerate(drafts)], [float(p[i, x]) for i, x in enumerate(drafts)],
                alpha(p[:len(examined)], q[:len(examined)]).tolist(), tuple(range(-1, len(drafts))) if drafts else ())
    children = tree.children()
    return ([float(node_law(tree, i)[x]) for i, x in enumerate(drafts, 1)],
            [float(p[tree.parents[i], x]) for i, x in enumerate(drafts, 1)],
            [float(alpha(p[e], node_law(tree, children[e][0]))) for e in examined], tuple(tree.parents))


def speculative_round(target, drafter, context, k, options, rng, kernels, keep_rows, stops):
    """Steps 1-4 and the roll-back; returns the round's RoundEvent (the loop adds n_emitted, seconds)."""
    start = time.perf_counter()
    drafts, q, tree = propose(drafter, context, k, options, rng)        # Step 1
    propose_seconds = time.perf_counter() - start
    n_past = len(target.cache)
    p = score(target, context, drafts, tree, options)                    # Step 2
    result = verify(drafts, q, tree, p, rng, options, kernels)           # Steps 3-4
    emitted, provenance = round_tokens(result, stops)
    n_keep = len(context) + len(emitted) - 1  # the invariant: new context[:-1]
    keep_accepted(target, n_past, len(context) - n_past, result.path, n_keep)
    drafter.roll_back(n_keep) if tree is None else drafter.roll_back(n_keep, result.path)
    q_at, p_at, overlaps, parents = tree_view(drafts, q, tree, p, result)
    return RoundEvent(
        tokens=emitted, provenance=provenance, K=len(drafts), n_emitted=0, drafts=drafts, q_at_drafts=q_at,
        p_at_drafts=p_at, decisions=[True] * len(result.path) + [False] * (result.kind == "resample"),
        overlaps=overlaps, q=q if keep_rows else None, p=p if keep_rows else None, propose_seconds=propose_seconds,
        parents=parents, path=result.path, tried=result.tried)


def observe(past, event, target, first_round, caught_up=1):
    """What the K policy may use next: this round's overlaps, the plain rounds' tokens since the last
    drafting round (past.owed), its target call and the drafter's wall time per drafted token (both
    without the first round, whose calls carry the prompt, or follow its prefill where read_prompt made
    one: a one-token call right after it read ~1.2x its later cost at 1558M under Haswell, so that v(3)
    looked 1.15 against 1.4, and auto drafted at alpha 0.3). No
    draft cost from a round whose draft model first caught up on more than CATCH_UP tokens (the
    drafter's caught_up): those were the plain rounds' debt, and charged to this round's one or two
    drafts they read c as 0.6-0.8 for a 124M draft of a 355M target (0.35 by parameters), which
    kept auto plain at alpha 0.8 (PERFORMANCE.md, "K policies, fifth look")."""
    past.overlaps += event.overlaps
    past.owed = 0 if event.drafts else past.owed + len(event.tokens)  # a plain round's token: the draft's debt
    if first_round:
        return
    n_seq = 1 + len(event.drafts)
    past.add_target_call(n_seq, target.durations[n_seq][-1])
    if event.drafts and caught_up <= CATCH_UP:
        past.add_draft_cost(event.propose_seconds / len(event.drafts))


def read_cost_shape(target, policy, n_tokens):  # -> ({M: v_shape(M)} or None, seconds it took)
    """The shape of the target's cost curve for a policy that plans with one (its cost_sizes: policies.AutoK,
    4.), read where the target can read it (row_cost_shape: a GPT2, model/cost_probe.py; a toy model
    cannot) in at most PROBE_SHARE of the run's plain passes: (None, 0.0) otherwise, and for a fixed
    K, which asked for no measuring. Where that share is too short for every size and the policy can
    plan with fewer (its fewest_cost_sizes: tree_policy.AutoTree's chains), those, carried on along
    their slope (cost_probe.carried_on). Before the first round, from the past only: exactness is untouched."""
    sizes, probe = getattr(policy, "cost_sizes", None), getattr(target, "row_cost_shape", None)
    if not sizes or probe is None:
        return None, 0.0
    start = time.perf_counter()
    shape, fewest = probe(sizes, PROBE_SHARE * n_tokens), getattr(policy, "fewest_cost_sizes", sizes)
    if shape is None and fewest < sizes:
        shape = carried_on(probe(fewest, PROBE_SHARE * n_tokens), sizes)
    return shape, time.perf_counter() - start


def read_prompt(target, drafter, prompt, options, policy):  # -> (beta at the prompt's last positions, seconds)
    """For a policy that asks (its prompt_positions: policies.AutoK, 5.) and a drafter that can say what it
    would have drafted (prompt_distributions: a draft model), both models' prefill of prompt[:-1] in one
    call each, keeping their distributions at its last n positions: beta = sum_x min(p, q) at each,
    what the kernel would have seen had those positions been drafted. ([], 0.0) otherwise, and for a
    prompt of one token. The prefill is work the first round would do anyway; what it adds is the head
    and the softmax over n rows. Off the stopwatches (a prefill, not a round's call), before the first
    round, from the past only: exactness is untouched. Afterwards both caches hold prompt[:-1].

    >>> from gpt2np.teach.toy_models import random_toy_model
    >>> from gpt2np.decoding.drafters import ModelDrafter
    >>> from types import SimpleNamespace
    >>> rng = np.random.default_rng(0)
    >>> target, draft = TimedModel(random_toy_model(rng)), ModelDrafter(random_toy_model(rng))
    >>> draft.reset(target.model)
    >>> reading = SimpleNamespace(prompt_positions=16)  # auto with policies.READ_PROMPT set asks for 16
    >>> overlaps, seconds = read_prompt(target, draft, [0, 1, 1, 0], dict(temperature=0), reading)
    >>> len(overlaps), set(overlaps) <= {0.0, 1.0}, len(target.cache), len(draft.timed.cache), target.calls
    (3, True, 3, 3, 0)
    """
    n_asked, read = getattr(policy, "prompt_positions", 0), getattr(drafter, "prompt_distributions", None)
    n = min(n_asked, len(prompt) - 1)
    if n < 1 or read is None:
        return [], 0.0
    start = time.perf_counter()
    ids = prompt[:-1]
    p = distribution(target.model.forward(np.asarray(ids), target.cache, n), **options)  # [n, n_vocab]
    q = read(ids, n, options)                                                             # [n, n_vocab]
    overlaps = [float(b) for b in np.minimum(p, q).sum(axis=-1)]                          # [n]
    return overlaps, time.perf_counter() - start


IN_USE = set()  # id() of each drafter a started, unfinished run holds (held_drafter)


def check_drafter_free(drafter):
    if id(drafter) in IN_USE:
        raise ValueError("this drafter is in use by an open run: a drafter serves one run at a time; close() it "
                         "or load another")


@contextmanager
def held_drafter(drafter):
    """The drafter for one run, from its first round to its end, its close() or its garbage collection.
    A drafter keeps one run's state (a draft model's KV cache, prompt lookup's index, its clocks), and
    reset(target) starts it afresh: two runs interleaved on one drafter would overwrite each other's
    (a cache of one context fed the other's tokens ends in a KV-cache error), so the second is a one-line
    refusal. Held from the first round, not the opening, so that streams opened together and run one
    after the other (the console's) share one; one after another always works. The server gives each
    stream a copy (serve/engine.py)."""
    check_drafter_free(drafter)
    IN_USE.add(id(drafter))
    try:
        yield drafter
    finally:
        IN_USE.discard(id(drafter))


def speculative_rounds(target, drafter, policy, prompt, n_tokens, options, rng, kernels, trace, calibrate,
                       stops):
    """The loop, one yield per round (a RoundEvent), with the drafter held throughout (held_drafter);
    returns the SpeculativeResult."""
    with held_drafter(drafter):
        return (yield from drafted_rounds(target, drafter, policy, prompt, n_tokens, options, rng, kernels, trace,
                                          calibrate, stops))


def drafted_rounds(target, drafter, policy, prompt, n_tokens, options, rng, kernels, trace, calibrate, stops):
    """The loop, one yield per round (a RoundEvent); returns the SpeculativeResult. It ends after
    n_tokens, or after the first token in `stops` (eot_id and the stop tokens), as plain decoding."""
    tree = getattr(drafter, "depth", None) is not None
    timed_target = TimedModel(target, len(prompt) + n_tokens + (TREE_ROOM if tree else 0))  # context[:-1], the
    drafter.reset(target)                                         # calibration call; a tree's rows past them
    positions = getattr(timed_target.cache, "n_ctx", target.n_ctx)
    if positions < target.n_ctx and hasattr(drafter, "fit_cache"):  # a cache sized to the run (request_cache):
        drafter.fit_cache(positions)                              # a draft model's holds no more, a tree fits in it
    policy.reset()
    past = Measurements(c_prior=drafter.c_prior)
    past.v_shape, probe_seconds = read_cost_shape(target, policy, n_tokens)
    past.prompt_overlaps, prompt_seconds = read_prompt(timed_target, drafter, prompt, options, policy)
    context, provenance, records, Ks = list(prompt), [], [], []
    while len(provenance) < n_tokens and not (provenance and context[-1] in stops):
        start = time.perf_counter()
        past.tokens_left = n_tokens - len(provenance)
        K = policy.choose(past)                                          # Step 0: from the past only
        k = min(K, n_tokens - len(provenance) - 1)  # K clamped: never emit more than asked for
        event = speculative_round(timed_target, drafter, context, k, options, rng, kernels, trace, stops)
        context += event.tokens
        provenance += event.provenance
        event = replace(event, n_emitted=len(provenance), seconds=time.perf_counter() - start)
        records.append(event)
        Ks.append(event.K if tree else k)      # a chain: K clamped to the tokens left; a tree: the nodes it drafted
        policy.update(event)
        observe(past, event, timed_target, first_round=len(records) == 1, caught_up=getattr(drafter, "caught_up", 1))
        yield event
    enough = len(timed_target.durations.get(1, [])) >= CALIBRATION_CALLS
    calibration = time_one_token_calls(timed_target, context, CALIBRATION_CALLS) if calibrate and not enough else []
    stats = summarise(records, Ks, timed_target, drafter, policy.name, len(provenance), calibration, probe_seconds,
                      past.prompt_overlaps, prompt_seconds)
    return SpeculativeResult(context[len(prompt):], provenance, stats, records if trace else None)


def drafter_and_policy(drafter, tree, K, K_max):  # -> (drafter, K policy)
    """tree= turns the drafter into a tree drafter; a tree drafter's depth is each round's K (the
    most tokens it may emit from drafts), so K must stay at its default. A draft model's sampler
    (draft_sampler=, or a ModelDrafter's sampler=) draws chains only: with tree= it is refused."""
    if tree is not None and getattr(drafter, "sampler", sample) is not sample:
        raise ValueError("draft_sampler= draws a chain's drafts, and tree= draws its trees without replacement "
                         "(tree_drafts.draft_tree), never calling it: leave it out with tree=")
    if isinstance(tree, str) and tree == "auto":
        check_default_K(K, "tree='auto' picks each round's tree")
        return auto_tree(drafter, K_max)
    drafter = as_tree_drafter(drafter, tree) if tree is not None else drafter
    depth = getattr(drafter, "depth", None)
    if depth is None:
        return drafter, make_policy(K, K_max)
    check_default_K(K, f"a tree fixes each round's drafts ({drafter.name})")
    return drafter, make_policy(depth, K_max)


def check_kernels(drafter, kernels):
    """kernel= verifies chains, tree_kernel= token trees: the one this run would never call is a
    one-line ValueError, since a broken kernel that is never called would look exact."""
    kernel, tree_kernel = kernels
    if getattr(drafter, "depth", None) is not None and kernel is not verify_round:
        raise ValueError("kernel= verifies chains, and this run drafts token trees (tree=, or a tree drafter): "
                         "pass tree_kernel= instead")
    if getattr(drafter, "depth", None) is None and tree_kernel is not verify_tree:
        raise ValueError("tree_kernel= verifies token trees, and this run drafts chains: pass kernel= instead, "
                         "or a tree shape with tree=")


def check_default_K(K, why):
    if isinstance(K, bool) or K != DEFAULT_K:
        raise ValueError(f"{why}: leave K at its default, got K={K!r} (a tree round's K is the number of nodes "
                         f"it drafts)")


def open_speculative(name, target, draft, prompt_ids, n_tokens, K, K_max, temperature, top_k, top_p, rng,
                     trace, kernels, draft_sampler, calibrate, stop_tokens, tree):
    """The Stream behind speculative_stream and speculative_generate (`name`, for the errors), after
    every check: the arguments' types first, so that another repository's order is named as such."""
    usage = f"{name}(target, draft, prompt_ids, n_tokens, ...)"
    check_model(target, "target", usage)
    drafter, policy = drafter_and_policy(as_drafter(draft, draft_sampler, usage), tree, K, K_max)
    check_kernels(drafter, kernels)
    temperature = default_temperature(temperature, rng)
    check_speculative_request(target, drafter, prompt_ids, n_tokens, temperature, top_k, top_p, rng)
    check_drafter_free(drafter)  # a run already going: refused now (streams opened together: at their start)
    options, stops = dict(temperature=temperature, top_k=top_k, top_p=top_p), stop_set(target, stop_tokens)
    prompt = [int(t) for t in prompt_ids]
    return Stream(speculative_rounds(target, drafter, policy, prompt, int(n_tokens), options, rng, kernels, trace,
                                     calibrate, stops))


def speculative_stream(target, draft, prompt_ids, n_tokens, K=DEFAULT_K, *, K_max=8, temperature=None, top_k=None,
                       top_p=None, rng=None, trace=False, kernel=verify_round, draft_sampler=sample,
                       calibrate=False, stop_tokens=None, tree=None, tree_kernel=verify_tree):
    """Speculative decoding as a Stream of RoundEvents; `.result` is speculative_generate's result.

    draft: a drafter (drafters.py) or a model (wrapped as a ModelDrafter). K: an int (the same K
    every round), "heuristic" or "auto" (policies.py; both at most K_max). The defaults are
    generate's: greedy unless an rng is passed (temperature None is 1.0 then); stop_tokens end
    the stream where plain decoding would stop. Every check runs here, before the first forward
    pass. calibrate=True: if the run made fewer than CALIBRATION_CALLS one-token target calls,
    time that many more after it, so that c and v are measured (the stats' calibration_seconds);
    by default the run makes only the calls its rounds need, and c and v are None where it made
    no call to measure them by.

    tree=(3, 2, 1): each round drafts a token tree of that shape (children per node at each depth,
    drawn without replacement) from a draft model, or from prompt lookup up to 3 * 2 * 1 earlier
    matches of up to 3 tokens as a trie (tree_drafts.py); K must then stay at its default. A
    tree drafter may also be passed as the draft. tree_kernel: verify_tree, or for teaching a broken
    one (teach/broken_tree_kernels.py). A run calls kernel= for chains and tree_kernel= for trees, and
    draft_sampler= only to draw a draft model's chain: any of them given where the run would never call
    it (a tree and kernel= or draft_sampler=, a chain and tree_kernel=, a drafter and draft_sampler=) is a
    one-line ValueError, so that a broken one cannot look exact by being ignored.
    """
    return open_speculative("speculative_stream", target, draft, prompt_ids, n_tokens, K, K_max, temperature,
                            top_k, top_p, rng, trace, (kernel, tree_kernel), draft_sampler, calibrate, stop_tokens,
                            tree)


def speculative_generate(target, draft, prompt_ids, n_tokens, K=DEFAULT_K, temperature=None, *, top_k=None,
                         top_p=None, rng=None, trace=False, kernel=verify_round, draft_sampler=sample,
                         K_max=8, calibrate=False, stop_tokens=None, tree=None, tree_kernel=verify_tree):
    """Sample n_tokens from `target` (exactly its distribution), using `draft` to go faster.

    Same sampling options, defaults and output distribution as generate(target, ...); stops early
    only at target.eot_id or one of stop_tokens (kept as the last token). draft: a model or a
    drafter; K: drafts per round, or a K policy name ("heuristic", "auto"). trace=True keeps one
    RoundEvent per round, with the full p and q rows. kernel and draft_sampler exist for teaching:
    pass a broken one (broken_kernels.py) and watch the exact tests fail. calibrate, tree and
    tree_kernel: see speculative_stream. Returns a SpeculativeResult.
    """
    return open_speculative("speculative_generate", target, draft, prompt_ids, n_tokens, K, K_max, temperature,
                            top_k, top_p, rng, trace, (kernel, tree_kernel), draft_sampler, calibrate, stop_tokens,
                            tree).run()
