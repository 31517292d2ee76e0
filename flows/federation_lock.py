"""One master run at a time per federation: Prefect's global concurrency limit `fedforest:<federation>`.

Retrain and batch-predict both start the institutions' agents on the ports the federation config names, so two
runs of one federation at once collide there (the second one's agents cannot bind: "Server did not start
properly"). Each master run therefore holds its federation's limit (one slot) from before it starts or reaches
any agent until its session is over, whoever started it: a deployment, `fedforest retrain` or `predict`, or a
flow of your own. A second run waits, and logs which run holds the federation.

Who holds it is recorded in the Prefect variable `fedforest-holder-<federation>` (flow run, lease, host and
process). A run that died holding the slot frees it when its lease lapses (a minute) on a server that keeps
leases (`prefect server start`). Where none does (the ephemeral server of `fedforest retrain`, a restarted
server), the waiting run frees the slot itself, once the holder is known to be gone: its flow run has ended or
no longer exists, it is an earlier attempt of the waiting flow run (a retry), or its process on this host is
dead. A slot whose holder is unknown (none recorded) is never freed by fedforest.
"""

from __future__ import annotations

import contextvars
import datetime
import hashlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any
from uuid import UUID

LIMIT_PREFIX = "fedforest:"
LEASE_S = 60.0
"""How long the server keeps a slot whose holder stopped renewing it (Prefect's minimum); renewed every
third of it."""
POLL_S = 5.0
"""How often a waiting run tries again."""
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def limit_name(federation: str) -> str:
    """The federation's global concurrency limit, `fedforest:<federation>` (banned characters as -)."""
    return LIMIT_PREFIX + re.sub(r"[/%&<>]", "-", federation)


def holder_variable(federation: str) -> str:
    """The Prefect variable naming who holds the federation (lowercase letters, digits, - and _ only).

    A federation name that needs changing for that gets a digest of the original, so two never share one.
    """
    slug = re.sub(r"[^a-z0-9_-]+", "-", federation.lower()).strip("-")[:180]
    if slug != federation:
        slug += "-" + hashlib.sha256(federation.encode()).hexdigest()[:8]
    return f"fedforest-holder-{slug}"


@dataclass(frozen=True)
class Holder:
    """The run that holds a federation, as its Prefect variable records it."""

    flow_run_id: str
    flow_run_name: str
    lease_id: str
    host: str
    pid: int
    since: str

    @classmethod
    def from_value(cls, value: Any) -> Holder | None:
        """The holder a variable's value records (None: nothing, or not a record fedforest wrote)."""
        try:
            return cls(**{k: value[k] for k in ("flow_run_id", "flow_run_name", "lease_id", "host", "pid",
                                                "since")})
        except (KeyError, TypeError):
            return None

    def describe(self, name: str | None = None, state: str | None = None) -> str:
        """`flow run 'retrain churn v0002' (<id>, Running) on host h, process 123, since <time>`."""
        status = f", {state}" if state else ""
        return (f"flow run {name or self.flow_run_name!r} ({self.flow_run_id}{status}) on host {self.host}, "
                f"process {self.pid}, since {self.since}")


def holder_gone(holder: Holder | None, run_state: str | None, run_exists: bool, me: str | None, host: str,
                pid_alive: Callable[[int], bool]) -> str | None:
    """Why `holder` cannot be holding its slot any more, or None while it may be.

    `run_state` is the state type of the holder's flow run (e.g. RUNNING), `run_exists` whether that run is
    still on the server, `me` the waiting flow run's id, `host` the waiting run's host.
    """
    if holder is None:
        return None  # unknown: never freed
    if me is not None and holder.flow_run_id == me:
        return "it is an earlier attempt of this same flow run"
    if not run_exists:
        return "its flow run no longer exists"
    if run_state is not None and run_state in FINAL_STATES:
        return f"its flow run has ended ({run_state.title()})"
    if holder.host == host and not pid_alive(holder.pid):
        return f"its process {holder.pid} on this host is gone"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


