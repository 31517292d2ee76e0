"""A hostile master against real agents over Flight and mutual TLS (issue #27, points 1, 2 and 4).

The master holds the consortium's master certificate, so the transport lets it in; what stops it is the
agent. It may not name an agent's files, read held-out labels through repeated or partial evaluations,
widen or shrink the alignment the institutions agreed to, or make an agent log tracebacks and echo data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.data.scenario import make_vertical_scenario
from fedcore.errors import ProtocolError
from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.protocol.messages import Message, pack_bits
from fedcore.transport.flight import AgentServer, FlightTransport
from fedcore.transport.inprocess import InProcessTransport
from fedcore.transport.tls import init_ca, issue_certificate
from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession
from tests.vertical.test_session import _agents

KEY = b"consortium-key-for-hostile-tests-0123"
PARAMS = ForestParams(n_estimators=3, max_depth=4, random_state=1)
HOLDOUT, MIN_OVERLAP = 0.2, 100


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=400, seed=3)


@pytest.fixture(scope="module")
def pki(tmp_path_factory, scenario) -> Path:
    ca = tmp_path_factory.mktemp("pki")
    init_ca(ca)
    issue_certificate(ca, "master", ca, role="master")
    for name in scenario["institutions"]:
        issue_certificate(ca, name, ca, role="institution")
    return ca


def _vertical_agents(scenario: dict, root: Path) -> dict[str, VerticalInstitutionAgent]:
    """The scenario's agents, each with its own training.holdout and min_overlap, as a config gives them."""
    return _agents(scenario, root, holdout=HOLDOUT, min_overlap=MIN_OVERLAP)


@contextmanager
def _served(agents: dict, pki: Path) -> Iterator[dict[str, str]]:
    """Each agent behind its own AgentServer on loopback; yields {name: endpoint}."""
    servers = {name: AgentServer(agent, tls_cert=pki / f"{name}.pem", tls_key=pki / f"{name}.key",
                                 ca_cert=pki / "ca.pem") for name, agent in agents.items()}
    try:
        yield {name: f"grpc+tls://127.0.0.1:{server.port}" for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.shutdown()


@contextmanager
def _master(endpoints: dict[str, str], pki: Path) -> Iterator[FlightTransport]:
    """The master's transport: a new session, started with validation_report and closed at the end."""
    with FlightTransport(endpoints, tls_cert=pki / "master.pem", tls_key=pki / "master.key",
                         ca_cert=pki / "ca.pem", timeout_s=60) as transport:
        transport.exchange({name: Message("validation_report") for name in endpoints})
        try:
            yield transport
        finally:
            transport.exchange({name: Message("close") for name in endpoints})


def _refused(transport: FlightTransport, party: str, message: Message, reason: str) -> str:
    """Send `message` to `party`, expect a refusal whose text contains `reason`; return the text."""
    with pytest.raises(ProtocolError) as refusal:
        transport.exchange({party: message})
    assert reason in str(refusal.value), str(refusal.value)
    return str(refusal.value)


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# -- point 1: an agent names its own files -------------------------------------------------------------------
def test_a_master_cannot_name_the_file_an_agent_writes(scenario, pki, tmp_path) -> None:
    agents = _vertical_agents(scenario, tmp_path)
    holder = scenario["label_holder"]
    train_file = Path(scenario["institutions"][holder]["train"])
    before, train_bytes = _files(tmp_path), train_file.read_bytes()
    with _served(agents, pki) as endpoints, _master(endpoints, pki) as transport:
        session = VerticalSession(transport, PARAMS, holdout_fraction=HOLDOUT, min_overlap=MIN_OVERLAP)
        session.align()
        session.train()
        for stem in ("../../data/bank/train", str(tmp_path / "outside")):
            _refused(transport, holder, Message("deliver_predictions", {"file_stem": stem},
                                                {"values": np.zeros((1, 2))}),
                     "refuses 'deliver_predictions' with header field(s) ['file_stem']: it takes ['run']")
        result = session.batch_predict(holder)
    assert train_file.read_bytes() == train_bytes
    written = _files(tmp_path) - before
    assert written == {Path(result["path"])}
    path = Path(result["path"])
    assert path.parent == tmp_path / "predictions" / holder
    assert path.name.startswith("unregistered-") and path.suffix == ".parquet"  # trained, never stored
    assert len(pd.read_parquet(path)) == result["rows"] == scenario["overlap"]["new"]


def test_a_horizontal_master_cannot_name_the_file_an_agent_writes(pki, tmp_path) -> None:
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(60)], "x": np.arange(60.0), "y": ["a", "b"] * 30})
    data = InstitutionData(name="bank", frame=frame, id_column="id", label="y", registry=tmp_path / "reg",
                           predictions_dir=tmp_path / "predictions",
                           load_batch=lambda: frame.drop(columns="y"))
    with _served({"bank": HorizontalInstitutionAgent(data)}, pki) as endpoints, \
            _master(endpoints, pki) as transport:
        _refused(transport, "bank", Message("predict_local", {"file_stem": "../../x"}),
                 "refuses 'predict_local' with header field(s) ['file_stem']: it takes ['run', 'until']")
        # the flow run's id is a value in a database sink's column, checked, never a name
        _refused(transport, "bank", Message("predict_local", {"run": "../../x"}),
                 "institution 'bank': run id '../../x' is not a flow run id (letters, digits, '.', '_', ':', "
                 "'-'; at most 128)")
        # the scheduled time ends a batch query: a value the agent binds, checked as a timestamp, never SQL
        _refused(transport, "bank", Message("predict_local", {"until": "'; DROP TABLE scores; --"}),
                 "institution 'bank': until \"'; DROP TABLE scores; --\" is not a timestamp with a time zone "
                 "(ISO 8601)")
    assert not (tmp_path / "predictions").exists()


