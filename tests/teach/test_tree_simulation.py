"""teach/tree_simulation.py: tree="auto" (AutoTree) against a cost model and the bench's forced per-rank coins."""
import numpy as np
import pytest

from gpt2np.decoding import tree_policy
from gpt2np.decoding.tree_policy import holds_if_higher, scaled_up
from gpt2np.decoding.tree_shape import best_shape, candidate_shapes, expected_tokens, tree_size, tree_speedup
from gpt2np.teach import tree_simulation
from gpt2np.teach.tree_simulation import (C_EPYC, EPYC_PANELS, RATIOS, FixedShape, compare, full_tree, play_round,
                                          simulate_tree_policy)


def test_a_full_tree_has_every_level_s_width_under_every_node_above():
    for widths in [(1,), (3,), (2, 1), (3, 2, 1), (4, 2, 1, 1)]:
        parents = full_tree(widths)
        assert len(parents) == 1 + tree_size(widths) and parents[0] == -1, (widths, parents)
        assert all(parents[i] < i for i in range(1, len(parents))), parents
        level = [0]
        for width in widths:  # each node of a level has exactly `width` children, in order
            children = [i for i in range(1, len(parents)) if parents[i] in level]
            assert [parents[i] for i in children] == [p for p in level for _ in range(width)], (widths, parents)
            level = children


def test_a_round_tries_the_children_in_rank_order_down_the_accepted_path():
    """Coins for three positions, rates 0.5 at every rank: position 0's rank 0 fails and rank 1 passes; position 1's
    rank 0 passes; position 2: every rank fails."""
    coins = np.array([[0.9, 0.1, 0.0], [0.2, 0.9, 0.9], [0.8, 0.7, 0.6]])
    rates = [[0.5, 0.5, 0.5]] * 3
    parents, tried, overlaps, reached = play_round((2, 1, 2), rates, coins, 0)
    assert parents == (-1, 0, 0, 1, 2, 3, 3, 4, 4)
    assert tried == [(1, False), (2, True), (4, True), (7, False), (8, False)], tried
    assert overlaps == [0.0, 1.0, 0.0] and reached == 2


@pytest.mark.parametrize("widths, alpha", [((3, 1), 0.6), ((2, 2, 1), 0.8), ((1, 1, 1, 1), 0.7)])
def test_the_forced_coins_give_tree_shape_s_expected_tokens(widths, alpha):
    """Tokens per round (accepted depth + 1) over 20,000 rounds against expected_tokens at the same rates: within
    4 standard errors (a false alarm about once in 16,000). The control: the prediction at rates 0.15 higher is
    more than 10 standard errors away."""
    rng = np.random.default_rng(7)
    rates = [[min(1.0, alpha * r) for r in RATIOS]] * len(widths)
    coins = rng.random((20_000 * len(widths), len(RATIOS)))
    tokens = np.array([play_round(widths, rates, coins, i * len(widths))[3] + 1 for i in range(20_000)])
    mean, se = tokens.mean(), tokens.std() / np.sqrt(len(tokens))
    predicted = expected_tokens(widths, rates)
    print(f"{widths} at alpha {alpha}: {mean:.4f} tokens a round, predicted {predicted:.4f} ({(mean - predicted) / se:+.2f} SE)")
    assert abs(mean - predicted) <= 4 * se
    higher = expected_tokens(widths, [[min(1.0, a + 0.15) for a in row] for row in rates])
    assert abs(mean - higher) > 10 * se, "the control: rates 0.15 off should be told apart"


def test_a_fixed_shape_s_speed_is_tree_speedup_s_prediction():
    """A fixed shape never decodes plainly, so no catch-up: its tokens over its cost in many long runs is
    E[tokens] / (depth c + v(1 + n)), tree_speedup's prediction (o = 0), to within 1 %."""
    for widths, alpha in [((2, 1), 0.8), ((3,), 0.3), ((1,) * 5, 0.8)]:
        runs = [simulate_tree_policy(FixedShape(widths), alpha, C_EPYC, EPYC_PANELS, 400, seed) for seed in range(40)]
        measured = np.mean([r["speedup"] for r in runs])
        rates = [[min(1.0, alpha * r) for r in RATIOS]] * len(widths)
        predicted = tree_speedup(widths, rates, C_EPYC, EPYC_PANELS)
        print(f"{widths} alpha {alpha}: {measured:.4f} against {predicted:.4f}")
        assert measured == pytest.approx(predicted, rel=0.01)


