"""Read a TensorFlow checkpoint (a "tensor bundle", as in OpenAI's GPT-2 release) with Python + NumPy.

A bundle `<prefix>` is two files (TensorFlow's tensor_bundle format; LevelDB's and protobuf's public specs below):
    <prefix>.index                 a LevelDB SSTable mapping tensor name -> BundleEntryProto
    <prefix>.data-00000-of-00001   the raw little-endian tensor bytes, back to back

Reading it takes four small decoders, built bottom-up below:
    1. CRC32C, masked as LevelDB/TF store it (every block and every tensor carries one)
    2. varints (LevelDB and protobuf both encode integers 7 bits per byte)
    3. the SSTable: footer -> index block -> data blocks -> (key, value) entries
       (LevelDB's doc/table_format.md; TF's copy lives in tensorflow/core/lib/io/)
    4. protobuf messages BundleHeaderProto / BundleEntryProto
       (tensorflow/core/protobuf/tensor_bundle.proto)

>>> decode_varint(bytes([0x96, 0x01]), 0)   # 0x16 + (0x01 << 7) = 150, next byte at 2
(150, 2)
>>> hex(crc32c_reference(b"123456789"))     # the standard CRC32C check value
'0xe3069283'
"""
import math
import os
from typing import NamedTuple

import numpy as np
# The C extension (SSE4.2 `crc32` instruction) checks GBs per second; the pure-Python
# crc32c_reference below does ~10 MB/s, i.e. ten minutes for the 6 GB 1558M data file.
from crc32c import crc32c as _crc32c_fast


class CheckpointError(ValueError):
    """The checkpoint files exist but are damaged, truncated or in a format we do not read."""


class _Corrupt(Exception):
    """Raised by the low-level decoders; read_index adds the file name and the advice."""


# ---- 1. CRC32C (Castagnoli polynomial) -----------------------------------------------------