# -- point 2: evaluation once, in order, over the whole held-out set; alignment within what was agreed ------
def test_evaluation_is_answered_once_per_session_over_the_whole_held_out_set(scenario, pki, tmp_path) -> None:
    agents = _vertical_agents(scenario, tmp_path)
    holder = scenario["label_holder"]
    with _served(agents, pki) as endpoints, _master(endpoints, pki) as transport:
        session = VerticalSession(transport, PARAMS, holdout_fraction=HOLDOUT, min_overlap=MIN_OVERLAP)
        session.align()
        n = session.facts.holdout_rows
        _refused(transport, holder, Message("evaluate", {}, {"values": np.zeros((n, 2))}),
                 "'evaluate' before the held-out rows were predicted")
        _refused(transport, holder, Message("load_holdout"),
                 "holds no model yet ('load_holdout' before finalize)")
        session.train()
        transport.exchange({name: Message("load_holdout") for name in endpoints})
        _refused(transport, holder, Message("load_holdout"),
                 "refuses a second 'load_holdout' in this session")
        values = session.master.predict_values(n)
        for bad, reason in ((values[:1], f"values must be floats of shape ({n}, 2), got float64 [1, 2]"),
                            (values[:, :1], f"values must be floats of shape ({n}, 2), got float64 [{n}, 1]"),
                            (np.full_like(values, np.nan), "values must be finite")):
            _refused(transport, holder, Message("evaluate", {}, {"values": bad}), reason)
        for threshold in (1.5, "high", True):  # a decision threshold is a probability (issue #33)
            _refused(transport, holder, Message("evaluate", {"decision_threshold": threshold},
                                                {"values": values}),
                     "header field 'decision_threshold' must be a finite number in [0, 1]")
        metrics = transport.exchange({holder: Message("evaluate", {}, {"values": values})})[holder]
        assert metrics.header["rows"] == n and 0 <= metrics.header["metrics"]["accuracy"] <= 1
        flipped = values.copy()
        flipped[0] = flipped[0, ::-1]  # the oracle's probe: one row changed, read the accuracy again
        _refused(transport, holder, Message("evaluate", {}, {"values": flipped}),
                 "refuses a second 'evaluate' in this session: it is answered once per session")
        # aligning again (to a held-out set of the master's choosing, on a fresh party) is refused too
        _refused(transport, holder, _align(np.arange(MIN_OVERLAP, dtype=np.int64), 20),
                 "refuses a second 'align' in this session")


