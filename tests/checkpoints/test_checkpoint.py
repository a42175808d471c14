"""Tests for gpt2np.checkpoints.tf_reader (the TF bundle reader) and gpt2np.checkpoints.tf_writer.

The fixtures were written by real TensorFlow (TF1 Saver), so reading them checks the reader
against TF, and re-writing them byte for byte checks the writer against TF.
"""
import doctest
from pathlib import Path

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from conftest import copy_fixture
from gpt2np.checkpoints import tf_reader as checkpoint

from gpt2np.checkpoints import tf_writer as checkpoint_writer
from gpt2np.checkpoints.tf_reader import (CheckpointError, crc32c, crc32c_reference, decode_varint,
                               index_block_handles, read_checkpoint, read_index)
from gpt2np.checkpoints.tf_writer import (encode_entry, encode_header, encode_table, encode_varint,
                                      short_successor, shortest_separator, write_checkpoint)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DATA = "model.ckpt.data-00000-of-00001"
# fixture -> (n_layer, n_embd); n_vocab 50257 and n_ctx 64 for both (see their hparams.json)
SIZES = {"gpt2-tiny-a": (2, 32), "gpt2-tiny-b": (4, 48)}


def expected_shapes(n_layer, E, V=50257, C=64):
    """Names and shapes of the tensors in OpenAI's GPT-2 checkpoints (as openai/gpt-2's model.py names them)."""
    shapes = {"model/wpe": (C, E), "model/wte": (V, E), "model/ln_f/g": (E,), "model/ln_f/b": (E,)}
    for i in range(n_layer):
        for name, shape in {"ln_1/g": (E,), "ln_1/b": (E,), "attn/c_attn/w": (1, E, 3 * E),
                            "attn/c_attn/b": (3 * E,), "attn/c_proj/w": (1, E, E),
                            "attn/c_proj/b": (E,), "ln_2/g": (E,), "ln_2/b": (E,),
                            "mlp/c_fc/w": (1, E, 4 * E), "mlp/c_fc/b": (4 * E,),
                            "mlp/c_proj/w": (1, 4 * E, E), "mlp/c_proj/b": (E,)}.items():
            shapes[f"model/h{i}/{name}"] = shape
    return shapes


@pytest.fixture
def copy_of(tmp_path):
    """copy_of(name) -> prefix of a private copy of tests/fixtures/<name> (safe to damage)."""
    def copy(name):
        copy_fixture(FIXTURES / name, tmp_path / name)
        return tmp_path / name / "model.ckpt"
    return copy


# ---- reading TF's files ----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SIZES))
def test_reads_fixture_names_and_shapes(name):
    tensors = read_checkpoint(FIXTURES / name / "model.ckpt")
    expected = expected_shapes(*SIZES[name])
    assert len(tensors) == 12 * SIZES[name][0] + 4 == len(expected)  # 28 and 52
    assert {k: v.shape for k, v in tensors.items()} == expected
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in tensors.values())


@pytest.mark.parametrize("name", sorted(SIZES))
def test_tensors_tile_data_file_in_key_order(name):
    header, entries = read_index(FIXTURES / name / "model.ckpt.index")
    assert header == {1: [1], 3: [b"\x08\x01"]}  # num_shards 1, version {producer 1}
    keys = list(entries)
    assert keys == sorted(keys, key=str.encode), "index keys must be in byte order"
    end = 0
    for key, entry in entries.items():  # offsets grow with the keys, no gaps, no overlap
        assert entry.offset == end, f"{key} starts at {entry.offset}, previous tensor ended at {end}"
        end += entry.size
    size = (FIXTURES / name / DATA).stat().st_size
    assert end == size, f"tensors cover {end} bytes, {DATA} has {size}"


