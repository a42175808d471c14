"""Write a TensorFlow tensor bundle byte-for-byte as TF1's `tf.train.Saver` writes it.

The inverse of gpt2np/checkpoints/tf_reader.py (read that first: it explains the format). Following
TF's BundleWriter (tensorflow/core/util/tensor_bundle/) and its LevelDB-derived TableBuilder
(tensorflow/core/lib/io/table_builder.cc):
  - tensors go to `<prefix>.data-00000-of-00001` in byte-wise sorted name order, unpadded;
  - `<prefix>.index` is an uncompressed SSTable: the header under key "" and then one
    BundleEntryProto per tensor, in data blocks cut once they reach 262,144 bytes (restart
    every 16 keys), an empty metaindex block, an index block (restart every key) keyed by the
    shortest separator between blocks, and the 48-byte footer.
The `.meta` graph file of the release is not written: no NumPy loader needs it.

>>> encode_varint(150).hex()
'9601'
>>> shortest_separator(b"the quick brown fox", b"the who"), short_successor(b"model/wte")
(b'the r', b'n')
"""
import os

import numpy as np

from .tf_reader import DT_FLOAT, FOOTER_SIZE, TABLE_MAGIC, crc32c, mask_crc

BLOCK_SIZE = 262_144    # TF's table::Options::block_size: a data block is cut once it gets this big
RESTART_INTERVAL = 16   # keys between full (uncompressed) keys in a data block


# ---- encoders: varints and protobuf ----------------------------------------------------------

def encode_varint(value):
    """Base-128 varint: 7 bits per byte, least significant first, high bit = "more follows"."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_field(number, value):
    """A protobuf varint field (wire type 0); proto3 leaves out fields equal to 0."""
    return encode_varint(number << 3) + encode_varint(value) if value else b""


def _bytes_field(number, payload):
    """A length-delimited protobuf field (wire type 2): sub-messages and strings."""
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def encode_header(num_shards=1):
    """BundleHeaderProto: num_shards (1), version (3) = VersionDef{producer (1) = 1};
    endianness (2) LITTLE is 0, so absent. GPT-2's: 08 01 1a 02 08 01."""
    return _varint_field(1, num_shards) + _bytes_field(3, _varint_field(1, 1))


def encode_entry(shape, offset, size, crc, dtype=DT_FLOAT):
    """BundleEntryProto, fields in number order as protobuf serializes them:
    dtype (1), shape (2, always present, one `dim` (2) {size (1)} per axis), shard_id (3, always
    0: absent), offset (4), size (5), crc32c (6, fixed32, masked)."""
    dims = b"".join(_bytes_field(2, _varint_field(1, n)) for n in shape)
    crc_field = encode_varint(6 << 3 | 5) + crc.to_bytes(4, "little") if crc else b""
    return (_varint_field(1, dtype) + _bytes_field(2, dims) + _varint_field(4, offset)
            + _varint_field(5, size) + crc_field)


# ---- the SSTable ---------------------------------------------------------------------------------

class BlockBuilder:
    """Accumulates sorted (key, value) entries into one LevelDB block (leveldb block_builder.cc).

    Each entry stores only the part of its key that differs from the previous key; every
    `restart_interval` entries a full key is stored and its offset recorded, so a reader
    can binary-search the restart points.
    """

    def __init__(self, restart_interval):
        self.restart_interval = restart_interval
        self.buffer, self.restarts = bytearray(), [0]
        self.last_key, self.counter, self.n_entries = b"", 0, 0

    def add(self, key, value):
        shared = 0
        if self.counter < self.restart_interval:  # count the bytes shared with the previous key
            limit = min(len(key), len(self.last_key))
            while shared < limit and key[shared] == self.last_key[shared]:
                shared += 1
        else:                                     # restart point: store the full key
            self.restarts.append(len(self.buffer))
            self.counter = 0
        for n in (shared, len(key) - shared, len(value)):
            self.buffer += encode_varint(n)
        self.buffer += key[shared:] + value
        self.last_key, self.counter, self.n_entries = key, self.counter + 1, self.n_entries + 1

    def size_estimate(self):
        """Bytes of the finished block: entries + uint32 restart offsets + their uint32 count."""
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def finish(self):
        ints = self.restarts + [len(self.restarts)]
        return bytes(self.buffer) + b"".join(i.to_bytes(4, "little") for i in ints)


