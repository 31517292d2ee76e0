"""What both demos' workspaces share: credentials made once and kept, and the config sections naming them."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Any


def ensure_credentials(work: Path, institutions: tuple[str, ...]) -> None:
    """Make the demo's credentials under `work` once and keep them.

    They are the consortium CA with the institutions' certificates, the master CA with the master's
    certificate, the consortium key and the master's signing key. A workspace from before the master CA gets
    one, and a master certificate issued from it.
    """
    from fedcore.files import PRIVATE, make_folders, write_file
    from fedcore.models.signing import (
        generate_signing_key,
        load_signing_key,
        public_key_path,
        write_public_key,
    )
    from fedcore.transport.tls import has_master_ca, init_ca, init_master_ca, issue_certificate

    certs, keys = work / "certs", work / "keys"
    if not (certs / "ca.pem").exists():
        init_ca(certs)
    if not has_master_ca(certs):  # agents accept only master certificates it signed (tls.master_ca)
        init_master_ca(certs)
        issue_certificate(certs, "master", certs, role="master", overwrite=True)
    for name in institutions:
        if not (certs / f"{name}.pem").exists():
            issue_certificate(certs, name, certs, role="institution")
    make_folders(keys, 0o700)
    if not (keys / "consortium.key").exists():  # 0600 from the start, whatever the umask
        write_file(keys / "consortium.key", secrets.token_hex(32).encode(), PRIVATE, exclusive=True)
    if not (keys / "master.key").exists():
        generate_signing_key(keys / "master.key")  # and keys/master.key.pub, which every registry trusts
    elif not public_key_path(keys / "master.key").exists():  # a workspace from before trusted keys
        write_public_key(load_signing_key(keys / "master.key"), public_key_path(keys / "master.key"))


def free_port() -> int:
    """A TCP port nobody listens on right now (for the demo's loopback agents)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def credential_sections() -> dict[str, Any]:
    """The config's consortium key, TLS and master sections, naming the files `ensure_credentials` makes."""
    return {
        "consortium_key": {"file": "keys/consortium.key"},
        "tls": {"ca": "certs/ca.pem", "master_ca": "certs/master-ca.pem", "master_cert": "certs/master.pem",
                "master_key": "certs/master.key"},
        "master": {"registry": "registry/master", "work_pool": "master", "signing_key": "keys/master.key",
                   "public_key": "keys/master.key.pub"},
    }


def local_institution(name: str, contract: str, id_column: str, label: str | None) -> dict[str, Any]:
    """One institution's config entry for an agent on loopback, with its files under the workspace."""
    return {"name": name, "data": f"data/{name}/train.parquet", "predict_data": f"data/{name}/new.parquet",
            "contract": contract, "id_column": id_column, **({"label": label} if label is not None else {}),
            "endpoint": f"grpc+tls://127.0.0.1:{free_port()}", "work_pool": name,
            "registry": f"registry/{name}", "predictions": f"predictions/{name}",
            "cert": f"certs/{name}.pem", "key": f"certs/{name}.key"}
