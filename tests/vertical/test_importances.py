"""Importances that respect party boundaries (issue #33): each institution's own features' stay at home.

A whole in-process vertical session with recorded payloads: each institution keeps its features'
importances in its own registry copy, the master's manifest and card hold each institution's share only,
and no institution's per-feature importance crosses to the master or to another institution. The values
are the estimators' (scikit-learn's definition), exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ProtocolError
from fedcore.estimator_api import impurity_importances, node_impurity_decrease
from fedcore.models.card import model_card
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.boosting import BoostingParams
from fedcore.trees.params import ForestParams
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from fedcore.vertical.importances import party_importances
from fedcore.vertical.session import VerticalSession
from tests.conftest import mixed_table
from tests.keys import master_key, master_public_key
from tests.vertical.test_session import _agents
from tests.wire import float_bits, found_bits


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    from fedcore.data.scenario import make_vertical_scenario

    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=900, seed=5)


@pytest.mark.parametrize("params", [
    ForestParams(n_estimators=8, max_depth=5, random_state=3),  # impurity: scikit-learn's values
    BoostingParams(n_estimators=8, max_depth=3, random_state=3)],  # boosting's total split gain shares
    ids=["forest", "boosting"])
def test_each_institution_keeps_its_own_importances_and_the_master_sees_only_shares(scenario, tmp_path,
                                                                                    params) -> None:
    agents = _agents(scenario, tmp_path, new_batch=False)
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    session = VerticalSession(transport, params, holdout_fraction=0.2, min_overlap=100)
    session.align()
    session.train()
    parties = session.manifest_entries()["parties"]
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("demo", {"algorithm": "forest", "parties": parties}, session.master_tables())
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))

    # each institution's registry copy: its own features' importances, scikit-learn's values exactly
    s = session.master.trained_structure
    forest = not isinstance(params, BoostingParams)
    decrease = node_impurity_decrease(s.tree, s.left, s.right, s.weight, s.value, "gini", s.n_trees) \
        if forest else None
    kept = {}
    for name, agent in agents.items():
        manifest, _ = ModelRegistry(tmp_path / "registry" / name,
                                    public_key=master_public_key(tmp_path)).load("demo", version)
        model = agent.party.model
        expected = (impurity_importances(decrease, s.tree, s.n_trees, model.feature, len(model.column_names))
                    if forest else agent.party.importances)  # boosting: the estimators' (test_boosting.py)
        kept[name] = manifest["importances"]
        assert list(kept[name]) == model.column_names
        assert np.array_equal(np.array(list(kept[name].values())), expected)
        assert [r["feature"] for r in agent.reports["importances"]] == sorted(
            kept[name], key=lambda c: (-kept[name][c], c))
    assert sum(v for own in kept.values() for v in own.values()) == pytest.approx(1.0, abs=1e-12)

    # the master's manifest: each institution's share, the sum of its features' importances, no feature
    shares = {p["name"]: p["importance_share"] for p in parties}
    assert shares == {n: pytest.approx(sum(own.values()), abs=1e-12) for n, own in kept.items()}
    assert not any(c in json.dumps(parties) for own in kept.values() for c in own)

    # the transcript: no per-feature importance reaches the master or another institution
    share_bits = float_bits(list(shares.values()))
    needles = {n: np.setdiff1d(float_bits([v for v in own.values() if v > 0]), share_bits)
               for n, own in kept.items()}
    assert all(len(n) for n in needles.values())
    owners = {name: i for i, name in enumerate(session.master.federation.parties)}
    leaks, finals = [], 0
    for entry in transport.transcript:
        message = Message.from_bytes(entry.payload)
        for owner, bits in needles.items():
            if entry.receiver == owner:  # its own splits' shares (boosting: a feature split once is one)
                continue
            if len(hits := found_bits(entry.payload, message.header, bits)):
                leaks.append(f"{len(hits)} of {owner}'s importances in {message.kind} "
                             f"{entry.sender}->{entry.receiver}")
        if message.kind == "finalize":  # the shares of its own splits, and of no other's
            own = s.owner == owners[entry.receiver]
            share = message.arrays["importance"]
            assert np.all(share[~own] == 0) and np.all(share[own & (s.left >= 0)] > 0)
            finals += 1
    assert leaks == [] and finals == len(agents)

    manifest = {"algorithm": "forest", "setting": "vertical", "task": "classification", "parties": parties,
                "metrics": {}, **_card_facts()}
    card = model_card("demo", version, manifest, None, False, None)
    assert "| institution | role | features | splits owned | importance share |" in card
    for name, share in shares.items():
        assert f"| {share:.4f} |" in card and name in card
    assert not any(f"| {c} |" in card for own in kept.values() for c in own)


def _card_facts() -> dict:
    return {"training": {"overlap": 1, "rows": 1, "holdout_rows": 0, "seconds": 0.0, "rounds": 0, "bytes": 0,
                         "nodes": 0},
            "params": {"n_estimators": 8, "max_depth": 5, "max_features": "sqrt", "criterion": "gini"},
            "lineage": {"code_version": "test"}}


@pytest.mark.parametrize("estimator, task", [(FederatedForestClassifier, "classification"),
                                             (FederatedForestRegressor, "regression")])
def test_the_protocol_gives_each_party_the_estimators_importances(estimator, task: str) -> None:
    table = mixed_table(n_rows=300, seed=4, task=task)
    parties = split_vertical(table, 3, label="target", seed=2)
    model = estimator(n_estimators=6, max_depth=4, random_state=1).fit(parties, label="target")
    expected = model.feature_importances_
    for party in model.parties_:  # computed at the party from the shares finalize gave it
        assert np.array_equal(party.importances, expected[party.name].to_numpy())
    assert pd.concat(expected.values()).sum() == pytest.approx(1.0, abs=1e-12)
    shares = model.master_.party_importance_shares()
    assert shares == {n: pytest.approx(float(v.sum()), abs=1e-12) for n, v in expected.items()}


def test_a_party_refuses_shares_that_are_not_one_share_per_node() -> None:
    table = mixed_table(n_rows=200, seed=6, n_classes=2)
    model = FederatedForestClassifier(n_estimators=3, max_depth=3, random_state=0).fit(
        split_vertical(table, 2, label="target", seed=1), label="target")
    party = model.parties_[0]
    n = len(party.model.tree)
    for bad in (np.zeros(n - 1), np.full(n, np.nan), np.full(n, 1.5), np.full(n, -0.1)):
        with pytest.raises(ProtocolError) as refused:
            party_importances(party.name, party.model, bad, 3)
        assert str(refused.value) == (f"party {party.name!r}: finalize's importance shares should be one "
                                      f"number in [0, 1] per node ({n})")
    # shares of nodes it does not own name no feature here: they cannot change its importances
    foreign = np.where(party.model.feature < 0, 0.5, 0.0)
    assert not party_importances(party.name, party.model, foreign, 3).any()


def test_the_horizontal_card_lists_the_whole_importance_table(tmp_path: Path) -> None:
    from tests.models.registering import agents, trained_session

    session = trained_session({n: a.handle for n, a in agents(tmp_path).items()})
    entries = session.manifest_entries()
    importances = entries["importances"]
    assert list(importances) == session.schema.names
    assert sum(importances.values()) == pytest.approx(1.0, abs=1e-12)
    manifest = {"algorithm": "extra-trees", "setting": "horizontal", "task": "classification", "metrics": {},
                **entries, **_card_facts()}
    manifest["training"]["overlap"] = None
    manifest["schema"] = entries["schema"]
    card = model_card("readmission", "v0001", manifest, None, False, None)
    for feature, value in importances.items():
        assert f"| {feature} | {value:.4f} |" in card
