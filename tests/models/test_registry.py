"""The versioned registry on a real fitted model.

Numbering, aliases, promote/rollback, signatures and crashes.
"""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ArtifactError
from fedcore.models import artifacts, signing
from fedcore.models.registry import ModelRegistry
from fedcore.models.tables import master_table, party_table, structure_from_table
from fedcore.vertical.estimators import FederatedForestClassifier
from tests.conftest import mixed_table

LABEL = "target"
MODEL = "credit"


def fit_model() -> FederatedForestClassifier:
    """A small fitted two-party Federated Forest."""
    frame = mixed_table(300)
    parties = split_vertical(frame, 2, label=LABEL)
    return FederatedForestClassifier(n_estimators=3, max_depth=4).fit(parties, label=LABEL)


def master_artifacts(model: FederatedForestClassifier, accuracy: float = 0.9) -> tuple[dict, dict]:
    """What the master registers: the manifest facts and master.arrow (no party tables)."""
    manifest = {
        "algorithm": "forest", "setting": "vertical", "task": "classification",
        "params": model.params.to_dict(), "n_trees": int(model.master_.structure.n_trees),
        "parties": [{"name": p.name, "role": "label_holder" if p.is_label_holder else "passive",
                     "feature_count": len(p.model.column_names), "file": f"{p.name}.arrow"}
                    for p in model.parties_],
        "metrics": {"accuracy": accuracy},
    }
    return manifest, {"master": master_table(model.master_.structure)}


@pytest.fixture(scope="module")
def model() -> FederatedForestClassifier:
    return fit_model()


@pytest.fixture
def key(tmp_path):
    return signing.generate_signing_key(tmp_path / "keys" / "master.pem")


@pytest.fixture
def registry(tmp_path, key) -> ModelRegistry:
    """The master's registry: signs versions and alias moves, trusts its own key."""
    return ModelRegistry(tmp_path / "registry", signing_key=key)


@pytest.fixture
def signed(tmp_path, key) -> ModelRegistry:
    return ModelRegistry(tmp_path / "registry", signing_key=key)


def _register(registry: ModelRegistry, model, accuracy: float = 0.9) -> str:
    return registry.register(MODEL, *master_artifacts(model, accuracy))


def test_versions_written_with_an_older_algorithm_spelling_are_described_by_the_canonical_id(registry, model):
    manifest, tables = master_artifacts(model)
    registry.register(MODEL, {**manifest, "algorithm": "federated-forest"}, tables)
    registry.register(MODEL, {**manifest, "algorithm": "someone-elses-forest"}, tables)
    assert registry.load(MODEL, "v0001")[0]["algorithm"] == "federated-forest"  # the signed file, as stored
    assert registry.describe(MODEL, "v0001")["algorithm"] == "forest"
    assert registry.describe(MODEL, "v0002")["algorithm"] == "someone-elses-forest"  # unknown: as stored


# -- numbering and aliases --------------------------------------------------------------------------
def test_versions_are_numbered_and_latest_follows(registry, model):
    assert registry.versions(MODEL) == []
    assert _register(registry, model, 0.8) == "v0001"
    assert _register(registry, model, 0.9) == "v0002"
    assert registry.versions(MODEL) == ["v0001", "v0002"]
    assert registry.models() == [MODEL]
    assert registry.aliases(MODEL) == {"latest": "v0002"}
    manifest, tables = registry.load(MODEL)
    assert (manifest["model_name"], manifest["version"], manifest["metrics"]) == (MODEL, "v0002",
                                                                                  {"accuracy": 0.9})
    assert registry.load(MODEL, "v0001")[0]["metrics"] == {"accuracy": 0.8}
    assert registry.load(MODEL, "1")[0]["version"] == "v0001"
    structure = structure_from_table(tables["master"], manifest["n_trees"])
    for field in ("tree", "node", "left", "right", "owner", "value"):
        assert np.array_equal(getattr(structure, field), getattr(model.master_.structure, field))


