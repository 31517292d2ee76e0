"""`fedforest deploy`: a federation's work pools, deployments and concurrency limit on a Prefect server.

    fedforest deploy --config federation.yaml [--cron '0 3 * * 1'] [--timezone UTC] [--no-schedule]
                     [--results DIR | --results-block TYPE/NAME] [--worker-config PATH]

On the server of PREFECT_API_URL: a process work pool per pool the config names, `institution-agent/<name>`
per institution, `retrain/weekly` (scheduled) and `batch-predict/on-demand` (`flows.deployments`). Run it
again after the config changed: it updates them and removes the agents of institutions that left. It prints
one line per pool, limit and deployment saying what it did.
"""

from __future__ import annotations

import argparse

from flows.commands.environment import add_config_option, quiet


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest deploy`."""
    deploy = commands.add_parser(
        "deploy", help="create or update a federation's work pools and deployments on a Prefect server",
        description="Create or update, on the Prefect server of PREFECT_API_URL, a process work pool for "
                    "every pool the config names, one institution-agent deployment per institution, "
                    "retrain/weekly (scheduled) and batch-predict/on-demand, and the federation's "
                    "concurrency limit; remove the agent deployments of institutions no longer in the "
                    "config. The config's optional 'deployments:' section sets schedule, results and "
                    "config_path; the options win over it.")
    add_config_option(deploy)
    deploy.add_argument("--cron", metavar="LINE",
                        help="retrain/weekly's cron schedule (default: the config's, else '0 3 * * 1', "
                             "Mondays 03:00)")
    deploy.add_argument("--timezone", metavar="ZONE",
                        help="the schedule's IANA time zone, e.g. Europe/Zurich (default: the config's, "
                             "else UTC)")
    deploy.add_argument("--no-schedule", action="store_true", help="retrain only when triggered")
    results = deploy.add_mutually_exclusive_group()
    results.add_argument("--results", metavar="DIR",
                         help="folder on the master's host where retrain and batch-predict keep the summary "
                              "they return (default: the config's, else .prefect-results beside the config)")
    results.add_argument("--results-block", metavar="TYPE/NAME",
                         help="a Prefect storage block for those results instead, e.g. "
                              "s3-bucket/fedforest-results")
    deploy.add_argument("--worker-config", metavar="PATH",
                        help="absolute path at which every worker reads the federation config (default: the "
                             "config's deployments.config_path, else --config's absolute path)")
    deploy.set_defaults(handler=_deploy)


def _deploy(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.errors import ConfigError

    config = load_config(args.config)
    quiet(verbose=False)
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():  # the environment's, else the Prefect profile's
        raise ConfigError("fedforest deploy needs PREFECT_API_URL: the Prefect server the workers poll, "
                          "e.g. http://prefect.example.org:4200/api (deployments on a temporary server would "
                          "vanish with it)")
    from flows.deployments import deploy, deploy_settings

    settings = deploy_settings(config, cron=args.cron, timezone=args.timezone, no_schedule=args.no_schedule,
                               results=args.results, results_block=args.results_block,
                               worker_config=args.worker_config)
    deploy(config, settings, echo=lambda line: print(f"fedforest deploy: {line}", flush=True))
    return 0
