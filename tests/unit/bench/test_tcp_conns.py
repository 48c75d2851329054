"""Counting the TCP connections a bench phase opens to a stack's gRPC ports: /proc/net/tcp parsing, and a real
loopback connection seen opened (and still counted once closed)."""

import socket
import sys

import pytest

from tandem.bench.tcp_conns import opened_to, parse, snapshot

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def row(local: str, remote: str, state: str) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 20 4 30 10 -1\n"


def test_parse_keeps_connections_once_whichever_side_lists_them_and_skips_listeners():
    text = HEADER + (
        row("0100007F:1F90", "00000000:0000", "0A")  # LISTEN on 8080: not a connection
        + row("0100007F:C350", "0100007F:1F90", "01")  # client side, ESTABLISHED
        + row("0100007F:1F90", "0100007F:C350", "01")  # the server side of the same connection
        + row("0100007F:C351", "0100007F:1F90", "06")
    )  # another, in TIME_WAIT
    got = parse(text)
    assert len(got) == 2
    assert {port for connection in got for _, port in connection} == {0xC350, 0xC351, 8080}


def test_opened_to_counts_only_new_connections_by_the_named_port():
    old = (("A", 50000), ("A", 8080))
    new = [(("A", 50001), ("A", 8080)), (("A", 50002), ("A", 9090)), (("A", 50003), ("A", 7070))]
    before, after = frozenset({old}), frozenset({old, *new})
    assert opened_to(before, after, {"router": 8080, "decode-0": 9090, "prefill-0": 6060}) == {
        "router": 1,
        "decode-0": 1,
        "prefill-0": 0,
    }


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/net/tcp")
def test_a_real_loopback_connection_is_seen_opened_and_still_counted_after_it_closes():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        before = snapshot()
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        assert opened_to(before, snapshot(), {"svc": port}) == {"svc": 1}
        client.close()
        accepted.close()
        assert opened_to(before, snapshot(), {"svc": port}) == {"svc": 1}  # TIME_WAIT on the side that closed
        assert opened_to(snapshot(), snapshot(), {"svc": port}) == {"svc": 0}
