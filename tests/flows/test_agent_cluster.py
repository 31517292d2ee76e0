"""An agent flow run with `compute: dask` lets go of its cluster when it fails (issue #29).

The run holds the process's cluster from its load to the end of its session: a load that fails, or a server
that cannot start after the load, closes the LocalCluster the run started (`distributed`'s own registries).
"""

from __future__ import annotations

import pytest
import yaml

from fedcore.errors import ConfigError, DataReadError
from tests.compute.test_agent_parquet import _north_and_new, _table, _write
from tests.compute.workers import open_clusters


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["a file that is not Parquet", "no endpoint to serve on"])
def test_an_agent_run_that_fails_leaves_no_cluster(tmp_path, fault) -> None:
    from flows.agent import institution_agent

    _write(_north_and_new(_table("classification"))[0], tmp_path / "north")
    if fault == "a file that is not Parquet":
        (tmp_path / "north" / "part-2.parquet").write_bytes(b"not a parquet file")
    local = {"dask": {"local": {"workers": 1, "processes": False}, "block_rows": 50}}
    raw = {"federation": "f", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "institutions": [
               {"name": "north", "data": str(tmp_path / "north" / "*.parquet"), "id_column": "patient_id",
                "label": "class", "compute": local},
               {"name": "south", "data": "unused.parquet", "id_column": "patient_id", "label": "class"}]}
    config = tmp_path / "federation.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert not open_clusters()
    error = DataReadError if fault == "a file that is not Parquet" else ConfigError
    with pytest.raises(error) as refused:
        institution_agent(str(config), "north")
    if error is ConfigError:  # the load passed: the run failed building its server
        assert str(refused.value) == (f"{config}: institution 'north' needs endpoint, cert, key, tls.ca to "
                                      "serve over Flight")
    assert not open_clusters()
