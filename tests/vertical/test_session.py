"""A whole vertical session in process: align, train, evaluate, register, store, batch predict."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.data.scenario import make_vertical_scenario
from fedcore.errors import ArtifactError, ProtocolError
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.alignment import AlignmentError
from fedcore.vertical.session import VerticalSession
from tests.keys import master_key, master_public_key

KEY = b"consortium-key-for-tests-0123456789"


def _agents(scenario: dict, root: Path, new_batch: bool = True,
            **settings) -> dict[str, VerticalInstitutionAgent]:
    """The scenario's institutions as agents; `settings` are further InstitutionData fields (holdout, ...)."""
    agents = {}
    for name, files in scenario["institutions"].items():
        label = scenario["label"] if name == scenario["label_holder"] else None
        data = InstitutionData(
            name=name, frame=pd.read_parquet(files["train"]), id_column=scenario["id_column"], label=label,
            registry=root / "registry" / name, predictions_dir=root / "predictions" / name,
            load_batch=(lambda path=files["new"]: pd.read_parquet(path)) if new_batch else None,
            master_key=master_public_key(root), **settings)
        agents[name] = VerticalInstitutionAgent(data, KEY)
    return agents


def _stored(agents: dict, root: Path, n_estimators: int, holdout_fraction: float,
            record_payloads: bool = False) -> tuple[VerticalSession, InProcessTransport, str]:
    """Align, train, register at the master (model "demo") and store at every institution.

    The session, its transport and the version.
    """
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=record_payloads)
    session = VerticalSession(transport, ForestParams(n_estimators=n_estimators, max_depth=4, random_state=1),
                              holdout_fraction=holdout_fraction, min_overlap=100)
    session.align()
    session.train()
    registry = ModelRegistry(root / "registry" / "master", signing_key=master_key(root))
    version = registry.register("demo", {"parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    return session, transport, version


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> dict:
    return make_vertical_scenario(tmp_path_factory.mktemp("scenario"), n_customers=1500, seed=3)


def test_session_end_to_end(scenario, tmp_path) -> None:
    agents = _agents(scenario, tmp_path)
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    session = VerticalSession(transport, ForestParams(n_estimators=15, max_depth=6, random_state=1),
                              holdout_fraction=0.25, min_overlap=100)
    plan = session.align()
    assert plan.n_common == scenario["overlap"]["train"]
    session.train()
    metrics = session.evaluate()
    assert 0.6 < metrics["accuracy"] <= 1.0
    assert session.facts.train_rows + session.facts.holdout_rows == plan.n_common

    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("demo",
                                {"metrics": metrics, "parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    stored = session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    assert set(stored) == set(agents)
    for name in agents:
        own = ModelRegistry(tmp_path / "registry" / name, public_key=master_public_key(tmp_path))
        manifest, tables = own.load("demo", version)
        assert manifest["master_manifest"]["version"] == version and len(tables) == 1

    holder = scenario["label_holder"]
    result = session.batch_predict(holder)
    assert result["rows"] == scenario["overlap"]["new"]
    predictions = pd.read_parquet(result["path"])
    assert list(predictions.columns[:2]) == [scenario["id_column"], "prediction"]
    assert len(predictions) == result["rows"] and predictions[scenario["id_column"]].is_unique
    for name in agents:  # only the requester got predictions
        assert (tmp_path / "predictions" / name).exists() == (name == holder)
    truth = pd.read_parquet(scenario["truth"]["new"]).set_index(scenario["id_column"])
    accuracy = (truth.loc[predictions[scenario["id_column"]], scenario["label"]].to_numpy()
                == predictions["prediction"].to_numpy()).mean()
    assert accuracy > 0.6
    session.close()
    assert all(a.closed for a in agents.values())


@pytest.mark.parametrize("alignment", ["hash", "psi"])
def test_empty_overlap_is_refused_naming_the_institution_whose_key_differs(scenario, tmp_path,
                                                                          alignment) -> None:
    agents = _agents(scenario, tmp_path, new_batch=False)
    agents["insurer"]._key = b"another-consortium-key-9876543210"
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    session = VerticalSession(transport, ForestParams(n_estimators=2, max_depth=2), min_overlap=10,
                              alignment=alignment)
    truth = pd.read_parquet(scenario["truth"]["train"])
    counts = {name: files["train_rows"] for name, files in scenario["institutions"].items()}
    shared = int((truth["in_bank"] & truth["in_ecommerce"]).sum())  # the two with the consortium's key
    with pytest.raises(AlignmentError) as refused:
        session.align()
    assert str(refused.value) == (
        f"ID overlap is empty (bank {counts['bank']} rows, ecommerce {counts['ecommerce']} rows, insurer "
        f"{counts['insurer']} rows); institution 'insurer' shares no ID hash with any other institution "
        f"(bank-ecommerce share {shared}): its consortium key or id_column differs")


def test_load_model_predicts_like_the_training_session(scenario, tmp_path) -> None:
    agents = _agents(scenario, tmp_path)
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=6, max_depth=5, random_state=2), min_overlap=100)
    session.align()
    session.train()
    manifest = {"task": "classification", "parties": session.manifest_entries()["parties"]}
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("demo", manifest, session.master_tables())
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    holder = scenario["label_holder"]
    trained_path = session.batch_predict(holder)["path"]
    trained = pd.read_parquet(trained_path)
    session.close()

    fresh = _agents(scenario, tmp_path)
    transport = InProcessTransport({n: a.handle for n, a in fresh.items()})
    transport.exchange({n: Message("validation_report") for n in fresh})
    loaded = VerticalSession(transport, ForestParams(), min_overlap=100)
    assert loaded.load_model(registry, "demo", "latest") == version
    result = loaded.batch_predict(holder)
    assert result["rows"] == scenario["overlap"]["new"]
    assert result["path"] != trained_path  # every prediction run keeps its own file
    assert Path(result["path"]).read_bytes() == Path(trained_path).read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(result["path"]), trained)

    with pytest.raises(ArtifactError, match="has no version 'v0009'"):
        loaded.load_model(registry, "demo", "v0009")
    # a local version that belongs to another master version
    bank = ModelRegistry(tmp_path / "registry" / "bank", public_key=master_public_key(tmp_path))
    stored, tables = bank.load("demo", version)
    bank.register("demo", {"institution": "bank", "master_manifest": stored["master_manifest"]}, tables,
                  version="v0002")
    with pytest.raises(ProtocolError,
                       match=r"institution 'bank'.*master version 'v0001', not the requested 'v0002'"):
        fresh["bank"].handle(Message("load_model", {"model": "demo", "version": "v0002"}))


def test_a_version_is_stored_at_every_institution_or_at_none(scenario, tmp_path) -> None:
    agents = _agents(scenario, tmp_path, new_batch=False)
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=3, max_depth=3, random_state=5), min_overlap=100)
    session.align()
    session.train()
    parties = session.manifest_entries()["parties"]
    forged = [{**p, "table_sha256": "0" * 64} if p["name"] == "insurer" else p for p in parties]
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("demo", {"task": "classification", "parties": forged},
                                session.master_tables())
    with pytest.raises(ProtocolError,
                       match="institution 'insurer': the master's manifest signs partial model digest "
                             "'0000000000000000000000000000000000000000000000000000000000000000', "
                             "not this party's model; refusing to store 'demo' v0001"):
        session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    assert [ModelRegistry(tmp_path / "registry" / name).versions("demo") for name in agents] == [[], [], []]


