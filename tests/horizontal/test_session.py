"""A whole horizontal session in process.

Agree the schema from the contracts, train, evaluate on every institution's held-out rows, store everywhere,
predict locally; and the refusals around it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.contracts.model import infer_contract
from fedcore.data.datasets import make_waveform
from fedcore.data.split import split_horizontal
from fedcore.errors import ArtifactError, ContractMismatch, ProtocolError
from fedcore.horizontal.agent import HorizontalInstitutionAgent
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.session import HorizontalSession
from fedcore.metrics import metrics as score
from fedcore.models.registry import ModelRegistry
from fedcore.privacy.keyauth import ephemeral_identities
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.settings import LocalDP
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from tests.horizontal.common import DOMAIN_LIES, announce_parties, rewrite_domains
from tests.keys import master_key, master_public_key

NAMES = ("north", "south", "east")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    frame = make_waveform(1500, random_state=3)
    frame["class"] = frame["class"].map({0: "a", 1: "b", 2: "c"})
    frame["region"] = pd.Categorical(np.random.default_rng(0).choice(["x", "y", "z"], len(frame)))
    frame.insert(0, "patient_id", [f"P{i:05d}" for i in range(len(frame))])
    return frame


def _agents(table: pd.DataFrame, root, contract=None) -> dict[str, HorizontalInstitutionAgent]:
    contract = contract or infer_contract(table, "waveform", id_column="patient_id", label="class")
    agents = {}
    identities = ephemeral_identities(NAMES)  # sign PPD-ERT's secure-aggregation keys (no certificates here)
    for name, part in zip(NAMES, split_horizontal(table, 3, seed=1), strict=True):
        new = part.sample(frac=0.3, random_state=2).drop(columns=["class"])
        data = InstitutionData(name=name, frame=part, id_column="patient_id", label="class",
                               registry=root / "registry" / name, predictions_dir=root / "predictions" / name,
                               load_batch=lambda new=new: new, contract=contract,
                               master_key=master_public_key(root))
        agents[name] = HorizontalInstitutionAgent(data, identity=identities[name])
    return agents


def _session(agents, algorithm="extra-trees", privacy=None, params=None) -> HorizontalSession:
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    transport.exchange({n: Message("validation_report") for n in agents})
    params = params or ExtraTreesParams(n_estimators=12, max_depth=8, random_state=4)
    return HorizontalSession(transport, params, algorithm=algorithm, privacy=privacy, holdout_fraction=0.25)


def _model_acks(session) -> list[Message]:
    """The institutions' acknowledgements of the finished model, as they crossed."""
    return [Message.from_bytes(e.payload) for e in session.transport.transcript
            if e.kind == "ack" and e.receiver == "master"]