def test_fixture_index_layout_matches_the_format_doc():
    buf = (FIXTURES / "gpt2-tiny-a" / "model.ckpt.index").read_bytes()
    assert len(buf) == 974
    assert index_block_handles(buf) == [(b"n", 0, 888)]  # one data block, key successor("model/wte")
    assert buf[:888][-12:] == bytes([0, 0, 0, 0, 217, 1, 0, 0, 2, 0, 0, 0])  # restarts [0, 473]


# ---- CRC32C and varints ----------------------------------------------------------------------

def test_crc32c_check_value():
    assert crc32c(b"123456789") == crc32c_reference(b"123456789") == 0xE3069283


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), start=st.integers(0, 2**32 - 1))
def test_fast_crc32c_agrees_with_reference(data, start):
    assert crc32c(data) == crc32c_reference(data)
    assert crc32c_reference(data, start) == checkpoint._crc32c_fast(data, start)


def test_crc32c_of_numpy_array_is_crc_of_its_bytes():
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    assert crc32c(x) == crc32c_reference(x.tobytes())


@given(st.integers(0, 2**64 - 1))
def test_varint_roundtrip(n):
    buf = b"\xAA" + encode_varint(n) + b"\xBB"
    assert decode_varint(buf, 1) == (n, len(buf) - 1)


def test_separator_and_successor():
    assert shortest_separator(b"the quick brown fox", b"the who") == b"the r"
    assert shortest_separator(b"abc", b"abcd") == b"abc"   # a prefix: nothing to shorten
    assert shortest_separator(b"abc", b"abd") == b"abc"    # "abd" itself is not < limit
    assert short_successor(b"model/wte") == b"n"
    assert short_successor(b"\xff\xff") == b"\xff\xff"


def test_doctests():
    for module in (checkpoint, checkpoint_writer):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, f"{module.__name__}: {result}"


# ---- damaged and missing files ----------------------------------------------------------------

def test_flipped_byte_in_data_names_the_tensor(copy_of):
    prefix = copy_of("gpt2-tiny-a")
    entry = read_index(f"{prefix}.index")[1]["model/wpe"]
    data = Path(f"{prefix}.data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 1234] ^= 0x01
    data.write_bytes(raw)
    with pytest.raises(CheckpointError, match="CRC32C") as info:
        read_checkpoint(prefix)
    message = str(info.value)
    assert "'model/wpe'" in message and DATA in message and "download" in message, message


def test_truncated_data_names_the_tensor_and_bytes(copy_of):
    prefix = copy_of("gpt2-tiny-b")
    data = Path(f"{prefix}.data-00000-of-00001")
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size - 100)
    entry = read_index(f"{prefix}.index")[1]["model/wte"]  # the last tensor in the file
    with pytest.raises(CheckpointError, match="truncated") as info:
        read_checkpoint(prefix)
    message = str(info.value)
    assert "'model/wte'" in message and f"[{entry.offset}, {size})" in message, message
    assert f"has {size - 100} bytes" in message and DATA in message, message


@pytest.mark.parametrize("cut", [1, 20, 500])
def test_truncated_index_is_reported(copy_of, cut):
    prefix = copy_of("gpt2-tiny-a")
    index = Path(f"{prefix}.index")
    index.write_bytes(index.read_bytes()[:-cut])
    with pytest.raises(CheckpointError, match="magic") as info:
        read_checkpoint(prefix)
    assert "model.ckpt.index" in str(info.value) and "download" in str(info.value)


@pytest.mark.parametrize("position", [3, 400, 890, 910])  # data block entries, trailer, index block
def test_corrupt_index_fails_a_block_crc(copy_of, position):
    prefix = copy_of("gpt2-tiny-a")
    index = Path(f"{prefix}.index")
    raw = bytearray(index.read_bytes())
    raw[position] ^= 0x20
    index.write_bytes(raw)
    with pytest.raises(CheckpointError, match="CRC32C") as info:
        read_checkpoint(prefix)
    assert "model.ckpt.index" in str(info.value)