def test_institutions_predict_only_with_the_partial_model_the_master_signed(scenario, tmp_path) -> None:
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    for seed in (5, 6):  # two versions of one model: swapping a party's files between them must be caught
        agents = _agents(scenario, tmp_path)
        session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                                  ForestParams(n_estimators=3, max_depth=3, random_state=seed),
                                  min_overlap=100)
        session.align()
        session.train()
        version = registry.register("demo",
                                    {"task": "classification",
                                     "parties": session.manifest_entries()["parties"]},
                                    session.master_tables())
        session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    session.close()
    ecommerce = tmp_path / "registry" / "ecommerce" / "demo"
    first, second = ecommerce / "v0001", ecommerce / "v0002"
    for name in ("ecommerce.arrow",):  # a consistent local swap: file and its local manifest entry
        (first / name).write_bytes((second / name).read_bytes())
    local = json.loads((first / "manifest.json").read_text())
    theirs = json.loads((second / "manifest.json").read_text())
    local["files"] = theirs["files"]
    (first / "manifest.json").write_text(json.dumps(local))

    fresh = _agents(scenario, tmp_path)
    transport = InProcessTransport({n: a.handle for n, a in fresh.items()})
    transport.exchange({n: Message("validation_report") for n in fresh})
    loaded = VerticalSession(transport, ForestParams(), min_overlap=100)
    with pytest.raises(ArtifactError,
                       match=r"institution 'ecommerce': its 'demo' v0001 partial model \(sha256 \w+\) "
                             r"is not the one the master's signed manifest lists"):
        loaded.load_model(registry, "demo", "v0001")


