"""TCP connections to a stack's gRPC ports, read from /proc/net/tcp and tcp6: `bench overhead` counts those a phase
opens, each one a TLS handshake on a secure stack (a channel made per request would show here). Linux only; reads
those files and opens no socket."""

from collections import Counter
from pathlib import Path

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
# every state a connection passes through once opened, up to TIME_WAIT (held 60 s by the side that closed first),
# so one opened and closed within a phase is still seen; LISTEN (0A) and CLOSE (07) are not connections
_CONNECTED = frozenset({"01", "02", "03", "04", "05", "06", "08", "09", "0B"})

Endpoint = tuple[str, int]  # (address in /proc's hex, port)
Connection = tuple[Endpoint, Endpoint]  # its two ends, sorted: the client's socket and the server's are one entry


def parse(text: str) -> set[Connection]:
    """The connections a /proc/net/tcp(6) table lists (its header line skipped)."""
    found = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] not in _CONNECTED:
            continue
        ends = sorted((_endpoint(fields[1]), _endpoint(fields[2])))
        found.add((ends[0], ends[1]))
    return found


def _endpoint(field: str) -> Endpoint:
    address, port = field.rsplit(":", 1)
    return address, int(port, 16)


def snapshot() -> frozenset[Connection]:
    """This host's TCP connections now (empty where /proc/net has no tables)."""
    found: set[Connection] = set()
    for table in _TABLES:
        try:
            found |= parse(table.read_text())
        except OSError:  # no IPv6, or not Linux
            continue
    return frozenset(found)


def opened_to(before: frozenset[Connection], after: frozenset[Connection], ports: dict[str, int]) -> dict[str, int]:
    """How many connections to each named port are in `after` and not in `before`: those opened in between."""
    by_port = {port: name for name, port in ports.items()}
    counts: Counter[str] = Counter(dict.fromkeys(ports, 0))
    for connection in after - before:
        names = {by_port[port] for _, port in connection if port in by_port}
        for name in names:  # NOTE: a connection between two named ports counts for both
            counts[name] += 1
    return dict(counts)
