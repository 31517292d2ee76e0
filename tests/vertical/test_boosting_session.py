"""Boosting through the institutions' agents: train, early stopping, register, store, load, batch predict.

The agents' federation must give the estimator's model on the same rows, byte for byte, and its registered
version must predict new rows as the estimator does (issue #32).
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.checks import reported
from fedcore.data.scenario import make_vertical_scenario
from fedcore.errors import ProtocolError
from fedcore.metrics import metrics as score
from fedcore.models.artifacts import table_file_bytes
from fedcore.models.card import build_manifest, model_card
from fedcore.models.registry import ModelRegistry
from fedcore.models.tables import master_table, party_table
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.boosting import BoostingParams
from fedcore.trees.early_stopping import kept_rounds, round_scores
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier, FederatedBoostingRegressor
from fedcore.vertical.session import VerticalSession
from tests.keys import master_key, master_public_key
from tests.vertical.test_session import KEY, _agents

PARAMS = {"n_estimators": 12, "max_depth": 3, "learning_rate": 0.3, "reg_lambda": 1.0, "gamma": 0.0,
          "min_child_weight": 1.0, "subsample": 0.8, "random_state": 4}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=1200, seed=5)


def _trained(scenario: dict, root, params: BoostingParams, **settings):
    """A boosting session over the scenario's agents, aligned and trained; its agents; the training frames.

    `settings`: further InstitutionData fields of every agent (its own privacy setting, ...).
    """
    agents = _agents(scenario, root, **settings)
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}), params,
                              holdout_fraction=0.25, min_overlap=100)
    session.align()
    frames = {}
    for name, agent in agents.items():  # the aligned training rows each agent trains on
        frame = agent.party.features.copy()
        if agent.party.is_label_holder:
            frame[scenario["label"]] = agent.party._label_values.to_numpy()
        frames[name] = frame
    holdout = {name: agent._holdout.drop(columns=[scenario["label"]], errors="ignore").reset_index(drop=True)
               for name, agent in agents.items()}
    session.train()
    return session, agents, frames, holdout


class _AgentsKeyed:
    """The estimator with the agents' feature key (from their consortium key).

    Features are then ordered, and ties between equal gains broken, as at the agents.
    """

    def _feature_key(self, random_state: int) -> bytes:
        return hmac.new(KEY, b"fedforest feature ids", hashlib.sha256).digest()


class AgentsClassifier(_AgentsKeyed, FederatedBoostingClassifier):
    pass


class AgentsRegressor(_AgentsKeyed, FederatedBoostingRegressor):
    pass


def _estimator(params: BoostingParams, **more):
    cls = AgentsClassifier if params.task == "classification" else AgentsRegressor
    return cls(n_estimators=params.n_estimators, max_depth=params.max_depth,
               learning_rate=params.learning_rate, reg_lambda=params.reg_lambda, gamma=params.gamma,
               min_child_weight=params.min_child_weight,
               subsample=params.subsample, colsample_bytree=params.max_features,
               random_state=params.random_state, **more)


def _same_model(session: VerticalSession, agents: dict, model) -> None:
    """The agents' federation and the estimator: the same master table and party tables, byte for byte."""
    assert table_file_bytes(master_table(session.master.structure, session.master.combination)) == \
        table_file_bytes(master_table(model.master_.structure, model.master_.combination))
    for party in model.parties_:
        assert table_file_bytes(party_table(agents[party.name].party.model)) == \
            table_file_bytes(party_table(party.model))


