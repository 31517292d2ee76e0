"""A small demo federation for flow and deployment tests."""

from __future__ import annotations


def small_federation(work, n_customers: int, seed: int, params: dict):
    """The demo federation in `work`, with fewer customers and a small forest so flows run fast:
    returns (config path, scenario)."""
    import yaml

    from flows.demo import prepare_workspace

    config_path, scenario = prepare_workspace(work, n_customers=n_customers, seed=seed)
    raw = yaml.safe_load(config_path.read_text())
    raw["params"] = {**params, "random_state": 0}
    raw["training"]["connect_timeout_s"] = 90
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, scenario
