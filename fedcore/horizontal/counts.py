"""What the horizontal master checks of the parties' label statistics before it uses them.

A hostile institution could otherwise send negative or huge counts, or counts that contradict each other,
and skew every split silently (issue #27). The master refuses, with a ProtocolError naming the party, what it
can prove wrong from what it knows: each party's rows (its `hello`; in a federation also its `setup` reply),
its regression targets' magnitude (`y_exponent` in `hello`, which the master bounds there), the agreed GDP
noise scale (the plan's sigma: a `hello` stating another is refused), and what the same party sent one
level up. Every check is a few whole-array operations per party and level.

- **Exact counts** (`CountLedger`): FET `none` and PPD-ERT without masks per party, FET `ldp`'s branch sizes
  per party, and PPD-ERT with secure aggregation on the unmasked sum over all parties (each party's own
  vector is masked, so no check can name a party there). Integers in [0, rows]; under every candidate of a
  node the two branches add up to the same per-class counts (every candidate splits the same rows); at a
  batch's roots they add up to the rows declared; below, to the branch of the parent's chosen candidate that
  the same contributor sent one level up. Regression: the same for the counts and for the sums of quantised
  targets, and |sum of q| <= count x 2^bits, the bound the party's own `y_exponent` puts on each |q|.
- **LDP bit sums** (`check_bit_sums`): each in [0, the branch's size] (one report of 0/1 bits per row), and
  the same over both branches of every candidate of a node (each row's one report is added under every
  candidate).
- **GDP noisy counts** (`check_noisy_counts`): finite, and within the largest noise NumPy's normal sampler
  can draw (`GAUSSIAN_NOISE_BOUND`, about 13.7 sigma) of [0, rows], rows the most the party's noisy row
  count allows (its own noise bounded alike). Nothing else is provable: every count
  carries its own independent noise, so branches, candidates and levels need not add up, and a party can still
  bias a count by up to that bound without being caught.
"""

from __future__ import annotations

import numpy as np

from fedcore.errors import ProtocolError
from fedcore.privacy.accounting import GAUSSIAN_NOISE_BOUND

SUM_OF_PARTIES = ("the unmasked sum over all parties (secure aggregation masks each party's counts: none "
                  "can be named)")
"""Who a secure-aggregation sum's refusal names."""
FLOAT_SLACK = 1 + 2.0 ** -40
"""Relative room for the rounding of a noisy count (float64: 2^-52 per operation)."""


def _first_node(bad: np.ndarray) -> int:
    """The first open node (axis 0) with a True entry in `bad`."""
    return int(np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))[0])


class CountLedger:
    """Checks exact branch counts level by level: against each contributor's rows and its counts one level up.

    A contributor is named as refusals name it: `party 'a'`, or `SUM_OF_PARTIES`. The master calls `check` for
    every contributor's (A, k, 2, S) counts of a level, `advance` with the level's decisions, and
    `open_batch` at a new tree batch (whose roots hold every row).
    """

    def __init__(self) -> None:
        """No batch yet."""
        self._sent: dict[str, np.ndarray] = {}  # this level's counts, as each contributor sent them
        self._expected: dict[str, np.ndarray] = {}  # the open nodes' (A, S) counts: their parents' branches

    def open_batch(self) -> None:
        """A new tree batch: the next level is its roots."""
        self._sent, self._expected = {}, {}

    def check(self, who: str, what: str, counts: np.ndarray, rows: int,
              target_bits: int | None = None) -> None:
        """Refuse (ProtocolError naming `who`) counts that cannot be a contributor's of `rows` rows.

        `counts` (A, k, 2, S): class counts (or branch sizes, S = 1); with `target_bits` (regression) S = 2,
        (count, sum of quantised targets q), each |q| <= 2**target_bits. `what` names the array.
        """
        _check_range(who, what, counts, rows, target_bits)
        c = counts.astype(np.int64, copy=False)  # every value is now within 2**52 in magnitude
        if target_bits is not None and np.any(np.abs(c[..., 1]) > c[..., 0] << target_bits):
            raise ProtocolError(_beyond_targets(who, what, target_bits))
        node = c.sum(axis=2)  # (A, k, S): the node's counts under each candidate
        differ = node != node[:, :1]
        if differ.any():
            raise ProtocolError(f"{who}: {what}: the two branches of the {node.shape[1]} candidates of open "
                                f"node {_first_node(differ)} add up to different counts; every candidate "
                                "splits the same rows")
        own = node[:, 0]
        expected = self._expected.get(who)
        if expected is None:  # a batch's roots: every row sits in every root
            size = own[:, 0] if target_bits is not None else own.sum(axis=-1)
            short = size != rows
            if short.any():
                a = _first_node(short)
                raise ProtocolError(f"{who}: {what}: the branches of root {a} add up to {int(size[a])} rows, "
                                    f"not the {rows} declared in hello")
        else:
            differ = own != expected
            if differ.any():
                raise ProtocolError(f"{who}: {what}: open node {_first_node(differ)} holds other counts than "
                                    "the branch that made it (its parent's chosen candidate, one level up)")
        self._sent[who] = counts

    def advance(self, split_idx: np.ndarray, best: np.ndarray, child_open: np.ndarray) -> None:
        """The next level's open nodes: the chosen branches of the split nodes whose children stay open.

        `split_idx` are the split nodes, `best` every node's chosen candidate, `child_open` (left, right per
        split node) which children open, in the order of the next level's open nodes.
        """
        chosen = best[split_idx]
        self._expected = {who: sent[split_idx, chosen].reshape(-1, sent.shape[-1])[child_open]
                          .astype(np.int64) for who, sent in self._sent.items()}
        self._sent = {}


