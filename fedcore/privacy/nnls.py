"""Non-negative least squares for many small problems sharing one matrix: compiled, exact, reproducible.

LDP count estimation solves ``min ||A x - y||, x >= 0`` for every group (node x candidate x branch) with
one design ``A`` (n_bits + 1 rows, n_classes columns). `SharedNNLS` reduces ``A`` once by a thin
Householder QR, ``A = Q R``; each row's problem then becomes ``min ||R x - Q'y||`` on a k x k triangular
system (``||(I - QQ')y||^2`` is a constant that does not move the minimiser), solved by Lawson and
Hanson's active set, every least-squares subproblem by Householder QR of the *unsquared* columns.

Why this way:

* **Stable.** Working on ``R`` keeps the condition number of ``A`` (about 1e4 for 26 classes with the
  sum-to-one row), where the normal equations ``A'A`` square it (1e8) and comparing residuals
  ``|y|^2 - x.b`` cancels away every digit that decides between supports.
* **Reproducible.** Each row is solved by the same scalar loops in a fixed order, with no BLAS call and no
  fast-math, so its answer depends on the row alone: not on which rows share the call, how many there
  are, the thread count, the BLAS build or the x86-64 CPU (IEEE add, multiply, divide and sqrt are
  correctly rounded and numba does not fuse them without fast-math).
* **Fast at any class count.** One compiled loop over rows, no Python per row; scipy's ``nnls`` is the
  same algorithm but one Python call per row (and scipy is not a runtime dependency).

`lawson_hanson` is the plain NumPy version of the same algorithm, kept as the test oracle.
`simplex_projection` is the closed form of the special case where the design is a multiple of the identity
and the sum is fixed (LDP's k-RR and OUE, GDP's noisy counts).
"""

from __future__ import annotations

import numba as nb
import numpy as np

_EPS = float(np.finfo(np.float64).eps)
_ROWS_PER_BLOCK = 256  # rows per parallel work item (each has its own scratch buffers)


@nb.njit(cache=True)
def _householder_triangularise(work: np.ndarray, n_cols: int, n_rows: int) -> bool:
    """Householder QR in place of ``work[:n_rows, :n_cols]``, also applied to the columns after n_cols.

    Those columns are right-hand sides. Leaves R in the upper triangle; False if a column is numerically
    dependent.
    """
    total_cols = work.shape[1]
    for j in range(n_cols):
        norm2 = 0.0
        for i in range(j, n_rows):
            norm2 += work[i, j] * work[i, j]
        norm = np.sqrt(norm2)
        if norm == 0.0:
            return False
        alpha = -norm if work[j, j] >= 0.0 else norm
        # v = x - alpha e1, stored in place below the diagonal; v'v = 2 norm (norm + |x0|)
        v0 = work[j, j] - alpha
        vv = norm2 - work[j, j] * work[j, j] + v0 * v0
        work[j, j] = v0
        for col in range(j + 1, total_cols):
            dot = 0.0
            for i in range(j, n_rows):
                dot += work[i, j] * work[i, col]
            scale = 2.0 * dot / vv
            for i in range(j, n_rows):
                work[i, col] -= scale * work[i, j]
        work[j, j] = alpha
        for i in range(j + 1, n_rows):
            work[i, j] = 0.0
    return True


