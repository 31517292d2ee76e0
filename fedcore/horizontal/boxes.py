"""Per open node and feature, an interval known to hold the node's values, from the declared (public) domains.

Shared by the horizontal algorithms that draw thresholds without seeing a node's exact extremes: PPD-ERT's
histogram thresholds (`ppdert/cells.py` narrows a box to the populated grid cells) and FET's DP modes (the
box alone: the declared domain cut along the path by the chosen splits). Every role derives the boxes alike
from public values (domains, draws, decisions), so nothing about the rows is needed to keep them.

The boxes are not held as (nodes, features, 2) arrays: a node's box differs from the declared domain only on
the features its path cut or narrowed, so each node of the batch keeps its cut (the parent's split: feature,
threshold, side) and its narrowed intervals, and a box is replayed from the root along the path when asked
for, applying the same min / max / assignments in the same order as a materialised box would, so every role
gets the same intervals bit for bit. A level's children cost O(open nodes), not O(open nodes x features).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba as nb
import numpy as np

if TYPE_CHECKING:
    from fedcore.trees.grower import Level

_ENTRY_BYTES = 8 + 4 + 8 + 1 + 8
"""One held node: parent index (int64), cut feature (int32), threshold (float64), side (bool), where its
narrowed intervals start (int64)."""
_NARROWED_BYTES = 4 + 8 + 8
"""One narrowed interval: feature (int32), low and high (float64)."""


def box_bytes_per_node(narrowed: int = 0) -> int:
    """Bytes a role holds per open node for the boxes, with `narrowed` intervals narrowed per node and level.

    The batch's nodes grown so far are held (a tree has fewer than twice its leaves, its leaves at most
    twice the open nodes per level the plan counts: 4 per open node), twice while a level's children are
    appended. Whatever the number of features: a box is replayed, never stored.
    """
    return 2 * 4 * (_ENTRY_BYTES + narrowed * _NARROWED_BYTES)


def span_thresholds(span_low: np.ndarray, span_high: np.ndarray, has: np.ndarray,
                    u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds uniform in each populated span (the seed-shared uniforms `u`), and which are usable.

    A candidate is usable when the node has values and the span is not a point. Unusable ones get NaN (every
    row goes right).
    """
    valid = has & (span_high > span_low)
    with np.errstate(invalid="ignore", over="ignore"):
        thresholds = span_low * (1 - u) + span_high * u  # a weighted mean: finite for any finite span
    thresholds = np.where(thresholds >= span_high, span_low, thresholds)  # a rounded-up draw
    return np.where(valid, thresholds, np.nan), valid


class _Held:
    """Arrays appended to in place (their capacity doubles), read by prefix: each holder knows its own end."""

    def __init__(self, arrays: dict[str, np.ndarray], size: int) -> None:
        """Wrap `arrays` (equal lengths, at least `size`) whose first `size` entries are in use."""
        self.arrays, self.size = arrays, size

    def at(self, end: int, shared: bool = False) -> _Held:
        """A buffer to write past `end` in: this one if nothing follows `end`, else a copy of the prefix.

        `shared`: another holder reads up to `end` and must not see a rewrite, so copy anyway.
        """
        if end == self.size and not shared:
            return self
        return _Held({name: a[:end].copy() for name, a in self.arrays.items()}, end)

    def put(self, start: int, parts: dict[str, np.ndarray]) -> int:
        """Write `parts` from `start` (at most `size`: a tail is replaced), growing as needed; the new end."""
        stop = start + len(next(iter(parts.values())))
        capacity = len(next(iter(self.arrays.values())))
        if stop > capacity:
            size = max(stop, 2 * capacity)
            for name, a in self.arrays.items():
                grown = np.empty(size, a.dtype)
                grown[:start] = a[:start]
                self.arrays[name] = grown
        for name, part in parts.items():
            self.arrays[name][start:stop] = part
        self.size = stop
        return stop

    def prefix(self, end: int, *names: str) -> tuple[np.ndarray, ...]:
        """The named arrays' first `end` entries (views)."""
        return tuple(self.arrays[name][:end] for name in names)


