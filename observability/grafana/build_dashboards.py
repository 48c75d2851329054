"""Writes the Grafana dashboards (observability/grafana/dashboards/*.json) from the panel lists beside it
(dashboards_data_plane.py: Overview and Workers; dashboards_control_plane.py: Router and Planner).

The JSON files are what Grafana provisions; this script is where they are edited, so every query
reads as a list and the layout stays consistent. Run it after a change:
    python observability/grafana/build_dashboards.py
Only metrics from observability/README.md's catalog may appear (a unit test checks it).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# NOTE: run as a script or loaded from its path (the unit test): its sibling modules are found beside it, and the
# path is put back afterwards
sys.path.insert(0, str(HERE))
try:
    from dashboard_panels import PROMETHEUS, Panel, Row, variable
    from dashboards_control_plane import PLANNER, ROUTER
    from dashboards_data_plane import OVERVIEW, WORKERS
finally:
    sys.path.remove(str(HERE))

OUT_DIR = HERE / "dashboards"

DASHBOARDS = {
    "overview": (
        "tandem-overview",
        "tandem / Overview",
        OVERVIEW,
        [variable("model", "model", "tandem_gateway_requests_total")],
    ),
    "workers": (
        "tandem-workers",
        "tandem / Workers",
        WORKERS,
        [
            variable("role", "role", "tandem_worker_kv_blocks_total"),
            variable("worker", "worker_id", "tandem_worker_kv_blocks_total"),
        ],
    ),
    "router": ("tandem-router", "tandem / Router", ROUTER, []),
    "planner": ("tandem-planner", "tandem / Planner", PLANNER, []),
}


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": PROMETHEUS, "expr": t.expr, "legendFormat": t.legend, "range": True}
        for i, t in enumerate(panel.targets)
    ]
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": PROMETHEUS,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "min": 0, "custom": {"fillOpacity": 10, "showPoints": "never"}},
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def dashboard_json(uid: str, title: str, rows: tuple[Row, ...], variables: list[dict]) -> dict:
    panels, y, panel_id = [], 0, 1
    for row in rows:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        panel_id, y, x = panel_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(panel_json(panel, panel_id, x, y))
            panel_id, x = panel_id + 1, x + panel.width
        y += 8
    links = [
        {
            "title": "tandem",
            "type": "dashboards",
            "tags": ["tandem"],
            "asDropdown": False,
            "includeVars": False,
            "keepTime": True,
        }
    ]
    return {
        "uid": uid,
        "title": title,
        "tags": ["tandem"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "timezone": "browser",
        "time": {"from": "now-30m", "to": "now"},
        "links": links,
        "annotations": {"list": []},
        "templating": {"list": variables},
        "panels": panels,
    }


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{name}.json": json.dumps(dashboard_json(*spec), indent=2) + "\n" for name, spec in DASHBOARDS.items()}


def main() -> int:
    OUT_DIR.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT_DIR / name).write_text(text)
        print(OUT_DIR / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
