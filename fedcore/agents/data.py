"""An institution's data for a session.

Its table read from the configured files or database (`fedcore.data.sql`), checked against its data
contract, and the contract result as it may leave the institution. With `compute: dask` and Parquet
files (or a Parquet dataset folder or URL) the agent reads only their metadata
(`fedcore.compute.dask_table`): the workers read, check and validate the blocks (issue #29).

Dates train as numbers, converted exactly as `fedforest simulate` converts them (`fedcore.data.columns`,
days since 1970-01-01 UTC) after validation: the contract's date and timestamp columns, or without a
contract the columns the training table holds dates in; prediction batches convert the same columns.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import pandas as pd

from fedcore.agents.batches import BatchLedger
from fedcore.compute.cluster import DaskCompute, loading_cluster
from fedcore.config import FederationConfig, default_predictions
from fedcore.contracts.expectations import ValidationReport
from fedcore.contracts.model import DataContract
from fedcore.data.columns import convert_dates, guess_date_columns
from fedcore.data.dialect import CsvDialect, CsvSource
from fedcore.data.io import is_dataset
from fedcore.data.numbers import check_finite_columns
from fedcore.data.sql import SqlSource
from fedcore.drift import DriftSettings
from fedcore.errors import ColumnNotFoundError, ConfigError, DataReadError, InputError, ProtocolError
from fedcore.models.registry import ModelRegistry
from fedcore.models.signing import PublicKeySource
from fedcore.privacy.settings import PrivacySetting

if TYPE_CHECKING:
    from fedcore.compute.cluster import Cluster
    from fedcore.compute.dask_table import ParquetTable

log = logging.getLogger(__name__)


@dataclass
class InstitutionData:
    """What an institution brings to a session: its (validated) table and how to read its new batches.

    In process, `frame` is the table. On a Dask cluster with Parquet data, `frame` holds no rows (the
    table's columns only) and `table` describes the files' blocks, which `cluster`'s workers read
    (`fedcore.compute.dask_table`).
    """

    name: str
    frame: pd.DataFrame
    id_column: str
    label: str | None
    registry: Path
    predictions_dir: Path
    """The predictions folder; with a sink and Dask workers, where their parts wait for delivery (hidden)."""
    load_batch: Callable[..., pd.DataFrame] | None = None
    """The new rows to predict; called with the batch's `:since`/`:until` values when `batches` is set."""
    validation: ValidationReport | None = None
    contract: DataContract | None = None
    memory_budget_mb: int | None = None
    """Memory the agent's party grows tree batches in (None: half of what its process may allocate)."""
    privacy: PrivacySetting | None = None
    """The federation's `privacy:` setting as this institution's own config reads it (a mapping is read by
    `fedcore.privacy.settings.parse_privacy` too); its party runs with it, and refuses a master that asks
    for another. None (in-process use): the master's."""
    holdout: float | None = None
    """This institution's own `training.holdout`: it refuses a master holding out another share of the rows.
    None (in-process use): the master's."""
    min_overlap: int | None = None
    """This institution's own `training.min_overlap` (vertical): it refuses to align fewer rows. None: 1."""
    master_key: PublicKeySource | None = None
    """The master's public key this institution's registry trusts (`master.public_key`); without one it
    stores nothing and loads nothing."""
    compute: DaskCompute | None = None
    """Where its party does its row work (`compute:` in its config, `fedcore.compute.cluster`); None: in the
    agent's process."""
    table: ParquetTable | None = None
    """The Parquet files' blocks when the workers read them (then `frame` holds the columns and no rows)."""
    cluster: Cluster | None = None
    """The institution's Dask cluster that holds `table`'s blocks."""
    open_batch: Callable[..., ParquetTable] | None = None
    """The new rows to predict as blocks the workers read (instead of `load_batch`); called as `load_batch`
    is."""
    predictions_sql: SqlSource | None = None
    """A database table the predictions are written to instead of `predictions_dir`
    (`fedcore.data.sql_sink`)."""
    dates: tuple[str, ...] = ()
    """The columns converted to days since epoch in the table and in every prediction batch."""
    predictions_dataset: Path | None = None
    """A Parquet dataset the predictions are delivered to, partitioned by model and version
    (`fedcore.data.parquet_sink`)."""
    batches: BatchLedger | None = None
    """The delivered batches of a `predict_data` query with `:since`/`:until` (`fedcore.agents.batches`)."""
    drift: DriftSettings | None = None
    """Its `drift:` setting: which batch PSI names a feature as drifted, and whether it then refuses to
    predict (`fedcore.agents.drift`). None (in-process use): the defaults (0.2, warn)."""
    federation_size: int | None = None
    """The institutions its own config lists: a secure-aggregation party refuses a master announcing another
    count (one would have it send its sums unmasked). None (in-process use): the master's."""

    def new_batch(self, until: datetime | None, version: tuple[str, str] | None) -> pd.DataFrame:
        """The new rows to predict: those of the batch scheduled at `until` when the query selects by time.

        `version` (model, version) predicts them: its model's batches of the query give `:since`.
        """
        if self.load_batch is None:
            raise ProtocolError(f"institution {self.name!r} has no prediction data configured")
        return self.load_batch(**self.batch_values(until, version))

    def open_new_batch(self, until: datetime | None, version: tuple[str, str] | None) -> ParquetTable:
        """The new rows to predict as blocks the workers read: `new_batch`'s rows, not read here."""
        assert self.open_batch is not None, "prediction data read by the workers"
        return self.open_batch(**self.batch_values(until, version))

    def batch_values(self, until: datetime | None, version: tuple[str, str] | None) -> dict[str, datetime]:
        """The `:since`/`:until` of the batch scheduled at `until` (`BatchLedger.window`), if it has them."""
        return {} if self.batches is None else self.batches.window(version, until)

    @property
    def n_rows(self) -> int:
        """Rows of the table (from the Parquet metadata when the agent does not hold them)."""
        return self.table.n_rows if self.table is not None else len(self.frame)

    def registry_store(self) -> ModelRegistry:
        """This institution's model registry, trusting only the master's key."""
        if self.master_key is None:
            raise ConfigError(f"institution {self.name!r}: no trusted master key, so no model version can be "
                              "stored or loaded here: set master.public_key in the federation config (the "
                              "master's public key, written beside its signing key as <signing_key>.pub)")
        return ModelRegistry(self.registry, public_key=self.master_key)

    @property
    def memory_budget(self) -> int:
        """The party's budget in bytes (`fedcore.trees.budget`)."""
        from fedcore.trees.budget import resolve_budget

        return resolve_budget(self.memory_budget_mb)

    @property
    def valid(self) -> bool:
        """Whether the table kept its data contract (True when there is no contract)."""
        return self.validation is None or self.validation.success


def institution_from_config(config: FederationConfig, name: str, cluster: Cluster | None = None
                            ) -> InstitutionData:
    """Load one institution's training table from its configured files and validate it against its contract.

    Examples of bad values stay in the local report. Runs where the data lives. The configured ID column
    and label are checked first (`check_configured_columns`): a misspelt one fails here, with the fix.
    With `compute: dask` and Parquet files or a dataset (or a database table or query), only their
    metadata (one ID per block) is read here; the workers of `cluster` (default: the config's,
    `shared_cluster`: one per process) check and validate the blocks. A load that fails lets go of the
    shared cluster (`loading_cluster`): one it started closes.
    """
    with loading_cluster(config.institution(name).compute) as shared:
        return _load_institution(config, name, cluster, shared)


def _load_institution(config: FederationConfig, name: str, cluster: Cluster | None,
                      shared: Callable[[], Cluster]) -> InstitutionData:
    """`institution_from_config`'s load, on `cluster` or else (when the workers read) on `shared()`."""
    inst = config.institution(name)
    master_key = _master_key(config, name)  # before reading data: a missing key file fails at once
    what = f"institution {name!r}"
    workers_read = inst.compute is not None
    contract = None
    if inst.contract is not None:
        from fedcore.contracts import load_contract

        contract = load_contract(inst.contract)
    table = batch = open_batch = None
    skip = [inst.id_column, inst.label]
    if workers_read and _on_dask(inst.data, what):
        from fedcore.compute.dask_table import profile

        cluster = cluster or shared()
        table = profile(cluster.client, _open_blocks(config, name, inst.data, what), skip)
        frame = pd.DataFrame(columns=list(table.columns))  # the columns, never the rows
    else:
        frame = read_source(inst.data, what, skip=skip, order_by=inst.id_column)
    check_configured_columns(config, name, frame.columns, contract)
    report = None
    if contract is not None:
        # no example values, not even in this institution's own log: counts and columns only (the
        # institution inspects its data with `fedforest contract check`, which shows examples on screen)
        if table is not None:
            from fedcore.compute.dask_validation import validate_blocks

            assert cluster is not None, "a table on Dask comes with its cluster"
            report = validate_blocks(cluster.client, table, contract, name,
                                     include_label=inst.is_label_holder)
        else:
            from fedcore.contracts import validate_frame

            report = validate_frame(frame, contract, name, include_label=inst.is_label_holder, max_examples=0)
        for line in report.failure_lines():
            log.warning("data contract violation: %s", line)
    dates = date_columns(contract, frame, skip, table, cluster)
    if report is None or report.success:  # a table that broke its contract does not train: left as read
        frame, table = _dates_as_numbers(frame, table, dates)
    predict_data = inst.predict_data
    if predict_data and workers_read and _on_dask(predict_data, f"{what} prediction data", batch=True):
        cluster = held = cluster or shared()
        open_batch = lambda **values: _open_batch(config, name, predict_data, held, dates, values)  # noqa: E731
    elif predict_data:
        batch = lambda **values: _read_batch(config, name, predict_data, dates, values)  # noqa: E731
    return InstitutionData(
        name=name, frame=frame, id_column=inst.id_column, label=inst.label, registry=inst.registry,
        predictions_dir=inst.predictions or default_predictions(config.path, name),
        load_batch=batch, validation=report, contract=contract, memory_budget_mb=inst.memory_budget_mb,
        privacy=config.privacy, master_key=master_key,
        holdout=config.training.holdout, min_overlap=config.training.min_overlap, compute=inst.compute,
        table=table, cluster=cluster if table is not None or open_batch is not None else None,
        open_batch=open_batch, predictions_sql=inst.predictions_sql, dates=dates,
        predictions_dataset=inst.predictions_dataset,
        batches=(BatchLedger.beside(inst.registry, predict_data, name)
                 if isinstance(predict_data, SqlSource) and predict_data.parameters else None),
        drift=config.drift, federation_size=len(config.institutions),
    )


def _dates_as_numbers(frame: pd.DataFrame, table: ParquetTable | None,
                      dates: tuple[str, ...]) -> tuple[pd.DataFrame, ParquetTable | None]:
    """The table with `dates` as days since epoch: converted here, or by the workers as they read blocks."""
    if table is not None:
        return frame, dataclasses.replace(table, dates=dates)
    return convert_dates(frame, dates=dates)[0], None


def date_columns(contract: DataContract | None, frame: pd.DataFrame, skip: Collection[str | None],
                 table: ParquetTable | None = None, cluster: Cluster | None = None) -> tuple[str, ...]:
    """The columns an agent converts to days since epoch: its contract's dates, else the table's own.

    Decided once per session from the training table (on Dask: from every block's evidence, so that the
    workers convert what the in-process agent would), so that a batch never holds a date where the table
    held a string (or the reverse).
    """
    if contract is not None:
        return tuple(contract.date_columns)
    keep = [c for c in skip if c is not None]
    if table is not None:
        from fedcore.compute.dask_table import guess_block_dates

        assert cluster is not None, "a table on Dask comes with its cluster"
        return guess_block_dates(cluster.client, table, keep)
    return tuple(guess_date_columns(frame, keep=keep))


def _on_dask(pattern: str | CsvSource | SqlSource, what: str,
             batch: bool = False) -> TypeGuard[str | SqlSource]:
    """Whether the workers read `pattern`: Parquet files or dataset, or a database table or query.

    The agent reads CSV. A query with :since/:until is cut into the blocks of each scheduled batch.

    `batch`: prediction data, which may not exist yet when the agent loads (a new batch arrives later):
    decided by the pattern's own suffix then, and its files are matched when a prediction reads them.
    """
    from fedcore.compute.dask_table import is_parquet

    if isinstance(pattern, CsvSource):
        log.info("%s: CSV files %s are read in the agent's own process (compute: dask reads Parquet and "
                 "databases on the workers)", what, pattern.describe())
        return False
    if (isinstance(pattern, SqlSource) or is_dataset(pattern)
            or is_parquet([pattern] if batch else matching_files(pattern, what))):
        return True
    log.info("%s: %r is not all Parquet, so the agent reads it in its own process (compute: dask reads "
             "Parquet and databases on the workers)", what, pattern)
    return False


def _open_blocks(config: FederationConfig, name: str, source: str | SqlSource, what: str,
                 values: Mapping[str, datetime] | None = None) -> ParquetTable:
    """The blocks an institution's workers read: Parquet files' row groups, or a database's rows in ID order.

    A dataset folder or URL's blocks carry their file's partition values (`open_dataset`).
    A database's blocks are cut by the ID column: one missing from the table or query is refused first,
    by name (`check_configured_columns`). `values`: the query's placeholders (a scheduled batch's).
    """
    from fedcore.compute.dask_table import open_dataset, open_parquet, open_sql
    from fedcore.data.sql import sql_schema

    inst = config.institution(name)
    assert inst.compute is not None, "workers read only with compute: dask"
    if not isinstance(source, SqlSource):
        files = matching_files(source, what)
        if len(files) == 1 and is_dataset(files[0]):  # as `read_files` decides
            return open_dataset(files[0], what, inst.compute.block_rows)
        return open_parquet(files, what, inst.compute.block_rows)
    schema = sql_schema(source, what, values)  # asked once: the columns checked here are the blocks'
    check_configured_columns(config, name, schema.names, table=source.describe(), keys=("id_column",))
    return open_sql(source, what, inst.id_column, inst.compute.block_rows, schema, values)


def check_configured_columns(config: FederationConfig, name: str, columns: Collection,
                             contract: DataContract | None = None, table: str = "its table",
                             keys: Collection[str] = ("id_column", "label")) -> None:
    """Refuse a configured `id_column` or `label` (label holders) that is not the table's, naming the fix.

    Against the institution's data contract when it declares the column (ConfigError; the contract's own
    check then finds a table without it), else against the table's `columns` (ColumnNotFoundError): one line
    naming the institution, the configured column, a close match and the config entry to set, before any
    work (a misspelt label would otherwise pass validation and fail at alignment).
    """
    index, inst = next((i, inst) for i, inst in enumerate(config.institutions) if inst.name == name)
    declared = {"id_column": contract.id_column if contract else None,
                "label": contract.label.column if contract and contract.label else None}
    for key, configured in (("id_column", inst.id_column), ("label", inst.label)):
        if configured is None or key not in keys:
            continue
        fix = f"set institutions[{index}].{key} in {config.path}"
        if declared[key] is not None and declared[key] != configured:
            raise ConfigError(f"institution {name!r}: {key} {configured!r} is not the {key} of its data "
                              f"contract {str(inst.contract)!r} ({declared[key]!r}); {fix} (or correct the "
                              "contract)")
        if declared[key] is None and configured not in columns:
            close = difflib.get_close_matches(configured, [str(c) for c in columns], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ColumnNotFoundError(f"institution {name!r}: {key} {configured!r} is not a column of {table}"
                                      f"{hint}; {fix}")


def _read_batch(config: FederationConfig, name: str, pattern: str | CsvSource | SqlSource,
                dates: Collection[str] = (), values: Mapping[str, datetime] | None = None) -> pd.DataFrame:
    """An institution's new rows to predict, refused without its ID column; `dates` converted.

    `values`: its query's placeholders (a scheduled batch's `:since`, `:until`).
    """
    what = f"institution {name!r} prediction data"
    id_column = config.institution(name).id_column
    frame = read_source(pattern, what, skip=[id_column], order_by=id_column, values=values)
    shown = pattern.describe() if isinstance(pattern, SqlSource | CsvSource) else repr(pattern)
    check_configured_columns(config, name, frame.columns, table=f"its prediction data {shown}",
                             keys=("id_column",))
    try:
        return convert_dates(frame, dates=dates)[0]
    except InputError as error:
        raise InputError(f"{what}: {error}") from None


def _open_batch(config: FederationConfig, name: str, pattern: str | SqlSource, cluster: Cluster,
                dates: tuple[str, ...] = (), values: Mapping[str, datetime] | None = None) -> ParquetTable:
    """New rows to predict as blocks, refused as `_read_batch` refuses them (rows not read here).

    The workers convert `dates` in each block they read. `values`: its query's placeholders (a scheduled
    batch's `:since`, `:until`), bound in every block's read.
    """
    from fedcore.compute.dask_table import profile

    what = f"institution {name!r} prediction data"
    inst = config.institution(name)
    assert inst.compute is not None, "only with compute: dask"
    shown = pattern.describe() if isinstance(pattern, SqlSource) else repr(pattern)
    table = profile(cluster.client, _open_blocks(config, name, pattern, what, values), [inst.id_column])
    check_configured_columns(config, name, table.columns, table=f"its prediction data {shown}",
                             keys=("id_column",))
    return dataclasses.replace(table, dates=dates)


def _master_key(config: FederationConfig, name: str) -> Path | None:
    """The master's public key file the config names, checked to exist where this institution runs."""
    path = config.master_public_key
    if path is not None and not path.is_file():
        raise ConfigError(f"institution {name!r}: the master's public key {str(path)!r} (master.public_key) "
                          "is not there: copy the master's public key file to this host (fedforest models "
                          "keygen writes it beside the signing key)")
    return path


def read_source(source: str | CsvSource | SqlSource, what: str, skip: Collection[str | None] = (),
                order_by: str | None = None, values: Mapping[str, datetime] | None = None) -> pd.DataFrame:
    """A configured `data`/`predict_data`: files (`read_files`) or a database table or query, as one table.

    A database's rows in `order_by`'s order (the ID column; a database has no order of its own), unless
    `order_by` is not one of its columns (then the configured-columns check names it); `values`: the
    query's placeholder values (a prediction batch's `:since`, `:until`). Refused if a numeric column
    other than `skip` holds an infinity (`fedcore.data.numbers`).
    """
    if isinstance(source, CsvSource):
        return read_files(source.path, what, skip, source.dialect)
    if not isinstance(source, SqlSource):
        return read_files(source, what, skip)
    from fedcore.data.sql import read_sql, sql_schema

    if order_by is not None and order_by not in sql_schema(source, what, values).names:
        order_by = None
    frame = read_sql(source, what, order_by, values)
    check_finite_columns(frame, what, skip=[c for c in skip if c is not None])
    return frame


def read_files(pattern: str, what: str, skip: Collection[str | None] = (),
               dialect: CsvDialect | None = None) -> pd.DataFrame:
    """All .parquet/.csv files matching `pattern` (a path or glob) as one table; CSV read in `dialect`.

    A folder or URL is a Parquet dataset (`fedcore.data.io.read_dataset`: Hive partitions as columns).

    Refused if a numeric column other than `skip` holds an infinity (`fedcore.data.numbers`).
    """
    from fedcore.data.io import read_dataset, read_table

    files = matching_files(pattern, what)
    if len(files) == 1 and is_dataset(files[0]):
        frame = read_dataset(files[0])
    else:
        frame = pd.concat([read_table(f, dialect) for f in files], ignore_index=True)
    check_finite_columns(frame, what, skip=[c for c in skip if c is not None])
    return frame


def matching_files(pattern: str, what: str) -> list[str]:
    """The files `pattern` (a path or glob) names, sorted: the order their rows are concatenated in."""
    import glob

    if "://" in pattern:  # a dataset URL: pyarrow's file systems list it
        return [pattern]
    files = sorted(glob.glob(pattern)) or ([pattern] if not glob.has_magic(pattern) else [])
    if not files:
        raise DataReadError(f"{what}: no file matches {pattern!r}")
    return files