def test_psi_alignment_lines_up_the_same_customers(scenario, tmp_path) -> None:
    aligned = {}
    for method in ("hash", "psi"):
        agents = _agents(scenario, tmp_path / method)
        transport = InProcessTransport({n: a.handle for n, a in agents.items()})
        session = VerticalSession(transport, ForestParams(n_estimators=3, max_depth=3), min_overlap=100,
                                  alignment=method)
        plan = session.align()
        assert plan.n_common == scenario["overlap"]["train"]
        orders = [tuple(agent.aligned_ids) for agent in agents.values()]
        assert len(set(orders)) == 1, f"{method}: row i is the same customer at every institution"
        aligned[method] = orders[0]
    assert set(aligned["psi"]) == set(aligned["hash"]) and aligned["psi"] != aligned["hash"]
    # that neither IDs nor their keyed hashes cross with PSI: the mode table in tests/test_wire_invariants.py


def test_psi_aligns_the_new_batch_too(scenario, tmp_path) -> None:
    agents = _agents(scenario, tmp_path)
    session = VerticalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                              ForestParams(n_estimators=3, max_depth=3, random_state=1), min_overlap=100,
                              alignment="psi")
    session.align()
    session.train()
    result = session.batch_predict(scenario["label_holder"])
    predictions = pd.read_parquet(result["path"])
    new = {n: set(pd.read_parquet(f["new"])[scenario["id_column"]])
           for n, f in scenario["institutions"].items()}
    assert set(predictions[scenario["id_column"]]) == set.intersection(*new.values())


def test_an_agent_refuses_a_master_asking_for_weaker_label_protection_than_its_config(scenario,
                                                                                      tmp_path) -> None:
    """A master cannot switch off Paillier, nor shrink its key, at an institution whose config asks for it.

    Whether mistaken or hostile, it is refused at setup, before any label statistic is computed.
    """
    agents = _agents(scenario, tmp_path, new_batch=False)
    for agent in agents.values():
        agent.data.privacy = {"mode": "paillier", "key_bits": 3072}
    for params, refusal in ((ForestParams(n_estimators=2, max_depth=3),
                             "the master asks for privacy 'none'; this institution's configuration says "
                             "'paillier'"),
                            (ForestParams(n_estimators=2, max_depth=3, privacy="paillier", key_bits=2048),
                             "the master asks for a 2048-bit Paillier key; this institution's configuration "
                             "says 3072")):
        transport = InProcessTransport({n: a.handle for n, a in agents.items()})
        transport.exchange({n: Message("validation_report") for n in agents})  # each attempt its own session
        session = VerticalSession(transport, params, min_overlap=100)
        session.align()
        with pytest.raises(ProtocolError, match=f"party '\\w+' refuses the request: {refusal}"):
            session.train()


