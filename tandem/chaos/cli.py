"""`tandem chaos`: start a stack (sim engine), run a load, inject the scenarios' faults, and report per scenario
what was sent, completed, migrated, failed cleanly and lost, with the recovery time; table + JSON; exit code 1 on
any loss or failed check. Parsing and printing only."""

import asyncio
import logging
import sys
import time
from pathlib import Path

SCENARIO_HELP = "a scenario's name (repeatable), or all"


def add_chaos_command(commands) -> None:
    chaos = commands.add_parser("chaos", help="fault-injection scenarios against a live stack", description=__doc__)
    chaos.add_argument("--scenario", action="append", default=None, help=SCENARIO_HELP)
    chaos.add_argument("--short", action="store_true", help="the seconds-long versions (what make test runs)")
    chaos.add_argument(
        "--model",
        default="",
        help="checkpoint directory the gateway tokenizes with (default: tandem model fetch's SmolLM2)",
    )
    chaos.add_argument("--json", type=Path, default=Path("bench/out/chaos.json"))
    chaos.add_argument("--log-dir", type=Path, default=Path(".cache/chaos"))
    chaos.add_argument(
        "--fuzz-cases",
        type=int,
        default=None,
        help="schemathesis cases in the fuzz scenario (default 1000; 100 with --short)",
    )
    chaos.add_argument("--list", action="store_true", help="list the scenarios and exit")
    chaos.set_defaults(func=_chaos)


def _chaos(args) -> int:
    from tandem.chaos.report import table, write_json
    from tandem.chaos.runner import run_scenarios
    from tandem.chaos.scenarios import build

    scenarios = build(args.short, fuzz_cases=args.fuzz_cases)
    if args.list:
        print("\n".join(f"{s.name:18} {s.goal}" for s in scenarios))
        return 0
    names = {s.name for s in scenarios}
    wanted = args.scenario or ["all"]
    unknown = sorted(set(wanted) - names - {"all"})
    if unknown:
        print(
            f"tandem chaos: unknown scenario {', '.join(unknown)}; choose from {', '.join(sorted(names))} or all",
            file=sys.stderr,
        )
        return 2
    chosen = scenarios if "all" in wanted else [s for s in scenarios if s.name in wanted]
    logging.getLogger("httpx").setLevel(logging.WARNING)
    started = time.monotonic()
    results = asyncio.run(run_scenarios(chosen, args.model or str(_default_model()), args.log_dir))
    wall_s = time.monotonic() - started
    print(table(results))
    write_json(results, args.json, wall_s, args.short)
    passed = all(r.passed for r in results)
    print(f"\n{len(results)} scenarios in {wall_s:.0f} s: {'all passed' if passed else 'FAILED'}; JSON: {args.json}")
    return 0 if passed else 1


def _default_model() -> Path:
    from tandem.models.fetch import fetch_model

    return fetch_model()
