"""The signed alias log.

Hand edits, removed or reordered entries, foreign keys and old unsigned alias files never change what an alias
resolves to silently.
"""

from __future__ import annotations

import json

import pytest

from fedcore.errors import ArtifactError
from fedcore.models import aliases, signing
from fedcore.models.registry import ModelRegistry
from tests.models.test_registry import MODEL, fit_model, master_artifacts


@pytest.fixture(scope="module")
def model():
    return fit_model()


@pytest.fixture
def key(tmp_path):
    return signing.generate_signing_key(tmp_path / "keys" / "master.pem")


@pytest.fixture
def registry(tmp_path, key, model) -> ModelRegistry:
    """Three versions; production promoted v0001, v0002, v0003 (three signed entries)."""
    registry = ModelRegistry(tmp_path / "registry", signing_key=key)
    for accuracy in (0.8, 0.85, 0.9):
        registry.register(MODEL, *master_artifacts(model, accuracy))
    for version in ("v0001", "v0002", "v0003"):
        registry.promote(MODEL, version)
    return registry


def _log_path(registry: ModelRegistry):
    return registry.root / MODEL / aliases.LOG_FILE


def _entries(registry: ModelRegistry) -> list[dict]:
    return [json.loads(line) for line in _log_path(registry).read_text().splitlines()]


def _write(registry: ModelRegistry, entries: list[dict]) -> None:
    _log_path(registry).write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))


def test_each_entry_says_who_moved_which_alias_when(registry, key):
    log = registry.alias_log(MODEL)
    assert [(e["seq"], e["action"], e["alias"], e["version"]) for e in log] == [
        (1, "promote", "production", "v0001"), (2, "promote", "production", "v0002"),
        (3, "promote", "production", "v0003")]
    assert all(e["by"]["key_id"] == signing.key_id(key) and e["by"]["user"] and e["by"]["host"] for e in log)
    assert log[0]["previous"] is None and all(e["previous"] for e in log[1:])
    assert registry.resolve(MODEL, "production") == "v0003"
    assert [h["version"] for h in registry.history(MODEL)] == ["v0001", "v0002", "v0003"]


def test_a_hand_edited_entry_is_refused(registry):
    entries = _entries(registry)
    entries[-1]["version"] = "v0002"  # the edit: production quietly pointed elsewhere
    _write(registry, entries)
    with pytest.raises(ArtifactError, match="aliases.log line 3: signature does not verify"):
        registry.resolve(MODEL, "production")
    with pytest.raises(ArtifactError, match="line 3"):
        registry.promote(MODEL, "v0001")  # nothing is appended to a broken log
    assert registry.resolve(MODEL, "v0002") == "v0002"  # explicit versions never depend on the alias log


def test_removed_and_reordered_entries_are_refused(registry):
    entries = _entries(registry)
    _write(registry, [entries[0], entries[2]])
    with pytest.raises(ArtifactError, match="line 2: entry 3 where entry 2 belongs"):
        registry.aliases(MODEL)
    renumbered = [entries[0], {**entries[2], "seq": 2}]  # renumbering breaks the signature instead
    _write(registry, renumbered)
    with pytest.raises(ArtifactError, match="line 2: (does not follow|signature does not verify)"):
        registry.aliases(MODEL)
    _write(registry, [entries[1], entries[0], entries[2]])
    with pytest.raises(ArtifactError, match="line 1: entry 2 where entry 1 belongs"):
        registry.aliases(MODEL)


def test_an_entry_signed_by_another_key_is_refused(registry, tmp_path, model):
    forger = ModelRegistry(registry.root, signing_key=signing.generate_signing_key(tmp_path / "forger.pem"),
                           trust_any_key=True)
    entries = registry.alias_log(MODEL)
    aliases.append_entry(registry.root / MODEL, entries, "promote", "production", "v0001", forger.signing_key)
    with pytest.raises(ArtifactError,
                       match="line 4: signature does not verify: the manifest was signed by key"):
        registry.resolve(MODEL, "production")
    # an institution's view: same refusal
    reader = ModelRegistry(registry.root, public_key=registry.public_key)
    with pytest.raises(ArtifactError, match="line 4"):
        reader.aliases(MODEL)


def test_an_unsigned_alias_file_of_an_older_version_is_not_trusted(tmp_path, key, model):
    registry = ModelRegistry(tmp_path / "registry", signing_key=key)
    registry.register(MODEL, *master_artifacts(model, 0.8))
    registry.register(MODEL, *master_artifacts(model, 0.9))
    legacy = registry.root / MODEL / "aliases.json"
    legacy.write_text(json.dumps({"aliases": {"latest": "v0002", "production": "v0001"}}))
    with pytest.raises(ArtifactError,
                       match="unsigned aliases \\(production\\) from an older fedforest are not "
                             "trusted; promote the version again"):
        registry.resolve(MODEL, "production")
    assert registry.resolve(MODEL, "latest") == "v0002"
    assert registry.promote(MODEL, "v0001") == "v0001"  # starts the signed log, the old file goes
    assert not legacy.exists() and registry.aliases(MODEL) == {"latest": "v0002", "production": "v0001"}


def test_only_the_signing_key_moves_aliases(registry, key):
    reader = ModelRegistry(registry.root, public_key=key.public_key())
    with pytest.raises(ArtifactError, match="moving an alias needs the master's signing key"):
        reader.promote(MODEL, "v0001")
    with pytest.raises(ArtifactError, match="moving an alias needs the master's signing key"):
        reader.rollback(MODEL)
    assert reader.resolve(MODEL, "production") == "v0003"


def test_a_signing_key_that_is_not_the_trusted_key_is_refused(tmp_path, key):
    other = signing.generate_signing_key(tmp_path / "other.pem")
    with pytest.raises(ArtifactError, match="the signing key .* is not the trusted key"):
        ModelRegistry(tmp_path / "registry", signing_key=other, public_key=key.public_key())