def _align(positions: np.ndarray, held: int, announced: int | None = None) -> Message:
    holdout = np.zeros(len(positions), np.uint8)
    holdout[:held] = 1
    return Message("align", {"rows": len(positions) if announced is None else announced},
                   {"positions": positions, "holdout": pack_bits(holdout)})


def test_an_institution_refuses_an_alignment_it_did_not_agree_to(scenario, pki, tmp_path) -> None:
    agents = _vertical_agents(scenario, tmp_path)
    holder = scenario["label_holder"]
    rows = len(pd.read_parquet(scenario["institutions"][holder]["train"]))
    with _served(agents, pki) as endpoints, _master(endpoints, pki) as transport:
        transport.exchange({holder: Message("id_hashes")})
        every = np.arange(rows, dtype=np.int64)  # "widen the overlap to every row"
        held = int(round(HOLDOUT * rows))
        _refused(transport, holder, _align(every, held, announced=150),
                 f"'align' announces 150 rows but carries {rows} positions")
        _refused(transport, holder, _align(every[:99], 20),
                 f"'align' aligns 99 rows, fewer than this institution's min_overlap={MIN_OVERLAP}")
        _refused(transport, holder, _align(every, 1),
                 f"the master holds out 1 of {rows} rows; this institution's training.holdout=0.2 "
                 f"gives {held}")
        _refused(transport, holder, _align(np.concatenate([every[:-1], [rows]]), held),
                 f"alignment positions run from 0 to {rows}, outside this party's {rows} rows")
        _refused(transport, holder, _align(np.concatenate([every[:-1], [0]]), held),
                 "alignment positions repeat a row")
        reply = transport.exchange({holder: _align(every, held)})[holder]  # within what it can check
        assert reply.header == {"train_rows": rows - held, "holdout_rows": held}


def test_a_horizontal_institution_evaluates_once_and_only_what_it_trained(tmp_path) -> None:
    """In-process: a second evaluation, one of a loaded model, or another held-out share is refused."""
    from fedcore.contracts.model import infer_contract
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.transport.inprocess import InProcessTransport

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(300)], "x": rng.normal(size=300),
                          "y": rng.choice(["a", "b"], 300)})
    contract = infer_contract(frame, "t", id_column="id", label="y")
    agents = {name: HorizontalInstitutionAgent(InstitutionData(
        name=name, frame=part.reset_index(drop=True), id_column="id", label="y", registry=tmp_path / name,
        predictions_dir=tmp_path / "p" / name, contract=contract, holdout=0.25))
        for name, part in (("north", frame[:150]), ("south", frame[150:]))}
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    params = ExtraTreesParams(n_estimators=3, max_depth=3, random_state=1)
    other = HorizontalSession(transport, params, holdout_fraction=0.05)
    with pytest.raises(ProtocolError, match="institution 'north': the master holds out 0.05 of the rows; "
                                            "this institution's training.holdout is 0.25"):
        other.agree_schema()
    session = HorizontalSession(transport, params, holdout_fraction=0.25)
    with pytest.raises(ProtocolError, match=r"institution 'north' holds no model yet \(train or load_model"):
        transport.exchange({"north": Message("evaluate")})
    session.agree_schema()
    session.train()
    with pytest.raises(ProtocolError, match="header field 'decision_threshold' must be a finite number in "
                                            r"\[0, 1\]"):  # refused before it counts as the one evaluation
        transport.exchange({"north": Message("evaluate", {"decision_threshold": -0.1})})
    session.decision_threshold = 0.7
    assert set(session.evaluate()) >= {"accuracy"}
    confusion = np.array(session.evaluation["confusion"])
    assert session.evaluation["classes"] == ["a", "b"] and confusion.sum() == session.facts.holdout_rows
    with pytest.raises(ProtocolError,
                       match="institution 'north' refuses a second 'evaluate' in this session"):
        transport.exchange({"north": Message("evaluate")})
    # the schema is the one the institution's own contract gives, and setup is answered once per session
    with pytest.raises(ProtocolError, match="institution 'north' refuses a second 'setup' in this session"):
        transport.exchange({"north": Message("setup", {"schema": session.schema.to_dict()})})
    transport.exchange({"north": Message("validation_report")})  # a new session
    label_swapped = {**session.schema.to_dict(), "task": "regression", "classes": None}
    with pytest.raises(ProtocolError, match="institution 'north': the master's schema is not the one its "
                                            "data contract gives"):
        transport.exchange({"north": Message("setup", {"schema": label_swapped})})
    # a version it does not hold: nothing to take back (tests/models/test_publish.py: an older one is refused)
    reply = transport.exchange({"north": Message("withdraw_model", {"model": "t", "version": "v0001"})})
    assert reply["north"].kind == "withdrawn"


