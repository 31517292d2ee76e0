"""Regression pins: a small forest of every algorithm and mode hashes to its recorded digest.

Each is trained with a fixed seed; the digests are those the engine produced before the one-grower refactor
(issue #12). A refactor of growth, batching or kernels that changes a single node, threshold, weight or value
fails here.

The cases use gini / squared error (only +, -, *, / and comparisons on counts: the same bits on every
CPU) and seeded noise, so the digests do not depend on the machine. Boosting's logistic and softmax cases
also take libm's exp and log (the label holder's gradients and base score), as entropy takes log2. When a
change is *meant* to alter models, recompute with `python -m tests.trees.test_model_digests` and say why
in the commit.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fedcore.compute.cluster import DaskCompute
from fedcore.data.split import split_vertical
from fedcore.horizontal import FederatedExtraTreesClassifier, FederatedExtraTreesRegressor, PPDERTClassifier
from fedcore.horizontal.boosting import HorizontalBoostingClassifier, HorizontalBoostingRegressor
from fedcore.privacy.ldp import LabelLDP
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier, FederatedBoostingRegressor
from fedcore.vertical.estimators import FederatedForestClassifier, FederatedForestRegressor
from tests.conftest import mixed_table
from tests.horizontal.common import horizontal_table, split_rows

BLOOM = {"mode": "ldp", "mechanism": "bloom"}  # the FET paper's mechanism (no longer the default)


def digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over every array's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _vertical(cls, table, n_parties: int, **params) -> dict[str, np.ndarray]:
    parties = split_vertical(table, n_parties, label="target", seed=7, label_party=0)
    model = cls(random_state=3, **params).fit(parties, label="target")
    s = model.master_.structure
    arrays = {f: getattr(s, f) for f in ("tree", "node", "left", "right", "depth", "owner",
                                         "weight", "value")}
    for index, party in enumerate(model.parties_):
        m = party.model
        for field in ("feature", "threshold", "missing_left", "cat_bits"):
            arrays[f"party{index}.{field}"] = np.asarray(getattr(m, field))
    return arrays


_DASK = DaskCompute(workers=3, processes=False)
"""A LocalCluster of three in-process workers, started for the fit and closed after it."""


def _horizontal(model, table, n_parties: int) -> dict[str, np.ndarray]:
    return model.fit(split_rows(table, n_parties, seed=n_parties), label="target").model_.arrays()


def _horizontal_boosting(model, table, n_parties: int) -> dict[str, np.ndarray]:
    fitted = model.fit(split_rows(table, n_parties, seed=n_parties), label="target").model_
    return {**fitted.arrays(), "base_score": np.array(fitted.combination.base_score)}


def _paillier_key():
    from fedcore.privacy.paillier import generate_keypair

    return generate_keypair(1024, insecure_for_tests=True)


def _ou_key():
    from fedcore.privacy.okamoto_uchiyama import generate_keypair

    return generate_keypair(1024, insecure_for_tests=True)


CASES = {
    "vertical plain gini": lambda: _vertical(
        FederatedForestClassifier, mixed_table(seed=1, n_classes=3), 3, n_estimators=5, max_depth=6),
    "vertical plain regression, batches": lambda: _vertical(
        FederatedForestRegressor, mixed_table(seed=3, task="regression"), 2, n_estimators=5, max_depth=5,
        tree_batch_size=2, max_samples=0.7),
    "vertical plain per-tree features, no bootstrap": lambda: _vertical(
        FederatedForestClassifier, mixed_table(seed=4, n_classes=2), 3, n_estimators=4,
        feature_sampling="tree", bootstrap=False, max_features=0.5, min_samples_leaf=3),
    # boosting (issue #32): the same engine on gradient statistics (1, 2, 3 and 5 parties give the same
    # model: tests/vertical/test_boosting.py)
    "vertical boosting squared error": lambda: _vertical(
        FederatedBoostingRegressor, mixed_table(seed=3, task="regression"), 2, n_estimators=4, max_depth=4,
        subsample=0.8, colsample_bytree=0.8),
    "vertical boosting logistic": lambda: _vertical(
        FederatedBoostingClassifier, mixed_table(seed=4, n_classes=2), 3, n_estimators=4, max_depth=4,
        learning_rate=0.5, gamma=0.1, min_child_weight=2.0),
    "vertical boosting softmax": lambda: _vertical(
        FederatedBoostingClassifier, mixed_table(seed=1, n_classes=3), 3, n_estimators=3, max_depth=3,
        reg_lambda=0.5, subsample=0.7),
    # encrypted gradients (SecureBoost): the plain cases above with (g, h) encrypted, so their digests
    "vertical boosting squared error, ou": lambda: _vertical(
        FederatedBoostingRegressor, mixed_table(seed=3, task="regression"), 2, n_estimators=4, max_depth=4,
        subsample=0.8, colsample_bytree=0.8, privacy="ou", label_key=_ou_key()),
    "vertical boosting softmax, paillier": lambda: _vertical(
        FederatedBoostingClassifier, mixed_table(seed=1, n_classes=3), 3, n_estimators=3, max_depth=3,
        reg_lambda=0.5, subsample=0.7, privacy="paillier", label_key=_paillier_key()),
    "vertical paillier": lambda: _vertical(
        FederatedForestClassifier, mixed_table(n_rows=200, seed=11, n_classes=3), 2, n_estimators=2,
        max_depth=4, privacy="paillier", label_key=_paillier_key()),
    "fet plain": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=5, random_state=11), horizontal_table(seed=1), 3),
    "fet plain regression, batches": lambda: _horizontal(
        FederatedExtraTreesRegressor(n_estimators=5, random_state=11, tree_batch_size=2, max_depth=7),
        horizontal_table(seed=3, task="regression"), 2),
    "fet gdp": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=4, random_state=5, privacy="gdp", epsilon=2.0,
                                      max_depth=5, allow_data_ranges=True),
        horizontal_table(seed=2), 3),
    "fet gdp regression": lambda: _horizontal(
        FederatedExtraTreesRegressor(n_estimators=3, random_state=5, privacy="gdp", epsilon=2.0, max_depth=4,
                                     allow_data_ranges=True),
        horizontal_table(seed=3, task="regression"), 2),
    # only epsilon given: the default plan (leaf release, drawn structure, depth from the noisy row count)
    "fet gdp leaves": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=4, random_state=5, privacy="gdp", epsilon=2.0,
                                      allow_data_ranges=True),
        horizontal_table(seed=2), 3),
    "fet ldp bloom": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=4, random_state=6, privacy=BLOOM, allow_data_ranges=True),
        horizontal_table(seed=2), 3),
    "fet ldp oue": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=4, random_state=6, privacy="ldp", allow_data_ranges=True,
                                      ldp=LabelLDP(mechanism="oue", report_epsilon=3.0)),
        horizontal_table(seed=2), 3),
    "fet ldp krr": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=4, random_state=6, privacy="ldp", allow_data_ranges=True,
                                      ldp=LabelLDP(mechanism="krr", report_epsilon=4.0)),
        horizontal_table(seed=2), 2),
    "ppdert secure": lambda: _horizontal(
        PPDERTClassifier(n_estimators=5, random_state=9, allow_data_ranges=True, max_depth=8,
                         thresholds="domain"),
        horizontal_table(seed=1), 3),
    "ppdert secure histogram": lambda: _horizontal(
        PPDERTClassifier(n_estimators=5, random_state=9, allow_data_ranges=True, max_depth=8),
        horizontal_table(seed=1), 3),
    # horizontal boosting under secure aggregation (issue #32; 1, 2 and 3 parties give the same model:
    # tests/horizontal/test_boosting.py)
    "horizontal boosting logistic": lambda: _horizontal_boosting(
        HorizontalBoostingClassifier(n_estimators=4, max_depth=4, learning_rate=0.5, gamma=0.1,
                                     min_child_weight=2.0, allow_data_ranges=True, random_state=3),
        horizontal_table(seed=4, n_classes=2), 3),
    "horizontal boosting softmax": lambda: _horizontal_boosting(
        HorizontalBoostingClassifier(n_estimators=3, max_depth=3, reg_lambda=0.5, colsample_bytree=0.7,
                                     allow_data_ranges=True, random_state=3),
        horizontal_table(seed=1), 3),
    "horizontal boosting squared error": lambda: _horizontal_boosting(
        HorizontalBoostingRegressor(n_estimators=4, max_depth=4, max_bins=32, allow_data_ranges=True,
                                    random_state=3),
        horizontal_table(seed=3, task="regression"), 2),
    # the same forests with every party's rows on a Dask cluster of three workers, in blocks of 50 rows
    # (issue #29), and a vertical classifier's and regressor's: pinned to the in-process digests above (FET
    # plain classification on Dask is compared with the in-process forest in tests/compute/test_dask_party.py)
    "fet gdp regression, dask": lambda: _horizontal(
        FederatedExtraTreesRegressor(n_estimators=3, random_state=5, privacy="gdp", epsilon=2.0, max_depth=4,
                                     compute=_DASK, block_rows=50, allow_data_ranges=True),
        horizontal_table(seed=3, task="regression"), 2),
    "ppdert secure histogram, dask": lambda: _horizontal(
        PPDERTClassifier(n_estimators=5, random_state=9, allow_data_ranges=True, max_depth=8, compute=_DASK,
                         block_rows=50),
        horizontal_table(seed=1), 3),
    "fet ldp bloom, dask": lambda: _horizontal(
        FederatedExtraTreesClassifier(n_estimators=4, random_state=6, privacy=BLOOM, compute=_DASK,
                                      block_rows=50, allow_data_ranges=True),
        horizontal_table(seed=2), 3),
    "vertical plain gini, dask": lambda: _vertical(
        FederatedForestClassifier, mixed_table(seed=1, n_classes=3), 3, n_estimators=5, max_depth=6,
        compute=_DASK, block_rows=50),
    # the encrypted forest with Okamoto-Uchiyama on Dask: the same model as "vertical paillier" in process
    "vertical ou, dask": lambda: _vertical(
        FederatedForestClassifier, mixed_table(n_rows=200, seed=11, n_classes=3), 2, n_estimators=2,
        max_depth=4, privacy="ou", label_key=_ou_key(), compute=_DASK, block_rows=50),
    "vertical plain regression, batches, dask": lambda: _vertical(
        FederatedForestRegressor, mixed_table(seed=3, task="regression"), 2, n_estimators=5, max_depth=5,
        tree_batch_size=2, max_samples=0.7, compute=_DASK, block_rows=50),
    # vertical boosting with every party's rows, each round's (g, h) and the label holder's leaf weights on
    # the blocks, plain and SecureBoost (issue #29): the in-process digests
    "vertical boosting softmax, dask": lambda: _vertical(
        FederatedBoostingClassifier, mixed_table(seed=1, n_classes=3), 3, n_estimators=3, max_depth=3,
        reg_lambda=0.5, subsample=0.7, compute=_DASK, block_rows=50),
    "vertical boosting squared error, ou, dask": lambda: _vertical(
        FederatedBoostingRegressor, mixed_table(seed=3, task="regression"), 2, n_estimators=4, max_depth=4,
        subsample=0.8, colsample_bytree=0.8, privacy="ou", label_key=_ou_key(), compute=_DASK, block_rows=50),
    # horizontal boosting with every party's margins and (g, h) on the blocks: the in-process digest
    "horizontal boosting softmax, dask": lambda: _horizontal_boosting(
        HorizontalBoostingClassifier(n_estimators=3, max_depth=3, reg_lambda=0.5, colsample_bytree=0.7,
                                     allow_data_ranges=True, random_state=3, compute=_DASK, block_rows=50),
        horizontal_table(seed=1), 3),
}

PINNED = {
    'vertical plain gini': '3ef066ddaa07724e',
    'vertical plain regression, batches': '502a058bd2d47094',
    'vertical plain per-tree features, no bootstrap': '0efe99659c225416',
    'vertical boosting squared error': '07fd3a3a0efc1409',
    'vertical boosting logistic': '92a43705acfebc07',
    'vertical boosting softmax': 'ae42f648555a3cd4',
    'vertical paillier': 'f0a92a2261a1e10a',
    'vertical boosting squared error, ou': '07fd3a3a0efc1409',
    'vertical boosting softmax, paillier': 'ae42f648555a3cd4',
    'fet plain': '446d5a9d39c1101b',
    'fet plain regression, batches': '771c434ef1ba80de',
    'fet gdp': 'ed0760427b5231b8',
    'fet gdp regression': '9fc4c505ac99a997',
    'fet gdp leaves': 'f5e7a6c7652c1671',
    'fet ldp bloom': '56d93e154aaa7449',
    'fet ldp krr': 'd14c7a2358633734',
    'fet ldp oue': 'f14dfa9131f438bc',
    'ppdert secure': '1226ead6a817ac16',
    'ppdert secure histogram': '541d7c9f1d5fe577',
    'horizontal boosting logistic': '32bc0cdcd3a765e7',
    'horizontal boosting softmax': 'bf671f8ad4ddc4fc',
    'horizontal boosting squared error': 'c846fb232817a513',
    'fet gdp regression, dask': '9fc4c505ac99a997',
    'ppdert secure histogram, dask': '541d7c9f1d5fe577',
    'fet ldp bloom, dask': '56d93e154aaa7449',
    'vertical plain gini, dask': '3ef066ddaa07724e',
    'vertical ou, dask': 'f0a92a2261a1e10a',
    'vertical plain regression, batches, dask': '502a058bd2d47094',
    'horizontal boosting softmax, dask': 'bf671f8ad4ddc4fc',
    'vertical boosting softmax, dask': 'ae42f648555a3cd4',
    'vertical boosting squared error, ou, dask': '07fd3a3a0efc1409',
}


@pytest.mark.parametrize("case", list(CASES))
def test_model_digest_is_pinned(case: str) -> None:
    assert digest(CASES[case]()) == PINNED[case]


if __name__ == "__main__":  # print the current digests, to pin after an intended model change
    for name, build in CASES.items():
        print(f"    {name!r}: {digest(build())!r},")
