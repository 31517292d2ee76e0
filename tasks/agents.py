"""Starting institution agents and connecting to them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect import get_run_logger, task

from fedcore.config import FederationConfig
from fedcore.errors import AgentRunEnded, CertificateRefused, FedForestError, PartyUnavailable
from fedcore.protocol.messages import Message
from fedcore.transport.flight import FlightTransport
from tasks.common import DATA_LOCAL

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

STARTED = "--- agent started for"
"""The line a master writes to an agent's (appended) log before starting it: what follows is this run's."""


@task(**DATA_LOCAL)
def start_local_agents(config: FederationConfig, log_dir: Path) -> list[subprocess.Popen]:
    """Start `fedforest agent serve` for every institution as a local process (the embedded default).

    Each agent watches this process (`--parent-pid`): if the master dies without stopping them (kill -9),
    they stop by themselves within a second and free their ports for the agents of the restarted master.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    for inst in config.institutions:
        log_path = log_dir / f"agent-{inst.name}.log"
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            # this run's part begins
            log.write(f"{STARTED} {inst.name} by master pid {os.getpid()}\n".encode())
            log.flush()
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "fedcore.cli", "agent", "serve", "--config", str(config.path),
                 "--institution", inst.name, "--parent-pid", str(os.getpid())],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}))
        get_run_logger().info("started agent for %s (pid %d), log %s", inst.name, processes[-1].pid, log_path)
    return processes


def wait_until_serving(config: FederationConfig, processes: list[subprocess.Popen], log_dir: Path,
                       timeout_s: float = 60.0) -> None:
    """Wait until every local agent says it is serving.

    If one exits first (its port is taken, by another run's agent perhaps), raise with what it said, before
    this master can reach a stranger on that port.
    """
    deadline = time.monotonic() + timeout_s
    pending = dict(zip((inst.name for inst in config.institutions), processes, strict=True))
    while pending:
        for name, process in list(pending.items()):
            log_path = log_dir / f"agent-{name}.log"
            said = (log_path.read_text(errors="replace").rsplit(f"{STARTED} {name} ", 1)[-1]
                    if log_path.exists() else "")
            if f"agent {name!r} (" in said and " serving on " in said:
                del pending[name]
            elif process.poll() is not None:
                last = [line for line in said.splitlines() if line.strip()][-1:] or ["(no output)"]
                raise PartyUnavailable(f"the agent this run started for {name!r} exited (code "
                                       f"{process.returncode}) before serving: {last[0].strip()}; is another "
                                       f"run's agent holding {config.institution(name).endpoint}? "
                                       f"(log {log_path})")
        if pending and time.monotonic() > deadline:
            raise PartyUnavailable(f"the agents this run started for {sorted(pending)} did not start serving "
                                   f"within {timeout_s:g} s (logs in {log_dir})")
        time.sleep(0.1)


