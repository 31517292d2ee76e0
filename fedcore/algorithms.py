"""The algorithms fedforest offers: one entry each: id, setting, title, privacy modes and implementation.

The config, the CLI, the simulator, the parameter checks, manifests and model tables all read this table.
Each entry names its implementation by import path ("module:attribute"), loaded only when asked for, so
importing the registry imports no engine; callers ask the entry instead of switching on algorithm strings.
Earlier versions wrote other spellings (`federated-forest`, `fet`, `ppdert`); `read_algorithm` still
accepts them in stored manifests and model tables, but nothing writes them and no input accepts them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedcore.errors import ParameterError
from fedcore.privacy.schemes import ENCRYPTED_MODES

if TYPE_CHECKING:
    from fedcore.agents.base import SessionAgent
    from fedcore.config import FederationConfig
    from fedcore.privacy.settings import PrivacySetting
    from fedcore.session import MasterSession
    from fedcore.transport.base import Transport

SETTINGS = ("vertical", "horizontal")


def load(path: str) -> Any:
    """The object at `path` ("package.module:Class.attribute"), its module imported now."""
    module, _, attributes = path.partition(":")
    found: Any = importlib.import_module(module)
    for name in attributes.split("."):
        found = getattr(found, name)
    return found


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: how configs and manifests name it, where it runs, and the privacy it offers."""

    id: str
    setting: str
    title: str
    privacy_modes: tuple[str, ...]
    """The `privacy.mode` values it accepts; the first is the default."""
    old_ids: tuple[str, ...] = ()
    """Spellings earlier versions wrote into manifests and model tables, accepted when reading them."""
    params: str = ""
    """Its parameter class."""
    parse_params: str = ""
    """`(params: dict, privacy) -> params`: a config's `params:` section as its parameter class."""
    check_params: str | None = None
    """`(privacy, params) -> None`: what its privacy requires of the parameters, or None."""
    session: str | None = None
    """`(config, transport) -> MasterSession`: the master's session for a federation config; None: not
    deployable (simulation and estimators only, so far)."""
    agent: str | None = None
    """`(config, source, name, identity) -> SessionAgent`: an institution's agent for a federation config."""
    estimators: tuple[str, str] = ("", "")
    """Its scikit-learn-style estimator classes: the classifier's and the regressor's."""
    simulate: str = ""
    """`(table, args, privacy) -> dict`: `fedforest simulate`'s run of its setting (`fedcore.simulation`)."""
    reference: str = ""
    """`(task, train, test, label, params) -> dict`: the centralised scikit-learn run a simulation is scored
    against (`fedcore.simulation.reference`)."""
    fieldless_modes: tuple[str, ...] = ()
    """Modes it runs with none of their fields: there they configure another algorithm's engine (PPD-ERT's
    `thresholds` and `cells` under `secagg`), so any given, even at its default value, is refused."""

    @property
    def deployable(self) -> bool:
        """Whether configs (agents, flows, the registry) run it; False: simulation and estimators only."""
        return self.session is not None

    @property
    def default_privacy(self) -> str:
        """The privacy mode used when none is configured."""
        return self.privacy_modes[0]

    def check_privacy(self, mode: str) -> str:
        """`mode`, refused unless this algorithm offers it."""
        if mode not in self.privacy_modes:
            raise ParameterError(f"algorithm {self.id!r} supports privacy {list(self.privacy_modes)}, "
                                 f"got {mode!r}")
        return mode

    def params_class(self) -> type:
        """Its parameter class (imported now)."""
        return load(self.params)

    def params_from_config(self, params: dict, privacy: PrivacySetting) -> Any:
        """A config's `params:` as its parameter class, refused with TypeError or ParameterError."""
        return load(self.parse_params)(params, privacy)

    def check_privacy_params(self, privacy: PrivacySetting, params: Any) -> None:
        """Refuse, with ParameterError, parameters that `privacy` cannot run with."""
        if self.check_params is not None:
            load(self.check_params)(privacy, params)

    def estimator_class(self, task: str) -> type:
        """Its estimator class for `task` ("classification" or "regression"), imported now."""
        path = self.estimators[0 if task == "classification" else 1]
        if not path:
            raise ParameterError(f"{self.title} has no {task} estimator")
        return load(path)

    def simulate_command(self, table: Any, args: Any, privacy: PrivacySetting) -> dict:
        """`fedforest simulate`'s result for `table` with the command's `args` (imports the simulator now)."""
        return load(self.simulate)(table, args, privacy)

    def run_reference(self, task: str, train: Any, test: Any, label: str, params: dict) -> dict:
        """The centralised reference's metrics on `test`, trained on `train` with `params`."""
        return load(self.reference)(task, train, test, label, params)

    def open_session(self, config: FederationConfig, transport: Transport) -> MasterSession:
        """The master session `config` asks for, over a connected `transport`."""
        assert self.session is not None, "the config refuses an algorithm that is not deployable"
        return load(self.session)(config, transport)

    def institution_agent(self, config: FederationConfig, source: Any, name: str,
                          identity: Any) -> SessionAgent:
        """Institution `name`'s agent serving `source` (its data, or a callable loading it)."""
        assert self.agent is not None, "the config refuses an algorithm that is not deployable"
        return load(self.agent)(config, source, name, identity)


