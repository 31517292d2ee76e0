"""A small demo federation for flow and deployment tests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


def small_federation(work, n_customers: int, seed: int, params: dict):
    """The demo federation in `work`: returns (config path, scenario).

    Fewer customers and a small forest, so flows run fast.
    """
    import yaml

    from flows.demos.vertical import prepare_workspace

    config_path, scenario = prepare_workspace(work, n_customers=n_customers, seed=seed)
    raw = yaml.safe_load(config_path.read_text())
    raw["params"] = {**params, "random_state": 0}
    raw["training"]["connect_timeout_s"] = 90
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, scenario


@dataclass(frozen=True)
class Federation:
    """A demo federation's folder, its config and scenario and, once trained, the run's result."""

    work: Path
    config_path: Path
    scenario: dict
    result: dict | None = None


def copy_of(federation: Federation, destination: Path) -> Federation:
    """A copy of `federation` in `destination`, its agents on other ports.

    Data, keys, certificates, registries and predictions are copied, and its scenario's paths point into the
    copy.
    """
    from tests.flows.crashes import copy_federation

    config_path = copy_federation(federation.work, destination)
    old, new = str(federation.work), str(destination)

    def moved(value):
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        inside = isinstance(value, str) and (value == old or value.startswith(old + "/"))
        return new + value[len(old):] if inside else value

    return replace(federation, work=destination, config_path=config_path, scenario=moved(federation.scenario))
