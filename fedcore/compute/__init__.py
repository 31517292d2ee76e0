"""An institution's data-local work on a Dask cluster (issue #29, horizontal setting).

`blocks.py` cuts an institution's rows into fixed blocks in a canonical order (an in-memory frame by row
count; a Parquet file or dataset folder by sorted file, row group and row range) that does not depend on
the number of workers; `dask_rows.py` holds a horizontal party's rows as one Dask future per block and
does each level's row work as one task per block (`DaskPartyRows`, a drop-in for
`fedcore.horizontal.rows.PartyRows`); `cluster.py` parses the `compute:` setting and connects to (or
starts) the cluster. An agent session on Parquet data: `dask_table.py` (the files as metadata, per-block
null and infinity counts, the holdout masks), `dask_validation.py` (the data contract per block, merged),
`dask_predict.py` (held-out statistics and batch predictions per block).

Dask is imported only when a cluster is used, so `fedforest --help` and every in-process run stay as fast
as before.
"""

DEFAULT_BLOCK_ROWS = 1 << 20
"""Rows per block unless told otherwise (about 170 MiB of encoded X at 20 features)."""