_VERTICAL_SESSION = "fedcore.vertical.deploy:open_session"
_VERTICAL_AGENT = "fedcore.vertical.deploy:institution_agent"
_SIMULATE_VERTICAL = "fedcore.simulation.vertical:simulate_command"
_SIMULATE_HORIZONTAL = "fedcore.simulation.horizontal:simulate_command"
_REFERENCE = "fedcore.simulation.reference:"
_HORIZONTAL_ESTIMATORS = "fedcore.horizontal.estimators:"
_HORIZONTAL: dict[str, Any] = dict(
    simulate=_SIMULATE_HORIZONTAL, reference=_REFERENCE + "reference_extra_trees",
    params="fedcore.horizontal.params:ExtraTreesParams",
    parse_params="fedcore.horizontal.params:ExtraTreesParams.from_config",
    check_params="fedcore.horizontal.plan:check_params",
    session="fedcore.horizontal.deploy:open_session",
    agent="fedcore.horizontal.deploy:institution_agent")

FOREST = Algorithm("forest", "vertical", "Federated Forest", ("none", *ENCRYPTED_MODES),
                   ("federated-forest",), params="fedcore.trees.params:ForestParams",
                   parse_params="fedcore.trees.params:ForestParams.from_vertical_config",
                   simulate=_SIMULATE_VERTICAL, reference=_REFERENCE + "reference_forest",
                   estimators=("fedcore.vertical.estimators:FederatedForestClassifier",
                               "fedcore.vertical.estimators:FederatedForestRegressor"),
                   session=_VERTICAL_SESSION, agent=_VERTICAL_AGENT)
EXTRA_TREES = Algorithm("extra-trees", "horizontal", "Federated Extra-Trees", ("none", "ldp", "gdp"),
                        ("fet",), estimators=(_HORIZONTAL_ESTIMATORS + "FederatedExtraTreesClassifier",
                                              _HORIZONTAL_ESTIMATORS + "FederatedExtraTreesRegressor"),
                        **_HORIZONTAL)
PPD_ERT = Algorithm("ppd-ert", "horizontal", "PPD-ERT", ("secagg", "secagg-dp"), ("ppdert",),
                    estimators=(_HORIZONTAL_ESTIMATORS + "PPDERTClassifier", ""), **_HORIZONTAL)
BOOSTING = Algorithm("boosting", "vertical", "Federated gradient boosting", ("none", *ENCRYPTED_MODES),
                     params="fedcore.trees.boosting:BoostingParams",
                     parse_params="fedcore.trees.boosting:BoostingParams.from_vertical_config",
                     simulate=_SIMULATE_VERTICAL, reference=_REFERENCE + "reference_boosting",
                     estimators=("fedcore.vertical.boosting_estimators:FederatedBoostingClassifier",
                                 "fedcore.vertical.boosting_estimators:FederatedBoostingRegressor"),
                     session=_VERTICAL_SESSION, agent=_VERTICAL_AGENT)
HORIZONTAL_BOOSTING = Algorithm("boosting", "horizontal", "Federated gradient boosting", ("secagg", "none"),
                                params="fedcore.trees.boosting:BoostingParams",
                                parse_params="fedcore.horizontal.boosting.params:from_config",
                                check_params="fedcore.horizontal.boosting.params:check_params",
                                fieldless_modes=("secagg",),
                                simulate=_SIMULATE_HORIZONTAL, reference=_REFERENCE + "reference_boosting",
                                estimators=("fedcore.horizontal.boosting:HorizontalBoostingClassifier",
                                            "fedcore.horizontal.boosting:HorizontalBoostingRegressor"),
                                session="fedcore.horizontal.deploy:open_boosting_session",
                                agent="fedcore.horizontal.deploy:boosting_agent")

REGISTERED: tuple[Algorithm, ...] = (FOREST, EXTRA_TREES, PPD_ERT, BOOSTING, HORIZONTAL_BOOSTING)
"""Every algorithm of every setting; one id may live in two settings (boosting), told apart by setting."""
ALGORITHMS: dict[str, Algorithm] = {a.id: a for a in REGISTERED if a is next(b for b in REGISTERED
                                                                            if b.id == a.id)}
"""By id, each id's first registration (an id in two settings: its vertical one; `algorithm(name, setting)`
finds the setting's own). Manifests, model tables and titles read the id."""
_BY_OLD_ID = {old: a for a in REGISTERED for old in a.old_ids}


def check_setting(setting: str) -> str:
    """`setting`, refused unless it is one fedforest has."""
    if setting not in SETTINGS:
        raise ParameterError(f"unknown setting {setting!r}: choose one of {list(SETTINGS)}")
    return setting


def in_setting(setting: str) -> tuple[Algorithm, ...]:
    """The algorithms of `setting`, its default first."""
    return tuple(a for a in REGISTERED if a.setting == check_setting(setting))


def algorithm(name: str, setting: str | None = None) -> Algorithm:
    """The algorithm a config or command names by its canonical id, refused if `setting` does not offer it."""
    offered = ALGORITHMS if setting is None else {a.id: a for a in in_setting(setting)}
    if name not in offered:
        where = "fedforest" if setting is None else f"the {setting} setting"
        raise ParameterError(f"{where} offers algorithms {list(offered)}, got {name!r}")
    return offered[name]


def read_algorithm(name: str, setting: str | None = None) -> Algorithm:
    """The algorithm a stored manifest or model table names, by its canonical id or an earlier spelling.

    With `setting` (a manifest's), the setting's own entry of an id two settings share (boosting).
    """
    found = ALGORITHMS.get(name) or _BY_OLD_ID.get(name)
    if found is None:
        raise ParameterError(f"unknown algorithm {name!r}: fedforest has {list(ALGORITHMS)}")
    return found if setting is None or found.setting == setting else algorithm(found.id, setting)
