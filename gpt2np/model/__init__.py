"""The model: GPT-2's forward pass as its equations (Radford et al. 2019).

    config.py      GPT2Config, the five hparams.json numbers, and the release sizes' presets
    forward.py     gelu, layer norm, attention, the transformer block, GPT2.forward with a KV cache
    batch.py       several sequences' new rows packed into one pass (forward_packed)
    kv_cache.py    the preallocated key/value cache that a forward pass appends to and rolls back
    reference.py   the slow oracle: no cache, one head at a time, its own GELU, layer norm and softmax
    rows.py        rows at explicit positions with an attention scope: token trees, packed sequences
    cost_probe.py  the shape of this machine's cost curve v(M), from one block's pass over M rows
    fast/          speed code, fenced off: few-row products per BLAS kernel, the weights' memory order,
                   blocked attention for long inputs, the helper threads, OpenBLAS's thread timeout

May import: NumPy, threadpoolctl. Nothing else of gpt2np: no tokenizer, no files, no decoding.
(No imports here: `import gpt2np.model.fast` must run before NumPy loads, see fast/__init__.py.)
"""
