"""The tokenizer: text <-> GPT-2's token ids (Radford et al. 2019, openai/gpt-2 encoder.py).

    bpe.py               byte-level BPE from scratch, the tiktoken fast path built offline, both
                         checked against each other; encoder.json / vocab.bpe and vocab.json / merges.txt
    unicode_classes.py   GPT-2's letter and number classes pinned to tiktoken's Unicode 16.0

May import: regex, tiktoken, NumPy. Nothing else of gpt2np.
"""
