"""The federation config: one YAML file that describes a federation for flows, agents and the CLI.

    federation: retail-consortium
    setting: vertical            # vertical | horizontal
    algorithm: forest            # vertical: forest | boosting; horizontal: extra-trees | ppd-ert | boosting
    privacy: none                # forest: none | paillier | ou ({mode: paillier, key_bits: 3072});
                                 # extra-trees: none | ldp | gdp ({mode: gdp, epsilon: 1, delta: 1e-6}:
                                 #   the whole model's budget per row, a tenth of it for DP marginal
                                 #   histograms that place thresholds; plan: auto | splits | leaves,
                                 #   split_levels: N (leaves); auto without params.max_depth: 100 trees,
                                 #   leaves released once per tree, depth from the noisy rows; splits
                                 #   needs params.max_depth),
                                 #   {mode: ldp, epsilon: 2, mechanism: auto | krr | oue | bloom}: each
                                 #   row's label epsilon, default 2; auto: k-RR or OUE by the classes);
                                 # ppd-ert: secagg ({mode: secagg, thresholds: histogram | domain, cells: 16})
                                 #   | secagg-dp ({mode: secagg-dp, epsilon: 1, delta: 1e-6}: distributed DP
                                 #   on the masked sums, the model's budget against the master; needs
                                 #   params.max_depth; domain thresholds; no exact row count is sent)
                                 # horizontal boosting: secagg (masked histograms) | none (plain ones)
                                 # (fedcore/privacy/settings.py: every mode's fields; others are refused)
    consortium_key: {env: FEDFOREST_CONSORTIUM_KEY}   # or {file: path}; never the key itself
    alignment: hash              # vertical ID alignment: hash (keyed HMAC-SHA256) | psi (ECDH PSI)
    tls: {ca: certs/ca.pem, master_ca: certs/master-ca.pem,  # agents accept only masters it signed
          master_cert: certs/master.pem, master_key: certs/master.key}
    master: {registry: registry/master, work_pool: master, signing_key: keys/master.key,
             public_key: keys/master.key.pub}   # the key every registry trusts (default: beside signing_key)
    institutions:
      - name: bank
        data: data/bank/*.parquet          # a path or glob of .parquet/.csv, a Parquet dataset folder or
                                           # URL (s3://...; Hive partitions become columns), or a
                                           # PostgreSQL table or query:
                                           # {sql: {url: {env: BANK_DB_URL}, table: customers}},
                                           # {sql: {url: {file: secrets/bank-db}, query: "SELECT ..."}}
                                           # (the connection string never in this file; fedcore/data/sql.py),
                                           # or CSV exports with their dialect: {csv: {path: data/bank/*.csv,
                                           # sep: ";", decimal: ",", encoding: latin-1, quotechar: "'",
                                           # na_values: ["n/a"]}} (fedcore/data/dialect.py)
        predict_data: data/bank/new/*.parquet   # the same forms as data; a query may select one scheduled
                                           # batch: "... WHERE t > :since AND t <= :until" with since:
                                           # '2026-01-01T00:00:00Z' (the first batch's start; :until is the
                                           # flow run's scheduled time: fedcore/agents/batches.py)
        contract: data_contracts/bank.yaml
        id_column: customer_id
        label: responded                   # only at the label holder
        endpoint: grpc+tls://127.0.0.1:8815
        work_pool: bank
        registry: registry/bank
        cert: certs/bank.pem
        key: certs/bank.key
        predictions: predictions/bank      # where batch predictions land (default: predictions/<name>),
                                           # or a PostgreSQL table {sql: {url: {env: BANK_DB_URL},
                                           # table: predictions}} (created if absent; a retried run
                                           # replaces its own rows: fedcore/data/sql_sink.py), or a
                                           # Parquet dataset {parquet: {path: scores}} partitioned by
                                           # model and version (fedcore/data/parquet_sink.py)
        memory_budget_mb: 8192             # memory its agent grows tree batches in
                                           # (default: half its free memory)
        compute: {dask: {address: tcp://dask:8786}}  # its party's rows on its own Dask
                                           # cluster, or {dask: {local: {workers: 2, memory_limit: 4GiB}}}
                                           # (memory_limit per worker, at least 640MiB)
                                           # (default: in the agent's process; fedcore/compute/cluster.py;
                                           # vertical: forests, not boosting, issue #29); Parquet data and
                                           # predict_data (files, dataset folder or URL) are then read by
                                           # the workers at the same path, a database table or query (a
                                           # batch query: each run's window) in blocks of IDs, and
                                           # horizontal predictions written by them into the
                                           # predictions folder (with a sink: a hidden temporary folder
                                           # there, which the agent delivers from and removes)
    params: {n_estimators: 50, max_depth: 8}   # ForestParams (vertical) or ExtraTreesParams (horizontal)
                                               # fields; boosting: XGBoost's names (n_estimators rounds,
                                               # max_depth, learning_rate, reg_lambda, gamma,
                                               # min_child_weight, subsample, colsample_bytree,
                                               # early_stopping_rounds: on the label holder's held-out
                                               # rows, log-loss or RMSE; fedcore/trees/boosting.py);
                                               # horizontal boosting: max_bins (64), no subsample or
                                               # early stopping (fedcore/horizontal/boosting/params.py)
    training: {model_name: retail-response, holdout: 0.2, min_overlap: 50, promote_margin: 0.0,
               metric: log_loss, predict_for: bank, connect_timeout_s: 60, agent_late_timeout_s: 30,
               agent_idle_timeout_s: 900, agent_session_timeout_s: 30,
               decision_threshold: 0.5}  # optional, binary labels: the positive class at probability >=
                                         # it, in held-out metrics and batch predictions (unset: argmax;
                                         # auto: chosen on the held-out curve)
    drift: {psi_threshold: 0.2, on_drift: warn}  # at batch prediction each institution scores its own
                                 # features' population stability index against its training rows (bins
                                 # kept in its registry copy); features at or above the threshold are named
                                 # to the master and in the run's final message (warn), or the institution
                                 # refuses to predict the batch and the run fails, naming them (fail)

Relative paths are resolved against the config file's folder. The master signs every model version and
alias move with `master.signing_key` (needed where the master runs); every registry, the institutions'
included, trusts only `master.public_key` (needed where agents run; default `<signing_key>.pub`, which
`fedforest models keygen` and `fedforest demo` write).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedcore.algorithms import SETTINGS, Algorithm, in_setting
from fedcore.algorithms import algorithm as find_algorithm
from fedcore.compute.cluster import DaskCompute, parse_compute
from fedcore.data.dialect import CsvSource, parse_csv
from fedcore.data.sql import BATCH_PARAMETERS, SqlSource, parse_sql
from fedcore.drift import DriftSettings
from fedcore.errors import ConfigError, InputError, ParameterError
from fedcore.metrics import default_metric
from fedcore.models.signing import public_key_path
from fedcore.names import check_name
from fedcore.privacy.settings import NoPrivacy, PrivacySetting, parse_privacy

if TYPE_CHECKING:
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.trees.params import ForestParams


@dataclass(frozen=True)
class Institution:
    """One institution: where its data, contract, agent and registry are."""

    name: str
    data: str | CsvSource | SqlSource
    """A path or glob of files, CSV files with their dialect (`fedcore.data.dialect`), or a table or query
    in a database (`fedcore.data.sql`)."""
    contract: Path | None
    id_column: str
    endpoint: str
    work_pool: str
    registry: Path
    label: str | None = None
    predict_data: str | CsvSource | SqlSource | None = None
    cert: Path | None = None
    key: Path | None = None
    predictions: Path | None = None
    """Where its batch predictions land; a parsed config always names one (`default_predictions`)."""
    predictions_sql: SqlSource | None = None
    """A database table its batch predictions are written to instead (`predictions: {sql: ...}`)."""
    predictions_dataset: Path | None = None
    """A Parquet dataset its batch predictions are delivered to instead (`predictions: {parquet: {path:
    ...}}`), partitioned by model and version."""
    memory_budget_mb: int | None = None
    compute: DaskCompute | None = None
    """Where its agent's party does the row work (`compute: {dask: ...}`, `fedcore.compute.cluster`); None:
    in the agent's own process."""

    @property
    def is_label_holder(self) -> bool:
        """Whether this institution holds the label column."""
        return self.label is not None


