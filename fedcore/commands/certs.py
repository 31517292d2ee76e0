"""`fedforest certs`: the consortium CA and the master's and institutions' TLS certificates.

    fedforest certs init --dir certs
    fedforest certs issue master --dir certs --role master
    fedforest certs issue bank --dir certs --host bank.example.org --host 10.0.0.5

`issue` signs with `<dir>/ca.pem` and `<dir>/ca.key` and writes `<name>.pem` and `<name>.key` (mode 0600)
to `--out` (default: the same folder). Existing files are kept unless `--force` is given.
"""

from __future__ import annotations

import argparse

from fedcore.transport.tls import ROLES, init_ca, issue_certificate

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest certs init` and `fedforest certs issue`."""
    certs = commands.add_parser("certs", help="create the consortium CA and TLS certificates")
    actions = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="create the consortium CA (ca.pem, ca.key)")
    init.add_argument("--dir", required=True, metavar="DIR", help="folder for ca.pem and ca.key")
    init.add_argument("--name", default="fedforest consortium CA", help="the CA's common name")
    init.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.set_defaults(handler=_init)
    issue = actions.add_parser("issue", help="issue a certificate for the master or an institution")
    issue.add_argument("name", metavar="NAME", help="the master's or institution's name (as in the config)")
    issue.add_argument("--dir", required=True, metavar="DIR", help="folder holding ca.pem and ca.key")
    issue.add_argument("--out", metavar="DIR", help="folder for NAME.pem and NAME.key (default --dir)")
    issue.add_argument("--role", choices=ROLES, help="master or institution (default: master for the name "
                                                     "'master', institution otherwise)")
    issue.add_argument("--host", action="append", metavar="HOST",
                       help="a host name or IP the agent is reached at (repeatable; default 127.0.0.1 and "
                            "localhost)")
    issue.add_argument("--days", type=int, default=825, help="validity in days (default 825)")
    issue.add_argument("--force", action="store_true", help="replace existing files")
    issue.set_defaults(handler=_issue)


def _init(args: argparse.Namespace) -> int:
    cert, key = init_ca(args.dir, name=args.name, days=args.days, overwrite=args.force)
    print(f"consortium CA: {cert} (keep {key} secret; it signs every certificate)")
    return 0


def _issue(args: argparse.Namespace) -> int:
    role = args.role or ("master" if args.name == "master" else "institution")
    hosts = tuple(args.host) if args.host else DEFAULT_HOSTS
    cert, key = issue_certificate(args.dir, args.name, args.out or args.dir, role=role, hosts=hosts,
                                  days=args.days, overwrite=args.force)
    print(f"{role} {args.name!r}: {cert}, {key} (hosts: {', '.join(hosts)})")
    return 0
