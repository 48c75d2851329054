"""One KV block as a file: a header saying what it is (model, dtype, block size, layout; its hash, parent hash and
tokens; FP8 scales; a keyed digest of the payload), an HMAC of the header, then the block's bytes (every layer,
contiguous). The key is the deployment's, bound to the one directory the file lives in. Bytes in, bytes out:
no files, no torch."""

import hashlib
import hmac
import struct
from dataclasses import dataclass

import msgpack
import xxhash

MAGIC = b"TNDMKVB\x02"
VERSION = 2
_PREFIX = struct.Struct("<8sI")  # magic, header length
MAC_BYTES = 32  # HMAC-SHA256 of prefix and header
UNKEYED = b"tandem-kv-disk-unkeyed"  # no deployment key (plaintext dev mode): integrity only, no authenticity


class CorruptBlockError(ValueError):
    """A block file that fails its checksum or cannot be parsed: dropped, and its tokens recomputed."""


class ForgedBlockError(CorruptBlockError):
    """A block file whose header does not authenticate: planted, or written by another worker or deployment."""


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


class BlockSeal:
    """What authenticates one directory's block files: HMAC-SHA256 over each header with a key derived from the
    deployment's and the directory (`scope`), so a file is good only where it was written; the header carries
    an XXH3-128 of the payload under a secret seed from that key (a MAC over every payload byte would cost more
    than the disk's bandwidth; docs/security-kv.md says what this covers)."""

    def __init__(self, key: bytes | None, scope: bytes):
        self.is_keyed = bool(key)
        self._key = hmac.new(key or UNKEYED, b"tandem-kv-disk/2\0" + scope, hashlib.sha256).digest()
        self._seed = int.from_bytes(hmac.new(self._key, b"payload", hashlib.sha256).digest()[:8], "little")

    def mac(self, head: bytes) -> bytes:
        return hmac.new(self._key, head, hashlib.sha256).digest()

    def payload_digest(self, payload: bytes | memoryview) -> bytes:
        return xxhash.xxh3_128(payload, seed=self._seed).digest()


def encode(header: BlockHeader, payload: bytes | memoryview, seal: BlockSeal) -> list[bytes | memoryview]:
    """The file's parts in order (written with one writev): prefix, header and its MAC, payload."""
    if len(payload) != header.payload_len:
        raise ValueError(f"payload of {len(payload)} bytes, header says {header.payload_len}")
    i = header.identity
    raw = msgpack.packb(
        [
            VERSION,
            i.model,
            i.dtype,
            i.block_size,
            list(i.layout),
            header.block_hash,
            header.parent_hash,
            list(header.token_ids),
            list(header.scales),
            header.payload_len,
            seal.payload_digest(payload),
        ]
    )
    head = _PREFIX.pack(MAGIC, len(raw)) + raw
    return [head + seal.mac(head), payload]


def header_length(prefix: bytes) -> int:
    """The header's length from the file's first `PREFIX_BYTES` bytes."""
    if len(prefix) < _PREFIX.size:
        raise CorruptBlockError("truncated block file")
    magic, length = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise ForgedBlockError("not a tandem KV block file of this version")
    return length


PREFIX_BYTES = _PREFIX.size


def parse_header(prefix: bytes, raw: bytes, mac: bytes, seal: BlockSeal) -> tuple[BlockHeader, bytes]:
    """The header and its payload digest, once the MAC over prefix and header checks out (ForgedBlockError)."""
    if len(mac) != MAC_BYTES or not hmac.compare_digest(seal.mac(prefix + raw), mac):
        raise ForgedBlockError("block header fails its authentication (planted, or another worker's)")
    try:
        version, model, dtype, block_size, layout, block_hash, parent, tokens, scales, payload_len, digest = (
            msgpack.unpackb(raw)
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptBlockError(f"unreadable block header: {exc}") from None
    if version != VERSION:
        raise ForeignBlockError(f"block file version {version}, this engine reads {VERSION}")
    identity = BlockIdentity(model, dtype, block_size, tuple(layout))
    return BlockHeader(identity, block_hash, parent, tuple(tokens), tuple(scales), payload_len), digest


def decode(data: bytes, identity: BlockIdentity, seal: BlockSeal) -> tuple[BlockHeader, memoryview]:
    """The header and payload of a whole file, checked: ForgedBlockError for a header that does not authenticate,
    CorruptBlockError for a payload that fails its digest or a bad shape, ForeignBlockError for another identity."""
    length = header_length(data)
    start = _PREFIX.size + length + MAC_BYTES
    header, digest = parse_header(
        data[: _PREFIX.size], data[_PREFIX.size : start - MAC_BYTES], data[start - MAC_BYTES : start], seal
    )
    if len(data) != start + header.payload_len:
        raise CorruptBlockError(f"block file of {len(data)} bytes, its header says {start + header.payload_len}")
    payload = memoryview(data)[start:]
    if not hmac.compare_digest(seal.payload_digest(payload), digest):
        raise ForgedBlockError(f"block {header.block_hash:016x}: its payload is not the one its header names")
    if header.identity != identity:
        raise ForeignBlockError(f"block {header.block_hash:016x} is of {header.identity}, not {identity}")
    return header, payload
