"""The `compute:` setting: parsed once when the config loads, every mistake refused by name (issue #29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.compute.cluster import DaskCompute, compute_from_spec
from fedcore.config import parse_config
from fedcore.errors import ConfigError, ParameterError

CONFIG = Path("/fed/federation.yaml")


def _raw(compute, setting: str = "horizontal", privacy: str = "none") -> dict:
    return {"federation": "clinics", "setting": setting, "privacy": privacy,
            "consortium_key": {"env": "FEDFOREST_CONSORTIUM_KEY"},
            "institutions": [
                {"name": "north", "data": "n.parquet", "id_column": "id", "label": "y", "compute": compute},
                {"name": "south", "data": "s.parquet", "id_column": "id", "label": "y"}]}


def test_an_institution_may_run_its_party_on_its_own_dask_cluster() -> None:
    north, south = parse_config(_raw({"dask": {"address": "tls://dask.north:8786", "block_rows": 500000}}),
                                CONFIG).institutions
    assert north.compute == DaskCompute(address="tls://dask.north:8786", block_rows=500000)
    assert south.compute is None  # absent: in the agent's process, as before
    local = {"dask": {"local": {"workers": 4, "threads_per_worker": 1, "memory_limit": "4GiB"}}}
    assert parse_config(_raw(local), CONFIG).institutions[0].compute == DaskCompute(
        workers=4, threads_per_worker=1, memory_limit="4GiB")


WHERE = "/fed/federation.yaml: institution 'north': "


@pytest.mark.parametrize("compute, message", [
    ({"ray": {}}, "compute must be {dask: {address: tcp://host:8786}} or {dask: {local: {workers: 2}}}, got "
                  "{'ray': {}}"),
    ({"dask": {"adress": "tcp://x:1"}}, "unknown compute.dask setting(s) ['adress']; valid: ['address', "
                                        "'local', 'block_rows', 'connect_timeout_s']"),
    ({"dask": {}}, "compute.dask needs exactly one of 'address' (a running scheduler) or 'local' (a cluster "
                   "the agent starts)"),
    ({"dask": {"address": "dask:8786"}}, "compute.dask.address must be a scheduler address such as "
                                         "tcp://scheduler:8786 or tls://scheduler:8786, got 'dask:8786'"),
    ({"dask": {"local": {"workers": 0}}}, "compute.dask.local.workers must be a positive integer, got 0"),
    ({"dask": {"local": {"cores": 2}}}, "unknown compute.dask.local setting(s) ['cores']; valid: ['workers', "
                                        "'threads_per_worker', 'memory_limit', 'processes']"),
    ({"dask": {"local": {"memory_limit": "lots"}}}, "compute.dask.local.memory_limit must be a size such as "
                                                    "4GiB, got 'lots'"),
    ({"dask": {"local": {}, "block_rows": 1.5}},
     "compute.dask.block_rows must be a positive integer, got 1.5"),
    ({"dask": {"address": "tcp://x:1", "connect_timeout_s": 0}}, "compute.dask.connect_timeout_s must be a "
                                                                 "positive number, got 0"),
])
def test_a_bad_compute_setting_is_refused_by_name(compute, message) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(_raw(compute), CONFIG)
    assert str(error.value) == WHERE + message


def test_every_algorithm_and_mode_loads_with_a_dask_party() -> None:
    compute = {"dask": {"local": {"workers": 2}}}

    def vertical(**kwargs) -> dict:
        raw = _raw(compute, setting="vertical", **kwargs)
        raw["institutions"][1].pop("label")
        return raw

    assert parse_config(vertical(), CONFIG).institutions[0].compute == DaskCompute(workers=2)
    encrypted = parse_config(vertical(privacy="paillier"), CONFIG)
    assert encrypted.institutions[0].compute == DaskCompute(workers=2)
    raw = vertical()
    raw["params"] = {"task": "regression", "criterion": "squared_error"}  # a forest of either task runs
    assert parse_config(raw, CONFIG).institutions[0].compute == DaskCompute(workers=2)
    for privacy in ("none", "ou"):  # vertical boosting, plain or SecureBoost (issue #29)
        boosted = parse_config({**vertical(privacy=privacy), "algorithm": "boosting"}, CONFIG)
        assert boosted.algorithm == "boosting" and boosted.setting == "vertical"
        assert boosted.institutions[0].compute == DaskCompute(workers=2)
    config = parse_config(_raw(compute, privacy="ldp"), CONFIG)  # every privacy mode runs on Dask
    assert config.privacy.mode == "ldp" and config.institutions[0].compute == DaskCompute(workers=2)
    boosting = parse_config({**_raw(compute), "algorithm": "boosting"}, CONFIG)  # horizontal boosting runs
    assert boosting.algorithm == "boosting" and boosting.institutions[0].compute == DaskCompute(workers=2)


def test_the_estimators_and_simulate_take_local_n_or_an_address() -> None:
    assert compute_from_spec(None) is None
    assert compute_from_spec("local:3", block_rows=1000) == DaskCompute(workers=3, block_rows=1000)
    assert compute_from_spec("tcp://10.0.0.5:8786") == DaskCompute(address="tcp://10.0.0.5:8786")
    for bad in ("local:0", "local", "10.0.0.5:8786", 3):
        with pytest.raises(ParameterError, match=r"^compute must be None, 'local:N' \(N workers on this "
                                                 rf"machine\), .*; got {bad!r}$"):
            compute_from_spec(bad)


def test_one_cluster_per_setting_held_by_each_server_closes_when_the_last_lets_go() -> None:
    """Two agent servers of one process share a setting's cluster; it closes when the last one stops."""
    from fedcore.compute.cluster import hold_shared, shared_cluster

    compute = DaskCompute(workers=1, processes=False)
    first, second = hold_shared(compute), hold_shared(compute)
    cluster = shared_cluster(compute)
    assert shared_cluster(compute) is cluster and DaskCompute(workers=1, processes=False) == compute
    first()
    first()  # a second call of the same holder releases nothing more
    assert cluster.client.status == "running" and shared_cluster(compute) is cluster
    second()
    assert cluster.client.status == "closed"
    again = shared_cluster(compute)  # a later agent starts a new one
    assert again is not cluster
    hold_shared(compute)()
    assert again.client.status == "closed"


