"""Tests for gpt2np.tokenizer.bpe: the from-scratch BPE against tiktoken, round trips, known ids, errors.

GPT-2's real encoder.json/vocab.bpe are third-party files and never live in this repo: tests that
need them look in ../shared/data/gpt2-bpe/ (next to the repo) or a downloaded weights/<size>/,
and skip with a one-line reason if neither holds OpenAI's exact bytes.
"""
import doctest
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import regex
import tiktoken

import gpt2np.tokenizer.bpe as tokenizer_module
from conftest import FIXTURES, copy_fixture, gpt2_bpe_dir
from gpt2np.tokenizer.bpe import BYTE_TO_SYMBOL, Tokenizer, bytes_to_unicode, replace_lone_surrogates
from gpt2np.tokenizer.fast import FastTokenizer
from gpt2np.tokenizer.files import load_hf_tokenizer, load_tokenizer, write_byte_level_vocab
from gpt2np.tokenizer.unicode_classes import LETTER, NEWER_THAN_UNICODE_16, NUMBER

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "data" / "corpus" / "tinyshakespeare.txt"
SETTINGS = hypothesis.settings(deadline=None, max_examples=200)


@pytest.fixture(scope="module")
def gpt2():
    folder = gpt2_bpe_dir()
    if folder is None:
        pytest.skip("GPT-2's encoder.json/vocab.bpe not found in ../shared/data/gpt2-bpe or weights/*")
    return scratch_and_fast(folder)


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    return scratch_and_fast(write_byte_level_vocab(tmp_path_factory.mktemp("byte_level")))


def scratch_and_fast(folder):
    """Both tokenizers of a folder; the fast one really tiktoken's (load_tokenizer falls back to scratch
    for files tiktoken cannot use, which would make every comparison here scratch against scratch)."""
    tokenizers = {"scratch": load_tokenizer(folder, fast=False), "fast": load_tokenizer(folder, fast=True)}
    assert type(tokenizers["fast"]) is FastTokenizer
    return tokenizers


@pytest.fixture(scope="module", params=["gpt2", "byte_level"])
def vocab(request):
    """Each vocabulary in turn, as {"scratch": Tokenizer, "fast": FastTokenizer}."""
    return request.getfixturevalue(request.param)


@functools.cache
def unicode_classes():
    """Two dicts {class: set of characters} for \\p{L}, \\p{N}, \\s: as our pre-tokenizer and tiktoken see it.

    tiktoken encodes only the regex *matches* (text between matches is dropped), so an Encoding
    whose pattern is just r"\\p{L}", over a byte-level vocabulary, decodes back to exactly the
    characters its Rust regex engine calls letters. Takes about 1 s for all 1.1M code points.
    """
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    ranks = {bytes([b]): b for b in range(256)}
    ours_spelling = {r"\p{L}": LETTER, r"\p{N}": NUMBER, r"\s": r"\s"}
    ours, theirs = {}, {}
    for cls, spelling in ours_spelling.items():
        enc = tiktoken.Encoding(name="probe", pat_str=cls, mergeable_ranks=ranks, special_tokens={})
        theirs[cls] = set(enc.decode(enc.encode_ordinary(everything)))
        ours[cls] = set(regex.findall(spelling, everything, flags=regex.VERSION1))
    return ours, theirs


def hex_ranges(chars):
    """{"a", "b", "c", "x"} -> "0061-0063 0078", NEWER_THAN_UNICODE_16's notation."""
    ranges = []
    for c in sorted(map(ord, chars)):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return " ".join(f"{a:04X}" if a == b else f"{a:04X}-{b:04X}" for a, b in ranges)


def newer_than_unicode_16():
    """The characters unicode_classes.NEWER_THAN_UNICODE_16 takes out of the letters and numbers."""
    table = NEWER_THAN_UNICODE_16
    chars = set()
    for r in (table["letters"] + " " + table["numbers"]).split():
        first, _, last = r.partition("-")
        chars.update(chr(c) for c in range(int(first, 16), int(last or first, 16) + 1))
    return chars


