"""An institution's agent in a horizontal federation.

It answers the master's session messages around the Federated Extra-Trees / PPD-ERT protocol and keeps
its rows, labels and predictions at home.

Session messages, as `kind` (what the master sends): what the institution answers. The engine's own
messages go to the party, see `fet/party.py` and `ppdert/party.py`.

- `validation_report`: pass/fail and counts per expectation of its data contract (session start).
- `contract`: its data contract (a consortium document, no data) for the master to check agreement.
- `setup` (the agreed schema, algorithm, privacy setting and parameters, holdout fraction and seed): its
  training and holdout row counts.
- `evaluate`: on its own held-out rows, the confusion matrix, or (n, sum y, sum y^2, squared error).
- `model_digest` / `store_model` / `withdraw_model` / `load_model` (as in the vertical setting): the
  complete model, stored (or loaded) in its own registry, checked against the master's signature.
- `predict_local` (the flow run's id, optional): it predicts its own new rows and writes them, with its
  IDs, at home (a file it names, or its database table: a retry of the run replaces its rows); answers
  the row count.
- `resume_status` (run id and the master's checkpoint context): the tree batches it has checkpointed
  for that run.
- `resume` (how many batches the run resumes after): it restores its state after the last of them.
- `drop_checkpoints`: it removes the run's checkpoints (the version is stored).
- `close`: ack.

Checkpoints (crash recovery) live under `<its registry>/.checkpoints/<run id>`, bound to the master's
context digest plus a digest of this institution's own training rows, so changed data starts the run
over. A horizontal party holds no tree state between batches (it receives the complete model at the
end), so a batch checkpoint is small: which batch is done, and the party's noise counters (queries
answered, LDP reports per row, the gdp ledger's releases per row and queries). In the DP modes (gdp, ldp)
the party's secret noise seed is kept once per run under `.checkpoints/.noise-seeds/<run id>` and reused by
every attempt of that run: a batch grown again after a crash gets the same noisy answers as before, so
resuming repeats no query with fresh noise, and the resumed forest is the uninterrupted one. The seed
never leaves the institution.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import shutil
import time
import zlib
from collections.abc import Callable
from datetime import datetime

import numpy as np
import pandas as pd

from fedcore.agents.base import SessionAgent, session_headers
from fedcore.agents.batches import requested_until
from fedcore.agents.checks import decision_threshold
from fedcore.agents.data import InstitutionData
from fedcore.agents.scoring import evaluation_reply, holdout_statistics, prediction_frame
from fedcore.agents.storage import (
    load_signed_table,
    new_prediction_folder,
    place_parts,
    run_id,
    signed_manifest,
    store_signed_table,
    write_predictions,
)
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.checkpoints import CHECKPOINTS, CheckpointStore
from fedcore.drift import training_snapshot
from fedcore.errors import ContractMismatch, DataWriteError, ParameterError, ProtocolError
from fedcore.horizontal.boosting.party import HorizontalBoostingParty
from fedcore.horizontal.domains import checked_domains
from fedcore.horizontal.fet.party import HorizontalParty
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.plan import NOISY_ROW_COUNTS
from fedcore.horizontal.ppdert.noise import DistributedNoise
from fedcore.horizontal.ppdert.party import PPDERTParty
from fedcore.horizontal.rows import PartyRows
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.models.artifacts import table_sha256
from fedcore.privacy.keyauth import PartyIdentity
from fedcore.privacy.settings import (
    DistributedDP,
    GlobalDP,
    LocalDP,
    PrivacySetting,
    SecureAggregation,
    parse_privacy,
)
from fedcore.protocol.messages import Header, Message

log = logging.getLogger(__name__)

MODEL_STEM = "model"
"""Every institution stores the same complete forest as `model.arrow`."""
ENGINE_KINDS = {"hello", "fet_ranges", "fet_stats", "fet_split", "fet_leaves", "ppdert_level", "ppdert_cells",
                "ppdert_counts", "model"}
SESSION_HEADERS = session_headers(contract=(), predict_local=("run", "until"))
"""The header fields of each session message but `setup` (`SessionAgent.session_headers`)."""
NOISE_SEEDS = ".noise-seeds"
"""Folder under the checkpoints for the DP modes' noise seeds (a leading dot: never a run id)."""
NOISY = ("gdp", "ldp", "secagg-dp")