@pytest.mark.parametrize("algorithm", ["extra-trees", "ppd-ert"])
def test_train_evaluate_store_and_predict_locally(table, tmp_path, algorithm) -> None:
    agents = _agents(table, tmp_path)
    session = _session(agents, algorithm)
    schema = session.agree_schema()
    assert schema.names == [c for c in table.columns if c not in ("patient_id", "class")]
    session.train()
    model = session.model
    assert all(a.model.same_as(model) for a in agents.values()), "every institution holds the complete model"

    metrics = session.evaluate()
    held = pd.concat([a._holdout for a in agents.values()])
    proba = model.predict_values(schema.encode(held))
    predicted = np.asarray(schema.classes)[np.argmax(proba, axis=1)]
    assert metrics["accuracy"] == pytest.approx(float(np.mean(predicted == held["class"].to_numpy())),
                                                abs=1e-12)
    assert metrics["accuracy"] > 0.7 and session.facts.holdout_rows == len(held)
    # balanced accuracy and base rate come from the summed confusion counts, as from the pooled predictions;
    # log-loss from each institution's sum of its rows' log-losses, rounded to 4 digits (0.05% at most)
    pooled = score("classification", held["class"].to_numpy(), predicted, proba, np.asarray(schema.classes))
    assert set(metrics) == {*score("classification", held["class"].to_numpy(), predicted), "log_loss"}
    assert {k: v for k, v in metrics.items() if k != "log_loss"} == pytest.approx(
        {k: v for k, v in pooled.items() if k in metrics and k != "log_loss"}, abs=1e-12)
    assert metrics["log_loss"] == pytest.approx(pooled["log_loss"], rel=5e-4) and metrics["log_loss"] > 0
    # no differential privacy, so no ledger: none crossed with the model, none in the report
    assert [sorted(ack.header) for ack in _model_acks(session)] == [["n_nodes"]] * 3
    assert session.facts.privacy_ledgers == {} and "ledgers" not in session.privacy_report()

    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    parties = session.manifest_entries()["parties"]
    version = registry.register("waveform", {"task": "classification", "parties": parties},
                                session.master_tables())
    session.store_at_institutions("waveform", version, registry.read_manifest("waveform", version))
    for name in NAMES:
        _, tables = ModelRegistry(tmp_path / "registry" / name, public_key=master_public_key(tmp_path)).load(
            "waveform", version)
        assert HorizontalForest_from(tables).same_as(model)

    result = session.predict_locally()
    assert result["counts"] == {n: len(a.data.load_batch()) for n, a in agents.items()}
    for name, agent in agents.items():
        path = Path(result["paths"][name])
        assert path.parent == tmp_path / "predictions" / name and path.name.startswith(f"waveform-{version}-")
        written = pd.read_parquet(path)
        new = agent.data.load_batch()
        assert list(written["patient_id"]) == list(new["patient_id"])
        expected = np.asarray(schema.classes)[np.argmax(model.predict_values(schema.encode(new)), axis=1)]
        assert list(written["prediction"]) == list(expected)
    session.close()


def HorizontalForest_from(tables):  # noqa: N802 - reads like the class it rebuilds
    from fedcore.horizontal.model import HorizontalForest

    return HorizontalForest.from_table(tables["model"])


def test_a_registered_version_loads_and_predicts_without_training(table, tmp_path) -> None:
    agents = _agents(table, tmp_path)
    session = _session(agents)
    session.agree_schema()
    session.train()
    model = session.model
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("waveform", {"parties": session.manifest_entries()["parties"]},
                                session.master_tables())
    session.store_at_institutions("waveform", version, registry.read_manifest("waveform", version))
    trained = session.predict_locally()["paths"]

    fresh = _agents(table, tmp_path)
    loaded = _session(fresh)
    assert loaded.load_model(registry, "waveform", "latest") == version
    assert all(a.model.same_as(model) for a in fresh.values())
    paths = loaded.predict_locally()["paths"]
    for name in NAMES:
        assert paths[name] != trained[name]
        pd.testing.assert_frame_equal(pd.read_parquet(paths[name]), pd.read_parquet(trained[name]))

    model_file = tmp_path / "registry" / "south" / "waveform" / version / "model.arrow"
    model_file.write_bytes(model_file.read_bytes()[:-8] + bytes(8))  # a local tamper
    with pytest.raises(ArtifactError, match="institution 'south': .*model.arrow"):
        _session(_agents(table, tmp_path)).load_model(registry, "waveform", version)


def test_contracts_that_disagree_stop_the_session(table, tmp_path) -> None:
    agents = _agents(table, tmp_path)
    narrow = infer_contract(table.drop(columns=["region"]), "waveform", id_column="patient_id", label="class")
    agents["east"].data.contract = narrow
    with pytest.raises(ContractMismatch,
                       match="institution 'east': its contract lacks \\['region'\\] compared with "
                             "'north'"):
        _session(agents).agree_schema()


