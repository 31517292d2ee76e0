"""`--format structure`: what a registry holds of a version, as JSON, row for row.

A vertical version cannot run outside the federation, but its tables can be read elsewhere: the master's copy
gives the structure and node values and nothing of any party's features; an institution's copy gives its own
splits only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedcore.cli import main
from fedcore.data.datasets import make_waveform
from fedcore.models import signing
from fedcore.models.registry import ModelRegistry
from fedcore.models.structure_export import STRUCTURE_FORMAT
from fedcore.models.tables import master_table, party_table
from fedcore.vertical.estimators import FederatedForestClassifier

FEATURES = {"bank": ["x1", "x2", "x3"], "shop": ["x4", "x5", "x6"]}
MANIFEST = {"algorithm": "forest", "setting": "vertical", "task": "classification",
            "metrics": {"accuracy": 0.9}}


@pytest.fixture(scope="module")
def forest() -> FederatedForestClassifier:
    table = make_waveform(400, random_state=1)
    parties = {"bank": table[[*FEATURES["bank"], "class"]], "shop": table[FEATURES["shop"]]}
    return FederatedForestClassifier(4, max_depth=4, random_state=2).fit(parties, label="class")


def _registry(root, key, tables) -> ModelRegistry:
    registry = ModelRegistry(root, signing_key=key)
    registry.register("credit", dict(MANIFEST), tables)
    return registry


def _export(capsys, registry: ModelRegistry, key, out) -> tuple[int, str, dict]:
    code = main(["models", "export", "--registry", str(registry.root), "--public-key", f"{key}.pub",
                 "--model", "credit", "--format", "structure", "--out", str(out)])
    printed = capsys.readouterr().out
    return code, printed, json.loads(out.read_text())


def test_the_masters_copy_exports_the_structure_and_nothing_of_the_features(forest, tmp_path, capsys) -> None:
    key = tmp_path / "master.pem"
    signing.generate_signing_key(key)
    structure = forest.master_.structure
    tables = {"master": master_table(structure, forest.master_.combination)}
    registry = _registry(tmp_path / "master", key, tables)
    code, printed, document = _export(capsys, registry, key, tmp_path / "credit.json")
    assert code == 0 and printed == (f"credit v0001: wrote {tmp_path / 'credit.json'} (structure: the tree "
                                     "tables this registry holds, as JSON; docs/design.md, Export)\n")
    assert (document["format"], document["model_name"], document["version"], document["setting"]) == (
        STRUCTURE_FORMAT, "credit", "v0001", "vertical")
    master = document["tables"]["master"]
    assert list(document["tables"]) == ["master"] and "threshold" not in master["columns"]
    rows = master["rows"]
    for name in ("tree", "node", "left", "right", "depth", "owner"):
        assert [row[name] for row in rows] == getattr(structure, name).tolist(), name
    values = np.array([row["value"] for row in rows])
    np.testing.assert_array_equal(values, structure.value)  # exact: JSON floats round-trip
    text = (tmp_path / "credit.json").read_text()
    assert not [name for names in FEATURES.values() for name in names if f'"{name}"' in text]


def test_an_institutions_copy_exports_its_own_splits_only(forest, tmp_path, capsys) -> None:
    key = tmp_path / "master.pem"
    signing.generate_signing_key(key)
    shop = next(p for p in forest.parties_ if p.name == "shop")
    registry = _registry(tmp_path / "shop", key, {"shop": party_table(shop.model)})
    code, _, document = _export(capsys, registry, key, tmp_path / "shop.json")
    assert code == 0 and list(document["tables"]) == ["shop"]
    rows = document["tables"]["shop"]["rows"]
    owned = shop.model.feature >= 0
    assert owned.any() and not owned.all()
    assert [row["feature"] for row in rows] == [shop.model.column_names[f] if f >= 0 else None
                                                for f in shop.model.feature]
    assert [row["threshold"] for row in rows] == [float(t) if o else None
                                                  for t, o in zip(shop.model.threshold, owned, strict=True)]
    assert {row["feature"] for row in rows} - {None} <= set(FEATURES["shop"])
    vocabulary = document["tables"]["shop"]["metadata"]["fedforest.columns"]
    assert [column["name"] for column in vocabulary] == FEATURES["shop"]
    assert not list(tmp_path.glob(".*.partial"))


def test_the_vertical_estimators_refuse_onnx_and_treelite_saying_why(forest) -> None:
    from fedcore.errors import ArtifactError

    for export in (forest.to_onnx, forest.to_treelite):
        with pytest.raises(ArtifactError) as refused:
            export()
        assert str(refused.value) == (
            "FederatedForestClassifier is a vertical model: its split thresholds stay at the institutions "
            "that own them, so it cannot run outside the federation (docs/design.md, Export): only "
            "horizontal models export to onnx or treelite")
