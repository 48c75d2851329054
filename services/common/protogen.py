"""The build step that turns protos/tandem/v1/*.proto into the `tandem.v1` stub package (`make protos`, run by
`make install` and every Dockerfile). A build tool only: no service imports it, and importing it generates nothing.

    python -m services.common.protogen [--force]
"""

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"
NAMES = ("common", "worker", "router", "planner")


class ProtocError(RuntimeError):
    """protoc refused the .proto files; its own message is on stderr."""


def outputs(out_root: Path = ROOT) -> list[Path]:
    return [out_root / "tandem" / "v1" / f"{name}{suffix}" for name in NAMES for suffix in ("_pb2.py", "_pb2_grpc.py")]


def is_stale(out_root: Path = ROOT) -> bool:
    """A stub missing, or older than a .proto file."""
    newest = max(p.stat().st_mtime for p in _sources())
    return not all(o.exists() and o.stat().st_mtime >= newest for o in outputs(out_root))


def generate(out_root: Path = ROOT, force: bool = False) -> bool:
    """Writes the stubs (and their .pyi) under out_root/tandem/v1 when stale or forced; True when it wrote them."""
    if not force and not is_stale(out_root):
        return False
    from grpc_tools import protoc  # NOTE: a build dependency; the services never need it

    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *map(str, _sources()),
    ]
    if protoc.main(args) != 0:
        raise ProtocError(f"protoc failed on {PROTO_DIR}")
    importlib.invalidate_caches()
    return True


def _sources() -> list[Path]:
    sources = sorted(PROTO_DIR.glob("tandem/v1/*.proto"))
    if not sources:
        raise FileNotFoundError(f"no .proto files under {PROTO_DIR}/tandem/v1")
    return sources


def main(argv: list[str]) -> int:
    wrote = generate(force="--force" in argv)
    print(f"{'generated' if wrote else 'up to date:'} {', '.join(NAMES)} in {ROOT / 'tandem' / 'v1'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
