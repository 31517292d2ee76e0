"""A test CA with the certificates the transport tests use: the master's and institution "a"'s."""

from __future__ import annotations

from pathlib import Path

from fedcore.transport.tls import init_ca, issue_certificate


def master_and_agent_ca(ca: Path) -> Path:
    """Create a CA in `ca` and issue certificates for the master and for institution "a" there."""
    init_ca(ca)
    for name, role in (("master", "master"), ("a", "institution")):
        issue_certificate(ca, name, ca, role=role)
    return ca