def test_unknown_refs_and_models_are_clear(registry, model):
    with pytest.raises(ArtifactError, match="no versions of model 'credit'"):
        registry.load(MODEL)
    _register(registry, model)
    with pytest.raises(ArtifactError, match="has no version 'v0007' .*versions: v0001"):
        registry.load(MODEL, "v0007")
    with pytest.raises(ArtifactError, match="has no alias or version 'production'"):
        registry.load(MODEL, "production")
    with pytest.raises(ArtifactError, match="not a safe directory name"):
        registry.versions("../elsewhere")


def test_promote_and_rollback_keep_a_history(registry, model):
    for _ in range(3):
        _register(registry, model)
    with pytest.raises(ArtifactError, match="no 'production' version to roll back"):
        registry.rollback(MODEL)
    for version in ("v0001", "v0002", "v0003"):
        assert registry.promote(MODEL, version) == version
    assert registry.load(MODEL, "production")[0]["version"] == "v0003"
    assert [h["version"] for h in registry.history(MODEL)] == ["v0001", "v0002", "v0003"]
    assert registry.rollback(MODEL) == "v0002"
    assert registry.rollback(MODEL) == "v0001"
    with pytest.raises(ArtifactError, match=r"'production' \(v0001\) has no earlier version"):
        registry.rollback(MODEL)
    assert registry.aliases(MODEL) == {"latest": "v0003", "production": "v0001"}
    log = registry.alias_log(MODEL)
    assert [(e["action"], e["version"]) for e in log] == [
        ("promote", "v0001"), ("promote", "v0002"), ("promote", "v0003"), ("rollback", "v0002"),
        ("rollback", "v0001")]
    assert {e["by"]["key_id"] for e in log} == {signing.key_id(registry.signing_key)}
    assert registry.promote(MODEL, "latest", alias="staging") == "v0003"
    with pytest.raises(ArtifactError, match="cannot be promoted to"):
        registry.promote(MODEL, "v0001", alias="latest")


def test_withdraw_takes_back_an_unpromoted_version(registry, model):
    _register(registry, model, 0.8)
    registry.promote(MODEL, "v0001")
    _register(registry, model, 0.9)
    registry.withdraw(MODEL, "v0002")
    assert registry.versions(MODEL) == ["v0001"]
    assert registry.aliases(MODEL) == {"latest": "v0001", "production": "v0001"}
    withdrawn = [p for p in (registry.root / MODEL).iterdir() if p.name.startswith(".withdrawn-v0002-")]
    assert len(withdrawn) == 1
    with pytest.raises(ArtifactError,
                       match="model 'credit' v0001 is production; roll back before withdrawing"):
        registry.withdraw(MODEL, "v0001")
    assert _register(registry, model, 0.7) == "v0002"
    assert registry.load(MODEL, "v0002")[0]["metrics"] == {"accuracy": 0.7}


def test_only_registry_files_are_left_behind(registry, model):
    _register(registry, model)
    registry.promote(MODEL, "v0001")
    assert sorted(p.name for p in (registry.root / MODEL).iterdir()) == [".lock", "aliases.log", "v0001"]


def test_manifest_must_be_plain_json(registry, model):
    manifest, tables = master_artifacts(model)
    manifest["metrics"] = {"accuracy": np.float32(0.5)}
    with pytest.raises(ArtifactError, match="not plain JSON"):
        registry.register(MODEL, manifest, tables)
    assert registry.versions(MODEL) == []


