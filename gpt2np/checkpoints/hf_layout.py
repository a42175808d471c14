"""GPT-2 in the Hugging Face layout: config.json + model.safetensors -> the same params as OpenAI's.

A folder saved by transformers' `GPT2LMHeadModel.save_pretrained` (or downloaded from the Hub)
holds config.json, model.safetensors, and the tokenizer as vocab.json + merges.txt (the same data
as OpenAI's encoder.json + vocab.bpe). The tensor names come from transformers' modeling_gpt2.py
and map one to one onto OpenAI's checkpoint names, so the loaded model is the TF path's exactly:

    transformer.h.{i}.attn.c_attn.weight [E, 3E]  ->  model/h{i}/attn/c_attn/w [1, E, 3E]
    transformer.h.{i}.ln_1.weight / .bias         ->  model/h{i}/ln_1/g / b
    transformer.wte.weight, .wpe.weight, .ln_f.*  ->  model/wte, model/wpe, model/ln_f/*

HF's Conv1D stores its weight [in, out] like TF's, so no transpose here either. The prefix
`transformer.` is there when the whole GPT2LMHeadModel was saved and absent for a bare GPT2Model
(OpenAI's own gpt2 repo). `lm_head.weight` is usually left out (tied to wte); when a file stores
it, it must equal wte, since GPT-2's output head is wte. `h.{i}.attn.bias` / `.masked_bias` are
buffers (the causal mask, the masking constant) that older transformers saved: not weights, skipped.
"""
import hashlib
import json
import os
import sys

import numpy as np

from ..model.config import GPT2Config
from .safetensors import read_header, read_safetensors
from .weights import CACHE_FORMAT, load_params_cached, tf_layout

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
PREFIX = "transformer."
# tanh-approximated GELU under its two transformers names; the erf form ("gelu") is another function
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
BUFFERS = ("attn.bias", "attn.masked_bias")  # per block; not parameters
# config.json keys that would change the computation, and the value gpt2np's forward pass implements
FIXED = {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
         "add_cross_attention": False}


def is_hf_folder(folder):
    return os.path.isfile(os.path.join(folder, CONFIG_FILE)) and not os.path.isfile(
        os.path.join(folder, "hparams.json"))


def config_from_hf(hf):  # config.json dict -> GPT2Config
    """Refuse what gpt2np cannot run (another architecture, another activation...), in one line."""
    if hf.get("model_type") != "gpt2":
        raise ValueError(f"model_type {hf.get('model_type')!r} (architectures {hf.get('architectures')}) "
                         f"is not GPT-2: gpt2np runs only model_type 'gpt2'")
    if hf.get("activation_function", "gelu_new") not in TANH_GELU:
        raise ValueError(f"activation_function {hf['activation_function']!r} is not GPT-2's tanh GELU "
                         f"({' / '.join(TANH_GELU)}), the only one gpt2np's forward pass computes")
    for key, value in FIXED.items():
        if hf.get(key, value) != value:
            raise ValueError(f"{key} = {hf[key]!r}: gpt2np computes GPT-2 with {key} = {value!r} only")
    if hf.get("n_inner") not in (None, 4 * hf.get("n_embd", 0)):
        raise ValueError(f"n_inner = {hf['n_inner']}: gpt2np's MLP is 4 * n_embd wide")
    missing = [k for k in ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer") if k not in hf]
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}")
    return GPT2Config(n_vocab=hf["vocab_size"], n_ctx=hf["n_positions"], n_embd=hf["n_embd"],
                      n_head=hf["n_head"], n_layer=hf["n_layer"])


def read_hf_config(folder):
    path = os.path.join(folder, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # e.g. a download cut short
        raise ValueError(f"{path} is not valid JSON ({e}): cut short or damaged? delete it and download it "
                         f"again") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path} must be a JSON object (model_type, n_embd, n_layer, ...), got a "
                         f"JSON {type(hf).__name__}")
    try:
        return config_from_hf(hf)
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: {e}") from None


def hf_names(config):  # -> {HF name without prefix: TF name}, every weight of the model
    """The name table, derived from weights.tf_layout: model/h0/ln_1/g -> h.0.ln_1.weight."""
    suffix = {"g": "weight", "b": "bias", "w": "weight"}
    table = {}
    for tf_name in tf_layout(config):
        parts = tf_name.split("/")[1:]  # drop "model"
        if parts[0].startswith("h"):
            parts = ["h", parts[0][1:]] + parts[1:]  # h0 -> h.0
        parts[-1] = suffix.get(parts[-1], parts[-1])
        table[".".join(parts) + ("" if len(parts) > 1 else ".weight")] = tf_name  # wte -> wte.weight
    return table


