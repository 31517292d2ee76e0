"""The party role in vertical Federated Forest.

Holds some columns (and maybe the label) of aligned rows and answers the master's requests without letting raw
values, bin edges or thresholds out.

A party answers only `FEDERATED_FOREST`, in its order (`fedcore.protocol.dispatch`); its role is its mode
(plain or encrypted labels, or boosting, from the master's `setup`) and whether it holds the label:

    setup -> export_labels (label holder) -> configure -> per batch: begin_batch (which is also the batch's
    first level's find_splits), then per level [evaluate_encrypted (label holder, encrypted labels)]
    [-> apply_splits (owners of splits)] -> find_splits (the next level) -> ... -> finalize; prediction
    (predict_leaves, route) only outside training, with a trained or loaded model. A level where no node may
    split (the depth limit) asks the label holder alone in plain modes: the others go from apply_splits to
    the next begin_batch or finalize.

Boosting: a batch is a round; the label holder answers begin_batch with the round's (g, h)
(`fedcore.vertical.boosting`) beside its first level's best splits, and the master relays them to the passive
parties in their begin_batch, in place of the labels a forest shares at configure. With encrypted labels
(SecureBoost, roles `secure-boost-*`) they are ciphertexts: the passive parties answer begin_batch and
find_splits with encrypted histograms and the label holder scores them (evaluate_encrypted), as for an
encrypted forest.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedcore.algorithms import FOREST
from fedcore.data.binning import PartyBinner
from fedcore.data.numbers import numeric_values
from fedcore.errors import LabelError, MalformedMessage, NotFittedError, ParameterError, ProtocolError
from fedcore.privacy.gmp_workers import default_worker_count
from fedcore.privacy.homomorphic import AdditivePrivateKey
from fedcore.privacy.keyauth import PartyIdentity, SignedKey, context_digest
from fedcore.privacy.packing import SlotLayout, weight_powers_bytes
from fedcore.privacy.schemes import ENCRYPTED_MODES, Scheme, public_key_from_json, scheme, scheme_for
from fedcore.privacy.sealed import SealingKey
from fedcore.privacy.settings import EncryptedLabels, PrivacySetting, parse_privacy
from fedcore.protocol.dispatch import Protocol, Step
from fedcore.protocol.messages import Arrays, Header, Message, pack_bits
from fedcore.trees.budget import default_budget
from fedcore.trees.combination import TreeCombination
from fedcore.trees.criteria import GRADIENT, SQUARED_ERROR, STATISTICS, n_stats
from fedcore.trees.fixed_gradients import exact_sums, fixed_targets, precision_bits
from fedcore.trees.losses import loss_for
from fedcore.trees.params import MAX_TREES_PER_BATCH
from fedcore.trees.partition import node_byte_lengths, scatter_node_bytes
from fedcore.trees.predictor import encode_columns
from fedcore.trees.splitting import NodeSplits
from fedcore.trees.structure import PartialForest, PartySplits, first_trees
from fedcore.vertical.boosting import BoostingLabels
from fedcore.vertical.encrypted import LabelHolderCrypto, PassiveCrypto
from fedcore.vertical.importances import party_importances
from fedcore.vertical.prediction_rows import LocalPredictionRows
from fedcore.vertical.rows import LocalRows
from fedcore.vertical.validation import check_label

if TYPE_CHECKING:
    from fedcore.compute.dask_vertical import DaskVerticalRows
    from fedcore.compute.dask_vertical_predict import DaskPredictionRows

log = logging.getLogger(__name__)


def opaque_feature_id(key: bytes, column: str) -> str:
    """The id under which a column is known outside its party: HMAC-SHA256(key, name), 16 hex digits."""
    return hmac.new(key, column.encode(), hashlib.sha256).hexdigest()[:16]


MAX_FEATURES = 10_000_000


def _refused(party: str, what: str) -> ProtocolError:
    """The error with which a party refuses a master request."""
    return ProtocolError(f"party {party!r} refuses the request: {what}")


def _require(condition: bool, party: str, what: str) -> None:
    """Refuse a master request that would index outside this party's arrays (the kernels do not check)."""
    if not condition:
        raise _refused(party, what)


def _indices(array: np.ndarray, size: int, party: str, what: str) -> np.ndarray:
    """`array` as int64 indices, each in [0, size), or ProtocolError."""
    array = np.asarray(array)
    _require(array.ndim == 1 and (array.size == 0 or array.dtype.kind in "iu"), party,
             f"{what} must be a 1-D integer array, got {array.dtype}{list(array.shape)}")
    values = array.astype(np.int64)
    _require(values.size == 0 or (values.min() >= 0 and values.max() < size), party,
             f"{what} must lie in [0, {size})")
    return values


ROLES = ("plain-holder", "plain-passive", "encrypted-holder", "encrypted-passive", "boost-holder",
         "boost-passive", "secure-boost-holder", "secure-boost-passive")
"""A party's role: its mode (from the master's setup) and whether it holds the label."""
_HOLDER = {"plain-holder", "encrypted-holder", "boost-holder", "secure-boost-holder"}
_PASSIVE = {"plain-passive", "encrypted-passive", "boost-passive", "secure-boost-passive"}
_LOCAL_BEST = {"plain-holder", "plain-passive", "encrypted-holder", "boost-holder",
               "boost-passive", "secure-boost-holder"}  # find_splits answers plain best splits
_ENCRYPTED = {"encrypted-passive", "secure-boost-passive"}  # find_splits answers encrypted histograms
_SEARCH_ENDS_LEVEL = {"plain-holder", "plain-passive", "encrypted-passive", "boost-holder",
                      "boost-passive", "secure-boost-passive"}  # its level ends with find_splits