@nb.njit(cache=True)
def thin_qr(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thin QR of a tall full-column-rank matrix by Householder reflections: (Q (m, n), R (n, n))."""
    m, n = matrix.shape
    work = np.zeros((m, n + m))
    work[:, :n] = matrix
    for i in range(m):
        work[i, n + i] = 1.0  # carry the identity: its transformed columns are Q' (then transpose)
    if not _householder_triangularise(work, n, m):
        raise ValueError("matrix does not have full column rank")
    r = np.zeros((n, n))
    for i in range(n):
        for j in range(i, n):
            r[i, j] = work[i, j]
    q = np.zeros((m, n))
    for i in range(n):
        for k in range(m):
            q[k, i] = work[i, n + k]
    return q, r


@nb.njit(cache=True)
def _back_substitute(r: np.ndarray, c: np.ndarray, z: np.ndarray) -> None:
    """`z` = R^-1 c for upper triangular R."""
    k = r.shape[0]
    for i in range(k - 1, -1, -1):
        acc = c[i]
        for j in range(i + 1, k):
            acc -= r[i, j] * z[j]
        z[i] = acc / r[i, i]


@nb.njit(cache=True)
def _gram(r: np.ndarray) -> np.ndarray:
    """R'R in a fixed summation order (no BLAS)."""
    k = r.shape[0]
    out = np.zeros((k, k))
    for a in range(k):
        for b in range(k):
            acc = 0.0
            for i in range(min(a, b) + 1):
                acc += r[i, a] * r[i, b]
            out[a, b] = acc
    return out


@nb.njit(cache=True)
def _append_column(r: np.ndarray, column: int, p: int, tri: np.ndarray, vecs: np.ndarray, vv: np.ndarray,
                   qc: np.ndarray) -> bool:
    """Append R[:, column] as column p of the triangular factor of the passive columns (updating QR).

    tri[:, :p] holds the triangularised passive columns, vecs[:, i] / vv[i] the Householder reflection i
    (zero above row i), qc the right-hand side with reflections 0..p-1 applied. O(k p) work.
    """
    k = r.shape[0]
    for i in range(k):
        tri[i, p] = r[i, column]
    for h in range(p):  # earlier reflections
        _reflect(vecs, vv, h, tri[:, p])
    norm2 = 0.0
    for i in range(p, k):
        norm2 += tri[i, p] * tri[i, p]
    if norm2 == 0.0:
        return False
    norm = np.sqrt(norm2)
    alpha = -norm if tri[p, p] >= 0.0 else norm
    for i in range(k):
        vecs[i, p] = tri[i, p] if i > p else 0.0
    vecs[p, p] = tri[p, p] - alpha
    vv[p] = norm2 - tri[p, p] * tri[p, p] + vecs[p, p] * vecs[p, p]
    tri[p, p] = alpha
    for i in range(p + 1, k):
        tri[i, p] = 0.0
    _reflect(vecs, vv, p, qc)
    return True


@nb.njit(cache=True)
def _reflect(vecs: np.ndarray, vv: np.ndarray, h: int, target: np.ndarray) -> None:
    """Apply Householder reflection h (vecs[:, h], zero above row h; vv[h] its squared norm) to `target`."""
    k = target.shape[0]
    dot = 0.0
    for i in range(h, k):
        dot += vecs[i, h] * target[i]
    scale = 2.0 * dot / vv[h]
    for i in range(h, k):
        target[i] -= scale * vecs[i, h]


@nb.njit(cache=True)
def _passive_solution(tri: np.ndarray, qc: np.ndarray, order: np.ndarray, p: int, z: np.ndarray,
                      solved: np.ndarray) -> None:
    """`z` = least-squares solution on the p passive columns (back substitution), zero elsewhere."""
    for j in range(z.shape[0]):
        z[j] = 0.0
    for i in range(p - 1, -1, -1):
        acc = qc[i]
        for j in range(i + 1, p):
            acc -= tri[i, j] * solved[j]
        solved[i] = acc / tri[i, i]
    for i in range(p):
        z[order[i]] = solved[i]


@nb.njit(cache=True)
def _refactor(r: np.ndarray, c: np.ndarray, order: np.ndarray, n_columns: int, passive: np.ndarray,
              x: np.ndarray, tri: np.ndarray, vecs: np.ndarray, vv: np.ndarray, qc: np.ndarray) -> int:
    """Triangularise the columns order[:n_columns] of R from scratch, in that order.

    qc = c is transformed alike; a column dependent on the earlier ones is left out (passive False, x 0).
    Returns how many columns the factor holds (order is compacted to them).
    """
    for i in range(qc.shape[0]):
        qc[i] = c[i]
    p = 0
    for i in range(n_columns):
        column = order[i]
        if _append_column(r, column, p, tri, vecs, vv, qc):
            order[p] = column
            p += 1
        else:
            passive[column] = False
            x[column] = 0.0
    return p


@nb.njit(cache=True)
def _nnls_row(r: np.ndarray, gram: np.ndarray, c: np.ndarray, allowed: np.ndarray, tol: float,
              tri: np.ndarray, vecs: np.ndarray, vectors: np.ndarray, flags: np.ndarray,
              order: np.ndarray, x: np.ndarray) -> None:
    """Lawson-Hanson active set for min ||R x - c||, x >= 0, x_j = 0 where not allowed; result in x.

    The passive columns are kept triangularised in entry order: a column entering costs O(k p), one
    leaving rebuilds the factor from the remaining columns.
    """
    k = r.shape[0]
    z, vv, qc, saved_qc, scratch, w, rc = (vectors[0], vectors[1], vectors[2], vectors[3], vectors[4],
                                           vectors[5], vectors[6])
    passive, blocked = flags[0], flags[1]
    n_allowed = _start_row(allowed, order, passive, x)
    # fast path: the least-squares solution on every allowed column is often already feasible; on all
    # columns it is R^-1 c by back substitution (R is triangular), else a factor of the allowed columns
    if n_allowed == k:
        _back_substitute(r, c, z)
    else:
        p = _refactor(r, c, order, n_allowed, passive, x, tri, vecs, vv, qc)
        _passive_solution(tri, qc, order, p, z, scratch)
    if _is_feasible(allowed, z):
        for j in range(k):
            x[j] = z[j]
        return
    p = 0
    _clear_active_set(c, x, qc, passive, blocked)
    # R'c: with G = R'R, the gradient R'(c - R x) = R'c - G x costs O(k |P|)
    _transposed_product(r, c, rc)
    for _ in range(3 * k + 3):
        _gradient(rc, gram, order, p, x, w)
        enter = _entering_column(allowed, passive, blocked, w, tol)
        if enter < 0:
            return
        saved_qc[:] = qc
        if not _append_column(r, enter, p, tri, vecs, vv, qc):
            blocked[enter] = True
            continue
        order[p] = enter
        p += 1
        passive[enter] = True
        _passive_solution(tri, qc, order, p, z, scratch)
        if z[enter] <= 0.0:  # rounding made the entering column useless: take it out, try the next one
            p -= 1
            passive[enter] = False
            qc[:] = saved_qc
            blocked[enter] = True
            continue
        for j in range(k):
            blocked[j] = False
        p = _leave_until_feasible(r, c, order, p, passive, x, z, tri, vecs, vv, qc, scratch)
        for j in range(k):
            x[j] = z[j] if passive[j] else 0.0


@nb.njit(cache=True)
def _start_row(allowed: np.ndarray, order: np.ndarray, passive: np.ndarray, x: np.ndarray) -> int:
    """List the allowed columns in `order`, make them the passive set and zero x; returns their count."""
    n_allowed = 0
    for j in range(allowed.shape[0]):
        if allowed[j]:
            order[n_allowed] = j
            n_allowed += 1
        passive[j] = allowed[j]
        x[j] = 0.0
    return n_allowed


@nb.njit(cache=True)
def _is_feasible(allowed: np.ndarray, z: np.ndarray) -> bool:
    """Whether `z` is non-negative on every allowed column."""
    feasible = True
    for j in range(allowed.shape[0]):
        if allowed[j] and z[j] < 0.0:
            feasible = False
    return feasible


@nb.njit(cache=True)
def _clear_active_set(c: np.ndarray, x: np.ndarray, qc: np.ndarray, passive: np.ndarray,
                      blocked: np.ndarray) -> None:
    """Start the active set method from x = 0 with no passive column (qc = c, nothing blocked)."""
    for j in range(x.shape[0]):
        x[j] = 0.0
        qc[j] = c[j]
        passive[j] = False
        blocked[j] = False  # entered, but rounding left it non-positive: try the next one


@nb.njit(cache=True)
def _transposed_product(r: np.ndarray, c: np.ndarray, rc: np.ndarray) -> None:
    """`rc` = R'c for upper triangular R."""
    for j in range(r.shape[0]):
        acc = 0.0
        for i in range(j + 1):
            acc += r[i, j] * c[i]
        rc[j] = acc


@nb.njit(cache=True)
def _gradient(rc: np.ndarray, gram: np.ndarray, order: np.ndarray, p: int, x: np.ndarray,
              w: np.ndarray) -> None:
    """`w` = R'c - G x, x non-zero only on the p passive columns order[:p]."""
    for j in range(w.shape[0]):
        acc = rc[j]
        for i in range(p):
            acc -= gram[j, order[i]] * x[order[i]]
        w[j] = acc


@nb.njit(cache=True)
def _entering_column(allowed: np.ndarray, passive: np.ndarray, blocked: np.ndarray, w: np.ndarray,
                     tol: float) -> int:
    """The allowed, active, unblocked column of the largest gradient above `tol`, or -1."""
    best, enter = tol, -1
    for j in range(w.shape[0]):
        if allowed[j] and not passive[j] and not blocked[j] and w[j] > best:
            best, enter = w[j], j
    return enter


@nb.njit(cache=True)
def _leave_until_feasible(r: np.ndarray, c: np.ndarray, order: np.ndarray, p: int, passive: np.ndarray,
                          x: np.ndarray, z: np.ndarray, tri: np.ndarray, vecs: np.ndarray, vv: np.ndarray,
                          qc: np.ndarray, scratch: np.ndarray) -> int:
    """Step x towards z and drop passive columns until z is positive on all of them; returns p."""
    for _inner in range(x.shape[0] + 1):
        leaving, step = _leaving_column(passive, x, z)
        if leaving < 0:
            break
        _step_towards(passive, x, z, step, leaving)
        # rebuild the factor from the remaining passive columns, in their entry order
        kept = _compact_passive(order, p, passive)
        p = _refactor(r, c, order, kept, passive, x, tri, vecs, vv, qc)
        _passive_solution(tri, qc, order, p, z, scratch)
    return p


@nb.njit(cache=True)
def _leaving_column(passive: np.ndarray, x: np.ndarray, z: np.ndarray) -> tuple[int, float]:
    """The passive column that reaches zero first on the way from x to z, and that step (-1, inf: none)."""
    leaving, step = -1, np.inf
    for j in range(x.shape[0]):
        if passive[j] and z[j] <= 0.0:
            ratio = x[j] / (x[j] - z[j])  # x_j > 0 >= z_j: in [0, 1)
            if ratio < step:
                leaving, step = j, ratio
    return leaving, step


@nb.njit(cache=True)
def _step_towards(passive: np.ndarray, x: np.ndarray, z: np.ndarray, step: float, leaving: int) -> None:
    """Move `x` by step (z - x) on the passive columns.

    `leaving`, and any other column that is no longer positive, leaves them.
    """
    for j in range(x.shape[0]):
        if passive[j]:
            x[j] += step * (z[j] - x[j])
    passive[leaving] = False
    x[leaving] = 0.0
    for j in range(x.shape[0]):
        if passive[j] and x[j] <= 0.0:
            passive[j] = False
            x[j] = 0.0


@nb.njit(cache=True)
def _compact_passive(order: np.ndarray, p: int, passive: np.ndarray) -> int:
    """Keep the still-passive columns of order[:p] at its front, in entry order; returns their count."""
    kept = 0
    for i in range(p):
        if passive[order[i]]:
            order[kept] = order[i]
            kept += 1
    return kept


@nb.njit(cache=True, parallel=True)
def _nnls_rows(q: np.ndarray, r: np.ndarray, gram: np.ndarray, targets: np.ndarray, offset: np.ndarray,
               allowed: np.ndarray, tol: float) -> np.ndarray:
    """Every row i: argmin ||R x - (Q' targets[i] + offset)||, x >= 0, x = 0 outside allowed[i]."""
    m, k = q.shape
    g = targets.shape[0]
    out = np.zeros((g, k))
    n_blocks = (g + _ROWS_PER_BLOCK - 1) // _ROWS_PER_BLOCK
    for block in nb.prange(n_blocks):  # rows are independent: any split over threads gives the same bits
        tri = np.zeros((k, k))
        vecs = np.zeros((k, k))
        vectors = np.zeros((7, k))
        flags = np.zeros((2, k), dtype=np.bool_)
        order = np.zeros(k, dtype=np.int64)
        c = np.empty(k)
        for row in range(block * _ROWS_PER_BLOCK, min(g, (block + 1) * _ROWS_PER_BLOCK)):
            scale = 1.0  # the gradient's rounding grows with the row's own target (never its neighbours')
            for i in range(m):
                scale = max(scale, abs(targets[row, i]))
            for j in range(k):
                acc = offset[j]
                for i in range(m):
                    acc += q[i, j] * targets[row, i]
                c[j] = acc
            _nnls_row(r, gram, c, allowed[row], tol * scale, tri, vecs, vectors, flags, order, out[row])
    return out


class SharedNNLS:
    """``min ||A x - y||, x >= 0`` for many targets y and one full-column-rank ``A`` (see module doc)."""

    def __init__(self, matrix: np.ndarray) -> None:
        """Factor the tall `matrix` once for every row's solve."""
        matrix = np.ascontiguousarray(matrix, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] < matrix.shape[1] or matrix.shape[1] < 1:
            raise ValueError(f"need a tall matrix with at least one column, got shape {matrix.shape}")
        self.q, self.r = thin_qr(matrix)
        self.gram = _gram(self.r)
        # gradient entries below tol * max(1, |y|_inf) count as zero: the rounding of R'c - G x
        self.tol = 10.0 * _EPS * float(np.abs(self.r).max()) * matrix.shape[1]

    @property
    def n_columns(self) -> int:
        """Number of columns of the design matrix."""
        return self.r.shape[0]

    def solve(self, targets: np.ndarray, allowed: np.ndarray | None = None,
              offset: np.ndarray | None = None) -> np.ndarray:
        """Solutions (g, n) for targets (g, m): x >= 0, zero outside ``allowed`` (g, n) bool if given.

        ``offset`` (n,) is added to the reduced target ``Q'y``: a target shift ``y + Q offset`` within
        the column space, without forming it (used by the Lasso's shift).
        """
        targets = np.ascontiguousarray(targets, dtype=np.float64)
        if targets.ndim != 2 or targets.shape[1] != self.q.shape[0]:
            raise ValueError(f"targets must have shape (g, {self.q.shape[0]}), got {targets.shape}")
        n = self.n_columns
        if allowed is None:
            allowed = np.ones((targets.shape[0], n), dtype=np.bool_)
        allowed = np.ascontiguousarray(allowed, dtype=np.bool_)
        offset = np.zeros(n) if offset is None else np.ascontiguousarray(offset, dtype=np.float64)
        if allowed.shape != (targets.shape[0], n) or offset.shape != (n,):
            raise ValueError(f"allowed must have shape {(targets.shape[0], n)} and offset {(n,)}, got "
                             f"{allowed.shape} and {offset.shape}")
        return _nnls_rows(self.q, self.r, self.gram, targets, offset, allowed, self.tol)

    def row_space_solution(self, rhs: np.ndarray) -> np.ndarray:
        """The z with R' z = rhs (forward substitution): ``Q z`` is the least-norm d with A'd = rhs."""
        return _forward_transposed(self.r, np.ascontiguousarray(rhs, dtype=np.float64))


@nb.njit(cache=True)
def _forward_transposed(r: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    n = r.shape[0]
    z = np.zeros(n)
    for i in range(n):
        acc = rhs[i]
        for j in range(i):
            acc -= r[j, i] * z[j]
        z[i] = acc / r[i, i]
    return z


def lawson_hanson(matrix: np.ndarray, target: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares min ||matrix x - target||, x >= 0, by Lawson and Hanson's active set.

    In plain NumPy, one row at a time: the reference the compiled solver is tested against.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    n = matrix.shape[1]
    max_iter = 3 * n if max_iter is None else max_iter
    tol = 10 * _EPS * np.abs(matrix).sum(axis=0).max() * max(matrix.shape)
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


def simplex_projection(values: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The Euclidean projection of each row of `values` (..., n) onto {x >= 0, sum x = total} (total >= 0).

    The least squares under x >= 0 and a fixed sum when the design is a multiple of the identity (LDP's
    k-RR and OUE after debiasing, GDP's noisy counts): closed form, a sort and a cumulative sum per row,
    so each row's answer depends on that row alone.
    """
    ordered = -np.sort(-values, axis=-1)
    cumulative = np.cumsum(ordered, axis=-1) - total
    rank = np.arange(1, values.shape[-1] + 1)
    support = ordered - cumulative / rank > 0
    last = values.shape[-1] - 1 - np.argmax(support[..., ::-1], axis=-1)  # largest rank still in the support
    shift = np.take_along_axis(cumulative, last[..., None], axis=-1) / (last[..., None] + 1)
    return np.maximum(values - shift, 0.0)
