"""What crosses the wire (docs/design.md), asserted on recorded transcripts, mode by mode.

Every row of MODES runs a whole in-process session of one setting and privacy mode (alignment, training,
evaluation, prediction) with payload recording, and says what DESIGN lets cross in that mode. One test
checks every row against the same invariants:

1. each message kind, in each direction, is one the row lists and carries only the arrays it lists
   (and every listed kind is used: the table cannot silently rot);
2. no raw feature value, raw ID, raw label or per-row label code appears in any payload, as array bytes
   or header text, beyond what the row documents (FET in mode none: each party's min/max of candidate
   features, none in gdp / ldp; horizontal: the agreed schema in the contract and setup messages);
3. vertical: feature names never cross, and no party's split threshold appears in any message, so
   neither the master nor another party ever receives it;
4. secure aggregation: the master receives only masked vectors that look uniform in their ring, never a
   vector a party computed in plain, and their sum is exactly the parties' total.

The raw values searched for are chosen to be distinctive: continuous floats with many digits, IDs like
`CUST-3F9A0C21D4`, labels `class_0..2`, column names `feat_*`; a probe message shows the search finds
each of them where they are. To add a mode, write its `run_*` function and add a row to MODES.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedcore.protocol.messages import Message
from fedcore.transport.base import MASTER, TranscriptEntry
from fedcore.transport.inprocess import InProcessTransport
from tests.conftest import mixed_table
from tests.wire import continuous_bits, float_bits, found_bits

LABEL = "target_label"
KEY = b"consortium-key-for-wire-tests-0123456789"
ID_PATTERN = re.compile(rb"(?:CUST|PAT)-[0-9A-F]{10}")
CLASSES = ("class_0", "class_1", "class_2")
# cat_str; cat_pd's one-letter values are not distinctive
CATEGORIES = ("crimson", "emerald", "azure", "onyx")
NAMES = ("north", "south", "east")
CODE_WINDOW = 64
"""Per-row label codes are searched as runs of this many consecutive rows (short runs of small integers
would also match ordinary count vectors by chance)."""


# -- one recorded session ----------------------------------------------------------------------------
@dataclass
class Recorded:
    """A session's transcript and the raw data it must not carry."""

    transcript: list[TranscriptEntry]
    parties: list[str]
    """Institution names in the master's order."""
    raw_floats: np.ndarray
    """Bit patterns of every continuous raw feature value at every institution."""
    ids: set[str]
    feature_names: list[str]
    label_codes: dict[str, np.ndarray] = field(default_factory=dict)
    """Each institution's per-row encoded training labels."""
    thresholds: dict[str, np.ndarray] = field(default_factory=dict)
    """Each institution's own split thresholds (bit patterns), vertical."""
    plain_counts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """Every count vector each institution computed in plain before masking it, secure aggregation."""
    plain_ranges: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    """PPD-ERT histogram thresholds: each institution's per-candidate min and max, per level (never sent)."""
    keyed_hashes: list[bytes] = field(default_factory=list)
    """The consortium-keyed hashes of the institutions' IDs (vertical)."""
    noise: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """PPD-ERT secagg-dp: the discrete Gaussian noise each institution added to each vector it masked."""
    exact_rows: dict[str, int] = field(default_factory=dict)
    """Each institution's exact training rows (secagg-dp: never sent)."""
    count_noise: dict[str, int] = field(default_factory=dict)
    """PPD-ERT secagg-dp: the noise of each institution's stated row count, drawn again from its seed."""
    noise_seeds: dict[str, tuple[int, object]] = field(default_factory=dict)
    """FET gdp: each institution's noise seed and Gaussian plan (its own, never sent)."""
    spent: dict[str, dict] = field(default_factory=dict)
    """FET gdp: each institution's own ledger after training (`privacy_spent`, never sent)."""
    session: object = None

    @cached_property
    def messages(self) -> list[tuple[TranscriptEntry, Message]]:
        """Every transcript entry with its decoded message."""
        return [(entry, Message.from_bytes(entry.payload)) for entry in self.transcript]


def _distinctive_table(n_rows: int, seed: int, prefix: str) -> pd.DataFrame:
    """mixed_table with distinctive column names, a label column and unique IDs `<prefix>-<10 hex digits>`."""
    table = mixed_table(n_rows=n_rows, seed=seed, n_classes=3)
    table = table.rename(columns={c: (LABEL if c == "target" else f"feat_{c}") for c in table.columns})
    rng = np.random.default_rng(seed + 1)
    ids = {f"{prefix}-{v:010X}" for v in rng.integers(1 << 36, 1 << 40, 3 * n_rows)}
    table.insert(0, "record_id", sorted(ids)[:n_rows])
    return table.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def _continuous(frame: pd.DataFrame) -> np.ndarray:
    numeric = [c for c in frame.columns if c.startswith("feat_num")]
    return continuous_bits([frame], numeric) if numeric else np.zeros(0, np.uint64)


