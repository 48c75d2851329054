"""The generated protobuf and gRPC modules, imported from the `tandem.v1` stub package. Importing never generates
them: a checkout without stubs gets one clear error naming the build step (services/common/protogen.py)."""

import importlib

COMMAND = "make protos"  # the build step (python -m services.common.protogen [--force] in any environment)

__all__ = [
    "common_pb2",
    "planner_pb2",
    "planner_pb2_grpc",
    "router_pb2",
    "router_pb2_grpc",
    "worker_pb2",
    "worker_pb2_grpc",
]


class ProtosMissingError(ImportError):
    """The generated stubs are not there (a fresh checkout, or `pip install -e .` without `make`)."""


def _stub(name: str):
    try:
        return importlib.import_module(f"tandem.v1.{name}")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("tandem"):
            raise  # NOTE: a missing dependency (grpc, protobuf) says so itself
        raise ProtosMissingError(
            f"the generated protobuf modules (tandem/v1/{name}.py) are missing: run `{COMMAND}` "
            "(python -m services.common.protogen) after installing"
        ) from exc


common_pb2 = _stub("common_pb2")
worker_pb2 = _stub("worker_pb2")
worker_pb2_grpc = _stub("worker_pb2_grpc")
router_pb2 = _stub("router_pb2")
router_pb2_grpc = _stub("router_pb2_grpc")
planner_pb2 = _stub("planner_pb2")
planner_pb2_grpc = _stub("planner_pb2_grpc")

if __name__ == "__main__":  # NOTE: this module used to generate when run; say where that went rather than do nothing
    raise SystemExit(
        f"services.common.protos only imports the stubs: generate them with `{COMMAND}` "
        "(python -m services.common.protogen --force)"
    )