def test_agents_train_the_estimators_model_and_its_version_predicts_as_it_does(scenario, tmp_path) -> None:
    params = BoostingParams(**PARAMS)
    session, agents, frames, holdout = _trained(scenario, tmp_path, params)
    model = _estimator(params).fit(frames, label=scenario["label"])
    _same_model(session, agents, model)
    assert session.master.combination.kind == "sum" and session.master.combination.link == "sigmoid"

    metrics = session.evaluate()  # the label holder scores the held-out rows (probabilities: log-loss too)
    expected = model.predict_proba(holdout)
    y = agents[scenario["label_holder"]]._holdout[scenario["label"]].to_numpy()
    truth = score("classification", y, model.classes_[np.argmax(expected, axis=1)], expected, model.classes_)
    assert metrics == {name: float(reported(value)) for name, value in truth.items()}

    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    manifest = {"algorithm": session.algorithm, "task": "classification", "metrics": metrics,
                **session.manifest_entries()}
    version = registry.register("boost", manifest, session.master_tables())
    session.store_at_institutions("boost", version, registry.read_manifest("boost", version))
    assert registry.read_manifest("boost", version)["boosting"]["loss"] == "binary:logistic"
    session.close()

    fresh = _agents(scenario, tmp_path)
    loaded = VerticalSession(InProcessTransport({n: a.handle for n, a in fresh.items()}), params,
                             min_overlap=1)
    trusted = ModelRegistry(tmp_path / "registry" / "master", public_key=master_public_key(tmp_path))
    assert loaded.load_model(trusted, "boost", version) == version
    result = loaded.batch_predict(scenario["label_holder"])
    delivered = pd.read_parquet(result["path"])
    ids = delivered[scenario["id_column"]]
    new = {name: pd.read_parquet(files["new"]).set_index(scenario["id_column"]).loc[ids.to_numpy()]
           .drop(columns=[scenario["label"]], errors="ignore").reset_index(drop=True)
           for name, files in scenario["institutions"].items()}
    proba = model.predict_proba(new)
    columns = [f"proba_{c}" for c in model.classes_]
    assert np.array_equal(delivered[columns].to_numpy(), proba)  # one round, leaf weights summed, the link
    assert np.array_equal(delivered["prediction"].to_numpy(), model.classes_[np.argmax(proba, axis=1)])
    loaded.close()


