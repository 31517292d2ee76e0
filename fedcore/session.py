"""The master's side of a session, the same steps in every setting.

`MasterSession` is the protocol orchestration calls (the Prefect tasks in `tasks/`, or plain Python):
`prepare` (agree which rows or columns train), `train`, `evaluate`, `master_tables` and
`manifest_entries` (what the signed version holds), `load_model` and `predict`, each returning the same
types in both settings. It also does the steps every setting shares: agreeing where a checkpointed run
resumes, collecting the institutions' model digests for the signed manifest, storing a version
everywhere or nowhere, and closing the session.
"""

from __future__ import annotations

import json
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from fedcore.checkpoints import CheckpointStore, resume_point
from fedcore.curves import confusion_at, youden_group
from fedcore.errors import FedForestError
from fedcore.metrics import confusion_metrics
from fedcore.models.registry import ModelRegistry
from fedcore.progress import ProgressCallback
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport
from fedcore.trees.params import TreeParams

log = logging.getLogger(__name__)


@dataclass
class Preparation:
    """What `prepare` agreed before training: rows per institution, as a table for the operator."""

    artifact_key: str
    """Where the table shows in the Prefect UI (`id-overlap`, `institution-rows`)."""
    description: str
    """One line for the log and the artifact: how many rows or columns were agreed."""
    table: list[dict[str, Any]]
    """One row per institution: counts only, never IDs or values."""
    facts: dict[str, Any] = field(default_factory=dict)
    """The JSON-ready figures a run reports (overlap, rows, features)."""


@dataclass
class TrainingFacts:
    """What a training run did: rows, time, rounds and bytes (recorded in the manifest)."""

    train_rows: int = 0
    holdout_rows: int = 0
    seconds: float = 0.0
    rounds: int = 0
    bytes: int = 0
    nodes: int = 0
    resumed_batches: int = 0
    """Tree batches taken from checkpoints of an interrupted attempt of the same run."""
    owned_nodes: dict[str, int] = field(default_factory=dict)
    """Vertical: the split nodes each institution owns (empty in the horizontal setting)."""
    privacy_ledgers: dict[str, dict] = field(default_factory=dict)
    """Horizontal DP modes: each institution's privacy ledger as it stated it with the model, checked by the
    master (`fedcore.horizontal.ledgers`); empty without differential privacy."""

    def to_dict(self) -> dict[str, Any]:
        """The facts as a JSON-ready dict."""
        return asdict(self)


