"""Tests for gpt2np.checkpoints.weights: the name table, shape checks, random init and the .npy load cache."""
import doctest
import errno
import json
import os
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from conftest import copy_fixture
from gpt2np.model.fast import matmul

from gpt2np.checkpoints import weights
from gpt2np.checkpoints.tf_reader import read_checkpoint
from gpt2np.checkpoints.tf_writer import write_checkpoint
from gpt2np.model.config import PRESETS, GPT2Config
from gpt2np.model.fast.matmul import stored_column_major
from gpt2np.checkpoints.weights import init_params, load_params, params_from_tf, params_to_tf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CACHE = weights.CACHE_DIR


def fixture_config(name):
    return GPT2Config.from_hparams_json(FIXTURES / name / "hparams.json")


def leaves(params, path=""):
    """Flatten params to {"blocks.0.attn.c_attn.w": array}, to compare whole trees."""
    items = params.items() if isinstance(params, dict) else enumerate(params)
    flat = {}
    for key, value in items:
        name = f"{path}.{key}" if path else str(key)
        flat.update(leaves(value, name) if isinstance(value, (dict, list)) else {name: value})
    return flat


def assert_same_bits(a, b):
    a, b = leaves(a), leaves(b)
    assert a.keys() == b.keys(), f"only in one: {sorted(a.keys() ^ b.keys())}"
    for name in a:
        assert a[name].shape == b[name].shape, f"{name}: {a[name].shape} vs {b[name].shape}"
        assert a[name].tobytes() == b[name].tobytes(), f"{name}: max |diff| {np.abs(a[name] - b[name]).max()}"


@pytest.fixture
def model_dir(tmp_path):
    """A private copy of the tiny-a fixture folder (loading writes a cache into it)."""
    return copy_fixture(FIXTURES / "gpt2-tiny-a", tmp_path / "gpt2-tiny-a")


# ---- the name table ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2-tiny-a", "gpt2-tiny-b"])
def test_params_from_tf_layout(name):
    config = fixture_config(name)
    tensors = read_checkpoint(FIXTURES / name / "model.ckpt")
    params = params_from_tf(tensors, config)
    E = config.n_embd
    assert params["wte"].shape == (config.n_vocab, E) and params["wpe"].shape == (config.n_ctx, E)
    assert len(params["blocks"]) == config.n_layer
    block = params["blocks"][-1]
    assert block["attn"]["c_attn"]["w"].shape == (E, 3 * E)   # [in, out]: y = x @ w + b
    assert block["mlp"]["c_proj"]["w"].shape == (4 * E, E)
    np.testing.assert_array_equal(block["mlp"]["c_fc"]["w"],
                                  tensors[f"model/h{config.n_layer - 1}/mlp/c_fc/w"][0])
    for key, x in leaves(params).items():
        assert x.dtype == np.float32 and in_memory_order(key, x), key
    assert_same_bits(params_to_tf(params), tensors)  # the inverse restores every name and shape


def test_layer_order_is_numeric_past_ten_layers():
    config = GPT2Config(n_vocab=5, n_ctx=4, n_embd=4, n_head=2, n_layer=12)
    tensors = params_to_tf(init_params(config, np.random.default_rng(0)))
    for i in range(12):
        tensors[f"model/h{i}/ln_1/b"] = np.full(4, i, np.float32)
    params = params_from_tf(tensors, config)
    assert [int(b["ln_1"]["b"][0]) for b in params["blocks"]] == list(range(12))


def test_wrong_tensors_are_named():
    config = fixture_config("gpt2-tiny-a")
    tensors = dict(read_checkpoint(FIXTURES / "gpt2-tiny-a" / "model.ckpt"))
    del tensors["model/h1/mlp/c_fc/b"]
    tensors["model/global_step"] = np.zeros((), np.float32)
    tensors["model/wpe"] = np.zeros((63, 32), np.float32)
    with pytest.raises(ValueError) as info:
        params_from_tf(tensors, config)
    message = str(info.value)
    for part in ["missing 1: model/h1/mlp/c_fc/b", "unexpected 1: model/global_step",
                 "model/wpe is (63, 32) not (64, 32)", "hparams.json"]:
        assert part in message, message


