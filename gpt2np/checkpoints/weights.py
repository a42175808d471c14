"""GPT-2 parameters: map OpenAI's checkpoint names to our nested dict, load them fast, or draw them.

The layout of `params` is the one in docs/CONTRACTS.md (picoGPT's). The checkpoint side is
OpenAI's TF1 release (variable names from openai/gpt-2's src/model.py), read by tf_reader.py.
One table, `tf_layout`, states the whole mapping. The only remapping is the Conv1D weight:
the checkpoint stores it as [1, in, out] and we drop the leading 1. It is already [in, out],
so `x @ w + b` needs NO transpose (the opposite of the torch ports, which transpose it).

Conv1D weights of 2 MiB or more (all of GPT-2's) are kept column-major in memory (w.T is
C-contiguous: each output's weights are contiguous, like wte's rows and torch's Linear). Their
shape and every result are the same; what changes is speed: matmul.py's few-row products need
that order. Smaller weights (the bundled models') run faster row-major and stay so. Under OpenBLAS's
SkylakeX kernel, load_model then cuts each large weight into panels of columns, a 3-D array
(model/fast/layout.py, order_as_loaded); this file's cache keeps the stored order either way.

>>> from gpt2np.model.config import PRESETS
>>> params = init_params(PRESETS["tiny"], np.random.default_rng(0))
>>> params["blocks"][0]["attn"]["c_attn"]["w"].shape      # [n_embd, 3 * n_embd]
(16, 48)
>>> params_to_tf(params)["model/h0/attn/c_attn/w"].shape  # the checkpoint's [1, in, out]
(1, 16, 48)
"""
import hashlib
import json
import os
import re

import numpy as np

from .tf_reader import crc32c, read_checkpoint
from ..model.config import GPT2Config
from ..model.fast.matmul import as_matrix, stored_column_major

CACHE_DIR = ".gpt2np-cache"  # inside the model folder
CACHE_FORMAT = 3             # bump when the cache layout changes, so old caches are rebuilt
                             # (2: Conv1D weights of 2 MiB or more column-major;
                             #  3: the manifest holds each tensor's CRC32C, checked on every load)


def tf_layout(config):  # -> {TF name: (path into params, shape in the checkpoint)}
    """The one name table: every checkpoint tensor, where it goes in `params`, and its shape."""
    V, C, E = config.n_vocab, config.n_ctx, config.n_embd
    layout = {
        "model/wte": (("wte",), (V, E)),   # token embeddings, also the output head (tied)
        "model/wpe": (("wpe",), (C, E)),   # position embeddings
    }
    for i in range(config.n_layer):  # built in layer order: never sort names ("h10" < "h2")
        block = {  # name under model/h{i}/ -> (path under params["blocks"][i], checkpoint shape)
            "ln_1/g": (("ln_1", "g"), (E,)),
            "ln_1/b": (("ln_1", "b"), (E,)),
            "attn/c_attn/w": (("attn", "c_attn", "w"), (1, E, 3 * E)),  # q|k|v side by side
            "attn/c_attn/b": (("attn", "c_attn", "b"), (3 * E,)),
            "attn/c_proj/w": (("attn", "c_proj", "w"), (1, E, E)),
            "attn/c_proj/b": (("attn", "c_proj", "b"), (E,)),
            "ln_2/g": (("ln_2", "g"), (E,)),
            "ln_2/b": (("ln_2", "b"), (E,)),
            "mlp/c_fc/w": (("mlp", "c_fc", "w"), (1, E, 4 * E)),
            "mlp/c_fc/b": (("mlp", "c_fc", "b"), (4 * E,)),
            "mlp/c_proj/w": (("mlp", "c_proj", "w"), (1, 4 * E, E)),
            "mlp/c_proj/b": (("mlp", "c_proj", "b"), (E,)),
        }
        layout.update({f"model/h{i}/{name}": (("blocks", i) + path, shape)
                       for name, (path, shape) in block.items()})
    layout["model/ln_f/g"] = (("ln_f", "g"), (E,))  # final layer norm
    layout["model/ln_f/b"] = (("ln_f", "b"), (E,))
    return layout


