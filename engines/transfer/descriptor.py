"""KvDescriptor: where a request's KV lies and how to read it — what a prefill engine hands a decode engine as
`kv_params` (NIXL: the source agent, its metadata, the block ids) or what a decode worker hands its own engine
(staging: a region of a shared-memory file the gRPC fallback filled). msgpack; pure, no I/O."""

import dataclasses
from dataclasses import dataclass

import msgpack

from engines.base.errors import InvalidRequestError
from engines.base.types import KvLayout
from engines.transfer import transports

VERSION = 1
NIXL = transports.NIXL
STAGING = "staging"  # NOTE: a descriptor kind, not a transport: the region a staging connector filled (grpc)


class DescriptorError(InvalidRequestError):
    """kv_params that name no KV this engine can read: malformed, another layout, an unknown agent."""


@dataclass(frozen=True, slots=True)
class KvDescriptor:
    kind: str  # NIXL or STAGING
    layout: KvLayout
    token_ids: tuple[int, ...]  # the tokens whose KV this is
    block_ids: tuple[int, ...] = ()  # NIXL: the source's blocks, in token order
    agent: str = ""  # NIXL: the source agent's name
    metadata: bytes = b""  # NIXL: the source agent's metadata (loaded once per agent)
    base: int = 0  # NIXL: address of the source cache's first byte; STAGING: byte offset in the file
    num_pool_blocks: int = 0  # NIXL: blocks in the source cache (the stride of its planes)
    mem: str = "DRAM"  # NIXL: "DRAM" or "VRAM"
    device_id: int = 0  # NIXL: the source device
    path: str = ""  # STAGING: the shared-memory file
    expires_unix_s: float = 0.0  # NIXL: when the source's lease on the blocks ends (0: not known); a READ
    # that has not ended by then may have read blocks the source gave to other requests

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.layout.block_size)


def encode(d: KvDescriptor) -> bytes:
    layout = (d.layout.num_layers, d.layout.num_kv_heads, d.layout.head_dim, d.layout.dtype, d.layout.block_size)
    return msgpack.packb(
        (
            VERSION,
            d.kind,
            layout,
            d.token_ids,
            d.block_ids,
            d.agent,
            d.metadata,
            d.base,
            d.num_pool_blocks,
            d.mem,
            d.device_id,
            d.path,
            d.expires_unix_s,
        )
    )


def decode(data: bytes) -> KvDescriptor:
    """The descriptor in `data`; DescriptorError for anything else."""
    try:
        version, kind, layout, *rest = msgpack.unpackb(data, use_list=False)
        if version != VERSION or kind not in (NIXL, STAGING):
            raise ValueError(f"version {version!r}, kind {kind!r}")
        d = KvDescriptor(kind, KvLayout(*layout), *rest)
        _check(d)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DescriptorError(f"kv_params are not a KV descriptor this engine reads ({exc})") from None
    return d


def with_expiry(data: bytes, expires_unix_s: float) -> bytes:
    """`data` with the source lease's end written in (what a decode worker learns from the KvHandle); anything
    that is not a descriptor is returned as is, for the engine to refuse with its reason."""
    try:
        d = decode(data)
    except DescriptorError:
        return data
    return encode(dataclasses.replace(d, expires_unix_s=float(expires_unix_s)))


def _check(d: KvDescriptor) -> None:
    if not d.token_ids:
        raise ValueError("no tokens")
    if d.kind == NIXL and (
        len(d.block_ids) != d.num_blocks
        or not d.agent
        or d.num_pool_blocks < 1
        or any(not 0 <= b < d.num_pool_blocks for b in d.block_ids)
    ):
        raise ValueError("NIXL descriptor without an agent or with block ids outside its cache")
    if d.kind == STAGING and (not d.path or d.base < 0):
        raise ValueError("staging descriptor without a file")


def check_layout(d: KvDescriptor, layout: KvLayout) -> None:
    if d.layout != layout:
        raise DescriptorError(f"KV layout {d.layout} does not match this engine's {layout}")
