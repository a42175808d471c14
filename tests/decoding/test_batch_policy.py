"""K for a batch (decoding/batch_policy.BatchAutoK) with the draft's catch-up priced, and the K = 0 round.

A draft that has not drafted for a sequence lacks its prompt and every token since: the first step
that drafts for it feeds them all (batched_speculative.draft_all). These tests run the policy in a
simulated batch whose costs are scripted (seconds of a target round and of a draft call by rows, no
noise), so the same run replays exactly, and compare its total seconds with plain decoding's.
"""
import numpy as np
import pytest

from gpt2np.decoding import batch_policy, batched_speculative
from gpt2np.decoding.batch_policy import BatchAutoK, goodputs
from gpt2np.decoding.batched import generate_batch
from gpt2np.decoding.autoregressive import generate
from gpt2np.decoding.batched_speculative import speculative_batch_stream, speculative_generate_batch
from gpt2np.decoding.speculative import speculative_generate
from gpt2np.model.config import GPT2Config
from gpt2np.model.fast.matmul import PANEL_PADDED_ROWS
from gpt2np.model.forward import GPT2
from gpt2np.teach import batch_simulation
from gpt2np.teach.toy_models import random_toy_model
from conftest import random_params

C = 0.35  # a 124M draft for a 355M target


def target_seconds(M):  # a round's target side over M rows: nearly flat to 16 rows, then a tenth of a row each
    return 0.03 * (1 + 0.05 * min(M - 1, 15) + 0.1 * max(M - 16, 0))


def draft_seconds(M):
    return C * target_seconds(M)


class Unpriced:
    """The rule told nothing of the draft's catch-up (choose(B) alone): the control."""

    def __init__(self, policy):
        self.policy = policy

    def choose(self, B, lag, horizon):
        return self.policy.choose(B)

    def update(self, *measured, first_round):
        self.policy.update(*measured, first_round=first_round)


def simulate(B, prompt_len, n_tokens, alpha, priced=True, seed=0):  # -> (seconds, [drafts per round])
    """A BatchAutoK run against the scripted costs (teach/batch_simulation.py; no timing noise)."""
    policy = BatchAutoK(K_max=4, c_prior=C)
    return batch_simulation.simulate(policy if priced else Unpriced(policy), B, prompt_len, n_tokens, alpha,
                                     target_seconds, C, seed)


def plain_seconds(B, prompt_len, n_tokens):
    return batch_simulation.plain_seconds(B, prompt_len, n_tokens, target_seconds)


def test_in_these_costs_drafting_pays_a_little_once_the_draft_has_caught_up():
    tokens = [1 + 0.8 * (K >= 1) for K in range(2)]  # alpha 0.8, K = 1
    plain, drafting = goodputs(tokens, 8, draft_seconds(8), target_seconds)
    print(f"B 8, alpha 0.8: K = 1 {drafting / plain:.3f}x plain decoding's tokens/s once caught up")
    assert 1.03 < drafting / plain < 1.15


def test_a_short_run_that_owes_the_prompts_stays_plain_where_the_unpriced_rule_drafts_and_loses():
    B, prompt_len, n_tokens, alpha = 8, 32, 32, 0.8
    plain = plain_seconds(B, prompt_len, n_tokens)
    priced, priced_Ks = simulate(B, prompt_len, n_tokens, alpha)
    unpriced, unpriced_Ks = simulate(B, prompt_len, n_tokens, alpha, priced=False)
    print(f"seconds: plain {plain:.3f}, catch-up priced {priced:.3f} (K {priced_Ks}), "
          f"unpriced {unpriced:.3f} (K {unpriced_Ks})")
    assert max(priced_Ks) == 0 and priced == pytest.approx(plain), f"priced: {priced / plain:.3f} of plain's seconds"
    assert max(unpriced_Ks) >= 1, "the control: without the catch-up the rule drafts"
    assert unpriced > 1.03 * plain, f"the control drafts and loses: {unpriced / plain:.3f} of plain's seconds"


def test_a_long_run_pays_the_catch_up_once_and_wins():
    B, prompt_len, n_tokens, alpha = 4, 32, 400, 0.9
    plain = plain_seconds(B, prompt_len, n_tokens)
    priced, Ks = simulate(B, prompt_len, n_tokens, alpha)
    print(f"400 tokens: priced {priced:.3f} s against plain {plain:.3f} s; rounds drafting {sum(k > 0 for k in Ks)}"
          f" of {len(Ks)}, first at round {next(r for r, k in enumerate(Ks) if k)}")
    assert Ks[0] == 0 and max(Ks) >= 1, "the first round owes the prompts to a prior only: plain"
    assert priced < 0.97 * plain, f"{priced / plain:.3f} of plain's seconds"