@pytest.mark.parametrize(("own", "asked", "refusal"), [
    ({"mode": "gdp", "epsilon": 0.5}, {"mode": "none"},
     "the master asks for privacy 'none', but this institution's configuration says 'gdp' \\(epsilon 0.5, "
     "delta 1e-06\\)"),
    ({"mode": "gdp", "epsilon": 0.5}, {"mode": "gdp", "epsilon": 8.0},
     "the master asks for privacy 'gdp' \\(epsilon 8, delta 1e-06\\), but .* says 'gdp' \\(epsilon 0.5, "
     "delta 1e-06\\)"),
    ({"mode": "gdp", "epsilon": 0.5}, {"mode": "gdp", "epsilon": 0.5, "delta": 1e-3},
     "the master asks for privacy 'gdp' \\(epsilon 0.5, delta 0.001\\), but .* says 'gdp' \\(epsilon 0.5, "
     "delta 1e-06\\)"),
    ({"mode": "ldp", "mechanism": "krr", "epsilon": 1.0}, {"mode": "ldp", "mechanism": "bloom"},
     "the master asks for privacy 'ldp' \\(bloom, epsilon 8.79\\), but .* says 'ldp' \\(krr, epsilon 1\\)"),
    # both "auto": each resolves it for the agreed 3 classes (k-RR), the master before it sends its setup
    ({"mode": "ldp", "epsilon": 3}, {"mode": "ldp"},
     "the master asks for privacy 'ldp' \\(krr, epsilon 2\\), but .* says 'ldp' \\(krr, epsilon 3\\)"),
    ({"mode": "ldp"}, {"mode": "ldp", "mechanism": "oue"},
     "the master asks for privacy 'ldp' \\(oue, epsilon 2\\), but .* says 'ldp' \\(krr, epsilon 2\\)"),
    ({"mode": "ldp", "mechanism": "bloom", "n_bits": 64}, {"mode": "ldp", "mechanism": "bloom"},
     "the master asks for privacy \\{'mode': 'ldp', .*\\}, but .* says \\{'mode': 'ldp', "
     "'mechanism': 'bloom', 'n_bits': 64, .*\\}"),
])
def test_an_agent_trains_fet_only_with_the_privacy_of_its_own_config(table, tmp_path, own, asked,
                                                                     refusal) -> None:
    """A master (mistaken or hostile) cannot lower an institution's noise.

    It is refused before any row is used.
    """
    agents = _agents(table.head(600), tmp_path)
    for agent in agents.values():
        agent.data.privacy = own
    with pytest.raises(ProtocolError, match=f"institution 'north': {refusal}; refusing to train"):
        _session(agents, privacy=asked).agree_schema()  # setup, before any row is used
    agents = _agents(table.head(600), tmp_path / "agreed")
    for agent in agents.values():
        agent.data.privacy = own
    agreed = _session(agents, privacy=own)
    agreed.agree_schema()
    agreed.train()
    assert agreed.model.n_trees == 12


def test_regression_metrics_from_the_institutions_sums_equal_the_pooled_ones(table, tmp_path) -> None:
    """RMSE, R^2 and MAE from each institution's (rounded) sums: the pooled held-out rows' to 4 digits."""
    values = table.assign(**{"class": table["class"].map({"a": 0.5, "b": 1.5, "c": 2.5})})
    agents = _agents(values, tmp_path)
    params = ExtraTreesParams(n_estimators=4, max_depth=4, random_state=4, task="regression",
                              criterion="squared_error")
    session = _session(agents, params=params)
    schema = session.agree_schema()
    session.train()
    metrics = session.evaluate()
    held = pd.concat([a._holdout for a in agents.values()])
    predicted = session.model.predict_values(schema.encode(held))[:, 0]
    pooled = score("regression", held["class"].to_numpy(), predicted)
    assert set(metrics) == {"rmse", "r2", "mae"}
    assert metrics == pytest.approx(pooled, rel=1e-3)  # each institution's sums rounded to 4 digits


