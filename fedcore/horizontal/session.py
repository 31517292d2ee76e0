"""The master's side of one horizontal session with real institutions.

It agrees the schema from the data contracts, trains (FET or PPD-ERT), evaluates on every institution's
held-out rows, stores the complete model everywhere, and lets each institution predict its own new rows
at home.

It implements `fedcore.session.MasterSession`: `prepare` is the schema agreement (`agree_schema`),
`predict` is every institution predicting its own rows (`predict_locally`).

Training can be checkpointed per tree batch and resumed after a crash, as in the vertical setting
(`train(checkpoints, run_id)`): the master keeps each finished batch's node records, each institution
its own per-batch state, and a restarted session resumes after the last batch all of them completed.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from datetime import datetime
from typing import Any, cast

import numpy as np
import yaml

from fedcore.algorithms import algorithm as find_algorithm
from fedcore.checkpoints import CheckpointStore
from fedcore.contracts.agreement import SharedSchema, shared_schema
from fedcore.contracts.model import parse_contract
from fedcore.curves import COLUMNS as CURVE_COLUMNS
from fedcore.curves import GRID, curve_metrics, pooled_groups
from fedcore.drift import reported_drift
from fedcore.errors import ArtifactError, ProtocolError
from fedcore.horizontal.boosting.master import HorizontalBoostingMaster
from fedcore.horizontal.contracts import declared_feature_ranges, declared_y_exponent, engine_schema
from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
from fedcore.horizontal.growth import ProgressCallback
from fedcore.horizontal.model import MODEL_TABLE, HorizontalForest
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import NOISY_ROW_COUNTS, check_bounded_depth
from fedcore.horizontal.ppdert.master import PPDERTMaster
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.metrics import confusion_metrics
from fedcore.models.artifacts import table_sha256
from fedcore.models.registry import ModelRegistry
from fedcore.privacy.accounting import DEFAULT_DELTA
from fedcore.privacy.settings import (
    DistributedDP,
    GlobalDP,
    LocalDP,
    PrivacySetting,
    SecureAggregation,
    parse_privacy,
)
from fedcore.protocol.messages import Message
from fedcore.session import (
    MasterSession,
    Prediction,
    Preparation,
    TrainingFacts,
    held_out_evaluation,
    prediction_header,
)
from fedcore.transport.base import Transport
from fedcore.trees.params import TreeParams

EngineMaster = FederatedExtraTreesMaster | PPDERTMaster | HorizontalBoostingMaster
"""The engines' masters a horizontal session drives (`HorizontalSession._make_master`)."""


