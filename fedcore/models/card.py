"""What a registered version says about itself: its manifest, its model card and where it is stored.

Built here, in fedcore, so that the plain Python API produces the same manifest and card as the Prefect
flows (which only publish them as artifacts). No feature value appears; feature names only where every
institution holds them anyway (horizontal: the agreed schema's importances); a vertical card shows each
institution's share of the importances, never its features'.
"""

from __future__ import annotations

import subprocess
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from fedcore.algorithms import read_algorithm
from fedcore.config import FederationConfig
from fedcore.metrics import LOWER_IS_BETTER
from fedcore.session import MasterSession

GROUPED_RANKING = ("roc_auc and average_precision: of the held-out probabilities grouped as the curve "
                   "pictures are (each institution's groups of at least 10 rows, pooled), not row by row.")
"""The horizontal card's note on its ranking metrics (`fedcore.curves.curve_metrics`)."""


def code_version() -> str:
    """The installed fedforest version, plus the git commit when run from a checkout."""
    text = package_version("fedforest")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{text}+{commit}" if commit else text


def build_manifest(session: MasterSession, federation: str, metrics: dict[str, float],
                   validation: dict[str, Any]) -> dict[str, Any]:
    """The master's manifest of a trained session: what was trained, on what, how well, with which code.

    The setting adds its own entries (`MasterSession.manifest_entries`): the parties with the model digests
    the master signs, and for example the ID overlap (vertical) or the agreed schema and privacy report
    (horizontal). See docs/design.md, Model artifacts.
    """
    algorithm, facts = read_algorithm(session.algorithm, session.setting), session.facts
    entries = session.manifest_entries()
    manifest: dict[str, Any] = {"algorithm": algorithm.id, "setting": algorithm.setting,
                                "task": session.params.task, "params": session.params.to_dict()}
    manifest.update({k: v for k, v in entries.items() if k not in ("training", "lineage")})
    manifest["metrics"] = metrics
    if isinstance(session.decision_threshold, float | int):  # batch prediction applies it (binary labels);
        manifest["decision_threshold"] = session.decision_threshold  # "auto" never evaluated: not stored
    if session.evaluation is not None:  # held-out confusion and binary curve: the pictures draw them
        manifest["evaluation"] = session.evaluation
    manifest["training"] = {"rows": facts.train_rows, "holdout_rows": facts.holdout_rows,
                            **entries.get("training", {}), "seconds": facts.seconds, "rounds": facts.rounds,
                            "bytes": facts.bytes, "nodes": facts.nodes}
    manifest["lineage"] = {"federation": federation, "contracts": validation, **entries.get("lineage", {}),
                           "code_version": code_version()}
    return manifest


def model_card(model_name: str, version: str, manifest: dict[str, Any], production: dict[str, Any] | None,
               promoted: bool, prediction: dict[str, Any] | None) -> str:
    """A markdown model card.

    It shows data sizes, parameters, metrics against the previous production version, rows or features per
    institution (counts, and vertical: each institution's share of the importances), the horizontal forest's
    feature importances, each institution's privacy ledger (horizontal DP modes), timings, communication
    and batch prediction.
    """
    algorithm = read_algorithm(manifest["algorithm"], manifest.get("setting"))
    vertical = algorithm.setting == "vertical"
    privacy = "" if vertical else f", privacy {manifest['privacy']['mode']}"
    lines = [f"# {model_name} {version}", "",
             f"{algorithm.title} ({manifest['setting']}, {manifest['task']}{privacy}); "
             f"{'promoted to production' if promoted else 'not promoted'}.", ""]
    lines += _metric_lines(manifest, production, vertical)
    lines += _data_lines(manifest, vertical)
    lines += _importance_lines(manifest)
    lines += _privacy_lines(manifest)
    lines += _training_lines(manifest)
    lines += _prediction_lines(prediction)
    return "\n".join(lines)


def _metric_lines(manifest: dict[str, Any], production: dict[str, Any] | None, vertical: bool) -> list[str]:
    """The metrics table, this version beside the previous production version."""
    previous = (production or {}).get("metrics", {})
    where = "computed at the label holder" if vertical else "aggregated from every institution"
    lines = [f"## Metrics (held-out rows, {where})", "", "| metric | this version | previous production |",
             "|---|---|---|"]
    names = {k: f"{k} (lower is better)" if k in LOWER_IS_BETTER else k for k in manifest["metrics"]}
    lines += [f"| {names[k]} | {v:.4f} | {previous[k]:.4f} |" if k in previous
              else f"| {names[k]} | {v:.4f} | - |" for k, v in manifest["metrics"].items()]
    if not vertical and "roc_auc" in manifest["metrics"]:
        lines += ["", GROUPED_RANKING]
    return lines + _threshold_lines(manifest)


