"""How many trees grow together: tree batches sized from a memory budget, at the master and every party.

Growing a batch of T trees costs each party memory in proportion to T x its rows (the row partition of
every tree; `BYTES_PER_TREE_ROW` per setting, measured, see docs/benchmarks.md), and the master in
proportion to T x the open nodes of a level. Every role states its budget (a configured number of
bytes, or by default `DEFAULT_SHARE` of the memory this process may still use, `available_bytes`); each
party reports its budget and rows in its opening reply, and the master plans the largest batch every role
can hold (`trees_per_batch`). The simulator runs every role in one process: their costs add up against one
budget. A user's `tree_batch_size` overrides the plan.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fedcore.errors import ParameterError, ProtocolError

if TYPE_CHECKING:
    from fedcore.protocol.messages import Message

DEFAULT_SHARE = 0.5
"""Share of the available memory a role plans to use by default: the rest is for the data itself,
message buffers in flight and the rest of the machine."""

BYTES_PER_TREE_ROW = {"vertical": 40, "horizontal": 16}
"""A party's growth state per tree of a batch and row: vertical (SamplePartition) sample order, weight
and label, double-buffered (32 bytes) plus partition bitmaps and bootstrap counts; horizontal: the row
order of the open nodes' segments (4 bytes), LDP's row positions (4 more) and room for the level's
replies. Upper bounds: benchmarks/bench_memory.py measured 26 and 7 at 10M rows (docs/benchmarks.md)."""

MIB = 1 << 20


class BudgetParams(Protocol):
    """What a batch plan reads of a setting's parameters (`fedcore.trees.params.TreeParams` has both)."""

    @property
    def memory_budget_mb(self) -> int | None:
        """The configured budget in MiB, or None for the default share."""

    @property
    def depth_limit(self) -> int:
        """The deepest level a tree can reach."""


def available_bytes() -> int:
    """Memory this process may still allocate.

    The smallest of the system's available memory, the cgroup limit's headroom and the address-space limit's
    headroom (RLIMIT_AS).
    """
    candidates = [_meminfo_available()]
    candidates.append(_cgroup_headroom())
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        candidates.append(soft - _virtual_size())
    found = [c for c in candidates if c is not None]
    return max(0, min(found)) if found else 4 << 30


def default_budget() -> int:
    """The default memory budget of a role: `DEFAULT_SHARE` of `available_bytes()`."""
    return int(available_bytes() * DEFAULT_SHARE)


def resolve_budget(memory_budget_mb: int | None) -> int:
    """A role's budget in bytes: the configured MiB, or the default share of the available memory."""
    if memory_budget_mb is None:
        return default_budget()
    if isinstance(memory_budget_mb, bool) or not isinstance(memory_budget_mb, int) or memory_budget_mb < 1:
        raise ParameterError(f"memory_budget_mb must be a positive integer (MiB), got {memory_budget_mb!r}")
    return memory_budget_mb * MIB


def batch_costs(setting: str, params: BudgetParams, party_rows: Mapping[str, int],
                party_budgets: Mapping[str, int], *, node_bound: int, master_bytes_per_node: int,
                party_bytes_per_node: int = 0, own_budget: int | None = None) -> list[tuple[int, int]]:
    """(bytes per tree of a batch, budget) of every party and of the master, for either setting's master.

    Per tree, a party's cost is its rows times `BYTES_PER_TREE_ROW[setting]`, plus `party_bytes_per_node`
    times the most open nodes one tree can have at a level (`level_nodes` of the depth limit and
    `node_bound`); the master's is `master_bytes_per_node` times those nodes. The master's budget is
    `own_budget`, or the one `params.memory_budget_mb` resolves to.
    """
    own = own_budget or resolve_budget(params.memory_budget_mb)
    nodes = level_nodes(params.depth_limit, node_bound)
    return role_costs(party_rows, party_budgets, BYTES_PER_TREE_ROW[setting], nodes * master_bytes_per_node,
                      own, party_per_tree=nodes * party_bytes_per_node)


def role_costs(party_rows: Mapping[str, int], party_budgets: Mapping[str, int], bytes_per_row: int,
               master_per_tree: int, own_budget: int, party_per_tree: int = 0) -> list[tuple[int, int]]:
    """(bytes per tree of a batch, budget) of every party, from its rows, and of the master.

    `party_per_tree` is what every party holds per tree besides its rows' share. A party that reported no
    budget is planned with the master's.
    """
    costs = [(rows * bytes_per_row + party_per_tree, party_budgets.get(name) or own_budget)
             for name, rows in party_rows.items()]
    return [*costs, (master_per_tree, own_budget)]


def level_nodes(depth_limit: int, node_bound: int) -> int:
    """The most open nodes one tree can have at a level: 2^depth, and at most `node_bound` (from its rows)."""
    return min(2 ** min(depth_limit, 40), max(1, node_bound))


def reported_budget(party: str, header: dict) -> int:
    """A party's reported memory budget in bytes (0: none reported).

    Anything but a non-negative integer is refused, naming the party.
    """
    value = header.get("memory_budget", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"party {party!r} reported memory_budget {value!r}; expected a number of bytes")
    return value


def reported_budgets(replies: Mapping[str, Message]) -> dict[str, int]:
    """Every party's reported memory budget in bytes, from its opening reply (`reported_budget`)."""
    return {name: reported_budget(name, reply.header) for name, reply in replies.items()}


def trees_per_batch(n_trees: int, costs: list[tuple[int, int]], shared_budget: int | None = None) -> int:
    """The largest batch (1..n_trees) within every role's budget.

    `costs` holds (bytes per tree, budget) per role. With `shared_budget` every role runs in one process (the
    simulator): their costs add up against that one budget instead. At least one tree per batch, even when a
    single tree exceeds a budget (growth then pages).
    """
    if shared_budget is not None:
        costs = [(sum(per_tree for per_tree, _ in costs), shared_budget)]
    fit = n_trees
    for per_tree, budget in costs:
        if per_tree > 0:
            fit = min(fit, budget // per_tree)
    return int(max(1, fit))


def _meminfo_available() -> int | None:
    available = _proc_kib("/proc/meminfo", "MemAvailable:")
    if available is not None:
        return available
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_headroom() -> int | None:
    """The cgroup v2 memory.max minus memory.current, when this process runs under a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def _virtual_size() -> int:
    """This process's current address-space size (VmSize), 0 when unknown."""
    return _proc_kib("/proc/self/status", "VmSize:") or 0


def _proc_kib(path: str, key: str) -> int | None:
    """The bytes of a `key: N kB` line of a /proc file, None when the file or the line is missing."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
