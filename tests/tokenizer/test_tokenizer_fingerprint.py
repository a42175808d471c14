"""Tokenizer.fingerprint: one sha256 for the whole vocabulary, merges and special tokens (issue 13).

Equal for the same vocabulary however it is loaded (twice, from-scratch or tiktoken-backed),
different as soon as one token or one merge differs, and named in the draft/target check's error.
"""
import json
from types import SimpleNamespace

import pytest

from conftest import gpt2_bpe_dir
from gpt2np.decoding.drafters import check_same_vocabulary
from gpt2np.tokenizer.bpe import BYTE_TO_SYMBOL, EOT, Tokenizer
from gpt2np.tokenizer.files import load_tokenizer

MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]


def write_vocab(folder, merges=MERGES, swap=None, eot=True):
    """Byte symbols (ids 0..255), then each merge's result, then <|endoftext|>; `swap` = two
    tokens whose ids are exchanged. Returns the folder, ready for load_tokenizer."""
    encoder = {symbol: i for i, symbol in enumerate(BYTE_TO_SYMBOL.values())}
    for a, b in merges:
        encoder.setdefault(a + b, len(encoder))
    if eot:
        encoder[EOT] = len(encoder)
    if swap:
        x, y = swap
        encoder[x], encoder[y] = encoder[y], encoder[x]
    folder.mkdir()
    (folder / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                      encoding="utf-8")
    return folder


def test_same_vocabulary_same_fingerprint(tmp_path):
    first, second = write_vocab(tmp_path / "first"), write_vocab(tmp_path / "second")
    tokenizers = [load_tokenizer(folder, fast=fast) for folder in (first, second) for fast in (False, True)]
    fingerprints = {t.fingerprint for t in tokenizers}
    assert len(fingerprints) == 1, fingerprints
    fingerprint = fingerprints.pop()
    assert len(fingerprint) == 64 and set(fingerprint) <= set("0123456789abcdef")  # a sha256 in hex


@pytest.mark.parametrize("change", [
    dict(merges=[*MERGES[:-1], ("Ġ", "h")]),        # the last merge replaced by another
    dict(merges=[MERGES[1], MERGES[0], *MERGES[2:]]),  # two merges' ranks exchanged
    dict(swap=("a", "b")),                          # two tokens' ids exchanged
    dict(swap=("hell", EOT)),                       # the special token moved
    dict(eot=False),                                # no special token (and one token fewer)
], ids=["one merge", "merge ranks", "one token", "special token id", "no special token"])
def test_any_change_changes_the_fingerprint(tmp_path, change):
    original = load_tokenizer(write_vocab(tmp_path / "original"), fast=False).fingerprint
    changed = load_tokenizer(write_vocab(tmp_path / "changed", **change), fast=False)
    assert changed.fingerprint != original  # (tiktoken refuses ids out of GPT-2's order: scratch only)


def test_fingerprint_in_repr(tmp_path):
    tok = load_tokenizer(write_vocab(tmp_path / "v"))
    assert repr(tok) == f"FastTokenizer(n_vocab=261, merges=4, eot_id=260, fingerprint={tok.fingerprint[:12]})"


def test_gpt2_fast_and_scratch_agree():
    folder = gpt2_bpe_dir()
    if folder is None:
        pytest.skip("GPT-2's encoder.json/vocab.bpe not found in ../shared/data/gpt2-bpe or weights/*")
    scratch, fast = load_tokenizer(folder, fast=False), load_tokenizer(folder, fast=True)
    assert scratch.fingerprint == fast.fingerprint
    swapped = {**scratch.encoder, EOT: 0, "!": 50256}  # two ids exchanged
    assert Tokenizer(swapped, list(scratch.ranks)).fingerprint != scratch.fingerprint


def test_draft_target_check_names_both_fingerprints(tmp_path):
    def model(tokenizer):  # what check_same_vocabulary reads of a model
        return SimpleNamespace(n_vocab=tokenizer.n_vocab, eot_id=tokenizer.eot_id, tokenizer=tokenizer)

    target = load_tokenizer(write_vocab(tmp_path / "target"))
    same = load_tokenizer(write_vocab(tmp_path / "same"), fast=False)
    other = load_tokenizer(write_vocab(tmp_path / "other", swap=("a", "b")), fast=False)
    check_same_vocabulary(model(target), model(same))  # another object, the same vocabulary: fine
    message = (f"draft and target tokenizers differ (fingerprints: draft {other.fingerprint[:12]}, "
               f"target {target.fingerprint[:12]})")
    with pytest.raises(ValueError) as error:
        check_same_vocabulary(model(target), model(other))
    assert str(error.value).startswith(message), str(error.value)
