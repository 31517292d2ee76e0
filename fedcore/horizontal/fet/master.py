"""The master in horizontal Federated Extra-Trees (FET, Algorithms 1-2 of the paper).

Holds no data; draws candidate features and thresholds from seeded streams, aggregates the parties' min/max
(mode none) and branch label statistics, picks the best split per node and sends every party the finished
forest.

Thresholds: in mode none (the paper's algorithm, lossless against a single party) each is the seed-shared
uniform placed in the candidate's [min, max] over all parties, which are the node's exact extremes. In the DP
modes (gdp, ldp) no extreme leaves a party: the same uniform is placed in the node's box, the feature's
declared (public) domain cut along the path by the chosen splits (`fedcore/horizontal/boxes.py`, shared with
PPD-ERT), so thresholds depend on public values and earlier decisions only. A box that is a point makes the
candidate unusable, as an empty range does in mode none.

Rounds (one `Transport.exchange` each), over all open nodes of all trees of a batch at once:

    hello                      1       schema check; row counts (gdp: noisy); gdp: the plan's terms,
                                       each party's noise sigma (the agreed one) and marginal histograms;
                                       regression: the target magnitude (2-power)
    per level: fet_ranges      1       candidate features, the previous level's decisions -> none: per-party
                                       min/max; gdp / ldp: an empty reply (thresholds from the boxes)
               fet_stats       1       thresholds -> per-party branch statistics (privacy mode)
    gdp plan leaves, below the chosen levels (`fet/plans.py`):
    per level: fet_split       1       the master's drawn split per open node and the previous decisions ->
                                       an empty reply
    per batch: fet_leaves      1       the last decisions -> each leaf's class counts plus Gaussian noise
    model                      1       the complete forest to every party -> ack; gdp / ldp: each
                                       party's privacy ledger (data-independent), checked against the
                                       agreed setting (`agreed_ledger`)

so a fit takes 2 + 2 * L rounds, L = number of levels that had open nodes, summed over tree batches
(L = max_depth per batch when some node of the batch stays splittable down to max_depth - 1).

Regression targets travel as int64 fixed point q = round(y * 2**shift). From the parties' row counts and
the largest power of two bounding |y| the master picks shift so that N * max|q| <= 2**52: every partial sum
is then an exact integer in float64 as well as int64, so sums are independent of the party layout. Gains
need only (count, sum q) per branch: the variance reduction n_l n_r / n (mean_l - mean_r)^2 needs no
sum of squares.

Resuming after a crash (`fit(checkpoints, resume_from)`, see `fedcore/trees/grower.py`) gives the forest
of an uninterrupted run in every privacy mode: the master's draws are keyed by (tree, depth), and a party's
noise (gdp: Gaussian, ldp: randomized response) is keyed by its own secret seed and its count of answered
queries, which its agent checkpoints at home with every batch and restores (`HorizontalInstitutionAgent`),
with its gdp ledger. A batch grown again is therefore answered with the same noise as before the crash, so
the repetition releases nothing new (to a master that follows the protocol) and the ledger charges it once.
This needs the same batches in every attempt: in the DP modes the batch plan comes from the configuration
alone (`noise_follows_batches`), and a resumed run keeps the plan its checkpoints recorded.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import numpy as np

from fedcore.algorithms import EXTRA_TREES
from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.boxes import NodeBoxes, box_bytes_per_node, span_thresholds
from fedcore.horizontal.counts import check_bit_sums, check_noisy_counts
from fedcore.horizontal.fet.class_marginals import ClassMarginals
from fedcore.horizontal.fet.gdp import (
    combined_node_stats,
    count_variance,
    shrunk_proportions,
    unbiased_sizes,
)
from fedcore.horizontal.fet.marginals import MARGINAL_BINS, MarginalQuantiles
from fedcore.horizontal.fet.plans import (
    GdpPlan,
    choose_gdp_plan,
    drawn_candidates,
    drawn_features,
    fill_random_nodes,
    leaf_depth,
)
from fedcore.horizontal.growth import (
    BranchStatsLevels,
    LevelResult,
    ProgressCallback,
    fet_candidate_features,
    fet_threshold_uniforms,
)
from fedcore.horizontal.ledgers import SIGMA_TOLERANCE, AgreedLedger, label_ldp_ledger, stated_sigma
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.horizontal.plan import count_reach, gaussian_plan, gdp_terms, leaf_sigma, marginal_sigma
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy.accounting import (
    DEFAULT_DELTA,
    GaussianPlan,
    check_delta,
    check_epsilon,
    recompute_gaussian,
)
from fedcore.protocol.messages import Message
from fedcore.transport.base import Transport
from fedcore.trees.grower import Level

if TYPE_CHECKING:
    from fedcore.privacy.ldp import LabelLDP

SUM_BITS = 52
"""Quantised target sums stay below 2**SUM_BITS: exact in float64 and in int64."""
MAX_TARGET_BITS = 40
"""At most this many bits of precision per quantised target."""
MIN_TARGET_BITS = 8
MAX_Y_EXPONENT = 256
"""The largest y_exponent a party may state: every |y| < 2**256 (about 1.2e77). No measured label comes near
it; below it the evaluation's float64 sums stay finite (a squared sum of targets over 2**63 rows is within
2**(2 * (256 + 63)) < 2**1024), and a party stating more could set the fixed-point scale of every target."""
Y_EXPONENT_SPREAD = 12
"""How far (in powers of two) a party's y_exponent may exceed every other party's.

