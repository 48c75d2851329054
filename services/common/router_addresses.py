"""Where the router replicas are: a comma list of host:port, where an entry `dns:NAME:PORT` stands for every A/AAAA
record of NAME (a Kubernetes headless Service lists one per replica). Resolution only: no channels, no retries.
"""

import socket


class RouterAddressError(ValueError):
    """A router address list that names no router, or a DNS name that resolves to none."""


def router_addresses(raw: str, resolve=socket.getaddrinfo) -> list[str]:
    """The replicas' host:port addresses, in the order given (a DNS name's records sorted), without repeats."""
    out: list[str] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        if entry.startswith("dns:"):
            out.extend(_resolve(entry.removeprefix("dns:").lstrip("/"), resolve))
        else:
            out.append(entry)
    if not out:
        raise RouterAddressError(f"no router address in {raw!r}")
    return list(dict.fromkeys(out))


def _resolve(name_port: str, resolve) -> list[str]:
    host, sep, port = name_port.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RouterAddressError(f"dns:{name_port}: expected dns:NAME:PORT")
    try:
        infos = resolve(host, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        raise RouterAddressError(f"dns:{name_port}: {exc}") from None
    ips = sorted({info[4][0] for info in infos})
    if not ips:
        raise RouterAddressError(f"dns:{name_port}: no records")
    return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in ips]