def _first(names, n=3):
    """At most n names, then how many more: keeps 1558M's 580-name lists to one line."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def check_tensors(tensors, config, source="checkpoint", config_file="hparams.json"):
    """Raise one ValueError naming every missing, unexpected or mis-shaped tensor. The hint names the
    file the config came from (config_file): hparams.json, or config.json in the Hugging Face layout."""
    layout = tf_layout(config)
    missing = [name for name in layout if name not in tensors]
    unexpected = [name for name in tensors if name not in layout]
    misshaped = [f"{name} is {tuple(np.shape(tensors[name]))} not {shape}"
                 for name, (_, shape) in layout.items()
                 if name in tensors and tuple(np.shape(tensors[name])) != shape]
    problems = [f"{what} {len(names)}: {_first(names)}" for what, names in
                (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)) if names]
    if problems:
        raise ValueError(f"{source} does not fit {config}: {'; '.join(problems)} "
                         f"(does {config_file} belong to this checkpoint?)")


def _float32(x):
    """Contiguous float32, without copying arrays (or memory maps) that already are."""
    if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x, dtype=np.float32)


def _conv1d_order(x):
    """A Conv1D weight [1, in, out] in float32 and the memory order its size calls for (module
    docstring): column-major (np.asfortranarray) from 2 MiB up, else C order. Copies only if needed."""
    if not stored_column_major(np.shape(x)):
        return _float32(x)
    if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.f_contiguous:
        return x
    return np.asfortranarray(x, dtype=np.float32)


def params_from_tf(tensors, config):  # {TF name: array} -> params
    """Arrange checkpoint tensors as the nested params dict, checking every name and shape."""
    check_tensors(tensors, config)
    params = {"wte": None, "wpe": None, "blocks": [{} for _ in range(config.n_layer)], "ln_f": {}}
    for name, (path, shape) in tf_layout(config).items():
        node = params
        for key in path[:-1]:
            node = node[key] if isinstance(key, int) else node.setdefault(key, {})
        if len(shape) == 3:  # Conv1D w: [1, in, out] -> [in, out], in its memory order (module docstring)
            node[path[-1]] = _conv1d_order(tensors[name])[0]
        else:
            node[path[-1]] = _float32(tensors[name])
    return params


def params_to_tf(params):  # params -> {TF name: array}
    """The inverse of params_from_tf: checkpoint names, and w gets back its leading axis of 1."""
    n_vocab, n_embd = params["wte"].shape
    # n_head changes no shape, and 1 divides every n_embd.
    config = GPT2Config(n_vocab, params["wpe"].shape[0], n_embd, 1, len(params["blocks"]))
    tensors = {}
    for name, (path, shape) in tf_layout(config).items():
        node = params
        for key in path:
            if not isinstance(node, list) and key not in node:
                raise ValueError(f"params has no {'.'.join(map(str, path))} (for {name})")
            node = node[key]
        tensors[name] = as_matrix(np.asarray(node))[None] if len(shape) == 3 else np.asarray(node)
    check_tensors(tensors, config, source="params")
    return tensors


def init_params(config, rng, std=0.02):  # -> params with fresh, writable float32 arrays
    """Random GPT-2 weights of any size: weights ~ N(0, std^2), layer-norm gains 1, biases 0.

    Drawn directly in float32 and scaled in place, so 1558M never needs float64 temporaries.
    """
    tensors = {}
    for name, (_, shape) in tf_layout(config).items():
        if name.endswith("/g"):
            tensors[name] = np.ones(shape, np.float32)
        elif name.endswith("/b"):
            tensors[name] = np.zeros(shape, np.float32)
        else:
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= np.float32(std)
            tensors[name] = _conv1d_order(x) if len(shape) == 3 else x  # one copy at a time
    return params_from_tf(tensors, config)


# ---- loading with a fast cache ----------------------------------------------------------------

def _checkpoint_key(prefix):  # -> dict identifying the checkpoint's exact bytes, or None
    """Sizes and mtimes of the checkpoint files plus the sha256 of the .index (which holds
    every tensor's CRC, so it changes whenever a tensor does). None if there is no .index."""
    if not os.path.isfile(prefix + ".index"):
        return None
    with open(prefix + ".index", "rb") as f:
        key = {"format": CACHE_FORMAT, "index_sha256": hashlib.sha256(f.read()).hexdigest()}
    folder, base = os.path.split(prefix)
    data = sorted(n for n in os.listdir(folder or ".") if n.startswith(base + ".data-"))
    for name in [base + ".index"] + data:
        stat = os.stat(os.path.join(folder, name))
        key[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return key


def tensor_crc32c(x):
    """CRC32C of an array's bytes in the order they are stored (C or column-major), as in the .npy."""
    return crc32c(np.ravel(x, order="K").view(np.uint8))  # ravel of a contiguous array: a view


def _in_stored_order(x):
    """Conv1D weights of 2 MiB or more column-major, everything else C order (module docstring).
    The CRC covers the bytes, not the header: a square weight read in the other order is transposed."""
    if x.ndim == 3 and stored_column_major(x.shape):
        return x.flags.f_contiguous
    return x.flags.c_contiguous


def _cached_tensor(path, shape, crc, verify_crc=True):  # -> the array, or None if it cannot be trusted
    """One cached tensor, checked against the name table's shape and the CRC32C the manifest recorded
    when it was written: a flipped byte or zeros in a .npy would otherwise change every later run."""
    x = np.load(path, allow_pickle=False)
    if x.dtype != np.float32 or x.shape != shape or not _in_stored_order(x):
        return None
    if verify_crc and tensor_crc32c(x) != crc:
        return None
    return x


def _load_cache(cache_dir, key, config, verify_crc=True):  # -> {TF name: array in memory}, or None to rebuild
    """Read, not memory-mapped: NumPy's own large allocations get 2 MiB pages, a file mapping gets
    4 KB pages, and a 355M verification pass over mapped weights took 1.09x as long (PERFORMANCE.md).
    Any tensor that fails its checks means rebuild from the checkpoint (whose CRCs are checked again),
    never an error: the cache is ours, the user did nothing wrong. verify_crc=False only for timing."""
    try:
        with open(os.path.join(cache_dir, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        layout = tf_layout(config)
        if key is None or manifest["key"] != key or manifest["tensors"].keys() != layout.keys():
            return None
        tensors = {}
        for name, entry in manifest["tensors"].items():
            path = os.path.join(cache_dir, os.path.basename(entry["file"]))  # never outside the cache
            tensors[name] = _cached_tensor(path, layout[name][1], entry["crc32c"], verify_crc)
            if tensors[name] is None:
                return None
        return tensors
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError):  # absent or damaged
        return None


TMP_SUFFIX = re.compile(r"\.tmp-(\d+)$")  # _save_atomically's temporary names: <file>.tmp-<writer's pid>


def _save_atomically(path, write):
    """Call write(file) on a temporary name, then rename it to `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_cache(cache_dir, key, tensors):
    """One .npy per tensor, then the manifest last: only a finished cache has a manifest.

    A write that fails (a full disk, an interrupt) removes every file this attempt wrote, and the
    folder if it made it: .npy files without a manifest are never read, so left behind they would
    only hold the disk (GBs at 1558M) that the next load needs to write them again."""
    created = not os.path.isdir(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    manifest_path = os.path.join(cache_dir, "manifest.json")
    written = []
    try:
        if os.path.exists(manifest_path):
            os.remove(manifest_path)  # the old manifest must not vouch for half-rewritten files
        entries = {}
        for name, tensor in tensors.items():
            file = name.replace("/", ".") + ".npy"  # model.h0.ln_1.g.npy
            # np.save streams a memmap straight from the page cache: no second copy in RAM. Conv1D
            # weights are saved in their memory order (module docstring), one tensor's copy at a time.
            x = _conv1d_order(tensor) if np.ndim(tensor) == 3 else _float32(tensor)
            written.append(os.path.join(cache_dir, file))
            _save_atomically(written[-1], lambda f, x=x: np.save(f, x))
            entries[name] = {"file": file, "crc32c": tensor_crc32c(x)}  # of the bytes just written
        manifest = json.dumps({"key": key, "tensors": entries}, indent=1).encode()
        _save_atomically(manifest_path, lambda f: f.write(manifest))
    except BaseException:
        for path in written:  # _save_atomically has removed its temporary file already
            _remove_quietly(path)
        if created:
            try:
                os.rmdir(cache_dir)  # only if empty: another writer's files stay
            except OSError:
                pass
        raise


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:  # gone already, or not ours to remove: the cleanup must not hide the first error
        pass


def _writer_is_gone(pid):
    """True if no process has this pid (os.kill with signal 0 checks, sends nothing). A pid taken again
    by another process, or a writer of another user, counts as alive: its file is kept, which is safe."""
    if pid <= 0:  # 0 and negative pids name process groups, not a writer
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists, under another user
        return False
    return False


def _sweep_stale_temporaries(cache_dir):
    """Remove the <file>.tmp-<pid> files of cache writers that died mid-write (kill -9, a power cut):
    no later write uses their names, so nothing else would ever remove them. A live writer's stay."""
    try:
        names = os.listdir(cache_dir)
    except OSError:  # no cache yet, or something else where it would be
        return
    for name in names:
        m = TMP_SUFFIX.search(name)
        if m and _writer_is_gone(int(m[1])):
            _remove_quietly(os.path.join(cache_dir, name))


def load_params(model_dir, config, cache=True):  # -> params
    """Load OpenAI-format weights from `model_dir` (model.ckpt.index + .data-*).

    The first load checks every CRC (checkpoint.read_checkpoint) and writes one .npy per
    tensor to `<model_dir>/.gpt2np-cache/`, with its CRC32C in the manifest; later loads read
    those straight into memory and check each one's shape and CRC32C (about a second for 355M),
    until the checkpoint files change. A cached tensor that fails a check makes the cache be
    rebuilt from the checkpoint. A folder we cannot write just goes uncached, and so does any with
    cache=False (the bundled models, inside the installed package: loading.load_model).
    """
    prefix = os.path.join(model_dir, "model.ckpt")
    # memory maps: nothing is held in RAM twice
    return load_params_cached(model_dir, config, _checkpoint_key(prefix), lambda: read_checkpoint(prefix), prefix,
                              cache=cache)


def load_params_cached(model_dir, config, key, read_tensors, source, config_file="hparams.json",
                       cache=True):  # -> params
    """Params from the .npy cache in `<model_dir>/.gpt2np-cache/` if it was written for `key` (a dict
    that changes whenever the source's bytes do), else from read_tensors() -> {TF name: array},
    caching them (cache=False: never, nothing written). Both checkpoint layouts (OpenAI's TF one here,
    Hugging Face's in hf_layout.py) load this way (config_file: where `config` came from, for
    check_tensors' hint). Temporary files of cache writers that died first are swept here
    (_sweep_stale_temporaries)."""
    if not cache:
        tensors = read_tensors()
        check_tensors(tensors, config, source, config_file)
        return params_from_tf(tensors, config)
    cache_dir = os.path.join(model_dir, CACHE_DIR)
    _sweep_stale_temporaries(cache_dir)
    tensors = _load_cache(cache_dir, key, config)
    if tensors is None:
        tensors = read_tensors()
        check_tensors(tensors, config, source, config_file)  # fail before writing a useless cache
        try:
            _write_cache(cache_dir, key, tensors)
        except OSError:  # read-only folder, disk full...: use the checkpoint's own memory maps
            return params_from_tf(tensors, config)
        del tensors  # unmap the checkpoint before the cache is read: never both in RAM
        tensors = _load_cache(cache_dir, key, config) or read_tensors()
    return params_from_tf(tensors, config)