def stop_local_agents(processes: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Terminate local agents and wait for them; kill any that do not stop."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def agent_run_name(institution: str, purpose: str | None) -> str | None:
    """An agent flow run's name in the UI, `bank: retrain churn-90d v0002`; None (Prefect's) without one."""
    return f"{institution}: {purpose}" if purpose else None


@task(**DATA_LOCAL)
def trigger_agent_deployments(config: FederationConfig, flow_name: str = "institution-agent",
                              purpose: str | None = None) -> dict[str, str]:
    """Start each institution's agent flow on its own work pool (production); returns {institution: run id}.

    Each run uses its deployment's own `config_path` (the institution's host has its own copy of the
    federation config); the runs show as subflows of the master's run in the UI, named after the institution
    and `purpose` (`bank: retrain churn-90d`, `agent_run_name`) rather than Prefect's random names.
    """
    from prefect.deployments import run_deployment

    runs = {}
    for inst in config.institutions:
        # a FlowRun when called from sync code (Prefect's async_dispatch types it as FlowRun or a coroutine)
        run = cast("FlowRun", run_deployment(f"{flow_name}/{inst.name}", timeout=0, as_subflow=True,
                                             parameters={"institution": inst.name},
                                             flow_run_name=agent_run_name(inst.name, purpose)))
        get_run_logger().info("started %s's agent: flow run %s on work pool %r", inst.name, run.id,
                              inst.work_pool)
        runs[inst.name] = str(run.id)
    return runs


NOT_PICKED_UP = ("Scheduled", "Late")
"""States of a flow run no worker has picked up yet (Late: Prefect's name for one past its start time)."""


def name_agent_runs(runs: Mapping[str, str], purpose: str,
                    rename: Callable[[str, str], None] | None = None,
                    logger: logging.Logger | logging.LoggerAdapter | None = None) -> None:
    """Rename the agent flow runs ({institution: run id}) `<institution>: <purpose>`, once it is known.

    For example `bank: retrain churn-90d v0002` once the version is registered. The names are for people:
    a failure is logged, never raised. `rename(run id, name)` defaults to the Prefect server's.
    """
    if not runs:
        return
    try:
        with nullcontext(rename) if rename else _flow_run_renamer() as apply:
            for institution, run_id in runs.items():
                apply(run_id, f"{institution}: {purpose}")
    except Exception as error:  # noqa: BLE001 - an unreachable API must not fail a trained run
        (logger or get_run_logger()).warning("could not rename the agent flow runs %r: %s", purpose, error)


@contextmanager
def _flow_run_renamer() -> Iterator[Callable[[str, str], None]]:
    """A function renaming flow runs by id over one Prefect client, open while the context lasts."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:

        def rename(run_id: str, name: str) -> None:
            client.update_flow_run(UUID(run_id), name=name)

        yield rename


def ended_agent_run(runs: dict[str, str], read_flow_run: Callable[[str], Any] | None = None,
                    every_s: float = 1.0, *, late_after_s: float | None = None,
                    pools: Mapping[str, str | None] | None = None,
                    describe_pool: Callable[[str], str] | None = None,
                    now: Callable[[], datetime] | None = None) -> Callable[[], str | None]:
    """A check for `FlightTransport.wait_ready(gave_up=...)`: why an agent will never serve, or None.

    The first agent flow run (of {institution: run id}) that has reached a final state before its agent
    served, with that run's own error quoted. With `late_after_s`, also the first that no worker picked up
    that long after its scheduled start (still Scheduled, or Late), naming its work pool (`pools`:
    {institution: pool}) and what `describe_pool` (default: the Prefect server, `work_pool_status`) says
    of its workers. Reads the runs at most every `every_s` seconds.
    """
    read_flow_run = read_flow_run or _read_flow_run
    describe_pool = describe_pool or work_pool_status
    now = now or (lambda: datetime.now(UTC))
    last = {"at": float("-inf")}

    def check() -> str | None:
        if time.monotonic() - last["at"] < every_s:
            return None
        last["at"] = time.monotonic()
        for name, run_id in runs.items():
            run = read_flow_run(run_id)
            state = run.state
            if state is not None and state.is_final():
                said = (state.message or "no message").strip()
                return (f"institution {name!r}: its agent flow run {run.name} ({run_id}) ended {state.name} "
                        f"before its agent served: {said}")
            waited = _waiting_for_a_worker(run, now())
            if late_after_s is not None and waited is not None and waited >= late_after_s:
                pool = (pools or {}).get(name)
                where = describe_pool(pool) if pool else "it has no work pool configured (work_pool)"
                return (f"institution {name!r}: its agent flow run {run.name} ({run_id}) is still "
                        f"{state.name} {waited:.0f} s after it was scheduled: {where} "
                        f"(training.agent_late_timeout_s={late_after_s:g})")
        return None

    return check


def _waiting_for_a_worker(run: Any, now: datetime) -> float | None:
    """Seconds a run not yet picked up by a worker has been past its scheduled start; None once picked up."""
    state = run.state
    if state is None or state.name not in NOT_PICKED_UP:
        return None
    start = getattr(run, "expected_start_time", None) or getattr(
        getattr(state, "state_details", None), "scheduled_time", None)
    return None if start is None else max(0.0, (now - start).total_seconds())


def work_pool_status(pool: str) -> str:
    """What the Prefect server says of work pool `pool` and its workers, as a clause for an error message."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            work_pool = client.read_work_pool(pool)
            workers = client.read_workers_for_work_pool(pool)
    except ObjectNotFound:
        return f"work pool {pool!r} does not exist on the Prefect server (deploy the federation's pools)"
    except Exception as error:  # noqa: BLE001 - the message still names the pool; the reason why is extra
        return f"work pool {pool!r} could not be read ({type(error).__name__}); is a worker polling it?"
    return pool_reading(pool, work_pool, workers)


def pool_reading(pool: str, work_pool: Any, workers: list[Any], now: datetime | None = None) -> str:
    """`work_pool_status` from a read work pool and its workers (Prefect's `WorkPool`, `Worker`).

    A worker stopped a moment ago still shows online until it misses its heartbeats (about 90 s), so
    online workers are given with when they were last seen.
    """
    now = now or datetime.now(UTC)
    if getattr(work_pool, "is_paused", False):
        return f"work pool {pool!r} is paused (resume it: prefect work-pool resume {pool})"
    online = [w for w in workers if str(getattr(w.status, "value", w.status)).upper() == "ONLINE"]
    if online:
        count = f"{len(online)} online worker{'s' if len(online) > 1 else ''}"
        names = ", ".join(f"{w.name} last seen {_ago(w.last_heartbeat_time, now)}" for w in online)
        return (f"work pool {pool!r} has {count} ({names}), which did not pick it up: stopped since, busy, "
                "or at a concurrency limit?")
    heard = [w.last_heartbeat_time for w in workers if w.last_heartbeat_time is not None]
    seen = (f"its last worker was seen {max(heard).astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if heard
            else "no worker ever polled it")
    return (f"no worker is polling work pool {pool!r} ({seen}); start one on the institution's host: "
            f"prefect worker start --pool {pool}")


def _ago(when: datetime | None, now: datetime) -> str:
    """`12 s ago`, or `never`."""
    return "never" if when is None else f"{max(0.0, (now - when).total_seconds()):.0f} s ago"


def wait_for_agent_runs(run_ids: list[str], timeout_s: float = 60.0, poll_s: float = 1.0, *,
                        read_flow_run: Callable[[str], Any] | None = None,
                        cancel: Callable[[list[str], str], list[str]] | None = None,
                        logger: logging.Logger | logging.LoggerAdapter | None = None) -> dict[str, str]:
    """Wait until the agents' flow runs reach a final state.

    Log and return {run id: state name}. A run still going after `timeout_s` is cancelled: its session is
    over, and it would hold its institution's port until its idle timeout. `read_flow_run`, `cancel` and
    `logger` default to the Prefect server's and the run logger (tests pass their own).
    """
    log = logger or get_run_logger()
    deadline = time.monotonic() + timeout_s
    with nullcontext(read_flow_run) if read_flow_run else flow_run_reader() as read:
        while True:
            runs = [read(run_id) for run_id in run_ids]
            if all(_is_final(r) for r in runs) or time.monotonic() > deadline:
                break
            time.sleep(poll_s)
    states = {run_id: r.state.name if r.state else "unknown" for run_id, r in zip(run_ids, runs, strict=True)}
    for run_id, run in zip(run_ids, runs, strict=True):
        level = logging.INFO if _is_final(run) and run.state.is_completed() else logging.WARNING
        log.log(level, "agent flow run %s (%s): %s", run.name, run_id,
                states[run_id] if _is_final(run) else f"still {states[run_id]} after {timeout_s:g} s")
    still_going = [run_id for run_id, run in zip(run_ids, runs, strict=True) if not _is_final(run)]
    why = f"the master's session ended and this agent run had not stopped {timeout_s:g} s later"
    if still_going and cancel is not None:
        cancel(still_going, why)
    elif still_going:
        cancel_agent_runs(still_going, why, logger=log)
    return states


def _is_final(run: Any) -> bool:
    """Whether a flow run has reached a final state (completed, failed, crashed or cancelled)."""
    return run.state is not None and run.state.is_final()


def cancel_agent_runs(run_ids: list[str], why: str,
                      logger: logging.Logger | logging.LoggerAdapter | None = None) -> list[str]:
    """Cancel the agent flow runs among `run_ids` that have not ended, logging `why`; return those cancelled.

    Their worker stops them. Used when no session can start (an agent run failed first, so the
    others would wait out their idle timeout on their ports) or a run outlives its session.
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    cancelled = []
    with get_client(sync_client=True) as client:
        for run_id in run_ids:
            run = client.read_flow_run(UUID(run_id))
            if run.state is not None and run.state.is_final():
                continue
            client.set_flow_run_state(run_id, Cancelling(message=f"cancelled by the master: {why}"),
                                      force=True)
            log = logger or get_run_logger()
            log.warning("cancelled agent flow run %s (%s): %s", run.name, run_id, why)
            cancelled.append(run_id)
    return cancelled


def release_agents(transport: FlightTransport) -> None:
    """Tell every agent the session is over, so none waits for a master that has finished or failed.

    Best effort: some may be gone.
    """
    timeout_s = getattr(transport, "timeout_s", None)
    if timeout_s is not None:
        transport.timeout_s = min(timeout_s, 10.0)  # a hung agent must not hold the master
    for party in transport.parties:
        try:
            transport.exchange({party: Message("close")})
        except FedForestError:
            pass


def agent_run_states(config: FederationConfig, runs: dict[str, str],
                     read_flow_run: Callable[[str], Any] | None = None) -> str:
    """Where each agent flow run stands, for a master that gave up waiting.

    A run still scheduled or pending has not been picked up by a worker of its institution's pool.
    """
    read_flow_run = read_flow_run or _read_flow_run
    parts = []
    for name, run_id in runs.items():
        state = read_flow_run(run_id).state
        label = state.name if state is not None else "unknown"
        hint = (f" (is a worker polling work pool {config.institution(name).work_pool!r}?)"
                if label in ("Scheduled", "Pending", "Late") else "")
        parts.append(f"{name} {label}{hint}")
    return ", ".join(parts)


def _read_flow_run(run_id: str) -> Any:
    """One flow run, read with a client of its own (one-off reads; polling loops use `flow_run_reader`)."""
    with flow_run_reader() as read:
        return read(run_id)


@contextmanager
def flow_run_reader() -> Iterator[Callable[[str], Any]]:
    """A function reading flow runs by id over one Prefect client, open while the context lasts."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield lambda run_id: client.read_flow_run(UUID(run_id))


def worth_retrying(task, task_run, state) -> bool:
    """Retry a failed connection unless a certificate was refused or an agent's flow run ended.

    Those need an operator, not time.
    """
    return not isinstance(state.result(raise_on_failure=False), CertificateRefused | AgentRunEnded)


@task(**DATA_LOCAL, retries=2, retry_delay_seconds=2, retry_condition_fn=worth_retrying)
def connect_agents(config: FederationConfig, timeout_s: float = 60.0,
                   agent_runs: dict[str, str] | None = None) -> FlightTransport:
    """A mutual-TLS Flight transport to every institution, once all agents answer.

    With `agent_runs` ({institution: flow run id}), an agent run that ends first fails this at once with its
    error, and one no worker picked up within `training.agent_late_timeout_s` fails it naming its work pool.
    """
    transport = FlightTransport.from_config(config)
    # a run no worker picks up fails this after training.agent_late_timeout_s (0: only the timeout does)
    pools = {i.name: i.work_pool for i in config.institutions}
    late_after_s = config.training.agent_late_timeout_s or None
    gave_up = ended_agent_run(agent_runs, late_after_s=late_after_s, pools=pools) if agent_runs else None
    try:
        transport.wait_ready(timeout_s=timeout_s, gave_up=gave_up)
    except AgentRunEnded:
        transport.close()
        raise
    except PartyUnavailable as exc:  # timed out: say where each agent run stands (never picked up?)
        transport.close()
        if not agent_runs:
            raise
        raise PartyUnavailable(f"{exc}; agent flow runs: {agent_run_states(config, agent_runs)}") from exc
    except BaseException:
        transport.close()
        raise
    return transport
