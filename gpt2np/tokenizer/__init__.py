"""The tokenizer: text <-> GPT-2's token ids (Radford et al. 2019, openai/gpt-2 encoder.py).

    bpe.py               byte-level BPE from scratch: pre-tokenize, bytes -> symbols, merge
    fast.py              the same tokenizer in tiktoken's Rust code, built offline from the same files
    files.py             load_tokenizer / load_hf_tokenizer from a folder; a byte-level vocabulary
    unicode_classes.py   GPT-2's letter and number classes pinned to tiktoken's Unicode 16.0

May import: regex, tiktoken. Nothing else of gpt2np.
"""