# Fragments that stress the pre-tokenizer: contractions (GPT-2 matches lower case only), every kind
# of whitespace run, digits in several scripts, emoji sequences, combining marks, control bytes.
FRAGMENTS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'VE", "'", "<|endoftext|>",
             " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\x0b", "\x0c", "\x85", "\xa0",
             "\u2009", "\u3000", "\u2028", "\u200b", "\ufeff", "0", "123", "٣٤", "½", "Ⅻ", "😀", "👍🏽",
             "👩‍💻", "🇫🇷", "e\u0301", "中文", "ﬁ", "\x00", "\x7f", "dog", " world", "...", "—"]
# Any text without lone surrogates (st.text() leaves them out); every path must round-trip it.
any_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=12).map("".join)
# Scratch and tiktoken must agree on every text. Unlike st.text(), st.characters() draws lone
# surrogates too (both paths must turn them into U+FFFD); letters and numbers newer than Unicode
# 16.0 (where the two libraries' tables differ) are 1.6% of all code points, so they are drawn
# on purpose as well.
NEWER = ["\U000323B0", "\U00018E00", "\u0C5C", "\U00011DE0", "\U00012550", "\U0003D000"]
every_text = st.lists(st.one_of(
    st.sampled_from(FRAGMENTS + NEWER), st.text(st.characters(), max_size=8)), max_size=12).map("".join)


@pytest.mark.parametrize("path", ["scratch", "fast"])
def test_known_ids(gpt2, path):
    tok = gpt2[path]
    assert tok.encode("Hello, world!") == [15496, 11, 995, 0]
    alan = "Alan Turing theorized that computers would one day become"
    assert tok.encode(alan) == [36235, 39141, 18765, 1143, 326, 9061, 561, 530, 1110, 1716]
    assert tok.n_vocab == 50257 and tok.eot_id == 50256
    assert tok.encode("a<|endoftext|>b") == [64, 50256, 65]  # the literal text is the special id


def test_tinyshakespeare_scratch_equals_tiktoken(gpt2):
    if not CORPUS.is_file():
        pytest.skip(f"corpus not found: {CORPUS}")
    text = CORPUS.read_text(encoding="utf-8")
    ids = gpt2["scratch"].encode(text)  # ~0.5 s thanks to the per-pre-token cache
    assert ids == gpt2["fast"].encode(text)
    assert len(ids) == 338025  # = 301,966 + 36,059, nanoGPT's data/shakespeare/prepare.py counts
    assert gpt2["scratch"].decode(ids) == text


@SETTINGS
@hypothesis.given(text=every_text)
def test_scratch_equals_tiktoken_on_unicode(gpt2, text):
    assert gpt2["scratch"].encode(text) == gpt2["fast"].encode(text)


@SETTINGS
@hypothesis.given(text=any_text)
def test_roundtrip(vocab, text):
    for tok in vocab.values():
        assert tok.decode(tok.encode(text)) == text


def test_pre_tokenizer_classes_are_tiktokens_on_every_code_point():
    """Our letters, numbers and whitespace are tiktoken's, code point for code point (Unicode 16.0).

    `regex` alone would call the letters and numbers of Unicode 17.0/18.0 \\p{L}/\\p{N}, tiktoken
    "other"; unicode_classes.NEWER_THAN_UNICODE_16 takes them out. If this fails, a library changed its
    Unicode version: the message gives the ranges to add to or drop from that table.
    """
    ours, theirs = unicode_classes()
    for cls in ours:
        extra, missing = ours[cls] - theirs[cls], theirs[cls] - ours[cls]
        assert not extra and not missing, (
            f"{cls}: {len(extra)} code points only we match ({hex_ranges(extra)[:300]}: add them to "
            f"NEWER_THAN_UNICODE_16), {len(missing)} only tiktoken matches ({hex_ranges(missing)[:300]}: "
            f"drop them there, or install regex >= 2024.9.11 (Unicode 16.0) if they are not in it)")


