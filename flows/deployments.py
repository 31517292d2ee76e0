"""A federation's Prefect deployments, from its config: what `fedforest deploy` creates, updates, removes.

For the federation in a config, on the Prefect server of PREFECT_API_URL:

- a process work pool for every `work_pool` the config names (each institution's and the master's);
- `institution-agent/<institution>` on each institution's pool;
- `retrain/weekly` on the master's pool, on a cron schedule (default Mondays 03:00 UTC), and
  `batch-predict/on-demand` beside it, both with `agents: deployments` and a result storage for the summary
  they return (`flows.RETURNED_SUMMARY`);
- the federation's concurrency limit (`flows.federation_lock`).

The deployments run the flows by module path (`flows.retrain.retrain`): a worker runs them with the fedforest
installed in its own environment, from any folder, and reads the config at `config_path`. Every deployment is
tagged `federation:<name>`; running the command again after the config changed updates them all and removes
the agent deployments of institutions no longer in it. The optional `deployments:` section of the config
(read only here) sets the schedule, the result storage and the config path the workers read:

    deployments:
      schedule: {cron: "0 3 * * 1", timezone: UTC}  # null: retrain only when triggered
      results: .prefect-results                     # a folder beside the config or {block: s3-bucket/res}
      config_path: /srv/federation/federation.yaml  # where every worker reads the config (default: this one)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, cast

from fedcore.config import FederationConfig, read_yaml, refuse_unknown_keys
from fedcore.errors import ConfigError

AGENT_FLOW = "institution-agent"
RETRAIN = ("retrain", "weekly")
PREDICT = ("batch-predict", "on-demand")
ENTRYPOINTS = {AGENT_FLOW: "flows.agent.institution_agent", RETRAIN[0]: "flows.retrain.retrain",
               PREDICT[0]: "flows.batch_predict.batch_predict"}
"""Each flow by module path: the worker imports it from the fedforest installed where it runs."""
DEFAULT_CRON, DEFAULT_TIMEZONE = "0 3 * * 1", "UTC"
DEFAULT_RESULTS = ".prefect-results"
SECTION = ("schedule", "results", "config_path")
SCHEDULE_SLUG = "weekly"


def federation_tag(federation: str) -> str:
    """The tag on every deployment (and so every run) of a federation: `federation:<name>`."""
    return f"federation:{federation}"


@dataclass(frozen=True)
class RetrainSchedule:
    """When `retrain/weekly` runs: a cron line in a time zone (IANA name)."""

    cron: str
    timezone: str

    def describe(self) -> str:
        """`0 3 * * 1 (UTC)`."""
        return f"{self.cron} ({self.timezone})"


@dataclass(frozen=True)
class Results:
    """Where retrain and batch-predict keep the summary they return: a folder or a Prefect storage block."""

    folder: str | None = None
    block: str | None = None

    def env(self) -> dict[str, str]:
        """The flow-run environment that makes Prefect keep results there."""
        if self.block:
            return {"PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": self.block}
        return {"PREFECT_LOCAL_STORAGE_PATH": str(self.folder)}

    def describe(self) -> str:
        """`results in /srv/federation/.prefect-results` or `results in block s3-bucket/results`."""
        return f"results in block {self.block}" if self.block else f"results in {self.folder}"


@dataclass(frozen=True)
class DeploySettings:
    """The `deployments:` section with the command's flags applied."""

    config_path: str
    """Where every worker reads the federation config (the deployments' `config_path` parameter)."""
    schedule: RetrainSchedule | None
    results: Results


@dataclass(frozen=True)
class Planned:
    """One deployment as `fedforest deploy` makes it."""

    flow: str
    name: str
    pool: str
    parameters: dict[str, Any]
    description: str
    tags: tuple[str, ...]
    schedule: RetrainSchedule | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        """`<flow>/<deployment>`, as `prefect deployment run` and `run_deployment` name it."""
        return f"{self.flow}/{self.name}"


def deploy_settings(config: FederationConfig, cron: str | None = None, timezone: str | None = None,
                    no_schedule: bool = False, results: str | None = None, results_block: str | None = None,
                    worker_config: str | None = None) -> DeploySettings:
    """The config's `deployments:` section, checked, with the command's flags (given ones win)."""
    raw = read_yaml(config.path, "federation config").get("deployments") or {}
    where = f"{config.path}: deployments"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of {', '.join(SECTION)}")
    refuse_unknown_keys(raw, SECTION, f"{where}: unknown setting")
    path = worker_config or raw.get("config_path") or str(config.path)
    if not PurePosixPath(str(path)).is_absolute():
        raise ConfigError(f"{where}.config_path must be an absolute path (where every worker reads the "
                          f"config), got {path!r}")
    folder = PurePosixPath(str(path)).parent
    return DeploySettings(config_path=str(path), schedule=_schedule(raw, where, cron, timezone, no_schedule),
                          results=_results(raw.get("results"), where, folder, results, results_block))