# -- point 4: one line per refusal, no raw value in a reply or a log line ----------------------------------
def test_malformed_evaluations_are_one_line_each_and_quote_no_data(scenario, pki, tmp_path, caplog) -> None:
    agents = _vertical_agents(scenario, tmp_path)
    holder = scenario["label_holder"]
    labels = {str(v) for v in pd.read_parquet(scenario["institutions"][holder]["train"])[scenario["label"]]}
    calls = 200
    with _served(agents, pki) as endpoints, _master(endpoints, pki) as transport:
        session = VerticalSession(transport, PARAMS, holdout_fraction=HOLDOUT, min_overlap=MIN_OVERLAP)
        session.align()
        session.train()
        transport.exchange({name: Message("load_holdout") for name in endpoints})
        n = session.facts.holdout_rows
        replies = []
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            for i in range(calls):
                bad = [np.array(["yes"] * n, dtype=object), np.zeros((n, 2), np.int64), np.zeros(3)][i % 3]
                with pytest.raises(ProtocolError) as refusal:
                    transport.exchange({holder: Message("evaluate", {}, {"values": bad})})
                replies.append(str(refusal.value))
    agent_lines = [r for r in caplog.records if r.name.startswith("fedcore") and "refused" in r.getMessage()]
    assert len(agent_lines) == calls
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in caplog.records)
    for text in replies + [r.getMessage() for r in caplog.records]:
        quoted = {label for label in labels if f"'{label}'" in text or f'"{label}"' in text}
        assert not quoted, text


def test_metrics_are_reported_to_four_significant_digits(tmp_path) -> None:
    """Regression predictions crafted as one power of two per row cannot be read back from the RMSE."""
    from fedcore.agents.checks import reported

    assert list(reported([0.123456789, -12345.678, 0.0, np.inf])) == [0.1235, -12350.0, 0.0, np.inf]
    rows = 40
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(rows)], "x": np.arange(rows, dtype=float),
                          "y": np.arange(rows, dtype=float) % 2})
    agent = VerticalInstitutionAgent(InstitutionData(
        name="bank", frame=frame, id_column="id", label="y", registry=tmp_path / "r",
        predictions_dir=tmp_path / "p"), KEY)
    transport = InProcessTransport({"bank": agent.handle})
    transport.exchange({"bank": Message("validation_report")})
    session = VerticalSession(transport, ForestParams(n_estimators=1, max_depth=2, task="regression",
                                                               criterion="squared_error"),
                              holdout_fraction=0.5, min_overlap=1)
    session.align()
    session.train()
    transport.exchange({"bank": Message("load_holdout")})
    n = session.facts.holdout_rows
    crafted = (-(2.0 ** -34) * 2.0 ** np.arange(n)).reshape(-1, 1)
    result = transport.exchange({"bank": Message("evaluate", {}, {"values": crafted})})["bank"].header
    assert result["metrics"]
    assert all(value == float(reported(value)) for value in result["metrics"].values())
