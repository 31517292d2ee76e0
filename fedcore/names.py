"""Names that become file or folder names, checked where they enter: the config, a peer's message.

A model, an institution or an alias names a folder or a file; a name from a config or from the master
must not be able to climb out of its folder (`..`, `/`), hide (a leading dot) or smuggle separators.
The one rule for such names is here; a certificate's name, which also becomes a DNS label, has the
stricter `DNS_LABEL`.
"""

from __future__ import annotations

import re

from fedcore.errors import InputError

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
"""A letter or digit, then up to 127 letters, digits, '.', '_' or '-': never '..', '/', or a hidden file."""
SAFE_RULE = ("start with a letter or digit and hold only letters, digits, '.', '_' or '-' (at most 128 "
             "characters)")
"""`SAFE_NAME` in words, for error messages."""
UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
"""A character `SAFE_NAME` never holds (what `fedcore.vertical.persistence` replaces in a file stem)."""
DNS_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}\Z")
"""A safe name that is also a DNS label: no '.', at most 63 characters (a certificate's name)."""


def is_safe_name(value: object) -> bool:
    """Whether `value` is a string that may name a file or folder (`SAFE_NAME`)."""
    return isinstance(value, str) and SAFE_NAME.match(value) is not None


def check_name(value: object, what: str, error: type[Exception] = InputError) -> str:
    """`value` if it may name a file or folder, else `error` naming `what` and the rule."""
    if not is_safe_name(value):
        raise error(f"{what} {value!r} is not a safe name: it becomes a file or folder name, so it must "
                    f"{SAFE_RULE}")
    assert isinstance(value, str)
    return value
