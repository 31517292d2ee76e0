"""The privacy setting of a training: one typed value per mode, parsed once, by one parser.

`parse_privacy(raw, algorithm, task=None)` reads what a user or a peer wrote (a mode name; a mapping, as in
the federation config's `privacy:` section, a master's setup header or an estimator's `privacy=`; or a
setting already parsed) and returns the setting of its mode:

| mode | setting | fields (besides `mode`) |
|---|---|---|
| none | `NoPrivacy` | - |
| paillier, ou | `EncryptedLabels` | `key_bits` (the scheme's sizes; default 2048 Paillier, 3072 OU) |
| gdp | `GlobalDP` | `epsilon` (1.0), `delta` (1e-6): the model's budget, per row; `plan`, `split_levels` |
| ldp | `LocalDP` | `epsilon`: each row's label, over any number of reports; the `LabelLDP` fields |
| secagg | `SecureAggregation` | `thresholds` (histogram, the default, or domain); `cells` (histogram only) |
| secagg-dp | `DistributedDP` | `epsilon` (1.0), `delta` (1e-6): the model's budget, against the master |

Under `ldp`, `epsilon` is what the mechanism guarantees for each row's label, however many reports it
sends. `mechanism: auto` (the default), `krr` and `oue` report once per row at that epsilon (default 2.0);
"auto" resolves to krr or oue by variance for the agreed classes (`LocalDP.for_classes`, which the master
session, the agent and the estimators apply once the classes are known, so the wire form and the privacy
report name the resolved one). The Bloom mechanism (`mechanism: bloom`, the FET paper's) sets
`keep_probability` to tanh(epsilon / (4 n_hashes)), so that its permanent epsilon
2 n_hashes ln((1 + keep) / (1 - keep)) is epsilon (never above it), and `keep_probability` may then not
be given as well; without `epsilon` its fields' own values decide it (the defaults: 8.79).

A field the mode (or its mechanism, estimator or threshold mode) does not use is refused, never ignored,
and so is an unknown one; both messages list the valid fields. Every entry point goes through this parser:
the config (`fedcore.config`), `fedforest simulate`, the estimators, the master session (its setup header
carries `to_dict()`) and the institution agent, which parses the master's header and its own config the
same way and trains only if the two settings are equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedcore.algorithms import Algorithm
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.errors import ParameterError
from fedcore.privacy.accounting import DEFAULT_DELTA, check_delta, check_epsilon
from fedcore.privacy.ldp import ESTIMATORS, MECHANISMS, ONE_REPORT, LabelLDP, keep_probability_for
from fedcore.privacy.schemes import ENCRYPTED_MODES, check_key_bits, scheme

THRESHOLD_MODES = ("histogram", "domain")
"""Where PPD-ERT's candidate thresholds come from: the populated grid cells of the node's rows
(`fedcore/horizontal/ppdert/cells.py`), or the declared domain, as in the paper."""
DEFAULT_CELLS = 16
CELL_CHOICES = (4, 8, 16, 32, 64)
"""Grid cells per candidate interval with histogram thresholds: powers of two, so cell edges are exact
fractions of the interval."""
DEFAULT_GDP_EPSILON = 1.0
_MOVED = {"ldp": "the LabelLDP fields now go directly under privacy:",
          "epsilon_krr": "each row's label epsilon is privacy.epsilon",
          "report_epsilon": "each row's label epsilon is privacy.epsilon"}
"""Fields earlier versions read (or LabelLDP's own names), and where their values go under privacy:."""

_BLOOM_FIELDS = ("n_bits", "n_hashes", "keep_probability", "p_one_if_one", "p_one_if_zero")
_LDP_FIELDS = ("epsilon", "mechanism", *_BLOOM_FIELDS, "estimator", "lasso_alpha", "min_leaf_reports")
MODE_FIELDS: dict[str, tuple[str, ...]] = {
    "none": (), **{mode: ("key_bits",) for mode in ENCRYPTED_MODES},
    "gdp": ("epsilon", "delta", "plan", "split_levels"),
    "ldp": _LDP_FIELDS,
    "secagg": ("thresholds", "cells"),
    "secagg-dp": ("epsilon", "delta"),
}
"""The fields each mode may have, besides `mode` (some only with a given mechanism, estimator or threshold
mode: `valid_fields`)."""


def check_threshold_mode(thresholds: object, n_cells: object) -> tuple[str, int]:
    """Refuse an unknown threshold mode or grid size (both PPD-ERT roles check what they are given)."""
    if not isinstance(thresholds, str) or thresholds not in THRESHOLD_MODES:
        raise ParameterError(f"PPD-ERT thresholds must be one of {list(THRESHOLD_MODES)}, got {thresholds!r}")
    if isinstance(n_cells, bool) or not isinstance(n_cells, int) or n_cells not in CELL_CHOICES:
        raise ParameterError(f"PPD-ERT histogram cells must be one of {list(CELL_CHOICES)}, got {n_cells!r}")
    return thresholds, int(n_cells)


class PrivacySetting:
    """What the setting of every mode has: its `mode`, its wire form and a short description."""

    mode: str

    def to_dict(self) -> dict[str, Any]:
        """The setting as `parse_privacy` reads it back: a setup header, a checkpoint context, a manifest."""
        return {"mode": self.mode, **self._fields()}

    def _fields(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        """The mode and what sets its strength, for messages: 'gdp' (epsilon 0.5)."""
        return repr(self.mode)

    def for_classes(self, n_classes: int) -> PrivacySetting:
        """The setting as it runs for n_classes agreed classes: the same but for LDP's "auto" (`LocalDP`)."""
        return self


@dataclass(frozen=True)
class NoPrivacy(PrivacySetting):
    """Mode `none`: labels and statistics in the clear (as the papers)."""

    mode: str = field(default="none", init=False)


@dataclass(frozen=True)
class EncryptedLabels(PrivacySetting):
    """Modes `paillier` and `ou` (vertical): the label holder's labels cross only as ciphertexts."""

    mode: str
    key_bits: int | None = None
    """The modulus size (None: the scheme's default, filled in)."""

    def __post_init__(self) -> None:
        """Check the scheme and the key size; fill in the scheme's default size."""
        if self.mode not in ENCRYPTED_MODES:
            raise ParameterError(f"privacy: {self.mode!r} is not an encrypted-label mode; known: "
                                 f"{list(ENCRYPTED_MODES)}")
        bits = scheme(self.mode).default_key_bits if self.key_bits is None else self.key_bits
        object.__setattr__(self, "key_bits", _key_bits(self.mode, bits))

    @property
    def bits(self) -> int:
        """The key size (`__post_init__` fills in the default)."""
        assert self.key_bits is not None, "__post_init__ fills in the scheme's default key size"
        return self.key_bits

    def _fields(self) -> dict[str, Any]:
        return {"key_bits": self.key_bits}

    def describe(self) -> str:
        """For messages: 'paillier' (3072-bit key)."""
        return f"{self.mode!r} ({self.key_bits}-bit key)"


@dataclass(frozen=True)
class ModelBudget(PrivacySetting):
    """A DP mode whose `epsilon` and `delta` are the whole model's budget, per row (gdp, secagg-dp)."""

    epsilon: float = DEFAULT_GDP_EPSILON
    """The whole trained model's epsilon, per row (add/remove-one neighbours)."""
    delta: float = DEFAULT_DELTA
    """The probability that the epsilon guarantee fails for a row (`fedcore.privacy.accounting`)."""

    def __post_init__(self) -> None:
        """Check epsilon (a finite number > 0) and delta (`check_delta`)."""
        object.__setattr__(self, "epsilon", _epsilon(self.epsilon))
        try:
            object.__setattr__(self, "delta", check_delta(self.delta))
        except ParameterError as error:
            raise ParameterError(f"privacy: {error}") from None

    def _fields(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta}

    def describe(self) -> str:
        """For messages: 'gdp' (epsilon 0.5, delta 1e-06)."""
        return f"{self.mode!r} (epsilon {self.epsilon:g}, delta {self.delta:g})"


GDP_PLANS = ("auto", "splits", "leaves", "marginals")
"""FET-GDP's release plans (`fedcore/horizontal/plan.py`): `splits` spends the budget on every level's noisy
branch counts (the paper's), `leaves` on one release of each tree's leaf class counts below a random structure
(after `split_levels` upper levels chosen as in `splits`), `marginals` as `leaves` with each drawn split
chosen among k candidates by class-conditional DP marginal histograms released once
(`fet/class_marginals.py`), `auto` picks one from the budget, classes and rows
(`default_gdp_plan`)."""


@dataclass(frozen=True)
class GlobalDP(ModelBudget):
    """Mode `gdp` (FET): each party adds Gaussian noise calibrated to the whole model's (epsilon, delta)."""

    plan: str = "auto"
    """Where the budget goes: `GDP_PLANS`."""
    split_levels: int = 0
    """Plan `leaves`: the upper levels chosen by noisy branch counts before the random ones (0: none)."""
    mode: str = field(default="gdp", init=False)

    def __post_init__(self) -> None:
        """Check the budget, the plan and its split levels (an integer >= 0, with plan leaves only)."""
        super().__post_init__()
        if self.plan not in GDP_PLANS:
            raise ParameterError(f"privacy: gdp's plan must be one of {list(GDP_PLANS)}, got {self.plan!r}")
        levels = self.split_levels
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
            raise ParameterError(f"privacy: gdp's split_levels must be an integer >= 0, got {levels!r}")
        if levels and self.plan not in ("leaves", "marginals"):
            raise ParameterError(f"privacy: gdp's split_levels applies to plans 'leaves' and 'marginals' "
                                 f"only, not {self.plan!r}")

    def _fields(self) -> dict[str, Any]:
        return {**super()._fields(), "plan": self.plan, "split_levels": self.split_levels}


@dataclass(frozen=True)
class LocalDP(PrivacySetting):
    """Mode `ldp` (FET, classification): each party randomizes its labels (`fedcore.privacy.ldp`)."""

    ldp: LabelLDP = field(default_factory=LabelLDP)
    """The label mechanism every party runs and the master estimates counts with."""
    mode: str = field(default="ldp", init=False)

    def __post_init__(self) -> None:
        """Check the mechanism is a LabelLDP (it checks its own fields)."""
        if not isinstance(self.ldp, LabelLDP):
            raise ParameterError(f"privacy: ldp must be a LabelLDP, got {type(self.ldp).__name__}")

    @property
    def epsilon(self) -> float:
        """Each row's label epsilon over any number of reports (its one report's; Bloom's permanent one)."""
        return self.ldp.epsilon()["permanent"]

    def budget(self) -> dict[str, Any]:
        """What a privacy report states: the mechanism, each row's label epsilon, and the model's total.

        The total is that epsilon with delta 0, not a composition over reports: a row's reports repeat its
        one randomized response (post-processing; Bloom: its permanent response bounds them).
        """
        return {"mechanism": self.ldp.mechanism, "epsilon": self.epsilon, "epsilon_total": self.epsilon,
                "delta": 0.0}

    def for_classes(self, n_classes: int) -> LocalDP:
        """Mechanism "auto" resolved to GRR or OUE for the agreed classes (`LabelLDP.resolved`)."""
        return LocalDP(self.ldp.resolved(n_classes))

    def _fields(self) -> dict[str, Any]:
        return label_ldp_fields(self.ldp)

    def describe(self) -> str:
        """For messages: 'ldp' (krr, epsilon 1)."""
        return f"'ldp' ({self.ldp.mechanism}, epsilon {self.epsilon:.3g})"


@dataclass(frozen=True)
class SecureAggregation(PrivacySetting):
    """Mode `secagg` (PPD-ERT): the master sees only masked sums of branch counts."""

    thresholds: str = "histogram"
    cells: int | None = None
    """Grid cells per candidate interval (histogram thresholds; None there means DEFAULT_CELLS). Domain
    thresholds have no grid: None."""
    mode: str = field(default="secagg", init=False)

    def __post_init__(self) -> None:
        """Check the threshold mode and its grid; fill in the default grid."""
        if self.thresholds == "domain" and self.cells is not None:
            raise ParameterError("privacy: thresholds 'domain' does not use field(s) ['cells']; valid: "
                                 f"{valid_fields('secagg', thresholds='domain')}")
        cells = DEFAULT_CELLS if self.cells is None else self.cells
        try:
            thresholds, cells = check_threshold_mode(self.thresholds, cells)
        except ParameterError as error:
            raise ParameterError(f"privacy: {error}") from None
        object.__setattr__(self, "cells", cells if thresholds == "histogram" else None)

    @property
    def n_cells(self) -> int:
        """The grid size both PPD-ERT roles are built with (DEFAULT_CELLS with domain thresholds, unused)."""
        return self.cells or DEFAULT_CELLS

    def _fields(self) -> dict[str, Any]:
        return {"thresholds": self.thresholds, **({"cells": self.cells} if self.cells is not None else {})}

    def describe(self) -> str:
        """For messages: 'secagg' (histogram thresholds on 16 cells)."""
        grid = f" on {self.cells} cells" if self.cells is not None else ""
        return f"'secagg' ({self.thresholds} thresholds{grid})"


@dataclass(frozen=True)
class DistributedDP(ModelBudget):
    """Mode `secagg-dp` (PPD-ERT): secure aggregation of counts carrying distributed discrete Gaussian noise.

    Named for what it is: PPD-ERT's secure aggregation (`secagg`) plus differential privacy. Each party adds
    1/P of the noise variance to its masked counts, the master's unmasked sum carries all of it
    (`fedcore.privacy.distributed`). `epsilon`, `delta`: the whole model's budget per row, against the
    master. Thresholds are the paper's (uniform in the declared domains): histogram thresholds would reveal
    each node's extreme grid cells, which no budget covers.
    """

    mode: str = field(default="secagg-dp", init=False)

    thresholds = "domain"
    """PPD-ERT's threshold mode under secagg-dp: always the declared domains."""

    @property
    def n_cells(self) -> int:
        """No grid (domain thresholds): the default size both PPD-ERT roles are built with, unused."""
        return DEFAULT_CELLS


def valid_fields(mode: str, *, mechanism: str = "bloom", estimator: str = "nnls", epsilon: bool = False,
                 thresholds: str = "histogram") -> list[str]:
    """The fields `mode` takes, sorted, `mode` included.

    LDP's depend on its mechanism and estimator (and, with Bloom, epsilon excludes keep_probability),
    secure aggregation's on its threshold mode.
    """
    fields = set(MODE_FIELDS[mode]) | {"mode"}
    if mode == "ldp":
        if mechanism in ONE_REPORT:
            fields -= set(_BLOOM_FIELDS)
        elif epsilon:
            fields.discard("keep_probability")
        if estimator != "lasso":
            fields.discard("lasso_alpha")
    if mode == "secagg" and thresholds == "domain":
        fields.discard("cells")
    return sorted(fields)


def label_ldp_fields(ldp: LabelLDP, complete: bool = True) -> dict[str, Any]:
    """A LabelLDP as the `ldp` fields `parse_privacy` reads (its report_epsilon as `epsilon`).

    `complete`: every field its mechanism and estimator use (the wire form); else only those that differ
    from their mechanism's defaults (an estimator's `ldp=`, which `epsilon=` may then calibrate). Either way
    a field it does not use but sets to another value than its default is included, for the parser to
    refuse.
    """
    used = set(valid_fields("ldp", mechanism=ldp.mechanism, estimator=ldp.estimator))
    defaults = LabelLDP(mechanism=ldp.mechanism)  # a one-report mechanism's default epsilon filled in
    out: dict[str, Any] = {}
    for entry in dataclasses.fields(LabelLDP):
        name = "epsilon" if entry.name == "report_epsilon" else entry.name
        value = getattr(ldp, entry.name)
        default = entry.default if entry.name == "mechanism" else getattr(defaults, entry.name)
        if (complete and name in used and value is not None) or value != default:
            out[name] = value
    return out


def parse_privacy(raw: object, algorithm: Algorithm | str, task: str | None = None) -> PrivacySetting:
    """The privacy setting `raw` describes, checked against `algorithm` (and `task`, when known).

    `raw`: None (the algorithm's default mode), a mode name, a mapping with `mode` (absent: the default
    mode) and that mode's fields, or a `PrivacySetting`. Refused with ParameterError: a mode the algorithm
    does not offer, an unknown field, a field the mode does not use, a value out of range, LDP for a
    regression task.
    """
    chosen = algorithm if isinstance(algorithm, Algorithm) else find_algorithm(algorithm)
    if isinstance(raw, PrivacySetting):
        setting = raw
        chosen.check_privacy(setting.mode)
    else:
        fields = _as_mapping(raw, chosen)
        mode = chosen.check_privacy(fields.pop("mode", chosen.default_privacy))
        setting = _BUILDERS[mode](mode, fields)
    if task == "regression" and setting.mode == "ldp":
        raise ParameterError("privacy 'ldp' randomizes class labels and works for classification only; use "
                             "'gdp' (Gaussian noise) or 'none' for a regression label")
    return setting


def privacy_with(privacy: object, algorithm: Algorithm | str, task: str | None = None,
                 **fields: Any) -> PrivacySetting:
    """An estimator's privacy setting: its `privacy=` completed by the fields its own arguments give.

    `fields`: `epsilon=`, `key_bits=`, `thresholds=`... by field name, None where the argument was not
    given. `privacy` is what `parse_privacy` reads; a field given both there and as an argument is refused,
    as is any field beside a `PrivacySetting` (which carries all of its own).
    """
    given = {name: value for name, value in fields.items() if value is not None}
    if not given:
        return parse_privacy(privacy, algorithm, task)
    if isinstance(privacy, PrivacySetting):
        raise ParameterError(f"privacy: {sorted(given)} given beside a {type(privacy).__name__}, which "
                             "carries all its fields: set them in the setting")
    base = _as_mapping(privacy, algorithm if isinstance(algorithm, Algorithm) else find_algorithm(algorithm))
    twice = sorted(set(base) & set(given))
    if twice:
        raise ParameterError(f"privacy: {twice} given both in privacy= and as an argument of its own; give "
                             "each once")
    return parse_privacy({**base, **given}, algorithm, task)


def _as_mapping(raw: object, chosen: Algorithm) -> dict[str, Any]:
    """`raw` as a mapping of field names: None is the default mode, a name {mode: name}."""
    if raw is None:
        return {"mode": chosen.default_privacy}
    if isinstance(raw, str):
        return {"mode": raw}
    if not isinstance(raw, Mapping):
        raise ParameterError(f"privacy must be a mode name, a mapping with 'mode' or a PrivacySetting, got "
                             f"{raw!r}")
    return {str(key): value for key, value in raw.items()}


def _check_fields(given: Mapping[str, Any], valid: list[str], mode: str, *variant: str) -> None:
    """Refuse fields no mode has (unknown), then those this mode (and its `variant`) does not use."""
    known = {name for names in MODE_FIELDS.values() for name in names} | {"mode"}
    unknown = sorted(name for name in given if name not in known)
    if unknown:
        moved = "".join(f" ({name}: {_MOVED[name]})" for name in unknown if name in _MOVED)
        raise ParameterError(f"privacy: unknown field(s) {unknown} for mode {mode!r}; valid: {valid}{moved}")
    unused = sorted(name for name in given if name not in valid)
    if unused:
        where = " and ".join((f"mode {mode!r}", *variant)).replace(" and ", " with ", 1)
        raise ParameterError(f"privacy: {where} does not use field(s) {unused}; valid: {valid}")


def _epsilon(value: Any) -> float:
    try:
        return check_epsilon(value)
    except ParameterError as error:
        raise ParameterError(f"privacy: {error}") from None


def _no_privacy(mode: str, fields: dict[str, Any]) -> PrivacySetting:
    _check_fields(fields, valid_fields(mode), mode)
    return NoPrivacy()


def _encrypted_labels(mode: str, fields: dict[str, Any]) -> PrivacySetting:
    _check_fields(fields, valid_fields(mode), mode)
    return EncryptedLabels(mode, _key_bits(mode, fields["key_bits"]) if "key_bits" in fields else None)


def _key_bits(mode: str, bits: object) -> int:
    try:
        return check_key_bits(mode, bits)
    except ParameterError as error:
        raise ParameterError(f"privacy: {error}") from None


def _model_budget(mode: str, fields: dict[str, Any]) -> PrivacySetting:
    """The setting of gdp or secagg-dp: the model's (epsilon, delta)."""
    _check_fields(fields, valid_fields(mode), mode)
    budget = fields.get("epsilon", DEFAULT_GDP_EPSILON), fields.get("delta", DEFAULT_DELTA)
    if mode == "gdp":
        return GlobalDP(*budget, plan=fields.get("plan", "auto"), split_levels=fields.get("split_levels", 0))
    return DistributedDP(*budget)


def _secure_aggregation(mode: str, fields: dict[str, Any]) -> PrivacySetting:
    thresholds = fields.get("thresholds", "histogram")
    _check_fields(fields, valid_fields(mode, thresholds=thresholds), mode, f"thresholds {thresholds!r}")
    return SecureAggregation(thresholds, fields.get("cells"))


def _local_dp(mode: str, fields: dict[str, Any]) -> PrivacySetting:
    """LDP: check the mechanism and estimator first (the valid fields depend on them), then the fields."""
    mechanism, estimator = fields.get("mechanism", "auto"), fields.get("estimator", "nnls")
    if mechanism not in MECHANISMS:
        raise ParameterError(f"privacy: mechanism must be one of {list(MECHANISMS)}, got {mechanism!r}")
    if estimator not in ESTIMATORS:
        raise ParameterError(f"privacy: estimator must be one of {list(ESTIMATORS)}, got {estimator!r}")
    if mechanism == "bloom" and {"epsilon", "keep_probability"} <= set(fields):
        raise ParameterError("privacy: give epsilon or keep_probability, not both: under mode 'ldp' with "
                             "mechanism 'bloom', epsilon sets keep_probability to "
                             "tanh(epsilon / (4 n_hashes))")
    _check_fields(fields, valid_fields(mode, mechanism=mechanism, estimator=estimator,
                                       epsilon="epsilon" in fields),
                  mode, f"mechanism {mechanism!r}", f"estimator {estimator!r}")
    values = {name: value for name, value in fields.items() if name != "epsilon"}
    epsilon = _epsilon(fields["epsilon"]) if "epsilon" in fields else None
    if mechanism in ONE_REPORT:
        values["report_epsilon"] = epsilon  # None: LabelLDP's DEFAULT_EPSILON
    try:
        ldp = LabelLDP(**values)
        if mechanism == "bloom" and epsilon is not None:
            ldp = dataclasses.replace(ldp, keep_probability=keep_probability_for(epsilon, ldp.n_hashes))
    except ParameterError as error:
        raise ParameterError(f"privacy: {error}") from None
    return LocalDP(ldp)


_BUILDERS = {"none": _no_privacy, **{mode: _encrypted_labels for mode in ENCRYPTED_MODES},
             "gdp": _model_budget, "ldp": _local_dp, "secagg": _secure_aggregation,
             "secagg-dp": _model_budget}
