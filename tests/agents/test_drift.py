"""Drift computed at home (issue #33): each institution scores its own batch against its training rows.

Whole in-process sessions, vertical and horizontal: train, store (the snapshot goes into each institution's
own registry copy), then batch predict an unshifted and a shifted batch. Only the drifted features' names and
scores reach the master; `on_drift: fail` refuses the batch, naming them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from fedcore.drift import DriftSettings
from fedcore.errors import ProtocolError
from fedcore.models.registry import ModelRegistry
from fedcore.transport.base import MASTER
from flows.ui import predict_outcome
from tests.keys import master_public_key
from tests.vertical.test_session import _agents, _stored


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    from fedcore.data.scenario import make_vertical_scenario

    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=3000, seed=8)


def _stored_session(scenario: dict, root: Path, drift: DriftSettings | None = None):
    agents = _agents(scenario, root)
    for agent in agents.values():
        agent._data = replace(agent.data, drift=drift)
    session, transport, version = _stored(agents, root, 4, 0.2, record_payloads=True)
    return agents, transport, session, version


def _shifted(scenario: dict) -> pd.DataFrame:
    """The e-commerce batch with baskets three times larger and every customer on one channel."""
    batch = pd.read_parquet(scenario["institutions"]["ecommerce"]["new"])
    batch["avg_basket"] = batch["avg_basket"] * 3
    batch["preferred_channel"] = pd.Categorical([batch["preferred_channel"].cat.categories[0]] * len(batch),
                                                categories=batch["preferred_channel"].cat.categories)
    return batch


def test_an_unshifted_batch_is_not_flagged(scenario, tmp_path) -> None:
    agents, _, session, version = _stored_session(scenario, tmp_path)
    for name, agent in agents.items():  # each kept its training snapshot in its own registry copy
        manifest, _ = ModelRegistry(tmp_path / "registry" / name,
                                    public_key=master_public_key(tmp_path)).load("demo", version)
        assert set(manifest["drift"]["features"]) == set(agent.party.model.column_names)
    assert session.predict(scenario["label_holder"]).drift == {}
    for agent in agents.values():
        assert {r["feature"] for r in agent.reports["drift"]} == set(agent.party.model.column_names)
        assert max(r["psi"] for r in agent.reports["drift"]) < 0.2


def test_a_shifted_batch_is_flagged_and_only_its_drifted_features_reach_the_master(scenario,
                                                                                   tmp_path) -> None:
    agents, transport, session, version = _stored_session(scenario, tmp_path)
    shifted = _shifted(scenario)
    agents["ecommerce"].data.load_batch = lambda: shifted
    before = len(transport.transcript)
    prediction = session.predict(scenario["label_holder"])
    assert list(prediction.drift) == ["ecommerce"]
    table = {r["feature"]: r for r in agents["ecommerce"].reports["drift"]}  # every feature, at home only
    assert set(table) == set(agents["ecommerce"].party.model.column_names)
    assert {f for f, r in table.items() if r["drifted"]} == {"avg_basket", "preferred_channel"}
    assert prediction.drift["ecommerce"] == {f: table[f]["psi"] for f in ("preferred_channel", "avg_basket")}
    # what reached the master: the two drifted names and scores; no other feature's name or score
    undrifted = [f for f, r in table.items() if not r["drifted"]]
    to_master = [e.payload for e in transport.transcript[before:] if e.receiver == MASTER]
    assert not any(f.encode() in p for p in to_master for f in undrifted)
    assert not any(f"{table[f]['psi']!r}".encode() in p for p in to_master for f in undrifted)
    drifted = prediction.drift["ecommerce"]
    assert drifted["preferred_channel"] > drifted["avg_basket"]  # named most drifted first
    assert predict_outcome("demo", version, prediction.to_dict()).endswith(
        f"; drift at ecommerce: preferred_channel {drifted['preferred_channel']:.4f}, avg_basket "
        f"{drifted['avg_basket']:.4f}")


def test_on_drift_fail_refuses_the_batch_naming_the_features(scenario, tmp_path) -> None:
    agents, _, session, _ = _stored_session(scenario, tmp_path, DriftSettings(0.2, "fail"))
    shifted = _shifted(scenario)
    agents["ecommerce"].data.load_batch = lambda: shifted
    with pytest.raises(ProtocolError) as refused:
        session.predict(scenario["label_holder"])
    own = agents["ecommerce"]
    drifted = [(r["feature"], r["psi"]) for r in own.reports["drift"] if r["drifted"]]  # most drifted first
    assert {f for f, _ in drifted} == {"avg_basket", "preferred_channel"}
    listed = ", ".join(f"{f} {v:.4f}" for f, v in drifted)
    assert str(refused.value).endswith(
        "institution 'ecommerce' refuses to predict: its batch drifted from its training rows (PSI >= 0.2): "
        f"{listed}; drift.on_drift is fail (retrain on recent rows, or set on_drift: warn)")
    predictions = tmp_path / "predictions"
    assert not predictions.exists() or not any(predictions.rglob("*.parquet"))  # nothing delivered


@pytest.mark.parametrize("shift, drifted", [(0.0, {}), (3.0, {"north": ["a"]})])
def test_a_horizontal_institution_scores_its_own_batch(tmp_path, shift: float, drifted: dict) -> None:
    from fedcore.models.publish import register_everywhere
    from tests.models.registering import agents, master_registry, table, trained_session

    institutions = agents(tmp_path)
    session = trained_session({n: a.handle for n, a in institutions.items()})
    manifest = {"algorithm": "extra-trees", "setting": "horizontal",
                "parties": session.manifest_entries()["parties"]}
    register_everywhere(master_registry(tmp_path), session, "readmission", manifest, session.master_tables())
    for seed, (name, institution) in enumerate(institutions.items(), start=9):
        # their training rows are few (about 64 each): PSI's noise is about 9 x (1/64 + 1/1000), a high bar
        institution.data.drift = DriftSettings(psi_threshold=1.0)
        batch = table(seed=seed, n_rows=1000).drop(columns=["label"])  # fresh rows of the training rows' law
        institution.data.load_batch = (lambda b=batch: b.assign(a=b["a"] + shift)) if name == "north" else (
            lambda b=batch: b)
    prediction = session.predict()
    north = institutions["north"]
    assert {name: list(features) for name, features in prediction.drift.items()} == drifted
    assert {r["feature"] for r in north.reports["drift"]} == {"a", "b", "c"}
    assert max(r["psi"] for r in north.reports["drift"] if r["feature"] != "a") < 1.0