@pytest.mark.parametrize("missing", ["model.ckpt.index", DATA])
def test_missing_file_is_named(copy_of, missing):
    prefix = copy_of("gpt2-tiny-a")
    (prefix.parent / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")) as info:
        read_checkpoint(prefix)
    assert "download_model" in str(info.value)


def test_unsupported_dtype_is_named(tmp_path):
    entry = encode_entry((2,), 0, 8, 0, dtype=3)  # DT_INT32
    (tmp_path / "m.index").write_bytes(encode_table([(b"", encode_header()), (b"step", entry)]))
    (tmp_path / "m.data-00000-of-00001").write_bytes(bytes(8))
    with pytest.raises(CheckpointError, match="'step' is DT_INT32"):
        read_checkpoint(tmp_path / "m")


# ---- the writer --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SIZES))
def test_rewrite_reproduces_tensorflow_bytes(tmp_path, name):
    write_checkpoint(tmp_path / "model.ckpt", read_checkpoint(FIXTURES / name / "model.ckpt"))
    for file in ["model.ckpt.index", DATA, "checkpoint"]:
        ours, tf = (tmp_path / file).read_bytes(), (FIXTURES / name / file).read_bytes()
        if ours != tf:
            at = next((i for i, (a, b) in enumerate(zip(ours, tf)) if a != b), min(len(ours), len(tf)))
            pytest.fail(f"{file}: {len(ours)} bytes vs TF's {len(tf)}; first difference at byte {at}")


def test_many_long_keys_make_several_data_blocks(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {f"model/h{i}/" + "x" * 150 + f"/{i % 7}": rng.standard_normal(i % 5, dtype=np.float32)
               for i in range(3000)}  # ~560 KB of index entries: three 256 KB blocks
    write_checkpoint(tmp_path / "m", tensors)
    handles = index_block_handles((tmp_path / "m.index").read_bytes())
    assert len(handles) == 3, f"expected 3 data blocks, index block lists {handles}"
    keys = [k.encode() for k in sorted(tensors, key=str.encode)]
    for separator, offset, size in handles[:-1]:
        # TF cuts a block right after the entry that takes it to >= 262,144 bytes (one entry < 300 B)
        assert 0 <= size - checkpoint_writer.BLOCK_SIZE < 300, f"block at {offset}: {size} bytes"
        assert any(a <= separator < b for a, b in zip(keys, keys[1:])), separator
    back = read_checkpoint(tmp_path / "m")
    assert list(back) == [k.decode() for k in keys]
    for name, x in tensors.items():
        np.testing.assert_array_equal(back[name], x, err_msg=name)


def test_more_than_ten_layers_sort_bytewise(tmp_path):
    names = [f"model/h{i}/ln_1/g" for i in range(13)]
    write_checkpoint(tmp_path / "m", {n: np.full(3, i, np.float32) for i, n in enumerate(names)})
    entries = read_index(tmp_path / "m.index")[1]
    assert list(entries)[:4] == ["model/h0/ln_1/g", "model/h1/ln_1/g", "model/h10/ln_1/g",
                                 "model/h11/ln_1/g"]
    back = read_checkpoint(tmp_path / "m")
    assert [int(back[n][0]) for n in names] == list(range(13))  # values follow names, not order


def test_writer_rejects_non_float32(tmp_path):
    with pytest.raises(ValueError, match="'w' is float64"):
        write_checkpoint(tmp_path / "m", {"w": np.zeros(3)})


names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)  # any UTF-8 name
arrays = hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))


@settings(max_examples=30, deadline=None)
@given(tensors=st.dictionaries(names, arrays, max_size=20))
def test_write_read_roundtrip(tmp_path_factory, tensors):
    prefix = tmp_path_factory.mktemp("roundtrip") / "model.ckpt"
    write_checkpoint(prefix, tensors)
    back = read_checkpoint(prefix)
    assert sorted(back) == sorted(tensors)
    for name, x in tensors.items():  # compare bits: NaN payloads and -0.0 must survive too
        assert back[name].shape == x.shape and back[name].tobytes() == x.tobytes(), name
