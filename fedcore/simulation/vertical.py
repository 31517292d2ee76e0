"""Simulate a vertical federation on one table and compare it with a centralized reference.

`simulate_vertical` splits a table into train and test rows, deals the training columns out to simulated
parties, trains Federated Forest (or boosting) over the in-process transport, and reports test metrics next
to scikit-learn's random forest (HistGradientBoosting) on the pooled data and to the same engine with every
column at one party (M = 1), which must agree exactly (design principle 2). The `fedforest simulate`
command and the benchmarks both call it; it returns a JSON-ready dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedcore.algorithms import BOOSTING, Algorithm
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.data.labels import infer_task
from fedcore.data.split import split_vertical
from fedcore.errors import ParameterError
from fedcore.privacy.settings import PrivacySetting, parse_privacy
from fedcore.simulation.comparison import compare, run_engine
from fedcore.simulation.params import TASK_DEFAULT, TASKS, boosting_params, forest_params
from fedcore.simulation.table import prepare_input, split_train_test
from fedcore.vertical.validation import check_label

STRUCTURE_FIELDS = ("tree", "node", "left", "right", "depth", "weight", "value")
"""Master structure arrays that must match between the federated and the single-party run (not `owner`)."""


def _engine(task: str, params: dict, progress: bool, chosen: Algorithm) -> Any:
    """An unfitted engine; building it validates the parameters before any work starts."""
    model = chosen.estimator_class(task)(**params, progress=progress)
    model.params  # noqa: B018 - validates the parameters now, before any work (scikit-learn style: not in __init__)
    return model


def same_structure(a: Any, b: Any) -> bool:
    """Whether two master forest structures have exactly the same trees, nodes, children and values."""
    return a.n_trees == b.n_trees and all(
        np.array_equal(getattr(a, name), getattr(b, name)) for name in STRUCTURE_FIELDS)


def simulate_vertical(
    table: pd.DataFrame,
    label: str,
    *,
    id_column: str | None = None,
    drop: Sequence[str] = (),
    parties: int = 2,
    trees: int = 100,
    max_depth: int | None = None,
    max_features: str | int | float | None = TASK_DEFAULT,
    seed: int = 0,
    test_size: float = 0.2,
    task: str = "auto",
    privacy: str | Mapping[str, Any] | PrivacySetting = "none",
    progress: bool = False,
    compute: Any = None,
    algorithm: str = "forest",
) -> dict:
    """Train Federated Forest on `parties` simulated vertical parties of `table`; compare it on held-out rows.

    The comparison is with scikit-learn and the single-party run; the result is JSON-ready.
    With `privacy="paillier"` or `"ou"` (or a setting with its `key_bits`, `fedcore.privacy.settings`) the
    federated run encrypts the labels and the single-party run stays plain, so `single_party_identical`
    checks that encryption changes nothing.

    `communication` counts training plus the prediction of the test rows; `columns` says which column was
    the id, which were dropped and which dates became numbers (see `prepare_input`). `compute` ("local:N", a
    Dask scheduler address or a Client): every simulated party's rows on that Dask cluster
    (`fedcore.compute.dask_vertical`, a forest of either task); the single-party run stays in
    process, so `single_party_identical` compares the two. `algorithm="boosting"`: vertical boosting with
    `trees` rounds of XGBoost's defaults (`fedcore.simulation.params.boosting_params`), plain or encrypted
    gradients (`privacy`), in process, compared with HistGradientBoosting.
    """
    if task not in TASKS:
        raise ParameterError(f"task must be one of {list(TASKS)}, got {task!r}")
    chosen = find_algorithm(algorithm, "vertical")
    setting = parse_privacy(privacy, chosen)
    table, column_notes = prepare_input(table, label, id_column, drop)
    if task == "auto":
        task = infer_task(table[label])
    check_label(table[label], task)
    params, federated_params = _params(chosen, task, trees, max_depth, max_features, seed, setting, compute)
    federated_model = _engine(task, federated_params, progress, chosen)
    single_model = _engine(task, params, progress, chosen)
    train, test = split_train_test(table, label, task, test_size, seed)
    party_frames = split_vertical(train, parties, label=label, seed=seed)
    columns = [[c for c in frame.columns if c != label] for frame in party_frames]
    classification = task == "classification"
    federated = run_engine(federated_model, party_frames, label, [test[c] for c in columns],
                           caption=f"{chosen.title}, {parties} parties, {trees} trees", progress=progress,
                           probabilities=classification)
    single = run_engine(single_model, [train], label, [test.drop(columns=[label])], progress=progress,
                        caption=f"single-party run of the same engine (M = 1), {trees} trees",
                        probabilities=classification)
    identical = bool(np.array_equal(federated.output, single.output)
                     and same_structure(federated.model.master_.structure, single.model.master_.structure))
    return {
        "setting": "vertical",
        "algorithm": chosen.id,
        "privacy": setting.mode,
        "task": task,
        "parties": parties,
        **({"compute": compute} if isinstance(compute, str) else {}),
        "rows_train": len(train),
        "rows_test": len(test),
        **compare(task, test[label].to_numpy(), federated, single, identical,
                  chosen.run_reference(task, train, test, label, params)),
        "columns": column_notes,
    }


def _params(chosen: Algorithm, task: str, trees: int, max_depth: int | None,
            max_features: str | int | float | None, seed: int, setting: PrivacySetting,
            compute: Any) -> tuple[dict, dict]:
    """The single-party (and reference) run's parameters, and the federated run's; refusals first."""
    if chosen is BOOSTING:
        if max_features != TASK_DEFAULT:
            raise ParameterError("--max-features applies to --algorithm forest only: boosting takes every "
                                 "feature in every tree")
        params = boosting_params(trees, max_depth, seed)
        return params, {**params, "privacy": setting, "compute": compute}
    params = forest_params(task, trees, max_depth, max_features, seed)
    return params, {**params, "privacy": setting, "compute": compute}


def simulate_command(table: pd.DataFrame, args: Any, privacy: PrivacySetting) -> dict:
    """`fedforest simulate --setting vertical`'s run (the algorithm registry's `simulate`)."""
    return simulate_vertical(
        table, args.label, id_column=args.id_column, drop=args.drop, parties=args.parties,
        trees=args.trees, max_depth=args.max_depth, max_features=args.max_features, seed=args.seed,
        test_size=args.test_size, task=args.task, privacy=privacy, progress=True, compute=args.dask,
        algorithm=args.algorithm)