def test_a_regression_label_with_missing_values_is_refused_at_setup(scenario, tmp_path) -> None:
    """As the estimators refuse it, naming the fix (it trained, then failed on non-finite predictions)."""
    agents = _agents(scenario, tmp_path, new_batch=False)
    bank = agents[scenario["label_holder"]].data
    bank.frame = bank.frame.drop(columns=[scenario["label"]])
    bank.frame["spend"] = 1.0 + np.arange(len(bank.frame))
    bank.frame["spend"] = bank.frame["spend"].where(bank.frame["spend"] % 7 != 0)  # every 7th row missing
    bank.label = "spend"
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    session = VerticalSession(transport, ForestParams(task="regression", criterion="squared_error",
                                                      n_estimators=2, max_depth=3), min_overlap=100)
    session.align()
    with pytest.raises(ProtocolError) as refused:
        session.train()
    line = str(refused.value)
    assert re.fullmatch(r"(.*: )?party 'bank' refuses the request: label 'spend' at party 'bank' has "
                        r"[1-9]\d* missing values; drop or fill those rows", line), line


def test_the_master_session_protocol_builds_manifest_and_card_without_prefect(scenario, tmp_path) -> None:
    """prepare/train/evaluate/predict return the shared types; the manifest and card come from fedcore."""
    from fedcore.models.card import build_manifest, model_card
    from fedcore.session import Prediction, Preparation, TrainingFacts

    agents = _agents(scenario, tmp_path)
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    session = VerticalSession(transport, ForestParams(n_estimators=4, max_depth=4, random_state=1),
                              min_overlap=100)
    preparation = session.prepare()
    assert isinstance(preparation, Preparation) and preparation.artifact_key == "id-overlap"
    assert preparation.facts["overlap"] == scenario["overlap"]["train"]
    assert [row["matched"] for row in preparation.table] == [scenario["overlap"]["train"]] * len(agents)
    facts = session.train()
    assert isinstance(facts, TrainingFacts) and facts is session.facts and facts.nodes > 0
    assert sum(facts.owned_nodes.values()) <= facts.nodes
    metrics = session.evaluate()
    manifest = build_manifest(session, "retail", metrics, {})
    assert (manifest["algorithm"], manifest["setting"], manifest["metrics"]) == ("forest", "vertical",
                                                                                 metrics)
    assert manifest["training"]["overlap"] == scenario["overlap"]["train"]
    assert manifest["training"]["rows"] == facts.train_rows and manifest["training"]["nodes"] == facts.nodes
    assert [p["name"] for p in manifest["parties"]] == session.institutions
    assert set(manifest["lineage"]) == {"federation", "contracts", "data_fingerprints", "code_version"}
    holder = scenario["label_holder"]
    prediction = session.predict(holder)
    assert isinstance(prediction, Prediction) and prediction.requester == holder
    assert prediction.rows == scenario["overlap"]["new"]
    card = model_card("retail", "v0001", manifest, None, True, prediction.to_dict())
    assert card.startswith("# retail v0001\n\nFederated Forest (vertical, classification); promoted to "
                           "production.")
    assert f"rows delivered to {holder}" in card
    # the label holder scored the class probabilities: every classification metric, rounded as it left
    assert set(metrics) == {"accuracy", "f1_macro", "balanced_accuracy", "base_rate", "roc_auc",
                            "average_precision", "log_loss"}
    assert 0.5 < metrics["roc_auc"] <= 1 and metrics["log_loss"] > 0
    assert f"| log_loss (lower is better) | {metrics['log_loss']:.4f} | - |" in card
    assert f"| roc_auc | {metrics['roc_auc']:.4f} | - |" in card
    # the file as the requester reported it, on its own host: in the summary, not in the model card
    (path,) = prediction.to_dict()["paths"].values()
    assert list(prediction.paths) == [holder] and path not in card
    assert Path(path).parent == tmp_path / "predictions" / holder and Path(path).is_file()
    with pytest.raises(ProtocolError,
                       match="vertical prediction delivers to one institution: name the requester"):
        session.predict()
