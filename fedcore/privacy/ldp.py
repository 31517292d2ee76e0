"""Local differential privacy for labels, RAPPOR-style, as in the Federated Extra-Trees paper.

Each sample's class ``c`` is Bloom-encoded into ``n_bits`` bits (``n_hashes`` positions taken from
SHA-256 of ``f"{c}:{i}"``, the digest read as a big-endian integer, mod ``n_bits``). A party then applies

1. permanent randomized response, once per sample and reused for every tree: keep each Bloom bit with
   probability ``keep_probability``, otherwise replace it by a fair coin;
2. instant randomized response, fresh for every report: send 1 with probability ``p_one_if_one`` if the
   permanent bit is 1 and ``p_one_if_zero`` if it is 0.

The master only sees per-group sums of instant bits and estimates class counts by non-negative
regression on the known report probabilities (``estimate_counts``). Privacy follows Erlingsson et al.
(2014): ``epsilon()["permanent"]`` bounds what any number of reports reveal, ``["instant"]`` one report.
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
from dataclasses import dataclass

import numpy as np

from fedcore.errors import LabelError, ParameterError

ESTIMATORS = ("nnls", "lasso")
SUM_WEIGHT = 1e3  # weight of the equation sum(proportions) = 1, against bit equations of scale <= 1
_CHUNK_ROWS = 1 << 15  # rows per random draw, to bound memory on large parties


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)


@dataclass(frozen=True)
class LabelLDP:
    """Parameters of the label mechanism; encode on the parties, estimate counts on the master."""

    n_bits: int = 32
    n_hashes: int = 4
    keep_probability: float = 0.5
    p_one_if_one: float = 0.8
    p_one_if_zero: float = 0.2
    estimator: str = "nnls"
    lasso_alpha: float = 0.01

    def __post_init__(self) -> None:
        if not _is_int(self.n_bits) or self.n_bits < 2:
            raise ParameterError(f"n_bits must be an integer >= 2, got {self.n_bits!r}: use a larger Bloom filter "
                                 "(e.g. n_bits=32)")
        if not _is_int(self.n_hashes) or not 1 <= self.n_hashes <= self.n_bits:
            raise ParameterError(f"n_hashes must be an integer with 1 <= n_hashes <= n_bits ({self.n_bits}), "
                                 f"got {self.n_hashes!r}: use fewer hashes or more bits")
        if not _is_real(self.keep_probability) or not 0 <= self.keep_probability <= 1:
            raise ParameterError(f"keep_probability must be a number in [0, 1], got {self.keep_probability!r}: "
                                 "it is the chance of keeping the true Bloom bit (smaller = more privacy)")
        p, q = self.p_one_if_zero, self.p_one_if_one
        if not (_is_real(p) and _is_real(q) and 0 <= p < q <= 1):
            raise ParameterError(f"need 0 <= p_one_if_zero < p_one_if_one <= 1, got p_one_if_zero={p!r}, "
                                 f"p_one_if_one={q!r}: a report must be more likely 1 when its bit is 1 "
                                 "(e.g. 0.2 and 0.8)")
        if self.estimator not in ESTIMATORS:
            raise ParameterError(f"estimator must be 'nnls' or 'lasso', got {self.estimator!r}")
        if not _is_real(self.lasso_alpha) or self.lasso_alpha < 0:
            raise ParameterError(f"lasso_alpha must be a finite number >= 0, got {self.lasso_alpha!r}: "
                                 "it is the L1 penalty on estimated class proportions (e.g. 0.01)")

    def class_patterns(self, n_classes: int) -> np.ndarray:
        """Bloom bits of each class code, (n_classes, n_bits) uint8; the same on every party and the master."""
        return _patterns(self.n_bits, self.n_hashes, _check_n_classes(n_classes)).copy()

    def check_classes(self, n_classes: int) -> None:
        """Refuse a class count the Bloom patterns cannot tell apart, before any sample is encoded."""
        _design(self, _check_n_classes(n_classes))

    def permanent_bits(self, labels: np.ndarray, n_classes: int, rng: np.random.Generator) -> np.ndarray:
        """Permanent randomized response of each sample's Bloom bits, (n, n_bits) uint8: draw once, reuse per tree."""
        labels = _check_labels(labels, n_classes)
        self.check_classes(n_classes)
        bloom = _patterns(self.n_bits, self.n_hashes, n_classes)
        keep = self.keep_probability
        coin_one = keep + (1.0 - keep) / 2.0  # one uniform per bit: [0, keep) keeps, then 1 / 0 half each
        out = np.empty((labels.shape[0], self.n_bits), dtype=np.uint8)
        for start in range(0, labels.shape[0], _CHUNK_ROWS):
            rows = slice(start, start + _CHUNK_ROWS)
            u = rng.random((labels[rows].shape[0], self.n_bits))
            out[rows] = np.where(u < keep, bloom[labels[rows]], u < coin_one)
        return out

    def instant_bits(self, permanent: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Instant randomized response of permanent bits, same shape uint8: draw fresh for every report."""
        permanent = np.asarray(permanent)
        if permanent.ndim != 2 or permanent.shape[1] != self.n_bits:
            raise ParameterError(f"permanent bits must have shape (n_samples, {self.n_bits}), got {permanent.shape}; "
                                 "pass the output of permanent_bits with the same LabelLDP")
        if permanent.size and (not np.issubdtype(permanent.dtype, np.integer) or permanent.min() < 0
                               or permanent.max() > 1):
            raise ParameterError("permanent bits must be integers 0 or 1; pass the output of permanent_bits")
        out = np.empty(permanent.shape, dtype=np.uint8)
        for start in range(0, permanent.shape[0], _CHUNK_ROWS):
            rows = slice(start, start + _CHUNK_ROWS)
            block = permanent[rows]
            u = rng.random(block.shape)
            out[rows] = u < np.where(block == 1, self.p_one_if_one, self.p_one_if_zero)
        return out

    def report_probabilities(self, n_classes: int) -> np.ndarray:
        """P(instant bit = 1 | class), (n_classes, n_bits) float64: the design of the count estimation."""
        bloom = _patterns(self.n_bits, self.n_hashes, _check_n_classes(n_classes)).astype(np.float64)
        p_permanent_one = self.keep_probability * bloom + (1.0 - self.keep_probability) / 2.0
        return self.p_one_if_zero + (self.p_one_if_one - self.p_one_if_zero) * p_permanent_one

    def estimate_counts(self, bit_sums: np.ndarray, totals: np.ndarray, n_classes: int) -> np.ndarray:
        """Estimated class counts (..., n_classes) >= 0 of groups from their summed instant bits and sizes."""
        design = _design(self, _check_n_classes(n_classes))
        bit_sums = np.asarray(bit_sums, dtype=np.float64)
        totals = np.asarray(totals, dtype=np.float64)
        if bit_sums.ndim < 1 or bit_sums.shape[-1] != self.n_bits:
            raise ParameterError(f"bit_sums must have shape (..., {self.n_bits}), got {bit_sums.shape}")
        if totals.shape != bit_sums.shape[:-1]:
            raise ParameterError(f"totals must have shape {bit_sums.shape[:-1]} (one size per group of bit_sums), "
                                 f"got {totals.shape}")
        if not (np.isfinite(bit_sums).all() and np.isfinite(totals).all()) or (totals < 0).any():
            raise ParameterError("bit_sums and totals must be finite and totals >= 0 (group sizes)")
        lead = totals.shape
        sums, sizes = bit_sums.reshape(-1, self.n_bits), totals.reshape(-1)
        proportions = np.zeros((sizes.shape[0], n_classes))
        filled = sizes > 0
        if filled.any():
            proportions[filled] = design.proportions(sums[filled] / sizes[filled, None], self)
        return (proportions * sizes[:, None]).reshape(*lead, n_classes)

    def epsilon(self) -> dict[str, float]:
        """RAPPOR's privacy levels: 'permanent' (any number of reports) and 'instant' (a single report)."""
        f, p, q, k = 1.0 - self.keep_probability, self.p_one_if_zero, self.p_one_if_one, self.n_hashes
        permanent = math.inf if f == 0 else 2 * k * math.log((1 - f / 2) / (f / 2))
        q_star = f / 2 * (p + q) + (1 - f) * q
        p_star = f / 2 * (p + q) + (1 - f) * p
        numerator, denominator = q_star * (1 - p_star), p_star * (1 - q_star)
        instant = math.inf if denominator == 0 else k * math.log(numerator / denominator)
        return {"permanent": permanent, "instant": instant}


def _check_n_classes(n_classes: int) -> int:
    if not _is_int(n_classes) or n_classes < 1:
        raise ParameterError(f"n_classes must be an integer >= 1, got {n_classes!r}")
    return int(n_classes)


def _check_labels(labels: np.ndarray, n_classes: int) -> np.ndarray:
    _check_n_classes(n_classes)
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
        raise LabelError(f"labels must be a 1-D array of integer class codes, got dtype {labels.dtype}, "
                         f"shape {labels.shape}; encode classes as 0..n_classes-1 first")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise LabelError(f"labels must be class codes in 0..{n_classes - 1}, found values from {labels.min()} "
                         f"to {labels.max()}; encode classes as 0..n_classes-1 first")
    return labels.astype(np.intp, copy=False)


@functools.lru_cache(maxsize=64)
def _patterns(n_bits: int, n_hashes: int, n_classes: int) -> np.ndarray:
    """Cached, read-only Bloom bits of classes 0..n_classes-1."""
    bloom = np.zeros((n_classes, n_bits), dtype=np.uint8)
    for c in range(n_classes):
        for i in range(n_hashes):
            digest = hashlib.sha256(f"{c}:{i}".encode()).digest()
            bloom[c, int.from_bytes(digest, "big") % n_bits] = 1
    bloom.setflags(write=False)
    return bloom


class _Design:
    """Pseudo-inverses of the estimation equations, computed once per (mechanism, n_classes)."""

    def __init__(self, probabilities: np.ndarray) -> None:
        n_classes, n_bits = probabilities.shape
        self.bits = probabilities.T  # (n_bits, n_classes): E[bit proportion] = bits @ class proportions
        self.full = np.vstack([self.bits, np.full((1, n_classes), SUM_WEIGHT)])
        self.full_pinv = np.linalg.pinv(self.full)
        self.bits_pinv = np.linalg.pinv(self.bits)
        # d with bits.T @ d = -1: NNLS on target y + alpha d minimises 0.5||bits x - y||^2 + alpha sum(x)
        self.lasso_shift = np.linalg.lstsq(self.bits.T, -np.ones(n_classes), rcond=None)[0]

    def proportions(self, observed: np.ndarray, ldp: LabelLDP) -> np.ndarray:
        """Class proportions (g, n_classes) >= 0 summing to ~1 from observed bit proportions (g, n_bits)."""
        target = np.hstack([observed, np.full((observed.shape[0], 1), SUM_WEIGHT)])
        if ldp.estimator == "nnls":
            return _nnls_rows(self.full, self.full_pinv, target)
        # lasso: select the classes present (RAPPOR), then refit with the sum equation on that support
        selected = _nnls_rows(self.bits, self.bits_pinv, observed + ldp.lasso_alpha * self.lasso_shift) > 0
        selected[~selected.any(axis=1)] = True  # nothing survived the penalty: fall back to every class
        out = np.zeros((observed.shape[0], self.bits.shape[1]))
        patterns, which = np.unique(selected, axis=0, return_inverse=True)
        for index, support in enumerate(patterns):
            rows = np.flatnonzero(which.reshape(-1) == index)
            columns = self.full[:, support]
            out[np.ix_(rows, np.flatnonzero(support))] = _nnls_rows(columns, np.linalg.pinv(columns), target[rows])
        return out


@functools.lru_cache(maxsize=64)
def _design(ldp: LabelLDP, n_classes: int) -> _Design:
    """Check that the classes are identifiable and build their estimation design."""
    bloom = _patterns(ldp.n_bits, ldp.n_hashes, n_classes)
    where = f"n_classes={n_classes} with n_bits={ldp.n_bits}, n_hashes={ldp.n_hashes}"
    fix = "use more bits (n_bits) or fewer hashes (n_hashes)"
    _, first, which = np.unique(bloom, axis=0, return_index=True, return_inverse=True)
    shared = np.flatnonzero(first[which.reshape(-1)] != np.arange(n_classes))
    if shared.size:
        other = int(first[which.reshape(-1)[shared[0]]])
        raise ParameterError(f"LDP Bloom patterns cannot represent {where}: classes {other} and {int(shared[0])} "
                             f"share a Bloom pattern; {fix}")
    probabilities = ldp.report_probabilities(n_classes)
    rank = int(np.linalg.matrix_rank(probabilities))
    if rank < n_classes:
        if ldp.keep_probability == 0 and n_classes > 1:
            fix = "keep_probability=0 makes reports independent of the label; use keep_probability > 0"
        raise ParameterError(f"LDP Bloom patterns cannot represent {where}: the estimation design matrix has "
                             f"rank {rank} < n_classes; {fix}")
    return _Design(probabilities)


MAX_ENUMERATED_CLASSES = 8
"""Up to this many classes, rows needing NNLS are solved together by enumerating supports (exact, vectorised);
above it, one Lawson-Hanson solve per row."""


def _nnls_rows(matrix: np.ndarray, pinv: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """min ||matrix x - y||, x >= 0, for each row y of targets; least squares rows that are already >= 0."""
    solutions = targets @ pinv.T
    negative = np.flatnonzero((solutions < 0).any(axis=1))
    if len(negative) and matrix.shape[1] <= MAX_ENUMERATED_CLASSES:
        solutions[negative] = _nnls_by_supports(matrix, targets[negative])
    else:
        for row in negative:
            solutions[row] = nnls(matrix, targets[row])
    return solutions


def _nnls_by_supports(matrix: np.ndarray, targets: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Exact NNLS for many rows sharing one matrix: the optimum is the least-squares solution on its own
    support, and that is the feasible (non-negative) support solution with the smallest residual, so
    trying every support (2**n - 1 of them) finds it. Works on the normal equations: with G = A'A and
    b = A'y, a support S has x = G_SS^-1 b_S and residual |y|^2 - x.b_S (the design has full column rank)."""
    n = matrix.shape[1]
    gram = matrix.T @ matrix
    supports = [np.flatnonzero([(mask >> j) & 1 for j in range(n)]) for mask in range(1, 1 << n)]
    inverses = [np.linalg.pinv(gram[np.ix_(s, s)]) for s in supports]
    out = np.zeros((targets.shape[0], n))
    for start in range(0, targets.shape[0], chunk):
        y = targets[start:start + chunk]
        b = y @ matrix
        squares = (y * y).sum(axis=1)
        best = squares.copy()  # the residual of x = 0, the empty support
        block = out[start:start + chunk]
        for support, inverse in zip(supports, inverses, strict=True):
            bs = b[:, support]
            x = bs @ inverse.T
            residual = squares - (x * bs).sum(axis=1)
            better = (x >= 0).all(axis=1) & (residual < best - 1e-12 * np.abs(best))
            if better.any():
                best[better] = residual[better]
                rows = np.flatnonzero(better)
                block[rows] = 0.0
                block[np.ix_(rows, support)] = x[better]
    return out


def nnls(matrix: np.ndarray, target: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares min ||matrix x - target||, x >= 0, by Lawson and Hanson's active set."""
    matrix = np.asarray(matrix, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    n = matrix.shape[1]
    max_iter = 3 * n if max_iter is None else max_iter
    tol = 10 * np.finfo(np.float64).eps * np.abs(matrix).sum(axis=0).max() * max(matrix.shape)
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    gradient = matrix.T @ target
    for _ in range(max_iter):
        if passive.all() or gradient[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(matrix[:, passive], target, rcond=None)[0]
            if not passive.any() or trial[passive].min() > 0:
                break
            blocking = passive & (trial <= 0)
            gap = x[blocking] - trial[blocking]
            step = np.min(np.divide(x[blocking], gap, out=np.zeros_like(gap), where=gap > 0))
            x = x + step * (trial - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = trial
        gradient = matrix.T @ (target - matrix @ x)
    return x
