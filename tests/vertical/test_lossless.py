"""Exact losslessness: M parties give node-for-node the trees and predictions of the single-party run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes

from fedcore.data.split import split_vertical
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from tests.conftest import mixed_table


def _fit(cls, table: pd.DataFrame, n_parties: int, **params):
    parties = split_vertical(table, n_parties, label="target", seed=7, label_party=n_parties - 1)
    model = cls(random_state=3, **params).fit(parties, label="target")
    return model, [[c for c in p.columns if c != "target"] for p in parties]


def _splits_by_node(model) -> pd.DataFrame:
    """Every split as (tree, node) -> column, threshold, missing direction, category set."""
    rows = []
    for party in model.parties_:
        m = party.model
        for g in np.flatnonzero(m.feature >= 0):
            rows.append((int(m.tree[g]), int(m.node[g]), m.column_names[m.feature[g]], float(m.threshold[g]),
                         bool(m.missing_left[g]), tuple(int(x) for x in m.cat_bits[g])))
    frame = pd.DataFrame(rows, columns=["tree", "node", "column", "threshold", "missing_left", "cats"])
    return frame.sort_values(["tree", "node"]).reset_index(drop=True)


def _assert_same_forest(single, federated) -> None:
    a, b = single.master_.structure, federated.master_.structure
    for field in ("tree", "node", "left", "right", "depth", "weight", "value"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    pd.testing.assert_frame_equal(_splits_by_node(single), _splits_by_node(federated))


DATASETS = {
    "mixed3": lambda: (mixed_table(seed=1, n_classes=3), FederatedForestClassifier),
    "mixed2": lambda: (mixed_table(seed=2, n_classes=2), FederatedForestClassifier),
    "mixed_reg": lambda: (mixed_table(seed=3, task="regression"), FederatedForestRegressor),
    "breast_cancer": lambda: (load_breast_cancer(as_frame=True).frame.rename(columns={"target": "target"}),
                              FederatedForestClassifier),
    "diabetes": lambda: (load_diabetes(as_frame=True).frame, FederatedForestRegressor),
}


PARAMS = {"n_estimators": 8, "max_depth": 8}


@pytest.fixture(scope="module")
def single_party():
    """Each dataset's single-party forest, fitted once for the module: the reference of every M."""
    fitted = {}

    def reference(dataset: str):
        if dataset not in fitted:
            table, cls = DATASETS[dataset]()
            fitted[dataset] = _fit(cls, table, 1, **PARAMS)[0]
        return fitted[dataset]

    return reference


@pytest.mark.parametrize("dataset", sorted(DATASETS))
@pytest.mark.parametrize("n_parties", [2, 3, 5])
def test_federated_equals_single_party(single_party, dataset: str, n_parties: int) -> None:
    table, cls = DATASETS[dataset]()
    single = single_party(dataset)
    federated, columns = _fit(cls, table, n_parties, **PARAMS)
    _assert_same_forest(single, federated)
    owners = federated.master_.structure.owner
    assert federated.master_.structure.max_depth() >= 4
    assert set(owners[owners >= 0]) == set(range(n_parties)), "every party should own some split"
    test = table.drop(columns="target")
    expected = single._predict_values([test])
    got = federated._predict_values([test[c] for c in columns])
    np.testing.assert_array_equal(expected, got)


@pytest.mark.parametrize("options", [
    {"feature_sampling": "tree", "max_features": 0.5},
    {"criterion": "entropy", "max_features": "log2", "min_samples_leaf": 3},
    {"bootstrap": False, "max_features": None, "min_impurity_decrease": 0.001},
    {"max_samples": 0.5, "min_samples_split": 10, "tree_batch_size": 3},
])
def test_federated_equals_single_party_under_options(options: dict) -> None:
    table = mixed_table(seed=4, n_classes=3)
    single, _ = _fit(FederatedForestClassifier, table, 1, n_estimators=7, max_depth=6, **options)
    federated, _ = _fit(FederatedForestClassifier, table, 3, n_estimators=7, max_depth=6, **options)
    _assert_same_forest(single, federated)


def test_unlimited_depth_grows_pure_leaves() -> None:
    table = mixed_table(seed=5, n_classes=2)
    model, columns = _fit(FederatedForestClassifier, table, 2, n_estimators=3, bootstrap=False,
                          max_features=None)
    s = model.master_.structure
    leaves = s.left == -1
    assert np.all(s.value[leaves].max(axis=1) == 1.0)  # no two rows of the table are identical
    train = model.predict([table[c] for c in columns])
    np.testing.assert_array_equal(train, table["target"].to_numpy())
