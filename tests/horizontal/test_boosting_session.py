"""Horizontal boosting deployed (issue #32): a config's agents and session grow the estimator's model.

The config (`setting: horizontal, algorithm: boosting`) gets its session and agents from the algorithm
registry (`tests.federations.horizontal_session_from_config`, in process, as `fedforest` deploys them); the
model they train equals, byte for byte, the one `HorizontalBoostingClassifier` / `Regressor` grows on the
same training rows with the same seed. The version is registered, stored at every institution, loaded and
predicted as a horizontal forest is, and the manifest and card state boosting's rounds instead of importances.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedcore.checkpoints import CHECKPOINTS
from fedcore.config import parse_config
from fedcore.contracts.agreement import shared_schema
from fedcore.contracts.model import dump_contract, infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.errors import PartyUnavailable, ProtocolError
from fedcore.horizontal.boosting import HorizontalBoostingClassifier, HorizontalBoostingRegressor
from fedcore.horizontal.boosting.session import HorizontalBoostingSession
from fedcore.horizontal.contracts import declared_feature_ranges
from fedcore.horizontal.model import HorizontalForest
from fedcore.models.artifacts import table_sha256
from fedcore.models.card import build_manifest, model_card
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Message
from tests.federations import horizontal_session_from_config
from tests.horizontal.common import DOMAIN_LIES, announce_parties, rewrite_domains
from tests.keys import master_key, master_public_key

NAMES = ("north", "south", "east")
PARAMS = {"n_estimators": 4, "max_depth": 3, "learning_rate": 0.5, "random_state": 7}
HOLDOUT = 0.25


def _table(task: str) -> pd.DataFrame:
    frame = make_waveform(900, random_state=3)
    if task == "classification":
        frame["class"] = frame["class"].map({0: "a", 1: "b", 2: "c"})
    else:  # a numeric label: the regressor's squared error
        frame["class"] = frame["x6"] * 2.0 - frame["x10"] + frame["class"]
    frame.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(frame))])
    return frame


def _federation(root: Path, task: str, privacy: str,
                compute: dict | None = None) -> tuple[object, dict[str, pd.DataFrame], dict]:
    """A horizontal boosting config over three institutions' files: (config, their rows, the contract).

    `compute`: north's `compute:` (its rows on its own Dask cluster, read there by the workers).
    """
    table = _table(task)
    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    (root / "contract.yaml").write_text(dump_contract(contract))
    parts = {}
    for name, part in zip(NAMES, split_horizontal(table, 3, seed=1), strict=True):
        parts[name] = part.reset_index(drop=True)
        parts[name].to_parquet(root / f"{name}.parquet")
        new = parts[name].sample(frac=0.3, random_state=2).drop(columns=["class"])
        new.to_parquet(root / f"{name}_new.parquet")
    institutions = [{"name": name, "id_column": "patient_id", "label": "class", "contract": "contract.yaml",
                     "data": f"{name}.parquet", "predict_data": f"{name}_new.parquet",
                     "registry": f"registry/{name}", "predictions": f"predictions/{name}"} for name in NAMES]
    if compute is not None:
        institutions[0]["compute"] = compute
    raw = {"federation": "waveform", "setting": "horizontal", "algorithm": "boosting", "privacy": privacy,
           "params": {**PARAMS, "task": task}, "consortium_key": {"env": "UNUSED"},
           "training": {"holdout": HOLDOUT}, "master": {"public_key": str(master_public_key(root))},
           "institutions": institutions}
    (root / "federation.yaml").write_text(yaml.safe_dump(raw))
    return parse_config(raw, root / "federation.yaml"), parts, contract


def _training_index(part: pd.DataFrame, name: str) -> pd.Index:
    """An institution's training rows: those the agent does not hold out (`HorizontalInstitutionAgent`)."""
    rng = np.random.default_rng(np.random.SeedSequence(PARAMS["random_state"],
                                                       spawn_key=(zlib.crc32(name.encode()),)))
    return part.index[~(rng.random(len(part)) < HOLDOUT)]


@pytest.mark.parametrize(("task", "privacy"), [("classification", "secagg"), ("classification", "none"),
                                               ("regression", "secagg")])
