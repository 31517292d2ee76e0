"""Under umask 000, the PKI, the keys and the registries are still written with explicit modes: nothing
group- or world-writable, private keys readable by their owner only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pyarrow as pa
import pytest

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
    written = [p for p in tmp_path.rglob("*")]
    assert len(written) > 12
    writable = [f"{p.relative_to(tmp_path)} {stat.filemode(p.stat().st_mode)}" for p in written
                if p.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)]
    assert writable == []
    private = sorted(p.name for p in written if p.is_file() and p.stat().st_mode & 0o077 == 0)
    assert {"ca.key", "bank.key", "master.key"} <= set(private)
    assert stat.S_IMODE((certs / "ca.pem").stat().st_mode) == 0o644
