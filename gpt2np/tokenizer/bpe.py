"""GPT-2's byte-level BPE tokenizer, from scratch (fast.py: the same in tiktoken; files.py: loading one).

Reference algorithm: openai/gpt-2 `src/encoder.py` (Radford et al. 2019, section 2.2). Text goes
through three stages, and `Tokenizer.encode_with_steps` returns every one of them:

1. pre-tokenize: a regex cuts the text into words, numbers, punctuation runs and whitespace, so
   that no merge ever crosses a word boundary ("dog." and "dog!" share the token "dog");
2. bytes -> symbols: each pre-token's UTF-8 bytes become printable characters (`bytes_to_unicode`);
3. merge: adjacent symbols are merged pair by pair, always the pair that comes first in vocab.bpe
   (learned earliest), until no pair is mergeable; each final symbol string is an encoder.json key.

Special token: the literal text "<|endoftext|>" encodes to its own id (50256 in GPT-2), as
Hugging Face's GPT2Tokenizer does (tiktoken needs `allowed_special` for that, which we pass), so
text containing it gets a document boundary there; it is cut out before the regex runs.
With GPT-2's files, "Hello, world!" -> [15496, 11, 995, 0].

A byte-level vocabulary (256 byte symbols + "<|endoftext|>", no merges) works the same way:
>>> import tempfile
>>> from gpt2np.tokenizer.files import load_tokenizer, write_byte_level_vocab
>>> with tempfile.TemporaryDirectory() as d:
...     tok = load_tokenizer(write_byte_level_vocab(d))
>>> tok.n_vocab, tok.eot_id, tok.encode("hi!<|endoftext|>")  # 'h' is byte 104 but id 71
(257, 256, [71, 72, 0, 256])
>>> tok.decode([71, 72, 0])
'hi!'
"""
import functools
import hashlib
import json
import numbers
from pathlib import Path

import regex  # unlike `re`, knows the Unicode classes \p{L} (letters) and \p{N} (numbers)

from .unicode_classes import LETTER, NUMBER

EOT = "<|endoftext|>"
# sha256 of OpenAI's own files (= tiktoken's expected_hash); other files (e.g. byte-level) differ.
OPENAI_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}

# GPT-2's pre-tokenizer. \p{L} below means LETTER, \p{N} NUMBER: letters and numbers as tiktoken's
# Unicode 16.0 tables have them (gpt2np/tokenizer/unicode_classes.py), so that both paths give the same ids.
# Alternatives are tried left to right at each position:
#   's|'t|'re|'ve|'m|'ll|'d   English contractions, lower case only ("'VE" is "'" + "VE")
#    ?\p{L}+                  a run of letters, with at most one leading space (" world")
#    ?\p{N}+                  a run of digits/numerals, same
#    ?[^\s\p{L}\p{N}]+        a run of everything else (punctuation, emoji, ...), same
#   \s+(?!\S)                 whitespace, but leave the last space if a word follows, so that the
#                             word gets its " " prefix: "a   b" -> "a", "  ", " b"
#   \s+                       any other whitespace (e.g. "\n" right before a word)
# tiktoken writes the same splits as '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|
# \s++$|\s+(?!\S)|\s' (possessive ++ and \s++$ only make its regex engine faster).
PRE_TOKENIZER = regex.compile(
    rf"""'s|'t|'re|'ve|'m|'ll|'d| ?{LETTER}+| ?{NUMBER}+| ?[^\s{LETTER}{NUMBER}]+|\s+(?!\S)|\s+""",
    regex.VERSION1)


