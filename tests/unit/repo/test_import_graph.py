"""The layering holds: no import circle among the repository's modules and no import from services/ or engines/ up
into tandem/, read from the source (ast; nothing imported). The reader itself is checked on a tiny fake tree."""

from pathlib import Path

from tests.unit.repo.import_graph import circles, import_graph, upward_arrows

ROOT = Path(__file__).resolve().parents[3]
# NOTE: the engine core and its tiering plug-in are untied by issue 23 item 2 (the `sched` branch); drop this entry
# when that lands: the test fails while an allowed circle no longer exists, so the list can only shrink.
ALLOWED_CIRCLES: list[list[str]] = []


def test_the_repository_has_no_import_circle():
    found = circles(import_graph(ROOT))
    assert [c for c in found if c not in ALLOWED_CIRCLES] == []
    assert [c for c in ALLOWED_CIRCLES if c not in found] == [], "an allowed circle is gone: remove its entry"


def test_nothing_in_services_or_engines_imports_tandem():
    assert upward_arrows(import_graph(ROOT)) == []


def test_the_planner_reads_timing_profiles_without_the_sim_engine():
    """Timing profiles are neutral ground (engines/timing): the planner, live or simulated, never loads a runner."""
    graph = import_graph(ROOT)
    planner = [m for m in graph if m.startswith(("services.planner", "tandem.cluster.planner"))]
    assert planner and "engines.timing.profile" in graph["services.planner.perf_model"]
    assert [(m, t) for m in planner for t in graph[m] if t.split(".")[:2] == ["engines", "sim"]] == []
    neutral = graph["engines.timing.profile"] | graph["engines.timing.measured"]
    # NOTE: beside each other, only the pure block arithmetic every layer shares
    assert neutral <= {"engines.timing.measured", "engines.base.block_hash"}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_reader_sees_lazy_relative_and_package_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "engines/__init__.py": "",
            "engines/a.py": "def f():\n    from engines.b import g\n",  # lazy
            "engines/b.py": "from . import a\n",  # relative, reads engines/__init__.py too
            "engines/pkg/__init__.py": "from engines.pkg.mod import X\n",
            "engines/pkg/mod.py": "from engines.pkg import other\n",  # reads pkg/__init__.py: a circle with it
            "engines/pkg/other.py": "import os\nimport tandem.cli\n",  # outside: ignored; tandem: an upward arrow
            "tandem/__init__.py": "",
            "tandem/cli.py": "import engines.a\n",
            "tandem/v1/common_pb2.py": "import engines.a\n",  # generated: not part of the graph
        },
    )
    graph = import_graph(root)
    assert graph["engines.a"] == {"engines.b"}
    assert graph["engines.b"] == {"engines", "engines.a"}
    assert graph["engines.pkg.other"] == {"tandem.cli"}
    assert "tandem.v1.common_pb2" not in graph
    assert circles(graph) == [["engines.a", "engines.b"], ["engines.pkg", "engines.pkg.mod"]]
    assert upward_arrows(graph) == [("engines.pkg.other", "tandem.cli")]
