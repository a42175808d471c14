"""The bench's forced drafters at the prompt's positions, where auto reads the overlaps before its first round.

There the target wants its own greedy token after each prefix of the prompt (wanted_sequence), and a forced
drafter agrees with it exactly where its coin says so, as at every generated position: the overlaps auto reads
are the coins, position by position, for the chain drafter and for the tree drafter (at the first depth's rates).
"""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import gpt2np
from gpt2np.decoding.drafters import ModelDrafter
from gpt2np.decoding.policies import PROMPT_POSITIONS
from gpt2np.decoding.speculative import read_prompt
from gpt2np.decoding.stopwatch import TimedModel

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # bench/ is a top-level folder beside gpt2np/, not an installed package

from bench.forced_draft import ForcedAcceptanceDraft, wanted_sequence  # noqa: E402
from bench.forced_tree_draft import ForcedTreeDrafter  # noqa: E402
from tiny_pair import tiny_pair  # noqa: E402

GREEDY = dict(temperature=0, top_k=None, top_p=None)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(40, 20)


def test_the_wanted_sequence_is_the_target_s_greedy_token_after_each_prefix(pair):
    target, _, prompt, continuation = pair
    wanted = wanted_sequence(target, prompt, continuation)
    one_at_a_time = [int(np.argmax(target.forward(np.asarray(prompt[:i]), target.new_cache())[-1]))
                     for i in range(1, len(prompt))]
    assert wanted == prompt[:1] + one_at_a_time + continuation
    assert wanted[len(prompt)] == continuation[0]  # the last prefix's greedy token is the first generated one
    assert sum(w != p for w, p in zip(wanted[1:len(prompt)], prompt[1:])) > len(prompt) // 2  # not the prompt


def read(target, drafter, prompt):
    drafter.reset(target)
    reading = SimpleNamespace(prompt_positions=PROMPT_POSITIONS)  # auto with policies.READ_PROMPT set asks for these
    overlaps, _ = read_prompt(TimedModel(target), drafter, prompt, GREEDY, reading)
    return overlaps


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_the_forced_draft_agrees_at_the_prompt_s_positions_exactly_where_its_coins_say(pair, alpha):
    target, draft, prompt, continuation = pair
    forced = ForcedAcceptanceDraft(draft, wanted_sequence(target, prompt, continuation), alpha, seed=5)
    overlaps = read(target, ModelDrafter(forced), prompt)
    positions = range(len(prompt) - PROMPT_POSITIONS, len(prompt))  # the rows predict these positions
    assert overlaps == [float(forced.choices.agree[i]) for i in positions]
    control = ForcedAcceptanceDraft(draft, prompt + continuation, alpha, seed=5)  # the prompt's own tokens
    assert sum(read(target, ModelDrafter(control), prompt)) < sum(overlaps)      # are not what the target wants


def test_the_forced_tree_drafter_agrees_at_the_prompt_s_positions_at_the_first_depth_s_rate(pair):
    target, draft, prompt, continuation = pair
    rates = ((0.7, 0.5), (0.2, 0.5))
    drafter = ForcedTreeDrafter(draft, wanted_sequence(target, prompt, continuation), rates, (2, 1), seed=2)
    choices = drafter.model.choices
    overlaps = read(target, drafter, prompt)
    positions = range(len(prompt) - PROMPT_POSITIONS, len(prompt))
    assert overlaps == [float(choices.rank_of_baseline(i, 0) == 0) for i in positions]
    assert overlaps != [float(choices.rank_of_baseline(i, 1) == 0) for i in positions]  # depth 2's would differ