@dataclass(frozen=True)
class TrainingSettings:
    """The `training:` section: how the master runs a retrain. None means "derive it" (see the fields)."""

    model_name: str | None = None
    """Registry name of the model; default: the federation's name."""
    holdout: float = 0.2
    """Fraction of aligned rows the label holder keeps back to evaluate each new version."""
    min_overlap: int = 50
    """Fewer aligned rows than this stops the run before training."""
    promote_margin: float = 0.0
    """A new version becomes production unless it is worse than production by more than this."""
    metric: str | None = None
    """Metric compared for promotion (`fedcore.metrics.LOWER_IS_BETTER` says its direction); default: log_loss
    for a classifier (the vertical label holder scores probabilities; horizontal institutions sum their rows'
    log-losses), r2 for regression (`FederationConfig.promotion_metric`).
    """
    decision_threshold: float | str | None = None
    """Binary labels: predict the positive (second) class where its probability is at least this, in held-out
    metrics and batch predictions; stored with the version. Default: the most probable class (0.5). "auto"
    (either setting): the held-out curve's threshold of the largest TPR - FPR (`fedcore.session`,
    `held_out_evaluation`)."""
    predict_for: str | None = None
    """Institution that receives batch predictions; default: the label holder."""
    connect_timeout_s: float = 60.0
    """How long the master waits for every agent to answer before failing, naming those that do not."""
    agent_late_timeout_s: float = 30.0
    """Agents started as deployments: an agent flow run that no worker of its institution's pool picked up
    this long after the master started it (still Scheduled, or Late) fails the master's run, naming the
    institution and its work pool, instead of waiting out connect_timeout_s and its retries."""
    agent_idle_timeout_s: float = 900.0
    """An agent started for one session stops (and fails) after this long without a call from the master
    (it never came)."""
    agent_session_timeout_s: float = 30.0
    """A session whose master has sent no message and no keep-alive for this long (while its agents were
    not answering) is presumed abandoned: another master may start one, and an agent started for one
    session stops, freeing its port. The master sends keep-alives every min(5, this / 4) seconds."""
    call_timeout_s: float = 600.0
    """A party that does not answer one protocol message within this long is reported by name (and the
    session resumes from its checkpoints, see resume_attempts) instead of being waited for forever."""
    resume_attempts: int = 2
    """After an institution is lost mid-training, restart the session this many times, resuming from the
    last tree batch everyone checkpointed."""

    @classmethod
    def from_mapping(cls, raw: dict, where: str) -> TrainingSettings:
        """Checked settings: unknown keys (typos) and wrongly typed values are refused, naming the key."""
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in raw.items():
            refuse_unknown_keys([key], sorted(known), f"{where}: unknown training setting")
            numeric = known[key].type in ("float", "int")
            if numeric and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ConfigError(f"{where}: training.{key} must be a non-negative number, got {value!r}")
            values[key] = value
        if values.get("agent_session_timeout_s", 30.0) <= 0:
            raise ConfigError(f"{where}: training.agent_session_timeout_s must be positive, got "
                              f"{values['agent_session_timeout_s']!r}")
        threshold = values.get("decision_threshold", "auto")
        if threshold != "auto" and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                    or not 0 <= threshold <= 1):
            raise ConfigError(f"{where}: training.decision_threshold must be a number between 0 and 1 or "
                              f"'auto', got {threshold!r}")
        if not 0 < values.get("holdout", 0.2) < 1:
            raise ConfigError(f"{where}: training.holdout must be between 0 and 1 (exclusive), "
                              f"got {values['holdout']!r}")
        return cls(**values)