def _crc32c_table():
    """Table of the CRC of each byte value: the classic byte-at-a-time trick."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):  # reflected polynomial 0x82F63B78: shift right, xor when a 1 falls out
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c_reference(data, crc=0):
    """Slow, readable CRC32C of `data` (bytes-like); `crc` continues an earlier result."""
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data):
    """Fast CRC32C of any contiguous buffer (bytes, memoryview, NumPy array); equals the reference."""
    return _crc32c_fast(data)


def mask_crc(crc):
    """Rotate right by 15 and add a constant, as LevelDB and TF store CRCs (a CRC computed
    over data that embeds CRCs is otherwise weak).
    >>> hex(mask_crc(0))
    '0xa282ead8'
    """
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---- 2. varints --------------------------------------------------------------------------------

def decode_varint(buf, pos):
    """Decode the base-128 varint at buf[pos]: 7 bits per byte, least significant group first,
    high bit set on every byte but the last. Returns (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _Corrupt("a varint runs past the end of its data")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


# ---- 3. the SSTable ------------------------------------------------------------------------------

TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")  # last 8 bytes of every SSTable
FOOTER_SIZE = 48       # two BlockHandles (varints) zero-padded to 40 bytes, then the magic
BLOCK_TRAILER_SIZE = 5  # 1 byte compression type + 4 bytes masked CRC32C


def read_block(buf, offset, size):  # -> the block's bytes, trailer checked and removed
    """Return buf[offset:offset+size] after checking its trailer (type byte 0, masked CRC32C)."""
    end = offset + size
    if end + BLOCK_TRAILER_SIZE > len(buf):
        raise _Corrupt(f"block [{offset}, {end}) runs past the end of the file ({len(buf)} bytes)")
    stored = int.from_bytes(buf[end + 1:end + 5], "little")
    if mask_crc(crc32c(buf[offset:end + 1])) != stored:  # the CRC covers the type byte too
        raise _Corrupt(f"block [{offset}, {end}) fails its CRC32C check")
    if buf[end] != 0:  # TF's BundleWriter never compresses (1 would be snappy)
        raise _Corrupt(f"block [{offset}, {end}) has compression type {buf[end]}, expected 0")
    return buf[offset:end]


def block_entries(block):
    """Yield the (key, value) pairs of a block, undoing the prefix compression of the keys.

    Layout: entries, then uint32 restart offsets, then uint32 count. Each entry is
    varint shared, varint non_shared, varint value_len, key[shared:], value; `shared` bytes
    come from the previous key. Restart points (shared == 0) only serve binary search:
    a front-to-back scan can ignore them.
    """
    end = len(block) - 4 - 4 * int.from_bytes(block[-4:], "little")  # start of the restart array
    if len(block) < 4 or end < 0:
        raise _Corrupt("a block is too short for its restart array")
    key, pos = b"", 0
    while pos < end:
        shared, pos = decode_varint(block, pos)
        non_shared, pos = decode_varint(block, pos)
        value_len, pos = decode_varint(block, pos)
        if shared > len(key) or pos + non_shared + value_len > end:
            raise _Corrupt(f"block entry at byte {pos} is inconsistent")
        key = key[:shared] + block[pos:pos + non_shared]
        pos += non_shared
        yield key, block[pos:pos + value_len]
        pos += value_len


def index_block_handles(buf):  # -> [(separator key, offset, size)] one per data block
    """Read the footer and the index block: where each data block lives. Each index key is
    >= every key in its block and < every key in the next (e.g. "n" after "model/wte")."""
    if len(buf) < FOOTER_SIZE or buf[-8:] != TABLE_MAGIC:
        raise _Corrupt("its last 8 bytes are not the SSTable magic number (truncated?)")
    footer = buf[-FOOTER_SIZE:]
    _, pos = decode_varint(footer, 0)           # metaindex offset: TF writes an empty metaindex
    _, pos = decode_varint(footer, pos)         # metaindex size
    index_offset, pos = decode_varint(footer, pos)
    index_size, _ = decode_varint(footer, pos)
    handles = []
    for key, handle in block_entries(read_block(buf, index_offset, index_size)):
        offset, pos = decode_varint(handle, 0)  # a BlockHandle is two varints
        size, _ = decode_varint(handle, pos)
        handles.append((key, offset, size))
    return handles


def sstable_items(buf):
    """Yield every (key, value) of an SSTable in key order, walking all its data blocks."""
    for _, offset, size in index_block_handles(buf):
        yield from block_entries(read_block(buf, offset, size))


# ---- 4. protobuf -------------------------------------------------------------------------------------

def parse_proto(buf):  # -> {field number: [values]}
    """Split a protobuf message into its fields, without a schema.

    Each field is a varint tag (field_number << 3 | wire_type) then a value:
    wire type 0 varint, 1 fixed 8 bytes, 2 varint length + bytes, 5 fixed 4 bytes.
    >>> parse_proto(bytes([0x08, 0x01, 0x1A, 0x02, 0x08, 0x01]))  # the GPT-2 BundleHeaderProto
    {1: [1], 3: [b'\\x08\\x01']}
    """
    fields, pos = {}, 0
    while pos < len(buf):
        tag, pos = decode_varint(buf, pos)
        wire_type = tag & 7
        if wire_type == 0:
            value, pos = decode_varint(buf, pos)
        elif wire_type in (1, 5):  # little-endian fixed64 / fixed32
            width = 8 if wire_type == 1 else 4
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        elif wire_type == 2:
            length, pos = decode_varint(buf, pos)
            value, pos = bytes(buf[pos:pos + length]), pos + length
        else:
            raise _Corrupt(f"protobuf wire type {wire_type} is not used by tensor bundles")
        if pos > len(buf):
            raise _Corrupt("a protobuf field runs past the end of its message")
        fields.setdefault(tag >> 3, []).append(value)
    return fields


def _scalar(fields, number):
    """A scalar field's value; proto3 omits zeros, and a repeated scalar field keeps the last."""
    return fields.get(number, [0])[-1]


class TensorEntry(NamedTuple):
    """BundleEntryProto: where a tensor's bytes are and how to check them."""
    dtype: int         # field 1: DataType enum (1 = DT_FLOAT)
    shape: tuple       # field 2: TensorShapeProto, one `dim` (field 2) per axis, size in its field 1
    shard_id: int      # field 3: which .data-NNNNN file
    offset: int        # field 4: byte offset in that file
    size: int          # field 5: number of bytes
    crc32c: int        # field 6: masked CRC32C of the bytes
    sliced: bool       # field 7 present: a partitioned variable, stored in slices


def parse_entry(value):
    """Decode a BundleEntryProto."""
    fields = parse_proto(value)
    shape = parse_proto(fields.get(2, [b""])[-1])
    dims = tuple(_scalar(parse_proto(dim), 1) for dim in shape.get(2, []))
    return TensorEntry(_scalar(fields, 1), dims, _scalar(fields, 3), _scalar(fields, 4),
                       _scalar(fields, 5), _scalar(fields, 6), 7 in fields)


# ---- reading a bundle ------------------------------------------------------------------------------------

DT_FLOAT = 1
_DTYPE_NAMES = {1: "DT_FLOAT", 2: "DT_DOUBLE", 3: "DT_INT32", 7: "DT_STRING", 9: "DT_INT64",
                10: "DT_BOOL", 14: "DT_BFLOAT16", 19: "DT_HALF"}
REDOWNLOAD = "delete it and download it again"


def _missing(path):
    return FileNotFoundError(
        f"{path} not found. A GPT-2 checkpoint prefix is '<model dir>/model.ckpt'; download the "
        f"model with gpt2np.checkpoints.download.download_model(size, models_dir)")


def read_index(path):  # -> (header fields, {tensor name: TensorEntry} in key order)
    """Parse a `.index` file: the header (key "") and one TensorEntry per tensor."""
    if not os.path.isfile(path):
        raise _missing(path)
    with open(path, "rb") as f:
        buf = f.read()  # small: ~20 KB even for 1558M
    try:
        items = list(sstable_items(buf))
        if not items or items[0][0] != b"":
            raise _Corrupt("it has no bundle header (the entry with the empty key)")
        header = parse_proto(items[0][1])
        entries = {key.decode("utf-8"): parse_entry(value) for key, value in items[1:]}
    except (_Corrupt, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is damaged: {e}; {REDOWNLOAD}") from None
    if _scalar(header, 2) != 0:  # field 2 endianness: 0 = LITTLE, the only one we read
        raise CheckpointError(f"{path}: the tensors are big-endian; gpt2np reads little-endian only")
    return header, entries


def check_meta_graph(path):
    """Raise CheckpointError unless `path` parses as a MetaGraphDef holding a graph and a saver.

    gpt2np never reads the graph (the .meta ships for fidelity to the release); this only tells a
    whole download from a cut one: a cut almost always lands inside a field, which fails to parse.
    """
    with open(path, "rb") as f:
        buf = f.read()  # ~0.5 MB for GPT-2; only the top-level fields are split, not decoded
    try:
        fields = parse_proto(buf)
    except _Corrupt as e:
        raise CheckpointError(f"{path} is damaged: {e}") from None
    if 2 not in fields or 3 not in fields:  # MetaGraphDef fields 2 graph_def, 3 saver_def
        raise CheckpointError(f"{path} is not a MetaGraphDef: no graph_def or saver_def field")


def _open_data(path):  # -> uint8 array over the whole file, paged in lazily by the OS
    if not os.path.isfile(path):
        raise _missing(path)
    if os.path.getsize(path) == 0:  # mmap refuses empty files
        return np.zeros(0, np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def _check_entry(index_path, name, entry):
    """Refuse entries we cannot read; they carry no bytes we could check."""
    where = f"{index_path}: tensor {name!r}"
    if entry.dtype != DT_FLOAT:
        dtype = _DTYPE_NAMES.get(entry.dtype, f"dtype {entry.dtype}")
        raise CheckpointError(f"{where} is {dtype}; gpt2np reads only DT_FLOAT (float32) tensors")
    if entry.sliced:
        raise CheckpointError(f"{where} is stored in slices (partitioned); gpt2np does not read those")
    if entry.size != 4 * math.prod(entry.shape):
        raise CheckpointError(f"{where} has shape {entry.shape} but {entry.size} bytes; {REDOWNLOAD}")


def _tensor(data_path, data, name, entry):  # -> float32 array of entry.shape (a view of `data`)
    """Cut one tensor out of its .data file after checking its extent and its CRC."""
    start, end = entry.offset, entry.offset + entry.size
    if end > len(data):
        raise CheckpointError(f"{data_path} is truncated: tensor {name!r} needs bytes [{start}, {end}) "
                              f"but the file has {len(data)} bytes; {REDOWNLOAD}")
    raw = data[start:end]
    computed = mask_crc(crc32c(raw))
    if computed != entry.crc32c:
        raise CheckpointError(f"{data_path} is corrupt: tensor {name!r} (bytes [{start}, {end})) fails "
                              f"its CRC32C check (stored {entry.crc32c:#010x}, computed "
                              f"{computed:#010x}); {REDOWNLOAD}")
    return raw.view("<f4").reshape(entry.shape)  # the bytes are little-endian, C order


def check_data_file(index_path, data_path):
    """Every tensor the index lists checked in data_path (a one-shard bundle's data file under any name, as a
    download's .part): its extent and its CRC32C; a CheckpointError names the first that fails."""
    _, entries = read_index(index_path)
    data = _open_data(data_path)
    for name, entry in entries.items():
        _check_entry(index_path, name, entry)
        _tensor(data_path, data, name, entry)


def read_checkpoint(prefix):  # -> {TF name: float32 array}
    """Read every tensor of the bundle `<prefix>.index` + `<prefix>.data-*`, checking every CRC.

    The arrays are read-only memory maps of the .data file: nothing is copied into RAM,
    the OS pages the bytes in as they are used (here, first by the CRC check).
    Raises FileNotFoundError for a missing file and CheckpointError for a damaged one.
    """
    index_path = f"{prefix}.index"
    header, entries = read_index(index_path)
    n_shards = _scalar(header, 1)
    shards = {}  # shard id -> (path, bytes), opened on first use
    tensors = {}
    for name, entry in entries.items():
        _check_entry(index_path, name, entry)
        if entry.shard_id not in shards:
            path = f"{prefix}.data-{entry.shard_id:05d}-of-{n_shards:05d}"
            shards[entry.shard_id] = (path, _open_data(path))
        tensors[name] = _tensor(*shards[entry.shard_id], name, entry)
    return tensors