@contextmanager
def holding_federation(federation: str, poll_s: float = POLL_S) -> Iterator[None]:
    """Hold the federation's concurrency limit while the block runs, waiting while another run holds it.

    Call it inside a flow run, before any agent is started or reached. It creates the limit (one slot) if the
    server has none; a limit an operator made inactive holds nothing.
    """
    from prefect import get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    logger = get_run_logger()
    name, variable = limit_name(federation), holder_variable(federation)
    me = str(flow_run.id) if flow_run.id else None
    with get_client(sync_client=True) as client:
        _ensure_limit(client, name)
        lease = _acquire(client, federation, me, logger, poll_s)
        if lease is not None:
            holder = Holder(me or "", str(flow_run.name or ""), str(lease), socket.gethostname(), os.getpid(),
                            datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
            _write_holder(client, variable, holder, logger)
    if lease is None:
        logger.warning("concurrency limit %r is inactive: this run does not hold federation %r, and another "
                       "run of it may start its agents on the same ports", name, federation)
        yield
        return
    logger.info("holding federation %r (concurrency limit %r): other retrain and batch-predict runs of it "
                "wait until this run is done with its agents", federation, name)
    keeper = _LeaseKeeper(lease, logger)
    keeper.start()
    try:
        yield
    finally:
        keeper.stop()
        try:
            with get_client(sync_client=True) as client:
                if Holder.from_value(_read_variable(client, variable)) == holder:
                    client.delete_variable_by_name(variable)
                client.release_concurrency_slots_with_lease(lease)
        except Exception as error:  # noqa: BLE001 - the lease lapses by itself within LEASE_S
            logger.warning("could not release federation %r (%s); it frees itself within %d s", federation,
                           error, LEASE_S)


def _ensure_limit(client: Any, name: str) -> None:
    """Create the limit (one slot) unless the server has it (`fedforest deploy` makes it too)."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    try:
        client.read_global_concurrency_limit_by_name(name)
        return
    except ObjectNotFound:
        pass
    try:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    except ObjectAlreadyExists:
        pass  # another run made it meanwhile


def _acquire(client: Any, federation: str, me: str | None, logger: Any, poll_s: float) -> UUID | None:
    """One slot's lease (None: the limit is inactive), waiting and saying for whom while the slot is taken."""
    import httpx
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder

    name, variable = limit_name(federation), holder_variable(federation)
    lease_holder = ConcurrencyLeaseHolder(type="flow_run", id=UUID(me)) if me else None
    said: Any = ()  # what was last logged about the holder, so each holder is named once
    freed: str | None = None  # the gone holder's lease this run released
    while True:
        try:
            response = client.increment_concurrency_slots_with_lease(
                names=[name], slots=1, mode="concurrency", lease_duration=LEASE_S, holder=lease_holder)
        except httpx.HTTPStatusError as error:
            if error.response.status_code != 423:  # 423 Locked: no free slot
                raise
        else:
            body = response.json()
            return UUID(body["lease_id"]) if body.get("limits") else None
        holder = Holder.from_value(_read_variable(client, variable))
        run_name, state, exists = _holder_run(client, holder)
        gone = holder_gone(holder, state, exists, me, socket.gethostname(), pid_alive)
        if gone is None:
            if said != (holder, state):
                said = (holder, state)
                who = (holder.describe(run_name, state and state.title()) if holder else
                       "a run that has not recorded itself (see the concurrency limit in the UI)")
                logger.warning("waiting for federation %r: %s holds it (concurrency limit %r, one run of a "
                               "federation at a time: they share the agents' ports); this run starts once it "
                               "is done", federation, who, name)
        elif holder is not None and freed != holder.lease_id:
            logger.warning("freeing federation %r: %s held it, but %s", federation,
                           holder.describe(run_name, state and state.title()), gone)
            client.release_concurrency_slots_with_lease(UUID(holder.lease_id))
            freed = holder.lease_id
            time.sleep(poll_s)  # a run waiting beside this one may take it meanwhile, and record itself
            continue
        elif holder is not None:
            # its lease was released and the slot is still taken: the server no longer knows that lease
            # (an ephemeral or restarted server), so nothing else would ever free the slot
            from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

            logger.warning("federation %r is still taken by %s, whose lease the server no longer knows; "
                           "resetting concurrency limit %r", federation, holder.describe(run_name), name)
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
            client.delete_variable_by_name(variable)
            freed = None
            continue
        time.sleep(poll_s)


def _holder_run(client: Any, holder: Holder | None) -> tuple[str | None, str | None, bool]:
    """The holder's flow run: (its current name, its state type, whether it exists)."""
    from prefect.exceptions import ObjectNotFound

    if holder is None or not holder.flow_run_id:
        return None, None, True
    try:
        run = client.read_flow_run(UUID(holder.flow_run_id))
    except ObjectNotFound:
        return None, None, False
    return run.name, (run.state.type.value if run.state else None), True


def _read_variable(client: Any, variable: str) -> Any:
    found = client.read_variable_by_name(variable)
    return found.value if found is not None else None


def _write_holder(client: Any, variable: str, holder: Holder, logger: Any) -> None:
    """Record the holder; if that fails, the run still holds the slot (waiting runs then cannot name it)."""
    from prefect.client.schemas.actions import VariableCreate, VariableUpdate

    try:
        if client.read_variable_by_name(variable) is None:
            client.create_variable(VariableCreate(name=variable, value=asdict(holder)))
        else:
            client.update_variable(VariableUpdate(name=variable, value=asdict(holder)))
    except Exception as error:  # noqa: BLE001 - naming the holder must not fail the run
        logger.warning("could not record this run as holding the federation in variable %r: %s", variable,
                       error)


class _LeaseKeeper:
    """Renews a lease every third of LEASE_S from a thread until stopped (a failure is logged once)."""

    def __init__(self, lease: UUID, logger: Any) -> None:
        self.lease, self.logger, self.done = lease, logger, threading.Event()
        context = contextvars.copy_context()  # the flow's Prefect settings (API URL) in the thread too
        self.thread = threading.Thread(target=context.run, args=(self._renew,), daemon=True,
                                       name="fedforest-federation-lease")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def _renew(self) -> None:
        from prefect.client.orchestration import get_client

        warned = False
        with get_client(sync_client=True) as client:
            while not self.done.wait(LEASE_S / 3):
                try:
                    client.renew_concurrency_lease(self.lease, lease_duration=LEASE_S)
                except Exception as error:  # noqa: BLE001 - the run goes on; a waiting run may free the slot
                    if not warned:
                        self.logger.warning("could not renew this run's hold on its federation: %s", error)
                        warned = True