def _schedule(raw: dict, where: str, cron: str | None, timezone: str | None,
              no_schedule: bool) -> RetrainSchedule | None:
    """The retrain schedule: flags, else the section's `schedule` (null: none), else Mondays 03:00 UTC."""
    if no_schedule:
        return None
    section: Any = raw.get("schedule", {})
    if section is None and cron is None and timezone is None:
        return None
    section = section or {}
    if not isinstance(section, dict) or set(section) - {"cron", "timezone"}:
        raise ConfigError(f"{where}.schedule must be {{cron: '0 3 * * 1', timezone: UTC}} or null (no "
                          f"schedule), got {section!r}")
    schedule = RetrainSchedule(str(cron or section.get("cron") or DEFAULT_CRON),
                               str(timezone or section.get("timezone") or DEFAULT_TIMEZONE))
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=schedule.cron, timezone=schedule.timezone)
    except ValueError as error:
        reason = ("; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
                  if hasattr(error, "errors") else str(error))
        raise ConfigError(f"{where}.schedule: {schedule.describe()} is not a cron schedule Prefect takes: "
                          f"{reason} (a cron line like '0 3 * * 1' and an IANA time zone like "
                          "Europe/Zurich)") from None
    return schedule


def _results(section: Any, where: str, config_folder: PurePosixPath, folder: str | None,
             block: str | None) -> Results:
    """The result storage: flags, else the section's `results` (folder or {block: slug}), else a folder."""
    if block:
        return Results(block=block)
    if folder is None and isinstance(section, dict):
        if set(section) != {"block"} or not str(section["block"]).count("/") == 1:
            raise ConfigError(f"{where}.results must be a folder or {{block: <block type>/<block name>}}, "
                              f"e.g. {{block: s3-bucket/fedforest-results}}, got {section!r}")
        return Results(block=str(section["block"]))
    if section is not None and not isinstance(section, str):
        raise ConfigError(f"{where}.results must be a folder or {{block: <block type>/<block name>}}, "
                          f"got {section!r}")
    chosen = PurePosixPath(folder or section or DEFAULT_RESULTS)
    return Results(folder=str(chosen if chosen.is_absolute() else config_folder / chosen))


def work_pools(config: FederationConfig) -> list[str]:
    """Every pool the config names, the master's first, each once."""
    return list(dict.fromkeys([config.master_work_pool] + [i.work_pool for i in config.institutions]))


def planned_deployments(config: FederationConfig, settings: DeploySettings) -> list[Planned]:
    """The federation's deployments: an agent per institution, then retrain and batch-predict."""
    tags = (federation_tag(config.federation),)
    agents = [Planned(AGENT_FLOW, i.name, i.work_pool,
                      {"config_path": settings.config_path, "institution": i.name},
                      f"{i.name}'s agent in federation {config.federation}: load, validate, serve a session",
                      tags)
              for i in config.institutions]
    master = {"config_path": settings.config_path, "agents": "deployments"}
    env = settings.results.env()
    return agents + [
        Planned(*RETRAIN, config.master_work_pool, master,
                f"Retrain federation {config.federation}: validate, align, train, evaluate, register, "
                "promote, batch predict", tags, settings.schedule, env),
        Planned(*PREDICT, config.master_work_pool, master,
                f"Batch prediction with the production version for the new data of federation "
                f"{config.federation}", tags, None, env),
    ]


@dataclass(frozen=True)
class Existing:
    """A deployment of one of fedforest's flows already on the server."""

    full_name: str
    tags: tuple[str, ...]
    pool: str | None


@dataclass(frozen=True)
class Changes:
    """What deploying a plan does besides creating and updating its deployments."""

    remove: list[str]
    """This federation's deployments the config no longer has (an institution left)."""
    stray: list[str]
    """Agent deployments of no federation (made otherwise, e.g. by hand) of institutions not in the config."""
    foreign: list[str]
    """Deployments the plan would overwrite that belong to another federation."""
    unused_pools: list[str]
    """Pools of removed deployments that nothing of this federation uses any more."""


def compare(existing: list[Existing], planned: list[Planned], federation: str) -> Changes:
    """What deploying `planned` for `federation` removes, leaves and must not touch, given what exists."""
    ours, wanted = federation_tag(federation), {p.full_name for p in planned}
    tagged = [e for e in existing if any(t.startswith("federation:") for t in e.tags)]
    removed = [e for e in tagged if ours in e.tags and e.full_name not in wanted]
    in_use = {p.pool for p in planned}
    return Changes(
        remove=sorted(e.full_name for e in removed),
        stray=sorted(e.full_name for e in existing if e not in tagged and e.full_name not in wanted
                     and e.full_name.startswith(AGENT_FLOW + "/")),
        foreign=sorted(e.full_name for e in tagged if ours not in e.tags and e.full_name in wanted),
        unused_pools=sorted({e.pool for e in removed if e.pool and e.pool not in in_use}),
    )


