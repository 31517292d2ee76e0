"""CSV files as real exports write them: separator, decimal mark, encoding, quote character, null markers.

In a config, `institutions[].data` or `predict_data` is `{csv: {path: data/bank/*.csv, sep: ";",
decimal: ",", encoding: latin-1, quotechar: "'", na_values: ["n/a", "-"]}}` (every key but `path`
optional); on the command line (`fedforest contract infer|check`, `fedforest simulate`) the same options
are `--sep`, `--decimal`, `--encoding`, `--quotechar` and `--na-value`. A file read with the wrong
separator comes out as one column whose name holds the real separator: `check_separator` refuses it,
naming the separator to set.
"""

from __future__ import annotations

import argparse
import codecs
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fedcore.errors import ConfigError, DataReadError

SEPARATORS = (";", "\t", "|", ",")
"""What a one-column header is searched for: the separators real exports use."""
_KEYS = ("path", "sep", "decimal", "encoding", "quotechar", "na_values")


@dataclass(frozen=True)
class CsvDialect:
    """How a CSV file is written; the defaults are pandas' (`,`, `.`, UTF-8, `"`, its own null markers)."""

    sep: str = ","
    decimal: str = "."
    encoding: str = "utf-8"
    quotechar: str = '"'
    na_values: tuple[str, ...] = ()
    """Extra strings read as missing, besides pandas' own ("", "NA", "NaN", "null", ...)."""

    def read_options(self) -> dict[str, Any]:
        """Keyword arguments of `pandas.read_csv`."""
        return {"sep": self.sep, "decimal": self.decimal, "encoding": self.encoding,
                "quotechar": self.quotechar, "na_values": list(self.na_values) or None}


@dataclass(frozen=True)
class CsvSource:
    """CSV files (a path or glob, resolved against the config) and the dialect they are written in."""

    path: str
    dialect: CsvDialect

    def describe(self) -> str:
        """The files, as errors and logs name them."""
        return repr(self.path)


def check_dialect(sep: str, decimal: str, encoding: str, quotechar: str, where: str,
                  error: Callable[[str], Exception] = ConfigError) -> CsvDialect:
    """The dialect, each character option one character and the encoding one Python knows."""
    values = {"sep": sep, "decimal": decimal, "quotechar": quotechar}
    for key, value in values.items():
        if not isinstance(value, str) or len(value) != 1:
            raise error(f"{where}: {key} must be one character (for a tab: \"\\t\"), found {value!r}")
    if sep == decimal:
        raise error(f"{where}: sep and decimal are both {sep!r}; a file cannot use one character for both")
    try:
        codecs.lookup(str(encoding))
    except LookupError:
        raise error(f"{where}: unknown encoding {encoding!r}; use one such as utf-8, latin-1 or cp1252") \
            from None
    return CsvDialect(sep=sep, decimal=decimal, encoding=str(encoding), quotechar=quotechar)


def parse_csv(value: Any, where: str, resolve: Callable[[str], Any]) -> CsvSource:
    """`{csv: {path: ..., sep: ..., ...}}` from a config, checked; `resolve` makes the path absolute."""
    body = value.get("csv") if isinstance(value, dict) and set(value) == {"csv"} else None
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected {{csv: {{path: files.csv, sep: ';', ...}}}}")
    unknown = sorted(str(k) for k in set(body) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown csv setting {unknown[0]!r}; known: {list(_KEYS)}")
    path = body.get("path")
    if not isinstance(path, str) or not path.lower().endswith(".csv"):
        raise ConfigError(f"{where}: csv.path must name .csv files (a path or glob), found {path!r}")
    defaults = CsvDialect()
    dialect = check_dialect(body.get("sep", defaults.sep), body.get("decimal", defaults.decimal),
                            body.get("encoding", defaults.encoding),
                            body.get("quotechar", defaults.quotechar), f"{where}: csv")
    na_values = body.get("na_values", [])
    if not isinstance(na_values, list) or not all(isinstance(v, str) for v in na_values):
        raise ConfigError(f"{where}: csv.na_values must be a list of strings, found {na_values!r}")
    return CsvSource(str(resolve(path)), CsvDialect(**{**dialect.__dict__, "na_values": tuple(na_values)}))


def add_dialect_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--sep`, `--decimal`, `--encoding`, `--quotechar`, `--na-value` options of a CSV reader."""
    group = parser.add_argument_group("CSV files", "how a .csv file is written (ignored for Parquet)")
    group.add_argument("--sep", default=",", metavar="C",
                       help="the column separator (default ','; a tab: \\t)")
    group.add_argument("--decimal", default=".", metavar="C", help="the decimal mark (default '.')")
    group.add_argument("--encoding", default="utf-8", help="the text encoding (default utf-8)")
    group.add_argument("--quotechar", default='"', metavar="C", help="the quote character (default \")")
    group.add_argument("--na-value", dest="na_values", action="append", default=[], metavar="TEXT",
                       help="a string that marks a missing value (repeatable), besides pandas' own")


def dialect_from_args(args: argparse.Namespace) -> CsvDialect:
    """The dialect the command-line options give (a backslash-t or `tab` for a tab)."""
    from fedcore.errors import InputError

    def char(value: str) -> str:
        return "\t" if value in ("\\t", "tab") else value

    dialect = check_dialect(char(args.sep), char(args.decimal), args.encoding, char(args.quotechar),
                            "the CSV options", error=InputError)
    return CsvDialect(**{**dialect.__dict__, "na_values": tuple(args.na_values)})


def read_csv(path: str, dialect: CsvDialect | None = None) -> pd.DataFrame:
    """A CSV file read in `dialect` (default: pandas'), refused if it reads as one column of many names."""
    dialect = dialect or CsvDialect()
    try:
        frame = pd.read_csv(path, **dialect.read_options())
    except UnicodeDecodeError as error:
        raise DataReadError(f"cannot read {str(path)!r}: it is not {dialect.encoding} text (byte "
                            f"0x{error.object[error.start:error.start + 1].hex()}): "
                            "set its encoding: pass --encoding latin-1 (or cp1252, ...), or in "
                            "federation.yaml write data as {csv: {path: ..., encoding: latin-1}}") from None
    check_separator(frame, path, dialect)
    return frame


def check_separator(frame: pd.DataFrame, path: str, dialect: CsvDialect) -> None:
    """Refuse a file that read as one column whose name holds another separator, naming the one to set."""
    if frame.shape[1] != 1:
        return
    name = str(frame.columns[0])
    found = [s for s in SEPARATORS if s != dialect.sep and s in name]
    if not found:
        return
    guess = max(found, key=name.count)
    flag = "'\\t'" if guess == "\t" else repr(guess)
    raise DataReadError(f"cannot read {str(path)!r}: it reads as one column {name!r} with the separator "
                        f"{dialect.sep!r}; the separator is probably {guess!r}: pass --sep {flag}, or in "
                        f"federation.yaml write data as {{csv: {{path: ..., sep: {flag}}}}}")
