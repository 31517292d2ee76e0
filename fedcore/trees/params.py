"""Forest hyper-parameters shared by every role, validated once, with scikit-learn's meanings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedcore.algorithms import FOREST
from fedcore.errors import ParameterError
from fedcore.privacy.schemes import ENCRYPTED_MODES, check_key_bits, scheme
from fedcore.trees.criteria import CRITERIA, SQUARED_ERROR, leaf_value

PRIVACY_MODES = FOREST.privacy_modes
"""Vertical label protection: none (labels shared, the paper's FF), or encrypted under Paillier or
Okamoto-Uchiyama ("ou"), SecureBoost-style."""


DEPTH_UNLIMITED = 10_000
"""The depth bound used when max_depth is None: no tree reaches it."""

MAX_ESTIMATORS = 2**31
"""Most trees a forest can have: tree numbers (0 .. n_estimators - 1) are int32 in the model tables
(fedcore/models/tables.py, fedcore/horizontal/model.py), the grower's node records and the messages that
carry them."""
MAX_DEPTH = 2**15 - 1
"""Deepest max_depth: node depths are int16 in the model tables and the grower's node records."""
MAX_TREES_PER_BATCH = 100_000
"""Most trees a vertical party grows in one batch (it refuses a larger `begin_batch`, see
fedcore/vertical/party.py): the bound of `tree_batch_size` in the vertical setting."""

INDEX_BYTES = 4 * 4
"""Bytes of a node's tree, node, left and right numbers (int32 each) in every model table."""
MASTER_NODE_BYTES = INDEX_BYTES + 2 + 2 + 8
"""A vertical master's node (fedcore/trees/structure.py ForestStructure): the index numbers, depth and owner
(int16) and weight (float64), plus 8 bytes per output of its value."""
PARTY_NODE_BYTES = INDEX_BYTES + 4 + 8 + 1 + 1 + 4 * 8
"""A vertical party's node (PartialForest): the index numbers, feature (int32), threshold (float64),
missing_left and is_categorical (bool) and the categorical split's 256 bits (4 uint64)."""
COMPLETE_NODE_BYTES = INDEX_BYTES + 2 + 4 + 8 + 8
"""A horizontal forest's node (fedcore/horizontal/model.py HorizontalForest), held by the master and every
party: the index numbers, depth (int16), feature (int32), threshold and weight (float64), plus 8 bytes per
output of its value."""


@dataclass(frozen=True)
class TreeParams:
    """What a forest of either setting is told, with scikit-learn's meanings, checked in one place.

    The task, how many trees, when to stop, how many candidate features, the seed and the tree batches. Each
    setting's params add their own fields and criteria (`_check_criterion`).
    """

    task: str = "classification"
    n_estimators: int = 100
    criterion: str = "gini"
    max_depth: int | None = None
    min_samples_split: int = 2
    min_samples_leaf: int = 1
    max_features: str | int | float | None = "sqrt"
    random_state: int = 0
    tree_batch_size: int | None = None
    memory_budget_mb: int | None = None

    def __post_init__(self) -> None:
        """Check every shared parameter (ParameterError names a bad one)."""
        if self.task not in ("classification", "regression"):
            raise ParameterError(f"task must be 'classification' or 'regression', got {self.task!r}")
        self._check_criterion()
        check_int("n_estimators", self.n_estimators, 1, MAX_ESTIMATORS,
                  "tree numbers are int32 in the model tables and messages")
        if self.max_depth is not None:
            check_int("max_depth", self.max_depth, 1, MAX_DEPTH, "node depths are int16 in the model tables")
        check_int("min_samples_split", self.min_samples_split, 2)
        check_int("min_samples_leaf", self.min_samples_leaf, 1)
        check_int("random_state", self.random_state, 0)
        if self.tree_batch_size is not None:
            check_int("tree_batch_size", self.tree_batch_size, 1)
        if self.memory_budget_mb is not None:
            check_int("memory_budget_mb", self.memory_budget_mb, 1)
        check_max_features(self.max_features)

    def _check_criterion(self) -> None:
        """Refuse a criterion this setting does not grow with (overridden per setting)."""

    def max_leaves(self, n_rows: int) -> int:
        """The most leaves a tree grown on `n_rows` rows can have.

        Every leaf holds at least min_samples_leaf of them (counts without noise).
        """
        return max(1, n_rows // self.min_samples_leaf)

    def node_bytes(self, n_outputs: int, colocated_parties: int = 0) -> int:
        """Bytes one node of the model takes at the master and at `colocated_parties` parties.

        Those parties share the master's memory (the simulator). Each setting states its own tables; this base
        counts the fields both share (index numbers, depth, weight and value), a lower bound of either.
        """
        return (INDEX_BYTES + 2 + 8 + 8 * n_outputs) * (1 + colocated_parties)

    def n_candidate_features(self, n_features: int) -> int:
        """How many features each node (or tree) considers."""
        return candidate_count(self.max_features, n_features)

    @property
    def depth_limit(self) -> int:
        """max_depth, or a bound no tree reaches."""
        return self.max_depth if self.max_depth is not None else DEPTH_UNLIMITED

    def batches(self, batch_size: int | None = None) -> list[list[int]]:
        """Tree indices grouped into the batches grown together.

        `tree_batch_size` when set, else `batch_size` (the grower's plan from the memory budget), else all at
        once.
        """
        size = self.tree_batch_size or batch_size or self.n_estimators
        return [list(range(a, min(a + size, self.n_estimators))) for a in range(0, self.n_estimators, size)]

    def to_dict(self) -> dict:
        """JSON-ready parameters."""
        return asdict(self)


def with_label_protection(params: dict, privacy: Any) -> dict:
    """Vertical `params:` with the `privacy:` section's mode and key size, which `params:` may not set."""
    if {"privacy", "key_bits", "paillier_key_bits"} & set(params):
        raise ParameterError("set label protection in the 'privacy:' section ({mode: paillier, key_bits: "
                             "2048}), not in params")
    return {**params, "privacy": privacy.mode, "key_bits": getattr(privacy, "key_bits", None)}


@dataclass(frozen=True)
class ForestParams(TreeParams):
    """Hyper-parameters of a vertical forest. Sizes (min_samples_*) count bootstrap-weighted rows."""

    min_impurity_decrease: float = 0.0
    feature_sampling: str = "node"
    bootstrap: bool = True
    max_samples: int | float | None = None
    max_bins: int = 255
    privacy: str = "none"
    key_bits: int | None = None
    """Label-encryption key size; None: the mode's default (Paillier 2048, Okamoto-Uchiyama 3072)."""

    def _check_criterion(self) -> None:
        if self.criterion not in CRITERIA:
            raise ParameterError(f"criterion must be one of {sorted(CRITERIA)}, got {self.criterion!r}")
        if (self.task == "regression") != (CRITERIA[self.criterion] == SQUARED_ERROR):
            raise ParameterError(f"criterion {self.criterion!r} does not fit task {self.task!r}")

    def __post_init__(self) -> None:
        """Check the Federated Forest parameters on top of the shared ones."""
        super().__post_init__()
        if self.min_impurity_decrease < 0:
            raise ParameterError(f"min_impurity_decrease must be >= 0, got {self.min_impurity_decrease}")
        if self.feature_sampling not in ("node", "tree"):
            raise ParameterError(f"feature_sampling must be 'node' or 'tree', got {self.feature_sampling!r}")
        if self.max_samples is not None:
            self._check_max_samples()
        if (isinstance(self.max_bins, bool) or not isinstance(self.max_bins, int)
                or not 2 <= self.max_bins <= 255):
            raise ParameterError("max_bins must be an integer between 2 and 255 (bin codes are uint8 and "
                                 f"code 255 marks missing values), got {self.max_bins!r}")
        if self.tree_batch_size is not None:
            check_int("tree_batch_size", self.tree_batch_size, 1, MAX_TREES_PER_BATCH,
                      "a vertical party refuses larger batches")
        self._check_privacy()

    def _check_max_samples(self) -> None:
        """A bootstrap sample size: a fraction in (0, 1] or a count >= 1, and only with bootstrap."""
        if not self.bootstrap:
            raise ParameterError("max_samples needs bootstrap=True")
        if isinstance(self.max_samples, float) and not 0 < self.max_samples <= 1:
            raise ParameterError(f"max_samples as a fraction must be in (0, 1], got {self.max_samples}")
        if isinstance(self.max_samples, int) and self.max_samples < 1:
            raise ParameterError(f"max_samples must be >= 1, got {self.max_samples}")

    def _check_privacy(self) -> None:
        """A vertical privacy mode; encrypted modes get their key size checked (their default if unset)."""
        if self.privacy not in PRIVACY_MODES:
            raise ParameterError(f"privacy must be one of {PRIVACY_MODES} in the vertical setting, got "
                                 f"{self.privacy!r}")
        if self.privacy in ENCRYPTED_MODES:
            bits = scheme(self.privacy).default_key_bits if self.key_bits is None else self.key_bits
            object.__setattr__(self, "key_bits", check_key_bits(self.privacy, bits))
        elif self.key_bits is not None:
            raise ParameterError(f"key_bits applies to the encrypted-label privacy modes {ENCRYPTED_MODES} "
                                 f"only, not {self.privacy!r}")

    @classmethod
    def from_vertical_config(cls, params: dict, privacy: Any) -> ForestParams:
        """A config's `params:`, with the label protection its `privacy:` section sets."""
        return cls(**with_label_protection(params, privacy))

    @classmethod
    def from_dict(cls, fields: dict) -> ForestParams:
        """Parameters as `to_dict` wrote them, also by an older version (its `paillier_key_bits`)."""
        fields = dict(fields)
        legacy_bits = fields.pop("paillier_key_bits", None)
        if legacy_bits is not None and fields.get("privacy") == "paillier":
            fields.setdefault("key_bits", legacy_bits)
        return cls(**fields)

    def batches(self, batch_size: int | None = None) -> list[list[int]]:
        """As `TreeParams.batches`, never more than MAX_TREES_PER_BATCH trees at once.

        A vertical party refuses a larger batch, however much memory the plan found.
        """
        return super().batches(min(batch_size or self.n_estimators, MAX_TREES_PER_BATCH))

    @property
    def criterion_code(self) -> int:
        """The numeric criterion used by the kernels."""
        return CRITERIA[self.criterion]

    @property
    def min_leaf_weight(self) -> float:
        """The least weight a child keeps (the kernels' `min_leaf`): min_samples_leaf draws."""
        return float(self.min_samples_leaf)

    def node_values(self, stats: np.ndarray) -> np.ndarray:
        """Each node's value from its statistics: class shares or the mean (`leaf_value`)."""
        return leaf_value(stats, self.criterion_code)

    def least_gain(self, root_weight: np.ndarray) -> np.ndarray | float:
        """The least gain that splits a node of a tree whose root weighs `root_weight`."""
        return self.min_impurity_decrease * root_weight

    def growth(self, trees_per_round: int) -> ForestParams:
        """The parameters the grower runs (boosting: rounds of trees; a forest: these)."""
        return self

    def setup_fields(self) -> dict[str, object] | None:
        """What boosting tells the parties at setup (a forest: nothing)."""
        return None

    def n_draws(self, n_rows: int) -> int | None:
        """Bootstrap sample size per tree, or None without bootstrap.

        A count above `n_rows` is refused (as scikit-learn does): the parties refuse to draw more rows than
        they hold.
        """
        if not self.bootstrap:
            return None
        if self.max_samples is None:
            return n_rows
        if isinstance(self.max_samples, float):
            return max(1, round(self.max_samples * n_rows))
        if self.max_samples > n_rows:
            raise ParameterError(f"max_samples must be at most the {n_rows} training rows (a bootstrap "
                                 f"sample draws from them), got {self.max_samples}; pass a fraction to scale "
                                 "with the data")
        return int(self.max_samples)

    def max_leaves(self, n_rows: int) -> int:
        """The most leaves a tree can have.

        Each holds at least one of the `n_rows` rows and, counting bootstrap draws, at least min_samples_leaf
        draws.
        """
        draws = self.n_draws(n_rows) or n_rows
        return max(1, min(n_rows, draws // self.min_samples_leaf))

    def node_bytes(self, n_outputs: int, colocated_parties: int = 0) -> int:
        """The master's structure node plus each colocated party's partial-model node."""
        return MASTER_NODE_BYTES + 8 * n_outputs + colocated_parties * PARTY_NODE_BYTES


def candidate_count(max_features: str | int | float | None, n_features: int) -> int:
    """Features per candidate draw for scikit-learn's `max_features` (sqrt, log2, int, fraction, None)."""
    if max_features is None:
        k = n_features
    elif max_features == "sqrt":
        k = int(math.sqrt(n_features))
    elif max_features == "log2":
        k = int(math.log2(n_features))
    elif isinstance(max_features, float):
        k = int(max_features * n_features)
    else:
        k = int(max_features)
    return max(1, min(n_features, k))


def check_int(name: str, value: object, minimum: int, maximum: int | None = None, why: str = "") -> None:
    """Refuse a non-integer (or boolean), or one outside [`minimum`, `maximum`], naming the parameter.

    The refusal of a value above `maximum` says `why` that is the bound.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ParameterError(f"{name} must be at most {maximum} ({why}), got {value!r}")


def check_max_features(mf: object) -> None:
    """Refuse anything scikit-learn's `max_features` does not mean.

    'sqrt', 'log2', a count >= 1, a fraction in (0, 1] or None.
    """
    if isinstance(mf, bool) or (isinstance(mf, str) and mf not in ("sqrt", "log2")) or not (
            mf is None or isinstance(mf, (str, int, float))):
        raise ParameterError("max_features must be 'sqrt', 'log2', an int, a float in (0, 1] or None, got "
                             f"{mf!r}")
    if isinstance(mf, float) and not 0 < mf <= 1:
        raise ParameterError(f"max_features as a fraction must be in (0, 1], got {mf}")
    if isinstance(mf, int) and mf < 1:
        raise ParameterError(f"max_features must be >= 1, got {mf}")


# -- what the model can cost, before any work -------------------------------------------------------
def max_nodes_per_tree(params: TreeParams, n_rows: int) -> int:
    """The most nodes one tree can have.

    A binary tree with L leaves has 2L - 1 nodes, L is at most `params.max_leaves(n_rows)`, and a tree of
    depth d has at most 2^(d+1) - 1 nodes.
    """
    by_rows = 2 * params.max_leaves(n_rows) - 1
    if params.max_depth is None:
        return by_rows
    return min(by_rows, 2 ** (params.max_depth + 1) - 1)


def model_bytes(params: TreeParams, n_rows: int, n_outputs: int = 1, colocated_parties: int = 0) -> int:
    """Worst-case bytes of the model's tables (`max_nodes_per_tree` nodes in each of n_estimators trees)."""
    return (params.n_estimators * max_nodes_per_tree(params, n_rows)
            * params.node_bytes(n_outputs, colocated_parties))


def check_model_fits(params: TreeParams, n_rows: int, budget_bytes: int, *, n_outputs: int = 1,
                     colocated_parties: int = 0) -> int:
    """Refuse, before any work, a forest whose worst-case model cannot fit in `budget_bytes`.

    `budget_bytes` is the memory available to the role that holds it. Returns the worst-case bytes otherwise.

    `n_rows`: the training rows; `n_outputs`: values per node (classes, or 1 for regression);
    `colocated_parties`: parties whose model copies share this memory (the simulator: all of them; a
    deployed master: 0).
    """
    need = model_bytes(params, n_rows, n_outputs, colocated_parties)
    if need <= budget_bytes:
        return need
    holders = "the master" + (f" and {colocated_parties} parties" if colocated_parties > 1 else
                              " and 1 party" if colocated_parties == 1 else "")
    depth = "" if params.max_depth is None else f" and max_depth={params.max_depth}"
    leaf = f" with min_samples_leaf={params.min_samples_leaf}" if params.min_samples_leaf > 1 else ""
    raise ParameterError(
        f"n_estimators={params.n_estimators} may need {format_bytes(need)} of memory, more than the "
        f"{format_bytes(budget_bytes)} available: a tree on {n_rows} rows{leaf}{depth} has up to "
        f"{max_nodes_per_tree(params, n_rows)} nodes, and the model tables of {holders} take "
        f"{params.node_bytes(n_outputs, colocated_parties)} bytes a node; lower n_estimators, "
        f"{'set' if params.max_depth is None else 'lower'} max_depth or raise min_samples_leaf")


def format_bytes(n: int) -> str:
    """A byte count in binary units: 512 B, 3.0 KiB, 1.5 GiB, 70.3 TiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} EiB"
