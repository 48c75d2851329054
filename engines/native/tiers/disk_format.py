"""One KV block as a file: a header saying what it is (model, dtype, block size, layout; its hash, parent hash and
tokens; FP8 scales), the block's bytes (every layer, contiguous), and a checksum over both. Bytes in, bytes out:
no files, no torch."""
import struct
from dataclasses import dataclass

import msgpack
import xxhash

MAGIC = b"TNDMKVB\x01"
VERSION = 1
_PREFIX = struct.Struct("<8sI")  # magic, header length
_CHECKSUM = struct.Struct("<Q")  # XXH3-64 of header and payload
_CHECKSUM_SEED = 0x6B76_6469_736B


class CorruptBlockError(ValueError):
    """A block file that fails its checksum or cannot be parsed: dropped, and its tokens recomputed."""


class ForeignBlockError(ValueError):
    """A block file from another model, dtype, block size or layout: never read into this cache."""


@dataclass(frozen=True, slots=True)
class BlockIdentity:
    """What every block of one KV cache shares; a file must match it exactly to be read."""

    model: str  # a fingerprint of the checkpoint
    dtype: str
    block_size: int
    layout: tuple[int, int, int]  # layers, KV heads, head dim


@dataclass(frozen=True, slots=True)
class BlockHeader:
    identity: BlockIdentity
    block_hash: int
    parent_hash: int
    token_ids: tuple[int, ...]
    scales: tuple[float, ...]  # per layer (k, v) for an FP8 cache; empty otherwise
    payload_len: int


def encode(header: BlockHeader, payload: bytes | memoryview) -> list[bytes | memoryview]:
    """The file's parts in order (written with one writev): prefix and header, payload, checksum."""
    if len(payload) != header.payload_len:
        raise ValueError(f"payload of {len(payload)} bytes, header says {header.payload_len}")
    i = header.identity
    raw = msgpack.packb([VERSION, i.model, i.dtype, i.block_size, list(i.layout), header.block_hash,
                         header.parent_hash, list(header.token_ids), list(header.scales), header.payload_len])
    head = _PREFIX.pack(MAGIC, len(raw)) + raw
    digest = xxhash.xxh3_64(head, seed=_CHECKSUM_SEED)
    digest.update(payload)
    return [head, payload, _CHECKSUM.pack(digest.intdigest())]


def header_length(prefix: bytes) -> int:
    """The header's length from the file's first `PREFIX_BYTES` bytes."""
    if len(prefix) < _PREFIX.size:
        raise CorruptBlockError("truncated block file")
    magic, length = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise CorruptBlockError("not a tandem KV block file")
    return length


PREFIX_BYTES = _PREFIX.size


def parse_header(raw: bytes) -> BlockHeader:
    try:
        version, model, dtype, block_size, layout, block_hash, parent, tokens, scales, payload_len = \
            msgpack.unpackb(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptBlockError(f"unreadable block header: {exc}") from None
    if version != VERSION:
        raise ForeignBlockError(f"block file version {version}, this engine reads {VERSION}")
    identity = BlockIdentity(model, dtype, block_size, tuple(layout))
    return BlockHeader(identity, block_hash, parent, tuple(tokens), tuple(scales), payload_len)


def decode(data: bytes, identity: BlockIdentity) -> tuple[BlockHeader, memoryview]:
    """The header and payload of a whole file, checked: CorruptBlockError for a bad checksum or shape,
    ForeignBlockError for a block of another identity."""
    length = header_length(data)
    start = _PREFIX.size + length
    header = parse_header(data[_PREFIX.size:start])
    end = start + header.payload_len
    if len(data) != end + _CHECKSUM.size:
        raise CorruptBlockError(f"block file of {len(data)} bytes, its header says {end + _CHECKSUM.size}")
    (stored,) = _CHECKSUM.unpack_from(data, end)
    if xxhash.xxh3_64_intdigest(memoryview(data)[:end], seed=_CHECKSUM_SEED) != stored:
        raise CorruptBlockError(f"block {header.block_hash:016x} fails its checksum")
    if header.identity != identity:
        raise ForeignBlockError(f"block {header.block_hash:016x} is of {header.identity}, not {identity}")
    return header, memoryview(data)[start:end]
