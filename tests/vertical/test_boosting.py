"""Vertical boosting, plain mode (fedcore/vertical/, issue #32): lossless across party layouts, what crosses.

Single- vs 2, 3 and 5-party byte identity of the trees, each column's thresholds and the predictions, for
squared error, logistic and softmax; the label holder's training margins are the model's predictions; the
passive parties receive the rounds' (g, h) and never the labels.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from fedcore.data.split import split_vertical
from fedcore.errors import ParameterError
from fedcore.protocol.messages import Message
from fedcore.trees.losses import transform
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier, FederatedBoostingRegressor
from tests.conftest import mixed_table
from tests.thresholds import assert_decides_at_thresholds

PARAMS = {"n_estimators": 4, "max_depth": 3, "learning_rate": 0.3, "subsample": 0.8, "colsample_bytree": 0.7,
          "min_child_weight": 0.5, "gamma": 0.01, "random_state": 5}
LOSSES = {"squared error": (FederatedBoostingRegressor, {"task": "regression"}),
          "logistic": (FederatedBoostingClassifier, {"n_classes": 2}),
          "softmax": (FederatedBoostingClassifier, {"n_classes": 3})}


def _fit(loss: str, n_parties: int, **params):
    cls, table_args = LOSSES[loss]
    table = mixed_table(n_rows=300, seed=4, **table_args)
    parties = split_vertical(table, n_parties, label="target", seed=2, label_party=n_parties - 1)
    model = cls(**{**PARAMS, **params}).fit(parties, label="target")
    frames = [p.drop(columns="target", errors="ignore") for p in parties]
    return model, frames, table


def _model_bytes(model, frames) -> dict[str, bytes]:
    """The structure, every column's splits (by column name, wherever it sits) and the predictions."""
    s = model.master_.structure
    out = {f: np.ascontiguousarray(getattr(s, f)).tobytes()
           for f in ("tree", "node", "left", "right", "depth", "weight", "value")}
    for party in model.parties_:
        m = party.model
        for j, column in enumerate(m.column_names):
            mine = m.feature == j
            out[column] = b"".join(np.ascontiguousarray(a[mine]).tobytes()
                                   for a in (m.threshold, m.missing_left, m.cat_bits))
            out[column + ".nodes"] = np.flatnonzero(mine).tobytes()
    predictions = model.predict(frames) if loss_is_regression(model) else model.predict_proba(frames)
    out["predictions"] = predictions.tobytes()
    return out


def loss_is_regression(model) -> bool:
    return isinstance(model, FederatedBoostingRegressor)


def test_parties_answering_side_by_side_grow_the_model_of_parties_answering_in_turn(monkeypatch) -> None:
    """A simulated round's parties can answer in threads (`InProcessTransport`); the model is the same."""
    from fedcore.transport.inprocess import kernels_threadsafe

    if not kernels_threadsafe():
        pytest.skip("numba's threading layer here (workqueue) is not thread-safe: the parties answer in turn")
    in_turn, frames, _ = _fit("softmax", 3)
    assert not in_turn.transport_.concurrent
    monkeypatch.setattr(FederatedBoostingClassifier, "_concurrent_parties", True)
    threads = set(threading.enumerate())
    side_by_side, _, _ = _fit("softmax", 3)
    assert side_by_side.transport_.concurrent
    assert _model_bytes(in_turn, frames) == _model_bytes(side_by_side, frames)
    # the fit and the predictions each closed the transport: none of its round threads is left
    left = set(threading.enumerate()) - threads
    assert not [t.name for t in left if t.name.startswith("fedforest-inprocess")]


@pytest.mark.parametrize("loss", list(LOSSES))
def test_two_three_and_five_parties_give_the_one_party_model_byte_for_byte(loss: str) -> None:
    single = _model_bytes(*_fit(loss, 1)[:2])
    for n_parties in (2, 3, 5):
        assert _model_bytes(*_fit(loss, n_parties)[:2]) == single
    trees = _fit(loss, 1)[0].master_.structure
    assert trees.n_trees == PARAMS["n_estimators"] * (3 if loss == "softmax" else 1)  # K trees a round
    assert len(trees.tree) > 3 * trees.n_trees  # they split


