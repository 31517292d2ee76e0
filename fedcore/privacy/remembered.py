"""The DP accountant's answers kept on disk, so that a process's first DP fit need not import dp-accounting.

dp-accounting's PLD accountant imports scipy's statistics, signal and optimisation packages: 1-2 s of CPU in a
fresh process, more than a small DP fit takes. Its answers about one Gaussian mechanism (the noise multiplier
calibrated to (epsilon, delta); the epsilon of a multiplier at delta) are kept in `dp_accounting.json` in
fedforest's cache folder (the kernel cache's, named by the sources' stamp: a change of fedcore starts afresh),
keyed by the question, its arguments, dp-accounting's version and the discretisation, and reused as they are:
the same float the accountant returned.

A kept answer is used only after it passes the exact analytic Gaussian bound (Balle and Wang, ICML 2018,
Theorem 8: a Gaussian of noise multiplier z is (epsilon, delta)-DP iff Phi(-epsilon z + 1/(2z)) - e^epsilon
Phi(-epsilon z - 1/(2z)) <= delta): a multiplier must give (epsilon, delta)-DP, an epsilon must be at least
the mechanism's true one at delta. The PLD accountant is pessimistic, so its own answers pass (relative
margins of 1e-9 and more against rounding errors near 1e-13); an answer edited to claim less noise, or less
spent, than the mechanism needs fails, and the accountant is asked again.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

FILE_NAME = "dp_accounting.json"
_kept: dict[str, float] | None = None
_LOCK = threading.Lock()


def gaussian_delta(epsilon: float, multiplier: float) -> float:
    """The least delta at which a Gaussian of noise multiplier z (sigma / L2 sensitivity) is epsilon-DP.

    Balle and Wang's exact bound (see the module doc); NaN where it cannot be computed in floats (e^epsilon
    overflowing), which no check passes.
    """
    try:
        a, b = -epsilon * multiplier, 1 / (2 * multiplier)
        return _phi(a + b) - math.exp(epsilon) * _phi(a - b)
    except (OverflowError, ZeroDivisionError, ValueError):
        return math.nan


def _phi(x: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


def remembered(question: str, arguments: tuple[float, ...], ask: Callable[[], float],
               holds: Callable[[float], bool], version: str) -> float:
    """The kept answer to `question` about `arguments` if `holds` accepts it, else `ask()`'s, then kept.

    `version` names what answers (dp-accounting's version and settings): answers of another are not reused.
    """
    key = "|".join((question, *(repr(float(a)) for a in arguments), version))
    with _LOCK:  # parties of one process may plan side by side, in threads
        kept = _load()
        answer = kept.get(key)
        if isinstance(answer, float) and holds(answer):
            return answer
        answer = float(ask())
        kept[key] = answer
        _store(kept)
        return answer


def _path() -> Path | None:
    """The file in fedforest's cache folder (NUMBA_CACHE_DIR, which importing fedcore sets); None if unset."""
    folder = os.environ.get("NUMBA_CACHE_DIR")
    return Path(folder) / FILE_NAME if folder else None


def _load() -> dict[str, float]:
    """The kept answers, read once per process (none if the file is missing or unreadable)."""
    global _kept
    if _kept is None:
        _kept = {}
        path = _path()
        try:
            stored = json.loads(path.read_text()) if path is not None and path.is_file() else {}
        except (OSError, ValueError):
            stored = {}
        if isinstance(stored, dict):
            _kept = {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, float)}
    return _kept


def _store(kept: dict[str, float]) -> None:
    """Write the answers whole (a temporary file renamed over the old one); a read-only folder keeps none."""
    path = _path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{FILE_NAME}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(kept, sort_keys=True))
        os.replace(temporary, path)
    except OSError:
        pass
