"""fedforest's engine: federated random forests and extra-trees (see the README).

Importing fedcore sets where numba caches compiled kernels, unless NUMBA_CACHE_DIR is set already: every
entry point (the CLI, agents, flows, the Python API) then shares one cache, which `make venv` warms
(`python -m fedcore.warmup`). In a source checkout it is the checkout's `.numba_cache/`; in an installed
package, `$XDG_CACHE_HOME/fedforest/numba` (default `~/.cache/fedforest/numba`); in either, a folder named
by `source_stamp` (the sources' contents), so that any change of fedcore's sources starts a fresh cache
(numba checks only the file a kernel is defined in, and a kernel keeps the compiled code of another
module's kernel it calls: a stale one trained wrong, run-to-run different forests after an update). The
folders of other stamps are removed when a new one is made.

It also makes the OpenMP threads of numba's parallel kernels sleep between kernels (`OMP_WAIT_POLICY=PASSIVE`,
unless set): spinning, they starved the other processes of a busy machine (`--agents local` runs a master and
three agents on one host), and a federated fit of 600 rows took 1.4-7 s instead of 0.2-0.8 s on two shared
cores. Models do not depend on it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def source_stamp(package: Path | None = None) -> str:
    """16 hex digits over every source file of `package` (default fedcore): its path and its bytes.

    Contents, not modification times: a fresh checkout or another worktree of the same sources finds the
    same kernels (about 20 ms a process for fedcore's 200 files).
    """
    package = package or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        source = path.read_bytes()
        digest.update(f"{path.relative_to(package).as_posix()}|{len(source)}|".encode())
        digest.update(source)
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """The checkout's .numba_cache when fedcore runs from a writable source checkout, else the user's."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file() and os.access(checkout, os.W_OK):
        return checkout / ".numba_cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedforest" / "numba"


def default_numba_cache() -> Path:
    """This source's kernel cache: a folder of `cache_root()` named by `source_stamp()`."""
    return cache_root() / source_stamp()


def prune_other_caches(keep: Path) -> None:
    """Once `keep` is new: remove everything else in its parent (other sources' caches), then make it."""
    if keep.is_dir():
        return
    if keep.parent.is_dir():
        for entry in keep.parent.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    keep.mkdir(parents=True, exist_ok=True)


if "NUMBA_CACHE_DIR" not in os.environ:
    _CACHE = default_numba_cache()
    prune_other_caches(_CACHE)
    os.environ["NUMBA_CACHE_DIR"] = str(_CACHE)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when numba first starts its OpenMP threads