def test_checkpoint_of_another_size_is_rejected():
    tensors = read_checkpoint(FIXTURES / "gpt2-tiny-b" / "model.ckpt")
    with pytest.raises(ValueError, match=r"unexpected 24: model/h2/.* and 21 more"):
        params_from_tf(tensors, fixture_config("gpt2-tiny-a"))


def test_params_to_tf_names_a_missing_param():
    params = init_params(PRESETS["tiny"], np.random.default_rng(0))
    del params["blocks"][1]["ln_2"]["g"]
    with pytest.raises(ValueError, match=r"blocks\.1\.ln_2\.g \(for model/h1/ln_2/g\)"):
        params_to_tf(params)


def test_doctests():
    result = doctest.testmod(weights)
    assert result.failed == 0 and result.attempted > 0, result


def in_memory_order(key, x):
    """Conv1D weights of 2 MiB or more column-major (w.T C-contiguous, for matmul.py's pieces), all
    else C order."""
    if key.endswith(".w") and stored_column_major(x.shape):
        return x.T.flags.c_contiguous
    return x.flags.c_contiguous


# ---- random parameters --------------------------------------------------------------------------

@settings(max_examples=20, deadline=None)
@given(n_layer=st.integers(1, 3), n_head=st.integers(1, 3), d_head=st.integers(1, 4),
       n_vocab=st.integers(1, 30), n_ctx=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_init_params_any_size(n_layer, n_head, d_head, n_vocab, n_ctx, seed):
    config = GPT2Config(n_vocab, n_ctx, n_head * d_head, n_head, n_layer)
    params = init_params(config, np.random.default_rng(seed))
    flat = leaves(params)
    assert sum(x.size for x in flat.values()) == config.n_params()
    for key, x in flat.items():
        assert x.dtype == np.float32 and in_memory_order(key, x) and x.flags.writeable, key
        if key.endswith(".g"):
            assert (x == 1).all(), key
        elif key.endswith(".b"):
            assert (x == 0).all(), key
    assert_same_bits(params, init_params(config, np.random.default_rng(seed)))  # rng decides all


def test_init_params_std_and_independent_arrays():
    params = init_params(PRESETS["tiny"], np.random.default_rng(1), std=0.5)
    std = params["wte"].std()
    assert abs(std - 0.5) < 0.05, f"wte std {std:.4f}, expected 0.5"
    params["blocks"][0]["ln_1"]["b"] += 1  # in-place edits (tests do them) must not leak
    assert (params["blocks"][0]["ln_2"]["b"] == 0).all() and (params["ln_f"]["b"] == 0).all()


# ---- load_params and its cache -------------------------------------------------------------------

def test_first_load_writes_cache_second_load_uses_it(model_dir, monkeypatch):
    config = fixture_config("gpt2-tiny-a")
    first = load_params(model_dir, config)
    assert_same_bits(first, params_from_tf(read_checkpoint(model_dir / "model.ckpt"), config))
    manifest = json.loads((model_dir / CACHE / "manifest.json").read_text())
    assert len(manifest["tensors"]) == 28 and all((model_dir / CACHE / entry["file"]).is_file()
                                                  for entry in manifest["tensors"].values())

    def fail(prefix):
        raise AssertionError("the second load read the checkpoint instead of the cache")
    monkeypatch.setattr(weights, "read_checkpoint", fail)
    second = load_params(model_dir, config)
    assert_same_bits(first, second)
    for key, x in leaves(second).items():  # read into memory as stored (memory maps got 4 KB pages)
        assert not isinstance(x, np.memmap) and x.flags.writeable and in_memory_order(key, x), key


def test_changed_checkpoint_rebuilds_cache(model_dir):
    config = fixture_config("gpt2-tiny-a")
    load_params(model_dir, config)
    tensors = {k: np.array(v) for k, v in read_checkpoint(model_dir / "model.ckpt").items()}
    tensors["model/wte"][7] += 1  # same sizes; the .index changes (tensor CRC)
    write_checkpoint(model_dir / "model.ckpt", tensors)
    params = load_params(model_dir, config)
    np.testing.assert_array_equal(params["wte"][7], tensors["model/wte"][7])


def test_touched_data_file_rebuilds_cache(model_dir, monkeypatch):
    config = fixture_config("gpt2-tiny-a")
    load_params(model_dir, config)
    data = model_dir / "model.ckpt.data-00000-of-00001"
    stat = data.stat()
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    calls = []
    monkeypatch.setattr(weights, "read_checkpoint", lambda p: calls.append(p) or read_checkpoint(p))
    load_params(model_dir, config)
    assert len(calls) == 1, "a newer data file must be re-read (and its CRCs re-checked)"


@pytest.mark.parametrize("damage", ["not an npy file", "empty", "truncated"])
def test_damaged_cache_is_rebuilt(model_dir, damage):
    config = fixture_config("gpt2-tiny-a")
    first = leaves(load_params(model_dir, config))
    wte = model_dir / CACHE / "model.wte.npy"
    wte.write_bytes({"not an npy file": b"not an npy file", "empty": b"",
                     "truncated": wte.read_bytes()[:200]}[damage])
    assert_same_bits(load_params(model_dir, config), first)
    (model_dir / CACHE / "manifest.json").write_text("{")
    assert_same_bits(load_params(model_dir, config), first)


def npy_data_offset(path):
    """Where the array's bytes start in a .npy file (after the magic, version and header)."""
    with open(path, "rb") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        return f.tell()


def flip_byte(path):
    raw = bytearray(path.read_bytes())
    raw[npy_data_offset(path) + 37] ^= 0x10  # one bit of one float: a plausible value, still finite
    path.write_bytes(bytes(raw))


def zero_data(path):
    raw = path.read_bytes()
    start = npy_data_offset(path)
    path.write_bytes(raw[:start] + bytes(len(raw) - start))


def transposed_in_place(path):
    """Same bytes, header says the other memory order: only the order check can tell."""
    x = np.load(path)
    np.save(path, np.ravel(x, order="K").reshape(x.shape))  # column-major bytes read as C order


CACHE_DAMAGE = {  # what can happen to a cached tensor that a CRC or shape check must catch
    "flipped byte": ("model.h1.attn.c_attn.w.npy", flip_byte),
    "zeros": ("model.wte.npy", zero_data),
    "wrong shape": ("model.wpe.npy", lambda p: np.save(p, np.zeros((63, 32), np.float32))),
    "float64": ("model.ln_f.g.npy", lambda p: np.save(p, np.load(p).astype(np.float64))),
    "transposed": ("model.h0.attn.c_proj.w.npy", transposed_in_place),
    "no crc in manifest": ("manifest.json", lambda p: p.write_text(p.read_text().replace('"crc32c"', '"crc"'))),
}


@pytest.mark.parametrize("damage", CACHE_DAMAGE)
def test_corrupt_cached_tensor_is_rebuilt_from_the_checkpoint(model_dir, monkeypatch, damage):
    """Issue 16, item 2: the cache is verified on every load (CRC32C per tensor, shape, dtype,
    memory order); a failure rebuilds it from the CRC-checked checkpoint, never an error."""
    config = fixture_config("gpt2-tiny-a")
    monkeypatch.setattr(matmul, "COLUMN_MAJOR_MIN", 1)  # c_proj.w [1, 32, 32] column-major: "transposed"
    expected = params_from_tf(read_checkpoint(model_dir / "model.ckpt"), config)
    load_params(model_dir, config)
    file, damage_fn = CACHE_DAMAGE[damage]
    damage_fn(model_dir / CACHE / file)
    calls = []
    monkeypatch.setattr(weights, "read_checkpoint", lambda p: calls.append(p) or read_checkpoint(p))
    assert_same_bits(load_params(model_dir, config), expected)
    assert len(calls) == 1, "the damaged cache was used instead of being rebuilt"
    assert_same_bits(load_params(model_dir, config), expected)
    assert len(calls) == 1, "the rebuilt cache was not used"


def test_cache_files_named_outside_the_cache_are_not_read(model_dir, monkeypatch):
    config = fixture_config("gpt2-tiny-a")
    load_params(model_dir, config)
    manifest_path = model_dir / CACHE / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    np.save(model_dir / "elsewhere.npy", np.zeros(32, np.float32))
    manifest["tensors"]["model/ln_f/b"]["file"] = "../elsewhere.npy"
    manifest["tensors"]["model/ln_f/b"]["crc32c"] = weights.tensor_crc32c(np.zeros(32, np.float32))
    manifest_path.write_text(json.dumps(manifest))
    calls = []
    monkeypatch.setattr(weights, "read_checkpoint", lambda p: calls.append(p) or read_checkpoint(p))
    load_params(model_dir, config)
    assert len(calls) == 1  # "elsewhere.npy" is looked up inside the cache, missing: rebuild


def test_unwritable_cache_location_loads_without_cache(model_dir):
    (model_dir / CACHE).write_text("a file where the cache folder should be")
    params = load_params(model_dir, fixture_config("gpt2-tiny-a"))
    assert params["wte"].shape == (50257, 32) and (model_dir / CACHE).is_file()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_folder_loads_without_cache(model_dir):
    model_dir.chmod(0o555)
    try:
        params = load_params(model_dir, fixture_config("gpt2-tiny-a"))
    finally:
        model_dir.chmod(0o755)
    assert params["wte"].shape == (50257, 32) and not (model_dir / CACHE).exists()


def test_full_disk_while_writing_the_cache_loads_and_leaves_nothing_behind(model_dir, monkeypatch, tmp_path):
    """The disk fills at the 4th tensor: the load still succeeds (from the checkpoint), and neither the 3
    .npy files written before nor the 4th's temporary file stay (they would never be read, and would hold
    the space); then the next load, with room again, writes the whole cache."""
    config = fixture_config("gpt2-tiny-a")
    expected = load_params(copy_fixture(FIXTURES / "gpt2-tiny-a", tmp_path / "other"), config)
    save, calls = np.save, []

    def save_until_full(f, x):
        calls.append(1)
        if len(calls) > 3:
            f.write(b"\x93NUMPY partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        save(f, x)

    monkeypatch.setattr(np, "save", save_until_full)
    assert_same_bits(load_params(model_dir, config), expected)
    assert len(calls) == 4 and not (model_dir / CACHE).exists(), sorted(os.listdir(model_dir / CACHE))
    monkeypatch.undo()
    assert_same_bits(load_params(model_dir, config), expected)
    assert (model_dir / CACHE / "manifest.json").is_file() and len(list((model_dir / CACHE).glob("*.npy"))) == 28


def test_full_disk_while_rewriting_a_cache_removes_what_the_attempt_wrote(model_dir, monkeypatch):
    """A cache folder that was there before stays, but without the files the failed attempt wrote."""
    config = fixture_config("gpt2-tiny-a")
    load_params(model_dir, config)
    os.utime(model_dir / "model.ckpt.data-00000-of-00001", ns=(1, 1))  # another key: the cache is rewritten
    save, written = np.save, []

    def save_until_full(f, x):
        written.append(f.name)
        if len(written) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        save(f, x)

    monkeypatch.setattr(np, "save", save_until_full)
    load_params(model_dir, config)
    left = set(os.listdir(model_dir / CACHE))
    attempt = {os.path.basename(name).rsplit(".tmp-", 1)[0] for name in written}
    assert len(attempt) == 4 and not left & attempt and not any(".tmp-" in n for n in left), sorted(left)
    assert "manifest.json" not in left


def dead_pid():
    """A pid no process has (os.kill with signal 0 raises ProcessLookupError for it)."""
    for pid in range(4_000_000, 5_000_000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
    pytest.skip("no free pid found")


def test_temporary_files_of_dead_writers_are_swept_and_a_live_writers_kept(model_dir):
    """kill -9 during a first load leaves <file>.tmp-<pid>: the next load removes it (its writer is
    gone) but never the file of a writer that is still running (here: this process)."""
    cache = model_dir / CACHE
    cache.mkdir()
    dead = [cache / f"model.wte.npy.tmp-{dead_pid()}", cache / f"manifest.json.tmp-{dead_pid()}"]
    live = cache / f"spare.npy.tmp-{os.getpid()}"
    for path in dead + [live]:
        path.write_bytes(b"")
    load_params(model_dir, fixture_config("gpt2-tiny-a"))
    assert live.is_file() and not any(p.exists() for p in dead), sorted(os.listdir(cache))
    assert (cache / "manifest.json").is_file()
    dead[0].write_bytes(b"")  # and when the cache is already good, the load that reads it sweeps too
    load_params(model_dir, fixture_config("gpt2-tiny-a"))
    assert live.is_file() and not dead[0].exists()


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.ckpt\.index not found"):
        load_params(tmp_path, PRESETS["tiny"])


def test_wrong_config_fails_before_caching(model_dir):
    with pytest.raises(ValueError, match="does not fit"):
        load_params(model_dir, fixture_config("gpt2-tiny-b"))
    assert not (model_dir / CACHE).exists()


def test_saved_random_model_loads_back(tmp_path):
    params = init_params(PRESETS["tiny"], np.random.default_rng(3))
    write_checkpoint(tmp_path / "model.ckpt", params_to_tf(params))
    assert_same_bits(load_params(tmp_path, PRESETS["tiny"]), params)


# ---- memory order: column-major Conv1D weights from 2 MiB up -------------------------------------

def test_gpt2_sized_weights_are_column_major_and_small_ones_row_major():
    config = GPT2Config(n_vocab=10, n_ctx=4, n_embd=768, n_head=12, n_layer=1)  # 124M's widths
    block = init_params(config, np.random.default_rng(0))["blocks"][0]
    for name in ("c_attn", "c_proj"):
        w = block["attn"][name]["w"]
        assert stored_column_major(w.shape) and w.T.flags.c_contiguous, (name, w.shape)
    small = init_params(PRESETS["tiny"], np.random.default_rng(0))["blocks"][0]["mlp"]["c_fc"]["w"]
    assert not stored_column_major(small.shape) and small.flags.c_contiguous


def test_column_major_weights_survive_cache_and_export(model_dir, monkeypatch, tmp_path):
    """With the threshold lowered, the tiny fixture goes through every column-major code path:
    the checkpoint -> params conversion, the .npy cache (read back in the order stored), and the
    export back to a checkpoint, which must give TensorFlow's bytes as before."""
    config = fixture_config("gpt2-tiny-a")
    row_major = params_from_tf(read_checkpoint(model_dir / "model.ckpt"), config)
    monkeypatch.setattr(matmul, "COLUMN_MAJOR_MIN", 1)
    for params in (load_params(model_dir, config), load_params(model_dir, config)):  # build, then read
        for key, x in leaves(params).items():
            assert in_memory_order(key, x), key
        assert_same_bits(params, row_major)
    assert not isinstance(params["blocks"][0]["mlp"]["c_fc"]["w"], np.memmap)  # the cache, read as stored
    write_checkpoint(str(tmp_path / "model.ckpt"), params_to_tf(params))
    for suffix in (".index", ".data-00000-of-00001"):
        assert (tmp_path / f"model.ckpt{suffix}").read_bytes() == (model_dir / f"model.ckpt{suffix}").read_bytes()