def test_an_agent_refuses_label_ldp_for_a_regression_label_by_name(table, tmp_path) -> None:
    """A master that asks for label LDP on a regression label is refused with the parser's reason."""
    values = table.assign(**{"class": table["class"].map({"a": 0.5, "b": 1.5, "c": 2.5})})
    agents = _agents(values, tmp_path)
    transport = InProcessTransport({n: a.handle for n, a in agents.items()})
    transport.exchange({n: Message("validation_report") for n in agents})
    params = ExtraTreesParams(n_estimators=2, max_depth=3, task="regression", criterion="squared_error")
    session = HorizontalSession(transport, params, privacy="gdp")
    session.privacy = LocalDP(LabelLDP(mechanism="krr"))  # past the master's own check
    with pytest.raises(ProtocolError) as caught:
        session.agree_schema()
    assert str(caught.value) == (
        "institution 'north': the master's setup asks for no usable privacy setting (privacy 'ldp' "
        "randomizes class labels and works for classification only; use 'gdp' (Gaussian noise) or 'none' for "
        "a regression label); refusing to train")


def test_a_configured_ldp_epsilon_is_the_epsilon_every_party_randomizes_labels_at(table, tmp_path) -> None:
    """`privacy: {mode: ldp, epsilon: 3}` trains at epsilon 3, not at the Bloom defaults' 8.79 (issue #27).

    The config is parsed once; the master resolves "auto" for the agreed classes (k-RR for 3 at epsilon 3)
    and sends that in its setup, every agent parses it and its own config with the same parser and resolves
    its own "auto" the same way, and the party's mechanism is the configured one.
    """
    from fedcore.config import parse_config

    institutions = [{"name": n, "data": f"{n}.csv", "id_column": "patient_id", "label": "class"}
                    for n in NAMES]
    config = parse_config({"federation": "waveform", "setting": "horizontal", "institutions": institutions,
                           "consortium_key": {"env": "KEY"}, "privacy": {"mode": "ldp", "epsilon": 3}},
                          tmp_path / "federation.yaml")
    agents = _agents(table.head(600), tmp_path)
    for agent in agents.values():
        agent.data.privacy = config.privacy
    session = _session(agents, privacy=config.privacy)
    session.agree_schema()
    session.train()
    for agent in agents.values():
        assert agent.party.privacy_spent()["permanent"] == 3.0
        assert agent.party.label_ldp() == LabelLDP(mechanism="krr", report_epsilon=3.0)
    resolved = {"mode": "ldp", "mechanism": "krr", "epsilon": 3.0, "estimator": "nnls"}
    assert config.privacy.to_dict()["mechanism"] == "auto"
    setups = [Message.from_bytes(e.payload) for e in session.transport.transcript if e.kind == "setup"]
    assert len(setups) == 3 and all(m.header["privacy"] == resolved for m in setups)  # what crossed
    stated = {"mechanism": "krr", "epsilon": 3.0, "epsilon_total": 3.0, "delta": 0.0}
    assert session.privacy_report() == {"mode": "ldp", "setting": resolved, "mechanism": "krr",
                                        "epsilon": 3.0, "epsilon_total": 3.0, "delta": 0.0,
                                        "ledgers": dict.fromkeys(NAMES, stated)}


@pytest.mark.parametrize("algorithm", ["extra-trees", "ppd-ert"])
def test_an_institution_declares_the_same_training_rows_in_hello_as_at_setup(table, tmp_path,
                                                                            algorithm) -> None:
    """The rows bound every count an institution sends (`fedcore/horizontal/counts.py`): it cannot raise them.

    A hostile institution that declares more rows in hello than at setup is refused before any level.
    """
    agents = _agents(table.head(600), tmp_path)
    honest = agents["north"].handle

    def inflating(message):
        reply = honest(message)
        if reply.kind == "hello_reply":
            return Message(reply.kind, {**reply.header, "n_rows": reply.header["n_rows"] + 7}, reply.arrays)
        return reply

    agents["north"].handle = inflating
    session = _session(agents, algorithm)
    session.agree_schema()
    rows = session.rows["north"]["train_rows"]
    with pytest.raises(ProtocolError) as refused:
        session.train()
    assert str(refused.value) == (f"party 'north' declared {rows + 7} rows in hello, but {rows} training "
                                  "rows at setup")