def _check_range(who: str, what: str, counts: np.ndarray, rows: int, target_bits: int | None) -> None:
    """Integers; counts in [0, rows]; regression: sums within rows x 2**target_bits (before any cast)."""
    if not np.issubdtype(counts.dtype, np.integer):
        raise ProtocolError(f"{who}: {what} must be integers, got {counts.dtype}")
    n = counts[..., :1] if target_bits is not None else counts
    if n.size:
        low, high = int(n.min()), int(n.max())
        if low < 0 or high > rows:
            raise ProtocolError(f"{who}: {what} holds a count of {low if low < 0 else high}, outside "
                                f"[0, {rows}], the rows declared in hello")
    if target_bits is not None and counts.size:
        sums = counts[..., 1]
        if max(-int(sums.min()), int(sums.max())) > rows << target_bits:
            raise ProtocolError(_beyond_targets(who, what, target_bits))


def _beyond_targets(who: str, what: str, target_bits: int) -> str:
    return (f"{who}: {what}: a branch's sum of quantised targets exceeds its count times 2**{target_bits}, "
            "the bound on each target from the magnitude declared in hello")


def check_bit_sums(who: str, bit_sums: np.ndarray, sizes: np.ndarray) -> None:
    """LDP: refuse bit sums (A, k, 2, n_bits) that the branch sizes (A, k, 2), already checked, cannot hold.

    A branch sums one randomized-response report per row, each bit 0 or 1; and each row's report is added
    under every candidate of its node, so both branches of every candidate sum to the same bits.
    """
    if not np.issubdtype(bit_sums.dtype, np.integer):
        raise ProtocolError(f"{who}: fet_bit_sums.bit_sums must be integers, got {bit_sums.dtype}")
    outside = bit_sums > sizes[..., None]
    if np.issubdtype(bit_sums.dtype, np.signedinteger):
        outside |= bit_sums < 0
    if outside.any():
        raise ProtocolError(f"{who}: fet_bit_sums.bit_sums at open node {_first_node(outside)} holds a bit "
                            "sum outside [0, its branch's size]: a branch sums one 0/1 report per row")
    node = bit_sums.sum(axis=2, dtype=np.int64)
    differ = node != node[:, :1]
    if differ.any():
        raise ProtocolError(f"{who}: fet_bit_sums.bit_sums: the two branches of the candidates of open node "
                            f"{_first_node(differ)} add up to different bit sums; each row's one report is "
                            "counted under every candidate")


def check_noisy_counts(who: str, what: str, counts: np.ndarray, rows: int, count_scale: float,
                       target_bits: int | None = None, sum_scale: float = 0.0) -> None:
    """GDP: refuse noisy counts that no count of `rows` rows plus the party's Gaussian noise can give.

    `rows`: the most rows the party can hold, its noisy row count in hello plus that count's largest noise
    (`fedcore.horizontal.plan.count_reach`).
    `counts` (A, k, 2, S) float64, noise of standard deviation `count_scale` (the agreed plan's sigma);
    regression (`target_bits`): column 1 is a sum of quantised targets, each |q| <= 2**target_bits, with
    noise of scale `sum_scale`. The sampler's noise is at most `GAUSSIAN_NOISE_BOUND` scales in magnitude, so
    that far beyond [0, rows] (or beyond rows x 2**target_bits for a sum) no honest party reaches.
    """
    if not np.issubdtype(counts.dtype, np.floating) or not np.all(np.isfinite(counts)):
        raise ProtocolError(f"{who}: {what} must be finite numbers")
    n = counts[..., :1] if target_bits is not None else counts
    reach = GAUSSIAN_NOISE_BOUND * count_scale
    if n.size:
        low, high = float(n.min()), float(n.max())
        if low < -reach * FLOAT_SLACK or high > (rows + reach) * FLOAT_SLACK:
            shown = low if low < -reach * FLOAT_SLACK else high
            raise ProtocolError(f"{who}: {what} holds a count of {shown:.6g}, further outside [0, {rows}] "
                                "(the most rows its noisy count in hello allows) than the largest Gaussian "
                                f"noise of the agreed scale can reach ({reach:.6g})")
    if target_bits is not None and counts.size:
        sums = counts[..., 1]
        bound = ((rows << target_bits) + GAUSSIAN_NOISE_BOUND * sum_scale) * FLOAT_SLACK
        if max(-float(sums.min()), float(sums.max())) > bound:
            raise ProtocolError(f"{who}: {what}: a branch's noisy sum of quantised targets exceeds "
                                f"{bound:.6g}: {rows} rows of targets within 2**{target_bits} (bounded in "
                                "hello) plus the largest Gaussian noise of the agreed scale")
