"""Files and folders written with explicit permissions, whatever the process's umask.

A private key is 0600, everything else of the PKI and the registries 0644 (folders 0755). Under umask 000 the
defaults would make the CA certificate, a model version or its folder world-writable, and anyone on the
machine could replace them.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE = 0o600
"""Keys: readable and writable by the owner only."""
PUBLIC = 0o644
"""Certificates, manifests, model tables, records: anyone may read, only the owner writes."""
FOLDER = 0o755
PRIVATE_FOLDER = 0o700
"""Folders of secrets and training state (checkpoints, noise seeds): the owner only."""
DATA = 0o640
"""Outputs derived from an institution's rows (predictions): the owner writes, its group reads."""


def make_folders(path: str | os.PathLike, mode: int = FOLDER) -> Path:
    """Create `path` and any missing parents, each new one with exactly `mode`; returns the path."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:
            continue  # created meanwhile by another writer
        os.chmod(folder, mode)  # mkdir's mode is masked by the umask
    return path


def set_mode(fd: int, mode: int) -> None:
    """Set an open file's mode exactly (not masked by the umask), where the platform can."""
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)


def write_file(path: str | os.PathLike, data: bytes, mode: int = PUBLIC, *, exclusive: bool = False) -> Path:
    """Write `data` to `path` with exactly `mode` and sync it.

    The mode is set on the open file before any byte is written. `exclusive`: refuse (FileExistsError) when
    the file exists; else it is replaced in place.
    """
    path = Path(path)
    make_folders(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, mode)
    try:
        set_mode(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            fd = -1
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        if fd >= 0:
            os.close(fd)
        if exclusive:
            path.unlink(missing_ok=True)
        raise
    return path