def deploy(config: FederationConfig, settings: DeploySettings, echo: Callable[[str], None] = print) -> None:
    """Create or update the federation's pools, concurrency limit and deployments; remove those it dropped.

    Says what it did, one line each, through `echo`. Refuses (ConfigError) before changing anything when a
    deployment it would overwrite belongs to another federation.
    """
    from prefect.client.orchestration import get_client

    planned = planned_deployments(config, settings)
    with get_client(sync_client=True) as client:
        existing = _existing(client)
        changes = compare(list(existing.values()), planned, config.federation)
        if changes.foreign:
            raise ConfigError(
                f"{', '.join(changes.foreign)} belong(s) to another federation (see the deployment's "
                "federation: tag); deployment names are fixed (institution-agent/<institution>, "
                "retrain/weekly, batch-predict/on-demand), so one Prefect server (or workspace) serves one "
                f"federation: deploy {config.federation!r} to its own, or delete those deployments first")
        echo(f"federation {config.federation!r} on {client.api_url}")
        for pool in work_pools(config):
            echo(_ensure_pool(client, pool))
        echo(_ensure_limit(client, config.federation))
        for spec in planned:
            echo(_apply(client, spec, existing.get(spec.full_name)))
        for name in changes.remove:
            client.delete_deployment(existing[name].id)
            echo(f"deployment {name}: removed (not in {config.path.name} any more)")
        for name in changes.stray:
            echo(f"deployment {name}: left as it is, but {name.split('/', 1)[1]!r} is no institution of "
                 f"{config.federation!r}, and it was not made by fedforest deploy; remove it with "
                 f"prefect deployment delete {name}")
        for pool in changes.unused_pools:
            echo(f"work pool {pool}: no deployment of {config.federation!r} uses it any more; once its "
                 f"worker is stopped, prefect work-pool delete {pool}")
    echo("next: start one worker per pool, each on its own host: prefect worker start --pool <pool>")


@dataclass(frozen=True)
class _Found(Existing):
    id: Any = None
    schedules: tuple[Any, ...] = ()


def _existing(client: Any) -> dict[str, _Found]:
    """The server's deployments of fedforest's flows, by full name."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    ours = FlowFilter(name=FlowFilterName(any_=list(ENTRYPOINTS)))
    flows = {f.id: f.name for f in client.read_flows(flow_filter=ours)}
    found = {}
    for deployment in client.read_deployments(flow_filter=ours):
        name = f"{flows.get(deployment.flow_id, '?')}/{deployment.name}"
        found[name] = _Found(name, tuple(deployment.tags or ()), deployment.work_pool_name, deployment.id,
                             tuple(deployment.schedules or ()))
    return found


def _ensure_pool(client: Any, pool: str) -> str:
    """Create the process work pool unless it exists; says which."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        found = client.read_work_pool(pool)
    except ObjectNotFound:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process",
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
        return f"work pool {pool} (process): created"
    note = "" if found.type == "process" else f"; fedforest's workers are 'process', not {found.type!r}"
    return f"work pool {pool} ({found.type}): exists{note}"


def _ensure_limit(client: Any, federation: str) -> str:
    """The federation's concurrency limit, one run at a time (an existing one is left as it is)."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectNotFound

    from flows.federation_lock import limit_name

    name = limit_name(federation)
    try:
        found = client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        return f"concurrency limit {name}: created (one retrain or batch-predict run of it at a time)"
    return (f"concurrency limit {name}: exists ({found.limit} slot(s), "
            f"{'active' if found.active else 'INACTIVE: runs of the federation are not kept apart'})")


def _apply(client: Any, spec: Planned, found: _Found | None) -> str:
    """Create or update one deployment; says which, where, and its schedule and result storage."""
    from prefect.client.schemas.objects import DeploymentSchedule
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    from flows.agent import institution_agent
    from flows.batch_predict import batch_predict
    from flows.retrain import retrain

    flows: dict[str, Any] = {AGENT_FLOW: institution_agent, RETRAIN[0]: retrain, PREDICT[0]: batch_predict}
    paused = any(isinstance(s, DeploymentSchedule) and s.slug == SCHEDULE_SLUG and not s.active
                 for s in (found.schedules if found else ()))
    schedules = ([Cron(spec.schedule.cron, timezone=spec.schedule.timezone, slug=SCHEDULE_SLUG,
                       active=not paused)] if spec.schedule else [])
    deployment = flows[spec.flow].to_deployment(
        name=spec.name, entrypoint_type=EntrypointType.MODULE_PATH, parameters=spec.parameters,
        description=spec.description, tags=list(spec.tags), schedules=schedules, work_pool_name=spec.pool,
        job_variables={"env": spec.env} if spec.env else {})
    cast(Any, deployment).apply()
    parts = [f"deployment {spec.full_name} on pool {spec.pool}: {'updated' if found else 'created'}"]
    if spec.schedule:
        parts.append(f"schedule {spec.schedule.describe()}" + (" (paused, as it was)" if paused else ""))
    elif spec.flow == RETRAIN[0]:
        parts.append("no schedule (runs when triggered)")
    if spec.env:
        parts.append(Results(folder=spec.env.get("PREFECT_LOCAL_STORAGE_PATH"),
                             block=spec.env.get("PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK")).describe())
    return "; ".join(parts)

