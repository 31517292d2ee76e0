"""The institution's role in horizontal boosting: its margins, its (g, h), its masked histograms.

Every party holds the whole model: each round it routes its rows through the round before's trees (sent
with the round's first request) and adds their leaf weights to its margins, in the order the model's
prediction adds them (`fedcore.trees.combination`), computes its rows' (g, h) with the agreed loss
(`fedcore.trees.losses`), quantises them (`fixedpoint.py`), and answers each level with its per node, feature
and bin sums of (count, g, h), masked for secure aggregation. Its rows' partition is the horizontal forests'
(`fedcore.horizontal.rows`), applied to the master's decisions as (feature, bin) cuts of the agreed bins.

The rows and their per-row state are in process (`rows.BoostingRows`) or on the institution's Dask cluster
(`fedcore.compute.dask_boosting.DaskBoostingRows`: the same functions per block, the integer sums added);
this protocol code is the same for both, and so are its replies.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.algorithms import HORIZONTAL_BOOSTING
from fedcore.errors import ProtocolError
from fedcore.horizontal.boosting.bins import AgreedBins
from fedcore.horizontal.boosting.fixedpoint import RING_BITS, check_totals
from fedcore.horizontal.boosting.master import REPLIES, TREE_FIELDS
from fedcore.horizontal.boosting.rows import BoostingRows
from fedcore.horizontal.model import HorizontalForest, combination_of
from fedcore.horizontal.ppdert.agreed import domain_fingerprint
from fedcore.horizontal.ppdert.keys import announced_parties, signed_key, verified_peer_keys
from fedcore.horizontal.rows import check_hello, checked_structure, own_rows
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.protocol.dispatch import Protocol, Step
from fedcore.protocol.messages import Arrays, Message
from fedcore.trees.losses import loss_for

if TYPE_CHECKING:
    from fedcore.compute.dask_boosting import DaskBoostingRows
    from fedcore.compute.dask_rows import DaskPartyRows
    from fedcore.privacy.keyauth import PartyIdentity
    from fedcore.privacy.secagg import SecureAggregator

log = logging.getLogger(__name__)

SUM_REPLIES = REPLIES[:2]

BOOSTING_PROTOCOL = Protocol(
    "horizontal boosting", initial="idle",
    states={"idle": "no session: before hello, or after the model",
            "greeted": "after hello",
            "summed": "after the base score's sums or a level's histograms"},
    steps=[
        Step("idle", "hello", "greeted", "hello_reply"),
        Step("greeted", "boost_base", "summed", SUM_REPLIES),
        Step("summed", "boost_level", "summed", SUM_REPLIES),
        Step("summed", "model", "idle", "ack"),
    ])
"""What a horizontal boosting party answers, in which order: never the forests' messages."""