def test_newer_letters_are_not_letters_on_either_path(gpt2):
    """A Unicode 17/18 letter X before "'s" is "X'" + "s" (82) on both paths: punctuation-like, as in
    tiktoken. With `regex`'s own \\p{L} the scratch path would give "X" + "'s" (338)."""
    newer = sorted(newer_than_unicode_16())
    assert len(newer) == 17480  # 17,144 letters + 336 numbers, Unicode 17.0 and 18.0
    for c in newer[::500]:
        assert gpt2["scratch"].encode(c + "'s") == gpt2["fast"].encode(c + "'s")
        assert gpt2["scratch"].encode(c + "'s")[-1] == 82
        if regex.fullmatch(r"\p{L}", c):  # this `regex` knows it as a letter: the old split shows it
            assert regex.findall(r"""'s| ?\p{L}+| ?[^\s\p{L}\p{N}]+""", c + "'s") == [c, "'s"]


def test_lone_surrogates_become_replacement_char(vocab):
    text = "a\ud800b\udfff\ud83d\ude00"  # lone surrogates have no UTF-8; a valid pair is one emoji
    assert vocab["scratch"].encode(text) == vocab["fast"].encode(text)
    assert vocab["scratch"].decode(vocab["scratch"].encode(text)) == "a\ufffdb\ufffd😀"


def check_steps(tok, text):
    steps = tok.encode_with_steps(text)
    assert steps["ids"] == tok.encode(text)
    assert "".join(p["text"] for p in steps["pre_tokens"]) == replace_lone_surrogates(text)
    for p in steps["pre_tokens"]:
        assert p["bytes"] == list(p["text"].encode("utf-8"))
        assert p["special"] or p["symbols"] == [BYTE_TO_SYMBOL[b] for b in p["bytes"]]
        ranks = [m["rank"] for m in p["merges"]]
        assert ranks == sorted(set(ranks))  # merges are applied in the order they were learned
        for m in p["merges"]:  # a merge regroups symbols, never changes them
            assert "".join(m["symbols"]) == "".join(p["symbols"]) and "".join(m["pair"]) in m["symbols"]
        assert p["tokens"] == (p["merges"][-1]["symbols"] if p["merges"] else p["symbols"])
        assert p["ids"] == [tok.encoder[t] for t in p["tokens"]]
    json.dumps(steps)  # plain data


@SETTINGS
@hypothesis.given(text=every_text)
def test_encode_with_steps_matches_encode(gpt2, text):
    check_steps(gpt2["scratch"], text)
    assert gpt2["fast"].encode_with_steps(text)["ids"] == gpt2["fast"].encode(text)


def test_encode_with_steps_example(gpt2):
    steps = gpt2["scratch"].encode_with_steps(" world<|endoftext|>")
    world, eot = steps["pre_tokens"]
    assert world["symbols"] == ["Ġ", "w", "o", "r", "l", "d"] and world["tokens"] == ["Ġworld"]
    # the merge order read off GPT-2's vocab.bpe: (pair, its rank)
    assert [(m["pair"], m["rank"]) for m in world["merges"]] == [
        (("Ġ", "w"), 10), (("o", "r"), 17), (("l", "d"), 79), (("Ġw", "or"), 220), (("Ġwor", "ld"), 739)]
    assert eot == {"text": "<|endoftext|>", "special": True, "bytes": list(b"<|endoftext|>"),
                   "symbols": ["<|endoftext|>"], "merges": [], "tokens": ["<|endoftext|>"], "ids": [50256]}


