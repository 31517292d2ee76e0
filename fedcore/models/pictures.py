"""A version's pictures as SVG written by our own code (issue #33).

Confusion matrix, ROC, precision-recall, calibration, importance bars and the headline metric across versions.
Built from the manifest alone (what the master holds: label counts of the held-out curve, never rows), so the
Prefect artifact, `fedforest models show --pictures` and the plain Python API draw the same bytes. Every
plotted line carries its exact values in a `data-values` attribute ("x,y x,y ..."), which tests and readers
can check against the numbers the pixels stand for. Prefect's UI shows them as data-URI images in a markdown
artifact (`pictures_markdown`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

import numpy as np

from fedcore.curves import calibration_points, pr_points, roc_points
from fedcore.models.registry import ModelRegistry

WIDTH, HEIGHT = 360, 300
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 30, 44
"""The frame of a chart: the plot area is inside these margins."""
COLOURS = ("#1f6feb", "#d1495b", "#2a9d8f", "#e9c46a", "#6a4c93")


def _svg(body: list[str], title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    """An SVG document of `body` elements with `title` on top (font sizes fixed: no CSS needed)."""
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                      f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
                      f'<rect width="{width}" height="{height}" fill="white"/>',
                      f'<text x="{width / 2:g}" y="18" text-anchor="middle" font-size="13" '
                      f'font-weight="bold">{escape(title)}</text>', *body, "</svg>"])


def _values(points: np.ndarray) -> str:
    return " ".join(f"{x!r},{y!r}" for x, y in np.asarray(points, np.float64).tolist())


def line_chart(title: str, series: Sequence[tuple[str, np.ndarray]], x_label: str, y_label: str,
               x_range: tuple[float, float] = (0.0, 1.0), y_range: tuple[float, float] = (0.0, 1.0),
               diagonal: bool = False, x_ticks: Sequence[tuple[float, str]] | None = None) -> str:
    """Lines through each series' (x, y) points (non-finite points dropped), with axes, ticks and legend."""
    (x0, x1), (y0, y1) = x_range, y_range
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def at(x: float, y: float) -> str:
        px = LEFT + (x - x0) / ((x1 - x0) or 1.0) * plot_w
        py = TOP + plot_h - (y - y0) / ((y1 - y0) or 1.0) * plot_h
        return f"{px:.2f},{py:.2f}"

    body = [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>']
    ticks = x_ticks or [(x0 + (x1 - x0) * i / 4, f"{x0 + (x1 - x0) * i / 4:.2f}") for i in range(5)]
    for x, label in ticks:
        px = at(x, y0).split(",")[0]
        body.append(f'<text x="{px}" y="{TOP + plot_h + 14}" text-anchor="middle">{escape(label)}</text>')
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        py = at(x0, y).split(",")[1]
        body.append(f'<text x="{LEFT - 4}" y="{float(py) + 4:.2f}" text-anchor="end">{y:.3g}</text>')
    body.append(f'<text x="{LEFT + plot_w / 2:g}" y="{HEIGHT - 8}" text-anchor="middle">'
                f'{escape(x_label)}</text>')
    body.append(f'<text x="12" y="{TOP + plot_h / 2:g}" text-anchor="middle" '
                f'transform="rotate(-90 12 {TOP + plot_h / 2:g})">{escape(y_label)}</text>')
    if diagonal:
        body.append(f'<polyline points="{at(x0, y0)} {at(x1, y1)}" fill="none" stroke="#bbb" '
                    'stroke-dasharray="4 3"/>')
    for k, (name, points) in enumerate(series):
        points = np.asarray(points, np.float64).reshape(-1, 2)
        points = points[np.isfinite(points).all(axis=1)]
        colour = COLOURS[k % len(COLOURS)]
        body.append(f'<polyline class="series" data-name="{escape(name)}" data-values="{_values(points)}" '
                    f'points="{" ".join(at(x, y) for x, y in points.tolist())}" fill="none" '
                    f'stroke="{colour}" stroke-width="2"/>')
        body += [f'<circle cx="{c.split(",")[0]}" cy="{c.split(",")[1]}" r="2.5" fill="{colour}"/>'
                 for c in (at(x, y) for x, y in points.tolist())]
        body.append(f'<text x="{LEFT + 8}" y="{TOP + 14 + 14 * k}" fill="{colour}">{escape(name)}</text>')
    return _svg(body, title)


def confusion_chart(confusion: np.ndarray, classes: Sequence[str], title: str) -> str:
    """The confusion matrix as shaded cells with their counts (rows: truth, columns: prediction)."""
    confusion = np.asarray(confusion, np.int64)
    n = len(classes)
    cell = min(60, (min(WIDTH - 90, HEIGHT - 90)) // max(n, 1))
    top, left = 54, 80
    peak = max(int(confusion.max()), 1)
    body = [f'<text x="{left + n * cell / 2:g}" y="{top - 18}" text-anchor="middle">predicted</text>',
            f'<text x="14" y="{top + n * cell / 2:g}" text-anchor="middle" '
            f'transform="rotate(-90 14 {top + n * cell / 2:g})">true</text>']
    for i, name in enumerate(classes):
        body.append(f'<text x="{left + (i + 0.5) * cell:g}" y="{top - 4}" text-anchor="middle">'
                    f'{escape(str(name))}</text>')
        body.append(f'<text x="{left - 6}" y="{top + (i + 0.5) * cell + 4:g}" text-anchor="end">'
                    f'{escape(str(name))}</text>')
        for j in range(n):
            count = int(confusion[i, j])
            shade = int(round(235 - 180 * count / peak))
            text = "white" if shade < 140 else "black"
            body.append(f'<rect class="cell" data-truth="{i}" data-predicted="{j}" data-count="{count}" '
                        f'x="{left + j * cell}" y="{top + i * cell}" width="{cell}" height="{cell}" '
                        f'fill="rgb({shade},{shade},255)" stroke="white"/>')
            body.append(f'<text x="{left + (j + 0.5) * cell:g}" y="{top + (i + 0.5) * cell + 4:g}" '
                        f'text-anchor="middle" fill="{text}">{count}</text>')
    return _svg(body, title, height=top + n * cell + 16)


def bar_chart(rows: Sequence[tuple[str, float]], title: str, limit: int = 15) -> str:
    """Horizontal bars, largest first (at most `limit`; the rest summed into one "others" bar)."""
    ranked = sorted(rows, key=lambda r: (-r[1], r[0]))
    if len(ranked) > limit:
        ranked = ranked[:limit - 1] + [(f"{len(ranked) - limit + 1} others",
                                        float(sum(v for _, v in ranked[limit - 1:])))]
    bar, left = 16, 130
    height = TOP + 10 + bar * len(ranked) + 10
    peak = max([v for _, v in ranked] + [1e-12])
    body = []
    for k, (name, value) in enumerate(ranked):
        y = TOP + 10 + k * bar
        length = (WIDTH - left - 60) * value / peak
        body.append(f'<text x="{left - 6}" y="{y + 11}" text-anchor="end">{escape(str(name)[:20])}</text>')
        body.append(f'<rect class="bar" data-name="{escape(str(name))}" data-value="{value!r}" x="{left}" '
                    f'y="{y + 2}" width="{length:.2f}" height="{bar - 4}" fill="{COLOURS[0]}"/>')
        body.append(f'<text x="{left + length + 4:.2f}" y="{y + 11}">{value:.3f}</text>')
    return _svg(body, title, height=max(height, 80))


def model_pictures(manifest: dict, history: Sequence[tuple[str, float]] = (),
                   metric: str | None = None) -> dict[str, str]:
    """Every picture the manifest's numbers can draw, by name.

    confusion, roc, precision_recall, calibration (binary classifiers with a held-out curve), importances
    (features, or institutions' shares), history.
    `history` is the headline `metric` of the model's versions, oldest first (from the registry).
    """
    pictures: dict[str, str] = {}
    evaluation = manifest.get("evaluation") or {}
    if evaluation.get("confusion") is not None:
        threshold = evaluation.get("decision_threshold")
        at = f" at threshold {threshold:g}" if threshold is not None else ""
        pictures["confusion"] = confusion_chart(np.asarray(evaluation["confusion"]),
                                                [str(c) for c in evaluation["classes"]],
                                                f"Confusion matrix (held-out rows{at})")
    if evaluation.get("curve") is not None:
        table = np.asarray(evaluation["curve"], np.float64)
        pictures["roc"] = line_chart("ROC curve (held-out rows)", [("model", roc_points(table))],
                                     "false positive rate", "true positive rate", diagonal=True)
        pictures["precision_recall"] = line_chart("Precision-recall (held-out rows)",
                                                  [("model", pr_points(table))], "recall", "precision")
        pictures["calibration"] = line_chart("Calibration (held-out rows)",
                                             [("model", calibration_points(table))],
                                             "mean predicted probability", "observed positive share",
                                             diagonal=True)
    importances = manifest.get("importances")
    if importances:
        pictures["importances"] = bar_chart(list(importances.items()), "Feature importances")
    elif any("importance_share" in p for p in manifest.get("parties", [])):
        pictures["importances"] = bar_chart([(p["name"], p["importance_share"]) for p in manifest["parties"]
                                             if "importance_share" in p], "Importance share per institution")
    finite = [(v, float(x)) for v, x in history if x is not None and np.isfinite(x)]
    if metric and finite:
        values = np.array([x for _, x in finite])
        low, high = float(values.min()), float(values.max())
        pad = (high - low) * 0.1 or abs(high) * 0.05 or 0.05
        ticks = [(float(i), v) for i, (v, _) in enumerate(finite)][-12:]
        pictures["history"] = line_chart(f"{metric} across versions",
                                         [(metric, np.column_stack([np.arange(len(values)), values]))],
                                         "version", metric, x_range=(0.0, max(len(values) - 1, 1)),
                                         y_range=(low - pad, high + pad), x_ticks=ticks)
    return pictures


TITLES = {"confusion": "Confusion matrix", "roc": "ROC curve", "precision_recall": "Precision-recall curve",
          "calibration": "Calibration", "importances": "Importances",
          "history": "Headline metric across versions"}


def data_uri(svg: str) -> str:
    """`svg` as a base64 data URI (what Prefect's markdown artifacts display as an image)."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def pictures_markdown(title: str, pictures: dict[str, str]) -> str:
    """A markdown page of `pictures` (the `model-pictures` artifact): data-URI images in one paragraph.

    One paragraph, so the UI lays them side by side as wide as the page allows; each picture has its title.
    """
    images = " ".join(f"![{name}]({data_uri(svg)})" for name, svg in pictures.items())
    names = ", ".join(TITLES.get(name, name).lower() for name in pictures)
    return "\n".join([f"# {title}", "", f"{names[:1].upper()}{names[1:]}.", "", images, ""])


def metric_history(registry: ModelRegistry, model_name: str, metric: str) -> list[tuple[str, float]]:
    """(version, `metric`) of every registered version of `model_name`, oldest first (verified manifests).

    A version without the metric is left out.
    """
    history = []
    for version in registry.versions(model_name):
        value = registry.read_manifest(model_name, version).get("metrics", {}).get(metric)
        if value is not None:
            history.append((version, float(value)))
    return history


def version_pictures(registry: ModelRegistry, model_name: str, version: str, metric: str) -> dict[str, str]:
    """`model_pictures` of a registered version with the metric's history up to it.

    What `fedforest models show --pictures` writes and the retrain flow's `model-pictures` artifact shows.
    """
    history = metric_history(registry, model_name, metric)
    upto = [v for v, _ in history].index(version) + 1 if version in [v for v, _ in history] else len(history)
    return model_pictures(registry.read_manifest(model_name, version), history[:upto], metric)
