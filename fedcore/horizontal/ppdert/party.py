"""The institution's role in PPD-ERT.

Its rows, the protocol table it answers (`PPDERT_PROTOCOL`) and the masked class counts of the seed-shared
candidates (see the package doc).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.algorithms import PPD_ERT
from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.boxes import NodeBoxes, span_thresholds
from fedcore.horizontal.ledgers import LEDGER
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.ppdert.agreed import (
    candidate_draws,
    check_threshold_mode,
    domain_fingerprint,
    ppdert_candidates,
)
from fedcore.horizontal.ppdert.cells import (
    CELL_RING_BITS,
    DEFAULT_CELLS,
    NO_CELL,
    cell_multipliers,
    extreme_cell_indicators,
    populated_spans,
)
from fedcore.horizontal.ppdert.keys import announced_parties, signed_key, verified_peer_keys
from fedcore.horizontal.rows import PartyRows, check_hello, level_decisions, narrow, own_rows, receive_model
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy.secagg import MODULUS_BITS, RING_BITS
from fedcore.protocol.dispatch import Protocol, Step
from fedcore.protocol.messages import Arrays, Header, Message
from fedcore.trees.budget import default_budget

if TYPE_CHECKING:
    from fedcore.compute.dask_rows import DaskPartyRows
    from fedcore.horizontal.ppdert.noise import DistributedNoise
    from fedcore.privacy.keyauth import PartyIdentity
    from fedcore.privacy.secagg import SecureAggregator


log = logging.getLogger(__name__)

COUNT_REPLIES = ("ppdert_masked_counts", "ppdert_plain_counts")

PPDERT_PROTOCOL = Protocol(
    "PPD-ERT", initial="idle",
    states={"idle": "no session: before hello, or after the model",
            "greeted": "after hello",
            "celled": "after a level's ppdert_cells (histogram thresholds)",
            "counted": "after a level's counts"},
    steps=[
        Step("idle", "hello", "greeted", "hello_reply"),
        Step(("greeted", "counted"), "ppdert_level", "counted", COUNT_REPLIES, roles={"domain"}),
        Step(("greeted", "counted"), "ppdert_cells", "celled", ("ppdert_masked_cells", "ppdert_plain_cells"),
             roles={"histogram"}),
        Step("celled", "ppdert_counts", "counted", COUNT_REPLIES, roles={"histogram"}),
        # from greeted: every batch was restored from checkpoints
        Step(("greeted", "counted"), "model", "idle", "ack"),
    ])
"""What a PPD-ERT party answers, in which order; the role is its threshold mode (see
fedcore.protocol.dispatch): never FET's messages, whose per-party min/max ranges would reveal exactly
what PPD-ERT keeps private, and never a histogram round when it agreed to domain thresholds."""


class PPDERTParty:
    """One institution in PPD-ERT: regenerates the candidates from the shared seed, masks its counts.

    It holds its rows and counts them like a FET party (`PartyRows`), but answers only `PPDERT_PROTOCOL`.
    """

    algorithm = PPD_ERT.id
    protocol = PPDERT_PROTOCOL
    reports_per_row = 0
    """Noise counters an institution agent checkpoints per batch (`HorizontalInstitutionAgent`): PPD-ERT adds
    no noise, so they stay zero."""
    reports = 0

    def __init__(self, name: str, frame: pd.DataFrame | None, schema: HorizontalSchema, *, seed: int,
                 low: np.ndarray, high: np.ndarray, k: int, secure: bool = True,
                 identity: PartyIdentity | None = None, memory_budget: int | None = None,
                 thresholds: str = "histogram", n_cells: int = DEFAULT_CELLS,
                 rows: DaskPartyRows | None = None, noise: DistributedNoise | None = None,
                 expected_parties: int | None = None) -> None:
        """Encode this party's rows with the agreed schema and keep its PPD-ERT settings.

        `identity` signs this party's secure-aggregation key and verifies its peers' (required with secure
        aggregation and more than one party). `memory_budget`: bytes this party grows tree batches in
        (default: a share of its available memory), reported in `hello_reply` (`fedcore.trees.budget`).
        `thresholds`, `n_cells`: what this party agrees to reveal (see `PPDERTMaster`); the master's hello
        must name the same. `rows`: the rows already on a Dask cluster (`fedcore.compute.dask_rows`),
        instead of `frame` (then None). `noise`: privacy secagg-dp, this party's share of the noise and its
        own budget (`noise.py`); it needs domain thresholds and secure aggregation. `expected_parties`: the
        institutions of its own federation; a master announcing another count is refused (None: in-process
        use).
        """
        self.name = name
        self.expected_parties = expected_parties
        self.protocol_role, self.n_cells = check_threshold_mode(thresholds, n_cells)
        self.memory_budget = memory_budget
        self.schema = schema
        self.privacy = "secagg" if secure else "none"
        self.noise = noise
        if noise is not None:
            if self.protocol_role != "domain" or not secure:
                raise ParameterError(f"party {name!r}: privacy 'secagg-dp' needs domain thresholds and "
                                     "secure aggregation (histogram grids reveal extreme cells; plain counts "
                                     "would carry 1/P of the noise)")
            self.privacy = "secagg-dp"
        self.rows: PartyRows | DaskPartyRows = own_rows(name, frame, schema, rows)
        if isinstance(self.rows, PartyRows):  # in process: the encoded rows, as before
            self.X, self.y = self.rows.X, self.rows.y
        self.n_rows = self.rows.n_rows
        self.model: HorizontalForest | None = None
        self.identity = identity
        self._key_context = b""
        self._n_parties = 0
        self.secure = bool(secure)
        self.seed = int(seed)
        self.low, self.high, self.k = np.asarray(low, np.float64), np.asarray(high, np.float64), int(k)
        self.aggregator: SecureAggregator | None = None
        self._agreed = False
        self._secret = b""
        # the level's candidate intervals and shared uniforms (histogram thresholds)
        self._grid = (np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)))
        # the open nodes' boxes (histogram thresholds), derived as the master derives them: a grid the
        # master sends must be exactly the node's box, so no request can locate values more finely
        self._boxes: NodeBoxes | None = None
        # the session's secure-aggregation ring, fixed by its first masked level
        self._ring: int | None = None
        self.machine = PPDERT_PROTOCOL.start(log)

    def handle(self, message: Message) -> Message:
        """Answer one protocol message.

        Refuse it (ProtocolError) when it is not the next one of `PPDERT_PROTOCOL`.
        """
        return self.machine.handle(self, message)

    def __getstate__(self) -> dict:
        """The party to pickle (a fitted estimator's): its model and rows, without its session's secrets.

        The signing identity, the masking keys and the cell multipliers serve one session and cannot, or must
        not, be written out. An unpickled party predicts, and refuses a secure session until it is given an
        identity; the estimator makes new parties to fit again.
        """
        state = self.__dict__.copy()
        state.update(identity=None, aggregator=None, _secret=b"")
        return state

    def privacy_spent(self) -> dict:
        """What this party has released in its own accounting: secagg-dp, its ledger; else nothing (sums)."""
        ledger = self.noise.ledger if self.noise is not None else None
        return ledger.to_dict() if ledger is not None else {}

    def _on_hello(self, message: Message) -> Message:
        h = message.header
        check_hello(self.name, self.algorithm, self.schema, h)
        if h.get("domains") != domain_fingerprint(self.low, self.high):
            raise ProtocolError(f"party {self.name!r}: the master's feature domains differ from the party's "
                                "declared ranges; both must come from the same data contract")
        if (h.get("thresholds", "domain") != self.protocol_role
                or h.get("n_cells", self.n_cells) != self.n_cells):
            cells = f" on {self.n_cells} cells" if self.protocol_role == "histogram" else ""
            raise ProtocolError(f"party {self.name!r} agreed to {self.protocol_role!r} thresholds{cells}; "
                                f"the master asked for {h.get('thresholds')!r} on {h.get('n_cells')} cells")
        if h.get("k") != self.k:
            raise ProtocolError(f"party {self.name!r}: the master draws {h.get('k')} candidates per node, "
                                f"the party {self.k}")
        if bool(h.get("secure", True)) != self.secure:
            raise ProtocolError(f"party {self.name!r} runs PPD-ERT {'with' if self.secure else 'without'} "
                                "secure aggregation; the master asked for "
                                f"{'it' if h.get('secure', True) else 'plain counts'}")
        arrays: dict[str, np.ndarray] = {}
        header: dict[str, object] = {"n_rows": self.n_rows,
                                     "memory_budget": self.memory_budget or default_budget()}
        self._n_parties = announced_parties(self.name, h, self.expected_parties)
        if self.noise is not None:  # the plan under its own budget; a noisy row count replaces the exact one
            header.update(self.noise.start(h, self._n_parties, self.n_rows))
        elif h.get("privacy", "secagg") != "secagg":
            raise ProtocolError(f"party {self.name!r} is configured for privacy 'secagg', the master asked "
                                f"for {h.get('privacy')!r}; the party's own setting wins")
        self.aggregator, self._agreed, self._ring = None, False, None
        if self._n_parties > 1 and self.secure:
            self.aggregator, self._key_context, arrays, signed = signed_key(self.name, self.identity, h)
            self._secret = os.urandom(32)  # this session's multipliers of the cell indicators (`cells.py`)
            header.update(signed)
        return Message("hello_reply", header, arrays)

    def _on_ppdert_level(self, message: Message) -> Message:
        """Domain thresholds: apply the previous level, count the seed-shared candidates, mask."""
        act_tree = self._start_level(message)
        self.rows.features, self.rows.thresholds = ppdert_candidates(self.seed, act_tree,
                                                                     message.header.int("depth"), self.low,
                                                                     self.high, self.k)
        return self._counts(message.header)

    def _on_ppdert_cells(self, message: Message) -> Message:
        """Histogram thresholds, first round of a level.

        The indicators of the grid cells holding this party's smallest and largest value per candidate
        (`cells.py`). Everything is checked before the previous level's decisions are applied, so a refused
        request leaves the party where it was.
        """
        h, a = message.header, message.arrays
        act_tree = a.typed("tree", "iu").astype(np.int64)
        features, u = candidate_draws(self.seed, act_tree, h.int("depth"), len(self.low), self.k)
        grid_low, grid_high = (a.typed(name, "f", 2).astype(np.float64) for name in ("grid_low", "grid_high"))
        if grid_low.shape != features.shape or grid_high.shape != features.shape \
                or not (np.all(np.isfinite(grid_low)) and np.all(np.isfinite(grid_high))
                        and np.all(grid_low <= grid_high)):
            raise ProtocolError(f"party {self.name!r}: the grid must be finite intervals of shape "
                                f"{features.shape}")
        if h.get("n_cells") != self.n_cells:
            raise ProtocolError(f"party {self.name!r}: the level asks for {h.get('n_cells')} cells, the "
                                f"session agreed {self.n_cells}")
        boxes = self._level_boxes(h, a, len(act_tree))
        box_low, box_high = boxes.grid(features)
        if not (np.array_equal(grid_low, box_low) and np.array_equal(grid_high, box_high)):
            if h.get("new_batch"):
                raise ProtocolError(f"party {self.name!r}: a tree's root grid must be the declared domain of "
                                    "each candidate feature")
            raise ProtocolError(f"party {self.name!r}: a node's grid must be its box on each candidate "
                                "feature (its parent's, narrowed to the populated spans and cut at the "
                                "split); a narrower grid would locate the parties' values more finely")
        if self.aggregator is not None and h.get("mask_bits") != CELL_RING_BITS:
            raise ProtocolError(f"party {self.name!r}: cell indicators are masked in the "
                                f"{CELL_RING_BITS}-bit ring, the master named {h.get('mask_bits')!r}")
        self._start_level(message)
        self.rows.features, self.rows.thresholds = features, np.full(features.shape, np.nan)
        self._grid, self._boxes = (grid_low, grid_high, u), boxes
        low, high = self.rows.ranges()
        if self.aggregator is None:
            indicators = extreme_cell_indicators(low, high, grid_low, grid_high, self.n_cells).reshape(-1)
            return Message("ppdert_plain_cells", {"plain": True}, {"cells": indicators.astype(np.uint8)})
        if not self._agreed:
            raise ProtocolError(f"party {self.name!r}: no peer keys were relayed before the first masked "
                                "round")
        round_id = h.int("round_id", 0, (1 << 64) - 1)  # in range before its multipliers are drawn from it
        hidden = extreme_cell_indicators(low, high, grid_low, grid_high, self.n_cells, cell_multipliers(
            self._secret, round_id, low.size * 2 * self.n_cells)).reshape(-1)
        return Message("ppdert_masked_cells", {}, {"masked": self.aggregator.mask(
            hidden, round_id, CELL_RING_BITS, overwrite=True)})

    def _on_ppdert_counts(self, message: Message) -> Message:
        """Histogram thresholds, second round.

        The first and last populated cell of each candidate; the party places the thresholds itself (the
        shared uniform within that span, as the master does), then counts and masks as in the domain mode.
        """
        grid_low, grid_high, u = self._grid
        first, last = (message.arrays.typed(name, "iu", 2) for name in ("first_cell", "last_cell"))
        has = first != NO_CELL
        if first.shape != grid_low.shape or last.shape != grid_low.shape \
                or not (np.issubdtype(first.dtype, np.integer) and np.issubdtype(last.dtype, np.integer)) \
                or not np.array_equal(has, last != NO_CELL) \
                or np.any(has & ((first > last) | (last >= self.n_cells))):
            raise ProtocolError(f"party {self.name!r}: the populated cells must be first <= last < "
                                f"{self.n_cells} (or both {NO_CELL}) for each of the level's "
                                f"{grid_low.shape} candidates")
        span_low, span_high, has = populated_spans(first, last, grid_low, grid_high, self.n_cells)
        self.rows.thresholds = span_thresholds(span_low, span_high, has, u)[0]
        assert self._boxes is not None, "the level's cells request set the open nodes' boxes"
        self._boxes.narrow(self.rows.features, span_low, span_high, has)
        return self._counts(message.header)

    def _level_boxes(self, h: Header, a: Arrays, n_open: int) -> NodeBoxes:
        """The open nodes' boxes this level's grid must follow, from the party's own record.

        The declared domains at a batch's roots; deeper, the previous level's boxes after its decisions.
        Nothing is changed here: the caller keeps them once the whole request is accepted.
        """
        if h.get("new_batch"):
            return NodeBoxes.roots(self.low, self.high, self.rows.check_batch_start(h, n_open))
        if self._boxes is None:
            raise ProtocolError(f"party {self.name!r}: a level of a tree batch that was never started (the "
                                "first level of a batch carries new_batch)")
        features, thresholds = self.rows.features, self.rows.thresholds
        chosen, next_pos = self.rows.partition.check_decisions(*level_decisions(a), features,
                                                               thresholds)
        opened = next_pos[next_pos >= 0]
        if not np.array_equal(np.sort(opened), np.arange(n_open)):
            raise ProtocolError(f"party {self.name!r}: the request covers {n_open} open nodes; the previous "
                                "level's decisions must number its open children 0 to n - 1, one a node")
        return self._boxes.after_decisions(chosen, next_pos, features, thresholds)

    def _start_level(self, message: Message) -> np.ndarray:
        """Relayed peer keys (first level), the previous level's decisions; the open nodes' trees."""
        h, a = message.header, message.arrays
        if "peer_keys" in a:
            if self.aggregator is None:
                raise ProtocolError(f"party {self.name!r} got peer keys but the session has a single party")
            if self._agreed:
                raise ProtocolError(f"party {self.name!r}: peer keys were relayed already in this session")
            self.aggregator.agree(self._verified_peer_keys(h, a.typed("peer_keys", "u", 2)))
            self._agreed = True
        act_tree = a.typed("tree", "iu").astype(np.int64)
        self.rows.start_level(h, a, len(act_tree))
        return act_tree

    def _counts(self, h: Header) -> Message:
        """The class counts of the level's candidates.

        Plain (one party, or no secure aggregation) or masked in the session's ring.
        """
        if self.noise is not None:  # charged before anything is computed or drawn
            self.noise.charge(self.rows.active_slots_per_row())
        counts = self.rows.class_counts().reshape(-1)
        if self.noise is not None:
            counts = self.noise.noisy(counts.astype(np.int64), h.int("round_id", 0))
        if self.aggregator is None:
            return Message("ppdert_plain_counts", {"plain": True}, {"counts": narrow(counts)})
        if not self._agreed:
            raise ProtocolError(f"party {self.name!r}: no peer keys were relayed before the first masked "
                                "round")
        bits = h.get("mask_bits", MODULUS_BITS)
        largest = self.n_rows + (self._n_parties * self.noise.reach() if self.noise is not None else 0)
        if isinstance(bits, bool) or bits not in RING_BITS or largest >= 1 << (bits - 1):
            raise ProtocolError(f"party {self.name!r}: a {bits}-bit ring cannot hold the counts of its "
                                f"{self.n_rows} rows; the ring must be one of {list(RING_BITS)} and hold "
                                "every sum")
        if self._ring is None:
            self._ring = bits  # one ring per session: every level masks in the ring the first one named
        elif bits != self._ring:
            raise ProtocolError(f"party {self.name!r}: the master changed the ring from {self._ring} to "
                                f"{bits} bits within a session")
        return Message("ppdert_masked_counts", {},
                       {"masked": self.aggregator.mask(counts, h.int("round_id", 0), bits)})

    def _on_model(self, message: Message) -> Message:
        self.model = receive_model(self.name, self.algorithm, self.schema, message)
        self.rows.clear()
        self._boxes = None
        header: dict[str, object] = {"n_nodes": self.model.n_nodes}
        if self.noise is not None:  # its ledger's data-independent summary (`fedcore.horizontal.ledgers`)
            header[LEDGER] = self.noise.plan.summary()
        return Message("ack", header)

    def _verified_peer_keys(self, h: Header, rows: np.ndarray) -> dict[str, bytes]:
        """The relayed peers' public keys, each checked against its party's signature (`keys.py`)."""
        return verified_peer_keys(self.name, self._n_parties, self.identity, self.aggregator,
                                  self._key_context, h, rows)