# -- vertical ------------------------------------------------------------------------------------------
def run_vertical(tmp_path: Path, alignment: str, privacy: str = "none") -> Recorded:
    """Vertical Federated Forest over three institutions with partially overlapping customers.

    Align (keyed hashes or PSI), train (labels shared, or encrypted under Paillier or Okamoto-Uchiyama),
    evaluate on the held-out rows, batch predict new customers.
    """
    from fedcore.agents.data import InstitutionData
    from fedcore.data.split import split_vertical
    from fedcore.privacy.hashing import hash_ids
    from fedcore.trees.params import ForestParams
    from fedcore.vertical.agent import VerticalInstitutionAgent
    from fedcore.vertical.session import VerticalSession

    table = _distinctive_table(420, seed=31, prefix="CUST")
    train, new = table.iloc[:360], table.iloc[360:]
    columns = [list(p.columns) for p in split_vertical(table.drop(columns=["record_id"]), 3,
                                                       label=LABEL, seed=5)]
    rng = np.random.default_rng(7)
    agents, frames = {}, {}
    for name, cols in zip(NAMES, columns, strict=True):
        keep = rng.random(len(train)) < 0.92  # each institution knows most, not all, of the customers
        frames[name] = train.loc[keep, ["record_id", *cols]].sample(frac=1.0, random_state=1)
        batch = new[["record_id", *[c for c in cols if c != LABEL]]]
        data = InstitutionData(name=name, frame=frames[name], id_column="record_id",
                               label=LABEL if LABEL in cols else None, registry=tmp_path / "registry" / name,
                               predictions_dir=tmp_path / "predictions" / name, load_batch=lambda b=batch: b)
        agents[name] = VerticalInstitutionAgent(data, KEY)
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    transport.exchange({n: Message("validation_report") for n in agents})
    session = VerticalSession(transport,
                              ForestParams(n_estimators=4, max_depth=4, random_state=1, privacy=privacy),
                              holdout_fraction=0.25, min_overlap=50, alignment=alignment)
    session.align()
    session.train()
    session.evaluate()
    holder = next(n for n, a in agents.items() if a.data.label)
    session.batch_predict(holder)
    thresholds = {}
    for name, agent in agents.items():
        t = agent.party.model.threshold
        # int0's k + 0.5 also occurs as counts and gains
        t = t[np.isfinite(t) & ~np.isclose(t * 2, np.round(t * 2))]
        thresholds[name] = float_bits(t)
    return Recorded(
        transcript=transport.transcript, parties=list(session.institutions),
        raw_floats=np.unique(np.concatenate([_continuous(f) for f in frames.values()])),
        ids=set(table["record_id"]), feature_names=[c for c in table.columns if c != "record_id"],
        thresholds=thresholds, keyed_hashes=hash_ids(table["record_id"], KEY).tolist(), session=session,
        label_codes={holder: agents[holder].party.rows.labels.astype(np.int64)} if privacy != "none" else {})


# -- horizontal ----------------------------------------------------------------------------------------
def run_horizontal(tmp_path: Path, algorithm: str, privacy: str, thresholds: str = "histogram",
                   gdp_plan: dict | None = None) -> Recorded:
    """Three hospitals with the same columns.

    Agree the schema from their contracts, train (FET in one privacy mode, PPD-ERT with secure aggregation
    and `thresholds`, or histogram boosting with or without it), evaluate, predict new patients at home.
    """
    from fedcore.agents.data import InstitutionData
    from fedcore.contracts.model import infer_contract
    from fedcore.horizontal.agent import HorizontalInstitutionAgent
    from fedcore.horizontal.boosting.agent import HorizontalBoostingAgent
    from fedcore.horizontal.boosting.session import HorizontalBoostingSession
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.privacy.keyauth import ephemeral_identities
    from fedcore.trees.boosting import BoostingParams

    boosting = algorithm == "boosting"

    table = _distinctive_table(540, seed=41, prefix="PAT")
    table["feat_cat_str"] = pd.Categorical(table["feat_cat_str"], categories=list(CATEGORIES))
    contract = infer_contract(table, "wire", id_column="record_id", label=LABEL)
    identities = ephemeral_identities(NAMES)
    parts = np.array_split(np.arange(len(table)), [150, 330])
    agents = {}
    for name, rows in zip(NAMES, parts, strict=True):
        frame = table.iloc[rows].reset_index(drop=True)
        batch = frame.sample(frac=0.2, random_state=3).drop(columns=[LABEL])
        data = InstitutionData(name=name, frame=frame, id_column="record_id", label=LABEL,
                               registry=tmp_path / "registry" / name,
                               predictions_dir=tmp_path / "predictions" / name, load_batch=lambda b=batch: b,
                               contract=contract)
        agents[name] = (HorizontalBoostingAgent if boosting else HorizontalInstitutionAgent)(
            data, identity=identities[name])
    transport = InProcessTransport({n: a.handle for n, a in agents.items()}, record_payloads=True)
    transport.exchange({n: Message("validation_report") for n in agents})
    session: HorizontalSession
    if boosting:
        params = BoostingParams(n_estimators=4, max_depth=3, random_state=2)
        session = HorizontalBoostingSession(transport, params, privacy=privacy, holdout_fraction=0.2)
    else:
        session = HorizontalSession(transport, ExtraTreesParams(n_estimators=6, max_depth=5, random_state=2),
                                    algorithm=algorithm,
                                    privacy={"mode": privacy,
                                             **({"epsilon": 1.0} if privacy in ("gdp", "secagg-dp") else {}),
                                             **({"thresholds": thresholds} if privacy == "secagg" else {}),
                                             **(gdp_plan or {})},
                                    holdout_fraction=0.2)
    session.agree_schema()
    plain_counts: dict[str, list[np.ndarray]] = {}
    plain_ranges: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    if boosting:
        for name, agent in agents.items():  # record each vector a party sums (masked under secagg)
            plain_counts[name] = []
            agent.party._reply = _spy_reply(agent.party._reply, plain_counts[name])
    elif privacy in ("secagg", "secagg-dp"):
        for name, agent in agents.items():  # record what each party masks: none of it may cross
            plain_counts[name], plain_ranges[name] = [], []
            agent.party.rows.class_counts = _spy(agent.party.rows.class_counts, plain_counts[name])
            agent.party.rows.ranges = _spy_ranges(agent.party.rows.ranges, plain_ranges[name])
            if agent.party.noise is not None:  # the party's own audit of the noise it adds
                agent.party.noise.audit = []
    session.train()
    session.evaluate()
    session.predict_locally()
    return Recorded(
        transcript=transport.transcript, parties=list(session.institutions),
        raw_floats=_continuous(table), ids=set(table["record_id"]),
        feature_names=[c for c in table.columns if c != "record_id"],
        label_codes={name: (agent.party.rows if boosting else agent.party).y
                     for name, agent in agents.items()},
        plain_counts=plain_counts, plain_ranges=plain_ranges, session=session,
        noise={name: [noise.reshape(-1) for _, _, noise in agent.party.noise.audit]
               for name, agent in agents.items() if getattr(agent.party, "noise", None) is not None},
        exact_rows={name: agent.party.n_rows for name, agent in agents.items()},
        count_noise={name: _count_noise(agent.party.noise) for name, agent in agents.items()
                     if getattr(agent.party, "noise", None) is not None},
        noise_seeds={name: (agent.party.noise_seed, agent.party.ledger.plan) for name, agent in agents.items()
                     if getattr(agent.party, "ledger", None) is not None},
        spent={name: agent.party.privacy_spent() for name, agent in agents.items()
               if getattr(agent.party, "ledger", None) is not None})


