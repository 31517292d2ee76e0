"""`fedforest certs`: the consortium CA, the master CA and the master's and institutions' certificates.

    fedforest certs init --dir certs
    fedforest certs issue master --dir certs --role master
    fedforest certs issue bank --dir certs --host bank.example.org --host 10.0.0.5

`init` makes the consortium CA (`ca.pem`, `ca.key`) and the master CA (`master-ca.pem`, `master-ca.key`),
a second root that signs master certificates only; `fedforest certs master-ca --dir certs` adds the master
CA to an existing consortium. `issue` signs an institution's certificate with `<dir>/ca.pem` and
`<dir>/ca.key`, and a master's with the master CA when `<dir>` holds one (else with the consortium CA, with
a warning), and writes `<name>.pem` and `<name>.key` (mode 0600) to `--out` (default: the same folder).
Existing files are kept unless `--force` is given.

Agents given the master CA (config `tls.master_ca`) accept only certificates it signed at the TLS handshake:
another institution's certificate is refused before anything it sends is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedcore.transport.tls import (
    MASTER_CA,
    ROLES,
    has_master_ca,
    init_ca,
    init_master_ca,
    issue_certificate,
)

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest certs init`, `fedforest certs master-ca` and `fedforest certs issue`."""
    certs = commands.add_parser("certs", help="create the consortium CA and TLS certificates")
    actions = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="create the consortium CA (ca.pem, ca.key) and the master CA "
                                           "(master-ca.pem, master-ca.key)")
    init.add_argument("--dir", required=True, metavar="DIR", help="folder for the CAs' files")
    init.add_argument("--name", default="fedforest consortium CA", help="the consortium CA's common name")
    init.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    init.add_argument("--force", action="store_true", help="replace existing CAs")
    init.set_defaults(handler=_init)
    master_ca = actions.add_parser("master-ca", help="create only the master CA (master-ca.pem, "
                                                     "master-ca.key), e.g. for an existing consortium")
    master_ca.add_argument("--dir", required=True, metavar="DIR", help="folder for master-ca.pem and "
                                                                       "master-ca.key")
    master_ca.add_argument("--name", default="fedforest master CA", help="the master CA's common name")
    master_ca.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    master_ca.add_argument("--force", action="store_true", help="replace an existing master CA")
    master_ca.set_defaults(handler=_master_ca)
    issue = actions.add_parser("issue", help="issue a certificate for the master or an institution")
    issue.add_argument("name", metavar="NAME", help="the master's or institution's name (as in the config)")
    issue.add_argument("--dir", required=True, metavar="DIR",
                       help="folder holding ca.pem and ca.key (and, for a master, master-ca.pem and "
                            "master-ca.key)")
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
    print(f"consortium CA: {cert} (keep {key} secret; it signs every institution's certificate)")
    if has_master_ca(args.dir) and not args.force:  # independent of the consortium CA: kept
        print(f"master CA: keeping {Path(args.dir) / f'{MASTER_CA}.pem'}")
        return 0
    return _master_ca(argparse.Namespace(dir=args.dir, name="fedforest master CA", days=args.days,
                                         force=args.force))


def _master_ca(args: argparse.Namespace) -> int:
    cert, key = init_master_ca(args.dir, name=args.name, days=args.days, overwrite=args.force)
    print(f"master CA: {cert} (keep {key} with the master's operator; it signs master certificates only). "
          f"Give every agent {cert.name} as tls.master_ca")
    return 0


def _issue(args: argparse.Namespace) -> int:
    role = args.role or ("master" if args.name == "master" else "institution")
    hosts = tuple(args.host) if args.host else DEFAULT_HOSTS
    cert, key = issue_certificate(args.dir, args.name, args.out or args.dir, role=role, hosts=hosts,
                                  days=args.days, overwrite=args.force)
    signer = "the master CA" if role == "master" and has_master_ca(args.dir) else "the consortium CA"
    print(f"{role} {args.name!r}: {cert}, {key} (hosts: {', '.join(hosts)}; signed by {signer})")
    if role == "master" and signer == "the consortium CA":
        print(f"warning: {args.dir} holds no {MASTER_CA}.pem, so this master certificate comes from the "
              "consortium CA and agents cannot tell it from a member's at the TLS handshake; run "
              f"`fedforest certs master-ca --dir {args.dir}` and issue it again with --force",
              file=sys.stderr)
    return 0