@dataclass(frozen=True)
class FederationConfig:
    """A parsed, validated federation config."""

    path: Path
    federation: str
    setting: str
    algorithm: str
    institutions: list[Institution]
    master_registry: Path
    master_work_pool: str
    master_signing_key: Path | None
    params: ForestParams | ExtraTreesParams
    consortium_key: dict[str, str]
    tls: dict[str, Path] = field(default_factory=dict)
    privacy: PrivacySetting = field(default_factory=NoPrivacy)
    """The `privacy:` section, parsed once (`fedcore.privacy.settings`): the master trains with it, and every
    institution's agent refuses a master asking for another."""
    alignment: str = "hash"
    """How vertical institutions align IDs: "hash" (keyed HMAC-SHA256) or "psi" (ECDH private set
    intersection)."""
    training: TrainingSettings = field(default_factory=TrainingSettings)
    master_public_key: Path | None = None
    """The master's public key every registry trusts: `master.public_key`, else `<signing_key>.pub`."""
    drift: DriftSettings = field(default_factory=DriftSettings)
    """The `drift:` section: each institution's batch drift check at prediction (`fedcore.drift`)."""

    @property
    def implementation(self) -> Algorithm:
        """The registry's entry for the config's algorithm in its setting: its session, agent and params."""
        return find_algorithm(self.algorithm, self.setting)

    @property
    def model_name(self) -> str:
        """The registry name of the federation's model."""
        return self.training.model_name or self.federation

    @property
    def prediction_requester(self) -> str:
        """The institution batch predictions are delivered to."""
        return self.training.predict_for or self.label_holder.name

    @property
    def promotion_metric(self) -> str:
        """The metric a new version must not be worse on to be promoted.

        Default `fedcore.metrics.default_metric`: log-loss for a classifier (both settings score
        probabilities), R^2 for regression.
        """
        return self.training.metric or default_metric(self.params.task)

    def institution(self, name: str) -> Institution:
        """The institution called `name`."""
        for inst in self.institutions:
            if inst.name == name:
                return inst
        raise ConfigError(f"{self.path}: no institution named {name!r}; "
                          f"known: {[i.name for i in self.institutions]}")

    @property
    def label_holder(self) -> Institution:
        """The institution that holds the label (vertical setting)."""
        return next(i for i in self.institutions if i.is_label_holder)

    def read_consortium_key(self) -> bytes:
        """The consortium key from the environment variable or file the config names."""
        if "env" in self.consortium_key:
            value = os.environ.get(self.consortium_key["env"])
            if not value:
                raise ConfigError(f"consortium key: environment variable {self.consortium_key['env']} "
                                  "is not set")
            return value.encode()
        path = self._resolve(self.consortium_key["file"])
        try:
            return path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"consortium key: cannot read {path}: {exc.strerror}") from exc

    def _resolve(self, value: str | os.PathLike) -> Path:
        return resolve(self.path, value)


