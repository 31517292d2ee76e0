"""Boosting's split gain, gamma, min_child_weight and leaf weights against XGBoost's formulas.

The reference below grows XGBoost's exact greedy trees in plain Python on a tiny table of small integers
(every value its own bin, so the histogram engine sees every threshold the reference does):

    gain = (G_L^2/(H_L+lambda) + G_R^2/(H_R+lambda) - G^2/(H+lambda)) / 2, split if 2 gain >= gamma (XGBoost
    compares min_split_loss with the sum before halving) and both children keep H >= min_child_weight; leaf
    weight -G/(H+lambda) times the learning rate.

(xgboost itself is not installed where the tests run: it is in the `bench` extra, see docs/design.md.) The
estimators' predictions on the training rows must equal the reference's to rounding. Also checked against
scikit-learn's HistGradientBoosting (same rounds, depth, learning rate and L2) on a larger table: accuracy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedcore.data.split import split_vertical
from fedcore.trees.losses import LOGISTIC, SQUARED_ERROR_LOSS, base_score, gradients, transform
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier, FederatedBoostingRegressor

PARAMS = {"n_estimators": 4, "max_depth": 3, "learning_rate": 0.4, "reg_lambda": 0.7, "gamma": 0.05,
          "min_child_weight": 0.6}


def reference_tree(X: np.ndarray, g: np.ndarray, h: np.ndarray, depth: int, p: dict) -> dict:
    """One XGBoost tree grown greedily from the formulas; ties keep the first feature, then the lowest cut."""
    lam = p["reg_lambda"]
    G, H = float(g.sum()), float(h.sum())
    leaf = {"value": p["learning_rate"] * (-G / (H + lam))}
    if depth == p["max_depth"] or len(g) < 2:
        return leaf
    best = (-np.inf, None, None)
    for f in range(X.shape[1]):
        values = np.unique(X[:, f])
        for cut in values[:-1]:
            left = X[:, f] <= cut
            gl, hl = float(g[left].sum()), float(h[left].sum())
            gr, hr = G - gl, H - hl
            if hl < p["min_child_weight"] or hr < p["min_child_weight"]:
                continue
            gain = (gl * gl / (hl + lam) + gr * gr / (hr + lam) - G * G / (H + lam)) / 2
            if gain > best[0] + 1e-9 * max(abs(gain), 1.0):
                best = (gain, f, cut)
    gain, f, cut = best
    if f is None or 2 * gain < p["gamma"] or gain <= 1e-12 * len(g):
        return leaf
    left = X[:, f] <= cut
    return {"feature": f, "cut": cut,
            "left": reference_tree(X[left], g[left], h[left], depth + 1, p),
            "right": reference_tree(X[~left], g[~left], h[~left], depth + 1, p)}


def reference_predict(tree: dict, X: np.ndarray) -> np.ndarray:
    """Each row's leaf value in one reference tree."""
    if "value" in tree:
        return np.full(len(X), tree["value"])
    left = X[:, tree["feature"]] <= tree["cut"]
    out = np.empty(len(X))
    out[left] = reference_predict(tree["left"], X[left])
    out[~left] = reference_predict(tree["right"], X[~left])
    return out


def reference_margins(X: np.ndarray, y: np.ndarray, loss, p: dict) -> np.ndarray:
    """The margins of n_estimators reference rounds, from the base score (one output)."""
    margins = np.tile(base_score(loss, y, 2), (len(y), 1))
    for _ in range(p["n_estimators"]):
        gh = gradients(loss, y, margins)[0]
        margins[:, 0] += reference_predict(reference_tree(X, gh[:, 0], gh[:, 1], 0, p), X)
    return margins


