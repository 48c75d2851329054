"""The gRPC stubs are a build step's output: protogen writes them (and only when a .proto is newer, unless forced),
importing services.common.protos never runs protoc, and missing stubs fail with one error naming `make protos`."""

import os
import subprocess
import sys
from pathlib import Path

from services.common import protogen

ROOT = Path(__file__).resolve().parents[4]


def _python(code: str, root: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=120)


def _generate(out_root: Path, force: bool = False) -> bool:
    """protogen.generate in a process of its own, as `make protos` runs it. NOTE: loading protoc's native module
    into a process that already holds torch and grpc can crash it (seen in the full unit suite)."""
    done = _python(
        "import sys; from pathlib import Path; from services.common.protogen import generate\n"
        f"print(generate(Path({str(out_root)!r}), force={force}))"
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


def test_protogen_writes_every_stub_then_skips_until_a_proto_changes(tmp_path):
    assert protogen.is_stale(tmp_path)
    assert _generate(tmp_path) is True
    assert all(p.is_file() for p in protogen.outputs(tmp_path))
    assert (tmp_path / "tandem" / "v1" / "router_pb2.pyi").is_file()
    assert protogen.is_stale(tmp_path) is False and _generate(tmp_path) is False
    assert _generate(tmp_path, force=True) is True
    stub = protogen.outputs(tmp_path)[0]
    os.utime(stub, (0, 0))  # older than every .proto
    assert protogen.is_stale(tmp_path)


def test_importing_stale_stubs_never_runs_protoc(tmp_path):
    """A copy of the tree whose stubs are older than every .proto: the import takes them as they are."""
    for name in (
        "services/__init__.py",
        "services/common/__init__.py",
        "services/common/protos.py",
        "tandem/__init__.py",
        *(str(p.relative_to(ROOT)) for p in protogen.outputs(ROOT)),
        *(str(p.relative_to(ROOT)) for p in (ROOT / "protos").rglob("*.proto")),
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    for stub in protogen.outputs(tmp_path):
        os.utime(stub, (0, 0))
    done = _python(
        "import sys; sys.modules['grpc_tools'] = None\n"  # NOTE: any import of it would now fail
        "from services.common.protos import router_pb2\n"
        "print(router_pb2.DESCRIPTOR.package)",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tandem.v1"


def test_missing_stubs_name_the_build_step():
    done = _python("import sys; sys.modules['tandem.v1.common_pb2'] = None\nimport services.common.protos")
    assert done.returncode == 1
    assert "ProtosMissingError" in done.stderr and "run `make protos`" in done.stderr


def test_running_the_old_module_says_where_generation_went():
    done = subprocess.run(
        [sys.executable, "-m", "services.common.protos", "--force"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1 and "python -m services.common.protogen --force" in done.stderr