@pytest.mark.parametrize("alpha", [0.3, 0.5])
def test_a_try_that_owes_the_prompts_is_priced_whole_where_the_belief_says_drafting_loses(alpha):
    """B = 4, 32 tokens after 32: drafting loses here (K = 1 at alpha 0.5: 0.95-0.98 x plain's goodput
    once caught up), and a try pays 4 prompts' catch-up at once. The rule without a price (before
    2026-11-27) took 1.07-1.20 x plain's seconds: it tried on the optimistic alpha, and kept drafting."""
    B, prompt_len, n_tokens = 4, 32, 32
    plain = plain_seconds(B, prompt_len, n_tokens)
    runs = [simulate(B, prompt_len, n_tokens, alpha, seed=seed) for seed in range(3)]
    print(f"B 4, alpha {alpha}: " + ", ".join(f"{s / plain:.3f} (K {Ks})" for s, Ks in runs))
    assert all(s <= 1.01 * plain for s, _ in runs), [round(s / plain, 3) for s, _ in runs]


def test_the_plain_pass_is_read_twice_near_a_tie_and_again_when_stale():
    """One reading of the B-row plain pass taken in a slow second (30 % high) makes a drafting round
    look like a gain; near a tie the rule reads it again before drafting, and re-reads it STALE_CALLS
    timed rounds later."""
    policy = BatchAutoK(K_max=2, c_prior=C)
    policy.overlaps = [0.5] * 40                                      # alpha 0.5 well known
    policy.update([], 1, 1.3 * target_seconds(1), [], first_round=False)  # the slow reading
    for rows in (2, 3):
        policy.update([], rows, target_seconds(rows), [(1, draft_seconds(1)), (2, draft_seconds(2))],
                      first_round=False)
    D, T = policy.costs(1)
    gain = max(goodputs([1.0, 1.5, 1.75], 1, D(1), T)[1:]) / goodputs([1.0], 1, D(1), T)[0]
    print(f"read once: T(1) {T(1):.4f} against {target_seconds(1):.4f}; alpha 0.5 plans {gain:.3f} x plain")
    assert gain > 1.0, "the slow reading makes drafting look like a gain"
    assert policy.times_plain(1, gain) and policy.choose(1) == 0, "one reading near a tie: read it again"
    assert not policy.times_plain(1, 1.5), "far from a tie one reading decides"
    policy.update([], 1, target_seconds(1), [], first_round=False)
    assert not policy.times_plain(1, gain), "read twice"
    for _ in range(batch_policy.STALE_CALLS):
        policy.update([], 2, target_seconds(2), [], first_round=False)
    assert policy.times_plain(1, 1.05) and not policy.times_plain(1, 1.5), "stale near a tie, not far from one"
    policy.update([], 1, target_seconds(1), [], first_round=False)
    assert not policy.times_plain(1, 1.05), "read again: fresh"


def traced_1558M_rounds(policy):
    """Two sequences, 124M -> 1558M under SkylakeX, as an AMD EPYC of family 26 timed them (seconds by rows): 2
    (plain), 5, 8 (K = 3, 43 rounds), 10, 12, 16 rows, and 6 rows (K = 2) read twice in a slow second; 4 rows
    (K = 1) never; alpha 0.5 well known; the draft's two-row step 19.7 ms."""
    policy.overlaps = [1.0, 0.0] * 60
    policy.update([], 32, 0.9, [], first_round=True)  # the prompts' round: not timed
    timed = {5: [0.214], 6: [0.428, 0.428], 8: [0.262] * 12, 10: [0.312] * 3, 12: [0.376] * 2, 16: [0.314],
             2: [0.201] * 6}  # the plain pass last: fresh, not read again
    for rows, readings in timed.items():
        for seconds in readings:
            policy.update([], rows, seconds, [(2, 0.0197)], first_round=False)
    return policy


