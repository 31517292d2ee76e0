"""A Markdown table printer for benchmark reports (keeps tabulate out of the dependencies)."""

from __future__ import annotations


def markdown_table(rows: list[dict], digits: int = 4) -> str:
    """Rows (dicts with the same keys) as a GitHub Markdown table; floats rounded to `digits`."""
    if not rows:
        return ""
    headers = list(rows[0])

    def cell(value: object) -> str:
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(row.get(h, "")) for h in headers) + " |" for row in rows]
    return "\n".join(lines)
