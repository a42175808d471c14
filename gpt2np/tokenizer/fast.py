"""The fast path: the same tokenizer with encode and decode in tiktoken's Rust code, built offline.

tiktoken is built from the same encoder.json + vocab.bpe as the from-scratch Tokenizer (bpe.py),
so both give the same ids for every text (tests/tokenizer/test_tokenizer.py checks it, and bpe.py pins the
pre-tokenizer's Unicode classes to tiktoken's). Nothing is downloaded: the files are local paths.
"""
import hashlib
import os
import sys
from pathlib import Path

from .bpe import EOT, OPENAI_SHA256, Tokenizer, check_ids, read_encoder, read_merges


# What tiktoken's data_gym_to_mergeable_bpe_ranks asserts beyond our readers' checks: it makes the ids up
# from the files' order and compares them with encoder.json's. Valid BPE files need not be in that order.
TIKTOKEN_LAYOUT = ("tiktoken needs the 256 byte tokens in GPT-2's id order, then each merge's token at id "
                   "256 + its line's rank, every merge line ending in a newline")


class TiktokenRefused(ValueError):
    """Files our readers accept but tiktoken cannot build an Encoding from (ids not in merge order, a
    last merge without its newline...). The scratch Tokenizer reads them exactly (bpe.py: ranks come
    from the merge lines' order, ids from encoder.json, as in openai/gpt-2's encoder.py), so files.py
    falls back to it; args[1] is the reason, for its note."""


def tiktoken_encoding(encoder_json, vocab_bpe, n_vocab, eot_id):
    """Build a tiktoken.Encoding offline from the same two files (no network: they are local paths)."""
    import tiktoken  # imported here, so that the from-scratch path runs without tiktoken installed
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's regex, tiktoken spelling
    from unittest.mock import patch  # patch.dict: os.environ changed for one `with` block (here: 30 ms at import)

    def known_hash(path):  # pass OpenAI's hash only when it matches: a byte-level vocab has others
        sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        return sha if sha == OPENAI_SHA256.get(Path(path).name) else None

    # tiktoken copies each file it reads into a cache keyed by the file's *path*; with no hash to
    # check, an edited file at the same path would be served stale. TIKTOKEN_CACHE_DIR="" turns the
    # cache off; patch.dict sets it only inside the `with` and then restores os.environ.
    try:  # tiktoken wants ids = the 256 bytes in bytes_to_unicode order, then 256 + merge rank
        with patch.dict(os.environ, TIKTOKEN_CACHE_DIR=""):
            ranks = data_gym_to_mergeable_bpe_ranks(str(vocab_bpe), str(encoder_json),
                                                    known_hash(vocab_bpe), known_hash(encoder_json))
        return tiktoken.Encoding(name=f"gpt2np:{encoder_json}", pat_str=r50k_pat_str,
                                 mergeable_ranks=ranks, explicit_n_vocab=n_vocab,
                                 special_tokens={} if eot_id is None else {EOT: eot_id})
    except (AssertionError, KeyError, ValueError) as e:
        why = str(e) or TIKTOKEN_LAYOUT  # its one check that can fail on files our readers accept says nothing
        raise TiktokenRefused(f"tiktoken cannot use {encoder_json} + {vocab_bpe} ({why}); load_tokenizer and "
                              f"load_hf_tokenizer fall back to the pure-Python Tokenizer (or pass fast=False)",
                              why) from None


class FastTokenizer(Tokenizer):
    """A Tokenizer whose encode and decode_bytes run in tiktoken's Rust code, built from the same
    files. The rest is inherited: `encode_with_steps` stays from scratch (tiktoken hides merges)."""

    def __init__(self, encoder, merges, encoding):
        super().__init__(encoder, merges)
        self.encoding = encoding  # a tiktoken.Encoding

    @classmethod
    def from_files(cls, encoder_json, vocab_bpe):
        """Raises TiktokenRefused for valid files tiktoken cannot use; fast_or_scratch falls back instead."""
        encoder = read_encoder(encoder_json)  # our readers check the files and explain any problem
        merges = read_merges(vocab_bpe, encoder, encoder_json)
        encoding = tiktoken_encoding(encoder_json, vocab_bpe, len(encoder), encoder.get(EOT))
        return cls(encoder, merges, encoding)

    def encode(self, text):
        return self.encoding.encode(text, allowed_special="all")  # "all" = just <|endoftext|>

    def decode_bytes(self, ids):
        check_ids(ids, self.n_vocab)  # tiktoken would raise KeyError or OverflowError
        return self.encoding.decode_bytes(ids)


def fast_or_scratch(encoder_json, vocab_bpe):  # -> FastTokenizer, or Tokenizer when tiktoken refuses
    """The fast tokenizer, or, for valid files that tiktoken cannot use, the scratch one with a note on
    stderr: it applies the files' merges in their order (the reference the fast path is tested against),
    only slower, so a command or the server works instead of stopping on advice about a Python argument.
    Malformed files still raise (read_encoder / read_merges name the file and the line), and so do merges
    that do not make every token of the encoder (a file cut short: read_merges)."""
    try:
        return FastTokenizer.from_files(encoder_json, vocab_bpe)
    except TiktokenRefused as e:
        print(f"note: tiktoken cannot use {encoder_json} + {vocab_bpe} ({e.args[1]}); using the pure-Python "
              f"tokenizer instead, which is slower", file=sys.stderr)
        return Tokenizer.from_files(encoder_json, vocab_bpe)
