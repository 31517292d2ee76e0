"""The master's role in PPD-ERT.

The level strategy of the one grower (`fedcore/trees/grower.py`) that sums the parties' masked counts of the
seed-shared candidates (see the package doc).
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedcore.algorithms import PPD_ERT
from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.boxes import NodeBoxes, box_bytes_per_node, span_thresholds
from fedcore.horizontal.counts import SUM_OF_PARTIES
from fedcore.horizontal.fet.gdp import combined_node_stats, shrunk_proportions, unbiased_sizes
from fedcore.horizontal.growth import (
    BranchStatsLevels,
    LevelResult,
    ProgressCallback,
)
from fedcore.horizontal.ledgers import AgreedLedger
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.ppdert.agreed import (
    candidate_draws,
    check_threshold_mode,
    domain_fingerprint,
    domain_thresholds,
)
from fedcore.horizontal.ppdert.cells import (
    CELL_RING_BITS,
    DEFAULT_CELLS,
    populated_cells,
    populated_spans,
)
from fedcore.horizontal.ppdert.rounds import MaskedRounds
from fedcore.horizontal.ppdert.sums import DistributedSums
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy.secagg import MODULUS_BITS, ring_bits_for
from fedcore.privacy.settings import DistributedDP
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport
from fedcore.trees.grower import Level

REPLIES = {"ppdert_level": ("ppdert_masked_counts", "ppdert_plain_counts", "counts"),
           "ppdert_counts": ("ppdert_masked_counts", "ppdert_plain_counts", "counts"),
           "ppdert_cells": ("ppdert_masked_cells", "ppdert_plain_cells", "cells")}
"""Request kind -> (masked reply kind, plain reply kind, the plain reply's array); masked replies carry
`masked`."""


class PPDERTMaster(BranchStatsLevels):
    """Coordinates one PPD-ERT training over a transport (see module doc)."""

    algorithm = PPD_ERT.id

    def __init__(self, transport: Transport, params: ExtraTreesParams, schema: HorizontalSchema, *,
                 low: np.ndarray, high: np.ndarray, session_id: bytes | None = None,
                 progress: ProgressCallback | None = None, secure: bool = True,
                 memory_budget: int | None = None, thresholds: str = "histogram",
                 n_cells: int = DEFAULT_CELLS, dp: DistributedDP | None = None) -> None:
        """The PPD-ERT master over the parties' declared domains (`low`, `high`).

        `thresholds`: "histogram" (within the populated grid cells of each node, see `cells.py`) or "domain"
        (the paper's: uniform in the declared domain); `n_cells`: the histogram grid's size. `dp`: privacy
        secagg-dp's agreed budget (domain thresholds, secure aggregation): the parties' noisy sums are read
        with the plan's noise (`DistributedSums`).
        """
        super().__init__(transport, params, schema, progress, memory_budget)
        self.thresholds, self.n_cells = check_threshold_mode(thresholds, n_cells)
        self._boxes: NodeBoxes | None = None
        self.secure = bool(secure)
        self.low, self.high = np.asarray(low, np.float64), np.asarray(high, np.float64)
        if session_id is None:
            session_id = hashlib.sha256(f"fedforest-ppdert|{params.random_state}|{'|'.join(self.parties)}"
                                        .encode()).digest()[:16]
        self.session_id = session_id
        self.rounds = MaskedRounds(transport, self.secure)
        self.mask_bits = MODULUS_BITS  # until the parties' row counts are known (hello)
        self.dp = DistributedSums(dp, params, self.k) if dp is not None else None
        if self.dp is not None and (self.thresholds != "domain" or not self.secure):
            raise ParameterError("privacy 'secagg-dp' needs domain thresholds and secure aggregation")

    def counters(self) -> dict[str, int]:
        """The secure-aggregation round id, checkpointed so a resumed run numbers rounds as before."""
        return {"round_id": self.rounds.round_id}

    def restore_counters(self, counters: dict[str, int]) -> None:
        """Continue numbering rounds from a checkpoint's `counters`."""
        self.rounds.round_id = counters["round_id"]

    def master_bytes_per_node(self) -> int:
        """The master's bytes per open node, with what histogram thresholds add.

        Histogram thresholds add the nodes' boxes (`box_bytes_per_node`: the k narrowed intervals per node)
        and the parties' extreme-cell indicators (one 64-bit vector per party and their sum).
        """
        extra = 0
        if self.thresholds == "histogram":
            cells = self.k * 2 * self.n_cells * 8 * (len(self.parties) + 1)
            extra = box_bytes_per_node(self.k) + cells
        return super().master_bytes_per_node() + extra

    def party_bytes_per_node(self) -> int:
        """Histogram thresholds: each party keeps the nodes' boxes too."""
        return box_bytes_per_node(self.k) if self.thresholds == "histogram" else 0

    def setup(self) -> None:
        """Greet every party, size the mask ring and collect the parties' signed secure-aggregation keys."""
        header = {"algorithm": self.algorithm, "schema": self.schema.fingerprint(),
                  "domains": domain_fingerprint(self.low, self.high), "k": self.k,
                  "n_parties": len(self.parties), "session_id": self.session_id.hex(), "secure": self.secure,
                  "thresholds": self.thresholds, "n_cells": self.n_cells}
        if self.dp is not None:
            header.update(self.dp.hello_terms())
        replies = self.transport.exchange({name: Message("hello", header) for name in self.parties})
        self._note_parties(replies)
        # the narrowest ring that holds any count's sum over all rows: fewer key-stream and wire bytes
        largest = sum(self.party_rows.values())
        if self.dp is not None:  # noisy row counts and noisy sums: the most their noise can reach
            largest = self.dp.check_hello(replies, self.party_rows)
        self.mask_bits = ring_bits_for(largest)
        self.rounds.collect_keys(replies)

    def _level(self, trees, depth, act_tree, act_node, transition) -> LevelResult:
        features, u = candidate_draws(self.params.random_state, act_tree, depth,
                                      self.schema.n_features, self.k)
        header = {"depth": depth, "n_trees": len(trees)}
        arrays = {"tree": act_tree.astype(np.int32)}
        if transition is None:
            self._new_batch(header)
            if self.thresholds == "histogram":
                self._boxes = NodeBoxes.roots(self.low, self.high, len(act_tree))
        else:
            arrays.update(transition)
        self._relay_keys(header, arrays)
        if self.thresholds == "domain":
            thresholds = domain_thresholds(features, u, self.low, self.high)
            valid = np.ones(features.shape, dtype=bool)
            counts, plain = self._sum("ppdert_level", header, arrays, self.mask_bits)
        else:
            boxes = self._boxes
            assert boxes is not None, "histogram thresholds: the batch's first level made the root boxes"
            grid_low, grid_high = boxes.grid(features)
            header["n_cells"] = self.n_cells
            arrays.update(grid_low=grid_low, grid_high=grid_high)
            cells, _ = self._sum("ppdert_cells", header, arrays, CELL_RING_BITS)
            if cells.size != features.size * 2 * self.n_cells:
                raise ProtocolError(f"aggregated cell indicators have {cells.size} entries, expected "
                                    f"{features.size * 2 * self.n_cells}")
            first, last = populated_cells(cells.reshape(*features.shape, 2, self.n_cells), self.n_cells)
            span_low, span_high, has = populated_spans(first, last, grid_low, grid_high, self.n_cells)
            thresholds, valid = span_thresholds(span_low, span_high, has, u)
            boxes.narrow(features, span_low, span_high, has)
            counts, plain = self._sum("ppdert_counts", {"depth": depth},
                                      {"first_cell": first, "last_cell": last}, self.mask_bits)
        shape = (*features.shape, 2, self.n_stats)
        if self.dp is not None:
            branch = self.dp.check_sums(counts, shape)
            return LevelResult(features, thresholds, valid, branch, unbiased_sizes(branch, self.params.task))
        self._check_counts(counts, plain, shape)
        # exact integer sums, added up as they are read (`best_of_counts`)
        return LevelResult(features, thresholds, valid, None, counts=[counts.reshape(shape)])

    def node_estimates(self, result: LevelResult) -> tuple[np.ndarray, np.ndarray]:
        """secagg-dp: FET-GDP's noise-aware estimates (`fedcore/horizontal/fet/gdp.py`); else exact."""
        if self.dp is None:
            return super().node_estimates(result)
        assert result.branch is not None, "noisy statistics come summed, as `branch`"
        stats = combined_node_stats(result.branch, self._open_stats)
        return stats, unbiased_sizes(stats, self.params.task)

    def node_values(self, stats: np.ndarray, parent_values: np.ndarray | None = None) -> np.ndarray:
        """secagg-dp: proportions projected and shrunk by the sums' noise (`gdp.py`); else exact."""
        if self.dp is None:
            return super().node_values(stats)
        return shrunk_proportions(stats, parent_values, self.dp.variance())

    def agreed_ledger(self) -> AgreedLedger | None:
        """secagg-dp: the agreed plan's terms, each party's totals recomputed by the master's accountant."""
        return self.dp.agreed_ledger() if self.dp is not None else None

    def _check_counts(self, counts: np.ndarray, plain: dict[str, np.ndarray], shape: tuple[int, ...]) -> None:
        """Refuse counts no party could hold (`fedcore/horizontal/counts.py`).

        Plain counts party by party, each named; masked ones only as their sum over all parties, against
        the rows they declared together: each party's own vector is uniformly masked, so nothing about a
        single party can be checked, nor a party named.
        """
        size = int(np.prod(shape))
        if counts.size != size:
            raise ProtocolError(f"aggregated counts have {counts.size} entries, expected {size}")
        for name, part in plain.items():
            self.counts.check(f"party {name!r}", "ppdert_plain_counts.counts", part.reshape(shape),
                              self.party_rows[name])
        if plain:
            return
        if counts.size and int(counts.min()) < 0:  # counts cannot be negative: a sum wrapped around the ring
            raise ProtocolError(f"the masked counts sum to negative values in the {self.mask_bits}-bit ring: "
                                "a party counted more rows than it reported, or masked in another ring")
        self.counts.check(SUM_OF_PARTIES, "ppdert_masked_counts", counts.reshape(shape),
                          sum(self.party_rows.values()))

    def advance(self, level: Level, split_idx: np.ndarray, left: np.ndarray, child_open: np.ndarray,
                next_pos: np.ndarray) -> None:
        """Besides the shared transition: the open children's boxes (histogram thresholds)."""
        super().advance(level, split_idx, left, child_open, next_pos)
        if self.thresholds == "histogram":
            assert self._boxes is not None, "histogram thresholds: every level has its open nodes' boxes"
            self._boxes = self._boxes.after_level(level, split_idx, next_pos)

    def _relay_keys(self, header: dict, arrays: dict) -> None:
        """The first request of the session relays every party's signed public key (`rounds.py`)."""
        self.rounds.relay_keys(header, arrays)

    def _sum(self, kind: str, header: dict, arrays: dict,
             bits: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One round under a fresh round id (`MaskedRounds.exchange`, the reply kinds of `kind`)."""
        return self.rounds.exchange(kind, header, arrays, bits, REPLIES[kind])
