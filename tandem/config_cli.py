"""`tandem config docs [--check]`: writes docs/configuration.md from the settings classes (or says it is stale).
Only the command; the text is tandem/config_docs.py's."""


def add_config_commands(commands) -> None:
    config = commands.add_parser("config", help="the services' settings")
    actions = config.add_subparsers(dest="config_command", required=True)
    docs = actions.add_parser("docs", help="write docs/configuration.md from the settings classes")
    docs.add_argument("--check", action="store_true", help="only say whether the committed file is stale (exit 1)")
    docs.set_defaults(func=_docs)


def _docs(args) -> int:
    from tandem.config_docs import main

    return main(["--check"] if args.check else [])