def test_an_unsettled_round_is_never_priced_above_a_larger_timed_one(monkeypatch):
    """A slow reading at 6 rows (K = 2) and a line pulled up by it at 4 rows (K = 1, never timed) priced both
    above the 8-row round's 43 readings, so auto played K = 3 (the bench: 78 rounds of K = 3, 0.929 of K = 1) and
    never timed the cheaper sizes that would have corrected it. Rows can be padded, so a size read fewer than
    SETTLED times costs no more than a larger timed one: K = 1. Control: without that bound the trace plays K = 3."""
    policy = traced_1558M_rounds(BatchAutoK(K_max=4, c_prior=0.09))
    T = policy.costs(2)[1]
    assert T(4) <= 0.214 and T(6) <= 0.262 and T(8) == pytest.approx(0.262), [T(M) for M in (4, 6, 8)]
    assert policy.choose(2, lag=0, horizon=100) == 1
    monkeypatch.setattr(batch_policy, "padded_price", lambda seconds, M, caps: seconds)
    unbounded = traced_1558M_rounds(BatchAutoK(K_max=4, c_prior=0.09))
    T = unbounded.costs(2)[1]
    print(f"unbounded: T(4) {T(4):.3f} s, T(6) {T(6):.3f} s, T(8) {T(8):.3f} s")
    assert T(6) > T(8) and unbounded.choose(2, lag=0, horizon=100) == 3


@pytest.mark.parametrize("n", [1, batch_policy.SETTLED])
def test_a_settled_size_keeps_its_own_median_above_a_larger_one(n):
    """3 rows of 1558M in panels read 212 ms over 25 rounds, 4 rows 192 ms over 26 (the loop does not pad: the
    3-row round costs what it reads). Read fewer than SETTLED times, the 3 rows are priced at the 4 rows'."""
    policy = BatchAutoK(K_max=4, c_prior=0.09)
    policy.update([], 17, 0.5, [], first_round=True)
    for rows, seconds, times in ((1, 0.165, 5), (3, 0.212, n), (4, 0.192, 26)):
        for _ in range(times):
            policy.update([], rows, seconds, [(1, 0.017)], first_round=False)
    T = policy.costs(1)[1]
    assert T(3) == pytest.approx(0.212 if n >= batch_policy.SETTLED else 0.192), (n, T(3))


def traced_xeon_rounds(policy):
    """One sequence, 124M -> 1558M in panels under SkylakeX, as an Intel Xeon (family 6, model 207) timed it: 3,
    4 (K = 3, 45 rounds), 5 and 6 rows, then the plain pass (1 row: fresh); 2 rows (K = 1) never. Alpha 0.45 over
    92 positions; the draft's one-row step 38 ms. There 2 rows cost what 1 does (in panels a 1-row product runs
    as 2 rows), 3-4 rows 1.15-1.25 of it (PERFORMANCE.md, "A Xeon whose few-row curve steps")."""
    policy.overlaps = [1.0] * 41 + [0.0] * 51
    policy.update([], 17, 1.1, [], first_round=True)  # the prompt's round: not timed
    for rows, seconds, times in ((3, 0.473, 4), (4, 0.438, 45), (5, 0.555, 3), (6, 0.534, 2), (1, 0.367, 5)):
        for _ in range(times):
            policy.update([], rows, seconds, [(1, 0.038)], first_round=False)
    return policy


def test_a_size_never_timed_costs_what_its_padded_twin_reads():
    """The line through 3-6 rows carried down to 2 priced K = 1's round at 1.16 one-row rounds, so K = 3 looked
    the better plan and K = 1, never played, was never timed (the bench: K = 3 in 45 rounds of 60, 0.84 of
    K = 1's speed). Told that the target's products run 1 row as 2 (panels), the policy prices 2 rows at the
    1-row round's reading and plays K = 1. Control: told nothing, the line's price plays K = 3."""
    told = traced_xeon_rounds(BatchAutoK(K_max=8, c_prior=0.09, runs_as=PANEL_PADDED_ROWS))
    untold = traced_xeon_rounds(BatchAutoK(K_max=8, c_prior=0.09))
    print(f"T(2): told {told.costs(1)[1](2):.3f} s, untold {untold.costs(1)[1](2):.3f} s (1 row 0.367 s)")
    assert told.costs(1)[1](2) == pytest.approx(0.367) and untold.costs(1)[1](2) > 1.1 * 0.367
    assert (told.choose(1, lag=0, horizon=40), untold.choose(1, lag=0, horizon=40)) == (1, 3)