@pytest.mark.parametrize("loss", list(LOSSES))
def test_training_margins_are_the_models_predictions(loss: str) -> None:
    """The label holder's margins after the last round, recomputed by the one predictor, bit for bit."""
    model, frames, _ = _fit(loss, 2)
    holder = model.label_holder_
    final = holder._boost.margins + holder.rows.leaf_values().T  # the last round's leaf weights: not added
    outputs = model._predict_values(frames)  # one-round prediction of the training rows, through the link
    combination = model.master_.combination
    s = model.master_.structure
    assert np.array_equal(transform(combination.link, final), outputs)
    assert np.array_equal(model._predict_values(frames, "node-by-node"), outputs)  # the other predictor
    assert combination.kind == "sum" and len(combination.base_score) == (3 if loss == "softmax" else 1)
    assert s.value.shape[1] == 1


def test_passive_parties_receive_gradients_not_labels() -> None:
    model, _, table = _fit("logistic", 3, record_payloads=True)
    holder = model.label_holder_.name
    passive = [p.name for p in model.parties_ if p.name != holder]
    sent = [(e.sender, e.receiver, Message.from_bytes(e.payload)) for e in model.transcript_]
    configure = [m for _, _, m in sent if m.kind == "configure"]
    assert len(configure) == 3 and all("y" not in m.arrays for m in configure)
    begins = [m for _, to, m in sent if m.kind == "begin_batch" and to in passive]
    assert len(begins) == len(passive) * PARAMS["n_estimators"]
    assert all(m.arrays["gh"].shape == (len(table), 2) for m in begins)
    # the label holder's round (g, h) come with its answer to the round's begin_batch (its first level)
    gradients = [(frm, m.kind) for frm, _, m in sent if "gh" in m.arrays and frm != "master"]
    assert gradients == [(holder, "local_best")] * PARAMS["n_estimators"]
    labels = [m for _, _, m in sent if m.kind == "labels"]
    assert len(labels) == 1 and not labels[0].arrays  # the label holder exports no labels


def test_a_passive_party_refuses_gradients_off_a_grid_of_exact_sums() -> None:
    """A master relaying (g, h) whose sums would round is refused, in the words of the refusal.

    Such sums would depend on the order a party adds its rows in: in process or in blocks on a Dask cluster.
    """
    from fedcore.errors import ProtocolError
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.boosting import BoostingParams
    from fedcore.vertical.master import VerticalMaster
    from fedcore.vertical.party import VerticalParty

    holder_frame, passive_frame = split_vertical(mixed_table(n_rows=80, seed=5), 2, label="target", seed=7,
                                                 label_party=0)
    holder = VerticalParty("holder", holder_frame, "target", feature_key=b"k" * 32)
    passive = VerticalParty("passive", passive_frame, feature_key=b"k" * 32)

    def nudged(message: Message) -> Message:
        if message.kind == "begin_batch":
            gh = message.arrays["gh"].copy()
            gh[3, 0] += gh[3, 0] * 2.0**-50  # below any step of the round's grid
            message = Message("begin_batch", message.header, {**message.arrays, "gh": gh})
        return passive.handle(message)

    params = BoostingParams(task="classification", n_estimators=1, max_depth=2, random_state=1)
    transport = InProcessTransport({"holder": holder.handle, "passive": nudged})
    with pytest.raises(ProtocolError) as refused:
        VerticalMaster(transport, params).fit()
    assert str(refused.value) == ("party 'passive' refuses the request: a boosting round's (g, h) must lie "
                                  "on a power-of-two grid whose sums are exact, as the label holder's do")


def test_boosting_is_refused_where_it_does_not_run_yet() -> None:
    from fedcore.trees.boosting import BoostingParams

    with pytest.raises(ParameterError, match=r"^privacy must be one of \('none', 'paillier', 'ou'\) in the "
                                             r"vertical setting, got 'gdp'$"):
        BoostingParams(privacy="gdp")
    with pytest.raises(ParameterError, match=r"^subsample must be a number in \(0.0, 1.0\], got 1.5$"):
        FederatedBoostingRegressor(subsample=1.5).params  # noqa: B018 (the check is the property's)
    with pytest.raises(ParameterError, match=r"^reg_lambda must be a number >= 0.0, got -1$"):
        FederatedBoostingRegressor(reg_lambda=-1).params  # noqa: B018


