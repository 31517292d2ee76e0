"""Exact losslessness: M parties give the forest and the outputs of all rows at one party.

Node for node and prediction for prediction, against the same engine run with every row at one party (same
seed).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from tests.horizontal.common import assert_same_forest, horizontal_table, split_rows

TABLES = {
    "classification": lambda: horizontal_table(seed=1, n_classes=3),
    "regression": lambda: horizontal_table(seed=3, task="regression"),
}
NUMERIC = [f"num{i}" for i in range(8)] + ["int0"]


def _estimator(kind: str, **params):
    common = {"n_estimators": 6, "random_state": 11, **params}
    if kind == "fet-classification":
        return FederatedExtraTreesClassifier(**common)
    if kind == "fet-regression":
        return FederatedExtraTreesRegressor(**common)
    if kind == "ppdert-domain":
        return PPDERTClassifier(allow_data_ranges=True, thresholds="domain", **common)
    return PPDERTClassifier(allow_data_ranges=True, **common)  # histogram thresholds


def _table(kind: str):
    return TABLES["regression" if kind == "fet-regression" else "classification"]()


def _predict(model, frame):
    return model.predict_proba(frame) if hasattr(model, "predict_proba") else model.predict(frame)


@pytest.fixture(scope="module")
def single_runs():
    """The pooled run of each engine (computed once per module)."""
    out = {}
    for kind in ("fet-classification", "fet-regression", "ppdert", "ppdert-domain"):
        table = _table(kind)
        out[kind] = _estimator(kind).fit([table], label="target")
    return out


@pytest.mark.parametrize("n_parties", [2, 3, 5])
@pytest.mark.parametrize("kind", ["fet-classification", "fet-regression", "ppdert", "ppdert-domain"])
def test_federated_equals_single_party(single_runs, kind: str, n_parties: int) -> None:
    table = _table(kind)
    single = single_runs[kind]
    federated = _estimator(kind).fit(split_rows(table, n_parties, seed=n_parties), label="target")
    assert_same_forest(single.model_, federated.model_)
    np.testing.assert_array_equal(_predict(single, table), _predict(federated, table))
    # the forests are real: deep trees, splits on categorical and numeric columns
    forest = federated.model_
    assert forest.max_depth() >= 5
    used = {forest.schema.names[f] for f in forest.feature[forest.feature >= 0]}
    assert {"cat_str", "cat_pd"} & used and {"num1", "num0"} & used
    # every party and the master end with the complete model
    for party in federated.parties_:
        assert_same_forest(forest, party.model)


def test_row_order_within_a_party_does_not_matter(single_runs) -> None:
    table = _table("fet-classification")
    shuffled = table.sample(frac=1.0, random_state=5).reset_index(drop=True)
    again = _estimator("fet-classification").fit([shuffled], label="target")
    assert_same_forest(single_runs["fet-classification"].model_, again.model_)


def test_tree_batches_give_the_same_forest(single_runs) -> None:
    table = _table("fet-regression")
    batched = _estimator("fet-regression", tree_batch_size=4).fit(split_rows(table, 3), label="target")
    assert_same_forest(single_runs["fet-regression"].model_, batched.model_)


def test_a_different_seed_gives_a_different_forest(single_runs) -> None:
    table = _table("fet-classification")
    other = _estimator("fet-classification", random_state=12).fit([table], label="target")
    assert not np.array_equal(other.model_.threshold, single_runs["fet-classification"].model_.threshold,
                              equal_nan=True)


def test_constraints_hold_on_every_node() -> None:
    table = _table("fet-classification")
    model = _estimator("fet-classification", max_depth=4, min_samples_leaf=7, min_samples_split=20).fit(
        split_rows(table, 3), label="target")
    f = model.model_
    assert f.max_depth() <= 4
    assert f.weight.min() >= 7
    internal = f.feature >= 0
    assert (f.weight[internal] >= 20).all()
    # children partition their parent exactly (plain counts)
    offsets = f.tree_offsets()
    rows = np.flatnonzero(internal)
    base = offsets[f.tree[rows]]
    np.testing.assert_array_equal(f.weight[base + f.left[rows]] + f.weight[base + f.right[rows]],
                                  f.weight[rows])
    # pure nodes are never split
    assert not np.any(internal & (f.value.max(axis=1) == 1.0))


@pytest.mark.parametrize("cls", [FederatedExtraTreesClassifier, PPDERTClassifier])
def test_entropy_criterion_is_lossless_too(cls) -> None:
    table = _table("fet-classification")
    extra = {"allow_data_ranges": True} if cls is PPDERTClassifier else {}
    runs = [cls(4, criterion="entropy", max_features=3, random_state=2, **extra)
            .fit(split_rows(table, m), "target") for m in (1, 4)]
    assert_same_forest(runs[0].model_, runs[1].model_)
    gini = cls(4, max_features=3, random_state=2, **extra).fit([table], "target")
    assert not np.array_equal(gini.model_.feature, runs[0].model_.feature)


def test_ppd_ert_without_masks_gives_the_same_forest_and_is_refused_by_a_secure_party() -> None:
    from fedcore.errors import ProtocolError
    from fedcore.horizontal.ppdert.master import PPDERTMaster
    from fedcore.horizontal.ppdert.party import PPDERTParty
    from fedcore.transport.inprocess import InProcessTransport

    table = horizontal_table(seed=7)
    parties = split_rows(table, 3, seed=1)
    options = {"n_estimators": 4, "max_depth": 5, "random_state": 3, "allow_data_ranges": True}
    secure = PPDERTClassifier(**options).fit(parties, label="target")
    plain = PPDERTClassifier(**options, secure_aggregation=False,
                             record_transcript=True).fit(parties, label="target")
    assert plain.model_.same_as(secure.model_) and plain.privacy_report_["mode"] == "none"
    assert "ppdert_masked_counts" not in {e.kind for e in plain.transcript_}

    k = plain.params.n_candidate_features(plain.schema_.n_features)
    members = [PPDERTParty(f"p{i}", frame, plain.schema_, seed=3, low=plain._low, high=plain._high, k=k,
                           # p0 insists on secure aggregation
                           secure=i == 0) for i, frame in enumerate(parties)]
    transport = InProcessTransport({p.name: p.handle for p in members})
    master = PPDERTMaster(transport, plain.params, plain.schema_, low=plain._low, high=plain._high,
                          secure=False)
    with pytest.raises(ProtocolError,
                       match="party 'p0' runs PPD-ERT with secure aggregation; the master asked for "
                             "plain counts"):
        master.fit()
