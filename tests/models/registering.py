"""A master process registering a version across three institutions, killable at any step.

Killed with SIGKILL (no cleanup) at any step of registering: `python -m tests.models.registering WORKDIR
STEP`.

The institutions are real horizontal agents over an in-process transport, each with its own registry
under WORKDIR; the master registry signs with WORKDIR/master.key. STEP names where the process kills
itself: `none` (it finishes), or one of `KILL_POINTS`. Used by tests/models/test_publish.py.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

NAMES = ("north", "south", "east")
MODEL = "readmission"
KILL_POINTS = ("pending-recorded", "master-written", "institution-writing", "stored-1", "stored-3",
               "committed")
"""Steps of registering, in order: the pending record is on disk (the version's files are not); the
master's version is written; the first institution is half-way through writing its part (a staging
folder); one, then all three institutions stored theirs; the commit is on disk."""


def table(seed: int = 0, n_rows: int = 240) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows, 3))
    return pd.DataFrame({"record_id": [f"R{seed}-{i}" for i in range(n_rows)], "a": x[:, 0], "b": x[:, 1],
                         "c": x[:, 2], "label": (x[:, 0] + x[:, 1] > 0).astype(int)})


def agents(workdir: Path) -> dict:
    """Fresh agents (a restarted process) on the institutions' registries under `workdir`."""
    from fedcore.agents.data import InstitutionData
    from fedcore.contracts.model import infer_contract
    from fedcore.horizontal.agent import HorizontalInstitutionAgent

    rows = table()
    frames = [rows.iloc[part] for part in np.array_split(np.arange(len(rows)), len(NAMES))]
    contract = infer_contract(table(), "registering", id_column="record_id", label="label")
    return {name: HorizontalInstitutionAgent(InstitutionData(
        name=name, frame=frame.reset_index(drop=True), id_column="record_id", label="label",
        registry=workdir / "registry" / name, predictions_dir=workdir / "predictions" / name,
        contract=contract, load_batch=lambda frame=frame: frame.drop(columns=["label"]).head(20),
        master_key=master_registry(workdir).public_key))
        for name, frame in zip(NAMES, frames, strict=True)}


def trained_session(handlers: dict):
    """A horizontal master session over `handlers`, trained (two small trees).

    The handlers are looked up at every message, so a caller may rewire them later.
    """
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.protocol.messages import Message
    from fedcore.transport.inprocess import InProcessTransport

    transport = InProcessTransport({name: (lambda message, name=name: handlers[name](message))
                                    for name in handlers})
    transport.exchange({n: Message("validation_report") for n in handlers})
    session = HorizontalSession(transport, ExtraTreesParams(n_estimators=2, max_depth=4, random_state=1),
                                algorithm="extra-trees", holdout_fraction=0.2)
    session.agree_schema()
    session.train()
    return session


def master_registry(workdir: Path):
    from fedcore.models.registry import ModelRegistry

    key_path = workdir / "master.key"
    if not key_path.exists():
        key_path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return ModelRegistry(workdir / "registry" / "master", signing_key=key_path)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(step: str, handlers: dict) -> None:
    """Make this process kill itself at `step` (see KILL_POINTS)."""
    import fedcore.models.artifacts as artifacts
    import fedcore.models.registry as registry

    if step == "pending-recorded":
        registry.write_version = lambda *args, **kwargs: _die()
    elif step == "master-written":
        original = registry.ModelRegistry.register
        registry.ModelRegistry.register = lambda self, *a, **k: (original(self, *a, **k), _die())[0]
    elif step == "institution-writing":
        original_publish = artifacts._publish
        # registry/<who>/..
        artifacts._publish = lambda staging, target: (_die() if Path(target).parts[-3] != "master"
                                                      else original_publish(staging, target))
    elif step in ("stored-1", "stored-3"):
        _die_after_stores(int(step[-1]), handlers)
    elif step == "committed":
        original_commit = registry.ModelRegistry.commit
        registry.ModelRegistry.commit = lambda self, *a, **k: (original_commit(self, *a, **k), _die())[0]
    elif step != "none":
        raise SystemExit(f"unknown step {step!r}; one of {KILL_POINTS} or none")


def _die_after_stores(wanted: int, handlers: dict) -> None:
    """Wrap every institution's handler so that this process dies once `wanted` of them stored the model."""
    seen = []
    for name, handle in list(handlers.items()):
        def counted(message, handle=handle, name=name):
            reply = handle(message)
            if message.kind == "store_model":
                seen.append(name)
                if len(seen) == wanted:
                    _die()
            return reply
        handlers[name] = counted


def register(workdir: Path, step: str) -> str:
    """Train and register one version everywhere, dying at `step`; returns the version."""
    from fedcore.models.publish import register_everywhere

    handlers = {name: agent.handle for name, agent in agents(workdir).items()}
    session = trained_session(handlers)
    arm(step, handlers)
    manifest = {"algorithm": "extra-trees", "setting": "horizontal",
                "parties": session.manifest_entries()["parties"]}
    version, _ = register_everywhere(master_registry(workdir), session, MODEL, manifest,
                                     session.master_tables())
    return version


if __name__ == "__main__":
    print(register(Path(sys.argv[1]), sys.argv[2]))
