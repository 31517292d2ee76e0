"""The institution agent in a vertical training session: the data-local steps around Federated Forest.

A `VerticalInstitutionAgent` answers the master for one institution. It hands out keyed hashes of its IDs,
lines its rows up with the intersection the master computed, keeps a held-out slice for evaluation,
serves the Federated Forest party protocol on the training rows, scores the master's held-out
predictions (label holder), stores its own partial model, and writes batch predictions where they were
asked for. Raw values, raw IDs and class names never leave it. With `compute:` in its config, its party's
row work runs on the institution's own Dask cluster (`fedcore.compute.dask_vertical`, issue #29).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedcore.agents.base import SessionAgent, session_headers
from fedcore.agents.batches import requested_until
from fedcore.agents.checks import check_holdout, decision_threshold, prediction_values, reported
from fedcore.agents.data import InstitutionData
from fedcore.agents.scoring import evaluation_arrays, predictions_table
from fedcore.agents.storage import (
    load_signed_table,
    run_id,
    signed_manifest,
    store_signed_table,
    write_predictions,
)
from fedcore.checkpoints import CHECKPOINTS, CheckpointStore
from fedcore.drift import training_snapshot
from fedcore.errors import ArtifactError, MalformedMessage, ProtocolError
from fedcore.metrics import class_codes, decide, metrics
from fedcore.models.artifacts import decode_classes, encode_classes, table_sha256
from fedcore.models.card import importance_rows
from fedcore.models.tables import partial_forest_from_table, party_table
from fedcore.privacy.hashing import hash_ids
from fedcore.privacy.keyauth import PartyIdentity
from fedcore.privacy.psi import PSIParty
from fedcore.protocol.messages import Arrays, Message, PartedMessage, StreamedMessage, unpack_bits
from fedcore.trees.early_stopping import kept_rounds, metric_name, round_scores
from fedcore.trees.structure import PartialForest, PartySplits
from fedcore.vertical.alignment import PositionsCheck, align_frame, check_positions
from fedcore.vertical.party import VerticalParty
from fedcore.vertical.persistence import party_file_stem

if TYPE_CHECKING:
    from distributed import Client, Future

    from fedcore.compute.dask_alignment import AlignedBlocks, AlignmentPlans, Blocks
    from fedcore.compute.dask_psi import BlockPSIParty
    from fedcore.compute.dask_table import ParquetTable
    from fedcore.compute.dask_vertical import DaskVerticalRows

log = logging.getLogger(__name__)

SPLIT_ARRAYS = ("tree", "node", "feature", "bin", "missing_left", "is_categorical", "cat_bits")
SESSION_HEADERS = session_headers(id_hashes=(), psi_blinded=("batch", "until"), psi_reblind=("rows",),
                                  align=("rows",), load_holdout=(), score_rounds=("patience",),
                                  keep_trees=("n_trees", "splitting_trees"), batch_hashes=("until",),
                                  align_batch=("rows",), deliver_predictions=("run",))
"""The header fields of each session message (`SessionAgent.session_headers`)."""
PARTY_KINDS = {"setup", "export_labels", "configure", "begin_batch", "find_splits", "evaluate_encrypted",
               "apply_splits", "finalize", "predict_leaves", "route"}


def _bits(packed: np.ndarray, first: int, count: int) -> np.ndarray:
    """Bits [first, first + count) of a `pack_bits` array, as uint8 0/1 (a part's share of a mask)."""
    start = first // 8
    bits = unpack_bits(packed[start:-(-(first + count) // 8)], first + count - 8 * start)
    return bits[first - 8 * start:]


def _count_bits(packed: np.ndarray, count: int, step: int = 1 << 20) -> int:
    """How many of the first `count` bits of a `pack_bits` array are set, `step` bits at a time."""
    return sum(int(_bits(packed, first, min(step, count - first)).sum()) for first in range(0, count, step))


def _points(values: np.ndarray) -> np.ndarray:
    """`values` (uint8, 2-d) if they are 32-byte points, one a row; else refused as malformed."""
    if values.shape[1] != 32:
        raise MalformedMessage("array 'values' must hold 32-byte points, one a row")
    return values


def _n_rows(rows: pd.DataFrame | Blocks) -> int:
    """Rows of a frame, or of blocks on the workers."""
    return len(rows) if isinstance(rows, pd.DataFrame) else rows.n_rows


class VerticalInstitutionAgent(SessionAgent[VerticalParty]):
    """Answers the master's session messages for one institution; see the module docstring."""

    engine_kinds = frozenset(PARTY_KINDS)
    not_ready = "rows are not aligned yet"
    session_headers = SESSION_HEADERS

    def __init__(self, data: InstitutionData | Callable[[], InstitutionData], consortium_key: bytes,
                 name: str = "", identity: PartyIdentity | None = None) -> None:
        """`data` is the institution's table, or a loader called afresh at the start of every session.

        `identity` signs the institution's sealing key in Paillier mode and checks its peers'.
        """
        super().__init__(data, name)
        self._key = consortium_key
        self.identity = identity
        self.party: VerticalParty | None = None
        self._holdout: pd.DataFrame | Blocks | None = None  # on Dask: blocks on the workers
        self._batch_ids: pd.Series | list[Future] | None = None  # on Dask: the aligned IDs' blocks
        self._batch: pd.DataFrame | ParquetTable | None = None  # the last new batch loaded (or opened)
        self._batch_rows = 0  # rows of the aligned batch
        self._until: datetime | None = None  # its scheduled time (the request's `until`)
        self._psi: PSIParty | BlockPSIParty | None = None  # an alignment in progress (its secret stays home)
        self._holdout_loaded = False  # the held-out rows are the party's prediction data (load_holdout)
        self.aligned_ids: pd.Series | None = None
        self._checkpoints: CheckpointStore | None = None

    def _batch_checkpoint(self) -> dict[str, np.ndarray]:
        assert self.party is not None, "handle() checkpoints a batch only once the party exists"
        splits = self.party.batch_splits()  # the splits this institution owns in the batch just finished
        return {f: getattr(splits, f) for f in SPLIT_ARRAYS}

    def _start_session(self) -> None:
        """Forget the last session's held-out rows, batch and alignment: a new master starts from nothing."""
        self._holdout, self._batch_ids, self._psi = None, None, None
        self._batch, self._until, self._batch_rows = None, None, 0
        self._holdout_loaded = False

    def _training_rows(self) -> pd.DataFrame | ParquetTable:
        """The training table: its rows in the agent, or its blocks on the workers."""
        return self.data.frame if self.data.table is None else self.data.table

    def _new_batch(self, message: Message) -> pd.DataFrame | ParquetTable:
        """The new rows to predict: read here, or opened as blocks the workers read (`open_batch`).

        A query that selects batches by time reads the one scheduled at the request's `until`.
        """
        self._until = requested_until(self.name, message.header)
        if self.data.open_batch is not None:
            self._batch = self.data.open_new_batch(self._until, self._prediction_target())
        else:
            self._batch = self.data.new_batch(self._until, self._prediction_target())
        return self._batch

    def _hashes(self, rows: pd.DataFrame | ParquetTable) -> Message | StreamedMessage:
        """The `id_hashes` answer: the keyed digests of the IDs of `rows` as uint8 rows of 32.

        Blocks on a Dask cluster hash their IDs on the workers and the answer streams them block by block
        (`dask_alignment.hash_parts`): the agent never holds every row's digest.
        """
        if isinstance(rows, pd.DataFrame):
            digests = hash_ids(rows[self.data.id_column], self._key)
            hashes = np.frombuffer(digests.tobytes(), dtype=np.uint8).reshape(len(digests), 32)
            return Message("id_hashes", {"rows": len(hashes)}, {"hashes": hashes})
        from fedcore.compute.dask_alignment import gathered, hash_parts

        client = self._client()
        parts = hash_parts(client, rows, self.data.id_column, self._key)  # repeated IDs are refused here
        return StreamedMessage("id_hashes", {"rows": rows.n_rows}, "hashes", (rows.n_rows, 32),
                               lambda: gathered(client, parts))

    def _psi_party(self, rows: pd.DataFrame | ParquetTable) -> PSIParty | BlockPSIParty:
        """PSI's party over the IDs of `rows`, with a fresh secret.

        Blocks on a Dask cluster blind, sort and re-blind on the workers with that secret (`BlockPSIParty`):
        the agent holds the secret and streams the blinded values range by range, never all of them.
        """
        from fedcore.privacy.psi import PSIParty, new_secret

        if isinstance(rows, pd.DataFrame):
            return PSIParty(self.name, rows[self.data.id_column], key=self._key)
        from fedcore.compute.dask_psi import BlockPSIParty

        assert self.data.compute is not None, "a table on Dask has its compute"
        return BlockPSIParty(self._client(), self.name, rows, self.data.id_column, self._key, new_secret(),
                             self.data.compute.block_rows)

    def _client(self) -> Client:
        """The client of the cluster that holds this institution's Parquet blocks."""
        assert self.data.cluster is not None, "a table on Dask comes with its cluster"
        return self.data.cluster.client

    # -- alignment and training ------------------------------------------------------------------------
    def _on_id_hashes(self, message: Message) -> Message | StreamedMessage:
        if not self.data.valid:
            raise ProtocolError(f"institution {self.name!r}: its data failed validation; it takes no part "
                                "in training")
        return self._hashes(self._training_rows())

    def _on_psi_blinded(self, message: Message) -> Message | StreamedMessage:
        """PSI step 1: this institution's IDs blinded with a fresh secret, sorted by value.

        The IDs are those of the training rows, or of the new batch.
        """
        rows = self._new_batch(message) if message.header.get("batch") else self._training_rows()
        self._psi = psi = self._psi_party(rows)
        if isinstance(psi, PSIParty):
            return Message("psi_blinded", {"rows": psi.n_rows}, {"blinded": psi.outgoing()})
        return StreamedMessage("psi_blinded", {"rows": psi.n_rows}, "blinded", (psi.n_rows, 32), psi.outgoing)

    def _on_psi_reblind(self, message: Message) -> Message | StreamedMessage:
        """PSI step 2: apply this institution's secret to another institution's list (order kept).

        On Dask the list may come part by part (`PartedMessage`): each part goes to the workers as it is
        read, so the agent never holds the list (issue #29).
        """
        psi = self._psi
        if psi is None:
            raise ProtocolError(f"institution {self.name!r}: psi_reblind before psi_blinded")
        announced = self._announced_rows(message)
        if isinstance(message, PartedMessage):
            assert not isinstance(psi, PSIParty), "streams() reads psi_reblind part by part on Dask only"
            if message.streamed != "values":
                raise MalformedMessage(f"'psi_reblind' streams array {message.streamed!r}; only 'values' "
                                       "may be")
            parts: Iterable[np.ndarray] = (_points(part)
                                           for _, part in self._parts(message, announced, "u", 2))
        else:
            values = _points(message.arrays.typed("values", "u", 2))
            if len(values) != announced:
                raise ProtocolError(f"institution {self.name!r}: 'psi_reblind' announces {announced} rows "
                                    f"but carries {len(values)} values")
            if isinstance(psi, PSIParty):
                return Message("psi_reblinded", {}, {"values": psi.reblind(values)})
            parts = [values]
        answer = psi.reblind(parts)  # checked now, re-blinded on the workers while the answer is sent
        return StreamedMessage("psi_reblinded", {}, "values", (announced, 32), lambda: answer)

    def _announced(self, message: Message) -> np.ndarray:
        """The master's positions, checked against what it announced and this institution's `min_overlap`."""
        positions = message.arrays.typed("positions", "iu")
        announced = message.header.get("rows")
        if not isinstance(announced, int) or announced != len(positions):
            raise ProtocolError(f"institution {self.name!r}: {message.kind!r} announces {announced!r} rows "
                                f"but carries {len(positions)} positions")
        self._least_rows(message.kind, len(positions))
        return positions

    def _least_rows(self, kind: str, rows: int) -> None:
        """Refuse an `align` of fewer rows than this institution's `min_overlap`, an `align_batch` of none."""
        least = self.data.min_overlap if kind == "align" else 1
        if least is not None and rows < least:
            raise ProtocolError(f"institution {self.name!r}: {kind!r} aligns {rows} rows, fewer than this "
                                f"institution's min_overlap={least}")

    def _part_rows(self, message: PartedMessage, announced: int,
                   n_rows: int) -> Iterator[tuple[int, np.ndarray]]:
        """A parted `align`'s (`align_batch`'s) positions as checked row numbers, part by part.

        Each with the count of rows before it; PSI's positions mapped back to rows; repeats and the range
        of `n_rows` checked as the parts arrive (`PositionsCheck`).
        """
        if message.streamed != "positions":
            raise MalformedMessage(f"{message.kind!r} streams array {message.streamed!r}; only 'positions' "
                                   "may be")
        psi, self._psi = self._psi, None

        def rows() -> Iterator[tuple[int, np.ndarray]]:
            check = PositionsCheck(n_rows)
            for count, part in self._parts(message, announced, "iu"):
                yield count, check.add(part.astype(np.int64, copy=False) if psi is None
                                       else psi.rows_from_positions(part))
            check.finish()

        return rows()

    def _rows(self, positions: np.ndarray) -> np.ndarray:
        """Row numbers of the master's positions: as they are after hashing, mapped back after PSI."""
        positions = np.asarray(positions)
        if self._psi is None:
            return positions.astype(np.int64, copy=False)
        rows, self._psi = self._psi.rows_from_positions(positions), None
        return rows

    def streams(self, kind: str) -> bool:
        """Whether this agent reads a `kind` request part by part (`PartedMessage`, issue #29).

        The master's per-row arrays whose rows are on this institution's Dask workers: `align`'s and
        `align_batch`'s positions, `psi_reblind`'s values.
        """
        if kind == "align":
            return self._data is not None and self._data.table is not None
        if kind == "psi_reblind":
            return self._psi is not None and not isinstance(self._psi, PSIParty)
        if kind == "align_batch":
            return self._batch is not None and not isinstance(self._batch, pd.DataFrame)
        return False

    def _parts(self, message: PartedMessage, announced: int, dtype_kinds: str,
               ndim: int = 1) -> Iterator[tuple[int, np.ndarray]]:
        """A parted request's parts as they are read, each typed, with the count of rows before it.

        The count is the whole message's check made part by part: refused at the first part past the
        announced rows (the rest is never read), and at the end if short.
        """
        noun, count = message.streamed, 0
        for part in message.parts:
            part = Arrays({noun: part}).typed(noun, dtype_kinds, ndim)
            if count + len(part) > announced:
                raise ProtocolError(f"institution {self.name!r}: {message.kind!r} announces {announced} rows "
                                    f"but carries more {noun} ({count + len(part)} so far)")
            yield count, part
            count += len(part)
        if count != announced:
            raise ProtocolError(f"institution {self.name!r}: {message.kind!r} announces {announced} rows but "
                                f"carries {count} {noun}")

    def _announced_rows(self, message: Message) -> int:
        """The row count a request announces in its header: a count, else refused."""
        announced = message.header.get("rows")
        if not isinstance(announced, int) or isinstance(announced, bool) or announced < 0:
            raise ProtocolError(f"institution {self.name!r}: {message.kind!r} announces {announced!r} rows")
        return announced

    def _on_align(self, message: Message) -> Message:
        if "align" in self._done:  # a second alignment would be a fresh party, without the trained model
            raise ProtocolError(f"institution {self.name!r} refuses a second 'align' in this session: it is "
                                "answered once per session")
        if isinstance(message, PartedMessage):
            return self._align_parts(message)
        positions = self._rows(self._announced(message))
        holdout = unpack_bits(message.arrays.typed("holdout", "u"), len(positions)).astype(bool)
        check_holdout(self.name, int(holdout.sum()), len(positions), self.data.holdout)
        if self.party is not None:
            self.party.rows.close()  # the last session's rows (on a cluster: its blocks)
            self.party = None
        if self.data.table is not None:
            from fedcore.compute.dask_alignment import align_blocks

            table = self.data.table
            assert self.data.compute is not None, "a table on Dask has its compute"
            self.party, self._holdout = self._align_on_workers(align_blocks(
                self._client(), table, check_positions(positions, table.n_rows), holdout, self.data.id_column,
                self.data.compute.block_rows))
        else:
            aligned = align_frame(self.data.frame, positions)
            self.aligned_ids = aligned[self.data.id_column]  # kept here, for audits; never sent
            aligned = aligned.drop(columns=[self.data.id_column])
            self._holdout = aligned[holdout].reset_index(drop=True)
            self.party = self._party(aligned[~holdout].reset_index(drop=True))
            self._on_cluster(self.party)
        return self._aligned()

    def _aligned(self) -> Message:
        """The `aligned` answer, the alignment final."""
        assert self.party is not None and self._holdout is not None, "called once the rows are aligned"
        self._holdout_loaded = False
        self._done.add("align")  # a refused alignment may be corrected; one that answered is final
        return Message("aligned", {"train_rows": self.party.rows.n_rows,
                                   "holdout_rows": _n_rows(self._holdout)})

    def _align_parts(self, message: PartedMessage) -> Message:
        """`align` on Dask with the master's positions read part by part: the agent never holds them all.

        The checks of the whole message, made as the parts arrive: their count against the announced rows
        (refused at the first part past it), their dtype, range and repeats (`PositionsCheck`); each part
        goes into the blocks' plan at once (`AlignmentPlans`), whose tasks go to the workers at the end.
        """
        from fedcore.compute.dask_alignment import AlignmentPlans

        table, compute = self.data.table, self.data.compute
        assert table is not None and compute is not None, "streams() reads align part by part on Dask only"
        announced = self._announced_rows(message)
        self._least_rows(message.kind, announced)
        packed = message.arrays.typed("holdout", "u", size=-(-announced // 8))
        check_holdout(self.name, _count_bits(packed, announced), announced, self.data.holdout)
        if self.party is not None:
            self.party.rows.close()  # the last session's rows (on a cluster: its blocks)
            self.party = None
        plans = AlignmentPlans(table, compute.block_rows)
        for count, rows in self._part_rows(message, announced, table.n_rows):
            plans.add(rows, _bits(packed, count, len(rows)))
        self.party, self._holdout = self._align_on_workers(plans.blocks(self._client(), self.data.id_column))
        return self._aligned()

    def _party(self, frame: pd.DataFrame, rows: DaskVerticalRows | None = None) -> VerticalParty:
        """This session's party over its training `frame` (or `rows` on the workers and `frame` the label)."""
        return VerticalParty(self.name, frame, self.data.label, feature_key=self._feature_key(),
                             identity=self.identity, memory_budget=self.data.memory_budget,
                             own_privacy=self.data.privacy, rows=rows)

    def _align_on_workers(self, aligned: AlignedBlocks) -> tuple[VerticalParty, Blocks]:
        """The party over training blocks the workers aligned, and the held-out blocks beside them.

        The agent holds (label holder) the training labels, which the protocol needs here; the rows stay on
        the workers (`fedcore.compute.dask_alignment`). The answer waits until the training blocks exist, so
        that the alignment's reads and cuts are the align step's work and not run into setup's (issue #29).
        """
        from distributed import wait

        from fedcore.compute.dask_vertical import DaskVerticalRows

        client, label = self._client(), self.data.label
        self.aligned_ids = None  # on the workers' side only: the agent never holds the aligned IDs
        features = [c for c in aligned.columns if c != label]
        rows = DaskVerticalRows.on_workers(client, aligned.frames, aligned.sizes, features, self.name)
        labels = aligned.gathered(client, label).to_frame() if label else pd.DataFrame()
        with client.as_current():
            wait(aligned.frames)
        log.info("institution %r: %d training rows aligned on the workers in %d blocks", self.name,
                 rows.n_rows, len(rows.blocks))
        return self._party(labels, rows), aligned.held

    def _on_cluster(self, party: VerticalParty) -> None:
        """Put the party's row work on this institution's Dask cluster, when its own config says so.

        The cluster is the institution's choice (`compute:`, never the master's): this process's one cluster
        for it (`shared_cluster`); the rows go there in blocks when setup bins them.
        """
        compute = self.data.compute
        if compute is None:
            return
        from fedcore.compute.cluster import shared_cluster
        from fedcore.compute.dask_vertical import DaskVerticalRows

        cluster = self.data.cluster if self.data.cluster is not None else shared_cluster(compute)
        party.rows = DaskVerticalRows(party.features, cluster.client, compute.block_rows, self.name)
        log.info("institution %r: %d training rows in %d blocks", self.name, party.rows.n_rows,
                 len(party.rows.blocks))

    def _feature_key(self) -> bytes:
        return hmac.new(self._key, b"fedforest feature ids", hashlib.sha256).digest()

    def _require_holdout(self, kind: str) -> pd.DataFrame | Blocks:
        """This session's held-out rows, or the refusal of a `kind` message that needs them."""
        if self._holdout is None:
            raise ProtocolError(f"institution {self.name!r}: no held-out rows ({kind!r} before align)")
        return self._holdout

    def _require_model(self, kind: str) -> PartialForest:
        """This party's partial model, trained or loaded, or the refusal of a `kind` message that needs it."""
        model = self._require_party(kind).model
        if model is None:
            raise ProtocolError(f"institution {self.name!r} holds no model yet ({kind!r} before finalize)")
        return model

    def _on_load_holdout(self, message: Message) -> Message:
        holdout = self._require_holdout(message.kind)
        model = self._require_model(message.kind)  # trained in this session: load_model drops held-out rows
        self._once(message.kind)
        party = self._require_party(message.kind)
        if isinstance(holdout, pd.DataFrame):
            party.set_prediction_data(holdout.drop(columns=[self.data.label]) if self.data.label else holdout)
        else:  # predicted where its blocks are, as a batch (the label column is not the model's: unread)
            from fedcore.compute.dask_vertical_predict import DaskPredictionRows

            party.set_prediction_rows(DaskPredictionRows(self._client(), holdout.frames, holdout.sizes,
                                                         model))
        self._holdout_loaded = True
        return Message("ack", {"rows": _n_rows(holdout)})

    def _on_evaluate(self, message: Message) -> Message:
        """Score the master's predictions of the whole held-out set, once per session, after training.

        Anything else (a second call, a subset of rows, values of another shape) is refused: the metrics
        would otherwise be an oracle for single held-out labels.
        """
        if not self.data.label:
            raise ProtocolError(f"institution {self.name!r} holds no label and cannot evaluate")
        if not self._holdout_loaded:
            raise ProtocolError(f"institution {self.name!r}: 'evaluate' before the held-out rows were "
                                "predicted (load_holdout after training)")
        holdout = self._require_holdout(message.kind)
        y = (holdout[self.data.label] if isinstance(holdout, pd.DataFrame)  # on Dask: one column gathered
             else holdout.gathered(self._client(), self.data.label)).to_numpy()
        party = self._require_party(message.kind)
        self._require_model(message.kind)  # trained in this session (load_holdout checked it too)
        width = len(party.classes_) if party.classes_ is not None else 1
        values = prediction_values(self.name, message, len(y), width)
        threshold = decision_threshold(message)
        self._once(message.kind)  # a refused call above revealed nothing; this one answers
        arrays: dict[str, np.ndarray] = {}
        if party.classes_ is not None:
            predicted = party.classes_[decide(values, threshold)]
            result = metrics("classification", y, predicted, values, party.classes_)  # values: probabilities
            arrays = evaluation_arrays(class_codes(y, party.classes_), values, threshold)
        else:
            result = metrics("regression", y, values[:, 0])
        # rounded: the predictions are the master's, so full precision would let crafted ones carry labels
        rounded = {name: float(reported(value)) for name, value in result.items()}
        return Message("metrics", {"metrics": rounded, "rows": int(len(y))}, arrays)

    def _on_score_rounds(self, message: Message) -> Message:
        """Boosting's early stopping: how many rounds to keep, scored on the whole held-out set, once.

        The master sends every tree's leaf weight for each held-out row; only the count of rounds goes back
        (`fedcore.trees.early_stopping`, XGBoost's rule over log-loss or RMSE).
        """
        if not self.data.label:
            raise ProtocolError(f"institution {self.name!r} holds no label and cannot score rounds")
        if not self._holdout_loaded:
            raise ProtocolError(f"institution {self.name!r}: 'score_rounds' before the held-out rows were "
                                "predicted (load_holdout after training)")
        party = self._require_party(message.kind)
        model = self._require_model(message.kind)
        combination = party.boosting_combination
        if combination is None:
            raise ProtocolError(f"institution {self.name!r}: 'score_rounds' after a training that was not "
                                "boosting")
        patience = message.header.int("patience")
        if patience < 1:
            raise ProtocolError(f"institution {self.name!r}: 'score_rounds' patience must be >= 1, got "
                                f"{patience}")
        holdout = self._require_holdout(message.kind)
        y = (holdout[self.data.label] if isinstance(holdout, pd.DataFrame)
             else holdout.gathered(self._client(), self.data.label)).to_numpy()
        leaf_values = prediction_values(self.name, message, len(y), model.n_trees)
        self._once(message.kind)
        if party.classes_ is not None:
            y = class_codes(y, party.classes_)
        scores = round_scores(combination, y, leaf_values)
        return Message("rounds", {"rounds": kept_rounds(scores, patience),
                                  "metric": metric_name(combination)})

    def _on_keep_trees(self, message: Message) -> Message:
        """Keep the first `n_trees` trees of the model trained in this session (boosting's early stopping)."""
        party, model = self._require_party(message.kind), self._require_model(message.kind)
        n_trees = message.header.int("n_trees")
        if not 1 <= n_trees <= model.n_trees:
            raise ProtocolError(f"institution {self.name!r}: 'keep_trees' asks for {n_trees} of its "
                                f"{model.n_trees} trees")
        self._once(message.kind)
        shares = None
        if "importance" in message.arrays:  # its own splits' importance shares, over the kept trees
            shares = message.arrays.typed("importance", "f"), message.header.int("splitting_trees", 0)
        party.keep_first_trees(n_trees, shares)
        return Message("ack", {"n_trees": n_trees})

    def _on_model_digest(self, message: Message) -> Message:
        """The SHA-256 of this party's partial model file, for the master to sign before anyone stores."""
        model = self._require_model(message.kind)
        return Message("model_digest", {"sha256": table_sha256(party_table(model))})

    def _on_store_model(self, message: Message) -> Message:
        party, model = self._require_party(message.kind), self._require_model(message.kind)
        extra: dict[str, Any] = {}
        if party.classes_ is not None:
            extra["classes"] = [str(c) for c in party.classes_]
            try:  # the strings above lose the labels' dtype; this keeps it for `load_model`
                extra["classes_encoding"] = encode_classes(party.classes_)
            except ArtifactError:
                pass
        self._keep_snapshot(self._training_snapshot(party), extra)
        if party.importances is not None:  # its own features' importances: in its own registry copy only
            extra["importances"] = dict(zip(model.column_names, map(float, party.importances), strict=True))
            self.reports["importances"] = importance_rows(extra["importances"])
        path = store_signed_table(self.data, message.header, party_file_stem(self.name), party_table(model),
                                  extra)
        self._stored_version(message.header, signed_manifest(message.header))
        return Message("stored", {"path": path})

    def _training_snapshot(self, party: VerticalParty) -> dict | None:
        """The drift snapshot of its training rows' own features: of its frame, or of its blocks.

        Blocks on the workers give the frame's snapshot (`fedcore.compute.dask_drift`).
        """
        from fedcore.compute.dask_vertical import DaskVerticalRows

        rows = party.rows
        if isinstance(rows, DaskVerticalRows) and rows.features is None:  # the rows are on the workers only
            from fedcore.compute.dask_drift import block_snapshot

            return block_snapshot(rows.client, rows.frames, [b.n_rows for b in rows.blocks],
                                  rows.columns)
        return training_snapshot(party.features)

    def _on_load_model(self, message: Message) -> Message:
        """Rebuild the party from its own stored partial model, to batch predict without training."""
        version = message.header.text("version")
        manifest, table = load_signed_table(self.data, message.header, party_file_stem(self.name))
        model = partial_forest_from_table(table)
        label = self.data.label
        columns = list(model.column_names) + ([label] if label else [])
        party = VerticalParty(self.name, pd.DataFrame(columns=columns), label,
                              feature_key=self._feature_key())
        party.model = model
        self.snapshot = manifest.get("drift")
        if label and manifest.get("classes") is not None:
            party.classes_ = self._stored_classes(manifest)
        self.party, self._holdout, self._batch_ids = party, None, None
        self._model_version(message.header, manifest.get("master_manifest") or {})
        return Message("loaded", {"version": version, "owned_nodes": int(np.sum(model.feature >= 0))})

    def _stored_classes(self, manifest: dict) -> np.ndarray:
        """The label holder's classes as trained.

        Decoded with their dtype, or (older versions, strings only) mapped back to the values of the same
        label in its current table where they match.
        """
        if manifest.get("classes_encoding") is not None:
            return decode_classes(manifest["classes_encoding"])
        stored = [str(c) for c in manifest["classes"]]
        values = self.data.frame[self.data.label].dropna().to_numpy()
        known = {str(v): v for v in np.unique(values)} if len(values) else {}
        if all(c in known for c in stored):
            return np.array([known[c] for c in stored], dtype=values.dtype)
        return np.array(stored, dtype=object)

    # -- batch prediction ---------------------------------------------------------------------------
    def _on_batch_hashes(self, message: Message) -> Message | StreamedMessage:
        return self._hashes(self._new_batch(message))

    def _on_align_batch(self, message: Message) -> Message:
        if self._batch is None:
            raise ProtocolError(f"institution {self.name!r}: align_batch before the batch IDs")
        party = self._require_party(message.kind)
        if isinstance(message, PartedMessage):  # on Dask: the positions read part by part, never held whole
            return self._align_batch_parts(party, message)
        positions = self._rows(self._announced(message))
        if not isinstance(self._batch, pd.DataFrame):
            plans = self._batch_plans()
            plans.add(check_positions(positions, self._batch.n_rows), np.zeros(len(positions), bool))
            return self._align_batch_on_workers(party, plans, len(positions))
        aligned = align_frame(self._batch, positions)
        self._batch_ids = aligned[self.data.id_column].reset_index(drop=True)
        self._batch_rows = len(aligned)
        features = aligned.drop(columns=[c for c in (self.data.id_column, self.data.label) if c in aligned])
        drift = self._batch_drift(features)  # its own features against its training rows, before predicting
        party.set_prediction_data(features.reset_index(drop=True))
        return Message("ack", {"rows": len(aligned), **drift})

    def _batch_plans(self) -> AlignmentPlans:
        """The aligned blocks' plan of the new batch on the workers, before its positions are added."""
        from fedcore.compute.dask_alignment import AlignmentPlans

        assert self.data.compute is not None and self._batch is not None and \
            not isinstance(self._batch, pd.DataFrame), "a batch on Dask comes with its compute"
        return AlignmentPlans(self._batch, self.data.compute.block_rows)

    def _align_batch_parts(self, party: VerticalParty, message: PartedMessage) -> Message:
        """`align_batch` on Dask with the positions read part by part, checked as the whole message's."""
        plans, announced = self._batch_plans(), self._announced_rows(message)
        self._least_rows(message.kind, announced)
        for _, rows in self._part_rows(message, announced, plans.table.n_rows):
            plans.add(rows, np.zeros(len(rows), bool))
        return self._align_batch_on_workers(party, plans, announced)

    def _align_batch_on_workers(self, party: VerticalParty, plans: AlignmentPlans, n_rows: int) -> Message:
        """The batch aligned, encoded and predicted in blocks on the workers, its IDs kept there to delivery.

        (`fedcore.compute.dask_vertical_predict`: the party's answers are the in-process ones, bit for bit.)
        """
        from fedcore.compute.dask_vertical_predict import DaskPredictionRows

        client = self._client()
        aligned = plans.blocks(client, self.data.id_column, keep_id=True)
        self._batch_ids, self._batch_rows = aligned.column(client, self.data.id_column), n_rows
        if self.snapshot is None:
            drift = self._drift_reply(None)
        else:  # counted per block on the workers: the in-process scores exactly
            from fedcore.compute.dask_drift import block_scores

            drift = self._drift_reply(block_scores(client, aligned.frames, n_rows, self.snapshot))
        rows = DaskPredictionRows(client, aligned.frames, aligned.sizes, party.trained_model)
        party.set_prediction_rows(rows)
        log.info("institution %r: %d batch rows aligned on the workers in %d blocks", self.name,
                 n_rows, len(aligned.frames))
        return Message("ack", {"rows": n_rows, **drift})

    def _on_deliver_predictions(self, message: Message) -> Message:
        run = run_id(self.name, message.header)
        if self._batch_ids is None:
            raise ProtocolError(f"institution {self.name!r}: 'deliver_predictions' before align_batch")
        party = self._require_party(message.kind)
        width = len(party.classes_) if party.classes_ is not None else 1
        values = prediction_values(self.name, message, self._batch_rows, width)
        self._once(message.kind)  # one file per model version: a master cannot fill the disk with copies
        ids = self._batch_ids
        if not isinstance(ids, pd.Series):  # the aligned IDs' blocks on the workers: gathered to be written
            from fedcore.compute.dask_alignment import gather_series

            ids = gather_series(self._client(), ids)
        out = predictions_table(ids, values, party.classes_, self.data.id_column, self.decision_threshold)
        path = write_predictions(self.data, out, self._prediction_target(), run, self._until)
        return Message("delivered", {"path": str(path), "rows": len(out)})

    # -- checkpoints (resuming a run after a crash) ------------------------------------------------------
    def _on_resume_status(self, message: Message) -> Message:
        """Open this run's checkpoints (bound to the master's context digest); report completed batches."""
        h = message.header
        self._checkpoints = CheckpointStore(self.data.registry / CHECKPOINTS, h.text("run"),
                                            h.text("context"))
        return Message("resume_status", {}, {"completed": np.array(self._checkpoints.completed(), np.int64)})

    def _on_resume(self, message: Message) -> Message:
        """Restore the splits of the first `batches` batches from this institution's checkpoints."""
        if self._checkpoints is None or self.party is None:
            raise ProtocolError(f"institution {self.name!r}: resume before resume_status and alignment")
        batches = message.header.int("batches", 0)
        restored = [PartySplits(**self._checkpoints.load(b)) for b in range(batches)]
        self.party.restore_splits(restored)
        return Message("resumed", {"batches": batches})

    def _on_drop_checkpoints(self, message: Message) -> Message:
        if self._checkpoints is not None:
            self._checkpoints.drop()
        return Message("ack")