def test_a_twin_prices_a_size_only_once_a_larger_size_is_timed():
    """Before any larger size is timed the untimed sizes are the prior curve's: a 1-row reading alone would price
    2 rows at 1 row's beside the prior's dearer 3-5 rows, and the first drafting round would try K = 1 where the
    prior would try more (the batch simulator's stepped curve, alpha 0.8, 32 tokens, 200 seeds: 0.961 -> 0.936 of
    the best fixed K)."""
    policy = BatchAutoK(K_max=4, c_prior=0.09, runs_as=PANEL_PADDED_ROWS)
    policy.update([], 17, 1.1, [], first_round=True)
    policy.update([], 1, 0.4, [(18, 0.08)], first_round=False)
    assert policy.costs(1)[1](2) > 0.4 * 1.1
    policy.update([], 5, 0.5, [(1, 0.04)], first_round=False)
    policy.update([], 8, 0.6, [(1, 0.04)], first_round=False)
    T = policy.costs(1)[1]
    assert (T(2), T(6)) == (pytest.approx(0.4), pytest.approx(0.5)), (T(2), T(6))


def traced_haswell_rounds(policy):
    """Eight sequences, 124M -> 1558M row-major under forced Haswell, as the Zen 4 EPYC timed them: 8 rows (plain)
    before and after 16 rows (K = 1) 16 times at 0.79-0.86 s; 24 rows (K = 2) never. Alpha 0.84 over 128
    positions; the draft's 8-row step 63 ms. Full price puts 24 rows at 1.5 x 16 rows' 0.85 s; they read 1.11 s
    (PERFORMANCE.md, "Issue 29's 1558M table under forced Haswell after sessions 70-71")."""
    policy.overlaps = [1.0] * 107 + [0.0] * 21
    policy.update([], 8 * 17, 2.3, [], first_round=True)  # the prompts' round: not timed
    for rows, seconds, times in ((8, 0.67, 1), (16, 0.85, 16), (8, 0.67, 1)):  # the plain pass timed again
        for _ in range(times):
            policy.update([], rows, seconds, [(8, 0.063)], first_round=False)
    return policy


def test_a_size_full_price_locks_out_is_tried_once():
    """24 rows, past FEW_ROWS and past every timed size, cost full price: K = 2 plans 13 % under K = 1, is never
    played, so never timed (the bench: K = 1 in 155 rounds of 176, 0.927 of K = 2). Its price lies between the
    line through 8 and 16 rows (1.07 s) and full price (1.28 s); what reading it could save over the 540 tokens
    left is worth a round's loss, so K = 2 is played once. Read at full price, it is not tried again. Controls:
    a target in panels (whose products jump past 16 rows) and a run near its end keep K = 1."""
    policy = traced_haswell_rounds(BatchAutoK(K_max=8, c_prior=0.09))
    _, T = policy.costs(8)
    _, line = policy.costs(8, line=True)
    print(f"T(24): full price {T(24):.3f} s, the line {line(24):.3f} s (16 rows 0.85 s; read 1.11 s)")
    assert T(24) == pytest.approx(1.5 * 0.85) and line(24) < 0.9 * T(24)
    panels = traced_haswell_rounds(BatchAutoK(K_max=8, c_prior=0.09, runs_as=PANEL_PADDED_ROWS))
    late = traced_haswell_rounds(BatchAutoK(K_max=8, c_prior=0.09))
    assert (policy.choose(8, lag=6, horizon=541), panels.choose(8, lag=6, horizon=541),
            late.choose(8, lag=6, horizon=16)) == (2, 1, 1)
    policy.update([1.0] * 15, 24, 1.5 * 0.85, [(8, 0.063), (8, 0.063)], first_round=False)
    assert policy.choose(8, lag=6, horizon=525) == 1


def test_a_panels_target_tells_its_batch_policy_which_sizes_it_pads():
    from gpt2np.model.fast.layout import set_weights_order
    config = GPT2Config(n_vocab=512, n_ctx=32, n_embd=512, n_head=4, n_layer=1)  # c_fc's 4 MiB: large
    model = GPT2(config, random_params(config, seed=1))
    told = {order: batched_speculative.batch_auto_K(set_weights_order(model, order), model, 4).runs_as
            for order in ("panels", "row-major")}
    assert told == {"panels": PANEL_PADDED_ROWS, "row-major": {}}, told


def test_on_a_stepped_curve_the_twin_price_recovers_what_the_line_loses():
    """The batch simulator's Intel Xeon curve (XEON_PANELS: 2 rows cost 1 row's, then a step every two rows),
    124M -> 1558M, one sequence, alpha 0.5, 100 tokens, 30 seeds: K = 1 is best (1.08x K = 3). Told the panels'
    twins, auto's seconds fall against the same policy told nothing, seed by seed."""
    target = batch_simulation.measured_costs(batch_simulation.XEON_PANELS)

    def seconds(runs_as):
        return np.array([batch_simulation.simulate(BatchAutoK(K_max=4, c_prior=0.09, runs_as=runs_as), 1, 16, 100,
                                                   0.5, target, 0.09, seed, 0.12)[0] for seed in range(30)])
    told, untold = seconds(PANEL_PADDED_ROWS), seconds(None)
    print(f"told / untold seconds: mean {np.mean(told / untold):.3f}, {np.sum(told < untold)} of 30 faster")
    assert np.mean(told / untold) < 0.985 and np.sum(told < untold) >= 15, told / untold


