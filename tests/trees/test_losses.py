"""Boosting's losses (fedcore/trees/losses.py): gradients and hessians against finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.trees.losses import (
    HESSIAN_FLOOR,
    LOGISTIC,
    SOFTMAX,
    SQUARED_ERROR_LOSS,
    base_score,
    gradients,
    loss_for,
    transform,
)


def loss_value(loss, y: float, margin: np.ndarray) -> float:
    """The loss of one row, from its definition: squared error / 2, log loss of the sigmoid or softmax."""
    if loss is SQUARED_ERROR_LOSS:
        return 0.5 * (margin[0] - y) ** 2
    if loss is LOGISTIC:
        p = 1 / (1 + math.exp(-margin[0]))
        return -(y * math.log(p) + (1 - y) * math.log(1 - p))
    top = max(margin)
    log_total = top + math.log(sum(math.exp(m - top) for m in margin))
    return -(margin[int(y)] - log_total)


CASES = [(SQUARED_ERROR_LOSS, lambda rng: rng.normal(size=7) * 3, 1),
         (LOGISTIC, lambda rng: rng.integers(0, 2, 7).astype(float), 1),
         (SOFTMAX, lambda rng: rng.integers(0, 4, 7).astype(float), 4)]


@pytest.mark.parametrize(("loss", "labels", "k"), CASES, ids=["squared", "logistic", "softmax"])
def test_gradients_and_hessians_are_the_loss_derivatives(loss, labels, k: int) -> None:
    """G = dL/dm and h = d2L/dm2 by central differences (softmax: XGBoost's 2 x the diagonal)."""
    rng = np.random.default_rng(5)
    y = labels(rng)
    margins = rng.normal(size=(len(y), k)) * 2
    gh = gradients(loss, y, margins)
    assert gh.shape == (k, len(y), 2)
    step = 1e-4
    for i in range(len(y)):
        for c in range(k):
            up, down = margins[i].copy(), margins[i].copy()
            up[c] += step
            down[c] -= step
            centre = loss_value(loss, y[i], margins[i])
            g = (loss_value(loss, y[i], up) - loss_value(loss, y[i], down)) / (2 * step)
            h = (loss_value(loss, y[i], up) - 2 * centre + loss_value(loss, y[i], down)) / step**2
            assert gh[c, i, 0] == pytest.approx(g, rel=1e-6, abs=1e-8)
            factor = 2.0 if loss is SOFTMAX else 1.0
            assert gh[c, i, 1] == pytest.approx(factor * h, rel=1e-4, abs=1e-6)


def test_hessians_have_xgboosts_floor() -> None:
    """A saturated sigmoid's hessian is 1e-16, not 0 (a leaf of such rows keeps a finite weight)."""
    gh = gradients(LOGISTIC, np.array([1.0, 0.0]), np.array([[800.0], [-800.0]]))
    assert gh[0, :, 1].tolist() == [HESSIAN_FLOOR, HESSIAN_FLOOR]
    assert gh[0, :, 0].tolist() == [0.0, 0.0]


def test_base_scores_are_the_label_mean_its_log_odds_and_log_shares() -> None:
    assert base_score(SQUARED_ERROR_LOSS, np.array([1.0, 2.0, 6.0]), 0).tolist() == [3.0]
    assert base_score(LOGISTIC, np.array([1.0, 0.0, 1.0, 1.0]), 2)[0] == pytest.approx(math.log(3))
    shares = base_score(SOFTMAX, np.array([0, 1, 1, 2, 2, 2]), 3)
    np.testing.assert_allclose(shares, np.log([1 / 6, 2 / 6, 3 / 6]), rtol=1e-15)
    # the starting margins' link is the label mean / the class shares
    np.testing.assert_allclose(transform("sigmoid", base_score(LOGISTIC, np.array([1.0, 0, 1, 1]), 2)[None]),
                               [[0.25, 0.75]], rtol=1e-12)
    np.testing.assert_allclose(transform("softmax", shares[None]), [[1 / 6, 2 / 6, 3 / 6]], rtol=1e-12)


def test_loss_of_a_task_and_its_outputs() -> None:
    assert loss_for("regression", 0) is SQUARED_ERROR_LOSS
    assert loss_for("classification", 2) is LOGISTIC
    assert loss_for("classification", 5) is SOFTMAX and SOFTMAX.n_outputs(5) == 5
    assert LOGISTIC.n_outputs(2) == 1
    with pytest.raises(ValueError, match="unknown link 'probit'"):
        transform("probit", np.zeros((1, 1)))