class HorizontalInstitutionAgent(SessionAgent[HorizontalParty | PPDERTParty | HorizontalBoostingParty]):
    """Answers one institution's side of horizontal sessions (see the module docstring)."""

    engine_kinds = frozenset(ENGINE_KINDS)
    not_ready = "no setup yet"
    session_headers = SESSION_HEADERS

    def __init__(self, data: InstitutionData | Callable[[], InstitutionData], name: str = "",
                 identity: PartyIdentity | None = None) -> None:
        """An agent for `data`, or for a loader called afresh at every session start.

        With a loader, a long-lived agent trains on its data as it is then. `identity` signs the
        institution's PPD-ERT secure-aggregation keys and checks its peers' (`fedcore.privacy.keyauth`; an
        agent server uses its mutual-TLS certificate and key).
        """
        super().__init__(data, name)
        self.identity = identity
        self.party: HorizontalParty | PPDERTParty | HorizontalBoostingParty | None = None
        self.model: HorizontalForest | None = None
        self.schema: HorizontalSchema | None = None
        self._holdout: pd.DataFrame | None = None
        self._held: list[np.ndarray] | None = None  # on Dask: each block's held-out rows, packed bits
        self._checkpoints: CheckpointStore | None = None
        self._seeds: CheckpointStore | None = None
        self._trained = False  # the model was trained in this session (its `model` message), not loaded

    def _engine_reply(self, message: Message) -> Message:
        party = self._require_party(message.kind)
        reply = party.handle(message)
        if message.kind == "model":
            self.model, self._trained = party.model, True
        return reply

    def _batch_checkpoint(self) -> dict[str, np.ndarray]:
        return self._party_state()

    # -- session start ----------------------------------------------------------------------------------
    def _start_session(self) -> None:
        self.model, self._holdout, self._held, self._seeds, self._trained = None, None, None, None, False

    def _on_contract(self, message: Message) -> Message:
        from fedcore.contracts.model import dump_contract

        if self.data.contract is None:
            raise ProtocolError(f"institution {self.name!r} has no data contract; a horizontal federation "
                                "agrees its schema through the contracts, so configure one")
        return Message("contract", {"yaml": dump_contract(self.data.contract)})

    def _on_setup(self, message: Message) -> Message:
        """Build the party on this institution's training rows; hold out a seeded share for evaluation."""
        if not self.data.valid:
            raise ProtocolError(f"institution {self.name!r}: its data failed validation; it takes no part "
                                "in training")
        h = message.header
        if "setup" in self._done:
            raise ProtocolError(f"institution {self.name!r} refuses a second 'setup' in this session: it is "
                                "answered once per session")
        self.schema = HorizontalSchema.received(h)
        self._check_schema(self.schema)
        rng = np.random.default_rng(np.random.SeedSequence(h.int("holdout_seed"),
                                                           spawn_key=(zlib.crc32(self.name.encode()),)))
        fraction = h.number("holdout")
        if self.data.holdout is not None and fraction != self.data.holdout:
            raise ProtocolError(f"institution {self.name!r}: the master holds out {fraction:g} of the rows; "
                                f"this institution's training.holdout is {self.data.holdout:g}")
        privacy = self._privacy(h)
        if self.party is not None:
            self.party.rows.close()  # the last session's rows (on a cluster: its blocks)
        if self.data.table is not None:  # on the workers: the agent holds each block's packed holdout mask
            rows, n_train, n_held = self._rows_on_workers(rng, fraction)
        else:
            frame = self.data.frame.drop(columns=[self.data.id_column])
            held = rng.random(len(frame)) < fraction
            train, self._holdout = frame[~held].reset_index(drop=True), frame[held].reset_index(drop=True)
            rows, n_train, n_held = self._rows(train), len(train), len(self._holdout)
        self.party = self._make_party(h, privacy, self.schema, rows)
        if privacy.mode in NOISY_ROW_COUNTS:  # no exact count leaves: a noisy one in hello
            n_train = None  # type: ignore[assignment]
        self._done.add("setup")  # a refused setup may be corrected; one that answered is final
        return Message("ready", {"train_rows": n_train, "holdout_rows": n_held})

    def _make_party(self, h: Header, privacy: PrivacySetting, schema: HorizontalSchema,
                    rows: dict) -> HorizontalParty | PPDERTParty | HorizontalBoostingParty:
        """The engine's party for the master's setup `h`: PPD-ERT under secure aggregation, else FET."""
        if isinstance(privacy, (SecureAggregation, DistributedDP)):
            noise = None
            if isinstance(privacy, DistributedDP):  # its own budget, a local secret seed
                noise = DistributedNoise(self.name, privacy.epsilon, privacy.delta, secrets.randbits(63))
            low, high = self._master_domains(h, schema)
            return PPDERTParty(self.name, schema=schema, seed=h.int("seed"), low=low, high=high,
                               k=h.int("k"), identity=self.identity, memory_budget=self.data.memory_budget,
                               thresholds=privacy.thresholds, n_cells=privacy.n_cells, noise=noise,
                               expected_parties=self.data.federation_size, **rows)
        budget = privacy if isinstance(privacy, GlobalDP) else GlobalDP()  # gdp: its own budget
        return HorizontalParty(self.name, schema=schema, privacy=privacy.mode, epsilon=budget.epsilon,
                               delta=budget.delta, ldp=privacy.ldp if isinstance(privacy, LocalDP) else None,
                               memory_budget=self.data.memory_budget, **rows)

    def _master_domains(self, h: Header, schema: HorizontalSchema) -> tuple[np.ndarray, np.ndarray]:
        """The setup's per-feature domains (PPD-ERT's cells, boosting's bins), checked (`checked_domains`).

        An honest master sends finite numbers, the categories' codes, and domains holding this institution's
        declared ranges (the hull over every contract); anything else is refused before training.
        """
        low, high = h.numbers("low", schema.n_features), h.numbers("high", schema.n_features)
        declared = None
        if self.data.contract is not None:
            from fedcore.contracts.agreement import shared_schema
            from fedcore.horizontal.contracts import declared_feature_ranges

            try:
                declared = declared_feature_ranges(shared_schema({self.name: self.data.contract}))
            except ContractMismatch as error:
                raise ProtocolError(f"institution {self.name!r}: {error}") from None
        return checked_domains(self.name, schema, low, high, declared)

    def _rows(self, train: pd.DataFrame) -> dict:
        """The party's rows as its constructor takes them: in process, or on this institution's Dask cluster.

        The cluster is the institution's own choice (`compute:` in its config, never the master's): this
        process's one cluster for it (`shared_cluster`), which gets the training rows in blocks.
        """
        compute = self.data.compute
        if compute is None:
            return {"frame": train}
        from fedcore.compute.cluster import shared_cluster
        from fedcore.compute.dask_rows import DaskPartyRows
        from fedcore.compute.level_clock import n_workers

        client = (self.data.cluster or shared_cluster(compute)).client
        assert self.schema is not None, "setup sets the schema first"
        rows = DaskPartyRows.from_frame(self.name, train, self.schema, client, compute.block_rows)
        log.info("institution %r: %d training rows in %d blocks on %d Dask worker(s)", self.name, rows.n_rows,
                 len(rows.blocks), n_workers(client))
        return {"frame": None, "rows": rows}

    def _rows_on_workers(self, rng: np.random.Generator, fraction: float) -> tuple[dict, int, int]:
        """The party's rows when the workers read the table: each block keeps its training rows.

        The holdout mask is drawn here block by block (the in-process mask's stream) and kept packed, one
        per block, for `evaluate`; the held-out rows stay in the files, read again by the workers then.
        """
        from fedcore.compute.dask_rows import DaskPartyRows
        from fedcore.compute.dask_table import count_bits, holdout_masks, invert_masks

        table, cluster = self.data.table, self.data.cluster
        assert table is not None and cluster is not None and self.schema is not None, "setup on Dask"
        self._held = holdout_masks(rng, table.blocks, fraction)
        keep = invert_masks(self._held, table.blocks)
        rows = DaskPartyRows.from_parquet_kept(self.name, table, keep, self.schema, cluster.client)
        n_held = count_bits(self._held, table.blocks)
        log.info("institution %r: %d training rows in %d blocks read by the Dask workers, %d held out",
                 self.name, rows.n_rows, len(rows.blocks), n_held)
        return {"frame": None, "rows": rows}, rows.n_rows, n_held

    def _check_schema(self, schema: HorizontalSchema) -> None:
        """Refuse a schema other than the one this institution's own data contract gives.

        A master may not choose the label, the columns, the categories, the classes or the task: encoding
        this institution's rows with a schema of the master's making would answer with what they hold.
        Without a contract (in-process use) the master's schema is taken.
        """
        contract = self.data.contract
        if contract is None:
            return
        from fedcore.contracts.agreement import shared_schema
        from fedcore.horizontal.contracts import engine_schema

        task = "classification" if contract.label is not None and contract.label.classes else "regression"
        own = engine_schema(shared_schema({self.name: contract}), task)
        if schema.fingerprint() != own.fingerprint():
            raise ProtocolError(f"institution {self.name!r}: the master's schema is not the one its data "
                                "contract gives (label, columns, categories, classes or task differ); "
                                "refusing to set up")

    def _privacy(self, h: Header) -> PrivacySetting:
        """The privacy setting this institution trains with (`fedcore.privacy.settings`).

        Its own configuration's when it has one: a master whose setup asks for any other (less noise, no
        noise, other thresholds) is refused before any row is touched. Else (in-process use) the master's.
        Both are read by the one parser, for the algorithm the master names, and resolved for the agreed
        classes (LDP "auto"), so a master and an institution with "auto" agree.
        """
        assert self.schema is not None, "setup reads the schema before the privacy setting"
        n_classes, task = self.schema.n_classes, self.schema.task
        try:
            entry = find_algorithm(str(h.get("algorithm")), "horizontal")
            asked = parse_privacy(h.get("privacy"), entry, task).for_classes(n_classes)
        except ParameterError as error:
            raise ProtocolError(f"institution {self.name!r}: the master's setup asks for no usable privacy "
                                f"setting ({error}); refusing to train") from None
        if self.data.privacy is None:
            return asked
        try:
            own = parse_privacy(self.data.privacy, entry, task).for_classes(n_classes)
        except ParameterError as error:
            raise ProtocolError(f"institution {self.name!r}: its own privacy configuration, read for the "
                                f"algorithm {h['algorithm']!r} the master asks for, is refused ({error}); "
                                "refusing to train") from None
        if own != asked:
            said, says = asked.describe(), own.describe()
            if said == says:  # they differ in a field the short form leaves out
                said, says = str(asked.to_dict()), str(own.to_dict())
            raise ProtocolError(f"institution {self.name!r}: the master asks for privacy {said}, but this "
                                f"institution's configuration says {says}; refusing to train")
        return own

    # -- after training -----------------------------------------------------------------------------------
    def _require_model(self) -> HorizontalForest:
        if self.model is None:
            raise ProtocolError(f"institution {self.name!r} holds no model yet (train or load_model first)")
        return self.model

    def _on_evaluate(self, message: Message) -> Message:
        """Aggregates of the model's errors on this institution's held-out rows; the master sums them.

        Once per session, on the model trained in it (not one loaded, which has no held-out rows here):
        repeated answers about models the master varies would be an oracle for single held-out labels.
        """
        model, schema = self._require_model(), self.schema
        assert schema is not None, "setup or load_model set the schema before any model exists"
        if (self._holdout is None and self._held is None) or not self._trained:
            raise ProtocolError(f"institution {self.name!r}: 'evaluate' scores only the model trained in "
                                "this session")
        threshold = decision_threshold(message) if schema.task == "classification" else None
        self._once(message.kind)
        if self._held is not None:  # on the workers, block by block
            from fedcore.compute.dask_predict import evaluate_blocks

            assert self.data.table is not None and self.data.cluster is not None, "held out on Dask"
            statistics = evaluate_blocks(self.data.cluster.client, self.data.table, self._held, model, schema,
                                         threshold)
        else:
            assert self._holdout is not None
            statistics = holdout_statistics(model, schema, self._holdout, threshold)
        return evaluation_reply(schema, statistics)

    def _on_model_digest(self, message: Message) -> Message:
        return Message("model_digest", {"sha256": table_sha256(self._require_model().to_table())})

    def _on_store_model(self, message: Message) -> Message:
        extra: dict = {}
        self._keep_snapshot(self._training_snapshot(), extra)
        path = store_signed_table(self.data, message.header, MODEL_STEM, self._require_model().to_table(),
                                  extra)
        self._stored_version(message.header, signed_manifest(message.header))
        return Message("stored", {"path": path})

    def _training_snapshot(self) -> dict | None:
        """The drift snapshot of this session's training rows, from the party's encoded rows.

        In process or on the workers: the same snapshot (`fedcore.compute.dask_drift`). None for a model not
        trained here.
        """
        schema, party = self.schema, self.party
        if schema is None or party is None:
            return None
        if isinstance(party.rows, PartyRows):
            return training_snapshot(schema.decode(party.rows.X))
        from fedcore.compute.dask_drift import encoded_snapshot
        from fedcore.compute.dask_rows import DaskPartyRows

        rows = party.rows
        if not isinstance(rows, DaskPartyRows):
            return None
        return encoded_snapshot(rows.client, rows.data, [b.n_rows for b in rows.blocks], schema)

    def _on_load_model(self, message: Message) -> Message:
        """Take the complete model of a registered version from this institution's own registry."""
        manifest, table = load_signed_table(self.data, message.header, MODEL_STEM)
        self.model = HorizontalForest.from_table(table)
        self.snapshot = manifest.get("drift")
        self.schema = self.model.schema
        self._holdout, self._held, self._trained = None, None, False
        self._model_version(message.header, manifest.get("master_manifest") or {})
        return Message("loaded", {"version": message.header["version"], "nodes": self.model.n_nodes})

    def _on_predict_local(self, message: Message) -> Message:
        """Predict this institution's new rows with the complete model; the predictions stay here."""
        run, until = run_id(self.name, message.header), requested_until(self.name, message.header)
        model, schema = self._require_model(), self.schema
        assert schema is not None, "setup or load_model set the schema before any model exists"
        self._once(message.kind)  # one file per model version: a master cannot fill the disk with copies
        if self.data.open_batch is not None:  # its workers read, predict and score drift per block
            return self._predict_on_workers(model, schema, run, until)
        if self.data.load_batch is None:
            return Message("predicted", {"rows": 0, "path": None, "seconds": 0.0, **self._drift_reply(None)})
        started, target = time.perf_counter(), self._prediction_target()
        batch = self.data.new_batch(until, target)
        drift = self._batch_drift(batch)  # its features against its training rows, before predicting
        out = prediction_frame(model, schema, batch, self.data.id_column, self.decision_threshold)
        path = write_predictions(self.data, out, target, run, until)
        return Message("predicted", {"rows": len(out), "path": str(path),
                                     "seconds": time.perf_counter() - started, **drift})

    def _predict_on_workers(self, model: HorizontalForest, schema: HorizontalSchema, run: str | None,
                            until: datetime | None) -> Message:
        """The workers read, predict and write the new rows' blocks into a temporary folder, a part each.

        The folder is renamed into a predictions dataset folder, or delivered into the sink (`place_parts`).
        A query that selects batches by time is cut into the blocks of the batch scheduled at `until`.
        """
        from fedcore.compute.dask_predict import predict_blocks

        started = time.perf_counter()
        assert self.data.cluster is not None, "prediction data on Dask"
        target = self._prediction_target()
        table = self.data.open_new_batch(until, target)
        tmp, path = new_prediction_folder(self.data, target)
        try:
            rows, scores = predict_blocks(self.data.cluster.client, table, model, schema, self.data.id_column,
                                          tmp, self.decision_threshold, self.snapshot)
            drift = self._drift_reply(scores)  # drift.on_drift fail: refused before any part is placed
            written = len(list(tmp.glob("part-*.parquet")))
            if written != len(table.blocks):  # the workers wrote on a disk this agent does not see
                raise DataWriteError(f"institution {self.name!r}: the Dask workers wrote {written} of "
                                     f"{len(table.blocks)} prediction parts into {str(tmp)!r} as this agent "
                                     "sees it: the workers must see the institution's predictions folder at "
                                     "the same path (a shared file system)")
            where = place_parts(self.data, tmp, path, rows, target, run, until)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # no half dataset left behind, under any name
            raise
        log.info("%s: the Dask workers predicted %d rows in %d parts, now in %s", self.name, rows,
                 len(table.blocks), where)
        seconds = time.perf_counter() - started
        return Message("predicted", {"rows": rows, "path": str(where), "seconds": seconds,
                                     **drift})

    # -- checkpoints (resuming a run after a crash) ------------------------------------------------------
    def _checkpointed_party(self, kind: str) -> HorizontalParty | PPDERTParty | HorizontalBoostingParty:
        """The party whose batches are checkpointed; refused before setup."""
        if self.party is None:
            raise ProtocolError(f"institution {self.name!r}: {kind} before setup")
        return self.party

    def _party_state(self) -> dict[str, np.ndarray]:
        """What this party carries from one batch to the next: its noise counters (see the module doc)."""
        party = self._checkpointed_party("a batch checkpoint")
        assert not isinstance(party, HorizontalBoostingParty), "boosting's agent saves its margins"
        state = {"reports": np.array([party.reports], np.int64),  # noise streams are keyed by this count
                 "reports_per_row": np.array([party.reports_per_row], np.int64)}
        owner = _noise_owner(party)
        ledger = owner.ledger if owner is not None else None
        if ledger is not None:  # gdp, secagg-dp: what each row took part in
            state["ledger"] = np.array([ledger.releases_per_row, ledger.queries], np.int64)
        return state

    def _on_resume_status(self, message: Message) -> Message:
        """Open this run's checkpoints and report the completed batches.

        The checkpoints are bound to the master's context plus a digest of this institution's training rows.
        """
        party = self._checkpointed_party(message.kind)
        h = message.header
        rows = party.rows.rows_digest()
        context = hashlib.sha256(f"{h.text('context')}|{rows}".encode()).hexdigest()
        root = self.data.registry / CHECKPOINTS
        self._checkpoints = CheckpointStore(root, h.text("run"), context)
        if getattr(party, "privacy", None) in NOISY:
            self._seeds = CheckpointStore(root / NOISE_SEEDS, h.text("run"), context)
        return Message("resume_status", {}, {"completed": np.array(self._checkpoints.completed(), np.int64)})

    def _on_resume(self, message: Message) -> Message:
        """Restore the state after the first `batches` batches.

        In the DP modes, take up this run's noise seed (or keep the current one for every later attempt). Must
        come before `hello`.
        """
        if self._checkpoints is None or self.party is None:
            raise ProtocolError(f"institution {self.name!r}: resume before resume_status")
        batches = message.header.int("batches", 0)
        party = self._checkpointed_party(message.kind)
        if self._seeds is not None:
            owner = _noise_owner(party)
            if owner is None:  # a DP mode's seeds, but set up again since
                raise ProtocolError(f"institution {self.name!r}: resume with noise seeds but no noisy party")
            if self._seeds.completed():
                owner.noise_seed = int(self._seeds.load(0)["noise_seed"][0])
            else:
                self._seeds.save(0, {"noise_seed": np.array([owner.noise_seed], np.int64)})
        if batches:
            self._restore_party(self._checkpoints.load(batches - 1))
        return Message("resumed", {"batches": batches})

    def _restore_party(self, state: dict[str, np.ndarray]) -> None:
        """Take up `_party_state`'s checkpoint of the last batch every role completed (before hello)."""
        party = self._checkpointed_party("resume")
        assert not isinstance(party, HorizontalBoostingParty), "boosting's agent restores its margins"
        party.reports = int(state["reports"][0])
        party.reports_per_row = int(state["reports_per_row"][0])
        owner = _noise_owner(party)
        if "ledger" in state and owner is not None:  # hello continues the ledger
            releases, queries = (int(v) for v in state["ledger"])
            owner.restored_ledger = (releases, queries)

    def _on_drop_checkpoints(self, message: Message) -> Message:
        for store in (self._checkpoints, self._seeds):
            if store is not None:
                store.drop()
        return Message("ack")


def _noise_owner(party: HorizontalParty | PPDERTParty | HorizontalBoostingParty
                 ) -> HorizontalParty | DistributedNoise | None:
    """What holds a party's noise seed and ledger: a FET party itself, a secagg-dp party's noise share."""
    if isinstance(party, HorizontalParty):
        return party
    return party.noise if isinstance(party, PPDERTParty) else None