def test_a_deployed_run_grows_the_estimators_model_byte_for_byte(tmp_path, task, privacy) -> None:
    config, parts, contract = _federation(tmp_path, task, privacy)
    session = horizontal_session_from_config(config, record_transcript=True)
    assert isinstance(session, HorizontalBoostingSession) and session.privacy.mode == privacy
    session.agree_schema()
    facts = session.train()
    train = {name: part.loc[_training_index(part, name)].drop(columns=["patient_id"]).reset_index(drop=True)
             for name, part in parts.items()}
    declared = {name: r["train_rows"] for name, r in session.rows.items()}
    assert declared == {name: len(rows) for name, rows in train.items()}

    estimator = (HorizontalBoostingClassifier if task == "classification" else HorizontalBoostingRegressor)(
        PARAMS["n_estimators"], max_depth=PARAMS["max_depth"], learning_rate=PARAMS["learning_rate"],
        random_state=PARAMS["random_state"], secure_aggregation=privacy == "secagg",
        feature_ranges=declared_feature_ranges(shared_schema({"all": contract})))
    estimator.fit(train, label="class")
    assert table_sha256(session.model.to_table()) == table_sha256(estimator.model_.to_table())
    assert session.model.algorithm == "boosting" and facts.nodes == session.model.n_nodes
    # every institution holds that model: the manifest's digests are checked against the master's
    entries = session.manifest_entries()
    assert {p["table_sha256"] for p in entries["parties"]} == {table_sha256(session.model.to_table())}
    # the gain importances the master chose the splits by: the estimator's, to the bit
    assert list(entries["importances"]) == list(estimator.feature_names_in_)
    assert list(entries["importances"].values()) == estimator.feature_importances_.tolist()
    # secure aggregation: the master read only masked histograms; without it, the plain per-party sums
    kinds = {e.kind for e in session.transport.transcript if e.receiver == "master"}
    assert ("boost_masked" in kinds, "boost_plain" in kinds) == (privacy == "secagg", privacy == "none")


def test_a_boosting_version_is_stored_loaded_predicted_and_carded_as_a_forest(tmp_path) -> None:
    config, parts, _ = _federation(tmp_path, "classification", "secagg")
    session = horizontal_session_from_config(config)
    session.agree_schema()
    session.train()
    model, schema = session.model, session.schema
    metrics = session.evaluate()
    held = pd.concat([part[~part.index.isin(_training_index(part, name))] for name, part in parts.items()])
    predicted = np.asarray(schema.classes)[np.argmax(model.predict_values(schema.encode(held)), axis=1)]
    assert metrics["accuracy"] == pytest.approx(float(np.mean(predicted == held["class"].to_numpy())),
                                                abs=1e-12)

    manifest = build_manifest(session, "waveform", metrics, {})
    assert (manifest["algorithm"], manifest["setting"]) == ("boosting", "horizontal")
    assert sum(manifest["importances"].values()) == pytest.approx(1.0, abs=1e-12)
    assert manifest["boosting"] == {"rounds": 4, "rounds_grown": 4, "trees_per_round": 3,
                                    "learning_rate": 0.5, "loss": "multi:softprob", "link": "softmax",
                                    "base_score": list(model.combination.base_score),
                                    "early_stopping_rounds": None, "early_stopping_metric": None}
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("waveform", manifest, session.master_tables())
    session.store_at_institutions("waveform", version, registry.read_manifest("waveform", version))
    card = model_card("waveform", version, manifest, None, True, None)
    assert card.startswith(f"# waveform {version}\n\nFederated gradient boosting (horizontal, "
                           "classification, privacy secagg); promoted to production.")
    assert "- 4 boosting rounds (3 trees a round), learning rate 0.5, loss multi:softprob" in card
    assert "\n## Feature importances (total split gain, summing to 1)\n" in card
    assert "of each node's per feature and bin (count, g, h) histograms" in manifest["privacy"]["note"]

    loaded = horizontal_session_from_config(config)
    assert loaded.load_model(registry, "waveform", "latest") == version
    assert loaded.model.same_as(model) and loaded.model.combination == model.combination
    paths = loaded.predict_locally("run-1")["paths"]
    for name in NAMES:
        new = pd.read_parquet(tmp_path / f"{name}_new.parquet")
        written = pd.read_parquet(paths[name])
        expected = np.asarray(schema.classes)[np.argmax(model.predict_values(schema.encode(new)), axis=1)]
        assert list(written["patient_id"]) == list(new["patient_id"])
        assert list(written["prediction"]) == list(expected)
        stored = ModelRegistry(tmp_path / "registry" / name, public_key=master_public_key(tmp_path))
        assert HorizontalForest.from_table(stored.load("waveform", version)[1]["model"]).same_as(model)


