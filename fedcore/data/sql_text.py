"""Where a PostgreSQL query's `:name` placeholders are, and the query with them numbered `$1`, `$2`, ...

A `:name` counts only in SQL text proper: never inside a quoted literal (`'...'`, `E'...'` with backslash
escapes), a quoted identifier (`"..."`), a `-- line comment`, a `/* block comment */` (nested, as
PostgreSQL nests them), a dollar-quoted string (`$$...$$`, `$tag$...$tag$`), nor as the second colon of a
`::` cast. So a `:since` written in a comment or a function body is neither bound nor refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_START = re.compile(r"""(?<![\w$])[Ee]'|'|"|--|/\*|::|(?<![\w$])\$(?:[^\W\d]\w*)?\$"""
                    r"|:([A-Za-z_][A-Za-z0-9_]*)")
"""What opens a span without placeholders (a dollar quote or escape string not glued to an identifier,
as PostgreSQL's lexer reads them), or a placeholder (group 1)."""
_ENDS = {"'": re.compile(r"(?:[^']|'')*'"), '"': re.compile(r'(?:[^"]|"")*"'),
         "e'": re.compile(r"(?:[^'\\]|\\.|'')*'", re.DOTALL), "--": re.compile(r"[^\n]*")}
"""The rest of a literal, identifier, escape string or line comment after its opening."""
_NESTED = re.compile(r"/\*|\*/")


def placeholder_spans(query: str) -> Iterator[tuple[int, int, str]]:
    """Each `:name` placeholder of `query` as (start, end, name), in order; unterminated text holds none."""
    pos = 0
    while (match := _START.search(query, pos)) is not None:
        token, pos = match[0], match.end()
        if match[1]:
            yield match.start(), pos, match[1]
        elif token == "/*":
            depth = 1
            while depth and (inner := _NESTED.search(query, pos)) is not None:
                depth += 1 if inner[0] == "/*" else -1
                pos = inner.end()
            pos = pos if depth == 0 else len(query)
        elif token.startswith("$"):
            end = query.find(token, pos)
            pos = len(query) if end < 0 else end + len(token)
        elif token != "::":
            rest = _ENDS[token.lower()].match(query, pos)
            pos = len(query) if rest is None else rest.end()


def placeholders(query: str) -> tuple[str, ...]:
    """The distinct `:name` placeholders of `query`, in order of first use."""
    return tuple(dict.fromkeys(name for _, _, name in placeholder_spans(query)))


def numbered(query: str, names: tuple[str, ...]) -> str:
    """`query` with each placeholder in `names` as `$<its index in names + 1>`; others stay as written."""
    parts, last = [], 0
    for start, end, name in placeholder_spans(query):
        if name in names:
            parts += [query[last:start], f"${names.index(name) + 1}"]
            last = end
    return "".join(parts) + query[last:]
