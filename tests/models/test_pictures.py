"""The version pictures (fedcore.models.pictures): their drawn numbers are the held-out curve's."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

import numpy as np
from sklearn.metrics import roc_curve

from fedcore.curves import GRID, MIN_GROUP_ROWS, score_groups
from fedcore.models.pictures import data_uri, model_pictures, pictures_markdown

SVG = "{http://www.w3.org/2000/svg}"


def series(svg: str) -> np.ndarray:
    """The exact values of the picture's one plotted line."""
    (line,) = [e for e in ET.fromstring(svg).iter(f"{SVG}polyline") if e.get("class") == "series"]
    return np.array([[float(v) for v in pair.split(",")] for pair in line.get("data-values").split()])


def manifest(positive: np.ndarray, score: np.ndarray) -> dict:
    confusion = np.array([[np.sum(~positive & (score < 0.5)), np.sum(~positive & (score >= 0.5))],
                          [np.sum(positive & (score < 0.5)), np.sum(positive & (score >= 0.5))]])
    return {"evaluation": {"classes": ["no", "yes"], "confusion": confusion.tolist(),
                           "curve": score_groups(positive, score).tolist(), "decision_threshold": 0.5},
            "parties": [{"name": "bank", "importance_share": 0.7}, {"name": "shop", "importance_share": 0.3}]}


def test_roc_picture_draws_scikit_learns_roc_of_the_same_predictions():
    rng = np.random.default_rng(0)
    cells = rng.choice([2, 6, 10, 14, 18], 400)
    positive = rng.random(400) < cells / GRID
    score = (cells + 0.5) / GRID  # the middle of grid cells
    assert np.unique(cells, return_counts=True)[1].min() >= MIN_GROUP_ROWS
    pictures = model_pictures(manifest(positive, score), [("v0001", 0.5), ("v0002", 0.41)], "log_loss")
    assert set(pictures) == {"confusion", "roc", "precision_recall", "calibration", "importances", "history"}
    # at least MIN_GROUP_ROWS rows in each occupied cell: the groups are the cells themselves
    fpr, tpr, _ = roc_curve(positive, score, drop_intermediate=False)
    np.testing.assert_array_equal(series(pictures["roc"]), np.column_stack([fpr, tpr]))
    np.testing.assert_array_equal(series(pictures["history"]), [[0, 0.5], [1, 0.41]])
    cells = {(int(e.get("data-truth")), int(e.get("data-predicted"))): int(e.get("data-count"))
             for e in ET.fromstring(pictures["confusion"]).iter(f"{SVG}rect") if e.get("class") == "cell"}
    assert cells == {(0, 0): np.sum(~positive & (score < 0.5)), (0, 1): np.sum(~positive & (score >= 0.5)),
                     (1, 0): np.sum(positive & (score < 0.5)), (1, 1): np.sum(positive & (score >= 0.5))}
    bars = {e.get("data-name"): float(e.get("data-value"))
            for e in ET.fromstring(pictures["importances"]).iter(f"{SVG}rect") if e.get("class") == "bar"}
    assert bars == {"bank": 0.7, "shop": 0.3}


def test_markdown_embeds_each_picture_as_a_decodable_data_uri():
    pictures = model_pictures({"importances": {"age": 0.6, "income": 0.4}})
    text = pictures_markdown("retail v0001", pictures)
    (uri,) = re.findall(r"!\[importances\]\((data:image/svg\+xml;base64,[A-Za-z0-9+/=]+)\)", text)
    assert uri == data_uri(pictures["importances"])
    assert base64.b64decode(uri.split(",", 1)[1]).decode() == pictures["importances"]


def test_a_regressor_without_history_draws_nothing():
    assert model_pictures({"metrics": {"r2": 0.5}}, [], "r2") == {}