@pytest.mark.parametrize(("loss", "parties"), [("softmax", 3), ("squared error", 2)])
def test_a_saved_model_loads_and_predicts_the_same_bytes(loss, parties, tmp_path) -> None:
    """Arrow tables with the combination rule (sum, link, base score) in the master's; a manifest."""
    from fedcore.models.artifacts import read_version
    from fedcore.models.tables import combination_from_table

    model, frames, _ = _fit(loss, parties)
    model.save(tmp_path / "model")
    manifest, tables = read_version(tmp_path / "model")
    assert manifest["algorithm"] == "boosting" and manifest["params"]["criterion"] == "gradient"
    assert combination_from_table(tables["master"]) == model.master_.combination
    again = type(model).load(tmp_path / "model")
    assert again.get_params() == model.get_params()
    assert np.array_equal(again._predict_values(frames), model._predict_values(frames))
    if loss == "squared error":  # a forest's loader refuses a boosting model by name
        from fedcore.errors import ArtifactError
        from fedcore.vertical.estimators import FederatedForestRegressor

        with pytest.raises(ArtifactError, match="holds a 'boosting'/'vertical' model, expected 'forest'"):
            FederatedForestRegressor.load(tmp_path / "model")


def test_a_fitted_model_pickles_and_clones_with_xgboost_names() -> None:
    import pickle

    from sklearn.base import clone

    model, frames, _ = _fit("softmax", 2)
    again = pickle.loads(pickle.dumps(model))
    assert np.array_equal(again.predict_proba(frames), model.predict_proba(frames))
    assert clone(model).get_params()["colsample_bytree"] == PARAMS["colsample_bytree"]
    pd.testing.assert_series_equal(pd.concat(again.feature_importances_.values()),
                                   pd.concat(model.feature_importances_.values()))


def test_a_decision_threshold_decides_the_positive_class_at_or_above_it() -> None:
    """Binary: the second class where its probability >= the threshold; a bad one is refused at predict."""
    model, frames, _ = _fit("logistic", 2)
    assert_decides_at_thresholds(model, frames)
    assert (model.set_params(decision_threshold=0.2).predict(frames)
            != model.set_params(decision_threshold=0.8).predict(frames)).any()  # the threshold matters here


def test_a_decision_threshold_leaves_a_multiclass_prediction_most_probable() -> None:
    model, frames, _ = _fit("softmax", 2, decision_threshold=0.1)
    proba = model.predict_proba(frames)
    np.testing.assert_array_equal(model.predict(frames), model.classes_[np.argmax(proba, axis=1)])


@pytest.mark.parametrize("loss", ["logistic", "softmax", "squared error"])
def test_gain_importances_are_the_single_partys_split_by_party(loss) -> None:
    """Each party gets its own features' total-gain shares; together they are one party's, summing to 1.

    The master sees each party's share only (the sum over its features).
    """
    single = _fit(loss, 1)[0].feature_importances_
    (expected,) = single.values()
    assert expected.sum() == pytest.approx(1.0, abs=1e-12) and (expected > 0).any()
    for n_parties in (2, 3):
        model = _fit(loss, n_parties)[0]
        per_party = model.feature_importances_
        assert set(per_party) == {p.name for p in model.parties_}
        joined = pd.concat(per_party.values())
        pd.testing.assert_series_equal(joined[expected.index], expected)
        shares = model.master_.party_importance_shares()
        assert shares == pytest.approx({name: float(s.sum()) for name, s in per_party.items()}, abs=1e-12)


