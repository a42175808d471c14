"""A tokenizer from the files on disk: OpenAI's encoder.json + vocab.bpe, Hugging Face's vocab.json +
merges.txt (the same two files under other names), or a byte-level vocabulary written here.
"""
import json
from pathlib import Path

from .bpe import BYTE_TO_SYMBOL, EOT, Tokenizer
from .fast import FastTokenizer


def load_tokenizer(directory, fast=True):
    """The tokenizer in `directory` (encoder.json + vocab.bpe): tiktoken-backed if fast, else scratch."""
    return (FastTokenizer if fast else Tokenizer).from_dir(directory)


def load_hf_tokenizer(directory, fast=True):
    """The tokenizer of a Hugging Face GPT-2 folder: vocab.json + merges.txt are encoder.json +
    vocab.bpe under other names (same JSON object, same "#version" line then one merge a line), so
    the same readers and the same Tokenizer come out, encoding identically."""
    paths = Path(directory) / "vocab.json", Path(directory) / "merges.txt"
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: gpt2np reads GPT-2's vocab.json + merges.txt "
                                    f"(not tokenizer.json alone)")
    return (FastTokenizer if fast else Tokenizer).from_files(*paths)


def write_byte_level_vocab(directory):
    """Write a 257-token vocabulary: the 256 byte symbols (GPT-2's ids 0..255), <|endoftext|> = 256,
    and a vocab.bpe with no merges, so every byte is one token. Returns the directory as a Path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    encoder = {symbol: i for i, symbol in enumerate(BYTE_TO_SYMBOL.values())}
    encoder[EOT] = len(encoder)
    (directory / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (directory / "vocab.bpe").write_text("#version: 0.2\n", encoding="utf-8")
    return directory