def test_an_institution_declares_row_counts_at_setup(table, tmp_path) -> None:
    agents = _agents(table.head(600), tmp_path)
    honest = agents["south"].handle

    def negative(message):
        reply = honest(message)
        if reply.kind == "ready":
            return Message(reply.kind, {**reply.header, "holdout_rows": -3})
        return reply

    agents["south"].handle = negative
    with pytest.raises(ProtocolError) as refused:
        _session(agents).agree_schema()
    assert str(refused.value) == ("institution 'south' declared -3 held-out rows at setup; a row count is an "
                                  "integer >= 0")


def test_the_master_session_protocol_builds_manifest_and_card_without_prefect(table, tmp_path) -> None:
    """The same protocol and types as the vertical session; the manifest adds the schema and privacy."""
    from fedcore.models.card import build_manifest, model_card
    from fedcore.session import Prediction, TrainingFacts

    agents = _agents(table, tmp_path)
    session = _session(agents, "ppd-ert")
    preparation = session.prepare()
    assert preparation.artifact_key == "institution-rows"
    assert preparation.facts["features"] == session.schema.n_features
    assert [row["institution"] for row in preparation.table] == list(NAMES)
    facts = session.train()
    assert isinstance(facts, TrainingFacts) and facts.nodes == session.model.n_nodes
    assert facts.owned_nodes == {}
    assert facts.train_rows == sum(row["training rows"] for row in preparation.table)
    metrics = session.evaluate()
    manifest = build_manifest(session, "hospitals", metrics, {})
    assert (manifest["algorithm"], manifest["setting"]) == ("ppd-ert", "horizontal")
    assert manifest["privacy"]["mode"] == "secagg" and manifest["schema"] == session.schema.to_dict()
    assert "overlap" not in manifest["training"] and manifest["training"]["rows"] == facts.train_rows
    prediction = session.predict()
    assert isinstance(prediction, Prediction) and prediction.requester is None
    assert prediction.rows == sum(prediction.counts.values()) > 0
    # every institution's own file, as it reported it (the summary carries them; the card does not)
    assert prediction.to_dict()["paths"] == prediction.paths
    assert list(prediction.paths) == list(prediction.counts)
    for name, path in prediction.paths.items():
        assert Path(path).parent == tmp_path / "predictions" / name and Path(path).is_file()
    card = model_card("hospitals", "v0001", manifest, None, False, prediction.to_dict())
    assert card.startswith("# hospitals v0001\n\nPPD-ERT (horizontal, classification, privacy secagg); not "
                           "promoted.")
    assert "rows predicted locally at " + ", ".join(f"{n} "
                                                    f"({c})" for n, c in prediction.counts.items()) in card


@pytest.mark.parametrize("mode", ["gdp", "ldp"])
def test_fet_in_a_dp_mode_needs_every_numeric_range_declared_in_the_contracts(table, tmp_path, mode) -> None:
    """FET's DP modes draw thresholds in the declared domains: a contract without a range stops them."""
    import dataclasses

    from fedcore.privacy.settings import parse_privacy

    contract = infer_contract(table, "waveform", id_column="patient_id", label="class")
    columns = [dataclasses.replace(c, min=None, max=None) if c.name == "x3" else c for c in contract.columns]
    agents = _agents(table, tmp_path, dataclasses.replace(contract, columns=columns))
    for agent in agents.values():
        agent.data.privacy = parse_privacy(mode, "extra-trees")
    with pytest.raises(ContractMismatch) as refused:
        _session(agents, privacy=mode).agree_schema()
    assert str(refused.value) == (f"Federated Extra-Trees in privacy {mode!r} draws thresholds from declared "
                                  "domains: declare min and max for column(s) ['x3'] in every institution's "
                                  "contract")
    declared = _agents(table, tmp_path / "declared")  # every range declared: it trains, from the domains
    for agent in declared.values():
        agent.data.privacy = parse_privacy(mode, "extra-trees")
    session = _session(declared, privacy=mode)
    session.agree_schema()
    session.train()
    low, high = session.master.domains
    x3 = session.schema.names.index("x3")
    spec = next(c for c in contract.columns if c.name == "x3")  # the contract's range, not the data's
    assert (low[x3], high[x3]) == (float(spec.min), float(spec.max)) != (table["x3"].min(), table["x3"].max())


