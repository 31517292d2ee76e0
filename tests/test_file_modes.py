"""Under umask 000, everything fedforest writes still gets explicit modes.

The PKI, the keys, the registries, checkpoints and predictions: nothing group- or world-writable; private keys
and checkpoints readable by their owner only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.agents.storage import write_predictions
from fedcore.checkpoints import CHECKPOINTS, CheckpointStore
from fedcore.models.publish import register_everywhere
from fedcore.models.registry import ModelRegistry
from fedcore.models.signing import generate_signing_key
from fedcore.transport.tls import init_ca, issue_certificate


@pytest.fixture
def open_umask():
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


class _Stored:
    def store_at_institutions(self, model_name, version, manifest):
        return {}

    def withdraw_at_institutions(self, model_name, version):
        pass


def test_nothing_is_writable_by_others_whatever_the_umask(tmp_path: Path, open_umask) -> None:
    certs, keys = tmp_path / "pki" / "certs", tmp_path / "pki" / "keys"
    init_ca(certs)
    issue_certificate(certs, "bank", certs / "bank")
    generate_signing_key(keys / "master.key")
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=keys / "master.key")
    register_everywhere(registry, _Stored(), "credit", {"algorithm": "a"}, {"master": pa.table({"x": [1]})})
    registry.promote("credit", "v0001")
    checkpoints = CheckpointStore(tmp_path / "registry" / "bank" / CHECKPOINTS, "run-1", "context")
    checkpoints.save(0, {"noise_seed": np.array([7], np.int64)})
    bank = InstitutionData("bank", None, "id", None, tmp_path / "registry" / "bank",
                           tmp_path / "predictions" / "bank")
    predictions = write_predictions(bank, pd.DataFrame({"id": ["a"], "prediction": [1]}), ("model", "v0001"))
    written = [p for p in tmp_path.rglob("*")]
    assert len(written) > 12
    writable = [f"{p.relative_to(tmp_path)} {stat.filemode(p.stat().st_mode)}" for p in written
                if p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)]
    assert writable == []
    private = sorted(p.name for p in written if p.is_file() and p.stat().st_mode & 0o077 == 0)
    assert {"ca.key", "bank.key", "master.key"} <= set(private)
    assert stat.S_IMODE((certs / "ca.pem").stat().st_mode) == 0o644
    assert stat.S_IMODE((keys / "master.key.pub").stat().st_mode) == 0o644
    assert stat.S_IMODE((registry.root / "credit" / "aliases.log").stat().st_mode) == 0o644
    assert stat.S_IMODE(checkpoints.folder.stat().st_mode) == 0o700  # training state and noise seeds
    assert {stat.S_IMODE(p.stat().st_mode) for p in checkpoints.folder.iterdir()} == {0o600}
    assert stat.S_IMODE((tmp_path / "registry" / "bank").stat().st_mode) == 0o755
    assert stat.S_IMODE(predictions.stat().st_mode) == 0o640  # derived from the institution's rows