def _count_noise(noise) -> int:
    """The draw a secagg-dp party added to its row count: its table's first word under its own seed."""
    from fedcore.privacy.discrete_gaussian import table
    from fedcore.randomness import counter_key

    key = counter_key(noise.noise_seed, "secagg_dp_count")
    return int(table(noise.plan.count_sigma).draw(key, 1)[0])


def _spy_ranges(method, calls: list) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    def spied() -> tuple[np.ndarray, np.ndarray]:
        low, high = method()
        calls.append((low.copy(), high.copy()))
        return low, high
    return spied


def _spy(method: Callable[[], np.ndarray], calls: list[np.ndarray]) -> Callable[[], np.ndarray]:
    def spied() -> np.ndarray:
        result = method()
        calls.append(result.reshape(-1).copy())
        return result
    return spied


def _spy_reply(method: Callable[[np.ndarray, Any], Message],
               calls: list[np.ndarray]) -> Callable[[np.ndarray, Any], Message]:
    """A boosting party's `_reply`, recording each vector before it is masked (or sent plain)."""
    def spied(vector: np.ndarray, header: Any) -> Message:
        calls.append(np.asarray(vector).reshape(-1).copy())
        return method(vector, header)
    return spied


# -- what each mode may send ------------------------------------------------------------------------------
def _arrays(table: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """{kind: "array names"} -> {kind: frozenset of array names}."""
    return {kind: frozenset(names.split()) for kind, names in table.items()}


VERTICAL_TO_MASTER = {  # DESIGN: per node each party's best local gain; partition bitmaps; leaf class counts
    "validation": "", "setup_reply": "feature_ids", "labels": "y", "aligned": "",
    "local_best": "gain rank stats", "partition_bits": "bits", "split_sets": "left", "ack": "",
    "metrics": "confusion curve", "delivered": ""}  # held-out confusion; binary: curve counts
VERTICAL_TO_PARTIES = {  # DESIGN: its sampled feature ids; bitmaps of nodes it does not own; encoded labels;
    # the importance shares of its own splits
    "validation_report": "", "align": "positions holdout", "setup": "", "export_labels": "",
    "configure": "global_index y", "begin_batch": "feat_ptr feat_global feat_rank",  # the first level's
    "find_splits": "feat_ptr feat_global feat_rank split_mask split_owner bits_0 bits_1 bits_2",
    "apply_splits": "tree node positions", "finalize": "tree node left right importance", "load_holdout": "",
    "predict_leaves": "", "evaluate": "values", "align_batch": "positions", "deliver_predictions": "values"}
ENCRYPTED_LABELS_TO_MASTER = {  # DESIGN: as plain, with gains of passive parties computed at the label holder
    "setup_reply": "feature_ids seal_public", "labels": "enc_y", "encrypted_histograms": "packed sealed",
    "encrypted_best": " ".join(f"gain_{n} rank_{n} choice_{n}" for n in NAMES)}
ENCRYPTED_LABELS_TO_PARTIES = {
    "configure": "global_index enc_y " + " ".join(f"seal_{n}" for n in NAMES),
    "evaluate_encrypted": " ".join(f"packed_{n} sealed_{n}" for n in NAMES),
    "apply_splits": "tree node positions choice"}
HASH_ALIGNMENT = ({"id_hashes": "hashes"}, {"id_hashes": "", "batch_hashes": ""})
PSI_ALIGNMENT = ({"psi_blinded": "blinded", "psi_reblinded": "values"},
                 {"psi_blinded": "", "psi_reblind": "values"})

HORIZONTAL_TO_MASTER = {  # around training: contract, row counts, evaluation aggregates, predicted row counts
    "validation": "", "contract": "", "ready": "", "hello_reply": "",
    "evaluation": "confusion log_loss_sum curve",  # curve: two classes, the institution's curve groups
    "predicted": "", "ack": ""}
HORIZONTAL_TO_PARTIES = {
    "validation_report": "", "contract": "", "setup": "", "hello": "", "evaluate": "", "predict_local": "",
    "model": "tree node left right depth feature threshold value weight"}  # DESIGN: the finished model
# candidates, thresholds
FET_TO_PARTIES = {"fet_ranges": "features chosen next_pos", "fet_stats": "thresholds"}
BOOSTING_TO_PARTIES = {  # a level's decisions, a round's first request the round before's finished trees
    "boost_base": "", "boost_level": "tree split_feature split_bin next_pos compute " + " ".join(
        f"round_{name}" for name in ("tree", "node", "left", "right", "depth", "feature", "threshold",
                                     "weight", "value"))}
SCHEMA_KINDS = frozenset({"contract", "setup"})
"""Horizontal: the agreed schema (column names, categories, classes) crosses in these, no data."""


def _min_max(message: Message) -> np.ndarray:
    """FET: a party's min/max of each candidate feature over a node's rows cross by design (DESIGN)."""
    if message.kind != "fet_ranges_reply":
        return np.zeros(0, np.uint64)
    return float_bits(np.concatenate([message.arrays["min"].ravel(), message.arrays["max"].ravel()]))


@dataclass(frozen=True)
class WireMode:
    """One row of the "What crosses the wire" table: how to run the mode and what it may send."""

    run: Callable[[Path], Recorded]
    to_master: Mapping[str, frozenset[str]]
    """Every message kind the master receives, with the arrays it may carry."""
    to_parties: Mapping[str, frozenset[str]]
    schema_kinds: frozenset[str] = frozenset()
    """Kinds that may carry column names, categories and class names."""
    discloses: Callable[[Message], np.ndarray] | None = None
    """Raw values (bit patterns) DESIGN lets this message carry."""
    label_codes_cross: bool = False
    """Vertical: the label holder shares its encoded labels (codes, not the label values)."""
    private_thresholds: bool = False
    secagg: bool = False
    extras: tuple[Callable[[Recorded], None], ...] = ()
    """Checks of this mode only."""


# -- checks of one mode only -------------------------------------------------------------------------------
def _cells_reveal_only_the_extreme_cells(run: Recorded) -> None:
    """PPD-ERT histogram thresholds.

    Per candidate, the master's unmasked cell sums are non-zero exactly from the cell of the smallest value
    over all parties on (first half) and up to the cell of the largest (second half), and their values hide
    how many parties hold a cell (random odd multipliers).
    """
    from fedcore.horizontal.ppdert.cells import cell_of
    from fedcore.privacy.secagg import unmask_sum

    messages = [(e, m) for e, m in run.messages]
    requests = [m for e, m in messages if e.receiver == run.parties[0] and m.kind == "ppdert_cells"]
    replies: dict[int, dict[str, np.ndarray]] = {}
    for entry, message in messages:
        if entry.receiver == MASTER and message.kind == "ppdert_masked_cells":
            replies.setdefault(entry.round, {})[entry.sender] = message.arrays["masked"]
    assert len(requests) == len(replies) == len(run.plain_ranges[run.parties[0]]) > 3
    shared_cells = odd = 0
    for level, (request, r) in enumerate(zip(requests, sorted(replies), strict=True)):
        grid_low, grid_high = request.arrays["grid_low"], request.arrays["grid_high"]
        n = request.header["n_cells"]
        total = unmask_sum([replies[r][p] for p in run.parties]).reshape(*grid_low.shape, 2, n)
        assert total.dtype == np.int64  # the 64-bit ring
        low = np.min([run.plain_ranges[p][level][0] for p in run.parties], axis=0)
        high = np.max([run.plain_ranges[p][level][1] for p in run.parties], axis=0)
        has = np.isfinite(low)
        first = cell_of(np.where(has, low, 0), grid_low, grid_high, n)
        last = cell_of(np.where(has, high, 0), grid_low, grid_high, n)
        cells = np.arange(n)
        np.testing.assert_array_equal(total[..., 0, :] != 0, (cells >= first[..., None]) & has[..., None])
        np.testing.assert_array_equal(total[..., 1, :] != 0, (cells <= last[..., None]) & has[..., None])
        # where all three parties hold a cell, a plain count would read 3; the sums are spread over the ring,
        # low bit included (odd multipliers would make it the count's parity)
        lows = [lo for lo, _ in (run.plain_ranges[p][level] for p in run.parties)]
        first_cells = [cell_of(np.where(np.isfinite(lo), lo, 0), grid_low, grid_high, n) for lo in lows]
        all_three = np.all([(cells >= own_first[..., None]) & np.isfinite(lo)[..., None]
                            for own_first, lo in zip(first_cells, lows, strict=True)], axis=0)
        values = total[..., 0, :][all_three]
        shared_cells += values.size
        odd += int(np.sum(values % 2))
        assert np.mean(np.abs(values) < 1 << 32) < 0.01
    assert shared_cells > 1000
    assert 0.45 < odd / shared_cells < 0.55


def _vertical_bitmaps_and_stats(run: Recorded) -> None:
    """Only the label holder reports leaf class counts; a party never receives its own nodes' bitmaps."""
    holder = run.session.master.info.label_holder
    senders = {e.sender for e, m in run.messages if m.kind == "local_best" and "stats" in m.arrays}
    assert senders == {holder}
    own = {name: f"bits_{index}" for index, name in enumerate(run.parties)}
    wrong = [_where(e) for e, m in run.messages if e.receiver in own and own[e.receiver] in m.arrays]
    assert wrong == []


def _no_keyed_hash_crosses(run: Recorded) -> None:
    """PSI: IDs cross only blinded, not even as keyed hashes."""
    leaked = [e.kind for e in run.transcript for digest in run.keyed_hashes if digest in e.payload]
    assert leaked == []


def _passive_parties_get_ciphertexts_only(run: Recorded) -> None:
    """Encrypted labels: the label holder alone gets histograms to decrypt.

    Passive parties get the label ciphertexts once, no plain label or statistic, and only split choices sealed
    for them.
    """
    holder = run.session.master.info.label_holder
    to_holder = {k for e, m in run.messages if e.receiver == holder for k in m.arrays}
    assert any(k.startswith("packed_") for k in to_holder) and "enc_y" not in to_holder
    for entry, message in run.messages:
        if entry.receiver not in (holder, "master"):
            assert not {"y", "stats", "gain", "rank"} & set(message.arrays), _where(entry)
    configured = [m.arrays["enc_y"] for e, m in run.messages if m.kind == "configure" and "enc_y" in m.arrays]
    width = {"paillier": 512, "ou": 384}[run.session.master.params.privacy]  # n^2 of 2048 bits; n of 3072
    assert len(configured) == len(run.parties) - 1 and all(c.shape[1] == width for c in configured)


def _gdp_counts_are_noised(run: Recorded) -> None:
    counts = [m.arrays["counts"] for _, m in run.messages if m.kind == "fet_noisy_counts"]
    marginals = [m.arrays["marginals"] for _, m in run.messages if m.kind == "hello_reply"]
    assert counts and marginals
    assert all(c.dtype == np.float64 and np.any(c != np.round(c)) for c in counts + marginals)


def _gdp_leaves_are_noised(run: Recorded) -> None:
    """FET gdp plan leaves: each tree's leaf class counts cross once, noised; drawn levels cross no statistic.

    Every party's `fet_split_reply` is empty, its `fet_leaf_counts` are floats off the integers, and its
    ledger charged exactly the plan's releases: a row's split levels and one leaf release per tree, the
    marginal histograms and the row count (the accountant's total at most the budget).
    """
    splits = [m for e, m in run.messages if m.kind == "fet_split_reply"]
    leaves = [m.arrays["counts"] for _, m in run.messages if m.kind == "fet_leaf_counts"]
    assert splits and all(not m.arrays and not m.header for m in splits)
    assert leaves and all(c.dtype == np.float64 and np.any(c != np.round(c)) for c in leaves)
    from fedcore.horizontal.fet.marginals import marginal_releases
    from fedcore.horizontal.plan import COUNT_RELEASES

    planned = 6 * (1 + 1)  # 6 trees x (1 split level + 1 leaf release)
    planned += marginal_releases(planned) + COUNT_RELEASES
    model = run.session.model
    unsplit = int(np.sum((model.depth == 0) & (model.feature < 0)))  # a root whose noisy counts chose none
    for name in run.parties:
        spent = run.spent[name]  # the party's own ledger: its busiest row took part in every release made
        assert spent["planned_releases_per_row"] == planned
        assert spent["releases_per_row"] == planned - unsplit  # a root that is a leaf releases no leaves
        assert 0 < spent["epsilon_total"] <= spent["epsilon_budget"] == 1.0
        assert run.session.master.ledgers[name]["epsilon_total"] <= 1.0
    plan = run.session.privacy_report()["plan"]  # what the manifest and the card carry
    assert (plan["plan"], plan["split_levels"], plan["n_estimators"], plan["max_depth"]) == ("leaves", 1, 6,
                                                                                             5)


def _dp_parties_send_no_extremes(run: Recorded) -> None:
    """FET gdp / ldp: no party message carries a node's min or max (thresholds come from declared domains).

    Every message a party sent holds only statistics or nothing: each level's `fet_ranges_reply` is empty,
    and the master's thresholds lie inside the declared domains without being any party's value.
    """
    from_parties = [m for e, m in run.messages if e.receiver == MASTER]
    ranges = [m for m in from_parties if m.kind == "fet_ranges_reply"]
    assert ranges and all(not m.arrays for m in ranges)
    for message in from_parties:
        assert not {"min", "max"} & set(message.arrays), message.kind
        assert set(message.arrays) <= {"counts", "bit_sums", "sizes", "confusion", "log_loss_sum",
                                       "marginals"}, message.kind
    from fedcore.horizontal.fet.master import FederatedExtraTreesMaster
    from fedcore.horizontal.session import HorizontalSession

    session = run.session
    assert isinstance(session, HorizontalSession) and isinstance(session.master, FederatedExtraTreesMaster)
    assert session.master.domains is not None
    low, high = session.master.domains
    thresholds = [(m.arrays["thresholds"], features) for (e, m), features in _fet_levels(run)]
    assert thresholds
    for values, features in thresholds:
        usable = ~np.isnan(values)
        assert usable.any()
        assert np.all((values >= low[features]) & (values < high[features]) | ~usable)


def _fet_levels(run: Recorded) -> list[tuple[tuple[TranscriptEntry, Message], np.ndarray]]:
    """Each level's fet_stats request to the first party, with the candidate features of that level."""
    features: np.ndarray | None = None
    out = []
    for entry, message in run.messages:
        if entry.receiver != run.parties[0]:
            continue
        if message.kind == "fet_ranges":
            features = message.arrays["features"].astype(np.int64)
        elif message.kind == "fet_stats":
            assert features is not None
            out.append(((entry, message), features))
    return out


def _ldp_sends_bit_sums(run: Recorded) -> None:
    replies = [m.arrays for _, m in run.messages if m.kind == "fet_bit_sums"]
    # integer sums (the narrowest unsigned type holding the largest branch), never a row's own bits
    assert replies and all(a["bit_sums"].dtype.kind == "u" and a["sizes"].dtype == a["bit_sums"].dtype
                           and a["sizes"].shape == a["bit_sums"].shape[:-1]
                           and (a["bit_sums"] <= a["sizes"][..., None]).all() for a in replies)


def _gdp_sends_no_exact_count(run: Recorded) -> None:
    """FET gdp: no exact training-row count reaches the master.

    Setup states none; hello states the exact count plus the party's own Gaussian draw of the count's sigma
    (recomputed here from its seed and plan), rounded; no header the master receives holds the exact count.
    """
    from fedcore.horizontal.plan import count_sigma
    from fedcore.randomness import stream

    ready = {e.sender: m.header for e, m in run.messages if m.kind == "ready"}
    assert set(ready) == set(run.parties) and all(h["train_rows"] is None for h in ready.values())
    hello = {e.sender: m.header["n_rows"] for e, m in run.messages if m.kind == "hello_reply"}
    for name in run.parties:
        seed, plan = run.noise_seeds[name]
        noise = stream(seed, "gdp_count").standard_normal() * count_sigma(plan)
        assert hello[name] == max(int(np.rint(run.exact_rows[name] + noise)), 0)
    # the seeds are fresh secrets: a draw rounding to 0 (about 1.6% of parties here, count sigma 25) states
    # the exact count
    _no_exact_count_sent(run, [name for name in run.parties if hello[name] != run.exact_rows[name]])


def _no_exact_count_sent(run: Recorded, parties: list[str] | None = None) -> None:
    """No header a party (of `parties`, default all) sends the master holds its exact training-row count.

    Every integer header field counts but the model's node count in the ack (`n_nodes`), which is about the
    trees and equals a party's row count by chance in about 1% of runs (the model follows the fresh noise).
    """
    for party in run.parties if parties is None else parties:  # its own: another's noisy count may equal it
        exact = run.exact_rows[party]
        sent = {v for e, m in run.messages if e.sender == party and e.receiver == MASTER
                for name, v in m.header.items() if isinstance(v, int) and not isinstance(v, bool)
                and not (m.kind == "ack" and name == "n_nodes")}
        assert sent and exact not in sent, party


def _secagg_dp_sends_no_exact_count(run: Recorded) -> None:
    """PPD-ERT secagg-dp: no exact training-row count reaches the master, and the ledgers are in budget.

    Setup states none; hello states the exact count plus the party's own discrete Gaussian draw (recomputed
    here from its seed); no header the master receives holds an exact count (unless the draw was 0). The
    master's recomputed ledgers are within the budget (epsilon 1), the coalition's epsilon beyond it.
    """
    ready = {e.sender: m.header for e, m in run.messages if m.kind == "ready"}
    assert set(ready) == set(run.parties) and all(h["train_rows"] is None for h in ready.values())
    hello = {e.sender: m.header["n_rows"] for e, m in run.messages if m.kind == "hello_reply"}
    assert hello == {name: run.exact_rows[name] + run.count_noise[name] for name in run.parties}
    # the seeds are fresh secrets: a draw of 0 (about 1.2% of parties here, count sigma 33) states the exact
    # count
    _no_exact_count_sent(run, [name for name in run.parties if run.count_noise[name]])
    ledgers = run.session.facts.privacy_ledgers
    assert set(ledgers) == set(run.parties)
    assert all(0 < ledger["epsilon_total"] <= 1.0 < ledger["epsilon_coalition"]
               for ledger in ledgers.values())


# -- the table ---------------------------------------------------------------------------------------------
def _boosting_master_reads_only_the_sums(run: Recorded) -> None:
    """Secure aggregation: each party's (count, g, h) vectors cross only masked, uniform in the 64-bit ring.

    The master's unmasked sum of every round is the parties' total, and no party's own vector (nor a run of
    it) appears in any payload.
    """
    from fedcore.privacy.secagg import unmask_sum

    rounds: dict[int, dict[str, np.ndarray]] = {}
    for entry, message in run.messages:
        if entry.receiver == MASTER and message.kind == "boost_masked":
            rounds.setdefault(entry.round, {})[entry.sender] = message.arrays["masked"]
    values = np.concatenate([m.reshape(-1) for r in rounds.values() for m in r.values()])
    assert values.dtype == np.uint64 and len(values) >= 256 * 10
    for byte in (values >> np.uint64(56), values & np.uint64(0xFF)):
        assert stats.chisquare(np.bincount(byte.astype(np.int64), minlength=256)).pvalue > 1e-6
    assert {p: len(v) for p, v in run.plain_counts.items()} == {p: len(rounds) for p in run.parties}
    for i, r in enumerate(sorted(rounds)):
        np.testing.assert_array_equal(unmask_sum([rounds[r][p] for p in run.parties]),
                                      sum(run.plain_counts[p][i] for p in run.parties))
    windows = [w for vectors in run.plain_counts.values() for v in vectors for w in _distinctive_windows(v)]
    assert len(windows) > 10
    assert [_where(entry) for entry in run.transcript for w in windows if w in entry.payload] == []


def _boosting_plain_sums_are_the_parties_own(run: Recorded) -> None:
    """Privacy none: what each party sends is exactly its own vector (the baseline secagg masks)."""
    sent = {p: [m.arrays["sums"] for e, m in run.messages if e.receiver == MASTER and e.sender == p
                and m.kind == "boost_plain"] for p in run.parties}
    assert {p: len(v) for p, v in sent.items()} == {p: len(v) for p, v in run.plain_counts.items()}
    for p in run.parties:
        for mine, crossed in zip(run.plain_counts[p], sent[p], strict=True):
            np.testing.assert_array_equal(mine, crossed)


MODES = {
    "vertical-plain-hash": WireMode(
        run=lambda tmp: run_vertical(tmp, "hash"),
        to_master=_arrays({**VERTICAL_TO_MASTER, **HASH_ALIGNMENT[0]}),
        to_parties=_arrays({**VERTICAL_TO_PARTIES, **HASH_ALIGNMENT[1]}),
        label_codes_cross=True, private_thresholds=True, extras=(_vertical_bitmaps_and_stats,)),
    "vertical-plain-psi": WireMode(
        run=lambda tmp: run_vertical(tmp, "psi"),
        to_master=_arrays({**VERTICAL_TO_MASTER, **PSI_ALIGNMENT[0]}),
        to_parties=_arrays({**VERTICAL_TO_PARTIES, **PSI_ALIGNMENT[1]}),
        label_codes_cross=True, private_thresholds=True,
        extras=(_vertical_bitmaps_and_stats, _no_keyed_hash_crosses)),
    "vertical-paillier": WireMode(  # passive: label ciphertexts only; label holder: histograms to decrypt
        run=lambda tmp: run_vertical(tmp, "hash", privacy="paillier"),
        to_master=_arrays({**VERTICAL_TO_MASTER, **HASH_ALIGNMENT[0], **ENCRYPTED_LABELS_TO_MASTER}),
        to_parties=_arrays({**VERTICAL_TO_PARTIES, **HASH_ALIGNMENT[1], **ENCRYPTED_LABELS_TO_PARTIES}),
        private_thresholds=True, extras=(_vertical_bitmaps_and_stats, _passive_parties_get_ciphertexts_only)),
    "vertical-ou": WireMode(  # the same messages under Okamoto-Uchiyama
        run=lambda tmp: run_vertical(tmp, "hash", privacy="ou"),
        to_master=_arrays({**VERTICAL_TO_MASTER, **HASH_ALIGNMENT[0], **ENCRYPTED_LABELS_TO_MASTER}),
        to_parties=_arrays({**VERTICAL_TO_PARTIES, **HASH_ALIGNMENT[1], **ENCRYPTED_LABELS_TO_PARTIES}),
        private_thresholds=True, extras=(_vertical_bitmaps_and_stats, _passive_parties_get_ciphertexts_only)),
    "horizontal-fet-none": WireMode(
        run=lambda tmp: run_horizontal(tmp, "extra-trees", "none"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "fet_ranges_reply": "min max", "fet_counts": "counts"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, **FET_TO_PARTIES}),
        schema_kinds=SCHEMA_KINDS, discloses=_min_max),
    "horizontal-fet-ldp": WireMode(
        run=lambda tmp: run_horizontal(tmp, "extra-trees", "ldp"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "fet_ranges_reply": "",
                           "fet_bit_sums": "bit_sums sizes"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, **FET_TO_PARTIES}),
        schema_kinds=SCHEMA_KINDS, extras=(_ldp_sends_bit_sums, _dp_parties_send_no_extremes)),
    "horizontal-fet-gdp": WireMode(
        run=lambda tmp: run_horizontal(tmp, "extra-trees", "gdp"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "fet_ranges_reply": "", "hello_reply": "marginals",
                           "fet_noisy_counts": "counts"}),
        # the declared (public) domains: the grid of the parties' noisy marginal histograms
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, **FET_TO_PARTIES, "hello": "low high"}),
        schema_kinds=SCHEMA_KINDS, extras=(_gdp_counts_are_noised, _dp_parties_send_no_extremes,
                                           _gdp_sends_no_exact_count)),
    "horizontal-fet-gdp-leaves": WireMode(
        run=lambda tmp: run_horizontal(tmp, "extra-trees", "gdp",
                                       gdp_plan={"plan": "leaves", "split_levels": 1}),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "fet_ranges_reply": "", "hello_reply": "marginals",
                           "fet_noisy_counts": "counts", "fet_split_reply": "", "fet_leaf_counts": "counts"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, **FET_TO_PARTIES, "hello": "low high",
                            "fet_split": "features thresholds chosen next_pos",
                            "fet_leaves": "chosen next_pos"}),
        schema_kinds=SCHEMA_KINDS, extras=(_gdp_counts_are_noised, _gdp_leaves_are_noised,
                                           _dp_parties_send_no_extremes, _gdp_sends_no_exact_count)),
    "horizontal-ppdert-secagg-domain": WireMode(
        run=lambda tmp: run_horizontal(tmp, "ppd-ert", "secagg", thresholds="domain"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "hello_reply": "public_key",
                           "ppdert_masked_counts": "masked"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, "ppdert_level": "tree chosen next_pos peer_keys"}),
        schema_kinds=SCHEMA_KINDS, secagg=True),
    "horizontal-ppdert-secagg-histogram": WireMode(
        run=lambda tmp: run_horizontal(tmp, "ppd-ert", "secagg", thresholds="histogram"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "hello_reply": "public_key",
                           "ppdert_masked_counts": "masked", "ppdert_masked_cells": "masked"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES,
                            "ppdert_cells": "tree chosen next_pos peer_keys grid_low grid_high",
                            "ppdert_counts": "first_cell last_cell"}),
        schema_kinds=SCHEMA_KINDS, secagg=True, extras=(_cells_reveal_only_the_extreme_cells,)),
    "horizontal-ppdert-secagg-dp": WireMode(
        run=lambda tmp: run_horizontal(tmp, "ppd-ert", "secagg-dp"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "hello_reply": "public_key",
                           "ppdert_masked_counts": "masked"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, "ppdert_level": "tree chosen next_pos peer_keys"}),
        schema_kinds=SCHEMA_KINDS, secagg=True, extras=(_secagg_dp_sends_no_exact_count,)),
    "horizontal-boosting-secagg": WireMode(
        run=lambda tmp: run_horizontal(tmp, "boosting", "secagg"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "hello_reply": "public_key", "boost_masked": "masked"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, **BOOSTING_TO_PARTIES, "boost_base": "peer_keys"}),
        schema_kinds=SCHEMA_KINDS, extras=(_boosting_master_reads_only_the_sums,)),
    "horizontal-boosting-none": WireMode(  # plain per-party histograms: the baseline the masks replace
        run=lambda tmp: run_horizontal(tmp, "boosting", "none"),
        to_master=_arrays({**HORIZONTAL_TO_MASTER, "boost_plain": "sums"}),
        to_parties=_arrays({**HORIZONTAL_TO_PARTIES, **BOOSTING_TO_PARTIES}),
        schema_kinds=SCHEMA_KINDS, extras=(_boosting_plain_sums_are_the_parties_own,)),
}


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_what_crosses_the_wire(mode: WireMode, tmp_path: Path) -> None:
    run = mode.run(tmp_path)
    messages = run.messages
    needles = Needles.of(run)
    _check_the_search_finds_raw_data(mode, run, needles)
    _check_kinds_and_arrays(mode, messages)
    leaks = [leak for entry, message in messages for leak in _raw_leaks(mode, run, needles, entry, message)]
    assert leaks == []
    if mode.discloses is not None:  # and the search does see raw values where DESIGN says they cross
        assert sum(len(np.intersect1d(found_bits(e.payload, m.header, run.raw_floats), mode.discloses(m)))
                   for e, m in messages) > 100
    if mode.private_thresholds:
        _check_thresholds_stay_home(run, messages)
    if mode.secagg:
        _check_master_sees_only_uniform_masked_sums(run, messages)
    for check in mode.extras:
        check(run)