def _threshold_lines(manifest: dict[str, Any]) -> list[str]:
    """The decision rule accuracy, F1 and balanced accuracy were scored at, and its held-out confusion."""
    evaluation = manifest.get("evaluation")
    if not evaluation:
        return []
    threshold = manifest.get("decision_threshold")
    rule = ("the most probable class" if threshold is None else
            f"the positive class at probability >= {threshold:g} (the decision threshold; batch predictions "
            "use it too)")
    classes, confusion = evaluation["classes"], evaluation["confusion"]
    lines = ["", f"Class decisions above: {rule}. Held-out confusion (rows: truth, columns: predicted):", "",
             "| | " + " | ".join(classes) + " |", "|---" * (len(classes) + 1) + "|"]
    return lines + [f"| {name} | " + " | ".join(str(c) for c in row) + " |"
                    for name, row in zip(classes, confusion, strict=True)]


def _data_lines(manifest: dict[str, Any], vertical: bool) -> list[str]:
    """Rows and, per institution, features and splits owned (vertical) or rows kept at home (horizontal)."""
    t = manifest["training"]
    if vertical:
        lines = ["", "## Data", "", f"- aligned rows (ID overlap): {t['overlap']}; training {t['rows']}, "
                 f"held out {t['holdout_rows']}", "",
                 "| institution | role | features | splits owned | importance share |",
                 "|---|---|---|---|---|"]
        return lines + [f"| {p['name']} | {p['role']} | {p['feature_count']} | {p['owned_nodes']} | "
                        f"{_share(p.get('importance_share'))} |" for p in manifest["parties"]]
    lines = ["", "## Data", "", f"- {len(manifest['schema']['columns'])} agreed feature columns; training "
             f"{t['rows']} rows, held out {t['holdout_rows']}", "",
             "| institution | training rows | held-out rows |", "|---|---|---|"]
    return lines + [f"| {p['name']} | {p['train_rows']} | {p['holdout_rows']} |" for p in manifest["parties"]]


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def importance_rows(importances: dict[str, float]) -> list[dict]:
    """An importance table, one row per feature, most important first (ties by name): cards, artifacts."""
    ranked = sorted(importances.items(), key=lambda item: (-item[1], item[0]))
    return [{"feature": name, "importance": round(value, 6)} for name, value in ranked]


def importance_kind(manifest: dict[str, Any]) -> str:
    """What a horizontal manifest's importances measure: boosting's split gain, a forest's impurity."""
    return "total split gain" if manifest.get("boosting") else "impurity decrease"


def _importance_lines(manifest: dict[str, Any]) -> list[str]:
    """Horizontal: the whole model's importances (every institution holds them)."""
    importances = manifest.get("importances")
    if not importances:
        return []
    lines = ["", f"## Feature importances ({importance_kind(manifest)}, summing to 1)", "",
             "| feature | importance |", "|---|---|"]
    return lines + [f"| {r['feature']} | {r['importance']:.4f} |" for r in importance_rows(importances)]


LEDGER_PARAMETERS = {"sigma": "sigma", "count_sigma": "row count sigma", "l2_sensitivity": "L2 sensitivity",
                     "counts_per_release": "counts per release", "parties": "parties",
                     "planned_releases_per_row": "releases per row planned", "epsilon": "epsilon per row"}
"""The parameters of a stated privacy ledger the card shows, and how it names them."""


def _privacy_lines(manifest: dict[str, Any]) -> list[str]:
    """DP modes: one line per institution: its mechanism, their parameters and its (epsilon, delta)."""
    ledgers = (manifest.get("privacy") or {}).get("ledgers") or {}
    if not ledgers:
        return []
    lines = ["", "## Privacy (each institution's ledger, as it stated it with the model)", ""]
    for name, ledger in ledgers.items():
        parameters = "".join(f", {label} {ledger[key]:.6g}" for key, label in LEDGER_PARAMETERS.items()
                             if key in ledger)
        coalition = (f"; against the master with the other institutions: epsilon "
                     f"{ledger['epsilon_coalition']:.6g}" if "epsilon_coalition" in ledger else "")
        lines.append(f"- {name}: {ledger['mechanism']}{parameters}: (epsilon {ledger['epsilon_total']:.6g}, "
                     f"delta {ledger['delta']:g}){coalition}")
    return lines


