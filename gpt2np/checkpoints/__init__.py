"""Checkpoints: files on disk or on a server -> named float32 arrays, a config and a tokenizer -> a model.

    loading.py      load_model(name): a size name, a bundled name, hf:owner/name or a folder; random_model
    download.py     OpenAI's release files: streaming, resume, every file checked before an atomic rename
    hub.py          hf:owner/name[@revision]: the Hub's files through download.py, sha256-checked
    tf_reader.py    TensorFlow's tensor bundle (SSTable, protobuf, CRC32C) read without TensorFlow
    tf_writer.py    the inverse, byte-identical to TensorFlow's Saver (ships the bundled pair)
    safetensors.py  safetensors read and written with json + NumPy
    hf_layout.py    Hugging Face's layout: config.json and its tensor names onto the same parameters
    weights.py      checkpoint names -> parameters (one table), the checked .npy cache, random weights

May import: the model and the tokenizer (to build one). Never decoding: loading a model needs
nothing of how it is decoded.
"""
