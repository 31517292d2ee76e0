"""Shared Dask clusters for the compute tests: in-process workers (threads), started once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

distributed = pytest.importorskip("distributed")


def _client(workers: int) -> Iterator:
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    client = distributed.Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def three_workers() -> Iterator:
    """A client to a LocalCluster of three in-process workers (shared by a module's tests)."""
    yield from _client(3)


@pytest.fixture(scope="module")
def one_worker() -> Iterator:
    """A client to a LocalCluster of one in-process worker."""
    yield from _client(1)


@pytest.fixture(scope="module")
def two_workers() -> Iterator:
    """A client to a LocalCluster of two in-process workers."""
    yield from _client(2)