def resolve(config_path: Path, value: str | os.PathLike) -> Path:
    """A config path made absolute against the config file's folder."""
    p = Path(os.path.expanduser(str(value)))
    return p if p.is_absolute() else (config_path.parent / p)


def default_predictions(config_path: Path, name: str) -> Path:
    """Where institution `name` writes batch predictions unless its `predictions:` says otherwise.

    `predictions/<name>` in the config file's folder: beside the default `registry/` folder, never inside it.
    """
    return resolve(config_path, Path("predictions") / name)


def read_yaml(path: Path, what: str) -> Any:
    """The parsed YAML file at `path`; unreadable or malformed files become one-line ConfigErrors."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc


def load_config(path: str | os.PathLike) -> FederationConfig:
    """Read and validate a federation config; every problem is a ConfigError naming the file and field."""
    path = Path(path).resolve()
    raw = read_yaml(path, "federation config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return parse_config(raw, path)


def _memory_budget(value: Any, path: Path, where: str) -> int | None:
    """An institution's memory_budget_mb: a positive integer (MiB), or None for the default share."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{path}: {where}: memory_budget_mb must be a positive integer (MiB), "
                          f"got {value!r}")
    return value


def parse_config(raw: dict, path: Path) -> FederationConfig:
    """Validate an already-parsed config mapping (see module docstring for the fields)."""
    setting = raw.get("setting", "vertical")
    if setting not in SETTINGS:
        raise ConfigError(f"{path}: setting must be one of {SETTINGS}, got {setting!r}")
    key = _consortium_key(raw, path)
    institutions = _parse_institutions(raw, setting, path)
    names = [i.name for i in institutions]
    try:
        algorithm = find_algorithm(str(raw.get("algorithm", in_setting(setting)[0].id)), setting)
    except ParameterError as error:
        raise ConfigError(f"{path}: {error}") from error
    if not algorithm.deployable:
        raise ConfigError(f"{path}: algorithm {algorithm.id!r} runs in simulation and the estimators only so "
                          "far (issue #32); choose another algorithm for a federation config")
    try:
        privacy = parse_privacy(raw.get("privacy"), algorithm)
    except ParameterError as error:
        raise ConfigError(f"{path}: {error}") from error
    _check_fieldless(raw.get("privacy"), privacy, algorithm, path)
    alignment = raw.get("alignment", "hash")
    if alignment not in ("hash", "psi"):
        raise ConfigError(f"{path}: alignment must be 'hash' (keyed hashes) or 'psi' (ECDH private set "
                          f"intersection), got {alignment!r}")
    training = TrainingSettings.from_mapping(raw.get("training") or {}, str(path))
    if training.predict_for is not None and training.predict_for not in names:
        raise ConfigError(f"{path}: training.predict_for names no institution: {training.predict_for!r}; "
                          f"known: {names}")
    master = raw.get("master") or {}
    forest = _parse_params(raw.get("params") or {}, algorithm, privacy, path)
    try:
        parse_privacy(privacy, algorithm, forest.task)
        algorithm.check_privacy_params(privacy, forest)
    except ParameterError as error:
        raise ConfigError(f"{path}: {error}") from error
    federation = str(raw.get("federation", path.stem))
    # names that become folders and files are checked now, not after a whole training run
    _safe_name(training.model_name or federation,
               "training.model_name" if training.model_name else "federation (the default model name)", path)
    return FederationConfig(
        path=path, federation=federation, setting=setting,
        algorithm=algorithm.id, privacy=privacy, alignment=alignment, institutions=institutions,
        master_registry=resolve(path, master.get("registry", "registry/master")),
        master_work_pool=str(master.get("work_pool", "master")),
        master_signing_key=resolve(path, master["signing_key"]) if master.get("signing_key") else None,
        master_public_key=_master_public_key(master, path),
        params=forest, consortium_key=dict(key),
        tls=_parse_tls(raw.get("tls") or {}, path),
        training=training, drift=DriftSettings.from_mapping(raw.get("drift"), str(path)),
    )


