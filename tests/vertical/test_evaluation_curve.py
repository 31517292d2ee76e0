"""Issue #33: what the vertical label holder reports about its held-out rows (recorded transcript).

Its `metrics` reply carries, beside the rounded metrics, the confusion counts at the decision threshold and
the binary curve's label counts per probability group, nothing per row; the master keeps them for the
pictures (`session.evaluation`).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.agents.data import InstitutionData
from fedcore.curves import MIN_GROUP_ROWS, score_groups
from fedcore.data.split import split_vertical
from fedcore.metrics import class_codes
from fedcore.protocol.messages import Message
from fedcore.transport.inprocess import InProcessTransport
from fedcore.trees.params import ForestParams
from fedcore.vertical.agent import VerticalInstitutionAgent
from fedcore.vertical.session import VerticalSession
from tests.conftest import mixed_table
from tests.keys import master_key, master_public_key

KEY = b"evaluation-curve-key"


def evaluated(tmp_path, threshold: float | str | None):
    """A two-party binary federation, trained and evaluated.

    (session, metrics, transcript, label holder's agent, every agent by name).
    """
    table = mixed_table(n_rows=400, seed=3, n_classes=2)
    table.insert(0, "cid", [f"C{i:05d}" for i in range(len(table))])
    columns = split_vertical(table.drop(columns=["cid"]), 2, label="target", seed=1)
    agents = {}
    for k, part in enumerate(columns):
        name = f"party{k}"
        data = InstitutionData(name=name, frame=table[["cid", *part.columns]], id_column="cid",
                               label="target" if "target" in part.columns else None,
                               registry=tmp_path / name, predictions_dir=tmp_path / f"p-{name}",
                               master_key=master_public_key(tmp_path))
        agents[name] = VerticalInstitutionAgent(data, KEY)
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    transport.exchange({n: Message("validation_report") for n in agents})
    session = VerticalSession(transport, ForestParams(n_estimators=3, max_depth=3, random_state=0),
                              holdout_fraction=0.3, min_overlap=50)
    session.decision_threshold = threshold
    session.align()
    session.train()
    metrics = session.evaluate()
    holder = next(a for a in agents.values() if a.data.label)
    return session, metrics, transport.transcript, holder, agents


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_only_counts_leave_the_label_holder(tmp_path, threshold):
    session, metrics, transcript, holder, _ = evaluated(tmp_path, threshold)
    messages = [(e, Message.from_bytes(e.payload)) for e in transcript]
    (values,) = [m.arrays["values"] for e, m in messages if m.kind == "evaluate"]
    (reply,) = [m for e, m in messages if m.kind == "metrics"]
    assert set(reply.arrays) == {"confusion", "curve"}
    y = holder._holdout[holder.data.label].to_numpy()
    codes = class_codes(y, holder.party.classes_)
    # the curve is the label counts per probability group of the master's own predictions
    np.testing.assert_array_equal(reply.arrays["curve"], score_groups(codes == 1, values[:, 1]))
    assert (reply.arrays["curve"][:, 1] >= MIN_GROUP_ROWS).all()
    predicted = np.argmax(values, axis=1) if threshold is None else (values[:, 1] >= threshold).astype(int)
    expected = np.zeros((2, 2), np.int64)
    np.add.at(expected, (codes, predicted), 1)
    np.testing.assert_array_equal(reply.arrays["confusion"], expected)
    assert session.evaluation == {"classes": ["class 0", "class 1"], "confusion": expected.tolist(),
                                  "curve": reply.arrays["curve"].tolist(), "decision_threshold": threshold}
    assert metrics["accuracy"] == pytest.approx(np.trace(expected) / len(y), rel=1e-3)  # 4 digits reported


def test_auto_chooses_the_curves_best_threshold_and_scores_it_exactly(tmp_path):
    """decision_threshold "auto": the group edge of the largest TPR - FPR, its confusion from the counts."""
    session, metrics, transcript, holder, _ = evaluated(tmp_path, "auto")
    messages = [Message.from_bytes(e.payload) for e in transcript]
    (request,) = [m for m in messages if m.kind == "evaluate"]
    assert "decision_threshold" not in request.header  # the label holder scores the most probable class
    values = request.arrays["values"]
    codes = class_codes(holder._holdout[holder.data.label].to_numpy(), holder.party.classes_)
    curve = score_groups(codes == 1, values[:, 1])
    tpr_minus_fpr = [np.mean(values[codes == 1, 1] >= t) - np.mean(values[codes == 0, 1] >= t)
                     for t in curve[:, 0]]
    chosen = float(curve[int(np.argmax(tpr_minus_fpr)), 0])
    assert session.decision_threshold == chosen and session.evaluation["decision_threshold"] == chosen
    predicted = (values[:, 1] >= chosen).astype(int)
    expected = np.zeros((2, 2), np.int64)
    np.add.at(expected, (codes, predicted), 1)
    assert session.evaluation["confusion"] == expected.tolist()
    assert metrics["accuracy"] == np.trace(expected) / len(codes)  # exact: from the counts, not rounded


@pytest.mark.parametrize("threshold", [0.3, "auto"])
def test_the_threshold_is_stored_with_the_version_and_decides_at_every_institution(tmp_path, threshold):
    """The threshold configured or chosen on the held-out curve is stored with the version.

    In the signed manifest, the card, the pictures and each institution's copy, which its batch predictions
    read.
    """
    from fedcore.models.card import GROUPED_RANKING, build_manifest, model_card
    from fedcore.models.pictures import model_pictures
    from fedcore.models.registry import ModelRegistry

    session, metrics, _, _, agents = evaluated(tmp_path, threshold)
    chosen = session.decision_threshold
    assert isinstance(chosen, float) and (chosen == 0.3 if threshold == 0.3 else 0 < chosen < 1)
    manifest = build_manifest(session, "evaluation", metrics, {})
    assert manifest["decision_threshold"] == chosen and manifest["evaluation"] == session.evaluation
    card = model_card("demo", "v0001", manifest, None, True, None)
    assert (f"Class decisions above: the positive class at probability >= {chosen:g} (the decision "
            "threshold; batch predictions use it too).") in card
    pictures = model_pictures(manifest)
    assert f"Confusion matrix (held-out rows at threshold {chosen:g})" in pictures["confusion"]
    assert f"| roc_auc | {metrics['roc_auc']:.4f} | - |" in card and GROUPED_RANKING not in card  # per row
    registry = ModelRegistry(tmp_path / "registry", signing_key=master_key(tmp_path))
    version = registry.register("demo", manifest, session.master_tables())
    assert registry.read_manifest("demo", version)["decision_threshold"] == chosen  # signed with the version
    session.store_at_institutions("demo", version, registry.read_manifest("demo", version))
    assert {name: agent.decision_threshold for name, agent in agents.items()} == dict.fromkeys(agents, chosen)


def test_without_a_threshold_none_is_stored_and_the_card_says_most_probable(tmp_path):
    from fedcore.models.card import build_manifest, model_card

    session, metrics, _, _, _ = evaluated(tmp_path, None)
    manifest = build_manifest(session, "evaluation", metrics, {})
    assert "decision_threshold" not in manifest and manifest["evaluation"]["decision_threshold"] is None
    assert "Class decisions above: the most probable class." in model_card("demo", "v0001", manifest, None,
                                                                           True, None)