# -- the invariants ------------------------------------------------------------------------------------------
def _where(entry: TranscriptEntry) -> str:
    return f"{entry.kind!r} {entry.sender}->{entry.receiver} (round {entry.round})"


def _check_kinds_and_arrays(mode: WireMode, messages) -> None:
    for direction, allowed, to_master in (("to the master", mode.to_master, True),
                                          ("to a party", mode.to_parties, False)):
        seen = {}
        for entry, message in messages:
            if (entry.receiver == MASTER) == to_master:
                seen.setdefault(entry.kind, set()).update(message.arrays)
        unexpected = {kind: sorted(arrays - allowed.get(kind, frozenset())) for kind, arrays in seen.items()
                      if kind not in allowed or not arrays <= allowed[kind]}
        assert unexpected == {}, f"{direction}: kinds or arrays the table does not allow"
        assert set(seen) == set(allowed), f"{direction}: the table lists kinds this mode never sends"


@dataclass
class Needles:
    """Byte strings that must not cross (besides raw floats and IDs, searched by value and pattern)."""

    words: list[bytes]
    label_runs: dict[str, list[bytes]]

    @classmethod
    def of(cls, run: Recorded) -> Needles:
        words = [w.encode() for w in (*CLASSES, *CATEGORIES, *run.feature_names)]
        runs = {}
        for party, codes in run.label_codes.items():
            codes = np.asarray(codes)
            starts = [s for s in (0, len(codes) // 2) if s + CODE_WINDOW <= len(codes)]
            runs[party] = [encoded for s in starts for encoded in _encodings(codes[s:s + CODE_WINDOW])]
        return cls(words, runs)


def _raw_leaks(mode: WireMode, run: Recorded, needles: Needles, entry: TranscriptEntry,
               message: Message) -> list[str]:
    """What of the raw data this message carries beyond what the mode documents."""
    payload, where, leaks = entry.payload, _where(entry), []
    floats = found_bits(payload, message.header, run.raw_floats)
    if mode.discloses is not None:
        floats = np.setdiff1d(floats, mode.discloses(message))
    if len(floats):
        leaks.append(f"{len(floats)} raw feature values in {where}")
    ids = {match.decode() for match in ID_PATTERN.findall(payload)} & run.ids
    if ids:
        leaks.append(f"{len(ids)} raw IDs, e.g. {min(ids)!r}, in {where}")
    if entry.kind not in mode.schema_kinds:
        words = [w.decode() for w in needles.words if w in payload]
        if words:
            leaks.append(f"labels or names {words[:5]} in {where}")
    if not mode.label_codes_cross:
        leaks += [f"{party}'s per-row labels in {where}" for party, runs in needles.label_runs.items()
                  if any(r in payload for r in runs)]
    return leaks


def _check_the_search_finds_raw_data(mode: WireMode, run: Recorded, needles: Needles) -> None:
    """A probe carrying one of each kind of raw data.

    Every kind must be reported, or the test proves nothing.
    """
    value = run.raw_floats[len(run.raw_floats) // 2].view(np.float64)
    some_id = min(run.ids)
    probes = [
        ("raw feature values", Message("probe", {}, {"x": np.array([1.5, value])})),
        ("raw feature values", Message("probe", {"text": f"x: {float(value)!r}"})),
        ("raw IDs", Message("probe", {}, {"ids": np.array([some_id], dtype=object)})),
        ("raw IDs", Message("probe", {"id": some_id})),
        ("labels or names", Message("probe", {"label": CLASSES[1]})),
        ("labels or names",
         Message("probe", {}, {"columns": np.array(run.feature_names[-1:], dtype=object)})),
    ]
    for party, runs in needles.label_runs.items():
        assert runs, f"{party} has too few rows to search for its label sequence"
        probes.append(("per-row labels",
                       Message("probe", {}, {"y": run.label_codes[party].astype(np.int64)})))
        probes.append(("per-row labels", Message("probe", {"y": run.label_codes[party].tolist()})))
    for expected, probe in probes:
        entry = TranscriptEntry(0, run.parties[0], MASTER, "probe", 0, "", probe.to_bytes())
        leaks = _raw_leaks(mode, run, needles, entry, probe)
        assert any(expected in leak for leak in leaks), (expected, probe)


def _check_thresholds_stay_home(run: Recorded, messages) -> None:
    """Vertical: a party's thresholds appear in no message at all (to the master or to another party)."""
    assert all(len(t) for t in run.thresholds.values()), "every party owns some numeric splits"
    leaks = [f"{len(hits)} thresholds of {owner} in {_where(entry)}"
             for entry, message in messages for owner, bits in run.thresholds.items()
             if len(hits := found_bits(entry.payload, message.header, bits))]
    assert leaks == []


def _check_master_sees_only_uniform_masked_sums(run: Recorded, messages) -> None:
    from fedcore.privacy.secagg import ring_bits_for, unmask_sum

    rounds: dict[int, dict[str, np.ndarray]] = {}
    for entry, message in messages:
        if entry.receiver == MASTER and message.kind == "ppdert_masked_counts":
            rounds.setdefault(entry.round, {})[entry.sender] = message.arrays["masked"]
    values = np.concatenate([m.reshape(-1) for r in rounds.values() for m in r.values()])
    # the session's ring: the narrowest that holds every sum (these parties' few hundred rows: 16 bits)
    bits = values.dtype.itemsize * 8
    master = run.session.master
    assert values.dtype == np.dtype(f"uint{bits}") and bits == master.mask_bits == 16
    assert bits == ring_bits_for(sum(master.party_rows.values()))
    assert len(values) >= 256 * 10  # at least 10 expected per chi-square bin
    # uniform modulo 2**bits: chi-square over the 2**8 values of the top byte and of the bottom byte (plain
    # counts would sit in the low bits, with zeros above); a p-value below 1e-6 fails
    for byte in (values >> values.dtype.type(bits - 8), values & values.dtype.type(0xFF)):
        assert stats.chisquare(np.bincount(byte.astype(np.int64), minlength=256)).pvalue > 1e-6
    # what the parties masked: exactly the total reaches the master, no single vector does (secagg-dp: each
    # party's exact counts plus the noise it recorded; neither the exact nor the noisy vector crosses)
    assert {p: len(v) for p, v in run.plain_counts.items()} == {p: len(rounds) for p in run.parties}
    released = {p: [v + run.noise[p][i] if run.noise else v for i, v in enumerate(vectors)]
                for p, vectors in run.plain_counts.items()}
    for i, r in enumerate(sorted(rounds)):
        np.testing.assert_array_equal(unmask_sum([rounds[r][p] for p in run.parties]),
                                      sum(released[p][i] for p in run.parties))
    windows = [w for vectors in (*run.plain_counts.values(), *released.values()) for v in vectors
               for w in _distinctive_windows(v)]
    assert len(windows) > 10
    leaks = [_where(entry) for entry in run.transcript for w in windows if w in entry.payload]
    assert leaks == []


def _distinctive_windows(vector: np.ndarray, width: int = 6, most: int = 3) -> list[bytes]:
    """Encodings of a few runs of `width` counts that could not appear elsewhere by chance."""
    picked = []
    for start in range(0, len(vector) - width + 1, width):
        window = vector[start:start + width]
        if window.max() >= 5 and len(set(window.tolist())) >= 4:
            picked.append(window)
            if len(picked) == most:
                break
    return [encoded for window in picked for encoded in _encodings(window)]


def _encodings(values: np.ndarray) -> list[bytes]:
    """Integers as they could cross: array bytes of several widths, or a list in a JSON header."""
    return [*(values.astype(dtype).tobytes() for dtype in ("<i8", "<i4", "i1", "<f8")),
            ", ".join(str(int(v)) for v in values).encode()]
