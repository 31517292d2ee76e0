"""`fedforest agent serve` in a subprocess: the master trains against it over Flight; SIGTERM stops it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedcore.agents.data import institution_from_config
from fedcore.cli import main
from fedcore.commands.agent import build_agent
from fedcore.config import load_config
from fedcore.data.split import split_vertical
from fedcore.protocol.messages import Message
from fedcore.transport.flight import FlightTransport
from fedcore.transport.inprocess import InProcessTransport
from fedcore.transport.tls import init_ca, issue_certificate
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession
from flows.demos.workspace import free_port
from tests.conftest import mixed_table

NAMES = ("bank", "insurer", "retailer")


@pytest.fixture
def federation(tmp_path: Path) -> Path:
    """Three institutions' parquet/csv files with a shared id column, certificates and a config."""
    table = mixed_table(n_rows=400, seed=6)
    ids = np.arange(1000, 1400)
    institutions = []
    for name, frame in zip(NAMES, split_vertical(table, 3, label="target", seed=2), strict=True):
        folder = tmp_path / "data" / name
        folder.mkdir(parents=True)
        frame.insert(0, "customer_id", ids)
        if name == "retailer":
            frame.to_csv(folder / "part-0.csv", index=False)
        else:  # two files, read in name order
            frame.iloc[:250].to_parquet(folder / "part-0.parquet")
            frame.iloc[250:].to_parquet(folder / "part-1.parquet")
        suffix = "csv" if name == "retailer" else "parquet"
        institutions.append({
            "name": name, "data": f"data/{name}/*.{suffix}", "id_column": "customer_id",
            "endpoint": f"grpc+tls://127.0.0.1:{free_port()}", "cert": f"certs/{name}.pem",
            "key": f"certs/{name}.key", **({"label": "target"} if "target" in frame.columns else {}),
        })
    certs = tmp_path / "certs"
    init_ca(certs)
    issue_certificate(certs, "master", certs, role="master")
    for name in NAMES:
        issue_certificate(certs, name, certs)
    (tmp_path / "consortium.key").write_text("a test consortium key\n")
    config = {
        "federation": "test", "consortium_key": {"file": "consortium.key"},
        "tls": {"ca": "certs/ca.pem", "master_cert": "certs/master.pem", "master_key": "certs/master.key"},
        "institutions": institutions, "params": {"n_estimators": 4, "max_depth": 5, "random_state": 3},
    }
    path = tmp_path / "federation.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _train(transport, params) -> VerticalSession:
    session = VerticalSession(transport, params, holdout_fraction=0.2, min_overlap=50)
    transport.exchange({name: Message("validation_report") for name in transport.parties})
    session.align()
    session.train()
    return session


def test_agent_serves_until_sigterm(federation: Path) -> None:
    config = load_config(federation)
    holder = config.label_holder.name
    env = {**os.environ,
           "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", str(federation.parent / "numba"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "fedcore.cli", "agent", "serve", "--config", str(federation),
         "--institution", holder],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    servers = [build_agent(config, name) for name in NAMES if name != holder]
    try:
        with FlightTransport.from_config(config) as transport:
            transport.wait_ready(timeout_s=60)
            remote = _train(transport, config.params).master.structure
        key = config.read_consortium_key()
        agents = {n: VerticalInstitutionAgent(institution_from_config(config, n), key) for n in NAMES}
        transport = InProcessTransport({n: a.handle for n, a in agents.items()})
        local = _train(transport, config.params).master.structure
        for f in fields(local):
            np.testing.assert_array_equal(getattr(remote, f.name), getattr(local, f.name), err_msg=f.name)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        for server in servers:
            server.shutdown()
    assert process.returncode == 0, err
    assert f"agent {holder!r} (label holder) serving on grpc+tls://127.0.0.1:" in out
    assert f"agent {holder!r} stopped" in out


def test_agent_config_errors_are_one_line(federation: Path, capsys) -> None:
    raw = yaml.safe_load(federation.read_text())
    raw["institutions"][1].pop("cert")
    federation.write_text(yaml.safe_dump(raw))
    name = raw["institutions"][1]["name"]
    assert main(["agent", "serve", "--config", str(federation), "--institution", name]) == 1
    assert f"institution {name!r} needs 'cert' to run an agent" in capsys.readouterr().err
    assert main(["agent", "serve", "--config", str(federation), "--institution", "nobody"]) == 1
    assert "no institution named 'nobody'" in capsys.readouterr().err


def test_a_contract_violation_is_logged_without_any_raw_value(federation: Path, caplog) -> None:
    from fedcore.contracts.model import dump_contract, infer_contract

    raw = yaml.safe_load(federation.read_text())
    bank = next(i for i in raw["institutions"] if i["name"] == "bank")
    files = sorted((federation.parent / "data" / "bank").glob("*.parquet"))
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    contract = infer_contract(frame, "bank", id_column="customer_id", label="target")
    (federation.parent / "bank.yaml").write_text(dump_contract(contract))
    column = next(c for c in frame.columns if c.startswith("num"))
    broken = pd.read_parquet(files[0])
    broken.loc[3, column] = 98765.4321  # far outside the contract's range
    broken.to_parquet(files[0])
    bank["contract"] = "bank.yaml"
    federation.write_text(yaml.safe_dump(raw))
    with caplog.at_level(logging.WARNING, logger="fedcore.agents"):
        data = institution_from_config(load_config(federation), "bank")
    assert not data.valid
    lines = [r.getMessage() for r in caplog.records if r.name == "fedcore.agents.data"]
    assert lines and all("data contract violation: institution 'bank'" in line for line in lines)
    assert any(repr(column) in line for line in lines)
    assert "98765" not in caplog.text
