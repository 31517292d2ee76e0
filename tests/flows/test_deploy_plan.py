"""What `fedforest deploy` makes of a federation config, without a Prefect server (`flows.deployments`).

The deployments against a real server: tests/e2e/test_deployments.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedcore.cli import main
from fedcore.config import load_config
from fedcore.errors import ConfigError
from flows.deployments import (
    Existing,
    Planned,
    compare,
    deploy_settings,
    planned_deployments,
    work_pools,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deployments" / "federation.example.yaml"


def _config(tmp_path: Path, names=("lender", "telco", "grocer"), deployments: dict | None = None,
            pools: dict | None = None) -> Path:
    """The example config with institutions of other names (the first holds the label)."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    template = raw["institutions"][1]
    raw["institutions"] = [dict(raw["institutions"][0], name=names[0], work_pool=(pools or {}).get(names[0],
                                                                                                 names[0]))]
    raw["institutions"] += [dict(template, name=name, work_pool=(pools or {}).get(name, name))
                            for name in names[1:]]
    if deployments is not None:
        raw["deployments"] = deployments
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_one_agent_deployment_per_institution_then_the_scheduled_retrain_and_batch_predict(tmp_path) -> None:
    path = _config(tmp_path)
    config = load_config(path)
    plan = planned_deployments(config, deploy_settings(config))
    assert [(p.full_name, p.pool) for p in plan] == [
        ("institution-agent/lender", "lender"), ("institution-agent/telco", "telco"),
        ("institution-agent/grocer", "grocer"), ("retrain/weekly", "master"),
        ("batch-predict/on-demand", "master")]
    assert [p.parameters for p in plan[:3]] == [{"config_path": str(path), "institution": name}
                                                for name in ("lender", "telco", "grocer")]
    assert plan[3].parameters == plan[4].parameters == {"config_path": str(path), "agents": "deployments"}
    assert {p.tags for p in plan} == {("federation:retail-consortium",)}
    assert (plan[3].schedule.cron, plan[3].schedule.timezone) == ("0 3 * * 1", "UTC")
    assert plan[4].schedule is None
    # the master flows keep the summary they return beside the config; the agents keep nothing
    results = {"PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / ".prefect-results")}
    assert [p.env for p in plan] == [{}, {}, {}, results, results]


def test_the_config_section_sets_schedule_results_and_the_path_workers_read(tmp_path) -> None:
    config = load_config(_config(tmp_path, deployments={
        "schedule": {"cron": "30 2 * * *", "timezone": "Europe/Zurich"},
        "results": "runs/results", "config_path": "/srv/federation/federation.yaml"}))
    settings = deploy_settings(config)
    assert settings.config_path == "/srv/federation/federation.yaml"
    assert settings.schedule.describe() == "30 2 * * * (Europe/Zurich)"
    assert settings.results.env() == {"PREFECT_LOCAL_STORAGE_PATH": "/srv/federation/runs/results"}
    # the command's options win over the section
    settings = deploy_settings(config, cron="0 4 * * 6", results_block="s3-bucket/fedforest-results",
                               worker_config="/opt/f.yaml")
    assert settings.schedule.describe() == "0 4 * * 6 (Europe/Zurich)"
    assert settings.config_path == "/opt/f.yaml"
    assert settings.results.env() == {"PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": "s3-bucket/fedforest-results"}
    assert deploy_settings(config, no_schedule=True).schedule is None
    block = load_config(_config(tmp_path, deployments={"results": {"block": "gcs-bucket/results"}}))
    assert deploy_settings(block).results.describe() == "results in block gcs-bucket/results"
    unscheduled = load_config(_config(tmp_path, deployments={"schedule": None}))
    assert deploy_settings(unscheduled).schedule is None


@pytest.mark.parametrize(("section", "message"), [
    ({"schedul": None}, "deployments: unknown setting 'schedul'; did you mean 'schedule'?"),
    ({"schedule": {"cron": "every monday"}},
     'deployments.schedule: every monday (UTC) is not a cron schedule Prefect takes: Invalid cron string: '
     '"every monday" (a cron line'),
    ({"schedule": {"timezone": "Mars/Olympus"}},
     'deployments.schedule: 0 3 * * 1 (Mars/Olympus) is not a cron schedule Prefect takes: Invalid timezone: '
     '"Mars/Olympus"'),
    ({"results": {"bucket": "x"}},
     "deployments.results must be a folder or {block: <block type>/<block name>}"),
    ({"config_path": "federation.yaml"}, "deployments.config_path must be an absolute path"),
])
def test_a_bad_deployments_section_is_refused_by_name(tmp_path, section, message) -> None:
    config = load_config(_config(tmp_path, deployments=section))
    with pytest.raises(ConfigError) as refused:
        deploy_settings(config)
    assert message in str(refused.value)


def test_pools_are_each_named_once_the_masters_first(tmp_path) -> None:
    config = load_config(_config(tmp_path, pools={"telco": "shared", "grocer": "shared"}))
    assert work_pools(config) == ["master", "lender", "shared"]


def _planned(*full_names: str, pool: str = "p") -> list[Planned]:
    return [Planned(*name.split("/"), pool, {}, "", ("federation:f",)) for name in full_names]


def test_deploying_again_removes_what_the_config_dropped_and_names_what_it_leaves() -> None:
    plan = _planned("institution-agent/lender", "retrain/weekly")
    existing = [
        Existing("institution-agent/lender", ("federation:f",), "lender"),
        Existing("institution-agent/departed", ("federation:f",), "departed"),  # left the federation
        Existing("institution-agent/moved", ("federation:f",), "p"),  # its pool is still used
        Existing("institution-agent/bank", (), "bank"),  # made otherwise (the old prefect.yaml)
        Existing("retrain/nightly", (), "master"),  # someone's own: not an agent, not ours
        Existing("institution-agent/other", ("federation:g",), "other"),  # another federation's
    ]
    changes = compare(existing, plan, "f")
    assert changes.remove == ["institution-agent/departed", "institution-agent/moved"]
    assert changes.stray == ["institution-agent/bank"]
    assert changes.foreign == []
    assert changes.unused_pools == ["departed"]


def test_a_deployment_of_another_federation_is_never_overwritten() -> None:
    theirs = [Existing("retrain/weekly", ("federation:g",), "master")]
    changes = compare(theirs, _planned("retrain/weekly"), "f")
    assert changes.foreign == ["retrain/weekly"] and changes.remove == []


def test_deploy_without_a_prefect_server_is_one_line(tmp_path, capsys) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert main(["deploy", "--config", str(_config(tmp_path))]) == 1
    assert capsys.readouterr().err.startswith("fedforest: error: fedforest deploy needs PREFECT_API_URL: the "
                                              "Prefect server the workers poll")