def bytes_to_unicode():
    """Map each byte 0..255 to one printable character, in the order of GPT-2's ids 0..255.

    BPE here works on *strings* and vocab.bpe is a text file of space-separated pairs, so every
    byte needs a visible, non-space stand-in. Printable Latin-1 bytes stand for themselves; the
    other 68 (control codes, space, NBSP, soft hyphen) are shifted to chr(256 + n) in byte order.
    >>> b2u = bytes_to_unicode()
    >>> b2u[ord("A")], b2u[ord(" ")], b2u[ord("\\n")]
    ('A', 'Ġ', 'Ċ')
    >>> list(b2u)[:3], len(b2u)  # dict order = id order: "!" is id 0
    ([33, 34, 35], 256)
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(shifted)}}


BYTE_TO_SYMBOL = bytes_to_unicode()
SYMBOL_TO_BYTE = {s: b for b, s in BYTE_TO_SYMBOL.items()}
SYMBOLS_TO_LATIN1 = {ord(s): b for s, b in SYMBOL_TO_BYTE.items()}  # str.translate table: symbol -> chr(byte)


def merge_pair(symbols, pair):
    """Replace every non-overlapping occurrence of `pair`, scanning left to right, by one symbol."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def bpe_steps(symbols, ranks):
    """The merge loop: return [(pair, rank, symbols after the merge), ...] in the order applied.

    `ranks[(a, b)]` is the position of "a b" among vocab.bpe's merges: 0 was learned first, and at
    each step the lowest-ranked adjacent pair is merged (all its non-overlapping occurrences).
    Each step rescans the symbols, as openai/gpt-2's loop does, so the cost grows with the square of a
    pre-token's length: nothing for words, 1 s for one 5,000-letter "word" (tiktoken: 1 ms, fast.py).
    """
    steps = []
    while len(symbols) > 1:
        pairs = set(zip(symbols, symbols[1:]))
        best = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if best not in ranks:  # no adjacent pair is a known merge: done
            break
        symbols = merge_pair(symbols, best)
        steps.append((best, ranks[best], symbols))
    return steps


def replace_lone_surrogates(text):
    """A Python str may hold lone UTF-16 surrogates, which have no UTF-8: make them U+FFFD (and join
    valid pairs into one character), exactly as tiktoken does. Other text comes back unchanged."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


AGAIN = "cut short or damaged? delete it and download it again"  # the fix for a file that reads wrong


def read_encoder(path):
    """encoder.json -> {symbol string: id}, checked: ids 0..N-1 and all 256 byte symbols present."""
    try:
        encoder = json.loads(Path(path).read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): {AGAIN}") from None
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        raise ValueError(f"{path} must be a JSON object mapping token strings to integer ids")
    if sorted(encoder.values()) != list(range(len(encoder))):
        raise ValueError(f"{path}: ids must be 0..{len(encoder) - 1}, each used once")
    missing = [b for b, s in BYTE_TO_SYMBOL.items() if s not in encoder]
    if missing:
        raise ValueError(f"{path} lacks the symbols of bytes {missing[:5]}...; GPT-2 needs all 256")
    bad = next((k for k in encoder if not all(c in SYMBOL_TO_BYTE for c in k)), None)
    if bad is not None:
        raise ValueError(f"{path}: token {bad!r} uses characters that are not byte symbols")
    return encoder


def read_merges(path, encoder, encoder_path="encoder.json"):
    """vocab.bpe -> [(a, b), ...] in rank order; line 1 is a "#version" header, then one "a b" a line.

    Checked against the encoder: each merge's token is in it, and each of its tokens is a byte, a special
    token or some merge's: a file cut at a line ending still parses, but makes fewer tokens (check_made).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e}): {AGAIN}") from None
    if not lines[0].startswith("#version"):
        raise ValueError(f"{path} must start with a '#version' line, got {lines[0][:40]!r}")
    merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
    for n, pair in enumerate(merges, start=2):
        if len(pair) != 2 or "".join(pair) not in encoder:
            raise ValueError(f"{path} line {n}: {' '.join(pair)!r} is not two symbols whose merge is in "
                             f"{Path(encoder_path).name}" + (f": {AGAIN}" if n == len(merges) + 1 else ""))
    check_made(merges, encoder, path, encoder_path)
    return merges


SPECIAL = regex.compile(r"<\|[^|]*\|>|<[^<>\s]+>|\[[A-Z_]+\]")  # "<|endoftext|>", and the tokens a Hugging Face
    # vocab.json may add after the merges' ("<|pad|>", "<pad>", "</s>", "[PAD]"): no merge makes them


def check_made(merges, encoder, path, encoder_path):
    """Every token of the encoder must be one byte symbol, a special token or the token of some merge. With
    each merge's token in the encoder (read_merges), the merges then make exactly its other tokens, as many
    as it implies: a vocab.bpe that lost merges (cut short) leaves theirs unmade. GPT-2's 50,000: ~15 ms."""
    made = {a + b for a, b in merges}
    unmade = [t for t in encoder if len(t) > 1 and t not in made and not SPECIAL.fullmatch(t)]
    if unmade:
        raise ValueError(f"{path} has {len(merges):,} merges, but no merge makes {len(unmade):,} of the "
                         f"{len(encoder):,} tokens of {Path(encoder_path).name} (e.g. {unmade[0]!r}): {AGAIN}")