class HorizontalBoostingParty:
    """One institution in horizontal boosting (see the module doc)."""

    algorithm = HORIZONTAL_BOOSTING.id
    protocol = BOOSTING_PROTOCOL

    def __init__(self, name: str, frame: pd.DataFrame | None, schema: HorizontalSchema, *, low: np.ndarray,
                 high: np.ndarray, max_bins: int, secure: bool = True,
                 identity: PartyIdentity | None = None, expected_parties: int | None = None,
                 rows: DaskPartyRows | None = None) -> None:
        """Encode this party's rows with the agreed schema and cut them into the agreed bins.

        The rows are `frame` in process, or `rows` already on a Dask cluster (exactly one given).
        `identity` signs this party's secure-aggregation key and verifies its peers' (required with secure
        aggregation and more than one party). `expected_parties`: the institutions of its own federation; a
        master announcing another count is refused (None: in-process use).
        """
        self.name = name
        self.schema = schema
        self.expected_parties = expected_parties
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        self.bins = AgreedBins.of(schema, self.low, self.high, max_bins)
        self.rows: BoostingRows | DaskBoostingRows
        if rows is None and frame is not None:
            self.rows = BoostingRows(name, frame, schema, self.bins)
        else:
            from fedcore.compute.dask_boosting import DaskBoostingRows

            own_rows(name, frame, schema, rows)  # refuses both or neither given
            assert rows is not None
            self.rows = DaskBoostingRows.of(rows, self.bins)
        self.n_rows = self.rows.n_rows
        self.secure = bool(secure)
        self.identity = identity
        self.loss = loss_for(schema.task, schema.n_classes)
        self.model: HorizontalForest | None = None
        self.aggregator: SecureAggregator | None = None
        self._key_context = b""
        self._n_parties = 0
        self._agreed = False
        self._round = 0
        self._n_outputs = 1
        self.restored: dict[str, np.ndarray] | None = None
        """A checkpoint's `round_state` (a resumed run), taken up by the next hello."""
        self.machine = BOOSTING_PROTOCOL.start(log)

    def handle(self, message: Message) -> Message:
        """Answer one protocol message; refuse it (ProtocolError) when it is not the next one."""
        return self.machine.handle(self, message)

    def round_state(self) -> dict[str, np.ndarray]:
        """What this party carries from one round to the next, for a checkpoint: rounds started, margins.

        Saved when a round's first request arrives, before its trees are added: the resumed round's first
        request carries them again.
        """
        return {"round": np.array([self._round], np.int64), "margins": self.rows.get_margins()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Resume from a checkpoint's `round_state` (applied by the next hello, which starts the session)."""
        margins, started = np.asarray(state["margins"], np.float64), int(np.asarray(state["round"])[0])
        if margins.ndim != 2 or len(margins) != self.n_rows or started < 1:
            raise ProtocolError(f"party {self.name!r}: the checkpoint holds margins of {margins.shape} after "
                                f"{started} round(s), not of this party's {self.n_rows} rows")
        self.restored = {"round": np.array([started], np.int64), "margins": margins}

    def __getstate__(self) -> dict:
        """The party to pickle (a fitted estimator's): without its session's signing identity and masks."""
        state = self.__dict__.copy()
        state.update(identity=None, aggregator=None)
        return state

    # -- handlers ------------------------------------------------------------------------------------
    def _on_hello(self, message: Message) -> Message:
        h = message.header
        check_hello(self.name, self.algorithm, self.schema, h)
        if h.get("domains") != domain_fingerprint(self.low, self.high) \
                or h.get("bins") != self.bins.fingerprint():
            raise ProtocolError(f"party {self.name!r}: the master's feature domains or bins differ from the "
                                "party's; both must come from the same data contract and max_bins")
        if h.get("loss") != self.loss.name:
            raise ProtocolError(f"party {self.name!r}: the agreed schema takes loss {self.loss.name!r}, the "
                                f"master named {h.get('loss')!r}")
        if bool(h.get("secure", True)) != self.secure:
            raise ProtocolError(f"party {self.name!r} runs {'with' if self.secure else 'without'} secure "
                                "aggregation; the master asked otherwise")
        self._n_parties = announced_parties(self.name, h, self.expected_parties)
        self._n_outputs = h.int("n_outputs")
        if self._n_outputs != self.loss.n_outputs(self.schema.n_classes):
            raise ProtocolError(f"party {self.name!r}: loss {self.loss.name!r} grows "
                                f"{self.loss.n_outputs(self.schema.n_classes)} margins a row, the master "
                                f"asked for {self._n_outputs}")
        self._round, self._agreed, self.aggregator = 0, False, None
        if self.restored is not None:  # a resumed run: the rounds before were grown in an earlier session
            margins = self.restored["margins"]
            if margins.shape[1] != self._n_outputs:
                raise ProtocolError(f"party {self.name!r}: the checkpoint holds {margins.shape[1]} "
                                    f"margins a row, the master's loss {self._n_outputs}")
            self._round = int(self.restored["round"][0])
            self.rows.set_margins(margins)
            self.restored = None
        arrays: dict[str, np.ndarray] = {}
        header: dict[str, object] = {"n_rows": self.n_rows}
        if self._n_parties > 1 and self.secure:
            self.aggregator, self._key_context, arrays, signed = signed_key(self.name, self.identity, h)
            header.update(signed)
        return Message("hello_reply", header, arrays)

    def _on_boost_base(self, message: Message) -> Message:
        """The label statistics of the base score: class counts, or (rows, fixed-point label sum)."""
        h, a = message.header, message.arrays
        if "peer_keys" in a:
            if self.aggregator is None:
                raise ProtocolError(f"party {self.name!r} got peer keys but masks with no peer")
            self.aggregator.agree(verified_peer_keys(self.name, self._n_parties, self.identity,
                                                     self.aggregator, self._key_context, h, a["peer_keys"]))
            self._agreed = True
        sums, totals = self.rows.label_sums(self.loss)
        if totals is not None:
            check_totals(self.name, totals, self._n_parties)
        return self._reply(sums, h)

    def _on_boost_level(self, message: Message) -> Message:
        """Apply the decisions (or start a round), then this party's histograms of the open nodes."""
        h, a = message.header, message.arrays
        n_open = len(a["tree"])
        if h.get("new_batch"):
            self._start_round(h, a)
            self.rows.start_level(h, Arrays(), n_open)
            compute = np.ones(n_open, bool)
        else:
            compute = np.asarray(a["compute"])
            if compute.dtype != np.uint8 or compute.shape != (n_open,) or compute.max(initial=0) > 1:
                raise ProtocolError(f"party {self.name!r}: 'compute' must flag each of the {n_open} open "
                                    "nodes with 0 or 1")
            compute = compute.astype(bool)
            feature = np.asarray(a["split_feature"]).astype(np.int64)
            split_bin = np.asarray(a["split_bin"]).astype(np.int64)
            splits = feature >= 0
            if feature.shape != split_bin.shape or not np.all(self.bins.valid_split(feature[splits],
                                                                                    split_bin[splits])):
                raise ProtocolError(f"party {self.name!r}: the decisions name splits outside the agreed bins")
            safe_f, safe_b = np.where(splits, feature, 0), np.where(splits, split_bin, 0)
            self.rows.features = safe_f[:, None]
            self.rows.thresholds = self.bins.thresholds(safe_f, safe_b)[:, None]
            self.rows.start_level(h, Arrays({"chosen": np.where(splits, 0, -1), "next_pos": a["next_pos"]}),
                                  n_open)
        hist = self.rows.histograms(compute)  # the nodes the master asks for (it subtracts their siblings)
        return self._reply(hist.reshape(-1), h)

    def _on_model(self, message: Message) -> Message:
        h = message.header
        if h.get("algorithm") != self.algorithm:
            raise ProtocolError(f"party {self.name!r} trained {self.algorithm!r}; the master sent a "
                                f"{h.get('algorithm')!r} model")
        combination = combination_of({"kind": "sum", "base_score": h.get("base_score"),
                                      "link": h.get("link")})
        self.model = HorizontalForest.from_arrays(message.arrays, n_trees=h.int("n_trees"), task=h["task"],
                                                  algorithm=self.algorithm, schema=self.schema,
                                                  combination=combination)
        self.rows.clear()
        return Message("ack", {"n_nodes": self.model.n_nodes})

    # -- rounds --------------------------------------------------------------------------------------
    def _start_round(self, h, a: dict[str, np.ndarray]) -> None:
        """Margins from the base score (round 0) or plus the round before's trees; this round's (g, h)."""
        k = self._n_outputs
        if h.int("n_trees") != k:
            raise ProtocolError(f"party {self.name!r}: a round grows {k} trees, the master asked for "
                                f"{h.get('n_trees')}")
        base, trees = None, None
        if self._round == 0:
            base = np.asarray(h["base_score"], dtype=np.float64)
            if base.shape != (k,) or not np.all(np.isfinite(base)):
                raise ProtocolError(f"party {self.name!r}: the base score must be {k} finite margins")
        else:
            trees = self._round_trees(a, first=(self._round - 1) * k, k=k)
        self._round += 1
        check_totals(self.name, self.rows.start_round(self.loss, base, trees), self._n_parties)

    def _round_trees(self, a: dict[str, np.ndarray], first: int, k: int) -> HorizontalForest:
        """The round before's trees, checked: the rows add their leaf weights to their margins."""
        missing = [name for name in TREE_FIELDS if f"round_{name}" not in a]
        if missing:
            raise ProtocolError(f"party {self.name!r}: a round's first request must carry the round before's "
                                f"trees; {missing} are missing")
        arrays = {name: np.asarray(a[f"round_{name}"]) for name in TREE_FIELDS}
        tree = arrays["tree"].astype(np.int64)
        if len(tree) == 0 or np.any(np.diff(tree) < 0) \
                or set(np.unique(tree).tolist()) != set(range(first, first + k)):
            raise ProtocolError(f"party {self.name!r}: the round before grew trees {first}..{first + k - 1}")
        arrays["tree"] = tree - first
        forest = HorizontalForest.from_arrays(arrays, n_trees=k, task="regression", algorithm=self.algorithm)
        return checked_structure(self.name, forest, self.schema.n_features)

    def _reply(self, vector: np.ndarray, h) -> Message:
        """The vector plain (one party, or no secure aggregation) or masked in the 64-bit ring."""
        if self.aggregator is None:
            return Message("boost_plain", {"plain": True}, {"sums": vector})
        if not self._agreed:
            raise ProtocolError(f"party {self.name!r}: no peer keys were relayed before the first masked "
                                "round")
        if h.get("mask_bits") != RING_BITS:
            raise ProtocolError(f"party {self.name!r}: boosting's sums are masked in the {RING_BITS}-bit "
                                f"ring, the master named {h.get('mask_bits')!r}")
        return Message("boost_masked", {}, {"masked": self.aggregator.mask(vector, h.int("round_id"),
                                                                           RING_BITS)})