def test_early_stopping_keeps_the_rounds_a_single_party_run_keeps(scenario, tmp_path) -> None:
    """The agents stop where the estimator, all columns at one party with the same held-out rows, stops."""
    params = BoostingParams(**{**PARAMS, "n_estimators": 15, "max_depth": 4, "learning_rate": 1.0,
                               "early_stopping_rounds": 3})
    session, agents, frames, holdout = _trained(scenario, tmp_path, params)
    entry = session.manifest_entries()["boosting"]
    assert entry["rounds_grown"] == 15 and 1 <= entry["rounds"] <= 12  # it stopped: overfits at rate 1
    assert entry["early_stopping_metric"] == "log_loss"
    label = scenario["label"]
    y = agents[scenario["label_holder"]]._holdout[label].to_numpy()

    def one_party(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
        return pd.concat([f.reset_index(drop=True) for f in frames.values()], axis=1)

    single = _estimator(params, early_stopping_rounds=3).fit(
        {"all": one_party(frames)}, label=label, eval_set=({"all": one_party(holdout)}, y))
    assert single.best_iteration_ + 1 == entry["rounds"] == single.master_.structure.n_trees
    federated = _estimator(params, early_stopping_rounds=3).fit(frames, label=label, eval_set=(holdout, y))
    _same_model(session, agents, federated)

    # the rule itself: the kept rounds are the best held-out log-loss of all 15, reached before 3 worse ones
    full = _estimator(params).fit(frames, label=label)
    for party in full.parties_:
        party.set_prediction_data(holdout[party.name])
    values = full.master_.tree_values(len(y))
    codes = np.searchsorted(full.classes_, y)
    scores = round_scores(full.master_.combination, codes, values)
    kept = entry["rounds"]
    assert kept == kept_rounds(scores, 3) and scores[kept - 1] == min(scores[:kept + 3])
    assert all(s >= scores[kept - 1] for s in scores[kept:kept + 3])
    assert np.array_equal(session.master.structure.value, full.master_.structure.value[
        : session.master.structure.n_nodes])
    metrics = session.evaluate()
    assert metrics["log_loss"] == float(reported(scores[kept - 1]))
    manifest = build_manifest(session, "retail", metrics, {})
    assert (manifest["algorithm"], manifest["params"]["early_stopping_rounds"]) == ("boosting", 3)
    card = model_card("retail", "v0001", manifest, None, True, None)
    assert card.startswith("# retail v0001\n\nFederated gradient boosting (vertical, classification); ")
    assert (f"- {kept} boosting rounds, learning rate 1, loss binary:logistic, max_depth 4, reg_lambda 1, "
            f"gamma 0, min_child_weight 1, subsample 0.8, colsample_bytree 1.0; early stopping after 3 "
            f"rounds without a better held-out log_loss: {kept} of 15 rounds kept\n") in card
    assert f"| log_loss (lower is better) | {metrics['log_loss']:.4f} | - |" in card

    # once per session, on the whole held-out set: no oracle for single held-out labels
    holder = scenario["label_holder"]
    again = Message("score_rounds", {"patience": 3}, {"values": values[:, :kept]})
    with pytest.raises(ProtocolError, match=f"institution '{holder}' refuses a second 'score_rounds' in this "
                                            "session"):
        session.transport.exchange({holder: again})
    passive = next(n for n in agents if n != holder)
    with pytest.raises(ProtocolError, match=f"'{passive}' holds no label and cannot score rounds"):
        session.transport.exchange({passive: again})
    with pytest.raises(ProtocolError, match=f"institution '{holder}' refuses a second 'keep_trees'"):
        session.transport.exchange({holder: Message("keep_trees", {"n_trees": 1})})
    session.close()


def test_score_rounds_is_refused_on_a_subset_of_the_held_out_rows(scenario, tmp_path) -> None:
    params = BoostingParams(**{**PARAMS, "n_estimators": 3})
    session, agents, _, _ = _trained(scenario, tmp_path, params)
    holder = scenario["label_holder"]
    ask = Message("score_rounds", {"patience": 1}, {"values": np.zeros((5, 3))})
    with pytest.raises(ProtocolError, match="'score_rounds' before the held-out rows were predicted"):
        session.transport.exchange({holder: ask})
    session.transport.exchange({n: Message("load_holdout") for n in agents})
    with pytest.raises(ProtocolError, match=rf"'score_rounds' values must be floats of shape "
                                            rf"\({session.facts.holdout_rows}, 3\), got float64 \[5, 3\]"):
        session.transport.exchange({holder: ask})
    with pytest.raises(ProtocolError, match="'keep_trees' asks for 4 of its 3 trees"):
        session.transport.exchange({holder: Message("keep_trees", {"n_trees": 4})})
    session.close()


def test_early_stopping_on_regression_watches_rmse(scenario, tmp_path) -> None:
    """A regressor stops on the held-out RMSE, as the single-party estimator does."""
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=600), rng.normal(size=600)
    frames = {"a": pd.DataFrame({"x": x, "y": 2 * x + z + rng.normal(scale=0.5, size=600)}),
              "b": pd.DataFrame({"z": z})}
    train = {k: f.iloc[:450].reset_index(drop=True) for k, f in frames.items()}
    test = {k: f.iloc[450:].drop(columns=["y"], errors="ignore").reset_index(drop=True)
            for k, f in frames.items()}
    y = frames["a"]["y"].iloc[450:].to_numpy()
    params = BoostingParams(task="regression", n_estimators=30, max_depth=4, learning_rate=0.9,
                            random_state=1)
    federated = _estimator(params, early_stopping_rounds=4).fit(train, label="y", eval_set=(test, y))
    single = _estimator(params, early_stopping_rounds=4).fit(
        {"all": pd.concat(list(train.values()), axis=1)}, label="y",
        eval_set=({"all": pd.concat(list(test.values()), axis=1)}, y))
    assert federated.best_iteration_ == single.best_iteration_ < 26
    assert np.array_equal(federated.predict(test), single.predict({"all": pd.concat(list(test.values()),
                                                                                     axis=1)}))


def test_agents_train_encrypted_gradients_into_the_plain_model(scenario, tmp_path) -> None:
    """`privacy: ou` through the agents: SecureBoost gives the plain estimator's model, byte for byte."""
    plain = BoostingParams(**{**PARAMS, "n_estimators": 3})
    encrypted = BoostingParams(**{**PARAMS, "n_estimators": 3}, privacy="ou", key_bits=2048)
    session, agents, frames, _ = _trained(scenario, tmp_path, encrypted,
                                          privacy={"mode": "ou", "key_bits": 2048})
    _same_model(session, agents, _estimator(plain).fit(frames, label=scenario["label"]))
    session.close()


