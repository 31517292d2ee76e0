"""The simulators: one table split into simulated parties, trained federated on one machine and compared.

`simulate_vertical` deals columns out to parties (Federated Forest); `simulate_horizontal` deals rows out
to institutions (Federated Extra-Trees, PPD-ERT). Both prepare the table the same way (`table`), take the
same forest parameters (`params`), time fit and predict and compare the federated run with the
single-party run and scikit-learn the same way (`comparison`, `reference`). `fedforest simulate` and the
benchmarks use them; production code (agents, sessions, flows) never imports this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "comparison": ("EngineRun", "timed"),
    "horizontal": ("build_estimator", "declared_ranges", "pooled_categories", "simulate_horizontal"),
    "params": ("TASK_DEFAULT", "TASKS", "forest_params"),
    "reference": ("one_hot", "reference_extra_trees", "reference_forest", "timed_reference"),
    "table": ("prepare_input", "prepare_table", "split_train_test"),
    "vertical": ("same_structure", "simulate_vertical"),
}
"""Which submodule holds each name: imported when the name is first used, so a horizontal simulation does
not import the vertical engine (and its kernels) nor a vertical one the horizontal engines (issue #34)."""
_HOME = {name: module for module, names in _HOMES.items() for name in names}

if TYPE_CHECKING:
    from fedcore.simulation.comparison import EngineRun, timed
    from fedcore.simulation.horizontal import (
        build_estimator,
        declared_ranges,
        pooled_categories,
        simulate_horizontal,
    )
    from fedcore.simulation.params import TASK_DEFAULT, TASKS, forest_params
    from fedcore.simulation.reference import one_hot, reference_extra_trees, reference_forest, timed_reference
    from fedcore.simulation.table import prepare_input, prepare_table, split_train_test
    from fedcore.simulation.vertical import same_structure, simulate_vertical


def __getattr__(name: str) -> Any:
    """`name` from the submodule that holds it, imported on first use."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)


__all__ = ["TASKS", "TASK_DEFAULT", "EngineRun", "build_estimator", "declared_ranges", "forest_params",
           "one_hot", "pooled_categories", "prepare_input", "prepare_table", "reference_extra_trees",
           "reference_forest", "same_structure", "simulate_horizontal", "simulate_vertical",
           "split_train_test", "timed", "timed_reference"]