SMALL = ExtraTreesParams(n_estimators=4, max_depth=4, random_state=4)


@pytest.mark.parametrize("mode", ["gdp", "ldp"])
def test_the_signed_manifest_and_the_card_carry_every_institutions_ledger(table, tmp_path, mode) -> None:
    """Each DP institution states its ledger's data-independent summary with the model (issue #31).

    The master checks it and the signed manifest and the model card carry it per institution, each
    epsilon_total at most the configured epsilon; the busiest row's releases do not cross.
    """
    from fedcore.models.card import build_manifest, model_card
    from fedcore.privacy.accounting import gaussian_epsilon
    from fedcore.privacy.settings import parse_privacy

    setting = parse_privacy({"mode": mode, "epsilon": 1.5}, "extra-trees")
    agents = _agents(table.head(600), tmp_path)
    for agent in agents.values():
        agent.data.privacy = setting
    session = _session(agents, privacy=setting, params=SMALL)
    session.agree_schema()
    session.train()
    if mode == "gdp":
        plan = session.master.plan
        expected = {"mechanism": "gaussian", "sigma": plan.sigma, "l2_sensitivity": 2.0,  # sqrt(k = 4)
                    # 16 levels of trees, the marginal histograms as ceil(0.1 x 16 / 0.9) = 2 releases and
                    # the noisy row count as 1
                    "planned_releases_per_row": 19, "epsilon_budget": 1.5, "delta": 1e-6,
                    "epsilon_total": gaussian_epsilon(plan.sigma / 2.0, 1e-6, 19)}
        spent = agents["north"].party.privacy_spent()  # data-dependent: the party's own report only
        assert 3 < spent["releases_per_row"] <= 19 and spent["queries"] > 1
    else:
        expected = {"mechanism": "krr", "epsilon": 1.5, "epsilon_total": 1.5, "delta": 0.0}
    assert expected["epsilon_total"] <= 1.5
    assert [ack.header["ledger"] for ack in _model_acks(session)] == [expected] * 3  # what crossed

    manifest = build_manifest(session, "hospitals", session.evaluate(), {})
    registry = ModelRegistry(tmp_path / "registry" / "master", signing_key=master_key(tmp_path))
    version = registry.register("waveform", manifest, session.master_tables())
    signed = ModelRegistry(tmp_path / "registry" / "master", public_key=master_public_key(tmp_path))
    stored = signed.read_manifest("waveform", version)
    assert stored["privacy"]["ledgers"] == dict.fromkeys(NAMES, expected)
    card = model_card("hospitals", version, stored, None, False, None)
    if mode == "gdp":
        line = (f"gaussian, sigma {plan.sigma:.6g}, L2 sensitivity 2, releases per row planned 19: "
                f"(epsilon {expected['epsilon_total']:.6g}, delta 1e-06)")
    else:
        line = "krr, epsilon per row 1.5: (epsilon 1.5, delta 0)"
    assert "\n## Privacy (each institution's ledger, as it stated it with the model)\n\n" + "\n".join(
        f"- {name}: {line}" for name in NAMES) + "\n\n## Training" in card