def test_bytes_to_unicode():
    b2u = bytes_to_unicode()
    assert sorted(b2u) == list(range(256)) and len(set(b2u.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in b2u.values())  # safe in a text file


def test_byte_level_vocab(byte_level):
    for tok in byte_level.values():
        assert (tok.n_vocab, tok.eot_id) == (257, 256)
        assert tok.encode("hi!<|endoftext|>") == [71, 72, 0, 256]
        assert tok.encode(" \n") == [220, 198]  # GPT-2's ids for " " and "\n"


def test_byte_level_ids_are_gpt2_byte_ids(gpt2, byte_level):
    for symbol in BYTE_TO_SYMBOL.values():  # id i is the byte of GPT-2's id i, for i < 256
        assert byte_level["scratch"].encoder[symbol] == gpt2["scratch"].encoder[symbol]


@SETTINGS
@hypothesis.given(text=any_text)
def test_byte_level_one_id_per_byte(byte_level, text):
    ids = byte_level["scratch"].encode(text)
    assert ids == byte_level["fast"].encode(text)  # no merges: Unicode tables cannot matter
    if "<|endoftext|>" not in text:
        assert len(ids) == len(text.encode("utf-8", "replace"))


@pytest.mark.parametrize("path", ["scratch", "fast"])
def test_decode_invalid_utf8_and_bad_ids(byte_level, path):
    tok = byte_level[path]
    e2 = tok.encoder[BYTE_TO_SYMBOL[0xE2]]  # the first of 3 bytes of e.g. "—"
    assert tok.decode_bytes([e2]) == b"\xe2" and tok.decode([71, e2, 72]) == "h\ufffdi"
    for bad in [257, -1]:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([71, bad])


@pytest.mark.parametrize("ids, says", [
    ([1.0], "must be ints, got float 1.0"), ([71, 1.5], "must be ints, got float 1.5"),
    ([None], "must be ints, got NoneType None"), ([True], "must be ints, got bool True"),
    ("ab", "1-D sequence of ints, got str"), (b"GH", "1-D sequence of ints, got bytes"),
    (5, "1-D sequence of ints, got int"), (None, "1-D sequence of ints, got NoneType"),
    ((i for i in [71]), "1-D sequence of ints, got generator"),
    (np.array([[71, 72]]), r"1-D sequence of ints, got ndarray of shape \(1, 2\)"),
    (np.array([71.0]), "must be ints, got float64"), (np.array([True]), "must be ints, got bool"),
    (np.array([71, 300]), "token id 300 is outside the vocabulary 0..256"),
], ids=["float", "half", "None", "bool", "str", "bytes", "int", "no-ids", "generator", "2-D", "float-array",
        "bool-array", "int-array-out-of-range"])
@pytest.mark.parametrize("path", ["scratch", "fast"])
def test_decode_refuses_what_is_not_token_ids(byte_level, path, ids, says):
    """One line naming what is wrong, on both paths: these failed deep inside (tiktoken's or a list's
    TypeError), or decoded (a bool as id 1, bytes as their values, a generator as nothing)."""
    with pytest.raises(ValueError, match=says) as e:
        byte_level[path].decode(ids)
    assert "\n" not in str(e.value)
    assert byte_level[path].decode(np.array([71, 72], np.uint16)) == byte_level[path].decode((71, 72)) == "hi"


def write_vocab(folder, encoder, bpe_text):
    folder.mkdir(exist_ok=True)
    (folder / "encoder.json").write_text(json.dumps(encoder) if isinstance(encoder, dict) else encoder)
    (folder / "vocab.bpe").write_text(bpe_text)
    return folder


def byte_encoder(*extra):
    encoder = {s: i for i, s in enumerate(BYTE_TO_SYMBOL.values())}
    return {**encoder, **{token: 256 + n for n, token in enumerate(extra)}}


def test_tiktoken_reads_files_afresh(tmp_path):
    """tiktoken's file cache is keyed by path; rewriting the files must change the tokenizer."""
    env_before = os.environ.get("TIKTOKEN_CACHE_DIR")
    folder = write_byte_level_vocab(tmp_path)
    assert FastTokenizer.from_dir(folder).encode("hi") == [71, 72]
    write_vocab(folder, byte_encoder("hi", "<|endoftext|>"), "#version: 0.2\nh i\n")
    for fast in [True, False]:
        assert load_tokenizer(folder, fast).encode("hi hi<|endoftext|>") == [256, 220, 256, 257]
    assert os.environ.get("TIKTOKEN_CACHE_DIR") == env_before


@pytest.mark.parametrize("encoder, bpe, match", [
    ("{", "#version: 0.2\n", "not valid JSON"),
    ("[1, 2]", "#version: 0.2\n", "must be a JSON object"),
    ({**byte_encoder(), "<|endoftext|>": 300}, "#version: 0.2\n", "ids must be 0..256"),
    ({s: i for i, s in enumerate(list(BYTE_TO_SYMBOL.values())[1:])}, "", "lacks the symbols"),
    (byte_encoder("€"), "#version: 0.2\n", "not byte symbols"),
    (byte_encoder(), "h i\n", "#version"),
    (byte_encoder("hi"), "#version: 0.2\nh i x\n", "line 2"),
    (byte_encoder("hi"), "#version: 0.2\nh j\n", "line 2"),
], ids=["bad-json", "not-object", "id-gap", "missing-byte", "non-byte-char", "no-header",
        "three-symbols", "merge-not-in-encoder"])
@pytest.mark.parametrize("fast", [False, True])
def test_malformed_files(tmp_path, encoder, bpe, match, fast):
    with pytest.raises(ValueError, match=match):
        load_tokenizer(write_vocab(tmp_path / "v", encoder, bpe), fast)


MERGES = [("h", "i"), ("Ġ", "hi"), ("Ġhi", "!")]  # each merge's token is the next one's part


@pytest.mark.parametrize("kept, pad", [(2, False), (0, False), (3, True), (2, True)],
                         ids=["last-merge-cut", "all-cut", "added", "added-and-cut"])
@pytest.mark.parametrize("fast", [False, True])
def test_merges_must_make_every_token(tmp_path, kept, pad, fast):
    """A vocab.bpe cut at a line's end parses, line by line, but its lost merges' tokens are made by none:
    refused in one line naming the file and the fix. A special-looking token no merge makes ("<|pad|>", as
    a Hugging Face vocab.json may add, or "<pad>", "</s>", "[PAD]") is not a lost merge."""
    added = ["<|pad|>", "<pad>", "</s>", "[PAD]"] if pad else []
    encoder = byte_encoder("hi", "Ġhi", "Ġhi!", "<|endoftext|>", *added)
    bpe = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES[:kept])
    folder = write_vocab(tmp_path / "v", encoder, bpe)
    if kept == len(MERGES):
        assert load_tokenizer(folder, fast).encode(" hi hi") == [257, 257]
        return
    with pytest.raises(ValueError) as e:
        load_tokenizer(folder, fast)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{folder / 'vocab.bpe'} has {kept} merges, but no merge "
                                                        f"makes {len(MERGES) - kept} of the {260 + len(added)} tokens "
                                                        "of encoder.json")
    assert "delete it and download it again" in message


