"""A tokenizer from the files on disk: OpenAI's encoder.json + vocab.bpe, Hugging Face's vocab.json +
merges.txt (the same two files under other names), or a byte-level vocabulary written here; and the
tokenizer a model without files gets (`tokenizer_for`: random_model's).
"""
import functools
import hashlib
import json
import os
from pathlib import Path

from .bpe import BYTE_TO_SYMBOL, EOT, OPENAI_SHA256, Tokenizer, vocab_paths
from .fast import fast_or_scratch

GPT2_N_VOCAB = 50257        # OpenAI's vocabulary: 256 bytes + 50,000 merges + <|endoftext|>
BYTE_LEVEL_N_VOCAB = 257    # 256 bytes + <|endoftext|>: the bundled models' vocabulary


def load_tokenizer(directory, fast=True):
    """The tokenizer in `directory` (encoder.json + vocab.bpe): tiktoken-backed if fast, else scratch;
    fast falls back to scratch, with a note, for valid files tiktoken cannot use (fast.fast_or_scratch)."""
    return fast_or_scratch(*vocab_paths(directory)) if fast else Tokenizer.from_dir(directory)


def load_hf_tokenizer(directory, fast=True):
    """The tokenizer of a Hugging Face GPT-2 folder: vocab.json + merges.txt are encoder.json +
    vocab.bpe under other names (same JSON object, same "#version" line then one merge a line), so
    the same readers and the same Tokenizer come out, encoding identically."""
    paths = Path(directory) / "vocab.json", Path(directory) / "merges.txt"
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: gpt2np reads GPT-2's vocab.json + merges.txt "
                                    f"(not tokenizer.json alone)")
    return fast_or_scratch(*paths) if fast else Tokenizer.from_files(*paths)


def write_byte_level_vocab(directory):
    """Write a 257-token vocabulary: the 256 byte symbols (GPT-2's ids 0..255), <|endoftext|> = 256,
    and a vocab.bpe with no merges, so every byte is one token. Returns the directory as a Path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "encoder.json").write_text(json.dumps(byte_level_encoder()), encoding="utf-8")
    (directory / "vocab.bpe").write_text("#version: 0.2\n", encoding="utf-8")
    return directory


def byte_level_encoder():
    """{symbol: id}: the 256 byte symbols (GPT-2's ids 0..255), then <|endoftext|> = 256."""
    encoder = {symbol: i for i, symbol in enumerate(BYTE_TO_SYMBOL.values())}
    encoder[EOT] = len(encoder)
    return encoder


@functools.lru_cache(maxsize=1)
def byte_level_tokenizer():
    """The byte-level vocabulary in memory (no merges: one token per byte), built once per process.

    >>> byte_level_tokenizer().encode("hi"), byte_level_tokenizer().eot_id
    ([71, 72], 256)
    """
    return Tokenizer(byte_level_encoder(), [])


def has_openai_files(folder):
    """True if folder holds OpenAI's own encoder.json + vocab.bpe (their sha256, as tiktoken pins)."""
    files = [Path(folder) / name for name in OPENAI_SHA256]
    return all(f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == OPENAI_SHA256[f.name]
               for f in files)


def find_gpt2_vocab(models_dir):
    """The first folder in models_dir (weights/124M/, ...) holding OpenAI's tokenizer files, or None."""
    folders = sorted(Path(models_dir).glob("*/encoder.json")) if Path(models_dir).is_dir() else []
    return next((f.parent for f in folders if has_openai_files(f.parent)), None)


@functools.lru_cache(maxsize=8)
def cached_tokenizer(folder):
    """The tokenizer of a folder in either layout, read once per process (GPT-2's takes ~1 s), so
    models built from the same folder share one tokenizer object."""
    hf = not (Path(folder) / "encoder.json").is_file() and (Path(folder) / "vocab.json").is_file()
    return load_hf_tokenizer(folder) if hf else load_tokenizer(folder)


def tokenizer_for(n_vocab, choice="auto", models_dir="weights"):
    """The tokenizer for a model of n_vocab tokens that came without one (random_model).

    choice: None (no tokenizer); a tokenizer (a real model's, to pair with it); a folder holding one;
    or "auto": GPT-2's when n_vocab is 50257 and OpenAI's files are in a folder of models_dir (where
    load_model downloads them), the byte-level one when n_vocab is 257, else None. A tokenizer of
    another size is a one-line ValueError.

    >>> tokenizer_for(257).n_vocab, tokenizer_for(64)
    (257, None)
    """
    if choice is None:
        return None
    if isinstance(choice, str) and choice == "auto":
        if n_vocab == BYTE_LEVEL_N_VOCAB:
            return byte_level_tokenizer()
        folder = find_gpt2_vocab(models_dir) if n_vocab == GPT2_N_VOCAB else None
        return None if folder is None else cached_tokenizer(str(folder.resolve()))
    tokenizer = cached_tokenizer(str(Path(choice).resolve())) if isinstance(choice, (str, os.PathLike)) else choice
    if not hasattr(tokenizer, "decode"):
        raise ValueError(f'tokenizer must be "auto", None, a tokenizer or a tokenizer folder, '
                         f'got {type(choice).__name__}')
    if tokenizer.n_vocab != n_vocab:
        raise ValueError(f"tokenizer has {tokenizer.n_vocab} tokens but the model's n_vocab is "
                         f"{n_vocab}: pass a tokenizer of the same vocabulary, or tokenizer=None")
    return tokenizer
