"""`tandem certs init|issue|kv-key`: argument parsing and printing only; tandem/certs/pki.py makes the files.

Each command prints the directories it wrote, one per line, on stdout.
"""

import argparse
import sys
from pathlib import Path

from services.common.identity import (
    ANY_ID,
    ROLES,
    WORKER_ROLES,
    Identity,
    IdentityError,
)
from tandem.certs import pki

SINGLE_ROLES = ("gateway", "planner", "operator")


def add_certs_commands(subparsers: argparse._SubParsersAction) -> None:
    certs = subparsers.add_parser("certs", help="make the CA, service certificates and KV signing key (mTLS)")
    actions = certs.add_subparsers(dest="certs_command", required=True)

    init = actions.add_parser("init", help="a new CA, one certificate per service identity, and a KV signing key")
    init.add_argument("dir", type=Path)
    init.add_argument("--routers", type=int, default=1, help="router, router-1, ...")
    init.add_argument("--prefill", type=int, default=1, help="prefill-0, prefill-1, ...")
    init.add_argument("--decode", type=int, default=1, help="decode-0, decode-1, ...")
    init.add_argument(
        "--role-wide",
        action="append",
        default=[],
        choices=ROLES,
        metavar="ROLE",
        help="also a certificate any replica of ROLE may hold (DIR/ROLE-any; repeatable)",
    )
    init.add_argument("--ca-days", type=int, default=pki.CA_DAYS)
    init.add_argument("--force", action="store_true", help="replace an existing CA (every old certificate dies)")
    _add_leaf_options(init)
    init.set_defaults(func=_run_init)

    issue = actions.add_parser("issue", help="one more identity from the CA in DIR (a new one replaces it)")
    issue.add_argument("dir", type=Path)
    issue.add_argument("role", choices=ROLES)
    issue.add_argument("id", nargs="?", default="", help="e.g. decode-3 (omit with --role-wide)")
    issue.add_argument("--role-wide", action="store_true", help="any replica of ROLE (DIR/ROLE-any)")
    _add_leaf_options(issue)
    issue.set_defaults(func=_run_issue)

    kv_key = actions.add_parser("kv-key", help="write a new KV signing key (DIR/kv-signing.key)")
    kv_key.add_argument("dir", type=Path)
    kv_key.set_defaults(func=_run_kv_key)


def _add_leaf_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--days", type=int, default=pki.LEAF_DAYS, help="certificate lifetime")
    parser.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="another host name clients dial the service by (repeatable)",
    )


def default_identities(
    num_routers: int, num_prefill: int, num_decode: int, role_wide: list[str] = ()
) -> list[Identity]:
    """What `init` issues; the ids are the ones `tandem up` gives its processes."""
    routers = ["router", *(f"router-{i}" for i in range(1, num_routers))]
    return (
        [Identity(role, role) for role in SINGLE_ROLES]
        + [Identity("router", r) for r in routers]
        + [Identity(role, f"{role}-{i}") for role, n in zip(WORKER_ROLES, (num_prefill, num_decode)) for i in range(n)]
        + [Identity(role, ANY_ID) for role in dict.fromkeys(role_wide)]
    )


def _run_init(args) -> int:
    if (args.dir / pki.CA_KEY).exists() and not args.force:
        return _fail(f"{args.dir} already has a CA; --force replaces it (every certificate it signed stops working)")
    if min(args.routers, 1 + args.prefill, args.decode) < 1 or min(args.prefill, args.decode) < 0:
        return _fail("need --routers >= 1, --prefill >= 0, --decode >= 0")
    try:
        authority = pki.new_authority(days=args.ca_days)
        pki.save_authority(args.dir, authority)
        for identity in default_identities(args.routers, args.prefill, args.decode, args.role_wide):
            print(pki.write_identity(args.dir, authority, identity, args.days, tuple(args.dns)).directory)
    except (IdentityError, ValueError) as exc:
        return _fail(str(exc))
    print(pki.write_kv_signing_key(args.dir))
    print(pki.write_kv_hash_secret(args.dir))
    return 0


def _run_issue(args) -> int:
    if args.role_wide == bool(args.id):
        return _fail("give an ID, or --role-wide, not both")
    try:
        identity = Identity(args.role, ANY_ID if args.role_wide else args.id)
        files = pki.write_identity(args.dir, pki.load_authority(args.dir), identity, args.days, tuple(args.dns))
    except (IdentityError, ValueError) as exc:
        return _fail(str(exc))
    print(files.directory)
    return 0


def _run_kv_key(args) -> int:
    pki.private_dir(args.dir)
    print(pki.write_kv_signing_key(args.dir))
    return 0


def _fail(message: str) -> int:
    print(f"tandem certs: error: {message}", file=sys.stderr)
    return 2
