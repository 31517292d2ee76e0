"""An institution's data-local work on a Dask cluster (issue #29).

`blocks.py` cuts an institution's rows into fixed blocks in a canonical order (an in-memory frame by row
count; a Parquet file or dataset folder by sorted file, row group and row range) that does not depend on
the number of workers; `dask_rows.py` holds a horizontal party's rows as one Dask future per block and
does each level's row work as one task per block (`DaskPartyRows`, a drop-in for
`fedcore.horizontal.rows.PartyRows`), and `dask_boosting.py` extends it with horizontal boosting's per-block
margins and fixed-point gradients (`DaskBoostingRows`); `dask_vertical.py` does the same for a vertical
Federated Forest party (`DaskVerticalRows`, a drop-in for `fedcore.vertical.rows.LocalRows`); `cluster.py`
parses the `compute:` setting and connects to (or starts) the cluster.

Dask is imported only when a cluster is used, so `fedforest --help` and every in-process run stay as fast
as before.
"""

DEFAULT_BLOCK_ROWS = 1 << 20
"""Rows per block unless told otherwise (about 170 MiB of encoded X at 20 features)."""
