"""README's layout names real files: a file it lists that was moved or renamed fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout"):]
    return section[section.index("```") + 3:section.index("```", section.index("```") + 3)]


def test_every_module_the_layout_names_exists() -> None:
    existing = {p.name for top in ("fedcore", "tasks", "flows") for p in (ROOT / top).rglob("*.py")}
    named = set(re.findall(r"\b([a-z_]+\.py)\b", _layout_block()))
    assert len(named) > 40
    assert sorted(named - existing) == []


def test_every_package_the_layout_names_exists() -> None:
    packages = {p.name for top in ("fedcore", "tasks", "flows")
                for p in (ROOT / top).rglob("*") if p.is_dir()}
    named = {m.group(1) for m in re.finditer(r"^\s*([a-z_]+)/\s", _layout_block(), re.MULTILINE)}
    top = {"fedcore", "tasks", "flows", "deployments", "benchmarks", "tests"}
    assert sorted(named - packages - top) == []