@pytest.mark.parametrize("cut", ["at a line's end", "mid-line"])
def test_gpt2_vocab_bpe_cut_short_is_refused(bpe_dir, tmp_path, cut):
    """The audit's case: GPT-2's vocab.bpe cut half-way (an interrupted copy) loaded, with other ids."""
    text = (bpe_dir / "vocab.bpe").read_bytes()
    end = text.rindex(b"\n", 0, len(text) // 2) + 1
    end += 0 if cut == "at a line's end" else text.index(b" ", end) + 2 - end  # "ĠRe gul" -> "ĠRe g"
    folder = tmp_path / "v"
    folder.mkdir()
    (folder / "encoder.json").write_bytes((bpe_dir / "encoder.json").read_bytes())
    (folder / "vocab.bpe").write_bytes(text[:end])
    for fast in (False, True):
        with pytest.raises(ValueError, match=r"vocab.bpe has 2\d,\d{3} merges, but no merge makes 2\d,\d{3} of the "
                                             r"50,257 tokens of encoder.json .*download it again"):
            load_tokenizer(folder, fast)


@pytest.mark.parametrize("fast", [False, True])
def test_missing_files(tmp_path, fast):
    with pytest.raises(FileNotFoundError, match="encoder.json not found"):
        load_tokenizer(tmp_path / "nowhere", fast)
    (write_byte_level_vocab(tmp_path) / "vocab.bpe").unlink()
    with pytest.raises(FileNotFoundError, match="vocab.bpe not found"):
        load_tokenizer(tmp_path, fast)


@pytest.mark.parametrize("encoder, bpe", [
    ({**byte_encoder(), "!": 1, '"': 0}, "#version: 0.2\n"),  # ids not in GPT-2's byte order
    (byte_encoder("hi"), "#version: 0.2\nh i"),  # no final newline: tiktoken drops the last line
])
def test_scratch_only_layouts(tmp_path, capsys, encoder, bpe):
    """Valid BPE files that tiktoken cannot load: the scratch path works, FastTokenizer itself explains,
    and load_tokenizer(fast=True), which commands and the server use, falls back to scratch with a note."""
    folder = write_vocab(tmp_path / "v", encoder, bpe)
    assert Tokenizer.from_dir(folder).decode(Tokenizer.from_dir(folder).encode("hi!")) == "hi!"
    with pytest.raises(ValueError, match=r"tiktoken cannot use .*\(tiktoken needs .*fast=False"):
        FastTokenizer.from_dir(folder)
    capsys.readouterr()
    tok = load_tokenizer(folder, fast=True)
    assert type(tok) is Tokenizer and tok.encode("hi! hi") == Tokenizer.from_dir(folder).encode("hi! hi")
    err = capsys.readouterr().err
    assert err.startswith("note: tiktoken cannot use ") and err.count("\n") == 1 and "pure-Python" in err, err
    assert "same ids" not in err  # the same as what? tiktoken refused the files


def swapped_merges(folder, source):
    """A copy of a Hugging Face fixture's tokenizer with merge lines 1 and 2 exchanged: valid BPE files
    (each merge's token is in vocab.json) whose ids no longer follow the merges' order, as tiktoken needs."""
    folder.mkdir()
    (folder / "vocab.json").write_bytes((source / "vocab.json").read_bytes())
    lines = (source / "merges.txt").read_text(encoding="utf-8").split("\n")
    lines[1], lines[2] = lines[2], lines[1]
    (folder / "merges.txt").write_text("\n".join(lines), encoding="utf-8")
    return folder


def test_swapped_merge_lines_load_with_the_scratch_tokenizer_and_its_ids(tmp_path, capsys):
    folder = swapped_merges(tmp_path / "v", FIXTURES / "hf-tiny-f32")
    tok, scratch = load_hf_tokenizer(folder), load_hf_tokenizer(folder, fast=False)
    text = "the weather is nice today, thanks<|endoftext|>"
    assert type(tok) is Tokenizer and tok.encode(text) == scratch.encode(text)
    assert tok.fingerprint == scratch.fingerprint
    assert tok.fingerprint != load_hf_tokenizer(FIXTURES / "hf-tiny-f32", fast=False).fingerprint  # other ranks
    assert "note: tiktoken cannot use" in capsys.readouterr().err


def test_main_runs_a_model_whose_merge_lines_are_swapped(tmp_path):
    """The audit's case: main.py stopped on "tiktoken cannot use ... (AssertionError ); try load_tokenizer(dir,
    fast=False)"; now it runs, with one note on stderr."""
    model = copy_fixture(FIXTURES / "hf-tiny-f32", tmp_path / "m")
    (model / "merges.txt").unlink()
    (model / "vocab.json").unlink()
    swapped = swapped_merges(tmp_path / "v", FIXTURES / "hf-tiny-f32")
    for name in ("vocab.json", "merges.txt"):
        (swapped / name).rename(model / name)
    out = subprocess.run([sys.executable, "main.py", "--target_model_size", str(model), "--n_tokens_to_generate",
                          "4", "--prompt", "the weather"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "note: tiktoken cannot use" in out.stderr, out.stderr
    assert "error" not in out.stderr, out.stderr


def test_docstring_examples():
    assert doctest.testmod(tokenizer_module).failed == 0


def test_the_fast_tokenizer_encodes_and_decodes_through_tiktoken(byte_level):
    """FastTokenizer's encode and decode_bytes are tiktoken's calls, not the scratch ones it inherits: a
    function defined in the middle of the class once left both as dead code in its body, and every fast
    tokenizer silently ran the pure-Python merges (the same ids, so only this check sees it)."""
    fast = byte_level["fast"]

    class Stub:  # stands in for the tiktoken.Encoding: what the tokenizer returns must come from here
        def encode(self, text, allowed_special):
            return ["tiktoken", text, allowed_special]

        def decode_bytes(self, ids):
            return b"tiktoken:" + bytes(ids)
    real, fast.encoding = fast.encoding, Stub()
    try:
        assert fast.encode("ab") == ["tiktoken", "ab", "all"]
        assert fast.decode_bytes([97, 98]) == b"tiktoken:ab"
    finally:
        fast.encoding = real