TLS_KEYS = ("ca", "master_ca", "master_cert", "master_key")
"""The `tls:` section's files: the consortium CA, the master CA (agents accept only master certificates it
signed), and the master's certificate and key."""


def refuse_unknown_keys(keys: Iterable[Any], known: Sequence[str], refusal: str) -> None:
    """Refuse the first of `keys` not in `known`: ConfigError `<refusal> 'key'` with a did-you-mean hint.

    The hint is the closest known key (a typo), else the list of known ones.
    """
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {list(known)}"
            raise ConfigError(f"{refusal} {key!r}{hint}")


def _parse_tls(tls: dict, path: Path) -> dict[str, Path]:
    """The `tls:` section's paths, resolved; an unknown key (a misspelt `master_ca`) is refused by name."""
    if not isinstance(tls, dict):
        raise ConfigError(f"{path}: tls must be a mapping of {', '.join(TLS_KEYS)} to files")
    refuse_unknown_keys(tls, TLS_KEYS, f"{path}: unknown tls setting")
    return {k: resolve(path, v) for k, v in tls.items()}


def _safe_name(value: Any, where: str, path: Path) -> str:
    """`value` as a name that may become a file or folder name (`fedcore.names`), else a ConfigError."""
    try:
        return check_name(str(value), where)
    except InputError as error:
        raise ConfigError(f"{path}: {error}") from None


def _need(mapping: dict, key: str, where: str, path: Path) -> Any:
    """`mapping[key]`, which must be present and not empty; otherwise a ConfigError naming `where`."""
    if key not in mapping or mapping[key] in (None, ""):
        raise ConfigError(f"{path}: {where} needs '{key}'")
    return mapping[key]


def _consortium_key(raw: dict, path: Path) -> dict:
    """The `consortium_key:` reference ({env: VARIABLE} or {file: path}); the key itself is refused."""
    key = _need(raw, "consortium_key", "the federation", path)
    if not isinstance(key, dict) or len(key) != 1 or not ({"env", "file"} & set(key)):
        raise ConfigError(f"{path}: consortium_key must be {{env: VARIABLE}} or {{file: path}}, "
                          "never the key itself")
    return key


def _parse_institutions(raw: dict, setting: str, path: Path) -> list[Institution]:
    """The `institutions:` list, with unique names and the label columns the setting needs."""
    institutions = [_parse_institution(item, index, path)
                    for index, item in enumerate(_need(raw, "institutions", "the federation", path))]
    names = [i.name for i in institutions]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: institution names must be unique, got {names}")
    _check_labels(institutions, setting, path)
    return institutions


def _parse_institution(item: dict, index: int, path: Path) -> Institution:
    """One entry of `institutions:`, its paths resolved against the config file's folder."""
    name = _safe_name(_need(item, "name", f"institutions[{index}]", path), f"institutions[{index}].name",
                      path)
    where = f"institution {name!r}"
    sink = item.get("predictions")
    sink_sql = isinstance(sink, dict) and "parquet" not in sink
    dataset = _dataset_sink(sink, f"{where}: predictions", path) if isinstance(sink, dict) and not sink_sql \
        else None
    return Institution(
        name=name, data=_source(_need(item, "data", where, path), f"{where}: data", path),
        contract=resolve(path, item["contract"]) if item.get("contract") else None,
        id_column=str(_need(item, "id_column", where, path)), endpoint=str(item.get("endpoint", "")),
        work_pool=str(item.get("work_pool", name)),
        registry=resolve(path, item.get("registry", f"registry/{name}")), label=item.get("label"),
        predict_data=(_source(item["predict_data"], f"{where}: predict_data", path, BATCH_PARAMETERS)
                      if item.get("predict_data") else None),
        cert=resolve(path, item["cert"]) if item.get("cert") else None,
        key=resolve(path, item["key"]) if item.get("key") else None,
        predictions=(resolve(path, sink) if sink and not isinstance(sink, dict)
                     else default_predictions(path, name)),
        predictions_dataset=dataset,
        predictions_sql=(parse_sql(sink, f"{path}: {where}: predictions", lambda f: resolve(path, f),
                                   sink=True) if sink_sql else None),
        memory_budget_mb=_memory_budget(item.get("memory_budget_mb"), path, where),
        compute=parse_compute(item.get("compute"), f"{path}: {where}"),
    )