def check_ids(ids, n_vocab):
    """Raise a one-line ValueError unless ids is a 1-D sequence of ints in 0..n_vocab-1 (forward's wording):
    a negative id would wrap around, and Python would index with a bool; a float, None, text or a 2-D array
    would fail deep inside, and a generator would be used up by this check."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or getattr(ids, "ndim", 1) != 1:
        shape = f" of shape {ids.shape}" if hasattr(ids, "shape") else ""
        raise ValueError(f"token ids must be a 1-D sequence of ints, got {type(ids).__name__}{shape}")
    if getattr(ids, "dtype", None) is not None and ids.dtype.kind in "iu" and len(ids):  # an int array:
        ids = (ids.min(), ids.max())  # its extremes are all the range check needs (NumPy finds them at once)
    for i in ids:
        if type(i) is not int and (isinstance(i, bool) or not isinstance(i, numbers.Integral)):  # type: fast
            raise ValueError(f"token ids must be ints, got {type(i).__name__} {i!r:.40}")
        if not 0 <= i < n_vocab:
            raise ValueError(f"token id {i} is outside the vocabulary 0..{n_vocab - 1}")


def vocabulary_fingerprint(tokens, merges, special_tokens):
    """sha256 (hex) of everything that decides the ids: each token's bytes in id order, the merges
    (a, b, rank) in rank order and the special tokens with their ids. Equal fingerprints mean the
    same ids for every text, whichever files (or file formats) the vocabulary was read from (every
    tokenizer here pre-tokenizes with GPT-2's regex, so the regex is not part of it).

    Every string goes in behind its length, so no two vocabularies hash the same bytes
    ([b"ab", b"c"] and [b"a", b"bc"] would otherwise both be b"abc").
    >>> ab = vocabulary_fingerprint([b"a", b"b", b"ab"], [(b"a", b"b", 0)], {})
    >>> ba = vocabulary_fingerprint([b"a", b"b", b"ba"], [(b"b", b"a", 0)], {})
    >>> ab[:12], ba[:12]  # pinned: a recorded fingerprint must keep its meaning
    ('c100c3397ed7', '6219451ca56e')
    """
    sections = {"tokens": list(tokens),
                "merges": [s for a, b, rank in merges for s in (a, b, str(rank).encode())],
                "special": [s for name, i in sorted(special_tokens.items())
                            for s in (name.encode(), str(i).encode())]}
    digest = hashlib.sha256()
    for name, strings in sections.items():
        digest.update(f"{name} {len(strings)}\n".encode())
        digest.update(b"".join(len(string).to_bytes(4, "little") + string for string in strings))
    return digest.hexdigest()


def symbols_to_bytes(symbols):
    """A vocab.bpe / encoder.json string of byte symbols -> the raw bytes it stands for."""
    return symbols.translate(SYMBOLS_TO_LATIN1).encode("latin-1")  # = bytes(SYMBOL_TO_BYTE[s] ...)


def vocab_paths(directory):
    """The two files of a tokenizer directory, with a clear error if either is missing."""
    paths = Path(directory) / "encoder.json", Path(directory) / "vocab.bpe"
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: download a GPT-2 model into {directory}, "
                                    f"or write a byte-level vocabulary there (write_byte_level_vocab)")
    return paths


class Tokenizer:
    """From scratch: `encoder` maps symbol strings to ids, `merges` are (a, b) pairs in rank order.

    Usually built with `from_dir`; `encode_with_steps` shows a toy vocabulary built by hand.
    """

    def __init__(self, encoder, merges):
        self.encoder = dict(encoder)
        self.n_vocab = len(self.encoder)
        self.eot_id = self.encoder.get(EOT)  # None if the vocabulary has no <|endoftext|>
        self.ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.id_to_bytes = [b""] * len(self.encoder)  # id -> raw bytes, for decoding
        for symbols, i in self.encoder.items():
            self.id_to_bytes[i] = symbols_to_bytes(symbols)
        # One cache per tokenizer (not one @lru_cache on the method, which all instances would
        # share). Text repeats its words, so most pre-tokens skip the merge loop entirely.
        self._encode_pre_token = functools.lru_cache(maxsize=2**16)(self._encode_pre_token_uncached)

    @functools.cached_property
    def fingerprint(self):
        """sha256 (64 hex digits) of the whole vocabulary and merges: see `vocabulary_fingerprint`."""
        merges = sorted(self.ranks.items(), key=lambda item: item[1])  # rank order
        return vocabulary_fingerprint(
            self.id_to_bytes, [(symbols_to_bytes(a), symbols_to_bytes(b), rank) for (a, b), rank in merges],
            {} if self.eot_id is None else {EOT: self.eot_id})

    def __repr__(self):
        return (f"{type(self).__name__}(n_vocab={self.n_vocab}, merges={len(self.ranks)}, "
                f"eot_id={self.eot_id}, fingerprint={self.fingerprint[:12]})")

    @classmethod
    def from_files(cls, encoder_json, vocab_bpe):
        encoder = read_encoder(encoder_json)
        return cls(encoder, read_merges(vocab_bpe, encoder, encoder_json))

    @classmethod
    def from_dir(cls, directory):
        return cls.from_files(*vocab_paths(directory))

    def pre_tokens(self, text):
        """Yield (pre-token, is_special): "<|endoftext|>" is cut out first, the rest by the regex."""
        parts = text.split(EOT) if self.eot_id is not None else [text]
        for n, part in enumerate(parts):
            if n > 0:  # an EOT stood between parts n-1 and n
                yield EOT, True
            for pre_token in PRE_TOKENIZER.findall(part):
                yield pre_token, False

    def _encode_pre_token_uncached(self, pre_token):
        symbols = tuple(BYTE_TO_SYMBOL[b] for b in pre_token.encode("utf-8"))
        steps = bpe_steps(symbols, self.ranks)
        return tuple(self.encoder[s] for s in (steps[-1][2] if steps else symbols))

    def encode(self, text):
        """Text -> token ids."""
        ids = []
        for pre_token, special in self.pre_tokens(replace_lone_surrogates(text)):
            ids.extend([self.eot_id] if special else self._encode_pre_token(pre_token))
        return ids

    def encode_with_steps(self, text):
        """Like `encode`, but return every intermediate step as plain data (dicts, lists, str, int).

        >>> enc = {s: i for i, s in enumerate(bytes_to_unicode().values())}
        >>> enc.update({"lo": 256, "Ġlo": 257})
        >>> steps = Tokenizer(enc, [("l", "o"), ("Ġ", "lo")]).encode_with_steps("lo lol")
        >>> [p["text"] for p in steps["pre_tokens"]], steps["ids"]
        (['lo', ' lol'], [256, 257, 75])
        >>> for m in steps["pre_tokens"][1]["merges"]: print(m)
        {'pair': ('l', 'o'), 'rank': 0, 'symbols': ['Ġ', 'lo', 'l']}
        {'pair': ('Ġ', 'lo'), 'rank': 1, 'symbols': ['Ġlo', 'l']}
        """
        pre_tokens = []
        for pre_token, special in self.pre_tokens(replace_lone_surrogates(text)):
            symbols = [EOT] if special else [BYTE_TO_SYMBOL[b] for b in pre_token.encode("utf-8")]
            steps = [] if special else bpe_steps(tuple(symbols), self.ranks)
            tokens = list(steps[-1][2]) if steps else symbols
            pre_tokens.append({
                "text": pre_token, "special": special, "bytes": list(pre_token.encode("utf-8")),
                "symbols": symbols, "tokens": tokens, "ids": [self.encoder[t] for t in tokens],
                "merges": [{"pair": pair, "rank": rank, "symbols": list(after)}
                           for pair, rank, after in steps]})
        return {"text": text, "pre_tokens": pre_tokens,
                "ids": [i for p in pre_tokens for i in p["ids"]]}

    def decode_bytes(self, ids):
        """Token ids -> the raw bytes they stand for (may end mid-character)."""
        check_ids(ids, self.n_vocab)
        return b"".join(self.id_to_bytes[i] for i in ids)

    def decode(self, ids):
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD, as in openai/gpt-2."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