# -- signatures and tampering -----------------------------------------------------------------------
def test_signed_versions_verify_and_describe(signed, model, key):
    _register(signed, model)
    manifest, _ = signed.load(MODEL)
    assert manifest["signature"]["key_id"] == signing.key_id(key)
    info = signed.describe(MODEL)
    assert info["signature"] == f"valid (trusted key {signing.key_id(key)})"
    assert info["integrity"] == "ok"
    assert (info["version"], info["aliases"], info["algorithm"], info["metrics"]) == (
        "v0001", ["latest"], "forest", {"accuracy": 0.9})
    assert [p["name"] for p in info["parties"]] == ["party0", "party1"]
    untrusting = ModelRegistry(signed.root)  # no trusted key: nothing loads
    with pytest.raises(ArtifactError, match="no trusted master key configured"):
        untrusting.load(MODEL)
    assert untrusting.describe(MODEL)["integrity"].startswith("FAILED: ")
    inspector = ModelRegistry(signed.root, trust_any_key=True)  # inspection: the embedded key, said loudly
    assert inspector.describe(MODEL)["signature"].startswith("valid (embedded key")
    assert "NOT TRUSTED" in inspector.describe(MODEL)["signature"]


def test_tampered_table_byte_is_refused(signed, model):
    _register(signed, model)
    path = signed.root / MODEL / "v0001" / "master.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError,
                       match=r"model 'credit' v0001 refused: .*v0001/master.arrow: contents do not match"):
        signed.load(MODEL)
    assert signed.describe(MODEL)["integrity"].startswith("FAILED: model 'credit' v0001 refused")
    with pytest.raises(ArtifactError, match="master.arrow"):
        signed.promote(MODEL, "v0001")
    assert "production" not in signed.aliases(MODEL)


def test_tampered_manifest_is_refused(signed, model):
    _register(signed, model)
    path = signed.root / MODEL / "v0001" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["metrics"]["accuracy"] = 0.99
    path.write_text(json.dumps(manifest, indent=2))
    with pytest.raises(ArtifactError,
                       match=r"v0001 refused: .*v0001/manifest.json: signature does not verify"):
        signed.load(MODEL)
    assert signed.describe(MODEL)["signature"].startswith("INVALID: ")


def test_wrong_public_key_is_refused(signed, model, tmp_path):
    _register(signed, model)
    other = signing.generate_signing_key(tmp_path / "other.pem")
    reader = ModelRegistry(signed.root, public_key=other.public_key())
    with pytest.raises(ArtifactError,
                       match=f"signed by key .*not by the trusted key {signing.key_id(other)}"):
        reader.load(MODEL)


def test_trusted_key_requires_a_signature(model, key, tmp_path):
    _register(ModelRegistry(tmp_path / "unsigned"), model)  # a writer without a signing key
    reader = ModelRegistry(tmp_path / "unsigned", public_key=key.public_key())
    with pytest.raises(ArtifactError,
                       match="v0001/manifest.json: not signed, but this registry requires a signature "
                             f"by key {signing.key_id(key)}"):
        reader.load(MODEL)
    with pytest.raises(ArtifactError, match="not signed, but this registry requires a signature"):
        # no key at all: refused too, not accepted by default
        ModelRegistry(tmp_path / "unsigned").load(MODEL)
    inspector = ModelRegistry(tmp_path / "unsigned", trust_any_key=True)
    assert inspector.load(MODEL)[0]["version"] == "v0001"
    assert inspector.describe(MODEL)["signature"] == "unsigned (accepted: --trust-any-key)"


def test_a_manifest_re_signed_with_another_key_is_refused(signed, model, tmp_path):
    """The issue's attack: edit the accuracy, re-sign with one's own key (the embedded key then matches)."""
    _register(signed, model)
    path = signed.root / MODEL / "v0001" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["metrics"]["accuracy"] = 0.9483
    forger = signing.generate_signing_key(tmp_path / "forger.pem")
    manifest["signature"] = signing.signer(forger)(artifacts.manifest_bytes(manifest))
    path.write_text(json.dumps(manifest, indent=2))
    with pytest.raises(ArtifactError,
                       match=f"signed by key {signing.key_id(forger)}, not by the trusted key"):
        signed.load(MODEL)
    with pytest.raises(ArtifactError, match="not by the trusted key"):
        signed.promote(MODEL, "v0001")
    assert signed.describe(MODEL)["signature"].startswith("INVALID: ")
    assert "production" not in signed.aliases(MODEL)


