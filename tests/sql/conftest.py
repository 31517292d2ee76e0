"""Shared fixtures of the SQL tests: the Dask cluster the institutions of a module's Dask runs share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fedcore.compute.cluster import Cluster


@pytest.fixture(scope="module")
def workers() -> Iterator[Cluster]:
    """Two in-process Dask workers, shared by every institution of a module's Dask runs."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    yield Cluster(client, [])
    client.close()
    cluster.close()