def test_auto_gains_with_trees_where_drafts_are_unsure_and_plays_chains_at_alpha_1(monkeypatch):
    """On this EPYC's panels curve at 48 tokens: at alpha 0.3 and 0.5 AutoTree beats the best fixed chain's median
    (a few candidates for the next token, one draft call), where AutoTree told never to branch (the control: the
    same rule, TREE_MARGIN too high for any tree) does not; at alpha 1 it branches in no round of any seed."""
    seeds = range(40)
    for alpha in (0.3, 0.5):
        auto = compare(alpha, C_EPYC, EPYC_PANELS, 48, seeds, trees=())
        monkeypatch.setattr(tree_policy, "TREE_MARGIN", 100.0)
        chains = compare(alpha, C_EPYC, EPYC_PANELS, 48, seeds, trees=())
        monkeypatch.undo()
        print(f"alpha {alpha}: auto {np.median(auto['ratios']):.3f}, chains only {np.median(chains['ratios']):.3f} "
              f"of the best chain K={auto['best']}")
        assert np.median(auto["ratios"]) >= 1.03 and np.median(chains["ratios"]) < 1.0
    shapes = [simulate_tree_policy(tree_policy.AutoTree(8), 1.0, C_EPYC, EPYC_PANELS, 48, s)["shapes"] for s in seeds]
    assert all(max(w, default=1) == 1 for run in shapes for w in run), "a tree played at alpha 1"
    assert np.median(compare(1.0, C_EPYC, EPYC_PANELS, 48, seeds, trees=())["ratios"]) >= 0.95


