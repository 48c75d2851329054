"""A KV pull is held to its handle: a handle naming more blocks than the request's tokens fill is refused before any
pull, and a prefill peer streaming more bytes than the handle's blocks hold is cut off."""

import grpc
import pytest

from services.common.protos import common_pb2, worker_pb2, worker_pb2_grpc
from services.decode.kv_import import KvPuller, handle_nbytes

LAYOUT = common_pb2.KvLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype="float32", block_size=4)
BLOCK_BYTES = 2 * 2 * 4 * 1 * 4 * 4  # layers x (k, v) x block_size x heads x head_dim x 4 bytes


def _handle(address: str = "", num_tokens: int = 6, num_blocks: int = 2) -> common_pb2.KvHandle:
    return common_pb2.KvHandle(
        worker_id="p0", address=address, req_id="r", layout=LAYOUT, num_tokens=num_tokens, num_blocks=num_blocks
    )


def test_the_handle_bounds_the_bytes_of_a_pull():
    assert handle_nbytes(_handle(), num_tokens=7) == 2 * BLOCK_BYTES


@pytest.mark.parametrize(
    "num_tokens,num_blocks,request_tokens",
    [
        (6, 3, 7),  # more blocks than 6 tokens fill
        (6, 1, 7),  # fewer
        (7, 2, 7),  # not a strict prefix of the request
        (0, 0, 7),
        (2**31, 2**29, 7),  # a huge handle for a short request
    ],
    ids=["extra-block", "missing-block", "whole-request", "empty", "huge"],
)
def test_a_handle_that_does_not_fit_the_request_is_refused(num_tokens, num_blocks, request_tokens):
    with pytest.raises(ValueError):
        handle_nbytes(_handle(num_tokens=num_tokens, num_blocks=num_blocks), request_tokens)


class Flooding(worker_pb2_grpc.PrefillWorkerServicer):
    """A prefill peer that streams chunks without end."""

    def __init__(self):
        self.num_sent = 0

    async def PullKv(self, request, context):
        while self.num_sent < 1000:
            self.num_sent += 1
            yield worker_pb2.KvChunk(
                layout=LAYOUT, first_block=0, num_blocks=1, total_blocks=2, data=b"\0" * BLOCK_BYTES
            )


async def test_a_peer_sending_past_the_handle_is_cut_off():
    server, peer = grpc.aio.server(), Flooding()
    worker_pb2_grpc.add_PrefillWorkerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    puller = KvPuller(timeout_s=5)
    try:
        with pytest.raises(ValueError, match="bytes"):
            await puller.pull(_handle(f"127.0.0.1:{port}"), num_tokens=7)
        assert peer.num_sent < 1000  # stopped early, never buffered the whole flood
    finally:
        await puller.close()
        await server.stop(0)
