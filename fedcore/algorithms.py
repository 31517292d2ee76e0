"""The algorithms fedforest offers: one entry each, with its canonical id, setting, title and privacy modes.

The config, the CLI, the simulator, the parameter checks, manifests and model tables all read this table.
Earlier versions wrote other spellings (`federated-forest`, `fet`, `ppdert`); `read_algorithm` still
accepts them in stored manifests and model tables, but nothing writes them and no input accepts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedcore.errors import ParameterError
from fedcore.privacy.schemes import ENCRYPTED_MODES

SETTINGS = ("vertical", "horizontal")


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
    deployable: bool = True
    """Whether configs (agents, flows, the registry) run it; False: simulation and estimators only, so far."""

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


FOREST = Algorithm("forest", "vertical", "Federated Forest", ("none", *ENCRYPTED_MODES),
                   ("federated-forest",))
EXTRA_TREES = Algorithm("extra-trees", "horizontal", "Federated Extra-Trees", ("none", "ldp", "gdp"),
                        ("fet",))
PPD_ERT = Algorithm("ppd-ert", "horizontal", "PPD-ERT", ("secagg", "secagg-dp"), ("ppdert",))
BOOSTING = Algorithm("boosting", "vertical", "Federated gradient boosting", ("none", *ENCRYPTED_MODES))
HORIZONTAL_BOOSTING = Algorithm("boosting", "horizontal", "Federated gradient boosting", ("secagg",),
                                deployable=False)

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


def read_algorithm(name: str) -> Algorithm:
    """The algorithm a stored manifest or model table names, by its canonical id or an earlier spelling."""
    found = ALGORITHMS.get(name) or _BY_OLD_ID.get(name)
    if found is None:
        raise ParameterError(f"unknown algorithm {name!r}: fedforest has {list(ALGORITHMS)}")
    return found
