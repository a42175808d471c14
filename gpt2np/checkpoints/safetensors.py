"""Read and write safetensors files with json and NumPy alone (Hugging Face's weight format).

The format (huggingface/safetensors, README "Format"), all little-endian:
    8 bytes      N, the header length, an unsigned 64-bit integer
    N bytes      a UTF-8 JSON object: {name: {"dtype": "F32", "shape": [768, 2304],
                 "data_offsets": [begin, end]}, ...}, plus an optional "__metadata__" of strings
    the rest     the raw tensors, C order; offsets count from the first byte after the header
The tensors tile the data exactly: no overlaps, no gaps, nothing past the end (the reference
reader refuses holes too, so that no bytes hide in a file). Every one of those rules is checked
here before a byte is interpreted, and a broken file gives one ValueError naming the file.

Why by hand, not the `safetensors` package: ~100 lines with no dependency, tensors are
memory-mapped views of the file (nothing is copied before weights.py arranges them), bfloat16
is read (NumPy has no bfloat16 dtype, so `safetensors.numpy` cannot load it) and every error
names the file and the rule broken. tests/checkpoints/test_hf_safetensors.py checks both readers agree.

>>> import tempfile, os
>>> with tempfile.TemporaryDirectory() as d:
...     path = os.path.join(d, "x.safetensors")
...     write_safetensors(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
...     read_safetensors(path)["w"]
array([[0., 1., 2.],
       [3., 4., 5.]], dtype=float32)
"""
import json
import os
import struct

import numpy as np

# safetensors dtype string -> NumPy dtype (little-endian); BF16 is read as its raw uint16 bits
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
NAME_OF_DTYPE = {np.dtype(v): k for k, v in DTYPES.items() if k not in ("BF16",)}
MAX_HEADER = 100 << 20  # bytes: the reference reader's limit; real headers are well under 1 MB


class SafetensorsError(ValueError):
    """A safetensors file breaks the format; the message names the file and the rule."""


def read_header(path):  # -> ({name: (dtype string, shape tuple, begin, end)}, first data byte, data size)
    """Parse and check the header of `path`: sizes, JSON, dtypes, shapes and the offset tiling."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            raise SafetensorsError(f"{path}: truncated, {size} bytes (a safetensors file starts "
                                   f"with an 8-byte header length)")
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8 or n > MAX_HEADER:
            raise SafetensorsError(f"{path}: header length {n:,} runs past the end of the file "
                                   f"({size:,} bytes); truncated download, or not a safetensors file")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is JSON but not an object")
    entries = {name: _entry(path, name, info) for name, info in header.items() if name != "__metadata__"}
    _check_tiling(path, entries, size - 8 - n)
    return entries, 8 + n, size - 8 - n


def _entry(path, name, info):  # -> (dtype string, shape, begin, end), checked on its own
    """One header entry, with its byte count checked against dtype and shape."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(f"{path}: tensor {name!r} needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPES:
        raise SafetensorsError(f"{path}: tensor {name!r} has unknown dtype {dtype!r} "
                               f"(known: {', '.join(DTYPES)})")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise SafetensorsError(f"{path}: tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(f"{path}: tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    need = int(np.prod(shape, dtype=object)) * np.dtype(DTYPES[dtype]).itemsize  # object: no overflow
    if offsets[1] - offsets[0] != need:
        raise SafetensorsError(f"{path}: tensor {name!r} spans {offsets[1] - offsets[0]:,} bytes but "
                               f"{dtype} {shape} needs {need:,}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _check_tiling(path, entries, data_size):
    """The tensors, sorted by offset, must cover bytes 0..data_size exactly once."""
    at, previous = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if end > data_size:
            raise SafetensorsError(f"{path}: tensor {name!r} ends at byte {end:,} of the data, past its "
                                   f"end ({data_size:,} bytes); truncated download?")
        if begin < at:
            raise SafetensorsError(f"{path}: tensor {name!r} (bytes {begin:,}-{end:,}) overlaps "
                                   f"{previous!r} (which ends at {at:,})")
        if begin > at:
            raise SafetensorsError(f"{path}: bytes {at:,}-{begin:,} of the data belong to no tensor")
        at, previous = end, name
    if at != data_size:
        raise SafetensorsError(f"{path}: the last {data_size - at:,} bytes of the data belong to no tensor")


def read_safetensors(path):  # -> {name: array}: read-only views of a memory map; BF16 -> float32
    """Every tensor in the file, in its stored dtype (BF16, which NumPy lacks, becomes float32)."""
    entries, start, data_size = read_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r") if data_size else np.zeros(0, np.uint8)
    tensors = {}
    for name, (dtype, shape, begin, end) in entries.items():
        flat = np.frombuffer(mapped, DTYPES[dtype], (end - begin) // np.dtype(DTYPES[dtype]).itemsize,
                             start + begin) if end > begin else np.zeros(0, DTYPES[dtype])
        tensors[name] = bfloat16_to_float32(flat).reshape(shape) if dtype == "BF16" else flat.reshape(shape)
    return tensors


def bfloat16_to_float32(bits):  # uint16 [...] -> float32 [...], exact
    """bfloat16 is the top half of a float32: shift its 16 bits up, fill the low half with zeros."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """Write {name: array} as safetensors (sorted by name), through a temporary name and a rename."""
    header, offset = {}, 0
    arrays = {name: np.ascontiguousarray(tensors[name]) for name in sorted(tensors)}
    for name, x in arrays.items():
        if x.dtype.newbyteorder("<") not in NAME_OF_DTYPE:
            raise ValueError(f"cannot write {name!r}: dtype {x.dtype} has no safetensors name")
        header[name] = {"dtype": NAME_OF_DTYPE[x.dtype.newbyteorder("<")], "shape": list(x.shape),
                        "data_offsets": [offset, offset + x.nbytes]}
        offset += x.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # pad with spaces so the data starts 8-byte aligned, as the reference does
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for x in arrays.values():
                f.write(x.astype(x.dtype.newbyteorder("<"), copy=False).tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
