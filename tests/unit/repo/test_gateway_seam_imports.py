"""The gateway pipeline speaks domain types: outside its gRPC boundary (RouterPool, WorkerClients) no gateway module
imports protobuf (the generated `tandem.v1` stubs, `services.common.protos`, google.protobuf) or the converter that
builds it. Read from the source with ast, as the import-graph test; the check itself is run on a tiny fake tree."""

from pathlib import Path

from tests.unit.repo.import_graph import GENERATED, imported_names, module_files

ROOT = Path(__file__).resolve().parents[3]
GATEWAY = "services.gateway"
BOUNDARY = frozenset(
    {"services.gateway.router_pool", "services.gateway.router_pool_stream", "services.gateway.worker_clients"}
)
PROTOBUF = (GENERATED, "services.common.protos", "services.common.convert", "google.protobuf")


def _is_protobuf(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PROTOBUF) or name.endswith(("_pb2", "_pb2_grpc"))


def protobuf_imports(root: Path) -> list[tuple[str, str]]:
    """(module, imported name) for each protobuf import of a gateway module outside the boundary."""
    return sorted(
        (module, name)
        for module, path in module_files(root).items()
        if (module == GATEWAY or module.startswith(GATEWAY + ".")) and module not in BOUNDARY
        for name in imported_names(path, module)
        if _is_protobuf(name)
    )


def test_no_gateway_module_outside_the_boundary_imports_protobuf():
    assert protobuf_imports(ROOT) == []


def test_the_boundary_is_where_the_stubs_are():
    """The check guards something: the boundary modules exist and do import the stubs (else it checks nothing)."""
    modules = module_files(ROOT)
    for module in BOUNDARY:
        assert any(_is_protobuf(n) for n in imported_names(modules[module], module)), module


def test_the_check_sees_every_way_in(tmp_path):
    files = {
        "services/__init__.py": "",
        "services/gateway/__init__.py": "",
        "services/gateway/router_pool.py": "from services.common.protos import router_pb2\n",  # the boundary
        "services/gateway/direct.py": "import tandem.v1.router_pb2 as pb\n",
        "services/gateway/lazy.py": "def f():\n    from services.common import convert\n",
        "services/gateway/shim.py": "from services.common.protos import worker_pb2_grpc\n",
        "services/gateway/relative.py": "from .other_pb2 import X\n",
        "services/gateway/clean.py": "import grpc\nfrom services.common.domain import Route\n",
        "services/common/__init__.py": "",
        "services/common/domain.py": "",
        "tandem/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert protobuf_imports(tmp_path) == [
        ("services.gateway.direct", "tandem.v1.router_pb2"),
        ("services.gateway.lazy", "services.common.convert"),
        ("services.gateway.relative", "services.gateway.other_pb2"),
        ("services.gateway.shim", "services.common.protos"),
        ("services.gateway.shim", "services.common.protos.worker_pb2_grpc"),
    ]
