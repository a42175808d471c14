# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Byte-level BPE, step by step
#
# GPT-2 reads text as a sequence of integers. Its tokenizer (Radford et al. 2019, §2.2) works on
# UTF-8 **bytes**, so any text at all can be encoded and there is no "unknown" token; and it
# merges frequent byte pairs into longer tokens with **byte-pair encoding** (Sennrich et al. 2016),
# so common words cost one token instead of one per letter. Encoding has three stages:
#
# 1. **pre-tokenize**: a regular expression cuts the text into words, numbers, punctuation and
#    whitespace, so that no merge ever crosses a word boundary;
# 2. **bytes → symbols**: each pre-token's UTF-8 bytes become printable stand-in characters;
# 3. **merge**: adjacent symbols are merged pair by pair, always the pair learned earliest
#    (the lowest *rank* in `vocab.bpe`), until no pair can be merged; each final symbol string is a
#    key of `encoder.json`, whose value is the token id.
#
# `gpt2np/tokenizer/bpe.py` implements this from scratch (after openai/gpt-2's `encoder.py`);
# `Tokenizer.encode_with_steps` returns every intermediate. At the end we check it against
# OpenAI's `tiktoken`, built from the same two files.

# %%
import sys
from functools import partial
from pathlib import Path

# Import gpt2np from this clone of the repository (the folder above notebooks/), and before
# NumPy: it sets OpenBLAS's thread timeout, which OpenBLAS reads only when NumPy loads it.
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "gpt2np" / "__init__.py").is_file())
sys.path.insert(0, str(ROOT))
import gpt2np
from gpt2np.teach import explain
from threadpoolctl import threadpool_limits

# One BLAS thread: these models' matrices are tiny (160 columns), so a second thread saves little,
# and when another process keeps a core busy, 2-thread OpenBLAS slows down several-fold.
threadpool_limits(1)

# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

# %% [markdown]
# ## The vocabularies
#
# OpenAI's `encoder.json` (50,257 tokens) and `vocab.bpe` (50,000 merges) are third-party files
# and are not part of this repository. We use them from `../shared/data/gpt2-bpe` next to the
# repository, or from a downloaded `weights/<size>/`; if neither exists, this notebook falls back
# to the byte-level vocabulary of the bundled models (256 byte tokens + `<|endoftext|>`, no merges):
# the same code, with nothing to merge.

# %%
import tempfile

import tiktoken
from gpt2np.tokenizer.bpe import PRE_TOKENIZER, Tokenizer, bytes_to_unicode
from gpt2np.tokenizer.files import load_tokenizer, write_byte_level_vocab

byte_dir = write_byte_level_vocab(Path(tempfile.mkdtemp()) / "bytes")  # the bundled models' vocabulary
byte_level = load_tokenizer(byte_dir, fast=False)
openai_dir = explain.openai_vocab_dir()
if openai_dir is not None:
    tok = Tokenizer.from_dir(openai_dir)          # from scratch: pure Python
    print(f"OpenAI's GPT-2 vocabulary: {tok.n_vocab} tokens, {len(tok.ranks)} merges")
else:
    tok = byte_level
    print("OpenAI's encoder.json/vocab.bpe not found: using the byte-level vocabulary")
print(f"byte-level vocabulary: {byte_level.n_vocab} tokens, {len(byte_level.ranks)} merges, "
      f"<|endoftext|> = {byte_level.eot_id}")

# %% [markdown]
# ## Stage 0 · Text is bytes
#
# UTF-8 writes ASCII characters as one byte and everything else as two to four. A byte-level
# tokenizer starts from these 256 possible values, so an emoji or a Chinese character is never
# out of vocabulary: at worst it costs a few tokens.

# %%
for text in ["Hello", "café", "🙂"]:
    print(f"{text!r:8} -> {list(text.encode('utf-8'))}")

# %% [markdown]
# ## Stage 1 · Pre-tokenization
#
# GPT-2's regex (`bpe.PRE_TOKENIZER`) tries, at each position: an English contraction
# (`'s`, `'t`, `'re`, ...), a run of letters, a run of digits, a run of other symbols (each with
# at most one leading space), or whitespace. The leading space stays *with* the word that follows,
# which is why GPT-2 has separate tokens for `"dog"` and `" dog"`.

