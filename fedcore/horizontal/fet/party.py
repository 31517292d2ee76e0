"""The institution's role in horizontal Federated Extra-Trees.

It holds some rows of every column (and their labels) and answers the master's requests with aggregates only.

Per level the party receives the candidate features of every open node and the previous level's decisions
(`fet_ranges`); in mode none it replies with its local min and max of each candidate over the node's rows (the
paper's), in the DP modes with an empty reply: a node's minimum is a record's raw value, so no extreme leaves
a DP party (the master draws thresholds in the declared domains instead). Then it receives the thresholds
(`fet_stats`) and replies with per-branch label statistics in its privacy mode:

* none: exact integer class counts, or (count, sum of quantised targets) for regression;
* gdp: the same vector plus Gaussian noise from the party's own seeded stream, its scale calibrated to the
  party's own budget for the whole model (`horizontal/plan.py`), each release charged to its `PrivacyLedger`
  (so are its row count and marginal histograms at hello, both noisy: no exact count leaves it);
* ldp: sums of the label reports' bits (`fedcore.privacy.ldp`: each row's response drawn once and reused
  across trees; the Bloom mechanism adds a fresh instant report per query), plus plain branch sizes. Every
  random word is addressed by the row's position (`fedcore.privacy.ldp_draws`), so a party on a Dask
  cluster draws exactly the in-process words.

Rows never leave; the party tracks which open node each of its rows sits in, per tree of the batch, and
applies the master's decisions locally (`PartyRows` in `rows.py`, which PPD-ERT parties hold too).

The party answers only `FET_PROTOCOL`, in its order: hello, then per level fet_ranges and fet_stats, then
model, acknowledged (in a DP mode with its ledger's data-independent summary, `stated_ledger`), after which
a new session may say hello again. Anything else, PPD-ERT's or the vertical setting's
messages included, is refused with ProtocolError (`fedcore.protocol.dispatch`).
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.algorithms import EXTRA_TREES
from fedcore.errors import ParameterError, ProtocolError
from fedcore.horizontal.ledgers import LEDGER, label_ldp_ledger
from fedcore.horizontal.model import HorizontalForest
from fedcore.horizontal.plan import (
    COUNT_RELEASES,
    GDP_PLAN_TERMS,
    count_sigma,
    gaussian_plan,
    leaf_sigma,
    marginal_sigma,
)
from fedcore.horizontal.rows import PartyRows, check_hello, narrow, own_rows, receive_model
from fedcore.horizontal.schema import HorizontalSchema
from fedcore.privacy.accounting import DEFAULT_DELTA, PrivacyLedger
from fedcore.protocol.dispatch import Protocol, Step
from fedcore.protocol.messages import Header, Message
from fedcore.randomness import counter_key, stream
from fedcore.trees.budget import default_budget

if TYPE_CHECKING:
    from fedcore.compute.dask_rows import DaskPartyRows
    from fedcore.privacy.accounting import GaussianPlan
    from fedcore.privacy.ldp import LabelLDP

log = logging.getLogger(__name__)

FET_PROTOCOL = Protocol(
    "Federated Extra-Trees", initial="idle",
    states={"idle": "no session: before hello, or after the model",
            "greeted": "after hello",
            "ranged": "after a level's fet_ranges",
            "counted": "after a level's fet_stats"},
    steps=[
        Step("idle", "hello", "greeted", "hello_reply"),
        Step(("greeted", "counted"), "fet_ranges", "ranged", "fet_ranges_reply"),
        Step("ranged", "fet_stats", "counted", "fet_counts", roles={"none"}),
        Step("ranged", "fet_stats", "counted", "fet_noisy_counts", roles={"gdp"}),
        Step("ranged", "fet_stats", "counted", "fet_bit_sums", roles={"ldp"}),
        # gdp plan leaves: a drawn level's splits (nothing released), then each tree's leaves, released once
        Step(("greeted", "counted"), "fet_split", "counted", "fet_split_reply", roles={"gdp"}),
        Step("counted", "fet_leaves", "counted", "fet_leaf_counts", roles={"gdp"}),
        # from greeted: every batch was restored from checkpoints
        Step(("greeted", "counted"), "model", "idle", "ack"),
    ])
"""What a FET party answers, in which order; the role is its privacy mode (see fedcore.protocol.dispatch).
The three modes share their message kinds; the statistics' reply differs, and `fet_ranges_reply` carries the
min/max arrays in mode none only (empty in gdp and ldp)."""


class HorizontalParty:
    """One institution in Federated Extra-Trees.

    Its rows, the agreed schema, its privacy settings and the protocol handlers (`FET_PROTOCOL`).

    `noise_seed` seeds the party's own random streams (Gaussian noise, randomized response); it never comes
    from the master. None draws a fresh random seed (runs are then not reproducible). `epsilon`, `delta`
    (gdp): the party's own budget for the whole model, per row.
    """

    algorithm = EXTRA_TREES.id
    protocol = FET_PROTOCOL

    def __init__(self, name: str, frame: pd.DataFrame | None, schema: HorizontalSchema, *,
                 privacy: str = "none", epsilon: float = 1.0, delta: float = DEFAULT_DELTA,
                 ldp: LabelLDP | None = None,
                 noise_seed: int | None = None, memory_budget: int | None = None,
                 rows: DaskPartyRows | None = None) -> None:
        """Encode this party's rows with the agreed schema and keep its privacy and memory settings.

        `memory_budget`: bytes this party grows tree batches in (default: a share of its available memory),
        reported in `hello_reply` so the master's batches fit (`fedcore.trees.budget`). `rows`: the rows
        already on a Dask cluster (`fedcore.compute.dask_rows`), instead of `frame` (then None).
        """
        self.name = name
        self.memory_budget = memory_budget
        self.schema = schema
        self.privacy = privacy
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        # n_bits fixed for the classes
        self.ldp = ldp.sized_for(schema.n_classes) if ldp is not None else None
        self.noise_seed = int(noise_seed) if noise_seed is not None else secrets.randbits(63)
        self.rows: PartyRows | DaskPartyRows = own_rows(name, frame, schema, rows)
        if isinstance(self.rows, PartyRows):  # in process: the encoded rows, as before
            self.X, self.y = self.rows.X, self.rows.y
        self.n_rows = self.rows.n_rows
        self.model: HorizontalForest | None = None
        self.ledger: PrivacyLedger[GaussianPlan] | None = None  # gdp: made at hello, from the master's terms
        self.restored_ledger = (0, 0)  # gdp: (releases per row, queries) of a resumed run (the agent's)
        self.reports_per_row = 0  # LDP: instant reports the busiest row has sent
        self.reports = 0  # noise reports so far: the noise streams are keyed by this count
        self.plan_k = 0  # gdp: the candidates per node the plan is for (hello)
        self.ledger_terms: dict = {}  # gdp: the plan's terms (hello)
        self._marginal_grid: tuple[np.ndarray, np.ndarray] | None = None  # gdp: the released histograms' grid
        self.y_exponent = 0  # regression: |y| < 2**y_exponent, stated in hello
        self.machine = FET_PROTOCOL.start(log)

    @property
    def protocol_role(self) -> str:
        """The privacy mode: which statistics reply the party sends."""
        return self.privacy

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, message: Message) -> Message:
        """Answer one protocol message.

        Refuse it (ProtocolError) when it is not the next one of `FET_PROTOCOL` for this party.
        """
        return self.machine.handle(self, message)

    def _on_hello(self, message: Message) -> Message:
        h = message.header
        check_hello(self.name, self.algorithm, self.schema, h)
        if h.get("privacy") != self.privacy:
            raise ProtocolError(f"party {self.name!r} is configured for privacy={self.privacy!r}, the master "
                                f"asked for {h.get('privacy')!r}; the party's own setting wins: reconfigure "
                                "the master")
        header: dict[str, object] = {"n_rows": self.n_rows,
                                     "memory_budget": self.memory_budget or default_budget()}
        if self.schema.task == "regression":
            largest = self.rows.label_abs_max()
            # |y| < 2**y_exponent: a power of two, not a value
            self.y_exponent = int(np.frexp(largest)[1])
            header["y_exponent"] = self.y_exponent
        arrays: dict[str, np.ndarray] = {}
        if self.privacy == "gdp":
            # the noise scale is public: the master bounds and weighs noisy counts by it
            plan = self._start_ledger(h)
            header["sigma"] = plan.sigma
            if self.ledger_terms["marginal_bins"]:
                arrays["marginals"] = self._marginals(message, plan)
            self._charge_hello()
            header["n_rows"] = self._noisy_rows(plan)
        if self.privacy == "ldp":
            self.rows.draw_permanent(self.label_ldp(), counter_key(self.noise_seed, "ldp_permanent"))
        return Message("hello_reply", header, arrays)

    def _marginals(self, message: Message, plan: GaussianPlan) -> np.ndarray:
        """GDP: the noisy marginal histograms over the hello's grid (`fet/marginals.py`): the first release.

        Charged with the row count (`_charge_hello`); the noise is keyed by purpose only, so a second hello
        (or a resumed run) gets the same release, and a second hello with another grid is refused (it would
        release other counts under the same noise).
        """
        assert self.ledger is not None, "hello makes the ledger under gdp"
        grid = [message.arrays.get(end) for end in ("low", "high")]
        if any(g is None or g.dtype.kind not in "iuf" or np.shape(g) != (self.schema.n_features,)
               or not np.all(np.isfinite(g)) for g in grid):
            raise ProtocolError(f"party {self.name!r}: a gdp hello with marginal histograms needs the "
                                f"declared domains 'low' and 'high', {self.schema.n_features} finite values "
                                "each")
        low, high = (np.asarray(g, np.float64) for g in grid)
        if self._marginal_grid is not None and not all(
                np.array_equal(a, b) for a, b in zip(self._marginal_grid, (low, high), strict=True)):
            raise ProtocolError(f"party {self.name!r} has released its marginal histograms over other "
                                "domains; a second hello must send the same 'low' and 'high'")
        self._marginal_grid = (low, high)
        terms = self.ledger_terms
        classes = terms["marginal_classes"]
        if classes and classes != self.schema.n_classes:
            raise ProtocolError(f"party {self.name!r}: the master asks for marginal histograms per "
                                f"{classes} classes, the schema has {self.schema.n_classes}")
        counts = self.rows.marginal_histograms(low, high, terms["marginal_bins"], classes)
        noise = stream(self.noise_seed, "gdp_marginals").standard_normal(counts.shape)
        return counts.astype(np.float64) + noise * marginal_sigma(plan, terms)

    def _charge_hello(self) -> None:
        """GDP: charge hello's releases (row count, marginal histograms) once: a resumed ledger has them."""
        assert self.ledger is not None, "hello makes the ledger under gdp"
        if self.ledger.queries == 0:
            try:
                self.ledger.charge(self.ledger_terms["marginal_releases"] + COUNT_RELEASES,
                                   f"party {self.name!r}")
            except ParameterError as error:
                raise ProtocolError(str(error)) from None

    def _noisy_rows(self, plan: GaussianPlan) -> int:
        """GDP: the row count plus Gaussian noise (`count_sigma`), rounded, at least 0; no exact count leaves.

        Keyed by purpose only, so a second hello (or a resumed run) states the same count, charged once.
        """
        noise = stream(self.noise_seed, "gdp_count").standard_normal() * count_sigma(plan)
        return max(int(np.rint(self.n_rows + noise)), 0)

    def _start_ledger(self, h: Header) -> GaussianPlan:
        """GDP: the plan of the master's terms under this party's own budget, and its ledger.

        The ledger of a resumed run starts where its checkpoint left it (`restored_ledger`); a second hello
        to the same party keeps its ledger, and is refused if it plans otherwise.
        """
        terms = {name: h.get(name) for name in GDP_PLAN_TERMS}
        try:
            plan = gaussian_plan(self.epsilon, self.delta, terms)
        except ParameterError as error:
            raise ProtocolError(f"party {self.name!r}: {error}") from None
        if terms["n_features"] != self.schema.n_features:
            raise ProtocolError(f"party {self.name!r}: the master plans for {terms['n_features']} features, "
                                f"the agreed schema has {self.schema.n_features}")
        if h.get("task") != self.schema.task:
            raise ProtocolError(f"party {self.name!r}: the master plans for task {h.get('task')!r}, the "
                                f"agreed schema's is {self.schema.task!r}")
        self.plan_k = h.int("k")
        if self.ledger is None:
            releases, queries = self.restored_ledger
            self.ledger = PrivacyLedger(plan, releases_per_row=releases, queries=queries)
        elif self.ledger.plan != plan:
            raise ProtocolError(f"party {self.name!r} has released under another plan "
                                f"({self.ledger.plan.releases} releases of L2 sensitivity "
                                f"{self.ledger.plan.sensitivity:g}); its ledger continues under that plan")
        elif self.ledger_terms and self.ledger_terms != terms:  # the same count of releases, spent elsewhere
            changed = sorted(n for n in GDP_PLAN_TERMS if self.ledger_terms.get(n) != terms.get(n))
            raise ProtocolError(f"party {self.name!r} planned its releases under other terms "
                                f"({', '.join(changed)} changed); its ledger continues under the first")
        self.ledger_terms = terms
        return plan

    # -- growth ---------------------------------------------------------------------------------
    def _on_fet_ranges(self, message: Message) -> Message:
        features = message.arrays.typed("features", "iu", 2).astype(np.int64)
        self.rows.start_level(message.header, message.arrays, features.shape[0])
        if features.size and (features.min() < 0 or features.max() >= self.schema.n_features):
            raise ProtocolError(f"party {self.name!r}: candidate feature index outside the schema")
        self.rows.features = features
        if self.privacy != "none":  # DP modes: no extreme leaves the party (thresholds from declared domains)
            return Message("fet_ranges_reply", {})
        low, high = self.rows.ranges()
        return Message("fet_ranges_reply", {}, {"min": low, "max": high})

    def _on_fet_stats(self, message: Message) -> Message:
        thresholds = message.arrays.typed("thresholds", "f", 2).astype(np.float64)
        if thresholds.shape != self.rows.features.shape:
            raise ProtocolError(f"party {self.name!r}: thresholds of shape {thresholds.shape} do not match "
                                f"the candidates {self.rows.features.shape}")
        self.rows.thresholds = thresholds
        if self.privacy == "gdp":
            self._charge(message.header)
        self.reports += 1
        if self.privacy == "ldp":
            return self._ldp_reply()
        if self.schema.task == "regression":
            counts = self._regression_sums(message.header.int("q_shift"))
        else:
            counts = self.rows.class_counts()  # the narrowest unsigned type holding the party's row count
        if self.privacy == "none":
            return Message("fet_counts", {},
                           {"counts": narrow(counts) if counts.dtype == np.int64 else counts})
        return self._gdp_reply(counts, q_bound_bits(message.header))

    def _on_fet_split(self, message: Message) -> Message:
        """GDP plan leaves: a drawn level's one split per open node; the rows move, nothing is released."""
        self._leaf_plan("fet_split")
        features = message.arrays.typed("features", "iu", 2).astype(np.int64)
        thresholds = message.arrays.typed("thresholds", "f", 2).astype(np.float64)
        if thresholds.shape != features.shape or features.shape[1:] != (1,):
            raise ProtocolError(f"party {self.name!r}: fet_split needs one feature and threshold per open "
                                f"node, got {features.shape} and {thresholds.shape}")
        self.rows.start_level(message.header, message.arrays, features.shape[0])
        if features.size and (features.min() < 0 or features.max() >= self.schema.n_features):
            raise ProtocolError(f"party {self.name!r}: split feature index outside the schema")
        self.rows.features, self.rows.thresholds = features, thresholds
        return Message("fet_split_reply", {})

    def _on_fet_leaves(self, message: Message) -> Message:
        """GDP plan leaves: the last level's decisions, then each leaf's class counts plus Gaussian noise.

        One release per tree (a row is in one leaf of each tree of the batch), charged before anything is
        drawn; the noise (`leaf_sigma`) comes from the party's stream keyed by its count of answered queries.
        """
        self._leaf_plan("fet_leaves")
        n_leaves = message.header.int("n_leaves")
        self.rows.start_level(message.header, message.arrays, n_leaves)
        # one candidate per leaf with a NaN threshold: every row goes right, so the right branch is the leaf
        self.rows.features = np.zeros((n_leaves, 1), np.int64)
        self.rows.thresholds = np.full((n_leaves, 1), np.nan)
        assert self.ledger is not None, "hello makes the ledger under gdp"
        self._charge_active_rows()
        counts = self.rows.class_counts()[:, 0, 1]
        noisy = stream(self.noise_seed, "gdp_leaves", self.reports).standard_normal(counts.shape)
        self.reports += 1
        noisy *= leaf_sigma(self.ledger.plan)  # in place: the same bits as counts + noise * sigma
        noisy += counts
        return Message("fet_leaf_counts", {}, {"counts": noisy})

    def _charge_active_rows(self) -> None:
        """Charge the ledger one release per tree the busiest row is still active in; refuse past the plan."""
        assert self.ledger is not None, "hello makes the ledger under gdp"
        times = self.rows.active_slots_per_row()
        if times:
            try:
                self.ledger.charge(times, f"party {self.name!r}")
            except ParameterError as error:
                raise ProtocolError(str(error)) from None

    def _leaf_plan(self, kind: str) -> None:
        """Refuse `kind` unless this session's gdp plan releases leaves (a classification's)."""
        if not self.ledger_terms.get("leaf_release"):
            raise ProtocolError(f"party {self.name!r}: {kind!r} belongs to gdp's plan 'leaves'; this "
                                "session's plan releases no leaves")

    def _regression_sums(self, shift: int) -> np.ndarray:
        """Per-branch (count, sum of quantised targets) of every candidate.

        (A, k, 2, 2) int64, summed in int64 (exact; the master picks the scale so that |sum of q| over all
        rows stays below 2**52).
        """
        return self.rows.shifted_regression_sums(shift)

    def _charge(self, header: Header) -> None:
        """GDP: refuse a request the plan does not cover, else charge the ledger before anything is drawn.

        The candidates must be the plan's k per node (more would raise each release's sensitivity), and a
        regression sum's noise scale 2**q_bound_bits must cover this party's own quantised targets. The
        busiest row takes part in one release per tree of the batch it is still active in.
        """
        assert self.ledger is not None, "hello makes the ledger under gdp"
        k = self.plan_k
        if self.rows.features.shape[1] != k:
            raise ProtocolError(f"party {self.name!r}: fet_stats with {self.rows.features.shape[1]} "
                                f"candidates per node, but the GDP plan is for k = {k}: more raise each "
                                "release's sensitivity")
        if self.schema.task == "regression" \
                and q_bound_bits(header) < self.y_exponent + header.int("q_shift"):
            raise ProtocolError(f"party {self.name!r}: q_bound_bits {header.get('q_bound_bits')!r} is below "
                                "its quantised targets' bound: the sums' noise would not cover one row")
        self._charge_active_rows()

    def _gdp_reply(self, counts: np.ndarray, q_bound_bits: int) -> Message:
        """The counts plus Gaussian noise of the plan's sigma (a regression sum's: sigma x 2**q_bound_bits).

        Drawn from the party's stream keyed by its count of answered queries, so a resumed run replays it.
        """
        assert self.ledger is not None, "hello makes the ledger under gdp"
        sigma = self.ledger.plan.sigma
        noise = stream(self.noise_seed, "gdp_noise", self.reports).standard_normal(counts.shape)
        if self.schema.task == "regression":
            noise *= np.array([sigma, sigma * 2.0 ** q_bound_bits])
        else:
            noise *= sigma
        return Message("fet_noisy_counts", {}, {"counts": counts.astype(np.float64) + noise})

    def _ldp_reply(self) -> Message:
        n_open, k = self.rows.features.shape
        ldp = self.label_ldp()
        n_bits = ldp.bits_for(self.schema.n_classes)
        # one fresh report per row and tree, added to the branch it takes under each candidate: drawn at
        # (row, tree slot, this report's number)
        key = counter_key(self.noise_seed, "ldp_instant")
        sums, sizes = self.rows.ldp_report_sums(ldp, key, self.reports)
        self.reports_per_row += self.rows.active_slots_per_row()
        # the narrowest unsigned type that holds the largest size: deep levels send bytes, not int64s
        wire = np.min_scalar_type(int(sizes.max()) if sizes.size else 0)
        return Message("fet_bit_sums", {}, {"bit_sums": sums.reshape(n_open, k, 2, n_bits).astype(wire),
                                            "sizes": sizes.reshape(n_open, k, 2).astype(wire)})

    # -- the finished model -----------------------------------------------------------------------
    def _on_model(self, message: Message) -> Message:
        self.model = receive_model(self.name, self.algorithm, self.schema, message)
        self.rows.clear()
        header: dict[str, object] = {"n_nodes": self.model.n_nodes}
        if self.privacy in ("gdp", "ldp"):
            header[LEDGER] = self.stated_ledger()
        return Message("ack", header)

    def stated_ledger(self) -> dict:
        """What this party states with the model: its ledger's data-independent summary (DP modes).

        gdp: the plan's terms and the accountant's epsilon for all its releases (every row's spend is under
        it); ldp: the label mechanism, each row's epsilon, delta 0. Not the busiest row's actual releases:
        those depend on the data and stay in `privacy_spent`.
        """
        if self.privacy == "gdp":
            assert self.ledger is not None, "hello makes the ledger under gdp"
            return self.ledger.plan.summary()
        return label_ldp_ledger(self.label_ldp())

    def privacy_spent(self) -> dict:
        """What this party has released, in its own accounting."""
        if self.privacy == "gdp":
            return self.ledger.to_dict() if self.ledger is not None else {}
        if self.privacy == "ldp":
            return {"reports_per_row": self.reports_per_row, **self.label_ldp().epsilon()}
        return {}

    def label_ldp(self) -> LabelLDP:
        """The label LDP mechanism (privacy "ldp"), sized for the schema's classes."""
        if self.ldp is None:
            raise ParameterError(f"privacy {self.privacy!r}: party {self.name!r} needs the label LDP "
                                 "mechanism (ldp=...)")
        return self.ldp


def q_bound_bits(header: Header) -> int:
    """A gdp regression request's noise scale exponent (2**q_bound_bits); 0 when the request has none."""
    return header.int("q_bound_bits", 0) if "q_bound_bits" in header else 0
