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

import numba as nb
import numpy as np

from fedcore.errors import ProtocolError
from fedcore.privacy.accounting import GAUSSIAN_NOISE_BOUND

SUM_OF_PARTIES = ("the unmasked sum over all parties (secure aggregation masks each party's counts: none "
                  "can be named)")
"""Who a secure-aggregation sum's refusal names."""
FLOAT_SLACK = 1 + 2.0 ** -40
"""Relative room for the rounding of a noisy count (float64: 2^-52 per operation)."""


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
        if not np.issubdtype(counts.dtype, np.integer):
            raise ProtocolError(f"{who}: {what} must be integers, got {counts.dtype}")
        expected = self._expected.get(who)
        if expected is not None and expected.shape != (counts.shape[0], counts.shape[-1]):
            raise ValueError(f"{who}: {what} of shape {counts.shape} does not fit the open nodes' counts "
                             f"{expected.shape}")
        if counts.size:
            # one pass over the array (many classes make it the master's largest per level)
            known = expected if expected is not None else np.zeros((0, 0), np.int64)
            low, high, differ, bad, bad_size = _scan_counts(
                counts, known, expected is not None, rows, 1 if target_bits is not None else counts.shape[-1])
            _check_range(who, what, low, high, rows, target_bits)
            if target_bits is not None:
                c = counts.astype(np.int64)  # every value is now within 2**52 in magnitude
                if np.any(np.abs(c[..., 1]) > c[..., 0] << target_bits):
                    raise ProtocolError(_beyond_targets(who, what, target_bits))
            if differ >= 0:
                raise ProtocolError(f"{who}: {what}: the two branches of the {counts.shape[1]} candidates of "
                                    f"open node {differ} add up to different counts; every candidate splits "
                                    "the same rows")
            if bad >= 0 and expected is None:  # a batch's roots: every row sits in every root
                raise ProtocolError(f"{who}: {what}: the branches of root {bad} add up to {bad_size} rows, "
                                    f"not the {rows} declared in hello")
            if bad >= 0:
                raise ProtocolError(f"{who}: {what}: open node {bad} holds other counts than the branch that "
                                    "made it (its parent's chosen candidate, one level up)")
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


def _check_range(who: str, what: str, low: np.ndarray, high: np.ndarray, rows: int,
                 target_bits: int | None) -> None:
    """Counts in [0, rows]; regression: sums within rows x 2**target_bits (before any cast).

    `low`, `high`: each stat's (S) least and largest value over the array, in the array's own type.
    """
    n = slice(0, 1) if target_bits is not None else slice(None)
    least, most = int(low[n].min()), int(high[n].max())
    if least < 0 or most > rows:
        raise ProtocolError(f"{who}: {what} holds a count of {least if least < 0 else most}, outside "
                            f"[0, {rows}], the rows declared in hello")
    if target_bits is not None and max(-int(low[1]), int(high[1])) > rows << target_bits:
        raise ProtocolError(_beyond_targets(who, what, target_bits))


@nb.njit(cache=True)
def _scan_counts(counts: np.ndarray, expected: np.ndarray, has_expected: bool, rows: int,
                 size_stats: int) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Everything `CountLedger.check` needs of (A, k, 2, S) counts (size > 0), in one pass.

    Returns each stat's least and largest value (the array's type), the first open node whose candidates'
    branches add up to different counts, the first whose own counts (candidate 0) differ from `expected`
    (or, without, the first root whose first `size_stats` stats do not sum to `rows`) and that root's sum;
    -1 for none. Sums are int64, as the checks compare them once the range is proven.
    """
    low = counts[0, 0, 0].copy()
    high = counts[0, 0, 0].copy()
    own = np.zeros(counts.shape[3], np.int64)
    differ, bad, bad_size = -1, -1, 0
    for a in range(counts.shape[0]):
        if _scan_node(counts, a, low, high, own) and differ < 0:
            differ = a
        if bad < 0:
            size = own[:size_stats].sum()
            if has_expected and np.any(own != expected[a]) or not has_expected and size != rows:
                bad, bad_size = a, size
    return low, high, differ, bad, bad_size


@nb.njit(cache=True)
def _scan_node(counts: np.ndarray, a: int, low: np.ndarray, high: np.ndarray, own: np.ndarray) -> bool:
    """`_scan_counts` at open node `a`: extremes folded into low/high, candidate 0's sums into `own`.

    True when another candidate's branches add up to other counts.
    """
    differs = False
    for j in range(counts.shape[1]):
        for s in range(counts.shape[3]):
            left, right = counts[a, j, 0, s], counts[a, j, 1, s]
            low[s] = min(low[s], left, right)
            high[s] = max(high[s], left, right)
            both = np.int64(left) + np.int64(right)
            if j == 0:
                own[s] = both
            elif both != own[s]:
                differs = True
    return differs


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
    outside, differ = _scan_bit_sums(bit_sums, sizes) if bit_sums.size else (-1, -1)
    if outside >= 0:
        raise ProtocolError(f"{who}: fet_bit_sums.bit_sums at open node {outside} holds a bit "
                            "sum outside [0, its branch's size]: a branch sums one 0/1 report per row")
    if differ >= 0:
        raise ProtocolError(f"{who}: fet_bit_sums.bit_sums: the two branches of the candidates of open node "
                            f"{differ} add up to different bit sums; each row's one report is "
                            "counted under every candidate")


@nb.njit(cache=True)
def _scan_bit_sums(bit_sums: np.ndarray, sizes: np.ndarray) -> tuple[int, int]:
    """`check_bit_sums` in one pass: the first open node with a bit sum out of range, and with unequal sums.

    Out of range: outside [0, its branch's size]; unequal: its candidates' branches add up to different bit
    sums; -1 for none. In int64: a value of 2**63 or more in an unsigned array reads as negative, so as
    outside too.
    """
    n_open, k, _, n_bits = bit_sums.shape
    own = np.zeros(n_bits, np.int64)
    outside, differ = -1, -1
    for a in range(n_open):
        for j in range(k):
            for s in range(n_bits):
                left, right = np.int64(bit_sums[a, j, 0, s]), np.int64(bit_sums[a, j, 1, s])
                if outside < 0 and (left < 0 or right < 0 or left > np.int64(sizes[a, j, 0])
                                    or right > np.int64(sizes[a, j, 1])):
                    outside = a
                if j == 0:
                    own[s] = left + right
                elif differ < 0 and left + right != own[s]:
                    differ = a
    return outside, differ


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