def test_a_reached_scheduler_outlives_the_agent_only_its_client_closes() -> None:
    """An agent that connected to a running scheduler closes its client when it lets go, not the cluster."""
    from distributed import Client, LocalCluster

    from fedcore.compute.cluster import hold_shared, shared_cluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as running:
        compute = DaskCompute(address=running.scheduler_address)
        release = hold_shared(compute)
        cluster = shared_cluster(compute)
        assert len(cluster.client.scheduler_info()["workers"]) == 1
        release()
        assert cluster.client.status == "closed"
        with Client(running.scheduler_address, set_as_default=False) as other:  # the scheduler runs on
            assert len(other.scheduler_info()["workers"]) == 1


def test_a_worker_memory_limit_under_what_a_worker_needs_idle_is_refused_by_name() -> None:
    """Dask pauses a worker at 80% of its limit; 400 MiB (where a run hung 14 minutes) is refused."""
    from fedcore.compute.cluster import smallest_memory_limit

    assert smallest_memory_limit() == 640 * 2**20  # 2 x 256 MiB idle / 0.8
    with pytest.raises(ConfigError) as error:
        parse_config(_raw({"dask": {"local": {"memory_limit": "400MiB"}}}), CONFIG)
    assert str(error.value) == WHERE + (
        "compute.dask.local.memory_limit '400MiB' is below the smallest that works, 640MiB: an idle worker "
        "takes about 256 MiB and Dask pauses a worker at 80% of its limit, so its tasks would wait forever; "
        "set memory_limit: 640MiB or more")
    local = {"dask": {"local": {"memory_limit": 640 * 2**20}}}
    assert parse_config(_raw(local), CONFIG).institutions[0].compute == DaskCompute(memory_limit=640 * 2**20)


def _rss_with_row_modules() -> int:
    """This worker's resident bytes once fedcore's row modules are imported (what any party task does)."""
    import fedcore.compute.dask_alignment
    import fedcore.compute.dask_vertical
    import fedcore.compute.dask_vertical_predict  # noqa: F401

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux /proc")
def test_an_idle_worker_process_stays_within_the_memory_the_limit_rule_assumes() -> None:
    """The rule's idle worker (WORKER_IDLE_BYTES): a real worker process's RSS with the row modules loaded."""
    distributed = pytest.importorskip("distributed")
    from fedcore.compute.cluster import WORKER_IDLE_BYTES

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  memory_limit="2GiB") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        (rss,) = client.run(_rss_with_row_modules).values()
    assert 100 * 2**20 < rss <= WORKER_IDLE_BYTES


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="TCP_USER_TIMEOUT is Linux's")
def test_a_busy_agents_connections_wait_five_minutes_not_thirty_seconds() -> None:
    """The agent's client socket to its scheduler: the kernel gives up on unacknowledged data after 300 s."""
    import socket

    import dask

    from fedcore.compute.cluster import held_cluster

    tcp_user_timeout = 18  # linux/tcp.h
    with dask.config.set({"distributed.comm.timeouts.tcp": "30s"}):  # Dask's default, restored after
        with held_cluster(DaskCompute(workers=1, processes=True)) as cluster:
            client_socket = cluster.client.scheduler_comm.comm.stream.socket
            assert client_socket.getsockopt(socket.SOL_TCP, tcp_user_timeout) == 300_000
            assert cluster.client.run(lambda: dask.config.get("distributed.comm.timeouts.tcp")) == {
                address: "300s" for address in cluster.client.scheduler_info()["workers"]}


def test_a_configured_tcp_timeout_is_left_alone() -> None:
    import dask

    from fedcore.compute.cluster import patient_comms

    with dask.config.set({"distributed.comm.timeouts.tcp": "45s"}):
        patient_comms()
        assert dask.config.get("distributed.comm.timeouts.tcp") == "45s"