def shortest_separator(start, limit):
    """A short key k with start <= k < limit: bump the first differing byte of `start` and cut
    after it, when that stays below `limit`; otherwise `start` itself."""
    n = 0
    while n < min(len(start), len(limit)) and start[n] == limit[n]:
        n += 1
    if n < min(len(start), len(limit)) and start[n] < 0xFF and start[n] + 1 < limit[n]:
        return start[:n] + bytes([start[n] + 1])
    return start


def short_successor(key):
    """A short key >= `key`: bump its first byte that is not 0xFF and cut after it."""
    for n, byte in enumerate(key):
        if byte != 0xFF:
            return key[:n] + bytes([byte + 1])
    return key


def _append_block(out, contents):  # -> BlockHandle (varint offset, varint size)
    """Append a block and its trailer: type 0 (uncompressed) + masked CRC32C of contents + type."""
    handle = encode_varint(len(out)) + encode_varint(len(contents))
    out += contents + b"\x00" + mask_crc(crc32c(contents + b"\x00")).to_bytes(4, "little")
    return handle


def encode_table(items):
    """Serialize sorted (key, value) byte pairs as an SSTable, as TF's TableBuilder does."""
    out, index, data = bytearray(), BlockBuilder(1), BlockBuilder(RESTART_INTERVAL)
    pending, last_key = None, b""  # handle of a finished data block still lacking its index key
    for key, value in items:
        if data.n_entries and len(key) + len(value) >= 2 * BLOCK_SIZE:  # huge entry: own block
            pending, data = _append_block(out, data.finish()), BlockBuilder(RESTART_INTERVAL)
        if pending:  # index key: between the previous block's last key and this block's first
            index.add(shortest_separator(last_key, key), pending)
            pending = None
        data.add(key, value)
        last_key = key
        if data.size_estimate() >= BLOCK_SIZE:
            pending, data = _append_block(out, data.finish()), BlockBuilder(RESTART_INTERVAL)
    if data.n_entries:
        pending = _append_block(out, data.finish())
    metaindex = _append_block(out, BlockBuilder(RESTART_INTERVAL).finish())  # empty, as TF's
    if pending:
        index.add(short_successor(last_key), pending)
    footer = metaindex + _append_block(out, index.finish())
    return bytes(out) + footer.ljust(FOOTER_SIZE - 8, b"\x00") + TABLE_MAGIC


# ---- the bundle ------------------------------------------------------------------------------------

def _write_atomically(path, chunks):
    """Write to a temporary name, then rename: a crash never leaves a half-written file at `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    os.replace(tmp, path)


def _as_float32(name, x):  # -> C-contiguous little-endian float32, same shape
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"tensor {name!r} is {x.dtype}; write_checkpoint writes float32 (DT_FLOAT) only")
    return np.require(x, dtype="<f4", requirements="C")  # unlike ascontiguousarray, keeps 0-d


def write_checkpoint(prefix, tensors):
    """Write `tensors` ({TF name: float32 array}) as `<prefix>.index` + `<prefix>.data-00000-of-00001`,
    plus the `checkpoint` text file beside them, exactly as TF1's Saver would."""
    names = sorted(tensors, key=lambda name: name.encode("utf-8"))  # byte order: "h10" < "h2"
    arrays = [_as_float32(name, tensors[name]) for name in names]
    items, offset = [(b"", encode_header())], 0
    for name, x in zip(names, arrays):
        entry = encode_entry(x.shape, offset, x.nbytes, mask_crc(crc32c(x)))
        items.append((name.encode("utf-8"), entry))
        offset += x.nbytes
    _write_atomically(f"{prefix}.data-00000-of-00001", arrays)
    _write_atomically(f"{prefix}.index", [encode_table(items)])
    # Relative paths, as in OpenAI's release (TF writes absolute ones unless told otherwise).
    base = os.path.basename(prefix)
    text = f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n'
    _write_atomically(os.path.join(os.path.dirname(prefix), "checkpoint"), [text.encode()])