def tiny_table(seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """60 rows of three small-integer features (a few distinct values each) and a noisy signal."""
    rng = np.random.default_rng(seed)
    X = np.stack([rng.integers(0, 6, 60), rng.integers(0, 4, 60), rng.integers(0, 9, 60)], axis=1)
    signal = X[:, 0] * 0.7 - (X[:, 1] == 2) * 1.3 + np.sin(X[:, 2]) + rng.normal(scale=0.4, size=60)
    return pd.DataFrame(X.astype(np.float64), columns=["a", "b", "c"]), signal


def test_regression_equals_xgboost_formulas() -> None:
    frame, signal = tiny_table(1)
    X = frame.to_numpy()
    expected = reference_margins(X, signal, SQUARED_ERROR_LOSS, PARAMS)[:, 0]
    parties = split_vertical(frame.assign(target=signal), 2, label="target", seed=3, label_party=0)
    model = FederatedBoostingRegressor(**PARAMS).fit(parties, label="target")
    got = model.predict([p.drop(columns="target", errors="ignore") for p in parties])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert len(np.unique(np.round(got, 9))) > 8  # the trees split: the comparison is not of constants


def test_logistic_equals_xgboost_formulas() -> None:
    frame, signal = tiny_table(2)
    y = (signal > np.median(signal)).astype(np.float64)
    X = frame.to_numpy()
    expected = transform("sigmoid", reference_margins(X, y, LOGISTIC, PARAMS))
    parties = split_vertical(frame.assign(target=y.astype(int)), 3, label="target", seed=3, label_party=1)
    model = FederatedBoostingClassifier(**PARAMS).fit(parties, label="target")
    got = model.predict_proba([p.drop(columns="target", errors="ignore") for p in parties])
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert model.classes_.tolist() == [0, 1]


def test_gamma_and_min_child_weight_stop_splits() -> None:
    """A gamma above every gain leaves stumps-less trees (one leaf); a large min_child_weight as well."""
    frame, signal = tiny_table(3)
    parties = split_vertical(frame.assign(target=signal), 2, label="target", seed=3, label_party=0)
    for blocking in ({"gamma": 1e6}, {"min_child_weight": 31.0}):
        model = FederatedBoostingRegressor(**{**PARAMS, **blocking}).fit(parties, label="target")
        assert len(model.master_.structure.tree) == PARAMS["n_estimators"]  # a root leaf per round
    model = FederatedBoostingRegressor(**{**PARAMS, "min_child_weight": 29.0}).fit(parties, label="target")
    assert len(model.master_.structure.tree) > PARAMS["n_estimators"]  # 30 rows a side still split


@pytest.mark.parametrize(("gamma", "leaves"), [(99.0, 2), (100.0, 2), (101.0, 1)])
def test_gamma_is_on_xgboosts_scale(gamma: float, leaves: int) -> None:
    """Rows (0, 0, 10, 10), base score 5, lambda 0: the split's G_L^2/H_L + G_R^2/H_R - G^2/H is 100.

    xgboost 2.1.4 (hist, max_depth 1, min_child_weight 0) splits at gamma 99 and 100, not at 101; so must the
    engine, whose gain (the textbook one, halved) is 50.
    """
    frame = pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "target": [0.0, 0.0, 10.0, 10.0]})
    model = FederatedBoostingRegressor(n_estimators=1, max_depth=1, learning_rate=1.0, reg_lambda=0.0,
                                       gamma=gamma, min_child_weight=0.0).fit([frame], label="target")
    assert len(model.master_.structure.tree) == 2 * leaves - 1


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_accuracy_near_scikit_learns_histogram_boosting(task: str) -> None:
    """Same rounds, depth, learning rate and L2 as HistGradientBoosting: held-out score within 0.03."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    rng = np.random.default_rng(7)
    n = 1500
    X = rng.normal(size=(n, 10))
    signal = X[:, 0] * 1.5 - X[:, 1] * X[:, 2] + np.abs(X[:, 3]) + rng.normal(scale=0.5, size=n)
    y = (signal > 0.8).astype(int) if task == "classification" else signal
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(10)]).assign(target=y)
    train, test = frame.iloc[:1000], frame.iloc[1000:]
    params = {"n_estimators": 30, "max_depth": 4, "learning_rate": 0.2, "reg_lambda": 1.0}
    ours = (FederatedBoostingClassifier if task == "classification" else FederatedBoostingRegressor)(**params)
    parties = split_vertical(train, 3, label="target", seed=1)
    ours.fit(parties, label="target")
    test_parties = [test[[c for c in p.columns if c != "target"]] for p in parties]
    reference_class = (HistGradientBoostingClassifier if task == "classification"
                       else HistGradientBoostingRegressor)
    reference = reference_class(
        max_iter=30, max_depth=4, learning_rate=0.2, l2_regularization=1.0, max_leaf_nodes=None,
        min_samples_leaf=1, early_stopping=False, random_state=0)
    reference.fit(train.drop(columns="target"), train["target"])
    score = ours.score(test_parties, test["target"])
    assert score > reference.score(test.drop(columns="target"), test["target"]) - 0.03