def test_the_table_prints_every_alpha(capsys):
    tree_simulation.main(["--seeds", "3"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.") or line.startswith("| 1.")]
    assert [row.split("|")[1].strip() for row in rows] == ["0.3", "0.5", "0.8", "1.0"], rows


def test_a_tree_must_hold_were_alpha_a_standard_deviation_higher():
    """holds_if_higher (AutoTree, 3.): at first-child rates of 0.65 (siblings at the bundled pair's ratios) the best
    shape is the tree (3, 1); a belief of 40 positions (sd 0.075) leaves room for alpha 0.72, where a chain beats it,
    while one of 400 (sd 0.024) does not. TREE_CONFIDENCE = 0 is the rule before: the best shape at the mean holds."""
    shapes = candidate_shapes(8, 4, 15)
    rates = [[0.65 * r for r in RATIOS]] * 8
    shape, _ = best_shape(rates, C_EPYC, EPYC_PANELS, shapes)
    assert shape == (3, 1), shape
    held = {n: holds_if_higher(shape, rates, (0.65 * n, 0.35 * n), C_EPYC, EPYC_PANELS, 0.0, 1.0, 8) for n in (40, 400)}
    assert held == {40: False, 400: True}, held
    assert scaled_up(rates, (26.0, 14.0), z=0.0) == rates
    assert max(max(row) for row in scaled_up([[0.99, 0.5]], (2.0, 1.0))) == 1.0  # capped at 1


def test_a_tree_that_holds_only_at_the_mean_loses_at_alpha_0_8(monkeypatch):
    """200 seeds, 48 tokens, this EPYC's panels curve: at alpha 0.8 AutoTree comes at least a point closer to the best
    chain than the control, TREE_CONFIDENCE = 0 (a tree wherever the belief's mean says so: the rule before, 0.945
    there), and at alpha 0.3 / 0.5 it still beats the best chain by 3 % (the trees it gives up were the unlucky ones)."""
    seeds = range(200)
    now = {alpha: np.median(compare(alpha, C_EPYC, EPYC_PANELS, 48, seeds, trees=())["ratios"]) for alpha in (0.3, 0.5, 0.8)}
    monkeypatch.setattr(tree_policy, "TREE_CONFIDENCE", 0.0)
    before = np.median(compare(0.8, C_EPYC, EPYC_PANELS, 48, seeds, trees=())["ratios"])
    print(f"auto / best chain: alpha 0.3 {now[0.3]:.3f}, 0.5 {now[0.5]:.3f}, 0.8 {now[0.8]:.3f} (control {before:.3f})")
    assert now[0.8] >= before + 0.01 and now[0.3] >= 1.03 and now[0.5] >= 1.03, (now, before)


def test_the_probe_reads_what_the_run_s_budget_reads():
    """As a 1558M GPT2 (48 blocks) reads it for AutoTree (speculative.read_cost_shape): at 48 tokens one reading of
    16 sizes does not fit 1 % of the run's passes, so its chains' 9 sizes are read and carried on; at 60 tokens all
    16. The shape's first 9 sizes are the same reading either way (the seed's noise, size by size)."""
    def read(n_tokens, seed=3):
        target = tree_simulation.ProbedTarget(EPYC_PANELS, seed)
        return tree_simulation.read_cost_shape(target, tree_policy.AutoTree(8), n_tokens)[0]
    short, long = read(48), read(60)
    assert sorted(short) == sorted(long) == list(range(1, 17))
    assert all(short[M] == long[M] for M in range(1, 10)), (short, long)
    slope = (short[9] - short[7]) / 2
    assert all(short[M] == pytest.approx(short[9] + max(0.0, slope) * (M - 9)) for M in range(10, 17)), short
    assert any(abs(short[M] - long[M]) > 1e-9 for M in range(10, 17)), "rows past 9 read at 60 tokens, carried at 48"
    assert tree_simulation.read_cost_shape(tree_simulation.ProbedTarget(EPYC_PANELS, 3, n_layer=12),
                                           tree_policy.AutoTree(8), 48)[0] is None  # 124M's 12 blocks: none fits


class Reader:
    """A fixed chain that records the readings the loop shows a policy (observe's past), a round at a time."""

    def __init__(self, widths):
        self.widths, self.seen = tuple(widths), []

    def reset(self):
        pass

    def choose(self, past):
        self.seen.append((dict(past.target_durations),))
        return len(self.widths)

    def update(self, event):
        self.seen.append(("round", len(event.drafts), event.propose_seconds))


@pytest.mark.parametrize("noise", [0.3, "spiky"])
def test_the_readings_carry_the_noise_and_the_seconds_counted_do_not(noise):
    """--noise reaches what the policy reads (the target call, the draft, the round), never the run's cost; the
    readings are late far more often than early under "spiky", as batch_simulation.SPIKES measured them."""
    args = (0.8, C_EPYC, EPYC_PANELS, 48)
    quiet = [simulate_tree_policy(FixedShape((1,) * 4), *args, seed)["speedup"] for seed in range(5)]
    noisy = [simulate_tree_policy(FixedShape((1,) * 4), *args, seed, noise=noise)["speedup"] for seed in range(5)]
    assert noisy == quiet  # a fixed chain reads nothing: the same rounds, the same cost
    logs = []
    for seed in range(20):
        reader = Reader((1, 1, 1, 1))
        simulate_tree_policy(reader, *args, seed, noise=noise)
        durations = reader.seen[-2][0]  # the last choose's: every timed call so far (the first round's untimed)
        logs += [float(np.log(x / EPYC_PANELS[5])) for x in durations[5]]
        rounds = [r for r in reader.seen if r[0] == "round"][1:]
        logs += [float(np.log(propose / (n * C_EPYC))) for _, n, propose in rounds if n]  # per drafted level
    logs = np.array(logs)
    assert len(logs) > 300 and np.std(logs) > 0.05, (len(logs), np.std(logs))
    if noise == "spiky":
        assert np.mean(logs > 0.1) > 0.05 and np.mean(logs < -0.1) < 0.01, (np.mean(logs > 0.1), np.mean(logs < -0.1))
    else:
        assert 0.2 < np.std(logs) < 0.4, f"log-readings' spread {np.std(logs):.3f} against the noise's 0.3"
    exact = Reader((1, 1, 1, 1))
    simulate_tree_policy(exact, *args, 0)
    assert set(exact.seen[-2][0][5]) == {EPYC_PANELS[5]}  # no noise: every reading is the cost itself


def test_noisy_readings_change_some_of_auto_s_rounds():
    runs = [simulate_tree_policy(tree_policy.AutoTree(8), 0.8, C_EPYC, EPYC_PANELS, 48, seed, noise=noise)
            for seed in range(10) for noise in (None, "spiky")]
    assert any(a["shapes"] != b["shapes"] for a, b in zip(runs[::2], runs[1::2])), "the spikes changed no decision"


def test_the_table_takes_spiky_readings_and_rejects_other_words(capsys):
    tree_simulation.main(["--seeds", "2", "--noise", "spiky"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| 0.", "| 1."))]
    assert "readings spiky" in out.splitlines()[0] and len(rows) == 4, out
    with pytest.raises(SystemExit) as stopped:
        tree_simulation.main(["--noise", "loud"])
    assert stopped.value.code == 2 and "must be 'spiky' or a log-standard deviation from 0 to 3 (3: readings off " \
                                       "by 20x either way), got 'loud'" in capsys.readouterr().err


def test_the_help_says_which_run_the_default_tokens_replay(capsys, monkeypatch):
    """--tokens defaults to 48, the documented trees runs' --tree-tokens, not the bench's own default (32): the
    help said "the bench's trees section", which runs 32 unless told."""
    from bench.trees import TreePlan
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps the help at the terminal's width: one line each
    with pytest.raises(SystemExit):
        tree_simulation.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: 48, as the trees runs in PERFORMANCE.md" in text and "--tree-tokens 48" in text, text
    assert f"the bench's own --tree-tokens default is {TreePlan().n_tokens}" in text, text


@pytest.mark.parametrize("argv, says", [
    (["--noise", "1e308"], "argument --noise: must be 'spiky' or a log-standard deviation from 0 to 3"),  # Overflow
    (["--tokens", "99999999999"], "--tokens 99999999999 is too many: at most 1000"),  # was a MemoryError
    (["--tokens", "1"], "--tokens at least 2"),
])
def test_bad_flags_are_one_line_errors(capsys, argv, says):
    with pytest.raises(SystemExit) as stopped:
        tree_simulation.main(["--seeds", "2", *argv])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert err.startswith("python -m gpt2np.teach.tree_simulation: error: "), err
