"""The `tandem` command: a top-level parser with one subcommand group per area; each subcommand sets `func`.

Parsing and error reporting only; subcommands live next to the code they drive (e.g. tandem/models/cli.py).
"""

import argparse
import logging
import sys

from tandem.bench.commands import add_bench_commands
from tandem.certs.cli import add_certs_commands
from tandem.chaos.cli import add_chaos_command
from tandem.cluster.cli import add_sim_command
from tandem.config_cli import add_config_commands
from tandem.models.cli import add_model_commands
from tandem.models.errors import ModelError
from tandem.stack_cli import add_stack_commands
from tandem.worker_drain import add_worker_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description="disaggregated LLM inference")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    commands = parser.add_subparsers(dest="command", required=True)
    add_model_commands(commands)
    add_stack_commands(commands)
    add_bench_commands(commands)
    add_sim_command(commands)
    add_worker_commands(commands)
    add_chaos_command(commands)
    add_certs_commands(commands)
    add_config_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except ModelError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
