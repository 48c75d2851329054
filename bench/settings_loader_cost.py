"""Start-up cost of tandem's own settings loader against pydantic-settings, for the router's and a decode worker's
settings: a fresh interpreter's import, and one load from the environment (variables -> the frozen dataclass, whose
checks run in both). pydantic-settings is not a dependency: install it aside, e.g.
`pip install --target /tmp/ps pydantic-settings python-dotenv`, and run with TANDEM_BENCH_PYDANTIC_SETTINGS=/tmp/ps.
Writes bench/results/settings_loader_cost.json and prints a table."""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

OUT = Path(__file__).parent / "results" / "settings_loader_cost.json"
EXTRA = os.environ.get("TANDEM_BENCH_PYDANTIC_SETTINGS", "")
ENV = {
    "TANDEM_MODEL": "/m",
    "TANDEM_ROUTER_POLICY": "kv",
    "TANDEM_WORKER_MAX_NUM_SEQS": "32",
    "TANDEM_WORKER_KV_HOST_GB": "1.5",
}


def import_ms(statement: str, runs: int) -> float:
    """Median wall time of a fresh interpreter running `statement`, less one running `pass`."""
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), EXTRA) if p)

    def once(code: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", f"import time; t = time.perf_counter(); {code}; print(time.perf_counter() - t)"],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ | {"PYTHONPATH": path},
        )
        return float(out.stdout)

    return statistics.median(once(statement) for _ in range(runs)) * 1e3


def pydantic_loader(source):
    """A pydantic-settings class with the same fields, defaults, variable names and types as the Source's."""
    from pydantic import AliasChoices, Field, create_model
    from pydantic_settings import BaseSettings, SettingsConfigDict

    fields = {
        s.name: (
            type(s.default) if s.name not in ("api_keys",) else str,
            Field(s.default, validation_alias=AliasChoices(s.env)),
        )
        for s in source.settings()
    }
    model = create_model("Bench", __base__=BaseSettings, **fields)
    model.model_config = SettingsConfigDict(frozen=True, extra="ignore")
    return model


def load_us(fn, number: int = 200) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    if EXTRA:
        sys.path.append(EXTRA)
    os.environ.update(ENV)
    from services.common.roles import WorkerRole
    from services.common.worker_settings import SOURCE as WORKER
    from services.router.settings import SOURCE as ROUTER

    rows = {}
    for name, source, fixed in (("router", ROUTER, {}), ("decode worker", WORKER, {"role": WorkerRole.DECODE})):
        model = pydantic_loader(source)
        assert dataclasses.asdict(source.cls(**fixed, **model().model_dump())) == dataclasses.asdict(
            source.load(**fixed)
        ), "the two loaders must build the same settings"
        rows[name] = {
            "own_load_us": load_us(lambda source=source, fixed=fixed: source.load(**fixed)),
            "pydantic_settings_load_us": load_us(
                lambda source=source, fixed=fixed, model=model: source.cls(**fixed, **model().model_dump())
            ),
        }
    runs = 15
    rows["import"] = {
        "own_import_ms": import_ms("import services.common.settings_loader", runs),
        "pydantic_settings_import_ms": import_ms("import pydantic_settings", runs),
    }
    OUT.write_text(json.dumps({"python": sys.version.split()[0], "import_runs": runs, "results": rows}, indent=1))
    print(f"{'':16} {'own loader':>12} {'pydantic-settings':>18}")
    for name in ("router", "decode worker"):
        r = rows[name]
        print(f"{name + ' load':16} {r['own_load_us']:10.1f}us {r['pydantic_settings_load_us']:16.1f}us")
    r = rows["import"]
    print(f"{'import (fresh)':16} {r['own_import_ms']:10.1f}ms {r['pydantic_settings_import_ms']:16.1f}ms")


if __name__ == "__main__":
    main()