def test_a_version_copied_under_another_number_is_refused(signed, model):
    _register(signed, model)
    shutil.copytree(signed.root / MODEL / "v0001", signed.root / MODEL / "v0002")
    with pytest.raises(ArtifactError, match="says model 'credit' version 'v0001'; a version moved or copied"):
        signed.load(MODEL, "v0002")


# -- institution registries -------------------------------------------------------------------------
def test_institution_keeps_its_partial_table_and_the_signed_master_manifest(signed, model, key, tmp_path):
    version = _register(signed, model)
    master_manifest = signed.read_manifest(MODEL, version)
    party = model.parties_[1]
    bank = ModelRegistry(tmp_path / "bank", public_key=signing.public_key_pem(key))
    manifest = {"party": party.name, "master_manifest": master_manifest,
                "parties": [{"name": party.name, "role": "passive", "file": f"{party.name}.arrow"}]}
    assert bank.register(MODEL, manifest, {party.name: party_table(party.model)}, version=version) == "v0001"
    loaded, tables = bank.load(MODEL)
    assert list(tables) == [party.name] and loaded["parties"][0]["sha256"]
    assert bank.describe(MODEL)["signature"].startswith("master manifest copy: valid (trusted key")

    path = bank.root / MODEL / "v0001" / "manifest.json"
    edited = json.loads(path.read_text())
    edited["master_manifest"]["metrics"]["accuracy"] = 0.5
    path.write_text(json.dumps(edited))
    with pytest.raises(ArtifactError, match="manifest.json 'master_manifest': signature does not verify"):
        bank.load(MODEL)
    with pytest.raises(ArtifactError, match="already has a version v0001"):
        bank.register(MODEL, manifest, {party.name: party_table(party.model)}, version=1)


# -- concurrency and crashes ------------------------------------------------------------------------
def test_concurrent_writers_get_distinct_versions(signed, model):
    manifest, tables = master_artifacts(model)
    start = threading.Barrier(2)
    results: list[str] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            start.wait()
            for _ in range(3):
                results.append(signed.register(MODEL, manifest, tables))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(results) == [f"v{i:04d}" for i in range(1, 7)]
    assert signed.versions(MODEL) == sorted(results)
    assert signed.aliases(MODEL)["latest"] == "v0006"


def test_crash_mid_write_leaves_no_version(signed, model, monkeypatch):
    _register(signed, model)
    signed.promote(MODEL, "v0001")
    real_write = artifacts._write_bytes

    def crash_on_manifest(path, data):
        if path.name == "manifest.json":
            raise OSError("disk full")
        real_write(path, data)

    monkeypatch.setattr(artifacts, "_write_bytes", crash_on_manifest)
    with pytest.raises(OSError, match="disk full"):
        _register(signed, model)
    monkeypatch.undo()
    assert signed.versions(MODEL) == ["v0001"]
    assert signed.aliases(MODEL) == {"latest": "v0001", "production": "v0001"}
    assert not [p for p in (signed.root / MODEL).iterdir() if ".tmp-" in p.name]
    assert signed.load(MODEL)[0]["version"] == "v0001"
    assert _register(signed, model) == "v0002"


def test_leftovers_of_a_hard_crash_are_never_listed(signed, model):
    _register(signed, model)
    model_dir = signed.root / MODEL
    leftover = model_dir / ".v0002.tmp-abc123"  # killed before the rename
    leftover.mkdir()
    (leftover / "master.arrow").write_bytes(b"partial")
    (model_dir / "v0002").mkdir()  # a directory without manifest.json (e.g. a broken manual copy)
    (model_dir / "v0002" / "master.arrow").write_bytes(b"partial")
    assert signed.versions(MODEL) == ["v0001"]
    with pytest.raises(ArtifactError, match="has no version 'v0002'"):
        signed.load(MODEL, "v0002")
    assert _register(signed, model) == "v0003"  # never reuses a taken directory name
    assert signed.versions(MODEL) == ["v0001", "v0003"]
    assert signed.load(MODEL, "v0001")[0]["version"] == "v0001"