# scores passive parties' histograms; its level ends with evaluate_encrypted
_SCORES = {"encrypted-holder", "secure-boost-holder"}
_SKIPPED_AT_LAST_LEVEL = {"plain-passive", "boost-passive"}  # not asked at a batch's last level


def _batch_begins(state: str, roles: set[str] | None = None) -> list[Step]:
    """begin_batch, which is also the batch's first level: answered as find_splits is (see `_level_ends`)."""
    roles = set(ROLES) if roles is None else roles
    steps = [Step(state, "begin_batch", "searched", "local_best", roles & _LOCAL_BEST),
             Step(state, "begin_batch", "searched", "encrypted_histograms", roles & _ENCRYPTED)]
    return [step for step in steps if step.roles]


def _level_ends(state: str, roles: set[str]) -> list[Step]:
    """Once its level's part is done: apply its own splits, or go on with the next level, batch or the end."""
    steps = [Step(state, "apply_splits", "applied", "partition_bits", roles),
             Step(state, "find_splits", "searched", "local_best", roles & _LOCAL_BEST),
             Step(state, "find_splits", "searched", "encrypted_histograms", roles & _ENCRYPTED),
             Step(state, "finalize", "idle", "ack", roles)]
    return [step for step in steps if step.roles] + _batch_begins(state, roles)


FEDERATED_FOREST = Protocol(
    "Federated Forest", initial="idle",
    states={"idle": "no training: before setup, or after finalize (it predicts with a trained or loaded "
                    "model)",
            "set_up": "after setup",
            "labels_out": "after export_labels",
            "configured": "after configure",
            "searched": "after a level's find_splits (a batch's first level: begin_batch)",
            "scored": "after a level's evaluate_encrypted",
            "applied": "after a level's apply_splits"},
    steps=[
        Step("idle", "setup", "set_up", "setup_reply"),
        Step("idle", "predict_leaves", "idle", "split_sets"),
        Step("idle", "route", "idle", "route_bits"),
        Step("set_up", "export_labels", "labels_out", "labels", _HOLDER),
        Step("set_up", "configure", "configured", "ack", _PASSIVE),
        Step("labels_out", "configure", "configured", "ack", _HOLDER),
        *_batch_begins("configured"),
        Step("configured", "finalize", "idle", "ack"),  # every batch restored from checkpoints
        Step("applied", "find_splits", "searched", "local_best", _LOCAL_BEST),
        Step("applied", "find_splits", "searched", "encrypted_histograms", _ENCRYPTED),
        # a batch's last level (no node may split) asks the label holder alone (plain modes): only a plain
        # passive party goes from its last apply_splits to the next batch or the end
        Step("applied", "finalize", "idle", "ack", _SKIPPED_AT_LAST_LEVEL),
        *_batch_begins("applied", _SKIPPED_AT_LAST_LEVEL),
        Step("searched", "evaluate_encrypted", "scored", "encrypted_best", _SCORES),
        *_level_ends("searched", _SEARCH_ENDS_LEVEL),
        *_level_ends("scored", _SCORES),
    ])
"""What a vertical party answers, in which order, per role (see the module docstring)."""


SearchRequest = tuple[np.ndarray, np.ndarray, np.ndarray, float]
"""A level request's candidates, checked: feat_ptr, the features' local indices, ranks, least leaf weight."""

_CODE_ROWS = 1 << 16