@dataclass
class Prediction:
    """What `predict` did: rows predicted per institution, and where the predictions went."""

    rows: int
    counts: dict[str, int]
    """Vertical: each institution's new rows; horizontal: the rows each predicted at home."""
    seconds: float
    requester: str | None = None
    """Vertical: the one institution the predictions (with IDs) were delivered to; horizontal: None,
    every institution keeps its own."""
    paths: dict[str, str] = field(default_factory=dict)
    """Where the predictions were written, per institution that wrote them (vertical: the requester only;
    horizontal: every institution), as each reported it: a path on its own host, which the master can
    neither see nor check. Each institution names its file `<model>-<version>-<UTC time>.parquet`."""
    drift: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per institution whose batch drifted from its training rows, its drifted features and their PSI
    (`fedcore.drift`; only those at or above its `drift.psi_threshold`: the other scores stay there)."""

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return {k: v for k, v in asdict(self).items() if v is not None}


class MasterSession(ABC):
    """A session with the institutions reachable through `transport` (see the module docstring)."""

    algorithm: str
    """The algorithm's canonical id (`fedcore.algorithms`)."""
    setting: str
    """Its setting, vertical or horizontal: with the id, the algorithm's registry entry."""
    params: TreeParams
    decision_threshold: float | str | None = None
    """Binary labels: predict the positive class at or above this probability (None: the most probable
    class, as 0.5 but ties to the first class); used at evaluation and stored with the version. AUTO: chosen
    by `evaluate` from the held-out curve (then the number, or None without a curve)."""
    evaluation: dict[str, Any] | None = None
    """After `evaluate`: what the held-out pictures draw from (`evaluation_entry`), no row's label."""

    def __init__(self, transport: Transport, progress: ProgressCallback | None = None) -> None:
        """`progress` is called as levels and tree batches complete (also settable later as `.progress`)."""
        self.transport = transport
        self.progress = progress
        self.facts = TrainingFacts()
        self._checkpoints: CheckpointStore | None = None

    @abstractmethod
    def prepare(self) -> Preparation:
        """Agree with the institutions which rows (vertical) or columns (horizontal) train, and a holdout."""

    @abstractmethod
    def train(self, checkpoints: str | os.PathLike | None = None, run_id: str | None = None) -> TrainingFacts:
        """Grow the forest; given `checkpoints` and `run_id`, checkpoint batches and resume a crashed run."""

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics, scored where the labels are; sets `evaluation` (confusion, binary curve)."""

    def _evaluate_header(self) -> dict[str, float]:
        """The `evaluate` header: the decision threshold when a number is set (AUTO: chosen afterwards)."""
        threshold = self.decision_threshold
        return {} if threshold is None or isinstance(threshold, str) else {"decision_threshold": threshold}

    @abstractmethod
    def master_tables(self) -> dict[str, pa.Table]:
        """The master's tables of the version to register."""

    @property
    @abstractmethod
    def privacy_mode(self) -> str:
        """The privacy mode the session trains under (`fedcore.algorithms`: none, paillier, ou, ldp...)."""

    @abstractmethod
    def manifest_entries(self) -> dict[str, Any]:
        """The setting's manifest fields: `parties` (with the model digests the master signs) and the rest."""

    @abstractmethod
    def load_model(self, registry: ModelRegistry, model_name: str, ref: str = "production") -> str:
        """Load a registered version (verified) at the master and every institution; returns the version."""

    @abstractmethod
    def predict(self, requester: str | None = None, run_id: str | None = None,
                until: datetime | None = None) -> Prediction:
        """Predict the institutions' new rows with the trained or loaded model.

        The institutions name the files they write (model, version, time), never the master. `run_id` (the
        flow run's) goes with the request: a sink replaces the rows an earlier attempt of that run delivered
        (`fedcore.data.delivery`). `until` (the run's scheduled time) ends a batch an institution's query
        selects by time (`fedcore.agents.batches`).
        """

    def agree_resume_point(self, store: CheckpointStore, run_id: str) -> int:
        """Agree after how many tree batches run `run_id` resumes, and tell every institution.

        Every institution reports which batches of the run it checkpointed (under the store's context); all
        resume after the last batch everyone, the master included, has. Returns that batch count.
        """
        header = {"run": run_id, "context": store.context}
        replies = self.transport.exchange({n: Message("resume_status", header) for n in self.institutions})
        done = [list(r.arrays["completed"].astype(int)) for r in replies.values()]
        resumed = resume_point(store.completed(), *done)
        self.transport.exchange({n: Message("resume", {"batches": resumed}) for n in self.institutions})
        self._checkpoints = store
        return resumed

    def drop_checkpoints(self) -> None:
        """Remove the run's checkpoints at the master and every institution (once its version is stored)."""
        if self._checkpoints is not None:
            self.transport.exchange({n: Message("drop_checkpoints") for n in self.institutions})
            self._checkpoints.drop()
            self._checkpoints = None

    @property
    def institutions(self) -> list[str]:
        """Names of the institutions in this session."""
        return self.transport.parties

    def model_digests(self) -> dict[str, str]:
        """Every institution's SHA-256 of the model file it will store, for the master to sign."""
        replies = self.transport.exchange({name: Message("model_digest") for name in self.institutions})
        return {name: str(reply.header["sha256"]) for name, reply in replies.items()}

    def store_at_institutions(self, model_name: str, version: str, manifest: dict) -> dict[str, str]:
        """Ask every institution to store its model under the master's version.

        If any cannot, those that did withdraw theirs again and the error is raised: a version is stored
        everywhere or nowhere.
        """
        header = {"model": model_name, "version": version, "manifest": json.dumps(manifest, default=str)}
        try:
            replies = self.transport.exchange({name: Message("store_model", header)
                                               for name in self.institutions})
        except FedForestError:
            self.withdraw_at_institutions(model_name, version)
            raise
        return {name: r.header["path"] for name, r in replies.items()}

    def withdraw_at_institutions(self, model_name: str, version: str) -> None:
        """Best effort: every institution that stored `version` takes it back (one unreachable is skipped)."""
        header = {"model": model_name, "version": version}
        for name in self.institutions:
            try:
                self.transport.exchange({name: Message("withdraw_model", header)})
            except FedForestError:
                log.warning("could not withdraw %s %s at %s", model_name, version, name)

    def close(self) -> None:
        """Tell the agents the session is over."""
        self.transport.exchange({name: Message("close") for name in self.institutions})


def prediction_header(run_id: str | None = None, until: datetime | None = None) -> dict[str, str]:
    """What a prediction request carries: the flow run's id and scheduled time (ISO 8601), when known."""
    header = {} if run_id is None else {"run": run_id}
    return header | ({} if until is None else {"until": until.isoformat()})


AUTO = "auto"
"""A decision threshold chosen on the held-out rows (`held_out_evaluation`)."""


def held_out_evaluation(metrics: dict[str, float], confusion: np.ndarray, classes: list[str],
                        curve: np.ndarray | None, threshold: float | str | None
                        ) -> tuple[dict[str, float], dict[str, Any], float | None]:
    """Metrics, the manifest's `evaluation` and the decision threshold of a classifier's held-out reply.

    `threshold` AUTO with a binary curve: the group threshold of the largest TPR - FPR (`youden_group`),
    with the confusion and its metrics (accuracy, F1, balanced accuracy, base rate) recomputed at it from the
    curve's counts (exact; chosen and scored on the same held-out rows, so slightly optimistic). AUTO
    without a curve: the most probable class (None). More than two classes: None whatever was configured
    (a threshold decides a binary label only; batch prediction ignores it there), so none is stored or shown.
    """
    if len(classes) != 2:
        threshold = None
    if threshold == AUTO:
        threshold = None
        if curve is not None:
            group = youden_group(curve)
            threshold, confusion = float(curve[group, 0]), confusion_at(curve, group)
            metrics = {**metrics, **confusion_metrics(confusion)}
    assert not isinstance(threshold, str), "a threshold is a number, AUTO or None"
    return metrics, evaluation_entry(confusion, classes, curve, threshold), threshold


def evaluation_entry(confusion: np.ndarray, classes: list[str], curve: np.ndarray | None,
                     threshold: float | None) -> dict[str, Any]:
    """The manifest's `evaluation`: held-out confusion counts, class names, binary curve table (or None)."""
    return {"classes": classes, "confusion": np.asarray(confusion, np.int64).tolist(),
            "curve": None if curve is None else np.asarray(curve, np.float64).tolist(),
            "decision_threshold": threshold}
