"""Two-phase registering (fedcore/models/publish.py, ModelRegistry pending/commit).

A version exists at the master and every institution, or nowhere, even when the master is killed at any step
of registering.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedcore.errors import ArtifactError, ProtocolError
from fedcore.models.publish import register_everywhere, withdraw_uncommitted
from fedcore.models.registry import ModelRegistry
from fedcore.protocol.messages import Message
from tests.models import registering

TABLE = {"master": pa.table({"x": [1, 2, 3]})}


def _registry(root: Path) -> ModelRegistry:
    """A master's registry (it signs, so it trusts its own versions)."""
    return ModelRegistry(root, signing_key=Ed25519PrivateKey.generate())


def test_a_pending_version_is_invisible_until_committed(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    assert registry.register("m", {"algorithm": "a"}, TABLE) == "v0001"
    assert registry.register("m", {"algorithm": "a"}, TABLE, pending=True) == "v0002"
    assert registry.versions("m") == ["v0001"] and registry.pending("m") == ["v0002"]
    assert registry.aliases("m")["latest"] == "v0001"
    with pytest.raises(ArtifactError, match=r"model 'm' has no version 'v0002' \(versions: v0001\)$"):
        registry.resolve("m", "v0002")
    with pytest.raises(ArtifactError, match="has no version"):
        registry.promote("m", "v0002")
    assert registry.read_manifest("m", "v0002", pending=True)["version"] == "v0002"
    assert registry.register("m", {"algorithm": "a"}, TABLE, pending=True) == "v0003"  # numbers never reused
    registry.commit("m", "v0002")
    assert registry.versions("m") == ["v0001", "v0002"] and registry.pending("m") == ["v0003"]
    assert registry.aliases("m")["latest"] == "v0002"
    registry.discard_pending("m", "v0003")
    assert registry.pending("m") == [] and not (tmp_path / "m" / "v0003").exists()
    with pytest.raises(ArtifactError, match="model 'm' has no pending version v0003 to commit"):
        registry.commit("m", "v0003")


def test_staging_leftovers_of_a_crashed_write_are_removed_by_the_next_write(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.register("m", {}, TABLE)
    (tmp_path / "m" / ".v0002.tmp-abc123").mkdir()
    (tmp_path / "m" / ".v0002.tmp-abc123" / "master.arrow").write_bytes(b"half")
    (tmp_path / "m" / ".aliases.log.tmp-xyz").write_bytes(b"{")
    registry.register("m", {}, TABLE)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [".lock", "v0001", "v0002"]


class _Institutions:
    """A master session's storing side, recording what it was asked; `fail` makes storing raise."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.calls = fail, []

    def store_at_institutions(self, model_name: str, version: str, manifest: dict) -> dict[str, str]:
        self.calls.append(("store", version, manifest["version"]))
        if self.fail:
            raise ProtocolError("institution 'east' is unreachable")
        return {"east": f"/east/{model_name}/{version}"}

    def withdraw_at_institutions(self, model_name: str, version: str) -> None:
        self.calls.append(("withdraw", version))


def test_register_everywhere_commits_only_after_every_institution_stored(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    institutions = _Institutions()
    assert register_everywhere(registry, institutions, "m", {}, TABLE) == ("v0001", {"east": "/east/m/v0001"})
    assert institutions.calls == [("store", "v0001", "v0001")] and registry.versions("m") == ["v0001"]
    failing = _Institutions(fail=True)
    with pytest.raises(ProtocolError, match="institution 'east' is unreachable"):
        register_everywhere(registry, failing, "m", {}, TABLE)
    assert failing.calls == [("store", "v0002", "v0002"), ("withdraw", "v0002")]
    assert registry.versions("m") == ["v0001"] and registry.pending("m") == []


def test_an_earlier_runs_uncommitted_version_is_withdrawn_everywhere_first(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.register("m", {}, TABLE, pending=True)  # a run killed while registering
    institutions = _Institutions()
    assert withdraw_uncommitted(registry, institutions, "m") == ["v0001"]
    assert institutions.calls == [("withdraw", "v0001")] and registry.pending("m") == []
    # the number is free again
    assert register_everywhere(registry, institutions, "m", {}, TABLE)[0] == "v0001"


def _run(workdir: Path, step: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.models.registering", str(workdir), step],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])


def _leftovers(workdir: Path) -> list[str]:
    return sorted(str(p.relative_to(workdir)) for p in (workdir / "registry").rglob(".*")
                  if p.name not in (".lock",) and not p.name.startswith(".withdrawn-"))


def _every_listed_version_loads_and_predicts_everywhere(workdir: Path) -> list[str]:
    """Fresh agents load each version the master lists (checked against the signed digests) and predict."""
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.transport.inprocess import InProcessTransport

    master = registering.master_registry(workdir)
    listed = master.versions(registering.MODEL)
    agents = registering.agents(workdir)
    session = HorizontalSession(InProcessTransport({n: a.handle for n, a in agents.items()}),
                                ExtraTreesParams(n_estimators=2))
    for version in listed:
        assert session.load_model(master, registering.MODEL, version) == version
        assert session.predict_locally()["counts"] == dict.fromkeys(registering.NAMES, 20)
    if len(listed) > 1:  # a master may not take back a version an institution stored before its newest
        name = registering.NAMES[0]
        with pytest.raises(ProtocolError, match=f"institution '{name}' withdraws only the version it stored "
                                                f"in this session or its newest one of the model, not "
                                                f"'{listed[0]}'"):
            session.transport.exchange({name: Message("withdraw_model", {"model": registering.MODEL,
                                                                         "version": listed[0]})})
    return listed


@pytest.mark.slow
@pytest.mark.parametrize("step", registering.KILL_POINTS)
def test_a_master_killed_at_any_step_of_registering_leaves_no_half_version(tmp_path: Path, step: str) -> None:
    first = _run(tmp_path, "none")
    assert first.returncode == 0 and first.stdout.strip() == "v0001", first.stderr
    killed = _run(tmp_path, step)
    assert killed.returncode == -9, killed.stderr  # SIGKILL: no cleanup ran
    master = registering.master_registry(tmp_path)
    committed = step == "committed"
    assert master.versions(registering.MODEL) == (["v0001", "v0002"] if committed else ["v0001"])
    assert master.pending(registering.MODEL) == ([] if committed else ["v0002"])
    assert _every_listed_version_loads_and_predicts_everywhere(tmp_path) == master.versions(registering.MODEL)
    if step == "institution-writing":
        assert any(".v0002.tmp-" in p for p in _leftovers(tmp_path))

    # the next run: withdraws the uncommitted version everywhere, registers anew
    again = _run(tmp_path, "none")
    assert again.returncode == 0, again.stderr
    expected = ["v0001", "v0002", "v0003"] if committed else ["v0001", "v0002"]  # a withdrawn number is free
    assert master.versions(registering.MODEL) == expected and master.pending(registering.MODEL) == []
    for name in registering.NAMES:
        assert ModelRegistry(tmp_path / "registry" / name).versions(registering.MODEL) == expected
    assert _leftovers(tmp_path) == []
    assert _every_listed_version_loads_and_predicts_everywhere(tmp_path) == expected