# %%
sentence = "GPT-2's tokenizer doesn't split  'tokenization' at 1234 spaces!"
print(PRE_TOKENIZER.findall(sentence))

# %% [markdown]
# ## Stage 2 · Bytes as printable symbols
#
# `vocab.bpe` is a text file of space-separated pairs, so every byte needs a visible, non-space
# stand-in. `bytes_to_unicode()` maps the 188 printable Latin-1 bytes to themselves and shifts
# the other 68 (control codes, space, ...) to `chr(256 + n)`. The space becomes `Ġ`, the newline
# `Ċ`: that is why GPT-2 vocabularies are full of `Ġ`. The dict's order is also the order of the
# ids 0..255.

# %%
b2u = bytes_to_unicode()
for byte in [ord("A"), "é".encode()[0], ord(" "), ord("\n"), 0]:
    print(f"byte {byte:3d} -> {b2u[byte]!r}   (token id {list(b2u).index(byte)})")

# %% [markdown]
# ## Stage 3 · Merges, one at a time
#
# Take one pre-token. Its symbols start as single bytes; at each step the adjacent pair with the
# lowest rank in `vocab.bpe` (the pair learned *first* from the training data) is merged,
# everywhere it occurs, until no adjacent pair is in the merge list.

# %%
steps = tok.encode_with_steps(" tokenization")
word = steps["pre_tokens"][0]
print("bytes:  ", word["bytes"])
print("symbols:", word["symbols"])
for m in word["merges"]:
    print(f"merge {m['pair']!s:22} rank {m['rank']:5d} -> {m['symbols']}")
print("tokens: ", word["tokens"], "-> ids", word["ids"])

# %% [markdown]
# Early merges (low rank) build short, frequent pieces such as `Ġt`, `on`, `at`; later ones glue
# those into whole words. Over the vocabulary, most tokens are 3 to 8 bytes long.

# %%
merged_lengths = [len(tok.id_to_bytes[tok.encoder[a + b]]) for a, b in tok.ranks]  # rank order
fig, axes = plt.subplots(1, 2, figsize=(12, 3))
axes[0].hist([len(b) for b in tok.id_to_bytes], bins=np.arange(0.5, 20.5), color="tab:blue")
axes[0].set(xlabel="bytes per token", ylabel="tokens in the vocabulary", title=f"{tok.n_vocab} tokens")
if merged_lengths:
    window = 500
    axes[1].plot(np.convolve(merged_lengths, np.ones(window) / window, mode="valid"))
    axes[1].set(xlabel="merge rank", ylabel=f"bytes (mean of {window} merges)",
                title="length of the token each merge creates")
plt.tight_layout()

# %% [markdown]
# The whole sentence: every pre-token is merged on its own, and the ids are concatenated.

# %%
steps = tok.encode_with_steps(sentence)
for p in steps["pre_tokens"]:
    print(f"{p['text']!r:18} {len(p['bytes']):2d} bytes, {len(p['merges']):2d} merges -> {p['tokens']} {p['ids']}")
print("\nids:", steps["ids"])
print("decode(ids) == sentence:", tok.decode(steps["ids"]) == sentence)

# %% [markdown]
# ## The check · against tiktoken
#
# OpenAI's `tiktoken` encodes GPT-2 text in Rust. `FastTokenizer` (the default of
# `load_tokenizer`) builds a `tiktoken.Encoding` offline from the *same two files* and GPT-2's
# regex in tiktoken's spelling (`r50k_pat_str`), which is what `tiktoken.get_encoding("gpt2")`
# does with files it downloads. Our from-scratch merges must give the same ids, on hand-picked
# hard cases and on seeded random text. One trap is the regex's Unicode tables: `regex` knows the
# letters of Unicode 17 and 18 (e.g. CJK Extension J, U+323B0 on), tiktoken's Rust engine only
# Unicode 16.0, where they are "other", like punctuation. Our pre-tokenizer takes tiktoken's side
# (`gpt2np/tokenizer/unicode_classes.py` lists the 17,480 code points), so the ids agree there too.