def _training_lines(manifest: dict[str, Any]) -> list[str]:
    """Parameters (boosting: rounds, learning rate, loss), time, rounds, bytes, nodes, code version."""
    t, params = manifest["training"], manifest["params"]
    return ["", "## Training", "", *_model_lines(params, manifest.get("boosting")),
            f"- {t['seconds']:.1f} s, {t['rounds']} rounds, {t['bytes'] / 2**20:.1f} MiB exchanged, "
            f"{t['nodes']} nodes",
            f"- code {manifest['lineage']['code_version']}"]


def _model_lines(params: dict[str, Any], boosting: dict[str, Any] | None) -> list[str]:
    """A forest's trees and criterion, or boosting's rounds, learning rate, loss and early stopping."""
    if boosting is None:
        return [f"- {params['n_estimators']} trees, max_depth {params['max_depth']}, max_features "
                f"{params['max_features']}, criterion {params['criterion']}"]
    stopping = (f"; early stopping after {boosting['early_stopping_rounds']} rounds without a better "
                f"held-out {boosting['early_stopping_metric']}: {boosting['rounds']} of "
                f"{boosting['rounds_grown']} rounds kept" if boosting.get("early_stopping_rounds") else "")
    per_round = f" ({boosting['trees_per_round']} trees a round)" if boosting["trees_per_round"] > 1 else ""
    return [f"- {boosting['rounds']} boosting rounds{per_round}, learning rate "
            f"{boosting['learning_rate']:g}, loss {boosting['loss']}, max_depth {params['max_depth']}, "
            f"reg_lambda {params['reg_lambda']:g}, "
            f"gamma {params['gamma']:g}, min_child_weight {params['min_child_weight']:g}, subsample "
            f"{params['subsample']:g}, colsample_bytree {params['max_features']}{stopping}"]


def _prediction_lines(prediction: dict[str, Any] | None) -> list[str]:
    """Where the run's batch predictions went, if it made any."""
    if not prediction:
        return []
    if prediction.get("requester"):
        return ["", "## Batch prediction", "", f"- {prediction['rows']} rows delivered to "
                f"{prediction['requester']} in {prediction['seconds']:.1f} s"]
    at = ", ".join(f"{name} ({count})" for name, count in prediction["counts"].items())
    return ["", "## Batch prediction", "", f"- {prediction['rows']} rows predicted locally at {at} in "
            f"{prediction['seconds']:.1f} s"]


def version_markdown(config: FederationConfig, model_name: str, version: str,
                     manifest: dict[str, Any]) -> str:
    """Where a registered version is, its digests and signing key, and how to use it.

    The registry folders are on the master's and institutions' own hosts; the text shows how to inspect,
    predict with or load the version.
    """
    folder = config.master_registry / model_name / version
    signature = manifest.get("signature") or {}
    lines = [f"# {model_name} {version}", "",
             f"Registered in the master's registry on the master's host: `{folder}`, signed by key "
             f"`{signature.get('key_id', '-')}` ({signature.get('algorithm', 'unsigned')}).", "",
             "| file | bytes | sha256 |", "|---|---|---|"]
    lines += [f"| {f['name']} | {f['bytes']} | `{f['sha256']}` |" for f in manifest.get("files", [])]
    lines += ["",
              "Each institution keeps its own part in its own registry; the master's signature covers these "
              "digests:", "", "| institution | role | table sha256 |", "|---|---|---|"]
    lines += [f"| {p['name']} | {p.get('role', '-')} | `{p.get('table_sha256', '-')}` |"
              for p in manifest.get("parties", [])]
    public_key = config.master_public_key or "<the master's public key (PEM)>"
    lines += ["", "## Use it", "", "```",
              f"fedforest models show --config {config.path} --model {model_name} "
              f"--version {version}", f"fedforest predict --config {config.path} --model {model_name} "
              f"--version {version}", "```", "",
              "In Python (verifies the signature and every file's SHA-256):", "",
              "```python", "from fedcore.models.registry import ModelRegistry", "",
              f'registry = ModelRegistry("{config.master_registry}", public_key="{public_key}")',
              f'manifest, tables = registry.load("{model_name}", "{version}")', "```"]
    return "\n".join(lines)
