"""python -m bench refuses, in one line and before any work, sizes too small for a section's contexts (audit 61)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is a top-level folder beside gpt2np/

import bench.__main__ as cli  # noqa: E402


@pytest.fixture
def no_work(monkeypatch):
    def measure(*args, **kwargs):
        raise AssertionError("the flags were accepted and the run started")
    monkeypatch.setattr(cli, "run", measure)


@pytest.mark.parametrize("flags, says", [
    (["--sections", "decode"], "--sections decode: steps at context 896 need a context of 897 tokens; "
                               "--sizes tiny has 32: larger sizes, or leave decode out"),
    (["--sections", "prefill"], "--sections prefill: prompts of up to 1000 need a context of 1000 tokens"),
    (["--sections", "verify"], "--sections verify: 9 tokens at context 896 need a context of 905 tokens"),
    (["--sections", "hf"], "--sections hf: prompts of up to 1000"),
    (["--sections", "kernels", "--kernel-sizes", "tiny"], "--sections kernels: 16 tokens at context 128 need a "
                                                          "context of 144 tokens; --kernel-sizes tiny has 32"),
])
def test_sizes_too_small_for_a_sections_contexts_are_one_line_before_any_work(flags, says, no_work, capsys,
                                                                              tmp_path):
    with pytest.raises(SystemExit) as done:
        cli.main([*flags, "--sizes", "124M,tiny", "--repeats", "1", "--json", str(tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and err.startswith("python -m bench: error: "), err
    assert says in err, err
    assert not (tmp_path / "b.json").exists()


def test_the_tiny_plan_fits_every_sections_contexts(no_work, tmp_path):
    with pytest.raises(AssertionError, match="run started"):
        cli.main(["--tiny", "--sections", "prefill,decode,verify,hf,kernels,reference", "--json",
                  str(tmp_path / "b.json")])
