"""`fedforest models ...` run in-process: tables, JSON, promote/rollback, keygen and one-line errors."""

from __future__ import annotations

import json
import stat

import pytest
import yaml

from fedcore.cli import main
from fedcore.models import signing
from fedcore.models.artifacts import manifest_bytes
from fedcore.models.registry import ModelRegistry
from tests.models.test_registry import MODEL, fit_model, master_artifacts


@pytest.fixture(scope="module")
def model():
    return fit_model()


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "master.pem"
    signing.generate_signing_key(path)  # and master.pem.pub
    return path


@pytest.fixture
def registry(tmp_path, key_file, model) -> ModelRegistry:
    registry = ModelRegistry(tmp_path / "registry", signing_key=key_file)
    for accuracy in (0.81, 0.86):
        registry.register(MODEL, *master_artifacts(model, accuracy))
    return registry


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["models", *(str(a) for a in argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _read(capsys, registry, *argv) -> tuple[int, str, str]:
    """list/show trusting the master's public key (master.pem.pub beside the signing key)."""
    return _run(capsys, *argv, "--registry", registry.root, "--public-key", _public(registry))


def _move(capsys, registry, *argv) -> tuple[int, str, str]:
    """promote/rollback with the master's signing key."""
    return _run(capsys, *argv, "--registry", registry.root, "--signing-key",
                registry.root.parent / "master.pem")


def _public(registry):
    return registry.root.parent / "master.pem.pub"


def test_list_models_and_versions(capsys, registry):
    code, out, _ = _read(capsys, registry, "list")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["model", "versions", "latest", "production"]
    assert row.split() == [MODEL, "2", "v0002", "-"]

    code, out, _ = _read(capsys, registry, "list", "--model", MODEL)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["version", "created_at", "algorithm", "aliases", "metrics",
                                              "signature", "integrity"]
    tokens = lines[2].split()
    assert tokens[0] == "v0002" and tokens[-2:] == ["valid", "ok"]
    assert {"forest", "latest", "accuracy=0.86"} <= set(tokens)

    code, out, _ = _read(capsys, registry, "list", "--model", MODEL, "--json")
    assert [row["version"] for row in json.loads(out)] == ["v0001", "v0002"]


def test_list_names_uncommitted_versions_without_listing_them(capsys, registry, model):
    registry.register(MODEL, *master_artifacts(model, 0.9), pending=True)  # a run killed while registering
    code, out, _ = _read(capsys, registry, "list", "--model", MODEL)
    lines = out.splitlines()
    assert code == 0 and [line.split()[0] for line in lines[1:3]] == ["v0001", "v0002"]
    assert lines[4] == (f"{MODEL}: uncommitted v0003 (a run stopped before every institution stored it; not "
                        "listed, and withdrawn everywhere by the next retrain)")
    code, _, err = _move(capsys, registry, "promote", "--model", MODEL, "--version", "v0003")
    assert code != 0 and "has no version 'v0003'" in err


def test_list_an_empty_registry(capsys, tmp_path, key_file):
    code, out, _ = _run(capsys, "list", "--registry", tmp_path / "nothing", "--public-key", f"{key_file}.pub")
    assert code == 0 and out.startswith("no models in")


def test_without_a_trusted_key_nothing_is_shown_or_moved(capsys, registry):
    """No key is not a default: reading needs the master's public key, moving an alias its signing key."""
    for action in (["list"], ["show", "--model", MODEL]):
        code, out, err = _run(capsys, *action, "--registry", registry.root)
        assert (code, out) == (1, "") and err.count("\n") == 1
        assert "no trusted key: pass --config federation.yaml or --public-key FILE" in err
    code, _, err = _run(capsys, "promote", "--registry", registry.root, "--model", MODEL,
                        "--version", "v0001", "--public-key", _public(registry))
    assert code == 1 and "moving an alias needs the master's signing key" in err
    assert "production" not in registry.aliases(MODEL)


def test_trust_any_key_inspects_loudly(capsys, registry, tmp_path, model):
    """The issue's attack (accuracy edited, re-signed with another key) fails with the trusted key.

    It is only 'valid' under --trust-any-key, which warns that nothing is proven.
    """
    path = registry.root / MODEL / "v0002" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["metrics"]["accuracy"] = 0.9483
    forger = signing.generate_signing_key(tmp_path / "forger.pem")
    manifest["signature"] = signing.signer(forger)(manifest_bytes(manifest))
    path.write_text(json.dumps(manifest))
    code, out, _ = _read(capsys, registry, "show", "--model", MODEL)
    assert code == 1 and "not by the trusted key" in out
    code, _, err = _move(capsys, registry, "promote", "--model", MODEL, "--version", "v0002")
    assert code == 1 and "not by the trusted key" in err
    code, out, err = _run(capsys, "show", "--registry", registry.root, "--model", MODEL, "--trust-any-key")
    assert code == 0 and "NOT TRUSTED" in out
    assert err.startswith("WARNING: --trust-any-key: no trusted key;")


def test_config_names_the_registry_and_the_keys(capsys, registry, tmp_path):
    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump({
        "federation": "f", "consortium_key": {"env": "UNUSED"}, "institutions": [
            {"name": "bank", "data": "bank.parquet", "id_column": "id", "label": "y",
             "endpoint": "grpc+tls://127.0.0.1:1"}],
        "master": {"registry": "registry", "signing_key": "master.pem"}}))  # public key: master.pem.pub
    code, out, _ = _run(capsys, "list", "--config", config, "--model", MODEL)
    assert code == 0 and out.splitlines()[1].split()[-2:] == ["valid", "ok"]
    code, out, _ = _run(capsys, "promote", "--config", config, "--model", MODEL, "--version", "v0002")
    assert (code, out) == (0, f"{MODEL}: production -> v0002\n")
    code, out, _ = _run(capsys, "list", "--config", config, "--model", MODEL)
    lines = out.splitlines()
    log = lines[lines.index("alias log (each entry signed by the master's key):") + 1:]
    assert log[0].split() == ["at", "action", "alias", "version", "by", "key"]
    row = log[1].split()
    assert row[2:5] == ["promote", "production", "v0002"] and "@" in row[5]
    assert row[6] == signing.key_id(registry.signing_key)
    code, out, _ = _run(capsys, "list", "--config", config, "--model", MODEL, "--json")
    moves = {row["version"]: row["alias_moves"] for row in json.loads(out)}
    assert moves["v0001"] == [] and [m["action"] for m in moves["v0002"]] == ["promote"]


def test_show_text_and_json(capsys, registry, key_file):
    code, out, _ = _read(capsys, registry, "show", "--model", MODEL, "--version", "v0001")
    assert code == 0
    assert out.splitlines()[0] == f"{MODEL} v0001"
    assert "signature:  valid (trusted key" in out and "integrity:  ok" in out
    assert "party0" in out and "master.arrow" in out and "accuracy=0.81" in out

    code, out, _ = _read(capsys, registry, "show", "--model", MODEL, "--json")
    info = json.loads(out)
    assert (info["version"], info["aliases"], info["integrity"]) == ("v0002", ["latest"], "ok")


def test_show_writes_the_versions_pictures(capsys, registry, tmp_path):
    """--pictures: the metric across versions, up to the one shown (v0001 has one point, v0002 two)."""
    from tests.models.test_pictures import series

    code, out, err = _read(capsys, registry, "show", "--model", MODEL, "--version", "v0001", "--metric",
                           "accuracy", "--pictures", tmp_path / "pictures")
    assert code == 0 and "v0001-history.svg" in err
    assert series((tmp_path / "pictures" / f"{MODEL}-v0001-history.svg").read_text()).tolist() == [[0, 0.81]]
    code, out, err = _read(capsys, registry, "show", "--model", MODEL, "--metric", "accuracy", "--pictures",
                           tmp_path / "pictures")
    assert err.strip() == f"wrote 1 pictures into {tmp_path / 'pictures'}: {MODEL}-v0002-history.svg"
    assert series((tmp_path / "pictures" / f"{MODEL}-v0002-history.svg").read_text()).tolist() == [
        [0, 0.81], [1, 0.86]]


def test_show_lists_the_importances_each_registry_holds(capsys, model, key_file, tmp_path):
    """The master's copy: each institution's share; an institution's copy: its own features' (issue #33)."""
    from fedcore.models.tables import party_table
    from tests.models.test_registry import master_artifacts

    importances = model.feature_importances_  # {party: its own features' importances}
    manifest, tables = master_artifacts(model)
    for party in manifest["parties"]:
        party["importance_share"] = float(importances[party["name"]].sum())
    master = ModelRegistry(tmp_path / "master", signing_key=key_file)
    version = master.register(MODEL, manifest, tables)
    code, out, _ = _run(capsys, "show", "--model", MODEL, "--registry", master.root, "--public-key",
                        f"{key_file}.pub")
    assert code == 0 and "importance_share" in out and "importances of" not in out
    for party in manifest["parties"]:
        assert f"{party['importance_share']:.4f}" in out
    assert not any(feature in out for own in importances.values() for feature in own.index)

    party = model.parties_[0]
    own = {k: float(v) for k, v in importances[party.name].items()}
    copy = ModelRegistry(tmp_path / party.name, public_key=f"{key_file}.pub")
    copy.register(MODEL, {"institution": party.name, "master_manifest": master.read_manifest(MODEL, version),
                          "importances": own}, {party.name: party_table(party.model)}, version=version)
    code, out, _ = _run(capsys, "show", "--model", MODEL, "--registry", copy.root, "--public-key",
                        f"{key_file}.pub")
    assert code == 0 and "  algorithm:  forest" in out and "accuracy=0.9" in out  # the master's manifest
    lines = out.splitlines()
    start = lines.index(f"  importances of this institution's own features (they never left it), summing to "
                        f"{sum(own.values()):.4f}:")
    ranked = sorted(own.items(), key=lambda item: (-item[1], item[0]))
    assert [line.split() for line in lines[start + 2:start + 2 + len(own)]] == [
        [name, f"{round(value, 6):.4f}"] for name, value in ranked]  # the card's table, to 4 digits
    others = [feature for name, series in importances.items() if name != party.name
              for feature in series.index]
    assert others and not any(feature in out for feature in others)
    code, out, _ = _run(capsys, "show", "--model", MODEL, "--registry", copy.root, "--public-key",
                        f"{key_file}.pub", "--json")
    assert json.loads(out)["importances"] == own


def test_show_reports_tampering(capsys, registry):
    path = registry.root / MODEL / "v0002" / "manifest.json"
    path.write_text(path.read_text().replace("0.86", "0.99"))
    code, out, _ = _read(capsys, registry, "show", "--model", MODEL)
    assert code == 1
    assert "signature:  INVALID: " in out and "integrity:  FAILED: " in out
    code, out, _ = _read(capsys, registry, "show", "--model", MODEL, "--json")
    assert code == 1 and json.loads(out)["integrity"].startswith("FAILED: ")


def test_list_checks_every_file_not_only_the_signature(capsys, registry):
    arrow = registry.root / MODEL / "v0001" / "master.arrow"
    data = bytearray(arrow.read_bytes())
    data[-20] ^= 0xFF  # one flipped byte: the signature still verifies, the file's SHA-256 does not
    arrow.write_bytes(bytes(data))
    code, out, _ = _read(capsys, registry, "list", "--model", MODEL)
    lines = out.splitlines()
    assert code == 1
    assert lines[0].split()[-2:] == ["signature", "integrity"]
    assert lines[1].split()[0] == "v0001" and lines[1].split()[-2:] == ["valid", "FAILED"]
    assert lines[2].split()[0] == "v0002" and lines[2].split()[-2:] == ["valid", "ok"]
    assert lines[3] == "checked: each version's signature and the SHA-256 of every file it lists"


def test_promote_and_rollback(capsys, registry):
    assert _move(capsys, registry, "promote", "--model", MODEL, "--version", "v0001")[:2] == (
        0, f"{MODEL}: production -> v0001\n")
    assert _move(capsys, registry, "promote", "--model", MODEL, "--version", "2")[1] == (
        f"{MODEL}: production -> v0002\n")
    code, out, _ = _move(capsys, registry, "rollback", "--model", MODEL)
    assert (code, out) == (0, f"{MODEL}: production rolled back to v0001\n")
    assert registry.aliases(MODEL)["production"] == "v0001"

    code, out, err = _move(capsys, registry, "rollback", "--model", MODEL)
    assert code == 1 and out == ""
    assert err.startswith("fedforest: error: ") and "no earlier version" in err and err.count("\n") == 1


def test_errors_are_one_line(capsys, registry, tmp_path):
    code, _, err = _move(capsys, registry, "promote", "--model", MODEL, "--version", "v0009")
    assert code == 1 and "has no version 'v0009'" in err and err.count("\n") == 1
    other = tmp_path / "other.pem"
    signing.generate_signing_key(other)
    code, _, err = _run(capsys, "promote", "--registry", registry.root, "--model", MODEL,
                        "--version", "v0001", "--signing-key", other)
    assert code == 1 and "not by the trusted key" in err and err.count("\n") == 1
    code, _, err = _move(capsys, registry, "promote", "--model", MODEL, "--version", "v0001",
                         "--public-key", other)
    assert code == 1 and "is not the trusted key" in err and err.count("\n") == 1
    code, _, err = _read(capsys, registry, "show", "--model", "nope")
    assert code == 1 and "no versions of model 'nope'" in err


def test_keygen_writes_a_private_and_a_public_key(capsys, tmp_path):
    out_file = tmp_path / "keys" / "signing.pem"
    code, out, _ = _run(capsys, "keygen", "--out", out_file)
    assert code == 0 and "key id" in out
    assert stat.S_IMODE(out_file.stat().st_mode) == 0o600
    key = signing.load_signing_key(out_file)
    public = signing.load_public_key(tmp_path / "keys" / "signing.pem.pub")
    assert signing.key_id(public) == signing.key_id(key)
    code, _, err = _run(capsys, "keygen", "--out", out_file)
    assert code == 1 and "refusing to overwrite" in err
