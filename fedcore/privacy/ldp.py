"""Local differential privacy for labels: each row's class randomized once, its report reused for every tree.

Mechanisms (`LabelLDP.mechanism`), all reporting a row as bits the master sums per branch:

* "krr" (k-ary / generalized randomized response, GRR): the row reports its class with probability
  e^eps / (e^eps + C - 1), else one of the other C - 1 classes uniformly; sent as a one-hot of C bits.
* "oue" (optimized unary encoding, Wang et al., USENIX Security 2017): the class one-hot in C bits, a 1
  kept with probability 1/2, a 0 turned to 1 with probability 1 / (e^eps + 1), each bit independently.
* "auto" (the default): GRR or OUE, whichever has the smaller variance for the classes (`resolved`).
* "bloom" (the FET paper's RAPPOR): each class Bloom-encoded into ``n_bits`` bits (``n_hashes`` positions
  from SHA-256 of ``f"{c}:{i}"``, read as a big-endian integer, mod ``n_bits``); a permanent randomized
  response (keep each bit with probability ``keep_probability``, else a fair coin), drawn once per row, and
  an instant one, fresh for every report (1 with probability ``p_one_if_one`` or ``p_one_if_zero``).

GRR and OUE report their permanent response itself (no instant step): every report of a row is the same
one, so the row's epsilon is that report's whatever the number of trees (post-processing). The Bloom
mechanism's ``epsilon()["permanent"]`` bounds any number of reports, ``["instant"]`` one (Erlingsson et
al., 2014). Every draw takes its random words by position (`fedcore.privacy.ldp_draws`): the permanent
response of row r, and the instant report of (report, tree slot, row r), each from its own counters under
the party's secret keys, so any block of rows draws exactly what the whole table draws for it.

The master only sees per-group sums of report bits and estimates class counts by non-negative regression
on the known report probabilities (``estimate_counts``, solved by `fedcore.privacy.nnls`: exact, compiled,
and the same for a group whatever other groups share the call; for GRR and OUE, whose design is a multiple
of the identity plus a constant, that regression is the projection of the debiased proportions onto the
simplex, in closed form).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import numbers
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

from fedcore.errors import LabelError, ParameterError
from fedcore.privacy import ldp_draws
from fedcore.privacy.nnls import SharedNNLS, simplex_projection

ESTIMATORS = ("nnls", "lasso")
MECHANISMS = ("auto", "krr", "oue", "bloom")
ONE_REPORT = ("auto", "krr", "oue")  # a row's one report, reused: epsilon is report_epsilon
DEFAULT_EPSILON = 2.0  # each row's label epsilon of the one-report mechanisms (docs/horizontal.md: why)
OUE_ONE = 0.5  # OUE: the probability that the class's own bit is reported as 1
MIN_AUTO_BITS = 32  # the smallest Bloom filter chosen when n_bits is left unset
SUM_WEIGHT = 1e3  # weight of the equation sum(proportions) = 1, against bit equations of scale <= 1


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> TypeGuard[float]:
    return (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
            and math.isfinite(value))


@dataclass(frozen=True)
class LabelLDP:
    """Parameters of the label mechanism; encode on the parties, estimate counts on the master.

    ``mechanism`` (see the module docstring): "auto" (the default: GRR or OUE by variance, `resolved`),
    "krr", "oue" (each at ``report_epsilon``, DEFAULT_EPSILON when unset; the Bloom fields do not apply) or
    "bloom" (the FET paper's RAPPOR: the Bloom fields; its epsilon follows from them).
    """

    mechanism: str = "auto"
    report_epsilon: float | None = None  # one-report mechanisms' epsilon (None: DEFAULT_EPSILON); bloom: None
    n_bits: int | None = None  # None: sized to the classes (`bits_for`)
    n_hashes: int = 4
    keep_probability: float = 0.5
    p_one_if_one: float = 0.8
    p_one_if_zero: float = 0.2
    estimator: str = "nnls"
    lasso_alpha: float = 0.01
    min_leaf_reports: int | None = None  # None: `leaf_floor` from the design

    def __post_init__(self) -> None:
        """Check the mechanism and its settings (ParameterError names a bad one)."""
        self._check_mechanism()
        self._check_bloom_filter()
        self._check_estimator()

    def _check_mechanism(self) -> None:
        """A known mechanism; a one-report one has its epsilon (filled in) and no Bloom size."""
        if self.mechanism not in MECHANISMS:
            raise ParameterError(f"mechanism must be one of {list(MECHANISMS)}, got {self.mechanism!r}")
        if self.mechanism in ONE_REPORT:
            if self.report_epsilon is None:
                object.__setattr__(self, "report_epsilon", DEFAULT_EPSILON)
            if not _is_real(self.report_epsilon) or self.report_epsilon <= 0:
                raise ParameterError(f"mechanism {self.mechanism!r} needs report_epsilon, a finite number > "
                                     f"0, got {self.report_epsilon!r}: each row's label epsilon (e.g. 2)")
            object.__setattr__(self, "report_epsilon", float(self.report_epsilon))
            if self.n_bits is not None:
                raise ParameterError(f"mechanism {self.mechanism!r} reports one bit per class: leave n_bits "
                                     "unset")
        elif self.report_epsilon is not None:
            raise ParameterError("report_epsilon applies to mechanisms 'auto', 'krr' and 'oue'; the Bloom "
                                 "mechanism's epsilon follows from n_hashes and keep_probability")

    def _check_bloom_filter(self) -> None:
        """The Bloom filter's size, hashes and response probabilities."""
        if self.n_bits is not None and (not _is_int(self.n_bits) or self.n_bits < 2):
            raise ParameterError(f"n_bits must be an integer >= 2, got {self.n_bits!r}: use a larger Bloom "
                                 "filter (e.g. n_bits=32), or leave it unset to size it to the classes")
        smallest = MIN_AUTO_BITS if self.n_bits is None else self.n_bits
        if not _is_int(self.n_hashes) or not 1 <= self.n_hashes <= smallest:
            raise ParameterError(f"n_hashes must be an integer with 1 <= n_hashes <= n_bits ({smallest}), "
                                 f"got {self.n_hashes!r}: use fewer hashes or more bits")
        if not _is_real(self.keep_probability) or not 0 <= self.keep_probability <= 1:
            raise ParameterError("keep_probability must be a number in [0, 1], got "
                                 f"{self.keep_probability!r}: it is the chance of keeping the true Bloom bit "
                                 "(smaller = more privacy)")
        p, q = self.p_one_if_zero, self.p_one_if_one
        if not (_is_real(p) and _is_real(q) and 0 <= p < q <= 1):
            raise ParameterError(f"need 0 <= p_one_if_zero < p_one_if_one <= 1, got p_one_if_zero={p!r}, "
                                 f"p_one_if_one={q!r}: a report must be more likely 1 when its bit is 1 "
                                 "(e.g. 0.2 and 0.8)")

    def _check_estimator(self) -> None:
        """The count estimator, its penalty and the leaf floor."""
        if self.estimator not in ESTIMATORS:
            raise ParameterError(f"estimator must be 'nnls' or 'lasso', got {self.estimator!r}")
        if not _is_real(self.lasso_alpha) or self.lasso_alpha < 0:
            raise ParameterError(f"lasso_alpha must be a finite number >= 0, got {self.lasso_alpha!r}: "
                                 "it is the L1 penalty on estimated class proportions (e.g. 0.01)")
        if self.min_leaf_reports is not None and (not _is_int(self.min_leaf_reports)
                                                  or self.min_leaf_reports < 1):
            raise ParameterError(f"min_leaf_reports must be an integer >= 1, got {self.min_leaf_reports!r}: "
                                 "it is the fewest rows a leaf may hold under LDP (unset: sized to the "
                                 "design)")

    def resolved(self, n_classes: int) -> LabelLDP:
        """This mechanism with "auto" resolved for n_classes: GRR ("krr") when C - 2 < 3 e^eps, else OUE.

        Wang et al. (USENIX Security 2017), the variance of a class count estimated from n reports:
        GRR n (e^eps + C - 2) / (e^eps - 1)^2, OUE n 4 e^eps / (e^eps - 1)^2 (independent of C); GRR's is
        the smaller exactly when C - 2 < 3 e^eps (at epsilon 2: up to 24 classes). OLH has OUE's variance
        at shorter reports, which labels (C bits) do not need. Master and parties resolve from the agreed
        classes, so they agree.
        """
        if self.mechanism != "auto":
            return self
        grr = _check_n_classes(n_classes) - 2 < 3 * math.exp(self._report_epsilon())
        return dataclasses.replace(self, mechanism="krr" if grr else "oue")

    def bits_for(self, n_classes: int) -> int:
        """The report's size for n_classes: a bit per class (GRR, OUE), else the Bloom filter's.

        n_bits if set, else the smallest power of two >= 32 and >= 2 n_classes. Privacy does not depend on it
        (epsilon counts hashes); the count estimates' noise does: 26 classes on 32 bits have 3.2x the standard
        error of 64 bits.
        """
        if self.mechanism in ONE_REPORT:
            return _check_n_classes(n_classes)
        if self.n_bits is not None:
            return self.n_bits
        return max(MIN_AUTO_BITS, 1 << (2 * _check_n_classes(n_classes) - 1).bit_length())

    def sized_for(self, n_classes: int) -> LabelLDP:
        """This mechanism resolved and n_bits fixed for n_classes (what the master and every party run)."""
        if self.mechanism in ONE_REPORT:
            return self.resolved(n_classes)
        return dataclasses.replace(self, n_bits=self.bits_for(n_classes))

    def class_patterns(self, n_classes: int) -> np.ndarray:
        """Bloom bits of each class code, (n_classes, n_bits) uint8.

        The same on every party and the master.
        """
        if self.mechanism in ONE_REPORT:
            return np.eye(_check_n_classes(n_classes), dtype=np.uint8)
        return _patterns(self.bits_for(n_classes), self.n_hashes, _check_n_classes(n_classes)).copy()

    def check_classes(self, n_classes: int) -> None:
        """Refuse a class count the Bloom patterns cannot tell apart, before any sample is encoded."""
        _design(self, _check_n_classes(n_classes))

    def permanent_bits(self, labels: np.ndarray, n_classes: int, key: np.ndarray,
                       first_row: int = 0) -> np.ndarray:
        """Permanent randomized response of each sample's Bloom bits, (n, n_bits) uint8.

        Drawn once, reused for every tree. Sample i is row first_row + i of the party: its response comes from
        that row's words under `key` (`ldp_draws`), whatever other rows are drawn with it.
        """
        labels = _check_labels(labels, n_classes)
        self.check_classes(n_classes)
        key = ldp_draws.check_key(key)
        ldp = self.resolved(n_classes)
        n_bits = ldp.bits_for(n_classes)
        out = np.zeros((labels.shape[0], n_bits), dtype=np.uint8)
        if ldp.mechanism == "krr":
            keep = ldp_draws.threshold63(ldp._krr_keep(n_classes))
            ldp_draws.permanent_krr(labels, n_classes, int(first_row), key, keep, out)
        elif ldp.mechanism == "oue":
            ldp_draws.permanent_unary(labels, np.eye(n_classes, dtype=np.uint8), int(first_row), key,
                                      ldp_draws.threshold63(OUE_ONE), ldp_draws.threshold63(ldp._oue_zero()),
                                      out)
        else:
            bloom = _patterns(n_bits, self.n_hashes, n_classes)
            ldp_draws.permanent_bloom(labels, bloom, int(first_row), key,
                                      ldp_draws.threshold63(self.keep_probability), out)
        return out

    def instant_thresholds(self) -> tuple[np.uint64, np.uint64]:
        """The instant response's thresholds; GRR and OUE have none (their report is the permanent one)."""
        if self.mechanism in ONE_REPORT:
            return ldp_draws.CERTAIN, np.uint64(0)
        return ldp_draws.threshold63(self.p_one_if_one), ldp_draws.threshold63(self.p_one_if_zero)

    def _report_epsilon(self) -> float:
        """A one-report mechanism's epsilon (`__post_init__` fills it in)."""
        assert self.report_epsilon is not None, "__post_init__ fills in a one-report mechanism's epsilon"
        return self.report_epsilon

    def _krr_keep(self, n_classes: int) -> float:
        """k-RR: the probability of reporting the true class."""
        return 1.0 / (1.0 + (n_classes - 1) * math.exp(-self._report_epsilon()))

    def _oue_zero(self) -> float:
        """OUE: the probability that a 0 bit (another class's) is reported as 1, 1 / (e^eps + 1)."""
        return 1.0 / (math.exp(self._report_epsilon()) + 1.0)

    def report_probabilities(self, n_classes: int) -> np.ndarray:
        """P(reported bit = 1 | class), (n_classes, n_bits) float64: the design of the count estimation."""
        ldp = self.resolved(n_classes)
        if ldp.mechanism == "krr":
            n_classes = _check_n_classes(n_classes)
            keep = ldp._krr_keep(n_classes)
            other = (1.0 - keep) / (n_classes - 1) if n_classes > 1 else 0.0
            return np.where(np.eye(n_classes, dtype=bool), keep, other)
        if ldp.mechanism == "oue":
            return np.where(np.eye(_check_n_classes(n_classes), dtype=bool), OUE_ONE, ldp._oue_zero())
        patterns = _patterns(self.bits_for(n_classes), self.n_hashes, _check_n_classes(n_classes))
        bloom = patterns.astype(np.float64)
        p_permanent_one = self.keep_probability * bloom + (1.0 - self.keep_probability) / 2.0
        return self.p_one_if_zero + (self.p_one_if_one - self.p_one_if_zero) * p_permanent_one

    def estimate_counts(self, bit_sums: np.ndarray, totals: np.ndarray, n_classes: int) -> np.ndarray:
        """Estimated class counts (..., n_classes) >= 0 of groups from their summed instant bits and sizes."""
        design = _design(self, _check_n_classes(n_classes))
        bit_sums = np.asarray(bit_sums, dtype=np.float64)
        totals = np.asarray(totals, dtype=np.float64)
        n_bits = self.bits_for(n_classes)
        if bit_sums.ndim < 1 or bit_sums.shape[-1] != n_bits:
            raise ParameterError(f"bit_sums must have shape (..., {n_bits}), got {bit_sums.shape}")
        if totals.shape != bit_sums.shape[:-1]:
            raise ParameterError(f"totals must have shape {bit_sums.shape[:-1]} (one size per group of "
                                 f"bit_sums), got {totals.shape}")
        if not (np.isfinite(bit_sums).all() and np.isfinite(totals).all()) or (totals < 0).any():
            raise ParameterError("bit_sums and totals must be finite and totals >= 0 (group sizes)")
        lead = totals.shape
        sums, sizes = bit_sums.reshape(-1, n_bits), totals.reshape(-1)
        proportions = np.zeros((sizes.shape[0], n_classes))
        filled = sizes > 0
        if filled.any():
            proportions[filled] = design.proportions(sums[filled] / sizes[filled, None], self)
        return (proportions * sizes[:, None]).reshape(*lead, n_classes)

    def standard_error(self, n_classes: int) -> float:
        """The largest standard error of an estimated class proportion from ONE report.

        A group of n has this / sqrt(n): the linear estimator's, with each report bit's variance bounded by
        1/4.
        """
        return _design(self, _check_n_classes(n_classes)).standard_error

    def leaf_floor(self, n_classes: int) -> int:
        """The fewest rows a leaf may hold.

        min_leaf_reports if set, else the fewest reports n whose class proportion estimate has a standard
        error of at most 1 (its whole range): ceil(se^2). A leaf of one row is mostly noise with many classes
        (26 classes, 64 bits: 3 rows), not with few (2-6: 1).
        """
        if self.min_leaf_reports is not None:
            return self.min_leaf_reports
        return max(1, math.ceil(round(self.standard_error(n_classes) ** 2, 6)))

    def epsilon(self) -> dict[str, float]:
        """RAPPOR's privacy levels: 'permanent' (any number of reports) and 'instant' (a single report).

        GRR's and OUE's report is their permanent response: both are report_epsilon.
        """
        if self.mechanism in ONE_REPORT:
            return {"permanent": self._report_epsilon(), "instant": self._report_epsilon()}
        f, p, q, k = 1.0 - self.keep_probability, self.p_one_if_zero, self.p_one_if_one, self.n_hashes
        permanent = _permanent_epsilon(self.keep_probability, k)
        q_star = f / 2 * (p + q) + (1 - f) * q
        p_star = f / 2 * (p + q) + (1 - f) * p
        numerator, denominator = q_star * (1 - p_star), p_star * (1 - q_star)
        instant = math.inf if denominator == 0 else k * math.log(numerator / denominator)
        return {"permanent": permanent, "instant": instant}


def _permanent_epsilon(keep_probability: float, n_hashes: int) -> float:
    """The Bloom mechanism's permanent epsilon: RAPPOR's 2 h ln((1 - f/2) / (f/2)), f = 1 - keep_probability.

    Evaluated as 4 h artanh(keep_probability), the same value without forming 1 - keep (which loses the
    digits of a small keep_probability).
    """
    return math.inf if keep_probability >= 1 else 4 * n_hashes * math.atanh(keep_probability)


def keep_probability_for(epsilon: float, n_hashes: int) -> float:
    """The Bloom keep_probability whose permanent epsilon at `n_hashes` hashes is `epsilon`, never above it.

    2 h ln((1 + keep) / (1 - keep)) = epsilon gives keep = tanh(epsilon / (4 h)); where rounding puts
    `LabelLDP.epsilon()` above `epsilon`, keep steps down to the next smaller double until it does not.
    """
    keep = math.tanh(epsilon / (4 * n_hashes))
    for _ in range(64):  # both sides are within a few ulps: a step or two at most
        if _permanent_epsilon(keep, n_hashes) <= epsilon:
            return keep
        keep = math.nextafter(keep, 0.0)
    raise ParameterError(f"no keep_probability gives the Bloom mechanism epsilon {epsilon!r} at "
                         f"n_hashes={n_hashes}")


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
        raise LabelError(f"labels must be class codes in 0..{n_classes - 1}, found values from "
                         f"{labels.min()} to {labels.max()}; encode classes as 0..n_classes-1 first")
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
    """The estimation equations of one (mechanism, n_classes), reduced once (`SharedNNLS`).

    NNLS solves min ||bits x - observed||^2 + SUM_WEIGHT^2 (sum(x) - 1)^2 over x >= 0; for k-RR and OUE
    (`_unary_form`) min ||bits x - observed||^2 over x >= 0 with sum(x) = 1 exactly, in closed form. The
    Lasso first selects the classes present (RAPPOR): NNLS on the bit equations alone with the target
    shifted by alpha d, where d is the least-norm solution of bits' d = -1, which minimises
    0.5 ||bits x - observed||^2 + alpha sum(x); then it refits with the sum equation on that support.
    """

    def __init__(self, probabilities: np.ndarray) -> None:
        n_classes = probabilities.shape[0]
        self.bits = probabilities.T  # (n_bits, n_classes): E[bit proportion] = bits @ class proportions
        self.unary = _unary_form(probabilities)
        full = np.vstack([self.bits, np.full((1, n_classes), SUM_WEIGHT)])
        self.full = SharedNNLS(full)
        self.bits_only = SharedNNLS(self.bits)
        self.standard_error = float(np.sqrt(0.25 * (np.linalg.pinv(full)[:, :-1] ** 2).sum(axis=1).max()))
        # Q z with R' z = -1 is the least-norm d with bits' d = -1: the shift adds alpha z to Q' target
        self.lasso_shift = self.bits_only.row_space_solution(-np.ones(n_classes))

    def proportions(self, observed: np.ndarray, ldp: LabelLDP) -> np.ndarray:
        """Class proportions (g, n_classes) >= 0 summing to ~1 from observed bit proportions (g, n_bits)."""
        if ldp.estimator == "nnls" and self.unary is not None:
            one, other = self.unary  # sum x = 1 holds exactly: the projection of the debiased proportions
            return simplex_projection((observed - other) / (one - other), np.ones((observed.shape[0], 1)))
        target = np.hstack([observed, np.full((observed.shape[0], 1), SUM_WEIGHT)])
        if ldp.estimator == "nnls":
            return self.full.solve(target)
        selected = self.bits_only.solve(observed, offset=ldp.lasso_alpha * self.lasso_shift) > 0
        selected[~selected.any(axis=1)] = True  # nothing survived the penalty: fall back to every class
        return self.full.solve(target, allowed=selected)


def _unary_form(probabilities: np.ndarray) -> tuple[float, float] | None:
    """(p, q) when P(bit b = 1 | class c) is p for b = c and q elsewhere (k-RR, OUE), else None (Bloom).

    Then the least squares under x >= 0, sum x = 1 is the simplex projection of (observed - q) / (p - q):
    closed form, where the active-set NNLS took most of LDP's training time on many classes.
    """
    n_classes, n_bits = probabilities.shape
    if n_classes < 2 or n_bits != n_classes:
        return None
    one, other = float(probabilities[0, 0]), float(probabilities[0, 1])
    if one == other or not np.array_equal(probabilities, np.where(np.eye(n_classes, dtype=bool), one, other)):
        return None
    return one, other


MAX_CONDITION = 1e4
"""Largest condition number of the bit equations accepted: it bounds how much report noise the count
estimates amplify (26 classes on 32 bits: 237; 32 classes on 32 bits: 1.8e4, refused; k-RR with 26
classes below epsilon 1.5 or so, refused)."""


def _identifiability_problem(ldp: LabelLDP, n_classes: int) -> str | None:
    """Why this (sized) mechanism cannot estimate n_classes class counts, or None when it can."""
    probabilities = ldp.report_probabilities(n_classes)
    if ldp.mechanism == "bloom":
        bloom = _patterns(ldp.n_bits, ldp.n_hashes, n_classes)
        _, first, which = np.unique(bloom, axis=0, return_index=True, return_inverse=True)
        shared = np.flatnonzero(first[which.reshape(-1)] != np.arange(n_classes))
        if shared.size:
            return (f"classes {int(first[which.reshape(-1)[shared[0]]])} and {int(shared[0])} share a Bloom "
                    "pattern")
        rank = int(np.linalg.matrix_rank(probabilities))
        if rank < n_classes:
            return f"the estimation design matrix has rank {rank} < n_classes"
    condition = float(np.linalg.cond(probabilities))
    if condition > MAX_CONDITION:
        return (f"the estimation design matrix is ill-conditioned (condition number {condition:.3g} > "
                f"{MAX_CONDITION:g}: estimates would be mostly noise)")
    return None


def _suggested_fix(ldp: LabelLDP, n_classes: int) -> str:
    """Name working parameters.

    The fewest bits (powers of two) at these hashes, or fewer hashes at these bits.
    """
    if ldp.mechanism in ONE_REPORT:
        return "use a larger epsilon or fewer classes"
    if ldp.keep_probability == 0 and n_classes > 1:
        return "keep_probability=0 makes reports independent of the label; use keep_probability > 0"
    options = []
    n_bits = ldp.bits_for(n_classes)  # its n_bits: `_design` sized it
    bits = max(2, 1 << (n_bits - 1).bit_length())
    while bits <= 1 << 12:
        if bits > n_bits and _identifiability_problem(dataclasses.replace(ldp, n_bits=bits),
                                                       n_classes) is None:
            options.append(f"n_bits={bits} with n_hashes={ldp.n_hashes}")
            break
        bits *= 2
    for hashes in range(ldp.n_hashes - 1, 0, -1):
        if _identifiability_problem(dataclasses.replace(ldp, n_hashes=hashes), n_classes) is None:
            options.append(f"n_hashes={hashes} with n_bits={ldp.n_bits}")
            break
    if not options:
        return "use more bits (n_bits) or fewer hashes (n_hashes)"
    return (f"use more bits or fewer hashes: {', or '.join(options)} works (more bits cost bandwidth, not "
            "privacy)")


@functools.lru_cache(maxsize=64)
def _design(ldp: LabelLDP, n_classes: int) -> _Design:
    """Check that the classes are identifiable and build their estimation design."""
    ldp = ldp.sized_for(n_classes)
    problem = _identifiability_problem(ldp, n_classes)
    if problem is not None:
        what = (f"LDP Bloom patterns with n_bits={ldp.n_bits}, n_hashes={ldp.n_hashes}"
                if ldp.mechanism == "bloom"
                else f"mechanism {ldp.mechanism!r} at epsilon {ldp.report_epsilon:g}")
        raise ParameterError(f"{what} cannot represent n_classes={n_classes}: {problem}; "
                             f"{_suggested_fix(ldp, n_classes)}")
    return _Design(ldp.report_probabilities(n_classes))
