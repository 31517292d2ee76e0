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
    existing = {p.name for top in ("fedcore", "tasks", "flows", "tools") for p in (ROOT / top).rglob("*.py")}
    named = set(re.findall(r"\b([a-z_]+\.py)\b", _layout_block()))
    assert len(named) > 40
    assert sorted(named - existing) == []


def test_every_package_the_layout_names_exists() -> None:
    packages = {p.name for top in ("fedcore", "tasks", "flows")
                for p in (ROOT / top).rglob("*") if p.is_dir()}
    named = {m.group(1) for m in re.finditer(r"^\s*([a-z_]+)/\s", _layout_block(), re.MULTILINE)}
    top = {"fedcore", "tasks", "flows", "data_contracts", "deployments", "benchmarks", "tools", "tests"}
    assert sorted(named - packages - top) == []


def _expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> `a/b.py`, `a/c.py`."""
    match = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path)
    return [f"{match[1]}{name}{match[3]}" for name in match[2].split(",")] if match else [path]


def test_the_protocol_pages_where_each_step_lives_name_real_files() -> None:
    for page in ("docs/protocol.md", "docs/horizontal.md"):
        text = (ROOT / page).read_text()
        section = text[text.index("## Where each step lives"):]
        section = section[:section.index("\n## ", 1)]
        cited = re.findall(r"`((?:fedcore|tasks|flows)/[^`\s]+\.py)`", section)
        named = {path for raw in cited for path in _expand(raw)}
        assert len(named) > 10, page
        assert sorted(p for p in named if not (ROOT / p).is_file()) == [], page


def test_the_layout_names_every_module() -> None:
    """A new module is named in the layout, so a newcomer finds it from README alone."""
    named = set(re.findall(r"\b([a-z_0-9]+\.py)\b", _layout_block()))
    modules = {p.relative_to(ROOT).as_posix() for top in ("fedcore", "tasks", "flows")
               for p in (ROOT / top).rglob("*.py") if p.name != "__init__.py"}
    assert sorted(m for m in modules if m.rsplit("/", 1)[-1] not in named) == []
