"""The master's side of a vertical training session: align IDs, train, evaluate, store, predict.

It implements `fedcore.session.MasterSession`: each step is one method so that orchestration (Prefect
tasks in `tasks/`) can show, retry and time it; all of them talk to the institutions only through the
transport. `prepare` is ID alignment (`align`), `predict` is batch prediction for one requester
(`batch_predict`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from datetime import datetime
from typing import Any

import numpy as np

from fedcore.agents.checks import expected_holdout
from fedcore.algorithms import BOOSTING, FOREST
from fedcore.checkpoints import CheckpointStore
from fedcore.drift import reported_drift
from fedcore.errors import ArtifactError, ProtocolError
from fedcore.models.registry import ModelRegistry
from fedcore.models.tables import N_TREES_KEY, combination_from_table, master_table, structure_from_table
from fedcore.protocol.messages import Message, pack_bits, streamed_request
from fedcore.randomness import stream
from fedcore.session import (
    MasterSession,
    Prediction,
    Preparation,
    TrainingFacts,
    held_out_evaluation,
    prediction_header,
)
from fedcore.transport.base import Transport
from fedcore.trees.boosting import BoostingParams
from fedcore.trees.losses import loss_for
from fedcore.trees.params import ForestParams
from fedcore.vertical.alignment import AlignmentPlan, check_overlap, intersect_hashes, pairwise_overlaps
from fedcore.vertical.master import FederationInfo, ProgressCallback, VerticalMaster

log = logging.getLogger(__name__)
ALIGNMENTS = ("hash", "psi")
ALIGN_PART_ROWS = 1 << 19
"""Positions a part of an `align` request (4 MiB of int64): an agent on Dask reads them part by part."""
PSI_PART_ROWS = 1 << 17
"""Values a part of a `psi_reblind` request (4 MiB of 32-byte points), read part by part likewise."""


class VerticalSession(MasterSession):
    """Drives one session with the institutions reachable through `transport`."""

    setting = "vertical"

    def __init__(self, transport: Transport, params: ForestParams, holdout_fraction: float = 0.2,
                 min_overlap: int = 50, progress: ProgressCallback | None = None,
                 alignment: str = "hash") -> None:
        """A master session over `transport`, aligning the institutions' IDs by `alignment`.

        `alignment` is "hash" (keyed HMAC-SHA256 hashes, the default) or "psi" (ECDH private set intersection:
        the master sees only blinded values and no institution learns non-members).
        """
        super().__init__(transport, progress)
        if alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
        self.alignment = alignment
        self.params: ForestParams = params
        self.algorithm = (BOOSTING if isinstance(params, BoostingParams) else FOREST).id
        self._holdout_values: np.ndarray | None = None  # boosting's early stopping: each tree's, held out
        self._grown_trees: int | None = None  # boosting's early stopping: the trees grown before the cut
        self.holdout_fraction = holdout_fraction
        self.min_overlap = min_overlap
        self.master = VerticalMaster(transport, params, progress=progress)
        self.plan: AlignmentPlan | None = None
        self.fingerprints: dict[str, str] = {}
        """Per institution, a digest of its sorted keyed ID hashes: which rows trained the model."""

    def _hashes(self, kind: str, header: dict | None = None) -> dict[str, np.ndarray]:
        replies = self.transport.exchange({name: Message(kind, dict(header or {}))
                                           for name in self.institutions})
        return {name: r.arrays["hashes"].reshape(-1, 32).copy().view("S32").ravel()
                for name, r in replies.items()}

    def _intersect(self, batch: bool, explain_below: int = 1, until: datetime | None = None) -> AlignmentPlan:
        """The alignment plan of the training rows (or of the new batch), by keyed hashes or by ECDH PSI.

        Below `explain_below` common rows, the plan also has the pairwise overlaps (`check_overlap`). A new
        batch's request carries `until` (`prediction_header`).
        """
        header = prediction_header(until=until) if batch else {}
        if self.alignment == "psi":
            return self._psi_plan(batch, explain_below, header)
        hashes = self._hashes("batch_hashes" if batch else "id_hashes", header)
        if not batch:
            self.fingerprints = {name: hashlib.sha256(np.sort(h).tobytes()).hexdigest()[:16]
                                 for name, h in hashes.items()}
        return intersect_hashes(hashes, explain_below)

    def _psi_plan(self, batch: bool, explain_below: int = 1, header: dict | None = None) -> AlignmentPlan:
        """ECDH PSI through the master (`fedcore.privacy.psi`).

        Every institution blinds its IDs, each list is re-blinded once by every other institution in M - 1
        rounds, the master intersects the fully blinded lists. Positions index each institution's (secretly
        shuffled) sent list. Below `explain_below` common rows, the pairwise overlaps of the fully blinded
        lists are counted too.
        """
        names = self.institutions
        replies = self.transport.exchange({n: Message("psi_blinded", {"batch": batch, **(header or {})})
                                           for n in names})
        lists = {n: replies[n].arrays["blinded"].reshape(-1, 32) for n in names}
        counts = {n: len(v) for n, v in lists.items()}
        for shift in range(1, len(names)):
            route = {names[(i + shift) % len(names)]: owner for i, owner in enumerate(names)}
            replies = self.transport.exchange({  # an agent on Dask reads the values part by part (issue #29)
                holder: streamed_request("psi_reblind", {"rows": len(lists[owner])}, "values", lists[owner],
                                         {}, PSI_PART_ROWS)
                for holder, owner in route.items()})
            for holder, owner in route.items():
                lists[owner] = replies[holder].arrays["values"].reshape(-1, 32)
        from fedcore.privacy.psi import intersect_blinded

        positions = intersect_blinded(lists)
        if not batch:
            self.fingerprints = {n: "psi" for n in names}  # blinded values are fresh per session: no digest
        n_common = len(next(iter(positions.values())))
        pairwise = pairwise_overlaps(lists) if n_common < explain_below and len(names) > 2 else None
        return AlignmentPlan(n_common=n_common, counts=counts, positions=positions, pairwise=pairwise)

    def prepare(self) -> Preparation:
        """Align the institutions' IDs (`align`): the overlap and the rows each institution trains on."""
        plan = self.align()
        return Preparation("id-overlap", f"{plan.n_common} rows are held by every institution",
                           plan.overlap_table(), {"overlap": plan.n_common, "counts": dict(plan.counts),
                            "train_rows": self.facts.train_rows, "holdout_rows": self.facts.holdout_rows})

    def align(self) -> AlignmentPlan:
        """Intersect the institutions' IDs; each learns its own rows' order and the holdout."""
        self.plan = self._intersect(batch=False, explain_below=self.min_overlap)
        check_overlap(self.plan, self.min_overlap)
        rng = stream(self.params.random_state, "split", 0)
        n = self.plan.n_common
        holdout = np.zeros(n, dtype=np.uint8)
        holdout[rng.permutation(n)[: expected_holdout(n, self.holdout_fraction)]] = 1
        packed = pack_bits(holdout)
        replies = self.transport.exchange({  # an agent on Dask reads the positions part by part (issue #29)
            name: streamed_request("align", {"rows": n}, "positions", self.plan.positions[name],
                                   {"holdout": packed}, ALIGN_PART_ROWS)
            for name in self.institutions})
        first = next(iter(replies.values())).header
        self.facts.train_rows, self.facts.holdout_rows = int(first["train_rows"]), int(first["holdout_rows"])
        return self.plan

    def train(self, checkpoints: str | os.PathLike | None = None, run_id: str | None = None) -> TrainingFacts:
        """Grow the forest (Federated Forest protocol) on the aligned training rows.

        With `checkpoints` (the master's checkpoint folder) and `run_id`, every completed tree batch is
        checkpointed at the master and at every institution; if this run was interrupted before, training
        resumes after the last batch all of them completed, and the forest is the same as without the
        interruption.
        """
        before = (self.transport.stats.rounds, self.transport.stats.bytes)
        started = time.perf_counter()
        self.master.progress = self.progress
        if checkpoints is None or run_id is None:
            self.master.fit()
        else:
            self.master.setup()
            store = CheckpointStore(checkpoints, run_id, self._context())
            self.facts.resumed_batches = self.agree_resume_point(store, run_id)
            self.master.fit(store, self.facts.resumed_batches)
        if isinstance(self.params, BoostingParams) and self.params.early_stopping_rounds is not None:
            self._stop_early(self.params.early_stopping_rounds)
        self.facts.seconds = time.perf_counter() - started
        self.facts.rounds = self.transport.stats.rounds - before[0]
        self.facts.bytes = self.transport.stats.bytes - before[1]
        owners = self.master.trained_structure.owner
        self.facts.owned_nodes = {name: int((owners == i).sum()) for i, name in enumerate(self.institutions)}
        self.facts.nodes = int(self.master.trained_structure.n_nodes)
        return self.facts

    def _stop_early(self, patience: int) -> None:
        """Boosting: keep the rounds up to the best on the label holder's held-out rows (XGBoost's rule).

        The held-out rows are predicted once, tree by tree; the label holder scores every prefix of rounds
        and answers how many to keep; the master and every institution cut the model there, and `evaluate`
        combines the kept trees' values already predicted.
        """
        self._grown_trees = self.master.trained_structure.n_trees
        if not self.facts.holdout_rows:
            return
        self.transport.exchange({name: Message("load_holdout") for name in self.institutions})
        values = self.master.tree_values(self.facts.holdout_rows)
        holder = self.master.federation.label_holder
        reply = self.transport.exchange({holder: Message("score_rounds", {"patience": patience},
                                                         {"values": values})})[holder]
        rounds = reply.header.int("rounds")
        k = self.master.combination.trees_per_round
        if not 1 <= rounds * k <= values.shape[1]:
            raise ProtocolError(f"the label holder keeps {rounds} rounds of {values.shape[1] // k}")
        self.master.keep_trees(rounds * k)
        self.transport.exchange({name: _keep_trees(rounds * k, self.master.kept_shares(name))
                                 for name in self.institutions})
        self._holdout_values = values[:, :rounds * k]

    def _context(self) -> str:
        """What a run's checkpoints are bound to: parameters, parties, their features and the aligned rows."""
        info = self.master.federation
        text = json.dumps({"params": self.params.to_dict(), "parties": info.parties, "rows": info.n_rows,
                           "features": list(map(str, info.feature_ids)),
                           "owners": info.feature_owner.tolist(),
                           "positions": {n: hashlib.sha256(np.asarray(p).tobytes()).hexdigest()
                                         for n, p in (self.plan.positions if self.plan else {}).items()}},
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def evaluate(self) -> dict[str, float]:
        """Predict the held-out rows (one round) and let the label holder score them."""
        if not self.facts.holdout_rows:
            return {}
        if self._holdout_values is not None:  # predicted for early stopping: the kept trees' values
            values = self.master.combination.combine(self._holdout_values[:, :, None])
        else:
            self.transport.exchange({name: Message("load_holdout") for name in self.institutions})
            values = self.master.predict_values(self.facts.holdout_rows)
        holder = self.master.federation.label_holder
        reply = self.transport.exchange({holder: Message("evaluate", self._evaluate_header(),
                                                         {"values": values})})[holder]
        metrics = dict(reply.header["metrics"])
        if "confusion" in reply.arrays:  # a classifier's: the label holder's class codes name the classes
            confusion = reply.arrays["confusion"]
            metrics, self.evaluation, self.decision_threshold = held_out_evaluation(
                metrics, confusion, [f"class {k}" for k in range(len(confusion))], reply.arrays.get("curve"),
                self.decision_threshold)
        return metrics

    def master_tables(self) -> dict:
        """The master's part of the model version: its structure table."""
        if self.master.structure is None:
            raise ProtocolError("nothing trained yet")
        return {"master": master_table(self.master.structure, self.master.combination)}

    @property
    def privacy_mode(self) -> str:
        """The label protection of the parameters: none, paillier or ou."""
        return self.params.privacy

    def manifest_entries(self) -> dict[str, Any]:
        """The manifest's "parties", the ID overlap and the data fingerprints.

        Each party entry has the institution's role, feature count, split nodes it owns, its share of the
        forest's impurity importance (the sum of its features', `fedcore.vertical.importances`) and the
        SHA-256 of the partial model it will store, so the master's signature covers every party's file.
        """
        info, digests = self.master.federation, self.model_digests()
        shares = self.master.party_importance_shares()  # each party's share only: features stay at home
        parties = [{"name": name, "role": "label_holder" if name == info.label_holder else "passive",
                    "table_sha256": digests[name], "feature_count": int((info.feature_owner == i).sum()),
                    "owned_nodes": self.facts.owned_nodes.get(name, 0),
                    **({"importance_share": shares[name]} if name in shares else {})}
                   for i, name in enumerate(info.parties)]
        overlap = self.plan.n_common if self.plan is not None else 0
        entries: dict[str, Any] = {"parties": parties, "training": {"overlap": overlap},
                                   "lineage": {"data_fingerprints": self.fingerprints}}
        if isinstance(self.params, BoostingParams):
            entries["boosting"] = self._boosting_entry()
        return entries

    def _boosting_entry(self) -> dict[str, Any]:
        """Boosting's facts for the manifest and card: rounds grown and kept, learning rate, loss, base."""
        p, c, info = self.params, self.master.combination, self.master.federation
        assert isinstance(p, BoostingParams), "only a boosting session has boosting facts"
        n_trees = self.master.trained_structure.n_trees
        loss = loss_for(p.task, info.n_classes).name
        return p.manifest_entry(c, n_trees, self._grown_trees or n_trees, loss)

    def load_model(self, registry: ModelRegistry, model_name: str, ref: str = "production") -> str:
        """Load a registered version (verified) at the master and at every institution; returns the version.

        This lets the master batch predict without training; the version returned is the resolved one.
        """
        version = registry.resolve(model_name, ref)
        manifest, tables = registry.load(model_name, version)
        if "master" not in tables:
            raise ArtifactError(f"model {model_name!r} {version}: no master table in {registry.root}")
        table = tables["master"]
        raw = (table.schema.metadata or {}).get(N_TREES_KEY)
        n_trees = int(raw) if raw is not None else int((manifest.get("params") or {})["n_estimators"])
        parties = [p["name"] for p in manifest.get("parties") or []]
        holders = [p["name"] for p in manifest.get("parties") or [] if p.get("role") == "label_holder"]
        if sorted(parties) != sorted(self.institutions) or len(holders) != 1:
            raise ProtocolError(f"model {model_name!r} {version} was trained by {parties} (label holder "
                                f"{holders}); this session has {sorted(self.institutions)}")
        structure = structure_from_table(table, n_trees)
        self.master.structure = structure
        self.master.combination = combination = combination_from_table(table)
        n_classes = structure.value.shape[1] if manifest.get("task") == "classification" else 0
        if combination.kind == "sum" and manifest.get("task") == "classification":  # one margin a class
            n_classes = max(2, combination.trees_per_round)
        self.master.info = FederationInfo(parties=parties, label_holder=holders[0], n_rows=0,
                                          n_classes=n_classes, feature_ids=[],
                                          feature_owner=np.zeros(0, np.int64))
        signed = {p["name"]: p.get("table_sha256") for p in manifest.get("parties") or []}
        self.transport.exchange({name: Message("load_model", {"model": model_name, "version": version,
                                                              "table_sha256": signed[name]})
                                 for name in self.institutions})
        return version

    def predict(self, requester: str | None = None, run_id: str | None = None,
                until: datetime | None = None) -> Prediction:
        """Batch prediction (`batch_predict`): only `requester` receives the predictions, with IDs."""
        if requester is None:
            raise ProtocolError("vertical prediction delivers to one institution: name the requester")
        result = self.batch_predict(requester, run_id=run_id, until=until)
        return Prediction(rows=result["rows"], counts=result["counts"], seconds=result["seconds"],
                          requester=requester, paths={requester: str(result["path"])}, drift=result["drift"])

    def batch_predict(self, requester: str, min_overlap: int = 1, run_id: str | None = None,
                      until: datetime | None = None) -> dict:
        """Align the institutions' new batches, predict them in one round per row batch, and deliver them.

        The predictions (with IDs) go to `requester` only, which names the file they are written to (a
        sink replaces what an earlier attempt of run `run_id` delivered; `until` ends a batch selected by
        time).
        """
        started = time.perf_counter()
        plan = self._intersect(batch=True, explain_below=min_overlap, until=until)
        check_overlap(plan, min_overlap)
        aligned = self.transport.exchange({  # an agent on Dask reads the positions part by part (issue #29)
            name: streamed_request("align_batch", {"rows": plan.n_common}, "positions", plan.positions[name],
                                   {}, ALIGN_PART_ROWS)
            for name in self.institutions})
        drift = {name: d for name, r in aligned.items() if (d := reported_drift(name, r.header))}
        values = self.master.predict_values(plan.n_common)
        header = prediction_header(run_id)
        reply = self.transport.exchange({requester: Message("deliver_predictions", header,
                                                            {"values": values})})[requester]
        return {"rows": plan.n_common, "counts": dict(plan.counts), "path": reply.header["path"],
                "seconds": time.perf_counter() - started, "requester": requester, "drift": drift}


def _keep_trees(n_trees: int, shares: tuple[np.ndarray, int] | None) -> Message:
    """The `keep_trees` message to one party: with its own splits' importance shares over the kept trees."""
    if shares is None:
        return Message("keep_trees", {"n_trees": n_trees})
    return Message("keep_trees", {"n_trees": n_trees, "splitting_trees": shares[1]},
                   {"importance": shares[0]})
