"""The retrain flow end to end on the demo scenario.

Agents over Flight with mutual TLS, under a Prefect test server. Checks artifacts, registries, where
predictions land, that no raw value reaches Prefect, and that bad input stops the run before any version is
registered.

The first run is the session's trained federation (local agents, started and stopped by the flow), in a
copy of its own. The runs that must fail use agents that stay up between them (`agents="running"`, as an
institution that runs its agent permanently): each session reloads and revalidates the institution's
files, and no case pays for starting three agents and importing Great Expectations in each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from prefect.client.orchestration import get_client

from fedcore.errors import CertificateRefused, ContractViolation, PartyUnavailable
from fedcore.models.registry import ModelRegistry
from fedcore.transport.tls import init_ca, issue_certificate
from fedcore.vertical.alignment import AlignmentError
from flows.demos.workspace import free_port
from flows.retrain import retrain
from tasks.agents import stop_local_agents
from tests.federations import copy_of
from tests.flows.crashes import start_agents
from tests.prefect_reads import all_artifacts, all_flow_runs, all_logs

pytestmark = pytest.mark.slow
MODEL = "retail-response"


def _registry(work, name: str = "master") -> ModelRegistry:
    """A registry of the demo federation in `work`, trusting the master's public key as institutions do."""
    return ModelRegistry(work / "registry" / name, public_key=work / "keys" / "master.key.pub")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, trained_federation):
    copy = copy_of(trained_federation, tmp_path_factory.mktemp("federation") / "work")
    return copy.work, copy.config_path, copy.scenario


@pytest.fixture(scope="module")
def first_run(trained_federation):
    return trained_federation.result


@pytest.fixture(scope="module")
def running_agents(workspace):
    """The workspace's agents, kept running for the module on ports of their own.

    Their config is `running.yaml` (the workspace's own ports stay free for the unreachable-agents case);
    returns its path.
    """
    work, config_path, _ = workspace
    raw = yaml.safe_load(config_path.read_text())
    for institution in raw["institutions"]:
        institution["endpoint"] = f"grpc+tls://127.0.0.1:{free_port()}"
    running = config_path.with_name("running.yaml")
    running.write_text(yaml.safe_dump(raw))
    processes = start_agents(running, work / "logs")
    try:
        yield running
    finally:
        stop_local_agents(processes)


def _artifacts() -> list:
    with get_client(sync_client=True) as client:
        return all_artifacts(client)


