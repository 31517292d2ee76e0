"""`privacy: paillier` and `privacy: ou` through the whole retrain flow.

Agents over Flight with mutual TLS: the registered tables are byte for byte those of the plain run, and the
manifest records the mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedcore.config import load_config
from fedcore.errors import ConfigError
from fedcore.models.registry import ModelRegistry
from flows.retrain import retrain
from tests.federations import small_federation

pytestmark = pytest.mark.slow
MODEL = "retail-response"
PARAMS = {"n_estimators": 4, "max_depth": 4}


def _registry(work, name: str = "master") -> ModelRegistry:
    """A registry of the demo federation in `work`, trusting the master's public key as institutions do."""
    return ModelRegistry(work / "registry" / name, public_key=work / "keys" / "master.key.pub")


def _tables(work: Path, version: str) -> dict[str, bytes]:
    return {f"{folder.parents[1].name}/{table.name}": table.read_bytes()
            for folder in sorted((work / "registry").glob(f"*/{MODEL}/{version}"))
            for table in folder.glob("*.arrow")}


def _set_privacy(config_path: Path, privacy) -> None:
    raw = yaml.safe_load(config_path.read_text())
    raw["privacy"] = privacy
    config_path.write_text(yaml.safe_dump(raw))


def _federation(work: Path, privacy) -> Path:
    config_path, _ = small_federation(work, 500, seed=8, params=PARAMS)
    _set_privacy(config_path, privacy)
    return config_path


def test_encrypted_label_retrains_register_the_plain_model(tmp_path) -> None:
    config_path = _federation(tmp_path, "none")  # one federation: same consortium key, so same feature ids
    assert retrain(str(config_path), agents="local", predict=False)["version"] == "v0001"
    registry = _registry(tmp_path)
    assert registry.load(MODEL, "v0001")[0]["params"]["privacy"] == "none"
    plain = _tables(tmp_path, "v0001")
    assert len(plain) == 4  # master plus three institutions
    for version, privacy, key_bits in (("v0002", {"mode": "paillier", "key_bits": 2048}, 2048),
                                       ("v0003", {"mode": "ou"}, 3072)):  # Okamoto-Uchiyama's default size
        _set_privacy(config_path, privacy)
        assert retrain(str(config_path), agents="local", predict=False)["version"] == version
        assert list(_tables(tmp_path, version).values()) == list(plain.values())
        manifest, _ = registry.load(MODEL, version)
        assert (manifest["params"]["privacy"], manifest["params"]["key_bits"]) == (privacy["mode"], key_bits)


def test_paillier_settings_are_checked(tmp_path) -> None:
    config_path = _federation(tmp_path, {"mode": "paillier", "key_bits": 1024})
    with pytest.raises(ConfigError, match=r"privacy: key_bits must be one of \(2048, 3072\) for privacy "
                                          r"'paillier' \(Paillier modulus sizes\), got 1024"):
        load_config(config_path)
    raw = yaml.safe_load(config_path.read_text())
    raw["privacy"], raw["params"]["privacy"] = "none", "paillier"
    config_path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="set label protection in the 'privacy:' section"):
        load_config(config_path)
