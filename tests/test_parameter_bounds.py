"""Issue #15, point 2: parameters are bounded, and refused with the bound and its reason before any work.

The bounds of single parameters live in `TreeParams` (tests/trees/test_params.py); here: the worst-case model
size against the memory available (`check_model_fits`), and the `fedforest simulate` requests that once ran
for minutes or died with a MemoryError traceback.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedcore import cli
from fedcore.commands import simulate as simulate_command
from fedcore.errors import ParameterError
from fedcore.horizontal.fet.party import HorizontalParty
from fedcore.horizontal.params import ExtraTreesParams
from fedcore.simulation import vertical as vertical_simulation
from fedcore.trees.params import ForestParams, check_model_fits, format_bytes, max_nodes_per_tree, model_bytes
from fedcore.vertical.party import VerticalParty

GIB = 1 << 30


# -- the estimate ------------------------------------------------------------------------------------
def test_a_tree_has_at_most_two_nodes_a_leaf_and_two_to_the_depth_leaves() -> None:
    assert max_nodes_per_tree(ForestParams(), 100) == 199  # 2 x rows - 1
    assert max_nodes_per_tree(ForestParams(max_depth=3), 100) == 15  # 2^(depth + 1) - 1
    assert max_nodes_per_tree(ForestParams(max_depth=30), 100) == 199
    assert max_nodes_per_tree(ForestParams(min_samples_leaf=10), 100) == 19  # at most 10 leaves
    # 40 draws: 13 leaves
    assert max_nodes_per_tree(ForestParams(max_samples=40, min_samples_leaf=3), 100) == 25
    assert max_nodes_per_tree(ExtraTreesParams(min_samples_leaf=7), 100) == 27
    assert max_nodes_per_tree(ForestParams(max_depth=32767), 10**6) == 2 * 10**6 - 1  # no 2^32768 overflow


def test_bytes_a_node_are_those_of_the_model_tables() -> None:
    # vertical master: tree, node, left, right (int32), depth, owner (int16), weight and 3 values (float64)
    assert ForestParams().node_bytes(3) == 16 + 4 + 8 + 24
    # ... plus each party's partial model: index, feature (int32), threshold, two flags, 4 words of
    # category bits
    assert ForestParams().node_bytes(3, colocated_parties=2) == 52 + 2 * (16 + 4 + 8 + 2 + 32)
    # horizontal: the complete forest (index, depth, feature, threshold, weight, values) at every holder
    assert ExtraTreesParams().node_bytes(1, colocated_parties=2) == 3 * (16 + 2 + 4 + 8 + 8 + 8)
    assert model_bytes(ForestParams(n_estimators=10, max_depth=3), 100, n_outputs=2) == 10 * 15 * 44


def test_check_model_fits_refuses_a_model_beyond_a_small_budget() -> None:
    params = ForestParams(n_estimators=10, max_depth=3)
    assert check_model_fits(params, 100, 6600, n_outputs=2) == 6600  # exactly fits
    with pytest.raises(ParameterError, match="may need 6.4 KiB of memory"):
        check_model_fits(params, 100, 6599, n_outputs=2)
    with pytest.raises(ParameterError) as excinfo:
        check_model_fits(params, 100, 4096, n_outputs=2)
    assert str(excinfo.value) == (
        "n_estimators=10 may need 6.4 KiB of memory, more than the 4.0 KiB available: a tree on 100 rows and "
        "max_depth=3 has up to 15 nodes, and the model tables of the master take 44 bytes a node; lower "
        "n_estimators, lower max_depth or raise min_samples_leaf")
    with pytest.raises(ParameterError) as excinfo:
        check_model_fits(ExtraTreesParams(n_estimators=1000, min_samples_leaf=2), 5000, 1 << 20,
                         colocated_parties=3)
    assert str(excinfo.value) == (
        "n_estimators=1000 may need 877.2 MiB of memory, more than the 1.0 MiB available: a tree on 5000 "
        "rows with min_samples_leaf=2 has up to 4999 nodes, and the model tables of the master and 3 parties "
        "take 184 bytes a node; lower n_estimators, set max_depth or raise min_samples_leaf")


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536 << 20, 93 << 40, 5 << 60)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 GiB", "93.0 TiB", "5.0 EiB"]


# -- fedforest simulate: refused at once, one line, exit 1 ----------------------------------------------
@pytest.fixture
def four_thousand_rows(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=4000), "b": rng.normal(size=4000), "c": rng.normal(size=4000)})
    frame["y"] = (frame["a"] > 0).astype(int)
    path = tmp_path / "table.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if any party is created (vertical or horizontal), and fix the memory available."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("a party was created: the request was not refused before work started")

    monkeypatch.setattr(VerticalParty, "__init__", refuse)
    monkeypatch.setattr(HorizontalParty, "__init__", refuse)
    monkeypatch.setattr(simulate_command, "available_bytes", lambda: 8 * GIB)


def _one_line(capsys, *argv) -> str:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.endswith("\n") and err.count("\n") == 1, f"expected one line, got {err!r}"
    return err.rstrip("\n")


@pytest.mark.parametrize(("setting", "node_bytes"), [("vertical", 160), ("horizontal", 138)])
def test_a_hundred_million_trees_are_refused_before_any_party_exists(capsys, four_thousand_rows: Path,
                                                                     no_training, setting: str,
                                                                     node_bytes: int) -> None:
    line = _one_line(capsys, "simulate", "--data", four_thousand_rows, "--label", "y", "--trees", 100_000_000,
                     "--setting", setting)
    need = format_bytes(100_000_000 * 6399 * node_bytes)
    assert line == (f"fedforest: error: n_estimators=100000000 may need {need} of memory, more than the 8.0 "
                    "GiB available: a tree on 3200 rows has up to 6399 nodes, and the model tables of the "
                    f"master and 2 parties take {node_bytes} bytes a node; lower n_estimators, set max_depth "
                    "or raise min_samples_leaf")


def test_a_shallow_forest_of_many_trees_is_bounded_by_its_depth(capsys, four_thousand_rows: Path,
                                                                no_training) -> None:
    line = _one_line(capsys, "simulate", "--data", four_thousand_rows, "--label", "y", "--trees", 100_000_000,
                     "--max-depth", 2, "--parties", 3)
    assert line == ("fedforest: error: n_estimators=100000000 may need 144.7 GiB of memory, more than the "
                    "8.0 GiB available: a tree on 3200 rows and max_depth=2 has up to 7 nodes, and the model "
                    "tables of the master and 3 parties take 222 bytes a node; lower n_estimators, lower "
                    "max_depth or raise min_samples_leaf")


def test_a_trillion_trees_is_one_line_not_a_memory_error(capsys, four_thousand_rows: Path,
                                                         no_training) -> None:
    line = _one_line(capsys, "simulate", "--data", four_thousand_rows, "--label", "y", "--trees", 10**12)
    assert line == ("fedforest: error: n_estimators must be at most 2147483648 (tree numbers are int32 in "
                    "the model tables and messages), got 1000000000000")


def test_a_memory_error_anywhere_is_one_line(capsys, four_thousand_rows: Path, monkeypatch) -> None:
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(vertical_simulation, "simulate_vertical", exhausted)  # imported when simulate runs
    line = _one_line(capsys, "simulate", "--data", four_thousand_rows, "--label", "y", "--trees", 3)
    assert line.startswith("fedforest: error: out of memory: ")