An honest party states the exponent of its largest |y| (`HorizontalParty._on_hello`), and the master scales
every party's targets by the largest exponent stated (`q_shift`). The parties hold the same agreed label, so
their largest values differ by how far the label's tail reaches among their own rows: one institution's
largest target 4096 times every other's is beyond that. A party stating more would shrink the others'
quantised targets to nothing (a y_exponent of 1000 made every prediction 0.0); within the spread the others'
largest targets keep at least q_bits - 13 significant bits (19 bits, a relative 2e-6, below 2**20 rows)."""





class FederatedExtraTreesMaster(BranchStatsLevels):
    """Coordinates one FET training over a transport (see module doc)."""

    algorithm = EXTRA_TREES.id

    def __init__(self, transport: Transport, params: ExtraTreesParams, schema: HorizontalSchema, *,
                 privacy: str = "none", epsilon: float | None = None, delta: float = DEFAULT_DELTA,
                 ldp: LabelLDP | None = None, low: np.ndarray | None = None, high: np.ndarray | None = None,
                 marginal_bins: int = MARGINAL_BINS, plan: str = "splits", split_levels: int = 0,
                 progress: ProgressCallback | None = None, memory_budget: int | None = None) -> None:
        """The FET master in privacy mode `privacy` ('none', 'gdp' or 'ldp'); LDP raises the leaf floor.

        `epsilon`, `delta` (gdp, epsilon required there): the agreed budget of the whole model, the configured
        setting's (`GlobalDP`). The master plans the parties' Gaussian releases from it
        (`horizontal/plan.py`, which needs a bounded max_depth); every party's hello must state the plan's
        sigma, which bounds and weighs the noisy counts.
        `low`, `high` (gdp and ldp, required there): the declared (public) domain of every feature, in schema
        order; thresholds are drawn in them, narrowed by the splits above (`fedcore/horizontal/boxes.py`).
        `marginal_bins` (gdp): cells of the parties' DP marginal histograms, by whose CDFs thresholds are
        placed in the boxes (`fet/marginals.py`); 0 places them uniformly.
        `plan`, `split_levels` (gdp): where the budget goes (`GlobalDP.plan`; "auto" resolved by
        `choose_gdp_plan`, which may also choose the trees and, after hello, the depth).
        """
        self.gdp_plan: GdpPlan | None = None
        if privacy == "gdp":
            if epsilon is None:
                raise ParameterError("privacy 'gdp': the master needs the agreed budget (epsilon=..., the "
                                     "privacy setting's)")
            epsilon = check_epsilon(epsilon, "privacy 'gdp': epsilon")
            self.gdp_plan = choose_gdp_plan(plan, split_levels, epsilon, schema.n_classes, params)
            params = replace(params, n_estimators=self.gdp_plan.n_estimators,
                             max_depth=self.gdp_plan.max_depth)
        super().__init__(transport, params, schema, progress, memory_budget)
        self.privacy = privacy
        self.plan: GaussianPlan | None = None
        self.plan_terms: dict = {}
        self._stated_sigma: dict[str, float] = {}  # gdp: each party's sigma, as its hello stated it
        self._random_level = False  # plan leaves: the level being decided was drawn, not chosen
        self._depth = 0  # the level being decided
        if self.gdp_plan is not None:
            g = self.gdp_plan
            self.plan_terms = gdp_terms(params.n_estimators, g.split_levels, g.leaf_release, self.k,
                                        params.task, schema.n_features, marginal_bins,
                                        schema.n_classes if g.class_marginals else 0)
            assert epsilon is not None, "checked above"
            self.plan = gaussian_plan(epsilon, check_delta(delta, "privacy 'gdp': delta"), self.plan_terms)
        self.domains = _dp_domains(privacy, low, high, schema.n_features)
        self._boxes: NodeBoxes | None = None  # DP modes: the open nodes' boxes
        self.marginals: MarginalQuantiles | None = None  # gdp: the features' noisy CDFs (hello)
        self.class_marginals: ClassMarginals | None = None  # plan marginals: per class too (hello)
        self._node_weights: np.ndarray | None = None  # plan marginals: the open nodes' class weights (A, C)
        self._child_weights: np.ndarray | None = None  # plan marginals: a drawn level's children's (A, 2, C)
        self.noise_follows_batches = privacy in ("gdp", "ldp")
        # n_bits fixed for the classes
        self.ldp = ldp.sized_for(schema.n_classes) if ldp is not None else None
        if privacy == "ldp":  # a leaf's classes are estimated from its rows' reports: not from too few
            floor = self._label_ldp().leaf_floor(schema.n_classes)
            self.min_samples_leaf = max(params.min_samples_leaf, floor)
        self.n_rows = 0  # the most rows the parties hold together (gdp: their noisy counts' bound)
        self._row_bound: dict[str, int] = {}  # the most rows each party holds (gdp: above its noisy count)
        self.q_bits = 0  # |q| <= 2**q_bits
        self.q_shift = 0  # q = round(y * 2**q_shift)
        self._noise_variance = 0.0  # GDP: of one count summed over the parties
        self.party_y_exponent: dict[str, int] = {}  # regression: each party's |y| < 2**exponent
        # regression in a federation: the largest y_exponent each party's data contract allows (its declared
        # label range; None: the contract declares none)
        self.declared_y_exponent: dict[str, int | None] | None = None

    def setup(self) -> None:
        """Greet every party; learn the row counts and (regression) the target scale; gdp: check sigma."""
        header = {"algorithm": self.algorithm, "schema": self.schema.fingerprint(), "privacy": self.privacy,
                  "task": self.params.task, **self.plan_terms}
        arrays = {}
        if self.plan_terms.get("marginal_bins"):  # the histograms' grid: the declared (public) domains
            assert self.domains is not None, "gdp has declared domains"
            arrays = {"low": self.domains[0], "high": self.domains[1]}
        hello = Message("hello", header, arrays)
        replies = self.transport.exchange(dict.fromkeys(self.parties, hello))
        self._note_parties(replies)
        reach = count_reach(self._plan()) if self.privacy == "gdp" else 0
        # gdp: the stated counts are noisy; a party holds at most `reach` more rows (its counts' bound)
        self._row_bound = {name: rows + reach for name, rows in self.party_rows.items()}
        self.n_rows = sum(self._row_bound.values())
        if self.privacy == "gdp":
            plan = self._plan()
            for name, reply in replies.items():  # the noise scale, so the counts' bound, is the agreed one
                self._stated_sigma[name] = stated_sigma(
                    name, reply.header, plan.sigma,
                    f"the agreed budget (epsilon {plan.epsilon:g}, delta {plan.delta:g}) over "
                    f"{plan.releases} releases of L2 sensitivity {plan.sensitivity:g}")
            self._noise_variance = count_variance([plan.sigma] * len(replies))
            if self.plan_terms["marginal_bins"]:
                self.marginals = self._marginal_quantiles(replies)
            if self.params.max_depth is None:  # plan leaves, no depth given: from the noisy row count
                assert self.gdp_plan is not None and self.gdp_plan.leaf_release, "choose_gdp_plan checks"
                depth = max(leaf_depth(sum(self.party_rows.values()), self.params.n_estimators,
                                       self.schema.n_classes), self.gdp_plan.split_levels + 1)
                self.params = replace(self.params, max_depth=depth)
                self.grower.params = self.params
        if self.params.task == "regression":
            self.party_y_exponent = {n: _reported_exponent(n, r.header) for n, r in replies.items()}
            self._check_exponents()
            exponent = max(self.party_y_exponent.values())
            bits = min(MAX_TARGET_BITS, SUM_BITS - math.ceil(math.log2(self.n_rows + 1)))
            if bits < MIN_TARGET_BITS:
                raise ParameterError(f"{self.n_rows} rows leave fewer than {MIN_TARGET_BITS} bits per "
                                     "regression target in the exact fixed-point sums; train on fewer rows")
            self.q_bits = bits
            self.q_shift = bits - exponent

    def _marginal_quantiles(self, replies: dict[str, Message]) -> MarginalQuantiles:
        """gdp: the parties' noisy marginal histograms (hello replies), checked and summed into CDFs."""
        assert self.domains is not None, "gdp has declared domains"
        classes = self.plan_terms["marginal_classes"]
        shape: tuple[int, ...] = (self.schema.n_features, self.plan_terms["marginal_bins"],
                                  *([classes] if classes else []))
        sigma = marginal_sigma(self._plan(), self.plan_terms)
        total = np.zeros(shape)
        for name in self.parties:
            part = _reply_array(replies, name, "hello_reply", "marginals", shape)
            scale = sigma * max(1.0, self._stated_sigma[name] / self._plan().sigma)  # within SIGMA_TOLERANCE
            check_noisy_counts(f"party {name!r}", "hello_reply.marginals", part, self._row_bound[name], scale)
            total += part
        if classes:
            self.class_marginals = ClassMarginals(total, *self.domains)
            return self.class_marginals.quantiles
        return MarginalQuantiles(total, *self.domains)

    def _check_exponents(self) -> None:
        """Refuse a y_exponent (already in [-1074, MAX_Y_EXPONENT]) no honest party can state, naming it.

        Above the label range its data contract declares (an institution whose data breaks its contract takes
        no part), or more than Y_EXPONENT_SPREAD above every other party's.
        """
        for name, exponent in self.party_y_exponent.items():
            allowed = (self.declared_y_exponent or {}).get(name)
            if allowed is not None and exponent > allowed:
                raise ProtocolError(f"party {name!r} stated y_exponent {exponent} (|y| < 2**{exponent}) in "
                                    f"hello, but its data contract's label range bounds |y| below "
                                    f"2**{allowed}")
        for name, exponent in self.party_y_exponent.items():
            others = [e for other, e in self.party_y_exponent.items() if other != name]
            if others and exponent > max(others) + Y_EXPONENT_SPREAD:
                raise ProtocolError(f"party {name!r} stated y_exponent {exponent} (|y| < 2**{exponent}) in "
                                    f"hello, more than {Y_EXPONENT_SPREAD} above every other party's (at "
                                    f"most {max(others)}); its targets would set the fixed-point scale of "
                                    "all")

    def plan_report(self) -> dict:
        """gdp: the plan that ran (where the budget went, the trees and depth) for the privacy report."""
        g = self.gdp_plan
        if g is None:
            return {}
        name = "marginals" if g.class_marginals else "leaves" if g.leaf_release else "splits"
        return {"plan": name, "split_levels": g.split_levels,
                "n_estimators": self.params.n_estimators, "max_depth": self.params.max_depth,
                "noisy_rows": sum(self.party_rows.values())}

    def _plan(self) -> GaussianPlan:
        """GDP: the parties' Gaussian plan under the agreed budget (`__init__` makes it under gdp)."""
        assert self.plan is not None, "__init__ plans the releases under gdp"
        return self.plan

    def agreed_ledger(self) -> AgreedLedger | None:
        """gdp: the agreed plan's terms (sigma within SIGMA_TOLERANCE); ldp: the agreed label mechanism's.

        Either way a party's stated epsilon_total may be at most the agreed epsilon.
        """
        if self.privacy == "gdp":
            plan = self._plan()
            return AgreedLedger(plan.terms(), plan.epsilon, approximate=("sigma",), tolerance=SIGMA_TOLERANCE,
                                recompute=recompute_gaussian)
        if self.privacy == "ldp":
            terms = label_ldp_ledger(self._label_ldp())
            epsilon = terms.pop("epsilon_total")
            return AgreedLedger(terms, epsilon)
        return None

    def node_estimates(self, result: LevelResult) -> tuple[np.ndarray, np.ndarray]:
        """GDP: every measurement of the open nodes combined, sizes without clamping bias (`gdp.py`)."""
        if self.privacy != "gdp":
            return super().node_estimates(result)
        assert result.branch is not None, "noisy statistics come summed, as `branch`"
        stats = combined_node_stats(result.branch, self._open_stats)
        return stats, unbiased_sizes(stats, self.params.task)

    def node_values(self, stats: np.ndarray, parent_values: np.ndarray | None = None) -> np.ndarray:
        """Node values: GDP class proportions projected and shrunk, regression means scaled back from q."""
        if self.privacy == "gdp" and self.params.task != "regression":
            # noisy counts: projected onto the simplex, shrunk towards the parent by the noise (`gdp.py`)
            return shrunk_proportions(stats, parent_values, self._noise_variance)
        if self.params.task != "regression":
            return super().node_values(stats)
        n = np.maximum(stats[..., 0], 0.0)
        bound = float(2 ** self.q_bits)
        mean_q = np.clip(np.where(n > 0, stats[..., 1] / np.where(n > 0, n, 1.0), 0.0), -bound, bound)
        return np.ldexp(mean_q, -self.q_shift)[..., None]

    def level(self, trees: list[int], depth: int, open_tree: np.ndarray, open_node: np.ndarray) -> Level:
        """A level chosen from the parties' statistics.

        Plan leaves: below its split levels a drawn level, at the depth limit the leaves' one release
        (`_drawn_level`, `_leaf_level`).
        """
        g = self.gdp_plan
        self._random_level = g is not None and g.leaf_release and depth >= g.split_levels
        self._depth = depth
        if not self._random_level:
            level = super().level(trees, depth, open_tree, open_node)
            if g is not None and g.leaf_release and level.child_open is not None:
                # plan leaves: a chosen split's children stay open down to the released leaves (the noisy
                # stopping rules would close some with values from the level's noisier counts)
                level.child_open[:] = True
                level.child_fields = {name: field[:0] for name, field in level.child_fields.items()}
            return level
        assert self.params.max_depth is not None, "setup chooses the depth of plan leaves"
        if depth >= self.params.max_depth:
            return self._leaf_level(depth, open_tree)
        return self._drawn_level(trees, depth, open_tree)

    def _request(self, header: dict, arrays: dict, trees: list[int]) -> None:
        """A level request's batch start (and the roots' boxes) or the previous level's decisions."""
        if self._transition is None:
            self._new_batch(header)
            if self.domains is not None:  # DP modes: every root's box is the declared domain
                self._boxes = NodeBoxes.roots(*self.domains, len(trees))
        else:
            arrays.update(self._transition)

    def _drawn_level(self, trees: list[int], depth: int, act_tree: np.ndarray) -> Level:
        """Plan leaves: every open node splits at random, from public values and earlier decisions only.

        Its feature is a seeded random one whose box is not a point, its threshold the seed's uniform placed
        by the noisy marginal CDFs in the box: no budget. The parties only learn the splits (`fet_split`, an
        empty reply). Weights and values come from the leaves (`batch_done`).
        """
        p, n = self.params, len(act_tree)
        header: dict = {"depth": depth, "n_trees": len(trees)}
        arrays: dict = {}
        self._request(header, arrays, trees)
        assert self._boxes is not None, "gdp has declared domains"
        if self.class_marginals is None:
            features, low, high = drawn_features(p.random_state, act_tree, depth, self._boxes)
            u = fet_threshold_uniforms(p.random_state, act_tree, depth, 1)
        else:
            features, low, high = drawn_candidates(p.random_state, act_tree, depth, self._boxes, self.k)
            u = fet_threshold_uniforms(p.random_state, act_tree, depth, self.k)
        if self.marginals is not None:
            u = self.marginals.warp(features, low, high, u)
        thresholds, valid = span_thresholds(low, high, np.ones(features.shape, dtype=bool), u)
        thresholds = np.where(valid, thresholds, low)  # a box that is a point: split at its one value
        if self.class_marginals is not None:
            features, thresholds = self._chosen_candidates(depth, features, low, high, thresholds, valid)
        arrays["features"] = features.astype(np.int32)
        arrays["thresholds"] = thresholds
        replies = self.transport.exchange(dict.fromkeys(self.parties, Message("fet_split", header, arrays)))
        for name, reply in replies.items():
            if reply.kind != "fet_split_reply" or reply.arrays:
                raise ProtocolError(f"party {name!r} answered 'fet_split' with {reply.kind!r} and arrays "
                                    f"{sorted(reply.arrays)}; expected an empty 'fet_split_reply'")
        fields = {"feature": features[:, 0].astype(np.int32), "threshold": thresholds[:, 0],
                  "weight": np.zeros(n), "value": np.full((n, self.n_stats), 1.0 / self.n_stats)}
        return Level(np.ones(n, dtype=bool), fields, np.ones(2 * n, dtype=bool))

    def _chosen_candidates(self, depth: int, features: np.ndarray, low: np.ndarray, high: np.ndarray,
                           thresholds: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Plan marginals: each node's candidate of least class impurity by the marginals (A, 1) each.

        The nodes' class weights start at a batch's first drawn level from their boxes, then follow the
        chosen splits (`advance`); post-processing of the hello's release, no budget.
        """
        assert self.class_marginals is not None and self._boxes is not None and self.gdp_plan is not None
        if depth == self.gdp_plan.split_levels or self._node_weights is None:
            d = self.schema.n_features
            every = np.broadcast_to(np.arange(d), (len(features), d))
            self._node_weights = self.class_marginals.box_weights(*self._boxes.grid(every))
        best, self._child_weights = self.class_marginals.choose_splits(self._node_weights, features, low,
                                                                       high, thresholds, valid)
        rows = np.arange(len(features))
        return features[rows, best][:, None], thresholds[rows, best][:, None]

    def _leaf_level(self, depth: int, act_tree: np.ndarray) -> Level:
        """Plan leaves: each party's noisy leaf class counts (`fet_leaves`, one release per tree), summed.

        A leaf's value is its clamped noisy proportions, its weight the sum of its noisy counts (at least 0).
        """
        n, shape = len(act_tree), (len(act_tree), self.n_stats)
        assert self._transition is not None, "a tree's leaves follow at least one level"
        header = {"depth": depth, "n_leaves": n}
        request = Message("fet_leaves", header, dict(self._transition))
        replies = self.transport.exchange(dict.fromkeys(self.parties, request))
        sigma = leaf_sigma(self._plan())
        total = np.zeros(shape)
        for name in self.parties:
            part = _reply_array(replies, name, "fet_leaf_counts", "counts", shape)
            check_noisy_counts(f"party {name!r}", "fet_leaf_counts.counts", part, self._row_bound[name],
                               sigma * max(1.0, self._stated_sigma[name] / self._plan().sigma))
            total += part
        fields = {"feature": np.full(n, -1, np.int32), "threshold": np.full(n, np.nan),
                  "weight": unbiased_sizes(total, self.params.task), "value": super().node_values(total)}
        return Level(np.zeros(n, dtype=bool), fields)

    def batch_done(self, records: dict[str, np.ndarray]) -> None:
        """Plan leaves: the drawn nodes' weights and values from the leaves below them (post-processing)."""
        g = self.gdp_plan
        if g is not None and g.leaf_release:
            fill_random_nodes(records, g.split_levels)

    def _level(self, trees, depth, act_tree, act_node, transition) -> LevelResult:
        p = self.params
        features = fet_candidate_features(p.random_state, act_tree, depth, self.schema.n_features, self.k)
        header = {"depth": depth, "n_trees": len(trees)}
        arrays = {"features": features.astype(np.int32)}
        self._request(header, arrays, trees)
        request = Message("fet_ranges", header, arrays)  # one message object: serialised once for every party
        replies = self.transport.exchange(dict.fromkeys(self.parties, request))
        u = fet_threshold_uniforms(p.random_state, act_tree, depth, self.k)
        if self._boxes is None:
            thresholds, valid = self._range_thresholds(replies, features, u)
        else:
            thresholds, valid = self._box_thresholds(replies, features, u, self._boxes)
        header = {"depth": depth, "q_shift": self.q_shift, "q_bound_bits": self.q_bits}
        replies = self.transport.exchange(dict.fromkeys(self.parties, Message("fet_stats", header,
                                                                              {"thresholds": thresholds})))
        if self.privacy == "ldp":
            return LevelResult(features, thresholds, valid,
                               *self._estimate(replies, features.shape, valid, depth))
        if self.privacy == "none":  # exact integers, added up where they are read
            return LevelResult(features, thresholds, valid, None,
                               counts=self._checked_counts(replies, features.shape))
        branch = self._noisy_sum(replies, features.shape)
        # gdp sizes: the noisy counts' sums, without the bias of clamping each at 0
        return LevelResult(features, thresholds, valid, branch, unbiased_sizes(branch, self.params.task))

    def _range_thresholds(self, replies: dict[str, Message], features: np.ndarray,
                          u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mode none (the paper's): thresholds uniform in each candidate's [min, max] over the parties.

        Returns thresholds (NaN where unusable: every row goes right) and which candidates are usable (the
        node's global range is not a point).
        """
        low = np.min([_reply_array(replies, n, "fet_ranges_reply", "min", features.shape)
                      for n in self.parties], axis=0)
        high = np.max([_reply_array(replies, n, "fet_ranges_reply", "max", features.shape)
                       for n in self.parties], axis=0)
        valid = np.isfinite(low) & np.isfinite(high) & (low < high)
        with np.errstate(invalid="ignore", over="ignore"):
            thresholds = low + u * (high - low)
        # a rounded-up draw: keep both sides non-empty
        thresholds = np.where(thresholds >= high, low, thresholds)
        return np.where(valid, thresholds, np.nan), valid

    def _box_thresholds(self, replies: dict[str, Message], features: np.ndarray, u: np.ndarray,
                        boxes: NodeBoxes) -> tuple[np.ndarray, np.ndarray]:
        """DP modes: thresholds uniform in each candidate's box (declared domain cut by the splits above).

        The parties' replies must carry nothing (no extremes). A box that is a point makes its candidate
        unusable, as an empty range does in mode none.
        """
        for name in self.parties:
            reply = replies[name]
            if reply.kind != "fet_ranges_reply" or reply.arrays:
                raise ProtocolError(f"party {name!r} answered {reply.kind!r} with arrays "
                                    f"{sorted(reply.arrays)}; in privacy {self.privacy!r} a party sends no "
                                    "ranges: expected an empty 'fet_ranges_reply'")
        low, high = boxes.grid(features)
        if self.marginals is not None:  # gdp: where the rows are, by the noisy marginal CDFs
            u = self.marginals.warp(features, low, high, u)
        return span_thresholds(low, high, np.ones(features.shape, dtype=bool), u)

    def advance(self, level: Level, split_idx: np.ndarray, left: np.ndarray, child_open: np.ndarray,
                next_pos: np.ndarray) -> None:
        """Besides the shared transition: the open children's boxes (DP modes).

        A drawn level's decisions are its one candidate at every node; before the leaves no box is needed.
        """
        if self._random_level and self._child_weights is not None:  # plan marginals: the open children's
            children = self._child_weights.reshape(-1, self._child_weights.shape[-1])
            opened = np.flatnonzero(next_pos >= 0)
            self._node_weights = np.empty((len(opened), children.shape[1]))
            self._node_weights[next_pos[opened]] = children[opened]
            self._child_weights = None
        if self._random_level:
            chosen = np.where(level.split, 0, -1).astype(np.int32)
            self._transition = {"chosen": chosen, "next_pos": next_pos}
            self._open_stats = self._open_n = self._open_parent_values = None
        else:
            super().advance(level, split_idx, left, child_open, next_pos)
        if self._random_level and self._depth + 1 >= (self.params.max_depth or 0):
            self._boxes = None  # the next level is the leaves: no thresholds to place
        elif self._boxes is not None:
            self._boxes = self._boxes.after_level(level, split_idx, next_pos)

    def master_bytes_per_node(self) -> int:
        """The DP modes add the nodes' boxes (`box_bytes_per_node`: cut only, never narrowed)."""
        extra = box_bytes_per_node() if self.domains is not None else 0
        return super().master_bytes_per_node() + extra

    def _estimate(self, replies: dict[str, Message], shape: tuple[int, int], valid: np.ndarray,
                  depth: int) -> tuple[np.ndarray, np.ndarray]:
        """LDP: sum the parties' bit sums and exact branch sizes, and estimate the branches' class counts.

        Only of the branches that can matter: candidates with both sides of at least min_samples_leaf rows
        (the others cannot split), and at the roots candidate 0, whose branches give the root's own counts.
        """
        ldp = self._label_ldp()
        n_bits = ldp.bits_for(self.schema.n_classes)
        parts = {name: {field: _reply_array(replies, name, "fet_bit_sums", field, (*shape, 2, n_bits)[:ndim])
                        for field, ndim in (("bit_sums", 4), ("sizes", 3))} for name in self.parties}
        for name, arrays in parts.items():
            # exact branch sizes, checked as integer counts; each bit sum an integer within its branch's size
            self.counts.check(f"party {name!r}", "fet_bit_sums.sizes", arrays["sizes"][..., None],
                              self.party_rows[name])
            check_bit_sums(f"party {name!r}", arrays["bit_sums"], arrays["sizes"])
        # typeshed's sum may return 0 (an empty iterable); there is always a party
        sizes = cast(np.ndarray, sum(arrays["sizes"].astype(np.int64) for arrays in parts.values()))
        needed = valid & (sizes.min(axis=-1) >= self.min_samples_leaf)
        if depth == 0:
            needed[:, 0] = True
        # the needed branches' bit sums only
        bit_sums = sum(arrays["bit_sums"][needed].astype(np.int64) for arrays in parts.values())
        branch = np.zeros((*shape, 2, self.n_stats))
        branch[needed] = ldp.estimate_counts(bit_sums, sizes[needed], self.schema.n_classes)
        return branch, sizes

    def _label_ldp(self) -> LabelLDP:
        """The label LDP mechanism (privacy "ldp"), sized for the schema's classes."""
        if self.ldp is None:
            raise ParameterError(f"privacy {self.privacy!r}: the master needs the label LDP mechanism "
                                 "(ldp=...)")
        return self.ldp

    def _checked_counts(self, replies: dict[str, Message], shape: tuple[int, int]) -> list[np.ndarray]:
        """Mode none: each party's branch statistics (A, k, 2, S), checked (`CountLedger`).

        Integers below 2**52 (see SUM_BITS): their float64 sums are exact in any order.
        """
        parts = []
        for name in self.parties:
            parts.append(_reply_array(replies, name, "fet_counts", "counts", (*shape, 2, self.n_stats)))
            self.counts.check(f"party {name!r}", "fet_counts.counts", parts[-1], self.party_rows[name],
                              self._target_bits(name))
        return parts

    def _noisy_sum(self, replies: dict[str, Message], shape: tuple[int, int]) -> np.ndarray:
        """GDP: sum the parties' noisy branch statistics, each checked: (A, k, 2, S) float64."""
        stats_shape = (*shape, 2, self.n_stats)
        total = np.zeros(stats_shape, dtype=np.float64)
        for name in self.parties:
            part = _reply_array(replies, name, "fet_noisy_counts", "counts", stats_shape)
            check_noisy_counts(f"party {name!r}", "fet_noisy_counts.counts", part, self._row_bound[name],
                               *self._noise_scales(name))
            total += part
        return total

    def _target_bits(self, party: str) -> int | None:
        """Regression: b with |q| <= 2**b for each of the party's quantised targets; None for classes.

        |y| < 2**y_exponent (its hello), so |y * 2**q_shift| < 2**(y_exponent + q_shift), and rounding reaches
        at most that power of two (at least 1).
        """
        if self.params.task != "regression":
            return None
        return max(self.party_y_exponent[party] + self.q_shift, 0)

    def _noise_scales(self, party: str) -> tuple[float, int | None, float]:
        """GDP: the party's count noise sigma, its targets' bits and its sums' noise sigma (`_gdp_reply`).

        From the agreed plan, whose sigma every party's hello stated (`setup`), never from a party's own word.
        """
        sigma = max(self._plan().sigma, self._stated_sigma.get(party, 0.0))  # within SIGMA_TOLERANCE
        if self.params.task != "regression":
            return sigma, None, 0.0
        # a row moves a sum by at most 2**q_bits: its noise is scaled by that
        return sigma, self._target_bits(party), float(2 ** self.q_bits) * sigma


def _dp_domains(privacy: str, low: np.ndarray | None, high: np.ndarray | None,
               n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The declared domains the DP modes draw thresholds in (None in mode none, which uses the ranges)."""
    if privacy not in ("gdp", "ldp"):
        return None
    if low is None or high is None:
        raise ParameterError(f"privacy {privacy!r}: the master draws thresholds in the declared feature "
                             "domains (low=..., high=..., from the data contracts), never from a party's "
                             "extremes")
    domains = np.asarray(low, np.float64), np.asarray(high, np.float64)
    if any(d.shape != (n_features,) for d in domains):
        raise ParameterError(f"privacy {privacy!r}: low and high need one value per feature ({n_features}), "
                             f"got shapes {domains[0].shape} and {domains[1].shape}")
    return domains


def _reported_exponent(party: str, header: dict) -> int:
    """A regression party's y_exponent from its hello reply: |y| < 2**y_exponent, a float64's exponent.

    At most MAX_Y_EXPONENT: a label beyond that is no measurement (see there).
    """
    exponent = header.get("y_exponent")
    if isinstance(exponent, (bool, np.bool_)) or not isinstance(exponent, (int, np.integer)) \
            or not -1074 <= exponent <= MAX_Y_EXPONENT:
        raise ProtocolError(f"party {party!r} reported no usable target magnitude ({exponent!r}); a "
                            f"regression party states y_exponent, an integer in [-1074, {MAX_Y_EXPONENT}] "
                            "with |y| < 2**y_exponent, in its hello reply")
    return int(exponent)


def _reply_array(replies: dict[str, Message], party: str, kind: str, name: str, shape: tuple) -> np.ndarray:
    """A named array of a party's reply, checked for kind and shape."""
    reply = replies[party]
    if reply.kind != kind or name not in reply.arrays:
        raise ProtocolError(f"party {party!r} answered {reply.kind!r} without {name!r}; expected {kind!r}")
    array = reply.arrays[name]
    if tuple(array.shape) != tuple(shape):
        raise ProtocolError(f"party {party!r}: {kind}.{name} has shape {tuple(array.shape)}, expected "
                            f"{tuple(shape)}")
    return array