class NodeBoxes:
    """Per open node and feature, an interval known to hold all the node's values, replayed along its path.

    Roots start from the declared domains; a node's candidates narrow its box to their populated spans,
    and its children inherit it, cut at the chosen split's threshold. Holds every node of the batch grown so
    far (index order: level by level), the open ones last (`start` to `end`), and their narrowed intervals in
    node order (node p's end at `narrow_stop[p]`): appended in place, so a level costs its own nodes; a
    level that is narrowed or split again after a later one was appended works on a copy (copy semantics).
    """

    def __init__(self, low: np.ndarray, high: np.ndarray, nodes: _Held, end: int, narrowed: _Held,
                 n_narrowed: int, start: int, n_levels: int) -> None:
        """Wrap the batch's first `end` nodes and `n_narrowed` narrowed intervals, open from `start`."""
        self.low, self.high = low, high
        self.nodes, self.end, self.narrowed, self.n_narrowed = nodes, end, narrowed, n_narrowed
        self.start, self.n_levels = start, n_levels

    @property
    def n_open(self) -> int:
        """How many open nodes the level has."""
        return self.end - self.start

    @classmethod
    def roots(cls, low: np.ndarray, high: np.ndarray, n_nodes: int) -> NodeBoxes:
        """Every root's box is the declared domain."""
        nodes = _Held({"parent": np.full(n_nodes, -1, np.int64), "cut_threshold": np.zeros(n_nodes),
                       "cut_feature": np.full(n_nodes, -1, np.int32), "cut_left": np.zeros(n_nodes, bool),
                       "narrow_stop": np.zeros(n_nodes, np.int64)}, n_nodes)
        narrowed = _Held({"feature": np.zeros(0, np.int32), "low": np.zeros(0), "high": np.zeros(0)}, 0)
        return cls(np.asarray(low, np.float64), np.asarray(high, np.float64), nodes, n_nodes, narrowed, 0, 0,
                   1)

    def _nodes(self) -> tuple:
        """The held nodes' arrays a box is replayed from (`_replay`)."""
        return (*self.nodes.prefix(self.end, "parent", "cut_feature", "cut_threshold", "cut_left",
                                   "narrow_stop"),
                *self.narrowed.prefix(self.n_narrowed, "feature", "low", "high"))

    def grid(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates' intervals: grid_low, grid_high (A, k)."""
        return _intervals((self.low, self.high), self._nodes(), self.start,
                          np.ascontiguousarray(features, dtype=np.int64))

    def drawn(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per open node, one feature drawn among its usable ones and its interval: feature, low, high (A,).

        Usable: the node's box is not a point on it. The feature is the rank-th usable one, rank = floor(u x
        usable count) below the count (`u` (A,) in [0, 1)); feature 0 where none is usable.
        """
        return _drawn((self.low, self.high), self._nodes(), self.start, self.n_levels,
                      np.ascontiguousarray(u, dtype=np.float64))

    @property
    def boxes(self) -> np.ndarray:
        """Every open node's whole box (A, d, 2), made on demand (for inspection: the roles use `grid`)."""
        every = np.broadcast_to(np.arange(len(self.low)), (self.n_open, len(self.low)))
        return np.stack(self.grid(every), axis=-1)

    def narrow(self, features: np.ndarray, span_low: np.ndarray, span_high: np.ndarray,
               has: np.ndarray) -> None:
        """Shrink each candidate's interval to its populated span (where the node has values)."""
        node, column = np.nonzero(has)  # node by node, each node's candidates in order
        forked = self.nodes.size != self.end  # a level was appended after this one: keep its view
        self.nodes = self.nodes.at(self.end)
        self.narrowed = self.narrowed.at(self.n_narrowed, shared=forked)  # a later level reads these too
        stop = self.nodes.arrays["narrow_stop"]
        begin = int(stop[self.start - 1]) if self.start else 0
        held = np.diff(stop[self.start:self.end], prepend=begin)  # this level's earlier intervals
        level = {name: a[begin:self.n_narrowed].copy() for name, a in self.narrowed.arrays.items()}
        if held.any():
            order = np.argsort(np.concatenate([np.repeat(np.arange(self.n_open), held), node]), kind="stable")
        else:
            order = None
        parts = {}
        for name, new in (("feature", features), ("low", span_low), ("high", span_high)):
            joined = np.concatenate([level[name], new[node, column].astype(level[name].dtype)])
            parts[name] = joined if order is None else joined[order]
        self.n_narrowed = self.narrowed.put(begin, parts)
        stop[self.start:self.end] = begin + np.cumsum(held + np.bincount(node, minlength=self.n_open))

    def split(self, split_idx: np.ndarray, feature: np.ndarray, threshold: np.ndarray,
              next_pos: np.ndarray) -> NodeBoxes:
        """The next level's boxes: each open child's parent box, cut at the parent's split.

        `split_idx` are the nodes that split, `feature` and `threshold` their splits; child 2i / 2i + 1
        (left / right) of the i-th becomes open node `next_pos[...]` (-1: a leaf), numbered 0 .. n - 1 (the
        grower numbers them so; a party checks it before). Only the open children are appended, in their
        final order; this level's boxes stay as they are.
        """
        opened = np.flatnonzero(next_pos >= 0)
        child = np.empty(len(opened), dtype=np.int64)
        child[next_pos[opened]] = opened  # open node -> its child index 2i (left) or 2i + 1 (right)
        parent = child // 2
        nodes = self.nodes.at(self.end)
        end = nodes.put(self.end, {"parent": self.start + split_idx[parent], "cut_feature": feature[parent],
                                   "cut_threshold": threshold[parent], "cut_left": child % 2 == 0,
                                   "narrow_stop": np.full(len(child), self.n_narrowed)})
        return NodeBoxes(self.low, self.high, nodes, end, self.narrowed, self.n_narrowed, self.end,
                         self.n_levels + 1)

    def after_decisions(self, chosen: np.ndarray, next_pos: np.ndarray, features: np.ndarray,
                        thresholds: np.ndarray) -> NodeBoxes:
        """`split`, from a level's decisions as a party receives them (`RowPartition.apply`).

        `chosen` is each node's candidate (-1: no split); `features` and `thresholds` the level's candidates
        (A, k).
        """
        split_idx = np.flatnonzero(chosen >= 0)
        winner = chosen[split_idx]
        return self.split(split_idx, features[split_idx, winner], thresholds[split_idx, winner], next_pos)

    def after_level(self, level: Level, split_idx: np.ndarray, next_pos: np.ndarray) -> NodeBoxes:
        """`split`, from the master's level record (`BranchStatsLevels.advance`)."""
        return self.split(split_idx, level.fields["feature"][split_idx], level.fields["threshold"][split_idx],
                          next_pos)


@nb.njit(cache=True)
def _replay(node, nodes, low, high, touched, seen, path):  # pragma: no cover - compiled
    """Node's box into low / high (the domain elsewhere) from the root down; the features touched, in order.

    The same operations in the same order as cutting and narrowing a materialised box: np.minimum /
    np.maximum as on arrays (NaN wins; on a tie, 0.0 against -0.0, the threshold) for cuts, assignment for
    narrowed intervals.
    """
    parent, cut_feature, cut_threshold, cut_left, narrow_stop, narrow_feature, narrow_low, narrow_high = nodes
    depth = 0
    while node >= 0:
        path[depth] = node
        depth += 1
        node = parent[node]
    n_touched = 0
    for step in range(depth - 1, -1, -1):
        p = path[step]
        f = cut_feature[p]
        if f >= 0:
            if not seen[f]:
                seen[f] = True
                touched[n_touched] = f
                n_touched += 1
            t = cut_threshold[p]
            if cut_left[p]:
                if not (high[f] < t or high[f] != high[f]):
                    high[f] = t
            elif not (low[f] > t or low[f] != low[f]):
                low[f] = t
        for e in range(narrow_stop[p - 1] if p > 0 else 0, narrow_stop[p]):
            f = narrow_feature[e]
            if not seen[f]:
                seen[f] = True
                touched[n_touched] = f
                n_touched += 1
            low[f] = narrow_low[e]
            high[f] = narrow_high[e]
    return n_touched


@nb.njit(cache=True)
def _restore(touched, n_touched, seen, low, high, domain_low, domain_high):  # pragma: no cover - compiled
    """Reset the scratch box to the domain after a node."""
    for i in range(n_touched):
        f = touched[i]
        low[f], high[f], seen[f] = domain_low[f], domain_high[f], False


@nb.njit(cache=True)
def _narrowing(p, f, narrow_stop, narrow_feature):  # pragma: no cover - compiled
    """Node p's last narrowed interval of feature f (its index), -1 if none."""
    for e in range(narrow_stop[p] - 1, (narrow_stop[p - 1] if p > 0 else 0) - 1, -1):
        if narrow_feature[e] == f:
            return e
    return -1


@nb.njit(cache=True)
def _intervals(domain, nodes, start, features):  # noqa: C901  # pragma: no cover - compiled
    """Each open node's box on its candidate features: low, high (A, k); `_replay`'s result, bit for bit.

    Each candidate's feature alone, walking up the path and stopping at its latest narrowed interval (an
    assignment: nothing before it counts), so a deep narrowed path costs its last narrowings. Forward, a cut
    replaces the bound when it is NaN or not looser (a tie goes to the later cut); so, backward, the first
    cut met is kept unless a strictly tighter one follows, and a NaN cut wins. One loop nest: split into
    helpers returning the walk's state, numba ran it about three times slower.
    """
    domain_low, domain_high = domain
    parent, cut_feature, cut_threshold, cut_left, narrow_stop, narrow_feature, narrow_low, narrow_high = nodes
    n, k = features.shape
    out_low, out_high = np.empty((n, k)), np.empty((n, k))
    for i in range(n):
        for j in range(k):
            f = features[i, j]
            low, high = domain_low[f], domain_high[f]
            cut_low, cut_high, nan_low, nan_high = -np.inf, np.inf, False, False
            p = start + i
            while p >= 0:
                found = _narrowing(p, f, narrow_stop, narrow_feature)
                if found >= 0:
                    low, high = narrow_low[found], narrow_high[found]
                    break
                if cut_feature[p] == f:
                    t, left = cut_threshold[p], cut_left[p]
                    if t != t:
                        if left:
                            nan_high = True
                        else:
                            nan_low = True
                    elif left:
                        if t < cut_high:
                            cut_high = t
                    elif t > cut_low:
                        cut_low = t
                p = parent[p]
            out_low[i, j] = np.nan if nan_low or low != low else (cut_low if cut_low >= low else low)
            out_high[i, j] = np.nan if nan_high or high != high else (cut_high if cut_high <= high else high)
    return out_low, out_high


@nb.njit(cache=True)
def rank_usable(usable, u):  # pragma: no cover - compiled
    """The rank-th True of `usable` (d,), rank = floor(u x its count) below the count; 0 if none is True."""
    count = 0
    for j in range(len(usable)):
        count += usable[j]
    if count == 0:
        return 0
    rank = int(u * count)  # truncated, as astype(int64) would
    if rank > count - 1:
        rank = count - 1
    for j in range(len(usable)):
        if usable[j]:
            if rank == 0:
                return j
            rank -= 1
    return 0


@nb.njit(cache=True)
def _drawn(domain, nodes, start, n_levels, u):  # pragma: no cover - compiled
    """Per open node, the rank-th feature its box is not a point on (`rank_usable`), and its interval.

    Where the path left every feature usable as in the domain (the rule), the rank indexes the domain's
    usable features directly.
    """
    domain_low, domain_high = domain
    n, d = len(nodes[0]) - start, len(domain_low)
    features, out_low, out_high = np.zeros(n, np.int64), np.empty(n), np.empty(n)
    everywhere, usable = domain_high > domain_low, np.empty(d, np.bool_)
    in_domain = np.flatnonzero(everywhere)
    low, high = domain_low.copy(), domain_high.copy()
    touched, seen, path = np.zeros(d, np.int64), np.zeros(d, np.bool_), np.zeros(n_levels, np.int64)
    for i in range(n):
        n_touched = _replay(start + i, nodes, low, high, touched, seen, path)
        changed = False
        for t in range(n_touched):
            f = touched[t]
            changed |= (high[f] > low[f]) != everywhere[f]
        if changed:
            usable[:] = everywhere
            for t in range(n_touched):
                f = touched[t]
                usable[f] = high[f] > low[f]
            f = rank_usable(usable, u[i])
        elif len(in_domain) == 0:
            f = 0
        else:
            f = in_domain[min(int(u[i] * len(in_domain)), len(in_domain) - 1)]
        features[i], out_low[i], out_high[i] = f, low[f], high[f]
        _restore(touched, n_touched, seen, low, high, domain_low, domain_high)
    return features, out_low, out_high