def is_buffer(name):
    """h.{i}.attn.bias / h.{i}.attn.masked_bias (prefix or not): saved buffers, not weights."""
    parts = name.removeprefix(PREFIX).split(".")
    return len(parts) == 4 and parts[0] == "h" and ".".join(parts[2:]) in BUFFERS


def tf_tensors_from_hf(tensors, config, source):  # {HF name: array} -> {TF name: array}
    """Rename, drop the buffers, check lm_head against wte and give Conv1D weights their axis of 1."""
    table, renamed, unexpected = hf_names(config), {}, []
    for name, x in tensors.items():
        bare = name.removeprefix(PREFIX)
        if bare in table:
            renamed[table[bare]] = x[None] if table[bare].endswith("/w") else x  # [in, out] -> [1, in, out]
        elif not is_buffer(name) and name != "lm_head.weight":
            unexpected.append(name)
    missing = [PREFIX + hf for hf, tf in table.items() if tf not in renamed]
    if unexpected or missing:
        problems = [f"{what} {len(names)}: {', '.join(names[:3])}" for what, names in
                    (("missing", missing), ("unexpected", unexpected)) if names]
        raise ValueError(f"{source} does not fit {config}: {'; '.join(problems)} (does {CONFIG_FILE} belong "
                         f"to this checkpoint? is it a GPT2LMHeadModel?)")
    if "lm_head.weight" in tensors:
        _check_tied(tensors["lm_head.weight"], renamed["model/wte"], source)
    return renamed


def _check_tied(lm_head, wte, source):
    """GPT-2's output head IS wte; a stored lm_head.weight must be a copy of it."""
    if lm_head.shape != wte.shape or not np.array_equal(lm_head, wte):
        diff = np.abs(lm_head.astype(np.float32) - wte).max() if lm_head.shape == wte.shape else "shape"
        raise ValueError(f"{source}: lm_head.weight differs from wte (max |diff| {diff}); gpt2np ties "
                         f"the output head to wte as GPT-2 does, so an untied head cannot be loaded")


def read_hf_tensors(path, config):  # -> {TF name: float32 array}
    """Read model.safetensors, converting float16 / bfloat16 to float32 (with a note on stderr)."""
    tensors = {k: x for k, x in read_safetensors(path).items() if not is_buffer(k)}
    kinds = sorted({str(x.dtype) for x in tensors.values()} - {"float32"})
    if any(not np.issubdtype(np.dtype(k), np.floating) for k in kinds):
        raise ValueError(f"{path} stores {', '.join(kinds)} weights; GPT-2's are floating point")
    if kinds:  # bfloat16 arrives as float32 already (safetensors.py), float16 is converted here
        print(f"note: {path} stores {'/'.join(kinds)} weights; converted to float32 at load", file=sys.stderr)
        tensors = {k: x.astype(np.float32) for k, x in tensors.items()}
    return tf_tensors_from_hf(tensors, config, path)


def _hf_key(path):  # -> dict that changes whenever the file's bytes may have (weights._checkpoint_key's role)
    """The sha256 of model.safetensors' header (names, dtypes, offsets), and of the file (the Hub
    cache's symlink followed to its blob) its size, mtime, ctime, inode and device.

    Hashing the data itself would cost seconds to minutes per load (6 GB at 1558M), and unlike
    OpenAI's .index the header holds no checksum of the data. Size and mtime alone miss a rewrite
    that keeps the header and puts the old mtime back (cp -p, rsync -a, tar, touch -r all do), which
    would then load the OLD weights from the cache. Every write to a file's data sets its ctime, and
    no tool can set ctime back; a file replaced through a new name (atomic save, rsync, cp over
    a deleted one) also gets a new inode. So the key misses only a rewrite in the same tick of the
    filesystem's clock (milliseconds) as the write the cache was built from. A chmod, chown, new
    hard link or rename of the file, or a copy of the folder (new inodes) or a move to another
    filesystem, changes ctime, inode or device without changing a weight: the cache is then
    rebuilt once, which costs time and is harmless.
    """
    entries, start, _ = read_header(path)
    with open(path, "rb") as f:
        header_sha256 = hashlib.sha256(f.read(start)).hexdigest()
    stat = os.stat(path)  # follows the Hub cache's symlink to the blob
    return {"format": CACHE_FORMAT, "layout": "hf", "header_sha256": header_sha256,
            WEIGHTS_FILE: {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
                           "inode": stat.st_ino, "device": stat.st_dev}}


def load_hf_params(folder, config):  # -> params
    """The weights of an HF-layout folder, cached as .npy beside them like the TF path's."""
    path = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found (gpt2np reads the safetensors file, not pytorch_model.bin)")
    return load_params_cached(folder, config, _hf_key(path), lambda: read_hf_tensors(path, config), path,
                              CONFIG_FILE)