class Crash(PartyUnavailable):
    """Stands in for an institution's process dying (the transport reports a lost party so)."""


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_run_killed_mid_training_resumes_to_the_same_model(tmp_path, task) -> None:
    """Every institution checkpoints its margins per round; a resumed run grows the uninterrupted model."""
    killed_and_resumed(tmp_path, task)


def killed_and_resumed(tmp_path: Path, task: str, compute: dict | None = None, cluster=None) -> None:
    """A run killed as round 2 starts, resumed from its checkpoints, is the uninterrupted run's model.

    `compute`, `cluster`: north's rows on that Dask cluster (its margins gathered from its blocks for the
    checkpoint and put back in them on resume).
    """
    for run in ("reference", "crash"):
        (tmp_path / run).mkdir()
    reference = horizontal_session_from_config(_federation(tmp_path / "reference", task, "secagg")[0])
    reference.agree_schema()
    reference.train()
    expected = (table_sha256(reference.model.to_table()), reference.manifest_entries()["importances"])

    config, _, _ = _federation(tmp_path / "crash", task, "secagg", compute)
    checkpoints = tmp_path / "crash" / "master-checkpoints"
    session = horizontal_session_from_config(config, cluster=cluster)
    south = session.transport._handlers["south"]
    started = [0]

    def dies_as_round_2_starts(message: Message) -> Message:
        if message.kind == "boost_level" and message.header.get("new_batch"):
            started[0] += 1
            if started[0] == 3:  # north got round 2's first request (and saved round 1) before south died
                raise Crash("institution 'south': connection lost")
        return south(message)

    session.transport._handlers["south"] = dies_as_round_2_starts
    session.agree_schema()
    with pytest.raises(Crash):
        session.train(checkpoints, "run-1")
    saved = {name: sorted(p.name for p in (tmp_path / "crash" / "registry" / name / CHECKPOINTS / "run-1")
                          .glob("*.sha256")) for name in NAMES}
    assert saved["south"] == saved["east"] == ["batch-00000.sha256"]
    assert saved["north"] == ["batch-00000.sha256", "batch-00001.sha256"]

    # fresh agents: nothing survives in memory
    restarted = horizontal_session_from_config(config, cluster=cluster)
    restarted.agree_schema()
    facts = restarted.train(checkpoints, "run-1")
    if compute is not None:
        north = restarted.transport._handlers["north"].__self__
        assert type(north.party.rows).__name__ == "DaskBoostingRows" and len(north.party.rows.blocks) > 1
    assert facts.resumed_batches == 1 and facts.rounds < reference.facts.rounds
    assert (table_sha256(restarted.model.to_table()), restarted.manifest_entries()["importances"]) == expected
    restarted.drop_checkpoints()
    assert not any((tmp_path / "crash" / "registry").rglob("batch-*"))


@pytest.mark.parametrize("announced", [1, 5])
def test_an_institution_refuses_a_master_announcing_another_number_of_parties(tmp_path, announced) -> None:
    """A master announcing one party would have each institution send its histograms unmasked.

    The institutions know their federation's size from their own config: no histogram leaves any of them.
    """
    config, _, _ = _federation(tmp_path, "classification", "secagg")
    session = horizontal_session_from_config(config, record_transcript=True)
    session.agree_schema()
    announce_parties(session, announced)
    with pytest.raises(ProtocolError, match=rf"party 'north': the master announced {announced} parties, this "
                                            r"institution's federation lists 3; refusing to aggregate"):
        session.train()
    sent = [e.kind for e in session.transport.transcript if e.receiver == "master"]
    assert "boost_plain" not in sent and "boost_masked" not in sent


@pytest.mark.parametrize(("feature", "low", "high", "why"), DOMAIN_LIES)
def test_an_institution_refuses_a_master_domain_its_contract_cannot_give(tmp_path, feature, low, high,
                                                                         why) -> None:
    """Boosting cuts its bins in the master's domains: each must be finite and hold the declared range."""
    config, _, _ = _federation(tmp_path, "classification", "secagg")
    session = horizontal_session_from_config(config, record_transcript=True)
    rewrite_domains(session, feature, low, high)
    with pytest.raises(ProtocolError, match=rf"institution 'north': the master's domain for feature "
                                            rf"'{feature}' {why}; refusing to set up"):
        session.agree_schema()
    assert not [e for e in session.transport.transcript if e.receiver == "master" and e.kind == "ready"]