def test_a_new_batch_size_is_not_timed_where_the_draft_s_clock_vouches_for_it():
    """A batch of 2, its rounds timed, loses a sequence: one row was never timed. Where the plan clearly
    pays and the draft's one-row calls over c_prior agree with the curve's guess of a one-row round,
    no plain round times it; with a draft clock twice as slow as its share of parameters says, a plan
    near a tie, or no one-row draft call yet, the plain round comes as before."""
    def seconds(M):  # a target round on the prior's own curve: the guess from the 2-row rounds is exact
        return 0.03 * (1.0 if M == 1 else 1.3 + 0.08 * (M - 2))

    def batch_of_two(clock, one_row_calls=True):
        policy = BatchAutoK(K_max=4, c_prior=C)
        policy.overlaps = [1.0] * 30
        for rows in (2, 6, 10):                                     # plain, K = 2 and K = 4 rounds of B = 2
            calls = [(2, clock * C * seconds(2))] + [(1, clock * C * seconds(1))] * one_row_calls
            policy.update([], rows, seconds(rows), calls, first_round=False)
        return policy

    agrees, slow, none = batch_of_two(1.0), batch_of_two(2.0), batch_of_two(1.0, one_row_calls=False)
    assert agrees.vouched(1) and not agrees.times_plain(1, 1.5), "the draft's clock vouches: no plain round"
    assert agrees.times_plain(1, 1.1), "near a tie the new size is timed all the same"
    assert not slow.vouched(1) and slow.times_plain(1, 1.5), "a clock that disagrees vouches for nothing"
    assert not none.vouched(1) and none.times_plain(1, 1.5), "no one-row draft call: nothing to vouch with"
    assert 1 not in agrees.target_durations


def test_a_new_batch_size_is_timed_only_while_the_run_has_rounds_left_to_use_the_reading():
    """A batch of two, its rounds timed, loses a sequence, and the draft's clock vouches for nothing (it runs
    1.5 times its share of parameters): the one-row pass was never timed. With 40 tokens left a plain round
    times it; with 6 left, about one round at K = 4, the round drafts at once: the reading could change
    no round after it."""
    def batch_of_two():
        policy = BatchAutoK(K_max=4, c_prior=C)
        policy.overlaps = [1.0] * 30
        for rows in (2, 6, 10):                                     # plain, K = 2 and K = 4 rounds of B = 2
            policy.update([], rows, target_seconds(rows), [(2, 1.5 * draft_seconds(2)), (1, 1.5 * draft_seconds(1))],
                          first_round=False)
        return policy

    tokens = batch_policy.expected_tokens_under_belief(31.5, 1.0, 4)
    print(f"a round of one sequence at K = 4 emits {tokens[4]:.2f} tokens (belief); timed while more than "
          f"{batch_policy.TIMING_ROUNDS * tokens[4]:.1f} are left")
    assert batch_of_two().times_plain(1, 1.5), "an untimed size the clock does not vouch for"
    assert batch_of_two().choose(1, horizon=40) == 0, "40 tokens left: time the one-row pass"
    assert batch_of_two().choose(1, horizon=6) >= 1, "6 tokens left: draft, no timing round"


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_where_drafting_cannot_pay_the_priced_rule_is_within_two_percent_of_plain(alpha):
    B, prompt_len, n_tokens = 16, 16, 64  # 16 rows fill the flat part: a drafted row costs a tenth of a pass
    plain = plain_seconds(B, prompt_len, n_tokens)
    priced, Ks = simulate(B, prompt_len, n_tokens, alpha)
    print(f"B 16, alpha {alpha}: {priced / plain:.4f} of plain's seconds, K {Ks}")
    assert priced <= 1.02 * plain


def simulated_runs(curve, B, alpha, c, seeds=range(30), n_tokens=100):  # -> [(plain seconds / auto's, Ks)]
    """BatchAutoK on teach/batch_simulation.py's curve, 12 % noise on every reading, as its table runs it."""
    target = batch_simulation.row_costs(*batch_simulation.CURVES[curve])
    plain = batch_simulation.plain_seconds(B, 16, n_tokens, target)
    runs = [batch_simulation.simulate(BatchAutoK(K_max=4, c_prior=c), B, 16, n_tokens, alpha, target, c, seed, 0.12)
            for seed in seeds]
    return [(plain / seconds, Ks) for seconds, Ks in runs]


