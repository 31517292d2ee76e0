"""Horizontal histogram boosting under secure aggregation (issue #32): one more algorithm of the one engine.

The bins are agreed once from the data contracts' declared domains (`bins`, as PPD-ERT's histogram
thresholds cut them); every party holds the whole model, computes its rows' (g, h) each round from it, and
sends per node, feature and bin sums of (count, g, h) in fixed point (`fixedpoint`, `histograms`), masked
with PPD-ERT's pairwise masks (`fedcore/horizontal/ppdert/rounds.py`, `keys.py`): the master reads only the
sums over the parties, picks splits with the shared criterion (`splits`) in the one grower, and broadcasts
each round's trees with the next round's first request.

Rounds:

    hello         1        schema, domains, bins, loss; each party's signed X25519 key and row count
    boost_base    1        relayed keys -> masked class counts (or rows and fixed-point label sum)
    boost_level   1/level  decisions and the nodes to sum (a round's first: base score or the round
                           before's trees) -> masked (A', F, bins + 1, 3) histograms: of two open
                           siblings only the one with fewer rows, the master subtracting it from their
                           parent for the other (exact in integers)
    model         1        the complete model (base score, link, trees)

Modules: `bins`, `fixedpoint`, `histograms` (the party's kernel), `splits` (the master's scan), `master` (the
level strategy), `party` (the institution's role and protocol table), `rows` (its per-row margins, (g, h)
and histograms, over its table or each of its Dask blocks: `fedcore.compute.dask_boosting`), `estimators`
(simulation API).
"""

from fedcore.horizontal.boosting.estimators import HorizontalBoostingClassifier, HorizontalBoostingRegressor

__all__ = ["HorizontalBoostingClassifier", "HorizontalBoostingRegressor"]