def test_importances_after_early_stopping_are_those_of_the_kept_rounds_alone(scenario, tmp_path) -> None:
    """Each party's gain importances cover the kept rounds only: those of a run of that many rounds.

    The `keep_trees` each party receives carries the shares of its own splits, none of another's.
    """
    params = BoostingParams(**{**PARAMS, "n_estimators": 15, "max_depth": 4, "learning_rate": 1.0,
                               "early_stopping_rounds": 3})
    agents = _agents(scenario, tmp_path / "stopped")
    sent: dict[str, list[Message]] = {name: [] for name in agents}

    def recording(name: str):
        def handle(message: Message) -> Message:
            sent[name].append(message)
            return agents[name].handle(message)
        return handle

    session = VerticalSession(InProcessTransport({n: recording(n) for n in agents}), params,
                              holdout_fraction=0.25, min_overlap=100)
    session.align()
    session.train()
    kept = session.manifest_entries()["boosting"]["rounds"]
    assert kept < 15  # it stopped (rate 1 overfits)
    shorter, shorter_agents, _, _ = _trained(scenario, tmp_path / "short",
                                             BoostingParams(**{**PARAMS, "n_estimators": kept, "max_depth": 4,
                                                               "learning_rate": 1.0}))
    grown_first = {name: [m for m in sent[name] if m.kind == "finalize"][0] for name in agents}
    for i, (name, agent) in enumerate(agents.items()):
        expected = shorter_agents[name].party.importances
        assert expected is not None and agent.party.importances is not None
        assert agent.party.importances.tobytes() == expected.tobytes(), name
        # before the cut it had every grown round's: not the kept ones'
        grown = grown_first[name].arrays["importance"]
        (keep,) = [m for m in sent[name] if m.kind == "keep_trees"]
        shares = keep.arrays["importance"]
        owner = session.master.structure.owner
        assert len(shares) == session.master.structure.n_nodes < len(grown)
        assert np.all(shares[owner != i] == 0) and np.any(shares[owner == i] > 0)  # its own splits only
    assert session.master.party_importance_shares() == shorter.master.party_importance_shares()
    # what finalize gave (every round grown: a run of 15 rounds' importances) is not what they keep
    full, full_agents, _, _ = _trained(scenario, tmp_path / "full", BoostingParams(**{
        **PARAMS, "n_estimators": 15, "max_depth": 4, "learning_rate": 1.0}))
    assert any(full_agents[n].party.importances.tobytes() != a.party.importances.tobytes()
               for n, a in agents.items())
    for closing in (session, shorter, full):
        closing.close()


def test_the_estimators_importances_after_early_stopping_are_the_kept_rounds(scenario, tmp_path) -> None:
    """`feature_importances_` of an early-stopped estimator: per party, those of a fit of the kept rounds."""
    params = BoostingParams(**{**PARAMS, "n_estimators": 15, "max_depth": 4, "learning_rate": 1.0})
    _, agents, frames, holdout = _trained(scenario, tmp_path, params)
    label, y = scenario["label"], agents[scenario["label_holder"]]._holdout[scenario["label"]].to_numpy()
    stopped = _estimator(params, early_stopping_rounds=3).fit(frames, label=label, eval_set=(holdout, y))
    kept = stopped.best_iteration_ + 1
    assert kept < 15
    again = _estimator(BoostingParams(**{**PARAMS, "n_estimators": kept, "max_depth": 4,
                                         "learning_rate": 1.0})).fit(frames, label=label)
    full = _estimator(params).fit(frames, label=label)
    for name, expected in again.feature_importances_.items():
        pd.testing.assert_series_equal(stopped.feature_importances_[name], expected, check_exact=True)
    assert stopped.master_.party_importance_shares() == again.master_.party_importance_shares()
    assert stopped.master_.party_importance_shares() != full.master_.party_importance_shares()
