"""The master's signing key for in-process federations in tests: every registry signs with it or trusts it."""

from __future__ import annotations

from pathlib import Path

from fedcore.models.signing import generate_signing_key, public_key_path


def master_key(root: Path) -> Path:
    """`root`/master.key (made once, with master.key.pub beside it): what the master's registry signs with."""
    path = Path(root) / "master.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        generate_signing_key(path)
    return path


def master_public_key(root: Path) -> Path:
    """The public half of `master_key(root)`, which institutions' registries trust."""
    return public_key_path(master_key(root))
