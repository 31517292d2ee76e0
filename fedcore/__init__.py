"""fedforest's engine: federated random forests and extra-trees (see the README).

Importing fedcore sets where numba caches compiled kernels, unless NUMBA_CACHE_DIR is set already: every
entry point (the CLI, agents, flows, the Python API) then shares one cache, which `make venv` warms
(`python -m fedcore.warmup`). In a source checkout it is the checkout's `.numba_cache/`; in an installed
package, `$XDG_CACHE_HOME/fedforest/numba` (default `~/.cache/fedforest/numba`).

It also makes the OpenMP threads of numba's parallel kernels sleep between kernels (`OMP_WAIT_POLICY=PASSIVE`,
unless set): spinning, they starved the other processes of a busy machine (`--agents local` runs a master and
three agents on one host), and a federated fit of 600 rows took 1.4-7 s instead of 0.2-0.8 s on two shared
cores. Models do not depend on it.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_numba_cache() -> Path:
    """The checkout's .numba_cache when fedcore runs from a writable source checkout, else the user's."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file() and os.access(checkout, os.W_OK):
        return checkout / ".numba_cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedforest" / "numba"


os.environ.setdefault("NUMBA_CACHE_DIR", str(default_numba_cache()))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when numba first starts its OpenMP threads
