"""gpt2np/checkpoints/safetensors.py: the reader and writer against the `safetensors` package, and a table of
broken files, each of which must give one line naming the file (never a traceback or garbage)."""
import json
import struct

import numpy as np
import pytest

from gpt2np.checkpoints.safetensors import SafetensorsError, read_header, read_safetensors, write_safetensors
from conftest import FIXTURES

F32_FIXTURE = FIXTURES / "hf-tiny-f32" / "model.safetensors"


def sample_tensors(rng):
    """Every dtype NumPy has a safetensors name for, odd shapes, a scalar and an empty tensor."""
    return {
        "f32": rng.standard_normal((3, 5), dtype=np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "f64": rng.standard_normal((2, 1, 3)),
        "i64": rng.integers(-9, 9, (4,)), "i8": rng.integers(-9, 9, (3,), dtype=np.int8),
        "u8": rng.integers(0, 255, (5,), dtype=np.uint8), "bool": rng.random(3) > 0.5,
        "scalar": np.array(2.5, dtype=np.float32), "empty": np.zeros((0, 4), np.float32),
    }


def test_reader_agrees_with_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package (requirements-dev.txt)")
    tensors = sample_tensors(np.random.default_rng(0))
    st.save_file(tensors, tmp_path / "theirs.safetensors")
    ours = read_safetensors(tmp_path / "theirs.safetensors")
    assert ours.keys() == tensors.keys()
    for name, x in tensors.items():
        assert ours[name].dtype == x.dtype and ours[name].shape == x.shape, name
        np.testing.assert_array_equal(ours[name], x, err_msg=name)


def test_writer_is_read_back_by_the_safetensors_package_and_by_ours(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package (requirements-dev.txt)")
    tensors = sample_tensors(np.random.default_rng(1))
    write_safetensors(tmp_path / "ours.safetensors", tensors)
    for reader in (st.load_file, read_safetensors):
        back = reader(tmp_path / "ours.safetensors")
        for name, x in tensors.items():
            assert back[name].dtype == x.dtype, name
            np.testing.assert_array_equal(back[name], x, err_msg=name)
    assert not list(tmp_path.glob("*.tmp-*"))


def test_the_transformers_fixture_reads_identically_with_both_readers():
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package (requirements-dev.txt)")
    theirs, ours = st.load_file(F32_FIXTURE), read_safetensors(F32_FIXTURE)
    assert theirs.keys() == ours.keys() and len(ours) == 2 * 12 + 4  # 12 per block, wte, wpe, ln_f g/b
    for name in theirs:
        assert ours[name].tobytes() == theirs[name].tobytes(), name


def hand_written(path, header, data, n=None):
    """A file with exactly this header (dict or raw bytes) and data, whatever they say."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if n is None else n) + raw + data)
    return path


def test_bfloat16_is_the_top_half_of_float32_exactly(tmp_path):
    x = np.array([1.0, -2.5, 3.140625, 1e30, -1e-30, 0.0], np.float32)  # all exact in bfloat16
    x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)              # ...now certainly
    top = (x.view(np.uint32) >> 16).astype("<u2")
    path = hand_written(tmp_path / "bf16.safetensors",
                        {"x": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}, top.tobytes())
    got = read_safetensors(path)["x"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, x.reshape(2, 3))


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


BAD_FILES = {  # name -> (header, data, forced header length or None, words the one-line error must hold)
    "shorter than the length field": (None, b"", None, "truncated, 5 bytes"),
    "header length past the end": ({"a": entry()}, bytes(8), 10**6, "runs past the end of the file"),
    "header not JSON": (b"{not json at all", b"", None, "not JSON"),
    "header not UTF-8": (b"\xff\xfe{}", b"", None, "not JSON"),
    "header a JSON list": (b"[1, 2]", b"", None, "not an object"),
    "unknown dtype string": ({"a": entry(dtype="F33")}, bytes(8), None, "unknown dtype 'F33'"),
    "dtype in lower case": ({"a": entry(dtype="f32")}, bytes(8), None, "unknown dtype 'f32'"),
    "offsets past the end": ({"a": entry(offsets=(0, 8)), "b": entry(offsets=(8, 16))}, bytes(12), None,
                             "past its end"),
    "overlapping offsets": ({"a": entry(offsets=(0, 8)), "b": entry(offsets=(4, 12))}, bytes(12), None,
                            "overlaps 'a'"),
    "a hole between tensors": ({"a": entry(offsets=(0, 8)), "b": entry(offsets=(12, 20))}, bytes(20), None,
                               "belong to no tensor"),
    "bytes after the last tensor": ({"a": entry()}, bytes(12), None, "belong to no tensor"),
    "byte count not shape x dtype": ({"a": entry(shape=(3,))}, bytes(8), None, "needs 12"),
    "negative size in shape": ({"a": entry(shape=(-2,))}, bytes(8), None, "not a list of sizes"),
    "offsets backwards": ({"a": entry(offsets=(8, 0))}, bytes(8), None, "not [begin, end]"),
    "missing data_offsets": ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), None, "exactly dtype"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_broken_file_is_one_line_naming_the_file(tmp_path, case):
    header, data, n, words = BAD_FILES[case]
    path = tmp_path / "model.safetensors"
    if header is None:
        path.write_bytes(b"\x01\x00\x00\x00\x00")
    else:
        hand_written(path, header, data, n)
    with pytest.raises(SafetensorsError) as e:
        read_safetensors(path)
    message = str(e.value)
    assert isinstance(e.value, ValueError) and "\n" not in message
    assert message.startswith(str(path)) and words in message, message


def test_a_truncated_download_is_caught_before_any_tensor_is_read(tmp_path):
    data = F32_FIXTURE.read_bytes()
    (tmp_path / "half.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(SafetensorsError, match="past its end.*truncated download"):
        read_safetensors(tmp_path / "half.safetensors")


def test_metadata_is_ignored_and_the_header_may_be_padded_with_spaces(tmp_path):
    raw = json.dumps({"__metadata__": {"format": "pt"}, "a": entry()}).encode() + b"   "
    path = hand_written(tmp_path / "m.safetensors", raw, np.array([1, 2], np.float32).tobytes())
    entries, start, size = read_header(path)
    assert list(entries) == ["a"] and start == 8 + len(raw) and size == 8
    np.testing.assert_array_equal(read_safetensors(path)["a"], [1, 2])