# %%
fast = load_tokenizer(openai_dir or byte_dir, fast=True)  # a tiktoken.Encoding inside
print(type(fast.encoding).__module__, fast.encoding)
hard_cases = [
    "Hello, world!", "I'll say it's 2024; they've 3.14159 reasons.", "   leading and  double  spaces  ",
    "tabs\tand\nnewlines\n\n", "naïve café Ünïcödé", "日本語のテキスト", "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧",
    "<|endoftext|>two documents<|endoftext|>", "O Romeo, Romeo! wherefore art thou Romeo?",
    "'S 'T uppercase contractions don'T merge", "x" * 40, "CJK Extension J: \U000323B0's",
]
for text in hard_cases:
    ours, theirs = tok.encode(text), fast.encode(text)
    print(f"{'same' if ours == theirs else 'DIFFERENT':9} {len(ours):3d} tokens  {text!r}")

# %% [markdown]
# Seeded random text mixing letters, digits, punctuation, whitespace and non-ASCII characters:

# %%
rng = np.random.default_rng(0)
alphabet = list("abcXYZ019 .,;'!?\n\t-_éü日本🙂") + [" the", " and", "'s", "'ll", "  "]
texts = ["".join(rng.choice(alphabet, size=rng.integers(1, 40))) for _ in range(500)]
mismatches = [t for t in texts if tok.encode(t) != fast.encode(t)]
roundtrip = all(tok.decode(tok.encode(t)) == t for t in texts)
print(f"{len(texts)} random texts: {len(mismatches)} differ from tiktoken; decode(encode(t)) == t for all: {roundtrip}")

# %% [markdown]
# ## Why merges matter: sequence length
#
# The same passage, in GPT-2's BPE tokens and in the bundled models' byte tokens. Fewer tokens
# means fewer forward passes to generate it, and more text inside the same `n_ctx`: the price of
# the bundled models' tiny vocabulary (257 instead of 50,257, which keeps them small) is about
# 3.6 times as many steps per word (3.6 bytes per GPT-2 token here). Speed, for scale: the pure Python merges (first on a fresh
# tokenizer, then warm: it caches each distinct pre-token, and text repeats its words) against
# tiktoken's Rust.

# %%
passage = ("But, soft! what light through yonder window breaks?\n"
           "It is the east, and Juliet is the sun.\n"
           "Arise, fair sun, and kill the envious moon,\n"
           "Who is already sick and pale with grief,\n") * 20
n_bytes = len(passage.encode("utf-8"))
for name, t in [("GPT-2 BPE (from scratch)", tok), ("byte-level", byte_level)]:
    ids = t.encode(passage)
    print(f"{name:26s} {len(ids):5d} tokens, {n_bytes / len(ids):.2f} bytes per token")
cold = Tokenizer.from_dir(openai_dir or byte_dir)  # a fresh one: nothing cached yet
_, seconds_cold = explain.best_time(partial(cold.encode, passage), repeats=1)
_, seconds_warm = explain.best_time(partial(cold.encode, passage))
_, seconds_fast = explain.best_time(partial(fast.encode, passage))
print(f"encode {n_bytes} bytes: from scratch {seconds_cold * 1e3:.1f} ms cold, {seconds_warm * 1e3:.1f} ms warm; "
      f"tiktoken {seconds_fast * 1e3:.2f} ms")

# %% [markdown]
# **Summary.** text → pre-tokens (regex) → UTF-8 bytes → printable symbols → merges in rank
# order → ids; decoding concatenates the bytes of each id and decodes UTF-8. Our from-scratch
# code and tiktoken agree on every case above.
#
# *References:* Radford et al. 2019 §2.2; Sennrich, Haddow & Birch 2016, *Neural Machine
# Translation of Rare Words with Subword Units*; openai/gpt-2 `src/encoder.py`; openai/tiktoken
# (`tiktoken/_educational.py`); karpathy/minbpe.