def class_codes(labels: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(labels.to_numpy(), return_inverse=True)`, the codes as float64, 65,536 labels at a time.

    The same classes and codes, without a NumPy copy of every label (a Python string each, for Arrow-backed
    strings) nor np.unique's sorted copies of it (about 100 bytes a row of string labels: the label
    holder's agent on Dask, issue #29): the classes are the union of each chunk's, and a label's code is
    its place among them.
    """
    def chunks() -> Iterator[np.ndarray]:
        for i in range(0, len(labels), _CODE_ROWS):
            yield (labels.iloc[i:i + _CODE_ROWS].to_numpy() if isinstance(labels, pd.Series)
                   else labels[i:i + _CODE_ROWS])

    if len(labels) == 0:
        return np.unique(np.asarray(labels)), np.zeros(0, np.float64)
    classes = np.unique(np.concatenate([np.unique(c) for c in chunks()]))
    codes = np.empty(len(labels), np.float64)
    for i, chunk in zip(range(0, len(labels), _CODE_ROWS), chunks(), strict=True):
        codes[i:i + len(chunk)] = np.searchsorted(classes, chunk)
    return classes, codes


class VerticalParty:
    """One institution's agent: its columns, optionally the label, and the protocol handlers."""

    protocol = FEDERATED_FOREST

    def __init__(self, name: str, frame: pd.DataFrame, label: str | None = None, feature_key: bytes = b"",
                 label_key: AdditivePrivateKey | None = None, identity: PartyIdentity | None = None,
                 memory_budget: int | None = None, own_privacy: PrivacySetting | None = None,
                 rows: LocalRows | DaskVerticalRows | None = None) -> None:
        """One institution's columns (and the label, when `label` names it) with its privacy settings.

        `label_key`: the label holder's Paillier or Okamoto-Uchiyama key for encrypted labels (default: a
        fresh one per training). `identity` signs this party's sealing key when labels are encrypted and
        checks its peers' (an agent uses its mutual-TLS certificate); without one, relayed sealing keys are
        taken on trust. `memory_budget`: bytes this party grows tree batches in (default: a share of its
        available memory), reported to the master at setup so batches fit (`fedcore.trees.budget`).
        `own_privacy`: the institution's configured `privacy:` setting (or what
        `fedcore.privacy.settings.parse_privacy` reads); a master asking for another mode or a smaller key is
        refused. `rows`: where the row work runs (default: in this process, `LocalRows`; on a Dask cluster,
        `fedcore.compute.dask_vertical.DaskVerticalRows` of the same rows).
        """
        self.name = name
        self.own_privacy = None if own_privacy is None else parse_privacy(own_privacy, FOREST)
        self.memory_budget = memory_budget
        self.label = label
        self.is_label_holder = label is not None
        self.features = frame.drop(columns=[label]) if label is not None else frame
        self._label_values = frame[label] if label is not None else None
        self.feature_key = feature_key
        self.classes_: np.ndarray | None = None
        self._binner: PartyBinner | None = None
        self.rows = rows if rows is not None else LocalRows(self.features)
        self._y = np.zeros(0, np.float64)  # the label holder's class codes or regression targets
        self._global_to_local = np.zeros(0, np.int64)
        self._candidates: NodeSplits | None = None
        self._own_bits = np.zeros(0, np.uint8)
        self._splits: list[PartySplits] = []
        self._batch_start = 0
        self._criterion = 0
        self._n_stats = 0
        self.model: PartialForest | None = None
        self.importances: np.ndarray | None = None
        """Impurity importances of its own features (`model.column_names` order), from finalize's shares."""
        self._prediction: LocalPredictionRows | DaskPredictionRows | None = None  # the rows to predict
        self._label_key = label_key
        self.identity = identity
        self._sealing: SealingKey | None = None
        self._seal_context = b""
        self._label_crypto: LabelHolderCrypto | None = None  # encrypted labels, label holder
        self._passive_crypto: PassiveCrypto | None = None  # encrypted labels, passive party
        self._powers_budget: int | None = None  # bytes planned for its label powers (setup), passive party
        self._privacy = "none"  # the mode of the last setup
        self._level_totals = np.zeros((0, 0))
        self._reg_lambda = 0.0  # gradient statistics' L2 term (boosting)
        self._boosting = False  # the last setup's: boosting rounds
        self._boost: BoostingLabels | None = None  # the label holder's rounds (boosting)
        self.machine = FEDERATED_FOREST.start(log)

    def __getstate__(self) -> dict:
        """The party to pickle (a fitted estimator's): its model and data, without its session's secrets.

        The signing identity, the sealing key, the encrypted-label state (keys, channels, worker processes)
        serve one training and cannot, or must not, be written out. An unpickled party predicts; the
        estimators make new parties, with new identities, to fit again.
        """
        state = self.__dict__.copy()
        state.update(identity=None, _sealing=None, _label_crypto=None, _passive_crypto=None)
        return state

    # -- dispatch -------------------------------------------------------------------------------
    @property
    def protocol_role(self) -> str:
        """The role in the protocol table: plain or encrypted (as the last setup asked), holder or passive."""
        encrypted = self._sealing is not None
        mode = ("secure-boost" if encrypted else "boost") if self._boosting else (
            "encrypted" if encrypted else "plain")
        return f"{mode}-{'holder' if self.is_label_holder else 'passive'}"

    def handle(self, message: Message) -> Message:
        """Answer one protocol message.

        Refuse it (ProtocolError) when it is not the next one of `FEDERATED_FOREST` for this party's role.
        """
        return self.machine.handle(self, message)

    # -- setup ----------------------------------------------------------------------------------
    def _on_setup(self, message: Message) -> Message:
        h = message.header
        _require(h.int("criterion") in set(STATISTICS.values()), self.name,
                 f"unknown criterion {h['criterion']!r}")
        _require(2 <= h.int("max_bins") <= 255, self.name,
                 f"max_bins must be in [2, 255], got {h['max_bins']!r}")
        self._criterion = h.int("criterion")
        privacy = h.get("privacy", "none")
        # the bin edges come from all the rows, wherever they are (`PartyBinner.fit`'s edges either way)
        self._binner = self.rows.fit(h.int("max_bins"), h.int("binning_seed"))
        self.rows.bin(self._binner)
        ids = np.array([opaque_feature_id(self.feature_key, c) for c in self.rows.columns], dtype=object)
        header: dict[str, object] = {"n_rows": self.rows.n_rows, "label_holder": self.is_label_holder}
        budget = self.memory_budget or default_budget()
        self._powers_budget = None
        arrays = {"feature_ids": ids.astype(str)}
        if self._passive_crypto is not None:
            self._passive_crypto.close()  # a new training: the last one's worker processes are done
        self._label_crypto = self._passive_crypto = self._sealing = None
        _require(privacy in ("none", *ENCRYPTED_MODES), self.name, f"unknown privacy mode {privacy!r}")
        own = self.own_privacy
        if own is not None:
            _require(privacy == own.mode, self.name,
                     f"the master asks for privacy {privacy!r}; this institution's configuration says "
                     f"{own.mode!r}")
            if isinstance(own, EncryptedLabels):  # a larger key than configured is stronger: accepted
                asked = h.get("key_bits")
                _require(isinstance(asked, int) and not isinstance(asked, bool) and asked >= own.bits,
                         self.name, f"the master asks for a {asked}-bit {scheme(privacy).title} key; this "
                         f"institution's configuration says {own.bits}")
        self._privacy = privacy
        boosting = self._setup_boosting(h)
        if privacy in ENCRYPTED_MODES:
            context = str(h.get("session_context", ""))
            _require(len(context) == 32 and all(c in "0123456789abcdef" for c in context), self.name,
                     "encrypted labels need a 16-byte hex session_context")
            self._sealing = SealingKey(self.name, bytes.fromhex(context))
            arrays["seal_public"] = np.frombuffer(self._sealing.public_bytes(), np.uint8)
            self._seal_context = context_digest(b"vertical paillier sealing", bytes.fromhex(context))
            if self.identity is not None:
                header.update(self.identity.sign_key(self._seal_context, self._sealing.public_bytes(),
                                                     "sealing").to_header())
            if self.is_label_holder:
                self._label_crypto = LabelHolderCrypto(self._session_key(privacy, h.get("key_bits")))
            else:  # the label ciphertexts' powers take their share first; the rest grows tree batches
                self._powers_budget = self._label_powers_share(budget, scheme(privacy), h.get("key_bits"))
                budget = max(budget - self._powers_budget, 1)
        header["memory_budget"] = budget
        if self.is_label_holder:
            header["n_classes"] = self._read_labels(boosting, h.int("binning_seed"), arrays)
        return Message("setup_reply", header, arrays)

    def _read_labels(self, boosting: dict | None, seed: int, arrays: dict[str, np.ndarray]) -> int:
        """The label holder's labels as values or class codes; its class count (0: regression).

        Boosting: its rounds start here, and the base score joins the setup reply's `arrays`.
        """
        labels = self._label_values
        if labels is None:
            raise _refused(self.name, "it holds a loaded model's label role, not training labels")
        task = boosting["task"] if boosting is not None else (
            "regression" if self._criterion == SQUARED_ERROR else "classification")
        try:  # as the estimators check it: a missing, infinite or single-class label, named with the fix
            check_label(labels, task, holder=self.name)
        except LabelError as error:
            raise _refused(self.name, str(error)) from None
        n_classes = 0
        if task == "regression":
            self._y = numeric_values(labels, "label")
        else:
            self.classes_, self._y = class_codes(labels)
            n_classes = len(self.classes_)
        try:
            if boosting is not None:
                precision_bits(len(self._y))
            elif task == "regression":  # on their grid: every sum of them is exact, in process or on Dask
                self._y = fixed_targets(self._y)
        except ParameterError as error:
            raise _refused(self.name, str(error)) from None
        if boosting is not None:
            self._boost = BoostingLabels(self._y, loss_for(task, n_classes), n_classes,
                                         boosting["reg_lambda"], boosting["learning_rate"],
                                         boosting["subsample"], seed)
            arrays["base_score"] = self._boost.base_score
        else:
            self.rows.set_labels(self._y)
        return n_classes

    def _setup_boosting(self, h: Header) -> dict | None:
        """Boosting's setup fields (checked), or None for a forest; sets the mode and lambda."""
        self._boosting, self._boost, self._reg_lambda = False, None, 0.0
        if h.int("criterion") != GRADIENT:
            return None
        fields = h.get("boosting")
        _require(isinstance(fields, dict) and fields.get("task") in ("classification", "regression"),
                 self.name,
                 "gradient statistics need the boosting fields (task, reg_lambda, learning_rate, subsample)")
        assert isinstance(fields, dict)
        numbers = {}
        for name, low in (("reg_lambda", 0.0), ("learning_rate", 0.0), ("subsample", 0.0)):
            value = fields.get(name)
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
                     and value >= low, self.name, f"boosting's {name} must be a finite number >= {low}")
            numbers[name] = float(value)  # type: ignore[arg-type]
        self._boosting, self._reg_lambda = True, numbers["reg_lambda"]
        return {"task": fields["task"], **numbers}

    def _label_powers_share(self, budget: int, encryption: Scheme, key_bits: object) -> int:
        """The part of `budget` a passive party plans for the label ciphertexts' weight powers.

        One copy per bin-sum worker (`default_worker_count`), at most half the budget, but always one copy
        (the party needs it, in its own process if no worker fits). Sized for the key the master asks for;
        `PassiveCrypto` starts the workers the share holds once the label holder's key is known.
        """
        bits = key_bits if isinstance(key_bits, int) and key_bits in encryption.key_bits \
            else encryption.default_key_bits
        rows = self.rows.n_rows
        one_copy = weight_powers_bytes(encryption.ciphertext_bytes(bits), rows)
        wanted = one_copy * max(default_worker_count(rows), 1)
        return min(wanted, max(budget // 2, one_copy))

    def _session_key(self, mode: str, key_bits: object) -> AdditivePrivateKey:
        """The label holder's key for this training.

        The one it was given (of the mode and at least the size the master asks for), else a fresh one.
        """
        encryption = scheme(mode)
        _require(isinstance(key_bits, int) and not isinstance(key_bits, bool)
                 and key_bits in encryption.key_bits, self.name,
                 f"the master asks for a {key_bits!r}-bit {mode} key; allowed: {encryption.key_bits}")
        key = self._label_key
        if key is None:
            return encryption.generate(key_bits)
        own = scheme_for(key.public)
        _require(own is encryption, self.name,
                 f"the master asks for privacy {mode!r}; this party's label key is {own.mode!r}")
        return key

    def _on_export_labels(self, message: Message) -> Message:
        if not self.is_label_holder:
            raise ProtocolError(f"party {self.name!r} holds no label")
        if self._boosting:  # no label leaves: the rounds' gradients do, one round at a time
            if self._label_crypto is None:
                return Message("labels")
            self._label_crypto.gradient_layout(self.rows.n_rows)  # encrypted: the layout of every round's
            return Message("labels", {"encryption": self._label_crypto.announcement()})
        if self._label_crypto is not None:
            max_weight = message.header.get("max_weight")
            if not (isinstance(max_weight, int) and 0 < max_weight <= 2**40):
                raise _refused(self.name, f"max_weight must be a positive integer, got {max_weight!r}")
            n_classes = 0 if self._criterion == SQUARED_ERROR else len(self._setup_classes())
            rows = self._label_crypto.encrypt_labels(self._y, self._criterion, n_classes, max_weight)
            self._y = np.zeros(0, np.float64)  # the rows hold the labels (on Dask, the blocks): no copy here
            return Message("labels", {"encryption": self._label_crypto.announcement()}, {"enc_y": rows})
        y = self._y if self._criterion == SQUARED_ERROR else self._y.astype(np.int32)
        self._y = np.zeros(0, np.float64)  # as above: exported once per setup, then held by the rows only
        return Message("labels", {}, {"y": y})

    def _on_configure(self, message: Message) -> Message:
        n_features, n_classes = message.header.int("n_features"), message.header.int("n_classes")
        _require(0 < n_features <= MAX_FEATURES, self.name, f"n_features out of range: {n_features}")
        _require(0 <= n_classes <= 65_535, self.name, f"n_classes out of range: {n_classes}")
        global_index = _indices(message.arrays["global_index"], n_features, self.name, "global_index")
        _require(len(global_index) == len(self.rows.columns)
                 and len(np.unique(global_index)) == len(global_index),
                 self.name, "global_index must name each of this party's features once")
        self._global_to_local = np.full(n_features, -1, dtype=np.int64)
        self._global_to_local[global_index] = np.arange(len(global_index))
        self._n_stats = n_stats(self._criterion, n_classes)
        if "y" in message.arrays:
            y = message.arrays.typed("y", "iuf")
            _require(y.shape == (self.rows.n_rows,), self.name,
                     f"labels must have one value per row, got {y.shape}")
            _require(self._criterion == SQUARED_ERROR
                     or (y.size == 0 or (y.min() >= 0 and y.max() < max(n_classes, 1))),
                     self.name, "class codes must lie in [0, n_classes)")
            if self._criterion == SQUARED_ERROR:  # the holder's grid already: exact sums, whatever was sent
                y = fixed_targets(y)
            self.rows.set_labels(y)  # a passive party's: kept by its rows only (on Dask, in blocks)
        if "enc_y" in message.arrays or (self._boosting and self._sealing is not None
                                         and not self.is_label_holder):
            self._configure_passive_crypto(message)
        if self._label_crypto is not None:
            self._configure_label_holder_crypto(message)
        return Message("ack")

    def _configure_passive_crypto(self, message: Message) -> None:
        """Encrypted labels: keep the public key and label ciphertexts; the label codes stay unknown."""
        sealing = self._sealing
        if sealing is None or self.is_label_holder:
            raise _refused(self.name,
                           "encrypted labels are for passive parties in an encrypted-label session")
        h = message.header
        try:
            public = public_key_from_json(h["encryption"]["public_key"], self._privacy)
            spec = h["encryption"]["layout"]
            layout = SlotLayout(int(spec["n_slots"]), int(spec["slot_bits"]), int(spec["top_max"]),
                                public.plaintext_bits)
            holder = str(h["label_holder"])
        except (KeyError, TypeError, ValueError) as error:
            raise ProtocolError(f"party {self.name!r} refuses the request: malformed encrypted-label setup "
                                f"({error})") from error
        if self._boosting:  # the rounds' (g, h) ciphertexts come at begin_batch (`_round_gradients`)
            _require("enc_y" not in message.arrays, self.name, "boosting takes no label ciphertexts")
            ciphertexts = []
        else:
            ciphertexts = public.from_bytes(message.arrays["enc_y"], "label ciphertexts")
            _require(len(ciphertexts) == self.rows.n_rows, self.name,
                     "one label ciphertext per row is needed")
        channel = sealing.channel(holder, self._peer_sealing_key(message, holder))
        on_dask = not isinstance(self.rows, LocalRows)
        self._passive_crypto = PassiveCrypto(public, layout, ciphertexts, channel,
                                             powers_budget=self._powers_budget, local=not on_dask,
                                             rows=self.rows.n_rows)
        self.rows.load_ciphertexts(public, ciphertexts)
        if not self._boosting:  # the bootstrap needs only the row count: codes of zero stand for the labels
            self.rows.set_labels(np.zeros(self.rows.n_rows, np.uint8))

    def _configure_label_holder_crypto(self, message: Message) -> None:
        """Encrypted labels: a sealed channel to every passive party."""
        crypto, sealing = self._label_crypto, self._sealing
        assert crypto is not None and sealing is not None, "setup makes the label crypto with the sealing key"
        passive = message.header.get("passive_parties")
        if not (isinstance(passive, list)
                and all(isinstance(name, str) and f"seal_{name}" in message.arrays for name in passive)):
            raise _refused(self.name, "the label holder needs every passive party's sealing key")
        crypto.channels = {name: sealing.channel(name, self._peer_sealing_key(message, name))
                           for name in passive}
        crypto.sequence = 0

    def _peer_sealing_key(self, message: Message, peer: str) -> bytes:
        """A peer's relayed sealing key, checked against its signature when this party has an identity."""
        key = message.arrays.typed(f"seal_{peer}", "u").astype(np.uint8).tobytes()
        if self.identity is None:
            return key
        signatures = message.header.get("seal_signatures") or {}
        signature = (signatures.get(peer) if isinstance(signatures, dict) else None) or {}
        if not isinstance(signature, dict):
            raise MalformedMessage("header field 'seal_signatures' must map each party to its signature")
        signed = SignedKey.from_header(peer, key, signature.get("key_signature"),
                                       signature.get("key_credential"))
        return self.identity.verify(self._seal_context, signed, "sealing")

    # -- growth ---------------------------------------------------------------------------------
    def _on_begin_batch(self, message: Message) -> Message:
        """A batch starts (each tree's rows in its root), and its first level is searched as `find_splits`.

        The search's fields are checked before anything changes, so a refused message leaves the party as
        it was. Boosting's label holder adds the round's (g, h) (or their ciphertexts) to its answer.
        """
        h = message.header
        trees, n_draws = h["trees"], h["n_draws"]
        _require(isinstance(trees, list) and 0 < len(trees) <= MAX_TREES_PER_BATCH
                 and all(isinstance(t, int) and t >= 0 for t in trees), self.name,
                 f"a batch's trees must be 1 to {MAX_TREES_PER_BATCH} tree numbers")
        n_rows = self.rows.n_rows
        _require(n_draws is None or (isinstance(n_draws, int) and 0 < n_draws <= max(n_rows, 1)),
                 self.name, f"n_draws must be between 1 and the {n_rows} rows, got {n_draws!r}")
        _require(self._boosting or self.rows.labelled, self.name, "configure must come before begin_batch")
        _require(not self._boosting or n_draws is None, self.name, "boosting takes every row: no bootstrap")
        seed = h.int("seed")
        request = self._search_request(message, len(trees))
        if self._boosting:
            gh = self._round_gradients(message, trees)
            self.rows.begin_batch(seed, list(trees), None, targets=gh)
        else:
            self.rows.begin_batch(seed, list(trees), n_draws)
        self._batch_start = len(self._splits)
        self._candidates = None
        reply = self._search(request, None)
        if self._boost is not None:
            reply.arrays.update(self._gradients(gh))
        return reply

    def _gradients(self, gh: np.ndarray) -> dict[str, np.ndarray]:
        """The label holder's round for the others: (g, h) as they are, or their packed ciphertexts."""
        boost, crypto = self._boost, self._label_crypto
        assert boost is not None and boost.grid is not None, "begin_round made this round's grid"
        if crypto is None:
            return {"gh": gh.reshape(-1, 2)}
        return {"enc_gh": crypto.encrypt_gradients(boost.grid, boost.integers)}

    def _round_gradients(self, message: Message, trees: list[int]) -> np.ndarray:
        """Boosting: the round's (g, h) per tree, (len(trees), n_rows, 2): the holder's own, or relayed.

        Encrypted (a passive party): the ciphertexts go to its `PassiveCrypto`; its partition carries zeros.
        """
        if self._boost is not None:
            gh = self._boost.begin_round(trees, self.rows.leaf_values)
            _require(not isinstance(gh, str), self.name, str(gh))
            assert not isinstance(gh, str)
            return gh
        n_rows = self.rows.n_rows
        if self._passive_crypto is not None:
            wanted = (f"an encrypted boosting round needs one (g, h) ciphertext for each of its {len(trees)} "
                      f"trees and {n_rows} rows")
            _require("enc_gh" in message.arrays and len(message.arrays["enc_gh"]) == len(trees) * n_rows,
                     self.name, wanted)
            ciphertexts = self._passive_crypto.public.from_bytes(message.arrays["enc_gh"],
                                                                 "gradient ciphertexts")
            self._passive_crypto.load_round(ciphertexts)
            self.rows.load_ciphertexts(self._passive_crypto.public, ciphertexts, trees=len(trees))
            return np.zeros((len(trees), n_rows, 2))
        gh = np.asarray(message.arrays.get("gh", np.zeros((0, 2))))
        _require(gh.shape == (len(trees) * n_rows, 2) and gh.dtype == np.float64
                 and bool(np.all(np.isfinite(gh))), self.name,
                 f"a boosting round needs finite float64 (g, h) for each of its {len(trees)} trees and "
                 f"{n_rows} rows")
        gh = gh.reshape(len(trees), n_rows, 2)
        _require(exact_sums(gh), self.name, "a boosting round's (g, h) must lie on a power-of-two grid "
                                            "whose sums are exact, as the label holder's do")
        return gh

    def _previous_splits(self, arrays: Arrays,
                         my_index: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
        """The last level's splits from the owners' bitmaps, checked but not applied.

        Returns the rows' `split` arguments (mask, packed bits, offsets) and the positions of the split nodes.
        """
        assert self.rows.in_batch, "the protocol admits find_splits only after begin_batch (the partition)"
        sizes = self.rows.node_sizes()
        n_nodes = len(sizes)
        split_mask = arrays.typed("split_mask", "biu")
        _require(split_mask.shape == (n_nodes,), self.name,
                 f"split_mask must have one entry per node ({n_nodes})")
        split_mask = split_mask.astype(bool)
        idx = np.flatnonzero(split_mask)
        owners = arrays.typed("split_owner", "iu").astype(np.int64)
        _require(owners.shape == idx.shape, self.name, "split_owner must name one owner per split node")
        lengths = node_byte_lengths(0, sizes[idx])
        pieces = [(owners == my_index, self._own_bits)]
        for key in list(arrays):
            if key.startswith("bits_"):
                _require(key[5:].isdigit(), self.name, f"array {key!r} must name a party's index")
                pieces.append((owners == int(key[5:]), arrays.typed(key, "u")))
        packed, offsets = scatter_node_bytes(pieces, lengths)
        return (split_mask, packed, offsets), idx

    def _on_find_splits(self, message: Message) -> Message:
        """A level's search: the last level's splits applied (the owners' bitmaps), then `_search`.

        Everything is checked before the splits are applied (each split node's two children are the level's
        open nodes), so a refused message leaves the partition as it was.
        """
        a, h = message.arrays, message.header
        if not self.rows.in_batch:
            raise _refused(self.name, "find_splits before begin_batch")
        if "split_mask" not in a:
            return self._search(self._search_request(message, len(self.rows.node_sizes())), None)
        split, parents = self._previous_splits(a, h.int("party_index"))
        request = self._search_request(message, 2 * len(parents))
        self.rows.split(*split)
        assert len(self.rows.node_sizes()) == 2 * len(parents), "a split node's children are the open nodes"
        return self._search(request, parents)

    def _search_request(self, message: Message, n_open: int) -> SearchRequest:
        """A level request's candidates for `n_open` nodes, checked (`SearchRequest`)."""
        a, h = message.arrays, message.header
        feat_global = _indices(a["feat_global"], len(self._global_to_local), self.name, "feat_global")
        feat_local = self._global_to_local[feat_global].astype(np.int32)
        if np.any(feat_local < 0):
            raise ProtocolError(f"party {self.name!r} was asked about features it does not hold")
        feat_ptr = a.typed("feat_ptr", "iu").astype(np.int64)
        _require(feat_ptr.shape == (n_open + 1,) and feat_ptr[0] == 0
                 and feat_ptr[-1] == len(feat_local) and bool(np.all(np.diff(feat_ptr) >= 0)), self.name,
                 "feat_ptr must index the candidates per node")
        feat_rank = a.typed("feat_rank", "iu").astype(np.int32)
        _require(feat_rank.shape == feat_local.shape and (feat_rank.size == 0 or feat_rank.min() >= 0),
                 self.name, "feat_rank must give a non-negative rank per candidate")
        min_leaf = h.number("min_samples_leaf")
        _require(np.isfinite(min_leaf) and min_leaf >= 0, self.name, "min_samples_leaf must be a number >= 0")
        return feat_ptr, feat_local, feat_rank, min_leaf

    def _search(self, request: SearchRequest, parents: np.ndarray | None) -> Message:
        """This party's best split per open node (plain), or its encrypted histograms (encrypted labels).

        `parents`: the last level's nodes that split (None: a batch's first level).
        """
        feat_ptr, feat_local, feat_rank, min_leaf = request
        binner = self._binned()
        if self._passive_crypto is not None:
            self._candidates = None
            packed, sealed = self._passive_crypto.histograms(self.rows, feat_ptr, feat_local, feat_rank,
                                                             binner.is_categorical, parents)
            return Message("encrypted_histograms", {}, {"packed": packed, "sealed": sealed})
        self._candidates, stats = self.rows.best_splits(feat_ptr, feat_local, feat_rank,
                                                        binner.is_categorical, self._n_stats, self._criterion,
                                                        min_leaf, self._reg_lambda, parents)
        arrays = {"gain": self._candidates.gain, "rank": self._candidates.rank}
        if self.is_label_holder:
            arrays["stats"] = stats
            self._level_totals = stats
            if self._boost is not None:  # each row's leaf weight so far, recorded where the rows are
                self.rows.record_leaves(self._boost.node_weights(stats))
        return Message("local_best", {}, arrays)

    def _on_evaluate_encrypted(self, message: Message) -> Message:
        """Label holder, encrypted labels: decrypt each passive party's histograms, find its best splits."""
        crypto = self._label_crypto
        if crypto is None or not self.rows.in_batch or len(self._level_totals) != len(self.rows.node_sizes()):
            raise _refused(self.name, "evaluate_encrypted needs an encrypted-label session and this level's "
                                      "find_splits first")
        parties = message.header.get("parties")
        if not (isinstance(parties, list) and all(isinstance(p, str) for p in parties)
                and set(parties) <= set(crypto.channels)):
            raise _refused(self.name, "evaluate_encrypted must name passive parties of this session")
        min_leaf = message.header.number("min_samples_leaf")
        node_rows = self.rows.node_sizes().astype(np.int64)
        arrays = {}
        for name in parties:
            splits, choices = crypto.evaluate(name, message.arrays.typed(f"packed_{name}", "u", 2),
                                              message.arrays.typed(f"sealed_{name}", "u"),
                                              self._level_totals, node_rows,
                                              min_leaf, self._n_stats, self._reg_lambda)
            arrays.update({f"gain_{name}": splits.gain, f"rank_{name}": splits.rank,
                           f"choice_{name}": choices})
        crypto.sequence += 1
        return Message("encrypted_best", {}, arrays)

    def _on_apply_splits(self, message: Message) -> Message:
        a = message.arrays
        if self._passive_crypto is not None and self.rows.in_batch:
            _require("choice" in a, self.name,
                     "encrypted labels: apply_splits needs the label holder's sealed choices")
            n_open = len(self.rows.node_sizes())
            pos = _indices(a["positions"], n_open, self.name, "positions")
            self._candidates = self._passive_crypto.open_choices(a.typed("choice", "u", 2), pos, n_open)
            chosen = self._candidates.feature[pos]
            _require(bool(np.all((chosen >= 0) & (chosen < len(self.rows.columns))))
                     and bool(np.all(self._candidates.bin[pos] < 255)), self.name,
                     "a split choice names a feature or bin this party does not have")
        c = self._candidates
        if c is None or not self.rows.in_batch:
            raise _refused(self.name, "apply_splits before find_splits")
        pos = _indices(a["positions"], len(c.gain), self.name, "positions")
        tree, node = a.typed("tree", "iu", size=len(pos)), a.typed("node", "iu", size=len(pos))
        _require(len(np.unique(pos)) == len(pos), self.name,
                 "positions must be distinct, with one tree and node id each")
        self._own_bits = self.rows.split_bits(pos, c)
        self._splits.append(PartySplits(
            tree=tree.astype(np.int32), node=node.astype(np.int32), feature=c.feature[pos],
            bin=c.bin[pos], missing_left=c.missing_left[pos], is_categorical=c.is_categorical[pos],
            cat_bits=c.cat_bits[pos],
        ))
        return Message("partition_bits", {}, {"bits": self._own_bits})

    def batch_splits(self) -> PartySplits:
        """The splits this party owns in the tree batch grown last (what it checkpoints)."""
        return PartySplits.concatenate(self._splits[self._batch_start:])

    def restore_splits(self, batches: list[PartySplits]) -> None:
        """Resume: the splits of the batches completed before a crash, as checkpointed."""
        self._splits = list(batches)
        self._batch_start = len(self._splits)

    def _on_finalize(self, message: Message) -> Message:
        a = message.arrays
        # the model first: a malformed finalize is refused and must leave the batch in progress untouched
        tree = a.typed("tree", "iu")
        left, right = (a.typed(name, "i", size=len(tree)) for name in ("left", "right"))
        model = build_partial_forest(
            tree, a.typed("node", "iu", size=len(tree)), left, right, message.header.int("n_trees", 0),
            PartySplits.concatenate(self._splits), self._binned(),
        )
        # the importances of its own features, from the shares of its own splits (none for boosting)
        self.importances = (party_importances(self.name, model, a.typed("importance", "f"),
                                              message.header.int("splitting_trees", 0))
                            if "importance" in a else None)
        self.model = model
        self.rows.clear()
        self._candidates = None
        self._splits = []
        return Message("ack", {"owned_nodes": int(np.sum(self.model.feature >= 0))})

    @property
    def boosting_combination(self) -> TreeCombination | None:
        """The label holder's rule for its last boosting training (base score, link); None otherwise."""
        if self._boost is None:
            return None
        return TreeCombination("sum", tuple(self._boost.base_score.tolist()), self._boost.loss.link)

    # -- prediction -----------------------------------------------------------------------------
    def keep_first_trees(self, n_trees: int, shares: tuple[np.ndarray, int] | None) -> None:
        """Boosting's early stopping: keep the first `n_trees` trees of the trained model.

        Its importances come anew from `shares` (the master's for its own splits over the kept trees, and
        the splitting trees' count); without them it has none, rather than those of trees cut.
        """
        self.model = first_trees(self.trained_model, n_trees)
        self.importances = None if shares is None else party_importances(self.name, self.model, *shares)

    @property
    def trained_model(self) -> PartialForest:
        """This party's partial forest; NotFittedError before training finalizes it or a load sets it."""
        if self.model is None:
            raise NotFittedError(f"party {self.name!r} has no trained or loaded model")
        return self.model

    def set_prediction_data(self, frame: pd.DataFrame) -> None:
        """Load the rows to predict (aligned with the other parties'); they never leave this party."""
        m = self.trained_model
        self.set_prediction_rows(LocalPredictionRows(encode_columns(frame, m.column_names,
                                                                    m.column_categories), m))

    def set_prediction_rows(self, rows: LocalPredictionRows | DaskPredictionRows) -> None:
        """The rows to predict, in this process or in blocks on the institution's workers."""
        if self._prediction is not None:
            self._prediction.close()
        self._prediction = rows

    def _on_predict_leaves(self, message: Message) -> Message:
        rows = self._prediction_rows()
        start, stop = message.header.int("start"), message.header.int("stop")
        _require(0 <= start <= stop <= rows.n_rows, self.name,
                 f"rows [{start}, {stop}) outside the {rows.n_rows} rows to predict")
        return Message("split_sets", {}, {"left": rows.split_sets(start, stop)})

    def _on_route(self, message: Message) -> Message:
        predict = self._prediction_rows()
        m = predict.model
        rows = _indices(message.arrays["rows"], predict.n_rows, self.name, "rows")
        nodes = _indices(message.arrays["nodes"], len(m.feature), self.name, "nodes")
        _require(rows.shape == nodes.shape and bool(np.all(m.feature[nodes] >= 0)), self.name,
                 "route asks about nodes this party does not own")
        return Message("route_bits", {}, {"bits": pack_bits(predict.route(rows, nodes))})

    def _prediction_rows(self) -> LocalPredictionRows | DaskPredictionRows:
        """The rows to predict (with the model they were loaded for), or ProtocolError."""
        if self.model is None or self._prediction is None or self._prediction.model is not self.model:
            raise ProtocolError(f"party {self.name!r} has no model or no prediction data loaded")
        return self._prediction

    def _binned(self) -> PartyBinner:
        """The binner of this party's features; the protocol has no growth step before setup."""
        assert self._binner is not None, "setup bins the features before growth"
        return self._binner

    def _setup_classes(self) -> np.ndarray:
        """The label holder's classes (classification); setup finds them before export_labels."""
        assert self.classes_ is not None, "setup finds the classes before export_labels (classification)"
        return self.classes_


def build_partial_forest(tree, node, left, right, n_trees: int, splits: PartySplits,
                         binner: PartyBinner) -> PartialForest:
    """Combine the master's structure with this party's own splits into its partial model."""
    n = len(tree)
    key = tree.astype(np.int64) * (1 << 32) + node.astype(np.int64)
    own_key = splits.tree.astype(np.int64) * (1 << 32) + splits.node.astype(np.int64)
    where = np.searchsorted(key, own_key)
    if len(own_key) and (np.any(where >= n) or np.any(key[np.minimum(where, n - 1)] != own_key)):
        raise ProtocolError("the forest structure does not contain every node this party split")
    feature = np.full(n, -1, np.int32)
    threshold = np.full(n, np.nan)
    missing_left = np.zeros(n, np.bool_)
    is_cat = np.zeros(n, np.bool_)
    cat_bits = np.zeros((n, 4), np.uint64)
    feature[where] = splits.feature
    missing_left[where] = splits.missing_left
    is_cat[where] = splits.is_categorical
    cat_bits[where] = splits.cat_bits
    for i, w in enumerate(where):
        if not splits.is_categorical[i]:
            threshold[w] = binner.columns[splits.feature[i]].threshold_value(int(splits.bin[i]))
    return PartialForest(
        tree=tree.astype(np.int32), node=node.astype(np.int32), left=left.astype(np.int32),
        right=right.astype(np.int32), feature=feature, threshold=threshold, missing_left=missing_left,
        is_categorical=is_cat, cat_bits=cat_bits, n_trees=n_trees,
        column_names=[c.name for c in binner.columns],
        column_categories=[c.categories if c.is_categorical else None for c in binner.columns],
    )