@pytest.mark.parametrize(("field", "value", "refusal"), [
    # the master recomputes the total from the ledger's mechanism and parameters: the stated one is not it
    ("epsilon_total", 1.6, "party 'south' stated epsilon_total 1.6 in its privacy ledger, but its mechanism "
                           "and parameters give {total!r} (the master's accountant)"),
    ("epsilon_budget", 3.0, "party 'south' stated epsilon_budget 3.0 in its privacy ledger, but the agreed "
                            "setting's is 1.5"),
])
def test_an_institution_stating_more_than_the_agreed_budget_is_refused(table, tmp_path, field, value,
                                                                       refusal) -> None:
    """A ledger above the agreed setting stops the session before anything is registered, naming the party."""
    from fedcore.privacy.settings import parse_privacy

    setting = parse_privacy({"mode": "gdp", "epsilon": 1.5}, "extra-trees")
    agents = _agents(table.head(600), tmp_path)
    for agent in agents.values():
        agent.data.privacy = setting
    honest = agents["south"].handle

    def overstating(message):
        reply = honest(message)
        if reply.kind == "ack" and "ledger" in reply.header:
            return Message(reply.kind, {**reply.header, "ledger": {**reply.header["ledger"], field: value}})
        return reply

    agents["south"].handle = overstating
    session = _session(agents, privacy=setting, params=SMALL)
    session.agree_schema()
    with pytest.raises(ProtocolError) as refused:
        session.train()
    assert str(refused.value) == refusal.format(total=agents["south"].party.stated_ledger()["epsilon_total"])
    assert session.facts.privacy_ledgers == {}


def test_the_manifest_and_card_show_the_trees_and_depth_gdp_plan_auto_chose(table, tmp_path) -> None:
    """Only epsilon given: the manifest's params and the card show the trees and depth that ran.

    Plan auto without a max_depth trains plan leaves' trees at the depth the noisy row count gives, not the
    configured 4 trees and no depth.
    """
    from fedcore.horizontal.fet.plans import DEFAULT_LEAF_TREES
    from fedcore.models.card import build_manifest, model_card
    from fedcore.privacy.settings import parse_privacy

    setting = parse_privacy({"mode": "gdp", "epsilon": 2.0}, "extra-trees")
    agents = _agents(table.head(600), tmp_path)
    for agent in agents.values():
        agent.data.privacy = setting
    session = _session(agents, privacy=setting, params=ExtraTreesParams(n_estimators=4, random_state=4))
    session.agree_schema()
    session.train()
    plan = session.privacy_report()["plan"]
    assert plan["plan"] == "leaves" and plan["n_estimators"] == DEFAULT_LEAF_TREES
    manifest = build_manifest(session, "hospitals", session.evaluate(), {})
    assert manifest["params"]["n_estimators"] == DEFAULT_LEAF_TREES == session.model.n_trees
    assert manifest["params"]["max_depth"] == plan["max_depth"] == int(session.model.depth.max())
    card = model_card("hospitals", "v0001", manifest, None, False, None)
    assert f"- {DEFAULT_LEAF_TREES} trees, max_depth {plan['max_depth']}, " in card


@pytest.mark.parametrize(("mode", "announced"), [("secagg", 1), ("secagg-dp", 6)])
def test_a_ppdert_institution_refuses_a_master_announcing_another_number_of_parties(table, tmp_path, mode,
                                                                                     announced) -> None:
    """One party announced: each would send its counts unmasked; more: each would add less noise.

    An institution knows its federation's size from its own config (3 here).
    """
    from fedcore.privacy.settings import parse_privacy

    agents = _agents(table.head(600), tmp_path)
    setting = parse_privacy({"mode": mode, "epsilon": 2.0} if mode == "secagg-dp" else mode, "ppd-ert")
    for agent in agents.values():
        agent.data.privacy, agent.data.federation_size = setting, len(NAMES)
    session = _session(agents, "ppd-ert", privacy=setting, params=SMALL)
    session.agree_schema()
    announce_parties(session, announced)
    with pytest.raises(ProtocolError, match=rf"party 'north': the master announced {announced} parties, this "
                                            r"institution's federation lists 3; refusing to aggregate"):
        session.train()
    to_master = [e.kind for e in session.transport.transcript if e.receiver == "master"]
    assert not [kind for kind in to_master if kind.startswith("ppdert")]