def _dataset_sink(value: dict, where: str, path: Path) -> Path:
    """`predictions: {parquet: {path: folder}}`: the Parquet dataset's root, resolved against the config."""
    body = value.get("parquet") if set(value) == {"parquet"} else None
    if not isinstance(body, dict) or set(body) != {"path"}:
        raise ConfigError(f"{path}: {where}: expected {{parquet: {{path: folder}}}} (a dataset partitioned "
                          "by model and version)")
    return resolve(path, body["path"])


def _source(value: Any, where: str, path: Path,
            parameters: tuple[str, ...] = ()) -> str | CsvSource | SqlSource:
    """A `data:`/`predict_data:` value: a path or glob resolved against the config, a URL, `{csv:}`, `{sql:}`.

    `parameters`: the placeholders its query may use (a prediction batch's `:since`, `:until`).
    """
    if isinstance(value, dict) and set(value) == {"csv"}:
        return parse_csv(value, f"{path}: {where}", lambda f: resolve(path, f))
    if isinstance(value, dict):
        return parse_sql(value, f"{path}: {where}", lambda f: resolve(path, f), parameters=parameters)
    if "://" in str(value):  # a dataset URL (s3://, file://, ...): pyarrow's file systems open it as given
        return str(value)
    return str(resolve(path, value))


def _check_fieldless(raw: object, privacy: PrivacySetting, algorithm: Algorithm, path: Path) -> None:
    """Refuse fields written under a mode the algorithm runs without any (`Algorithm.fieldless_modes`).

    Checked on the config as written: the parsed setting fills in defaults, so `cells: 16` would pass
    unnoticed there though it configures nothing.
    """
    if privacy.mode in algorithm.fieldless_modes and isinstance(raw, Mapping):
        given = sorted(str(name) for name in raw if name != "mode")
        if given:
            raise ConfigError(f"{path}: privacy: {algorithm.title} ({algorithm.setting}) runs mode "
                              f"{privacy.mode!r} without fields, got {given}: they configure another "
                              "algorithm's engine")


def _check_labels(institutions: list[Institution], setting: str, path: Path) -> None:
    """Vertical: exactly one institution holds the label; horizontal: all hold the same label column."""
    holders = [i.name for i in institutions if i.is_label_holder]
    if setting == "vertical" and len(holders) != 1:
        raise ConfigError(f"{path}: a vertical federation needs exactly one institution with 'label', "
                          f"found {holders}")
    if setting == "horizontal":
        without = [i.name for i in institutions if not i.is_label_holder]
        if without or len({i.label for i in institutions}) != 1:
            raise ConfigError(f"{path}: in a horizontal federation every institution holds the same label "
                              f"column; set 'label' for {without}" if without else
                              f"{path}: in a horizontal federation every institution holds the same label "
                              f"column, found {sorted({str(i.label) for i in institutions})}")


def _parse_params(params: dict, algorithm: Algorithm, privacy: PrivacySetting,
                  path: Path) -> ForestParams | ExtraTreesParams:
    """The `params:` section as the algorithm's parameter class, by its registered parser.

    Vertical label protection comes from `privacy:`; boosting takes XGBoost's names (`BoostingParams`).
    """
    try:
        return algorithm.params_from_config(params, privacy)
    except (TypeError, ParameterError) as exc:
        raise ConfigError(f"{path}: params: {exc}") from exc


def _master_public_key(master: dict, path: Path) -> Path | None:
    """`master.public_key`, or the public key `keygen` writes beside `master.signing_key`."""
    if master.get("public_key"):
        return resolve(path, master["public_key"])
    return public_key_path(resolve(path, master["signing_key"])) if master.get("signing_key") else None