def test_where_drafting_clearly_loses_a_retry_must_be_worth_what_it_could_teach(monkeypatch):
    """One sequence, the Haswell curve, 124M -> 355M, alpha 0.5: K = 1 is 0.82 of plain decoding. After its first
    try the rule retries only where what about TRY_ROUNDS rounds could teach, over the rounds left, outweighs what
    one loses (try_value): a few drafting rounds a run. The rule before retried as its price decayed (0.953 of
    plain decoding in the simulator's table; measured under Haswell 0.94-0.955 at B = 1-4). Control: a retry
    judged worth anything drafts nearly every round and loses a quarter."""
    runs = simulated_runs("Haswell", 1, 0.5, C, seeds=range(10))
    ratios, drafting = [r for r, _ in runs], [sum(K > 0 for K in Ks) for _, Ks in runs]
    print(f"auto / plain {np.median(ratios):.3f} (lowest {min(ratios):.3f}); drafting rounds {drafting}")
    assert np.median(ratios) >= 0.97 and min(ratios) >= 0.95, ratios
    monkeypatch.setattr(batch_policy, "try_value", lambda *args, **kwargs: float("inf"))
    control = [r for r, _ in simulated_runs("Haswell", 1, 0.5, C, seeds=range(10))]
    print(f"control, every retry worth it: {np.median(control):.3f}")
    assert np.median(control) < 0.85


def test_a_retry_is_worth_more_with_more_tokens_left_and_less_evidence():
    """One sequence, 124M -> 1558M on the Haswell curve, its plain and short rounds timed. Two rejected drafts
    make the belief say drafting loses (0.84 x plain), but two positions say little: with 100 tokens left a
    retry pays for what it could teach, with 20 left it cannot. Thirty positions at 0.3 leave nothing to learn."""
    target = batch_simulation.row_costs(*batch_simulation.CURVES["Haswell"])

    def policy(overlaps):
        p = BatchAutoK(K_max=4, c_prior=0.09)
        p.overlaps = list(overlaps)
        p.update([], 17, 1.0, [], first_round=True)
        for rows in (1, 1, 2, 3, 5):
            p.update([], rows, target(rows), [(1, 0.09 * target(1))], first_round=False)
        return p
    assert policy([0.0, 0.0]).choose(1, lag=0, horizon=100) >= 1
    assert policy([0.0, 0.0]).choose(1, lag=0, horizon=20) == 0
    assert policy([1.0] * 9 + [0.0] * 21).choose(1, lag=0, horizon=100) == 0


