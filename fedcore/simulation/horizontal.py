"""Simulate a horizontal federation on one table and compare it with scikit-learn's ExtraTrees.

The algorithms: Federated Extra-Trees (plain, local DP, global DP), PPD-ERT with secure aggregation, or
histogram boosting under secure aggregation (issue #32); the reference: scikit-learn's ExtraTrees on the
pooled rows (boosting: HistGradientBoosting with the same rounds, depth, learning rate and L2). The
training rows are dealt out to simulated institutions (iid, by a column's values, or label-skewed), each
keeping every column. The result also holds the same engine with all rows at one party (M = 1), which must
agree exactly where no noise is added, and `local_only`: the models each institution would train on its
own rows alone, which is what joining the federation is measured against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedcore.algorithms import HORIZONTAL_BOOSTING
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.data.binning import category_strings
from fedcore.data.labels import infer_task
from fedcore.data.numbers import numeric_values
from fedcore.data.split import split_horizontal
from fedcore.errors import ParameterError
from fedcore.horizontal.schema import CATEGORICAL, NUMERIC
from fedcore.horizontal.validation import column_kind
from fedcore.metrics import metrics
from fedcore.privacy.settings import PrivacySetting, privacy_with
from fedcore.simulation.comparison import EngineRun, announce, compare, run_engine
from fedcore.simulation.params import TASK_DEFAULT, boosting_params, forest_params
from fedcore.simulation.table import prepare_input, split_train_test
from fedcore.vertical.validation import check_label

EXACT_MODES = ("none", "secagg")
"""Modes without noise: the federated run must equal the single-party run exactly."""
CATEGORIES_FROM = "the pooled table (a data contract declares them in production)"


def check_mode(algorithm: str, privacy: object, task: str | None = None, *, epsilon: float | None = None,
               delta: float | None = None, thresholds: str | None = None) -> PrivacySetting:
    """The privacy setting to use (PPD-ERT: secagg; FET: none by default), refusing impossible combinations.

    `privacy`: a mode name, a mapping or a setting (`fedcore.privacy.settings`); `epsilon`, `delta` and
    `thresholds` (None: not given) are fields of it.
    """
    chosen = find_algorithm(algorithm, "horizontal")
    setting = privacy_with(privacy, chosen, epsilon=epsilon, delta=delta, thresholds=thresholds)
    if chosen is HORIZONTAL_BOOSTING and thresholds is not None:
        raise ParameterError(f"thresholds={thresholds!r} applies to --algorithm ppd-ert only; boosting cuts "
                             "the declared domains into equal bins")
    if task == "regression" and (algorithm == "ppd-ert" or setting.mode == "ldp"):
        what = "PPD-ERT" if algorithm == "ppd-ert" else "privacy 'ldp' (randomized labels)"
        raise ParameterError(f"{what} is for classification only; use --algorithm extra-trees with privacy "
                             "none or gdp for a regression label")
    return setting


def build_estimator(algorithm: str, privacy: str | Mapping[str, Any] | PrivacySetting, task: str,
                    params: dict, *, epsilon: float | None = None, feature_ranges: dict | None = None,
                    categories: Mapping[str, Sequence[str]] | None = None,
                    thresholds: str | None = None, compute: Any = None) -> Any:
    """An unfitted horizontal estimator; building it validates the parameters before any work starts.

    `privacy` is what the estimators' `privacy=` takes; `epsilon` (FET) and `thresholds` (PPD-ERT) are
    fields of it (None: not given). `categories` are the agreed category lists of categorical columns (see
    `pooled_categories`). `compute`: where every party's rows go (the estimators' `compute=`).
    """
    from fedcore.horizontal.estimators import (
        FederatedExtraTreesClassifier,
        FederatedExtraTreesRegressor,
        PPDERTClassifier,
    )

    model: Any
    if algorithm == HORIZONTAL_BOOSTING.id:
        from fedcore.horizontal.boosting import HorizontalBoostingClassifier, HorizontalBoostingRegressor

        if epsilon is not None:
            raise ParameterError("horizontal boosting takes no epsilon (no noise: its histograms are exact)")
        boosting = HorizontalBoostingClassifier if task == "classification" else HorizontalBoostingRegressor
        secure = check_mode(algorithm, privacy, task).mode == "secagg"  # none: plain histograms
        model = boosting(**params, feature_ranges=feature_ranges, allow_data_ranges=feature_ranges is None,
                         categories=categories, secure_aggregation=secure, compute=compute)
    elif algorithm == "ppd-ert":
        if epsilon is not None:
            raise ParameterError("epsilon applies to --algorithm extra-trees (privacy gdp or ldp) only, not "
                                 "'ppd-ert'")
        model = PPDERTClassifier(**params, feature_ranges=feature_ranges,
                                 allow_data_ranges=feature_ranges is None, categories=categories,
                                 privacy=privacy, thresholds=thresholds, compute=compute)
    else:
        if thresholds is not None:
            raise ParameterError(f"thresholds={thresholds!r} applies to --algorithm ppd-ert only; Federated "
                                 "Extra-Trees draws each threshold within the node's range already")
        cls = FederatedExtraTreesClassifier if task == "classification" else FederatedExtraTreesRegressor
        model = cls(**params, privacy=privacy, categories=categories, epsilon=epsilon, compute=compute,
                    feature_ranges=feature_ranges)
    model.params  # noqa: B018 - validates the parameters now, before any work (scikit-learn style: not in __init__)
    return model


def declared_ranges(train: pd.DataFrame, label: str) -> dict[str, tuple[float, float]]:
    """Numeric feature domains (PPD-ERT, FET's DP modes; booleans: 0 to 1), read off the pooled training rows.

    In a real federation the data contracts declare them; the simulator stands in for the consortium.
    """
    ranges = {}
    for column in train.columns:
        if column == label or column_kind(train[column]) != NUMERIC:
            continue
        values = numeric_values(train[column])
        values = values[~np.isnan(values)]
        ranges[column] = (float(values.min()), float(values.max())) if len(values) else (0.0, 0.0)
    return ranges


def pooled_categories(table: pd.DataFrame, label: str) -> dict[str, list[str]]:
    """The category list of every categorical feature column, read off the pooled table.

    A pandas Categorical keeps its own list, other columns list their values, sorted. In a real federation
    the data contracts declare them; the simulator stands in for the consortium.
    """
    categories = {}
    for column in table.columns:
        values = table[column]
        if column == label or column_kind(values) != CATEGORICAL:
            continue
        if isinstance(values.dtype, pd.CategoricalDtype):
            categories[column] = [str(c) for c in values.dtype.categories]
        else:
            categories[column] = sorted(category_strings(values).dropna().unique().tolist())
    return categories


def _same_run(a: EngineRun, b: EngineRun) -> bool:
    """The same trees and the same predictions."""
    return bool(a.model.model_.same_as(b.model.model_) and np.array_equal(a.predictions, b.predictions))


def simulate_horizontal(
    table: pd.DataFrame,
    label: str,
    *,
    algorithm: str = "extra-trees",
    privacy: str | Mapping[str, Any] | PrivacySetting | None = None,
    id_column: str | None = None,
    drop: Sequence[str] = (),
    parties: int = 2,
    partition: str = "iid",
    partition_column: str | None = None,
    alpha: float = 0.5,
    trees: int = 100,
    max_depth: int | None = None,
    max_features: str | int | float | None = TASK_DEFAULT,
    epsilon: float | None = None,
    delta: float | None = None,
    thresholds: str | None = None,
    seed: int = 0,
    test_size: float = 0.2,
    task: str = "auto",
    local_only: bool = True,
    progress: bool = False,
    compute: Any = None,
) -> dict:
    """Train the horizontal `algorithm` on `parties` simulated institutions of `table`; evaluate it.

    It is compared on held-out rows with scikit-learn's ExtraTrees, the single-party run and local-only
    models.
    `columns` in the result says which column was the id, which were dropped, which dates became numbers
    (see `prepare_input`) and how many categories each categorical column was agreed to have.
    `privacy`: a mode name, a mapping or a setting (`fedcore.privacy.settings`), the algorithm's default
    mode if None; `epsilon` (gdp: the whole model's, with `delta`; ldp: each row's label) and `thresholds`
    (PPD-ERT: "histogram", the default, or "domain", the paper's draw) are fields of it, None when not
    given. A field the mode does not use is refused. `compute` ("local:N", a Dask scheduler address or a
    Client): every simulated party's rows on that Dask cluster (`fedcore.compute`); the single-party run
    stays in process, so `single_party_identical` compares the two. Where noise is added (gdp, ldp) no
    single-party run can be identical: `in_process_identical` then compares the Dask run with the same
    federation in process.
    """
    table, column_notes = prepare_input(table, label, id_column, drop)
    if task == "auto":
        task = infer_task(table[label])
    setting = check_mode(algorithm, privacy, task, epsilon=epsilon, delta=delta, thresholds=thresholds)
    privacy = setting.mode
    check_label(table[label], task)
    boosting = algorithm == HORIZONTAL_BOOSTING.id
    if boosting and max_features != TASK_DEFAULT:
        raise ParameterError("--max-features applies to the forests only: boosting takes every feature in "
                             "every tree")
    params = (boosting_params(trees, max_depth, seed) if boosting
              else forest_params(task, trees, max_depth, max_features, seed))
    train, test = split_train_test(table, label, task, test_size, seed)
    # thresholds (boosting: bins) from declared domains: PPD-ERT, boosting, and FET in a DP mode (no party
    # sends a node's extremes)
    ranges = (declared_ranges(train, label) if algorithm == "ppd-ert" or boosting or privacy in ("gdp", "ldp")
              else None)
    categories = pooled_categories(table, label)
    make = lambda: build_estimator(algorithm, setting, task, params,  # noqa: E731
                                   feature_ranges=ranges, categories=categories)
    federated_model = build_estimator(algorithm, setting, task, params, feature_ranges=ranges,
                                      categories=categories, compute=compute)
    party_frames = split_horizontal(train, parties, partition=partition, label=label, column=partition_column,
                                    alpha=alpha, seed=seed)
    features = test.drop(columns=[label])
    y_test = test[label].to_numpy()

    classification = task == "classification"
    federated = run_engine(federated_model, party_frames, label, features, progress=progress,
                           probabilities=classification,
                           caption=f"{algorithm} ({privacy}), {parties} parties, {trees} trees")
    single = run_engine(make(), [train], label, features, probabilities=classification,
                        caption="single-party run of the same engine (M = 1)", progress=progress)
    identical = in_process = None
    if privacy in EXACT_MODES:
        identical = _same_run(federated, single)
    elif compute is not None:  # the Dask run's lossless reference: the same parties and noise, in process
        in_process = _same_run(federated, run_engine(make(), party_frames, label, features, progress=progress,
                                                     probabilities=classification,
                                                     caption="the same federation in process"))
    result = {
        "setting": "horizontal",
        "algorithm": algorithm,
        "privacy": privacy,
        "task": task,
        "parties": parties,
        "partition": {"kind": partition, **({"column": partition_column} if partition == "column" else {}),
                      **({"alpha": alpha} if partition == "dirichlet" else {}),
                      "rows": [len(p) for p in party_frames]},
        **({"compute": compute} if isinstance(compute, str) else {}),
        **({"in_process_identical": in_process} if in_process is not None else {}),
        "rows_train": len(train),
        "rows_test": len(test),
        **compare(task, y_test, federated, single, identical,
                  find_algorithm(algorithm, "horizontal").run_reference(task, train, test, label, params)),
        "privacy_report": federated_model.privacy_report_,
        "columns": {**column_notes, "categories": {name: len(values) for name, values in categories.items()},
                    "categories_from": CATEGORIES_FROM},
    }
    if ranges is not None:
        result["feature_ranges"] = ("declared from the pooled training rows (a data contract declares them "
                                    "in production)")
    if local_only:
        announce(progress, "local-only models, one per institution")
        local = ((lambda: build_estimator(algorithm, setting, task, params, feature_ranges=ranges,
                                          categories=categories)) if boosting
                 else (lambda: build_estimator("extra-trees", "none", task, params, categories=categories)))
        result["local_only"] = _local_only(party_frames, label, features, y_test, task, local)
    return result


def _local_only(party_frames: list[pd.DataFrame], label: str, features: pd.DataFrame, y_test: np.ndarray,
                task: str, make: Callable[[], Any]) -> dict:
    """Each institution's model on its own rows alone, evaluated on the common test rows.

    The models are plain (a party alone needs no privacy); their mean is the paper's local-only baseline.
    """
    per_party = []
    for frame in party_frames:
        model = make().fit([frame], label=label)
        if task == "classification":
            proba = model.predict_proba(features)
            per_party.append(metrics(task, y_test, model.classes_[np.argmax(proba, axis=1)], proba,
                                     model.classes_))
        else:
            per_party.append(metrics(task, y_test, model.predict(features)))
    names = list(per_party[0])
    return {"mean": {n: float(np.mean([m[n] for m in per_party])) for n in names}, "per_party": per_party}


def simulate_command(table: pd.DataFrame, args: Any, privacy: PrivacySetting) -> dict:
    """`fedforest simulate --setting horizontal`'s run (the algorithm registry's `simulate`)."""
    return simulate_horizontal(
        table, args.label, algorithm=args.algorithm, privacy=privacy, id_column=args.id_column,
        drop=args.drop, parties=args.parties, partition=args.partition,
        partition_column=args.partition_column, alpha=args.alpha, trees=args.trees,
        max_depth=args.max_depth, max_features=args.max_features, seed=args.seed,
        test_size=args.test_size, task=args.task, progress=True,
        compute=args.dask)