def test_a_refused_begin_batch_leaves_the_label_holders_round_and_margins_as_they_were() -> None:
    """A bad seed is refused before the holder adds the last round's leaves to its margins (review).

    Read after them, the refusal left the round counted and the leaves added: the next begin_batch added them
    again.
    """
    from fedcore.errors import ProtocolError
    from fedcore.protocol.messages import Header
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.boosting import BoostingParams
    from fedcore.vertical.master import VerticalMaster
    from fedcore.vertical.party import VerticalParty

    holder_frame, passive_frame = split_vertical(mixed_table(n_rows=80, seed=5), 2, label="target", seed=7,
                                                 label_party=0)
    holder = VerticalParty("holder", holder_frame, "target", feature_key=b"k" * 32)
    passive = VerticalParty("passive", passive_frame, feature_key=b"k" * 32)
    refused: list[str] = []

    def with_a_bad_seed_first(message: Message) -> Message:
        boost = holder._boost
        if message.kind == "begin_batch" and boost is not None and boost.round == 1 and not refused:
            before = boost.margins.copy()
            with pytest.raises(ProtocolError) as error:
                bad_seed = Header({**message.header, "seed": "one"})
                holder.handle(Message("begin_batch", bad_seed, message.arrays))
            refused.append(str(error.value))
            assert boost.round == 1 and np.array_equal(boost.margins, before)
        return holder.handle(message)

    params = BoostingParams(task="classification", n_estimators=3, max_depth=2, random_state=1)
    transport = InProcessTransport({"holder": with_a_bad_seed_first, "passive": passive.handle})
    model = VerticalMaster(transport, params).fit()
    assert len(refused) == 1 and "seed" in refused[0]
    expected = VerticalMaster(InProcessTransport({
        "holder": VerticalParty("holder", holder_frame, "target", feature_key=b"k" * 32).handle,
        "passive": VerticalParty("passive", passive_frame, feature_key=b"k" * 32).handle}), params).fit()
    for field in ("tree", "node", "left", "right", "owner", "weight", "value"):  # the refusal changed none
        np.testing.assert_array_equal(getattr(model, field), getattr(expected, field))


def test_a_refused_find_splits_leaves_the_partition_as_it_was() -> None:
    """Candidates that do not fit the level are refused before the last level's splits are applied (review).

    Applied first, the refusal left the nodes split, and the master's next find_splits split them again.
    """
    from fedcore.errors import ProtocolError
    from fedcore.protocol.messages import Arrays
    from fedcore.transport.inprocess import InProcessTransport
    from fedcore.trees.boosting import BoostingParams
    from fedcore.vertical.master import VerticalMaster
    from fedcore.vertical.party import VerticalParty

    holder_frame, passive_frame = split_vertical(mixed_table(n_rows=80, seed=5), 2, label="target", seed=7,
                                                 label_party=0)
    params = BoostingParams(task="classification", n_estimators=2, max_depth=3, random_state=1)

    def parties() -> tuple[VerticalParty, VerticalParty]:
        return (VerticalParty("holder", holder_frame, "target", feature_key=b"k" * 32),
                VerticalParty("passive", passive_frame, feature_key=b"k" * 32))

    holder, passive = parties()
    refused: list[str] = []

    def a_bad_request_first(message: Message) -> Message:
        if message.kind == "find_splits" and "split_mask" in message.arrays and not refused:
            before = passive.rows.node_sizes().copy()
            bad = Arrays({**message.arrays, "feat_ptr": message.arrays["feat_ptr"][:-1]})
            with pytest.raises(ProtocolError) as error:
                passive.handle(Message("find_splits", message.header, bad))
            refused.append(str(error.value))
            np.testing.assert_array_equal(passive.rows.node_sizes(), before)
        return passive.handle(message)

    model = VerticalMaster(InProcessTransport({"holder": holder.handle, "passive": a_bad_request_first}),
                           params).fit()
    assert refused == ["party 'passive' refuses the request: feat_ptr must index the candidates per node"]
    holder, passive = parties()
    expected = VerticalMaster(InProcessTransport({"holder": holder.handle, "passive": passive.handle}),
                              params).fit()
    for field in ("tree", "node", "left", "right", "owner", "weight", "value"):
        np.testing.assert_array_equal(getattr(model, field), getattr(expected, field))