@pytest.mark.parametrize("curve, B, c, most_locked", [("Haswell", 1, 0.09, 0), ("SkylakeX", 2, C, 2)])
def test_a_bad_start_does_not_lock_drafting_out_where_it_pays(monkeypatch, curve, B, c, most_locked):
    """alpha 0.8 where drafting pays (124M -> 1558M on Haswell's curve, 1.4x plain; 124M -> 355M on SkylakeX's at
    B = 2, 1.15x), 30 seeds: a run whose first drafts were rejected believes drafting loses, and only a retry
    can correct it. Counted: the runs that draft not once in their second half. Control: never retrying
    (try_value 0) locks out 8 of the 30 in both."""
    def locked_out():
        return sum(not any(Ks[len(Ks) // 2:]) for _, Ks in simulated_runs(curve, B, 0.8, c))
    locked = locked_out()
    monkeypatch.setattr(batch_policy, "try_value", lambda *args, **kwargs: 0.0)
    never = locked_out()
    print(f"{curve}, B = {B}, c {c}: locked out {locked} of 30; never retrying {never}")
    assert locked <= most_locked and never >= 5


def test_the_catch_up_is_priced_from_the_drafts_own_calls():
    policy = BatchAutoK(K_max=2, c_prior=0.9)  # a prior far from the measured draft
    policy.overlaps = [0.95] * 50              # a belief that says drafting pays once caught up
    for rows in (8, 8, 16):  # the plain pass read twice (near a tie one reading is not trusted)
        policy.update([], rows, target_seconds(rows), [], first_round=False)
    policy.update([], 16, target_seconds(16), [(8, 0.010), (136, 0.100)], first_round=False)
    D, T = policy.costs(8)
    assert D(8) == 0.010 and D(72) == pytest.approx(0.055), (D(8), D(72))  # joined size to size
    assert D(200) == pytest.approx(0.100 * T(200) / T(136)), D(200)      # past them: the target's shape
    caught_up = policy.choose(8, lag=0, horizon=256)
    owing = policy.choose(8, lag=128, horizon=64)
    amortised = policy.choose(8, lag=128, horizon=100_000)
    assert (caught_up >= 1, owing, amortised >= 1) == (True, 0, True), (caught_up, owing, amortised)


def test_past_the_few_row_methods_untimed_rows_cost_their_full_share_unless_the_target_has_none():
    """Rounds of 8 and 16 rows timed (1.0 and 1.1 s): a 40-row round, never timed, costs 40 / 16 of the
    16-row one where the target's products leave their few-row methods at 16 rows (few_rows=FEW_ROWS),
    and what the line through 8 and 16 says where they have none (few_rows=None: small weights), up
    to a catch-up's 144 rows past the curve's end."""
    def costs(few_rows):
        policy = BatchAutoK(K_max=4, c_prior=0.1, few_rows=few_rows)
        policy.update([], 8, 9.9, [], first_round=True)  # the prompts' round: not timed
        policy.update([], 8, 1.0, [], first_round=False)
        policy.update([1.0] * 8, 16, 1.1, [(8, 0.1)], first_round=False)
        return policy.costs(8)[1]
    full, line = costs(batch_policy.FEW_ROWS), costs(None)
    assert [full(M) for M in (8, 16)] == [line(M) for M in (8, 16)] == [1.0, 1.1]
    assert full(40) == pytest.approx(1.1 * 40 / 16) and full(144) == pytest.approx(1.1 * 144 / 16)
    assert line(40) == pytest.approx(1.0 + 0.1 / 8 * 32) and line(144) == pytest.approx(1.0 + 0.1 / 8 * 136)
    assert line(12) == full(12) == pytest.approx(1.05)  # below the edge the line either way


def test_past_the_curve_a_small_target_s_rows_never_get_cheaper():
    """The curve's last size (B (K_max + 1) = 40) timed below the line through the others: a catch-up's
    144 rows still cost at least the 40 rows' reading, not a line falling from it."""
    policy = BatchAutoK(K_max=4, c_prior=0.1, few_rows=None)
    policy.update([], 8, 9.9, [], first_round=True)
    for rows, seconds in ((8, 1.0), (16, 1.1), (40, 1.05)):
        policy.update([1.0] * 8, rows, seconds, [(8, 0.1)], first_round=False)
    T = policy.costs(8)[1]
    assert T(40) == pytest.approx(1.05) and T(144) >= T(40) and T(1000) >= T(40), (T(39), T(40), T(144))


def test_the_bundled_pair_s_batch_policy_knows_its_target_has_no_few_row_edge():
    from gpt2np.checkpoints.loading import load_model
    bundled = batched_speculative.batch_auto_K(load_model("shakespeare-2.6M"), load_model("shakespeare-260K"), 4)
    config = GPT2Config(n_vocab=8300, n_ctx=32, n_embd=64, n_head=4, n_layer=1)  # wte.T over 2 MiB: large
    large = GPT2(config, random_params(config, seed=1))
    assert (bundled.few_rows, batched_speculative.batch_auto_K(large, large, 4).few_rows) == (None, 16)
    assert bundled.c_prior == pytest.approx(0.1, abs=0.05) and bundled.K_max == 4, bundled.c_prior


# ---- the loop: what it tells the policy, and a round of K = 0 for all ------------------------------------

class Scripted:
    """A policy that plays the given Ks and records what each round owed."""

    def __init__(self, Ks):
        self.Ks, self.asked, self.t = list(Ks), [], 0

    def choose(self, B, lag, horizon):
        self.t += 1
        self.asked.append((B, lag, horizon))
        return self.Ks.pop(0) if self.Ks else 0

    def update(self, *measured, first_round):
        pass


def test_the_loop_tells_the_policy_the_rows_the_draft_lacks_and_the_tokens_left():
    rng = np.random.default_rng(0)
    target, draft = random_toy_model(rng, 4, order=3), random_toy_model(rng, 4)
    seqs = batched_speculative.open_sequences(target, draft, [[0, 1, 2], [3]], [6, 6], "auto", 2, None, None, None,
                                              None, None)
    policy = Scripted([0, 0, 1])
    rounds = batched_speculative.batch_rounds(target, draft, seqs, policy=policy)
    for _ in range(4):
        next(rounds)
    assert policy.asked[:3] == [(2, 2 + 0, 12), (2, 3 + 1, 10), (2, 4 + 2, 8)], policy.asked
    assert policy.asked[3][1] <= 2, f"after a drafting round each draft lags 1-2 tokens: {policy.asked[3]}"


def test_a_round_where_no_sequence_drafts_is_the_plain_batched_step(monkeypatch):
    config = GPT2Config(n_vocab=37, n_ctx=64, n_embd=12, n_head=3, n_layer=2)
    target, draft = GPT2(config, random_params(config, seed=1)), GPT2(config, random_params(config, seed=2))
    calls = []
    real = batched_speculative.packed_call
    monkeypatch.setattr(batched_speculative, "packed_call",
                        lambda model, c, n: calls.append(model is target) or real(model, c, n))

    def no_kernel(*args):
        raise AssertionError("a round with every k = 0 ran the verification kernel")
    prompts = [[1, 2, 3], [4], [5, 6]]
    rngs = [np.random.default_rng(s) for s in range(3)]
    steps = list(speculative_batch_stream(target, draft, prompts, [5, 2, 4], K=0, temperature=[0, 0.8, 1.2],
                                          rng=[None, *rngs[1:]], verify=no_kernel, roll_back=no_kernel))
    expected = generate_batch(target, prompts, [5, 2, 4], temperature=[0, 0.8, 1.2],
                              rng=[None, *[np.random.default_rng(s) for s in range(1, 3)]])
    tokens = [[t for step in steps for i, e in step if i == s for t in e.tokens] for s in range(3)]
    assert tokens == expected, f"plain rounds: {tokens} against generate_batch's {expected}"
    assert calls == [True] * len(steps), f"one target call a round, no draft call: {calls}"
    assert all(e.K == 0 and e.provenance == ["target"] and not e.decisions for step in steps for _, e in step)


def test_mixed_rounds_stay_exact_when_the_last_rounds_are_plain():
    """Rounds where some sequences draft and others are clamped to k = 0 (their last token, or K = 0):
    each sequence draws what speculative_generate (K = 0: generate) draws alone from the same seed."""
    rng = np.random.default_rng(7)
    target, draft = random_toy_model(rng, 5, order=3), random_toy_model(rng, 5)
    prompts, n_tokens, Ks = [[0], [1, 2], [3]], [7, 3, 5], [2, 3, 0]
    rngs = [np.random.default_rng(10 + s) for s in range(3)]
    got = speculative_generate_batch(target, draft, prompts, n_tokens, K=Ks, temperature=1.0, rng=rngs)
    solo = [speculative_generate(target, draft, p, n, K=k, temperature=1.0, rng=np.random.default_rng(10 + s)).tokens
            if k else generate(target, p, n, temperature=1.0, rng=np.random.default_rng(10 + s))
            for s, (p, n, k) in enumerate(zip(prompts, n_tokens, Ks))]
    assert got == solo, f"batch {got} against each alone {solo}"


def test_sequences_beside_the_auto_ones_add_their_rows_and_tokens_not_a_gain():
    """A server's batch: one sequence with K="auto" and three plain ones riding along (K = 0). Drafting for the
    one adds its rows to a pass of four and gains only its own tokens: here plain decoding's goodput is the best
    (alpha 0.95: K = 1 0.92x, K = 2 0.86x). The rule told of the three (fixed=[0, 0, 0]) stays plain; counting
    all four as drafting sequences (choose(4), as before) it drafts."""
    policy = BatchAutoK(K_max=4, c_prior=C)
    for _ in range(3):  # a belief at alpha 0.95 and every row count timed twice or more, as a long run leaves them
        for M in range(1, 21):
            policy.update([1.0] * 19 + [0.0], M, target_seconds(M), [(min(M, 8), draft_seconds(min(M, 8)))],
                          first_round=False)
    tokens = [sum(0.95 ** j for j in range(K + 1)) for K in range(5)]
    truth = goodputs(tokens, 1, draft_seconds(1), target_seconds, fixed=(3, 3.0))
    print("goodput over plain decoding's, K = 1..4:", [round(g / truth[0], 3) for g in truth[1:]])
    assert max(truth[1:]) < 0.95 * truth[0]
    told = [policy.choose(1, fixed=[0, 0, 0]) for _ in range(5)]
    assert told == [0] * 5, f"told of the plain sequences the rule should stay plain, chose {told}"
    assert policy.choose(4) >= 1, "the control: counted as four drafting sequences, drafting looks like a gain"
