"""The generated protobuf modules, (re)built from protos/ when missing or stale.

`make install` generates them; this fallback keeps a plain `pip install -e .` working.
"""
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "tandem" / "v1"
NAMES = ("common", "worker", "router", "planner")


def generate(force: bool = False) -> None:
    sources = sorted(PROTO_DIR.glob("tandem/v1/*.proto"))
    if not sources:
        return  # an installed package without protos/: the generated modules ship with it
    newest = max(p.stat().st_mtime for p in sources)
    outputs = [OUT_DIR / f"{n}_pb2.py" for n in NAMES]
    if not force and all(o.exists() and o.stat().st_mtime >= newest for o in outputs):
        return
    from grpc_tools import protoc

    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={ROOT}", f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}", *map(str, sources)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR}")
    importlib.invalidate_caches()


generate()
common_pb2 = importlib.import_module("tandem.v1.common_pb2")
worker_pb2 = importlib.import_module("tandem.v1.worker_pb2")
worker_pb2_grpc = importlib.import_module("tandem.v1.worker_pb2_grpc")
router_pb2 = importlib.import_module("tandem.v1.router_pb2")
router_pb2_grpc = importlib.import_module("tandem.v1.router_pb2_grpc")
planner_pb2 = importlib.import_module("tandem.v1.planner_pb2")
planner_pb2_grpc = importlib.import_module("tandem.v1.planner_pb2_grpc")

if __name__ == "__main__":
    generate(force="--force" in sys.argv)
    print(f"generated {', '.join(NAMES)} into {OUT_DIR}")