def test_retrain_registers_promotes_and_predicts(workspace, first_run) -> None:
    work, _, scenario = workspace
    assert first_run["version"] == "v0001" and first_run["promoted"]
    assert first_run["preparation"]["overlap"] == scenario["overlap"]["train"]
    assert 0.5 < first_run["metrics"]["accuracy"] <= 1
    master = _registry(work)
    manifest, tables = master.load(MODEL, "production")
    assert manifest["signature"]["algorithm"] == "ed25519" and set(tables) == {"master"}
    assert [p["feature_count"] for p in manifest["parties"]] == [8, 6, 5]
    kept = {}
    for name in ("bank", "ecommerce", "insurer"):
        local, _ = _registry(work, name).load(MODEL, "v0001")
        assert local["master_manifest"]["version"] == "v0001"
        kept[name] = local["importances"]  # its own features' importances, in its own registry only
    assert [len(own) for own in kept.values()] == [8, 6, 5]
    assert {p["name"]: p["importance_share"] for p in manifest["parties"]} == {
        name: pytest.approx(sum(own.values()), abs=1e-12) for name, own in kept.items()}
    assert "importances" not in manifest  # the master's: shares only, no feature
    parties = json.dumps(manifest["parties"])
    assert not any(f'"{feature}"' in parties for own in kept.values() for feature in own)
    files = sorted((work / "predictions").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["bank"]
    assert len(pd.read_parquet(files[0])) == scenario["overlap"]["new"]
    # the summary says where the bank wrote them (in the trained federation this workspace copies)
    (written,) = first_run["prediction"]["paths"].items()
    assert written[0] == "bank" and Path(written[1]).name == files[0].name


def test_artifacts_exist_and_hold_no_raw_data(workspace, first_run) -> None:
    work, _, scenario = workspace
    artifacts = _artifacts()
    keys = {a.key for a in artifacts}
    assert {"validation-bank", "validation-ecommerce", "validation-insurer", "id-overlap",
            "training-progress", "model-version", "model-card", "batch-prediction",
            "importance-shares", "model-pictures"} <= keys
    bank = pd.read_parquet(scenario["institutions"]["bank"]["train"])
    needles = (list(bank[scenario["id_column"]].iloc[::40])
               + [f"{v:.2f}" for v in bank["income"].dropna().iloc[::40]])
    with get_client(sync_client=True) as client:
        logs = " ".join(log.message for log in all_logs(client))
    text = " ".join(str(a.data) for a in artifacts) + " " + logs
    assert [n for n in needles if n in text] == []


def test_the_run_is_named_after_the_version_and_says_how_good(first_run) -> None:
    """The run list answers "which version, how good": name and final message (deployments/README.md)."""
    headline = f"log_loss {first_run['metrics']['log_loss']:.4f}"  # the demo config's promotion metric
    with get_client(sync_client=True) as client:
        runs = [r for r in all_flow_runs(client) if r.name == f"retrain {MODEL} v0001"]
    said = [r.state.message for r in runs]
    assert f"{MODEL} v0001: {headline} on held-out rows; promoted to production" in said


def test_model_version_artifact_says_where_it_is_and_how_to_load_it(trained_federation, first_run) -> None:
    """A markdown artifact (not a file:// link).

    The registry folder, every digest, and a Python snippet that, run as shown, loads and verifies the
    version.
    """
    folder = trained_federation.work / "registry" / "master" / MODEL / "v0001"
    cards = [a for a in _artifacts() if a.key == "model-version" and f"`{folder}`" in str(a.data)]
    assert len(cards) == 1 and cards[0].type == "markdown"
    text = cards[0].data
    manifest = _registry(trained_federation.work).read_manifest(MODEL, "v0001")
    digests = [f["sha256"] for f in manifest["files"]] + [p["table_sha256"] for p in manifest["parties"]]
    assert len(digests) == 4 and all(f"`{digest}`" in text for digest in digests)
    assert f"--model {MODEL} --version v0001" in text and manifest["signature"]["key_id"] in text
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(snippet, namespace)  # noqa: S102 - the artifact's own instructions, run as a user would
    assert namespace["manifest"]["version"] == "v0001" and set(namespace["tables"]) == {"master"}


def test_agents_log_the_version_they_stored_and_the_predictions_they_wrote(trained_federation,
                                                                           first_run) -> None:
    logs = {name: (trained_federation.work / "logs" / f"agent-{name}.log").read_text()
            for name in ("bank", "ecommerce", "insurer")}
    for name, text in logs.items():
        assert f"agent {name}: stored {MODEL} v0001 (signed by the master; table sha256 " in text
        assert str(trained_federation.work / "registry" / name / MODEL / "v0001") in text
    rows = first_run["prediction"]["rows"]
    assert f"agent bank: wrote {rows} predictions to " in logs["bank"]
    assert [name for name, text in logs.items() if "predictions to" in text] == ["bank"]


def _negative_age(frame: pd.DataFrame) -> str:
    frame.loc[frame.index[:3], "age"] = -4
    return "-4"


def _drop_basket(frame: pd.DataFrame) -> str:
    del frame["avg_basket"]
    return "avg_basket_values_never_shown"


def _duplicate_id(frame: pd.DataFrame) -> str:
    frame.loc[frame.index[1], "customer_id"] = frame.loc[frame.index[0], "customer_id"]
    return str(frame.loc[frame.index[0], "customer_id"])


def _unknown_vehicle(frame: pd.DataFrame) -> str:
    frame["vehicle_type"] = frame["vehicle_type"].astype(object)
    frame.loc[frame.index[:2], "vehicle_type"] = "hovercraft"
    return "hovercraft"


def _age_as_text(frame: pd.DataFrame) -> str:
    frame["age"] = frame["age"].map(lambda v: f"{v} years")
    return f"{frame['age'].iloc[0]}"


def _null_ids(frame: pd.DataFrame) -> str:
    raw = str(frame.loc[frame.index[5], "customer_id"])
    frame["customer_id"] = frame["customer_id"].astype(object)
    frame.loc[frame.index[5:9], "customer_id"] = None
    return raw


@pytest.mark.parametrize(("institution", "damage", "expected"), [
    ("bank", _negative_age,
     r"institution 'bank', column 'age': expect_column_values_to_be_between\(.*\) failed: 3 unexpected"),
    ("ecommerce", _drop_basket, r"institution 'ecommerce', column 'avg_basket': expect_column_to_exist"),
    ("insurer", _duplicate_id,
     r"institution 'insurer', column 'customer_id': expect_column_values_to_be_unique"),
    ("insurer", _unknown_vehicle,
     r"institution 'insurer', column 'vehicle_type': expect_column_values_to_be_in_set"),
    ("bank", _age_as_text, r"institution 'bank', column 'age': expect_column_values_to_be_in_type_list"),
    ("ecommerce", _null_ids,
     r"institution 'ecommerce', column 'customer_id': expect_column_values_to_not_be_null failed: 4 null "
     r"values"),
])
def test_contract_violation_stops_before_training(workspace, first_run, running_agents, institution, damage,
                                                  expected) -> None:
    work, _, scenario = workspace
    path = scenario["institutions"][institution]["train"]
    original = pd.read_parquet(path)
    broken = original.copy()
    raw_value = damage(broken)
    broken.to_parquet(path)
    try:
        with pytest.raises(ContractViolation, match=expected) as caught:
            retrain(str(running_agents), agents="running")
    finally:
        original.to_parquet(path)
    assert raw_value not in str(caught.value)
    assert _registry(work).versions(MODEL) == ["v0001"]
    failures = [a for a in _artifacts() if a.key == "failure"]
    assert failures and all(raw_value not in str(a.data) for a in failures)


def test_unreachable_agents_fail_with_their_names(workspace) -> None:
    _, config_path, _ = workspace
    raw = yaml.safe_load(config_path.read_text())
    raw["training"]["connect_timeout_s"] = 2
    other = config_path.with_name("unreachable.yaml")
    other.write_text(yaml.safe_dump(raw))
    with pytest.raises(PartyUnavailable, match=r"agents not ready after 2 s: cannot reach party 'bank'"):
        retrain(str(other), agents="running")


def _assert_failed_cleanly(work, raw_values: list[str]) -> None:
    """No new version; the failure artifact exists and quotes no raw value."""
    assert _registry(work).versions(MODEL) == ["v0001"]
    failures = [a for a in _artifacts() if a.key == "failure"]
    assert failures and not [v for v in raw_values if v in str(failures[-1].data)]


def test_empty_overlap_stops_before_training(workspace, first_run, running_agents) -> None:
    work, _, scenario = workspace
    path = scenario["institutions"]["insurer"]["train"]
    original = pd.read_parquet(path)
    strangers = original.copy()
    strangers["customer_id"] = [f"X{i:07d}" for i in range(len(strangers))]
    strangers.to_parquet(path)
    try:
        # the pairwise overlaps name the institution whose IDs (or consortium key) differ
        with pytest.raises(AlignmentError, match=r"ID overlap is empty \(bank \d+ rows, ecommerce \d+ rows, "
                           r"insurer \d+ rows\); institution 'insurer' shares no ID hash with any other "
                           r"institution \(bank-ecommerce share \d+\): its consortium key or id_column "
                           r"differs$"):
            retrain(str(running_agents), agents="running")
    finally:
        original.to_parquet(path)
    _assert_failed_cleanly(work, list(strangers["customer_id"].iloc[:20]))


def test_master_certificate_from_another_ca_is_refused(workspace, first_run, running_agents,
                                                       tmp_path) -> None:
    work, _, _ = workspace
    init_ca(tmp_path / "rogue", name="not the consortium CA")
    issue_certificate(tmp_path / "rogue", "master", tmp_path / "rogue", role="master")
    raw = yaml.safe_load(running_agents.read_text())
    raw["tls"].update(master_cert=str(tmp_path / "rogue" / "master.pem"),
                      master_key=str(tmp_path / "rogue" / "master.key"))
    raw["tls"].pop("master_ca")  # a rogue master's own config: its master would otherwise refuse itself
    raw["training"]["connect_timeout_s"] = 20
    other = running_agents.with_name("rogue-master.yaml")
    other.write_text(yaml.safe_dump(raw))
    with pytest.raises(CertificateRefused, match=r"agents not ready after 20 s: cannot reach party 'bank' at "
                                                 r"grpc\+tls://127\.0\.0\.1:\d+: the agent closed the "
                                                 r"connection after the handshake: it refused this master's "
                                                 r"certificate"):
        retrain(str(other), agents="running")
    _assert_failed_cleanly(work, [])
    with get_client(sync_client=True) as client:
        connects = [r for r in client.read_task_runs() if r.name.startswith("connect_agents")]
    assert connects[-1].run_count == 1, "a refused certificate is not retried"