class HorizontalSession(MasterSession):
    """Drives one horizontal session (see the module docstring)."""

    setting = "horizontal"
    secagg_note = "the master received only masked sums of branch counts"
    """What the privacy report says the master saw under `secagg`."""

    def __init__(self, transport: Transport, params: TreeParams, algorithm: str = "extra-trees",
                 privacy: PrivacySetting | str | dict | None = None, holdout_fraction: float = 0.2,
                 progress: ProgressCallback | None = None) -> None:
        """A master session over `transport` growing `algorithm` with `privacy` (default: the algorithm's).

        `privacy`: a parsed setting (a config's), or what `fedcore.privacy.settings.parse_privacy` reads.
        """
        super().__init__(transport, progress)
        self.params: TreeParams = params
        entry = find_algorithm(algorithm, "horizontal")
        self.algorithm = entry.id
        self.privacy: PrivacySetting = parse_privacy(privacy, entry, params.task)
        check_bounded_depth(self.privacy, params.max_depth)
        self.holdout_fraction = holdout_fraction
        self.schema: HorizontalSchema | None = None
        self.master: EngineMaster | None = None
        self.model: HorizontalForest | None = None
        self.rows: dict[str, dict] = {}
        self._low = self._high = np.zeros(0)
        self._y_exponents: dict[str, int | None] = {}  # regression: each contract's label range, as 2-powers

    def prepare(self) -> Preparation:
        """Agree the schema and set every institution up (`agree_schema`): the rows each keeps at home."""
        schema = self.agree_schema()
        table = [{"institution": name, "training rows": r["train_rows"], "held-out rows": r["holdout_rows"]}
                 for name, r in self.rows.items()]
        return Preparation("institution-rows",
                           f"{schema.n_features} agreed feature columns, label {schema.label!r}",
                           table, {"features": schema.n_features, "rows": self.rows,
                                   "train_rows": self.facts.train_rows,
                                   "holdout_rows": self.facts.holdout_rows})

    def agree_schema(self) -> HorizontalSchema:
        """Check that the institutions' contracts agree; send everyone the schema and the session setup.

        Every contract must declare the same columns, dtypes, categories and classes (ContractMismatch
        names the first difference).
        """
        replies = self.transport.exchange({name: Message("contract") for name in self.institutions})
        contracts = {name: parse_contract(yaml.safe_load(r.header["yaml"]),
                                          f"institution {name!r}'s contract")
                     for name, r in replies.items()}
        shared = shared_schema(contracts)
        self.schema = engine_schema(shared, self.params.task)
        self.privacy = self.privacy.for_classes(self.schema.n_classes)  # LDP "auto": the mechanism it runs
        self._y_exponents = {name: declared_y_exponent(contract) for name, contract in contracts.items()}
        header = {"schema": self.schema.to_dict(), "algorithm": self.algorithm,
                  "privacy": self.privacy.to_dict(),
                  "holdout": self.holdout_fraction, "holdout_seed": self.params.random_state,
                  "seed": self.params.random_state,
                  "k": self.params.n_candidate_features(self.schema.n_features)}
        header.update(self._engine_setup(shared))
        replies = self.transport.exchange({name: Message("setup", header) for name in self.institutions})
        self.rows = {name: dict(r.header) for name, r in replies.items()}
        hidden = self.privacy.mode in NOISY_ROW_COUNTS  # gdp, secagg-dp: a noisy count at hello, none here
        for name, r in self.rows.items():  # the bounds of every count the institution sends in training
            for field, what in (("train_rows", "training rows"), ("holdout_rows", "held-out rows")):
                value = r.get(field)
                if hidden and field == "train_rows":
                    if value is not None:
                        raise ProtocolError(f"institution {name!r} declared {value!r} training rows at "
                                            f"setup; under privacy {self.privacy.mode!r} no exact count is "
                                            "sent (a noisy one comes with hello)")
                    continue
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ProtocolError(f"institution {name!r} declared {value!r} {what} at setup; a row "
                                        "count is an integer >= 0")
        empty = [name for name, r in self.rows.items() if r["train_rows"] == 0]
        if empty:
            raise ProtocolError(f"institutions {empty} have no training rows; every institution needs at "
                                "least one")
        self.facts.train_rows = sum(r["train_rows"] or 0 for r in self.rows.values())
        self.facts.holdout_rows = sum(r["holdout_rows"] for r in self.rows.values())
        return self.schema

    def _engine_setup(self, shared: SharedSchema) -> dict[str, Any]:
        """The setup header's engine fields, from the agreed contracts `shared`; sets the domains it uses."""
        assert self.schema is not None, "agree_schema sets the schema first"
        if self.algorithm == "ppd-ert":
            self._low, self._high = self._domains(self.schema, declared_feature_ranges(shared))
            return {"low": self._low.tolist(), "high": self._high.tolist()}
        if self.privacy.mode in ("gdp", "ldp"):  # FET's DP modes: the master draws thresholds in them
            user = f"Federated Extra-Trees in privacy {self.privacy.mode!r}"
            self._low, self._high = self._domains(self.schema, declared_feature_ranges(shared, user))
        return {}

    def _domains(self, schema: HorizontalSchema,
                 ranges: dict[str, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
        low, high = schema.feature_domains()
        for j, column in enumerate(schema.columns):
            if not column.is_categorical:
                low[j], high[j] = ranges[column.name]
        return low, high

    def train(self, checkpoints: str | os.PathLike | None = None, run_id: str | None = None) -> TrainingFacts:
        """Grow the forest over the transport; every institution ends with the complete model (`.model`).

        With `checkpoints` (the master's checkpoint folder) and `run_id`, every completed tree batch is
        checkpointed at the master and at every institution; if this run was interrupted before, training
        resumes after the last batch all of them completed, and the forest is the same, byte for byte, as
        without the interruption (FET in every privacy mode, PPD-ERT with or without secure aggregation).
        """
        if self.schema is None:
            raise ProtocolError("agree_schema() must run before train()")
        rounds, sent = self.transport.stats.rounds, self.transport.stats.bytes
        started = time.perf_counter()
        self.master = self._make_master()
        # each institution's hello must declare the training rows it declared at setup (its counts' bound)
        if self.privacy.mode not in NOISY_ROW_COUNTS:  # gdp, secagg-dp: only the noisy counts of hello
            self.master.declared_rows = {name: int(r["train_rows"]) for name, r in self.rows.items()}
        self.model, resumed = self._fit(checkpoints, run_id)
        self.facts.seconds = time.perf_counter() - started
        self.facts.rounds = self.transport.stats.rounds - rounds
        self.facts.bytes = self.transport.stats.bytes - sent
        self.facts.nodes = int(self.model.n_nodes)
        self.facts.resumed_batches = resumed
        self.facts.privacy_ledgers = dict(self.master.ledgers)
        if self.privacy.mode in NOISY_ROW_COUNTS:  # the rows as the master knows them: noisy counts
            for name, rows in self.master.party_rows.items():
                self.rows[name]["train_rows"] = rows
            self.facts.train_rows = sum(self.master.party_rows.values())
        return self.facts

    def _make_master(self) -> EngineMaster:
        """The engine's master for the algorithm and privacy: PPD-ERT under secure aggregation, else FET."""
        assert self.schema is not None, "train() checks the schema is agreed first"
        assert isinstance(self.params, ExtraTreesParams), "the config parses params by its algorithm"
        if isinstance(self.privacy, (SecureAggregation, DistributedDP)):
            budget = self.privacy if isinstance(self.privacy, DistributedDP) else None
            return PPDERTMaster(self.transport, self.params, self.schema, low=self._low, high=self._high,
                                session_id=secrets.token_bytes(16), progress=self.progress,
                                thresholds=self.privacy.thresholds, n_cells=self.privacy.n_cells, dp=budget)
        ldp = self.privacy.ldp if isinstance(self.privacy, LocalDP) else None
        gdp = self.privacy if isinstance(self.privacy, GlobalDP) else None
        dp = self.privacy.mode in ("gdp", "ldp")
        master = FederatedExtraTreesMaster(self.transport, self.params, self.schema,
                                           privacy=self.privacy.mode, ldp=ldp,
                                           epsilon=gdp.epsilon if gdp else None,
                                           delta=gdp.delta if gdp else DEFAULT_DELTA,
                                           plan=gdp.plan if gdp else "splits",
                                           split_levels=gdp.split_levels if gdp else 0,
                                           low=self._low if dp else None,
                                           high=self._high if dp else None, progress=self.progress)
        # a regression party's hello may state no larger target than its contract's label range allows
        master.declared_y_exponent = dict(self._y_exponents)
        return master

    def _fit(self, checkpoints: str | os.PathLike | None, run_id: str | None) -> tuple[HorizontalForest, int]:
        """The trained model and the batches resumed from checkpoints (with `checkpoints` and `run_id`)."""
        master = self.master
        assert isinstance(master, (FederatedExtraTreesMaster, PPDERTMaster)), "a forest's master"
        if checkpoints is None or run_id is None:
            return master.fit(), 0
        # before `hello`: an institution restores its noise seed before it derives anything from it
        store = CheckpointStore(checkpoints, run_id, self._context())
        resumed = self.agree_resume_point(store, run_id)
        return master.fit(store, resumed), resumed

    def _context(self) -> str:
        """What a run's checkpoints are bound to.

        Parameters, algorithm, privacy settings, the agreed schema and domains, the institutions and their row
        counts (each institution adds a digest of its own rows).
        """
        privacy = self.privacy.to_dict()  # with the resolved defaults
        assert self.schema is not None, "train() checks the schema is agreed before binding checkpoints to it"
        text = json.dumps({"params": self.params.to_dict(), "algorithm": self.algorithm, "privacy": privacy,
                           "schema": self.schema.fingerprint(), "holdout": self.holdout_fraction,
                           "parties": self.institutions, "rows": self.rows,
                           "domains": [self._low.tolist(), self._high.tolist()]},
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def evaluate(self) -> dict[str, float]:
        """Metrics over all institutions' held-out rows, from the aggregates each computes at home.

        A binary label adds ROC AUC and average precision of the pooled curve groups (`curve_metrics`).
        """
        header = self._evaluate_header() if self.params.task == "classification" else {}
        replies = self.transport.exchange({name: Message("evaluate", header) for name in self.institutions})
        if self.params.task == "classification":
            confusion = cast(np.ndarray, sum(r.arrays["confusion"].astype(np.int64)
                                             for r in replies.values()))
            assert self.schema is not None and self.schema.classes is not None, "a classifier's agreed schema"
            curve = self._pooled_curve(replies)
            metrics, self.evaluation, self.decision_threshold = held_out_evaluation(
                confusion_metrics(confusion), confusion, [str(c) for c in self.schema.classes], curve,
                self.decision_threshold)
            log_loss_sum = float(sum(float(r.arrays["log_loss_sum"][0]) for r in replies.values()))
            rows = int(confusion.sum())
            ranked = curve_metrics(curve) if curve is not None else {}  # binary: of the pooled groups
            return {**metrics, **ranked, "log_loss": log_loss_sum / rows if rows else float("nan")}
        n, total, squares, sse, sae = cast(np.ndarray, sum(r.arrays["sums"] for r in replies.values()))
        variance = squares - total * total / n if n else 0.0
        return {"rmse": float(np.sqrt(sse / n)) if n else float("nan"),
                "r2": float(1 - sse / variance) if variance > 0 else float("nan"),
                "mae": float(sae / n) if n else float("nan")}

    def _pooled_curve(self, replies: dict[str, Message]) -> np.ndarray | None:
        """Two classes: the institutions' curve groups pooled (`fedcore.curves.pooled_groups`), else None.

        None also when an institution sent none, or the pooled held-out rows lack a class (no curve).
        """
        assert self.schema is not None, "a classifier's agreed schema"
        if self.schema.n_classes != 2 or any("curve" not in r.arrays for r in replies.values()):
            return None
        tables = []
        for name, reply in replies.items():
            table = np.asarray(reply.arrays["curve"], np.float64)
            shaped = table.ndim == 2 and table.shape[1] == len(CURVE_COLUMNS) and len(table) > 0
            edges = table[:, 0] * GRID if shaped else np.zeros(1)
            if not shaped or not np.all(np.isfinite(table[:, :3])) or np.any(table[:, 1:3] < 0) \
                    or np.any(table[:, 2] > table[:, 1]) or edges[-1] != 0 or np.any(np.diff(edges) >= 0) \
                    or not np.allclose(edges, np.rint(edges), rtol=0, atol=1e-9):
                raise ProtocolError(f"institution {name!r} sent a curve that is not groups of the "
                                    f"{GRID}-cell probability grid, highest first")
            tables.append(table)
        pooled = pooled_groups(tables)
        positives, rows = pooled[:, 2].sum(), pooled[:, 1].sum()
        return pooled if 0 < positives < rows else None

    def master_tables(self) -> dict:
        """The master's copy of the version: the complete forest (the same table every institution stores)."""
        if self.model is None:
            raise ProtocolError("nothing trained yet")
        return {MODEL_TABLE: self.model.to_table()}

    @property
    def privacy_mode(self) -> str:
        """The configured privacy mode: none, ldp, gdp or secagg."""
        return self.privacy.mode

    def manifest_entries(self) -> dict[str, Any]:
        """The privacy report, the agreed schema, and the parties with the model digests the master signs.

        Each institution comes with its row counts and the SHA-256 of the model file it will store (the
        same for all: it is the complete forest).
        """
        if self.schema is None:
            raise ProtocolError("nothing trained yet")
        digests = self.model_digests()
        mine = table_sha256(self.master_tables()[MODEL_TABLE])
        differ = [name for name, digest in digests.items() if digest != mine]
        if differ:
            raise ProtocolError(f"institutions {differ} hold a different forest than the master; refusing "
                                "to register")
        parties = [{"name": name, "role": "member", **self.rows.get(name, {}), "table_sha256": digests[name]}
                   for name in self.institutions]
        return {"privacy": self.privacy_report(), "schema": self.schema.to_dict(), "parties": parties,
                **self._model_entries()}

    def _model_entries(self) -> dict[str, Any]:
        """The manifest's facts of the model itself: the forest's impurity importances; GDP: its params.

        Under GDP the trees and depth that ran: plan auto may choose them (the depth after hello), and the
        card shows these.
        """
        assert self.model is not None and self.schema is not None, "a model is trained first"
        assert isinstance(self.params, ExtraTreesParams), "the config parses params by its algorithm"
        importances = self.model.importances(self.params.criterion, self.schema.n_features)
        entries: dict[str, Any] = {
            "importances": dict(zip(self.schema.names, map(float, importances), strict=True))}
        if isinstance(self.master, FederatedExtraTreesMaster) and self.master.gdp_plan is not None:
            entries["params"] = self.master.params.to_dict()
        return entries

    def privacy_report(self) -> dict[str, Any]:
        """What the master saw and, for the DP modes, the budget and every institution's stated ledger.

        `ledgers` (DP modes, after training): per institution, the ledger it stated with the model, checked
        against the agreed setting (`fedcore.horizontal.ledgers`).
        """
        mode = self.privacy.mode
        out: dict[str, Any] = {"mode": mode, "setting": self.privacy.to_dict()}
        if isinstance(self.privacy, GlobalDP):
            out.update({"epsilon_budget": self.privacy.epsilon, "delta": self.privacy.delta,
                        "note": "the model's whole budget, per row: each institution adds Gaussian noise "
                                "calibrated to it and keeps its own ledger, which refuses a release past it; "
                                "each states its plan's epsilon_total (the bound of every row's spend) with "
                                "the model, the busiest row's actual releases stay in its ledger; row counts "
                                "are noisy (the training rows here are those noisy counts)"})
            plan = getattr(self.master, "plan", None)
            if plan is not None:
                out["sigma"], out["planned_releases_per_row"] = plan.sigma, plan.releases
                # the plan that ran: plan auto may choose the trees and (after hello) the depth
                out["plan"] = self.master.plan_report()  # type: ignore[union-attr]
        if isinstance(self.privacy, LocalDP):
            out.update(self.privacy.budget())
        if mode == "secagg":
            out["note"] = self.secagg_note
        if isinstance(self.privacy, DistributedDP):
            out.update({"epsilon_budget": self.privacy.epsilon, "delta": self.privacy.delta,
                        "note": "the model's whole budget, per row, against the master: it received only "
                                "masked sums of branch counts, each institution's with discrete Gaussian "
                                "noise of 1/P of the variance, and noisy row counts (the training rows here "
                                "are those noisy counts); each institution states its ledger with the model, "
                                "which the master recomputes"})
            sums = getattr(self.master, "dp", None)
            if sums is not None and sums.planned:
                out["sigma"], out["planned_releases_per_row"] = sums.plan.sigma, sums.plan.releases
        if self.facts.privacy_ledgers:
            out["ledgers"] = self.facts.privacy_ledgers
        return out

    def load_model(self, registry: ModelRegistry, model_name: str, ref: str = "production") -> str:
        """Load a registered version (verified) at the master and every institution; returns the version."""
        version = registry.resolve(model_name, ref)
        manifest, tables = registry.load(model_name, version)
        if MODEL_TABLE not in tables:
            raise ArtifactError(f"model {model_name!r} {version}: no {MODEL_TABLE!r} table "
                                f"in {registry.root}")
        self.model = HorizontalForest.from_table(tables[MODEL_TABLE])
        self.schema = self.model.schema
        signed = {p["name"]: p.get("table_sha256") for p in manifest.get("parties") or []}
        missing = sorted(set(self.institutions) - set(signed))
        if missing:
            raise ProtocolError(f"model {model_name!r} {version} was not stored at {missing}")
        self.transport.exchange({name: Message("load_model", {"model": model_name, "version": version,
                                                              "table_sha256": signed[name]})
                                 for name in self.institutions})
        return version

    def predict(self, requester: str | None = None, run_id: str | None = None,
                until: datetime | None = None) -> Prediction:
        """Every institution predicts its own new rows (`predict_locally`); `requester` does not apply.

        `paths` lists the files as the institutions reported them (one without new rows writes none).
        """
        result = self.predict_locally(run_id, until)
        paths = {name: str(path) for name, path in result["paths"].items() if path is not None}
        return Prediction(rows=result["rows"], counts=result["counts"], seconds=result["seconds"],
                          paths=paths, drift=result["drift"])

    def predict_locally(self, run_id: str | None = None, until: datetime | None = None) -> dict:
        """Every institution predicts its own new rows with the complete model; predictions stay there.

        Each names its own file (model, version, time): the master names nothing that becomes a path. A
        `run_id` lets a sink replace what an earlier attempt of the run delivered; `until` ends a batch
        selected by time (`prediction_header`).
        """
        started = time.perf_counter()
        header = prediction_header(run_id, until)
        replies = self.transport.exchange({name: Message("predict_local", header)
                                           for name in self.institutions})
        counts = {name: int(r.header["rows"]) for name, r in replies.items()}
        paths = {name: r.header["path"] for name, r in replies.items()}
        drift = {name: d for name, r in replies.items() if (d := reported_drift(name, r.header))}
        return {"rows": sum(counts.values()), "counts": counts, "paths": paths,
                "seconds": time.perf_counter() - started, "drift": drift}