@pytest.mark.parametrize(("feature", "low", "high", "why"), [
    *DOMAIN_LIES, ("region", 0.0, 7.0, r"is \[0\.0, 7\.0\]; its 3 categories' codes are \[0, 2\]")])
def test_a_ppdert_institution_refuses_a_master_domain_its_contract_cannot_give(table, tmp_path, feature, low,
                                                                              high, why) -> None:
    """PPD-ERT cuts its cells in the master's domains: each must be finite and hold the declared range."""
    session = _session(_agents(table.head(600), tmp_path), "ppd-ert", params=SMALL)
    rewrite_domains(session, feature, low, high)
    with pytest.raises(ProtocolError, match=rf"institution 'north': the master's domain for feature "
                                            rf"'{feature}' {why}; refusing to set up"):
        session.agree_schema()
    assert not [e for e in session.transport.transcript if e.receiver == "master" and e.kind == "ready"]


@pytest.mark.parametrize("algorithm", ["extra-trees", "ppd-ert"])
def test_a_binary_label_gets_the_pooled_held_out_curve_and_an_auto_threshold(table, tmp_path,
                                                                             algorithm) -> None:
    """Every institution sends its own curve groups; the master pools them for the pictures and `auto`."""
    from fedcore.curves import MIN_GROUP_ROWS
    from fedcore.session import AUTO

    binary = table.assign(**{"class": np.where(table["class"] == "a", "a", "b")})
    agents = _agents(binary, tmp_path)
    session = _session(agents, algorithm, params=SMALL)
    session.agree_schema()
    session.train()
    session.decision_threshold = AUTO
    metrics = session.evaluate()
    replies = [Message.from_bytes(e.payload) for e in session.transport.transcript
               if e.kind == "evaluation" and e.receiver == "master"]
    assert len(replies) == 3
    for reply in replies:  # no institution reports a group under MIN_GROUP_ROWS of its held-out rows
        curve = reply.arrays["curve"]
        assert len(curve) == 1 or (curve[:, 1] >= MIN_GROUP_ROWS).all()
        assert curve[:, 1].sum() == reply.arrays["confusion"].sum()
    pooled = np.asarray(session.evaluation["curve"])
    confusion = np.asarray(session.evaluation["confusion"])
    held = sum(r.arrays["confusion"].sum(axis=1) for r in replies)  # held-out rows per true class
    assert pooled[:, 1].sum() == held.sum() and pooled[:, 2].sum() == held[1]
    assert session.decision_threshold in pooled[:, 0].tolist()  # auto: a group's threshold
    assert confusion.sum() == held.sum()
    assert metrics["accuracy"] == pytest.approx(np.trace(confusion) / held.sum())
    # ranking metrics: scikit-learn's on every institution's held-out rows, each score rounded to its group
    from sklearn.metrics import average_precision_score, roc_auc_score

    from fedcore.models.card import GROUPED_RANKING, build_manifest, model_card
    from tests.test_curves import grouped_scores

    rows = pd.concat([a._holdout for a in agents.values()])
    score = session.model.predict_values(session.schema.encode(rows))[:, 1]
    positive = rows["class"].to_numpy() == session.schema.classes[1]
    grouped = grouped_scores(pooled, score)
    assert list(metrics) == ["accuracy", "f1_macro", "balanced_accuracy", "base_rate", "roc_auc",
                             "average_precision", "log_loss"]  # the keys and order of `simulate --json`
    assert metrics["roc_auc"] == pytest.approx(roc_auc_score(positive, grouped), rel=1e-12)
    assert metrics["average_precision"] == pytest.approx(average_precision_score(positive, grouped),
                                                         rel=1e-12)
    manifest = build_manifest(session, "hospitals", metrics, {})
    card = model_card("waveform", "v0001", manifest, None, True, None)
    assert f"| roc_auc | {metrics['roc_auc']:.4f} | - |" in card and GROUPED_RANKING in card
