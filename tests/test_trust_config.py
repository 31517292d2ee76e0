"""Trust comes from the federation config.

The master's public key beside its signing key (or named), an institution that lacks it refuses at start, and
a master manifest signed by anyone else is never stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from fedcore.agents.data import InstitutionData, institution_from_config
from fedcore.agents.storage import store_signed_table
from fedcore.config import parse_config
from fedcore.errors import ConfigError, ProtocolError
from fedcore.models.artifacts import table_sha256
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Header
from tests.keys import master_key, master_public_key


def _raw(tmp_path: Path, master: dict | None = None) -> dict:
    pd.DataFrame({"id": ["a", "b"], "x": [1.0, 2.0], "y": [0, 1]}).to_parquet(tmp_path / "bank.parquet")
    raw = {"federation": "f", "consortium_key": {"env": "UNUSED"},
           "institutions": [{"name": "bank", "data": "bank.parquet", "id_column": "id", "label": "y"}]}
    return {**raw, "master": master} if master is not None else raw


def test_the_public_key_defaults_to_the_one_beside_the_signing_key(tmp_path):
    config = parse_config(_raw(tmp_path, {"signing_key": "keys/master.key"}), tmp_path / "federation.yaml")
    assert config.master_public_key == tmp_path / "keys" / "master.key.pub"
    named = parse_config(_raw(tmp_path, {"signing_key": "k", "public_key": "/etc/f/master.pub"}),
                         tmp_path / "f.yaml")
    assert named.master_public_key == Path("/etc/f/master.pub")
    assert parse_config(_raw(tmp_path), tmp_path / "federation.yaml").master_public_key is None


def test_an_institution_without_the_named_public_key_refuses_to_start(tmp_path):
    config = parse_config(_raw(tmp_path, {"public_key": "keys/master.key.pub"}), tmp_path / "federation.yaml")
    with pytest.raises(ConfigError,
                       match=r"institution 'bank': the master's public key '.*keys/master.key.pub' "
                             r"\(master.public_key\) is not there: copy the master's public key"):
        institution_from_config(config, "bank")
    master_key(tmp_path / "keys")
    assert institution_from_config(config, "bank").master_key == master_public_key(tmp_path / "keys")


def _version(tmp_path: Path, signer: Path) -> tuple[Header, pa.Table]:
    """A master version listing the bank's table digest, signed with `signer`.

    Returns its header and table.
    """
    table = pa.table({"x": [1.0, 2.0]})
    registry = ModelRegistry(tmp_path / "master", signing_key=signer)
    manifest = {"parties": [{"name": "bank", "table_sha256": table_sha256(table)}]}
    version = registry.register("m", manifest, {"master": pa.table({"t": [0]})})
    header = Header({"model": "m", "version": version,
                     "manifest": json.dumps(registry.read_manifest("m", version))})
    return header, table


def _bank(tmp_path: Path, key: Path | None) -> InstitutionData:
    return InstitutionData("bank", None, "id", "y", tmp_path / "bank", tmp_path / "predictions",
                           master_key=key)


def test_an_institution_stores_only_what_the_trusted_master_signed(tmp_path):
    header, table = _version(tmp_path / "forged", master_key(tmp_path / "forger"))
    with pytest.raises(ProtocolError,
                       match="institution 'bank': refusing to store 'm' v0001: .*signed by key .*, not "
                             "by the trusted key"):
        store_signed_table(_bank(tmp_path, master_public_key(tmp_path / "master")), header, "bank", table, {})
    with pytest.raises(ConfigError,
                       match="institution 'bank': no trusted master key, so no model version can be "
                             "stored or loaded here: set master.public_key"):
        store_signed_table(_bank(tmp_path, None), header, "bank", table, {})
    assert not (tmp_path / "bank" / "m").exists() or not ModelRegistry(tmp_path / "bank").versions("m")

    header, table = _version(tmp_path / "real", master_key(tmp_path / "master"))
    stored = store_signed_table(_bank(tmp_path, master_public_key(tmp_path / "master")), header,
                                "bank", table, {})
    assert Path(stored).name == "v0001"


def test_retrain_refuses_to_start_without_a_signing_key(tmp_path):
    from tasks.registry import master_registry

    config = parse_config(_raw(tmp_path), tmp_path / "federation.yaml")
    with pytest.raises(ConfigError,
                       match="master.signing_key is not set, but every model version and alias move is "
                             "signed by the master"):
        master_registry(config)
