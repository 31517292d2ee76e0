"""Checkpoints of a training run.

Each completed tree batch, written atomically at the master and at every party, so that a run interrupted by a
crash (kill -9 of an agent or of the master) resumes from the last batch everyone completed and ends with the
same model as an uninterrupted run.

A run is identified by `run_id` (the master chooses it, e.g. its Prefect flow-run id, so a retried flow
finds its checkpoints) and bound to a `context` digest of what must not change between attempts
(parameters, parties, aligned row counts); checkpoints of another context are ignored. Each batch is
one Arrow IPC file (a `Message`, so any set of named arrays) with its SHA-256 alongside. Checkpoints hold
training state and (horizontal DP) secret noise seeds: files 0600 in folders 0700, whatever the umask.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np

from fedcore.errors import ArtifactError
from fedcore.files import PRIVATE, PRIVATE_FOLDER, make_folders, write_file
from fedcore.names import check_name
from fedcore.protocol.messages import Message

CHECKPOINTS = ".checkpoints"
"""Folder name next to a registry's models (hidden: the registry never lists it)."""


class CheckpointStore:
    """Completed batches of one run under `root/<run_id>/`."""

    def __init__(self, root: str | os.PathLike, run_id: str, context: str) -> None:
        """Checkpoints of run `run_id` under `root`, valid only for the digest `context`."""
        check_name(run_id, "run id", ArtifactError)
        self.folder = Path(root) / str(run_id)
        self.context = context

    def _matches(self) -> bool:
        """Whether the folder holds checkpoints of this context (not of another model or other data)."""
        path = self.folder / "context"
        return path.is_file() and path.read_text() == self.context

    def save(self, batch: int, arrays: dict[str, np.ndarray]) -> None:
        """Write batch `batch` atomically (temporary file, fsync, rename), with its SHA-256.

        Checkpoints of another context under the same run id are discarded first.
        """
        if not self._matches():
            shutil.rmtree(self.folder, ignore_errors=True)
            make_folders(self.folder.parent.parent)  # the registry's own folder keeps the usual mode
            make_folders(self.folder, PRIVATE_FOLDER)
            # written once per run and atomically: a kill -9 while rewriting it would leave a context that
            # matches nothing, and the next attempt would discard every checkpoint of the run
            self._write(self.folder / "context", self.context.encode())
        booleans = sorted(name for name, a in arrays.items() if np.asarray(a).dtype == np.bool_)
        stored = {name: (np.asarray(a).astype(np.uint8) if name in booleans else a)
                  for name, a in arrays.items()}
        data = Message("checkpoint", {"batch": int(batch), "booleans": booleans}, stored).to_bytes()
        digest = hashlib.sha256(data).hexdigest()
        for name, payload in ((f"batch-{batch:05d}.arrow", data),
                              (f"batch-{batch:05d}.sha256", digest.encode())):
            self._write(self.folder / name, payload)

    @staticmethod
    def _write(path: Path, payload: bytes) -> None:
        """Replace `path` atomically: a temporary file, fsync, rename (a reader sees the old or new file)."""
        temp = path.with_name(f".{path.name}.tmp")
        write_file(temp, payload, PRIVATE)
        os.replace(temp, path)

    def completed(self) -> list[int]:
        """Batches with both their file and its digest written, in order."""
        if not self.folder.is_dir() or not self._matches():
            return []
        done = {int(p.stem.split("-")[1]) for p in self.folder.glob("batch-*.sha256")}
        return sorted(b for b in done if (self.folder / f"batch-{b:05d}.arrow").is_file())

    def load(self, batch: int) -> dict[str, np.ndarray]:
        """The arrays of batch `batch`, refused if the file does not match its recorded SHA-256."""
        data = (self.folder / f"batch-{batch:05d}.arrow").read_bytes()
        expected = (self.folder / f"batch-{batch:05d}.sha256").read_text().strip()
        if hashlib.sha256(data).hexdigest() != expected:
            raise ArtifactError(f"checkpoint {self.folder.name}/batch {batch} is corrupt (SHA-256 mismatch)")
        message = Message.from_bytes(data)
        booleans = set(message.header.get("booleans", []))
        return {name: (a.astype(np.bool_) if name in booleans else a) for name, a in message.arrays.items()}

    def drop(self) -> None:
        """Remove the run's checkpoints (after its model version is stored)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def resume_point(*completed: list[int]) -> int:
    """How many leading batches every role has completed (the batch to resume from)."""
    k = 0
    while all(k in set(c) for c in completed):
        k += 1
    return k
