"""The `fedforest` console command: fedcore's commands plus the Prefect-backed ones (`demo`, `retrain`,
`predict`).

fedcore never imports Prefect, so the pipeline commands are added here, on top of `fedcore.cli`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedcore import cli as core_cli

QUIET_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "GX_ANALYTICS_ENABLED": "false",
             # a fresh ephemeral server migrates its SQLite database first: allow for a slow, busy machine
             "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest demo`, `fedforest retrain` and `fedforest predict`."""
    demo = commands.add_parser("demo", help="the whole pipeline on this machine (Prefect ephemeral server)",
                               description="Generate three institutions with overlapping customers and run the "
                                           "retrain pipeline on Prefect's ephemeral server, agents on loopback.")
    demo.add_argument("--work", type=Path, default=None,
                      help="workspace folder (default: each demo its own, work/demo, work/demo-horizontal or "
                           "work/demo-ppd-ert)")
    demo.add_argument("--verbose", action="store_true", help="show Prefect's own log lines")
    demo.add_argument("--setting", choices=("vertical", "horizontal"), default="vertical",
                      help="vertical: bank, e-commerce, insurer share customers (default); horizontal: three "
                           "hospitals share columns")
    demo.add_argument("--algorithm", choices=("extra-trees", "ppd-ert"), default="extra-trees",
                      help="horizontal demo: Federated Extra-Trees (default) or PPD-ERT")
    demo.add_argument("--privacy", choices=("none", "ldp", "gdp", "secagg"), default=None,
                      help="horizontal demo: extra-trees none (default) | ldp | gdp; ppd-ert secagg")
    demo.set_defaults(handler=_demo)
    retrain = commands.add_parser("retrain", help="run the retrain flow for a federation config")
    retrain.add_argument("--config", required=True, type=Path, metavar="FILE", help="the federation config (YAML)")
    retrain.add_argument("--agents", choices=("deployments", "local", "running"), default="running",
                         help="start agents as deployments, as local processes, or use running ones (default)")
    retrain.add_argument("--no-predict", action="store_true", help="skip the batch prediction step")
    retrain.add_argument("--run-id", metavar="ID",
                         help="training run id (default: the flow run id); give a crashed run's id to resume "
                              "its vertical training from its checkpoints")
    retrain.set_defaults(handler=_retrain)
    predict = commands.add_parser("predict", help="batch predict with a registered model version (no training)")
    predict.add_argument("--config", required=True, type=Path, metavar="FILE", help="the federation config (YAML)")
    predict.add_argument("--model", metavar="NAME", help="model name (default: training.model_name or the federation)")
    predict.add_argument("--version", default="production", metavar="V",
                         help="version or alias, e.g. v0003, latest (default production)")
    predict.add_argument("--requester", metavar="NAME", help="institution that receives the predictions "
                                                             "(default: training.predict_for or the label holder)")
    predict.add_argument("--agents", choices=("deployments", "local", "running"), default="running",
                         help="start agents as deployments, as local processes, or use running ones (default)")
    predict.set_defaults(handler=_predict)


def demo_folder(setting: str, algorithm: str) -> Path:
    """Each demo's own default workspace, so one never overwrites another's config, data or registry."""
    if setting == "vertical":
        return Path("work/demo")
    return Path("work/demo-horizontal" if algorithm == "extra-trees" else f"work/demo-{algorithm}")


def use_federation_prefect_home(config_path: Path) -> Path | None:
    """Record runs where the federation's own Prefect home is (`<config folder>/.prefect`, which `demo`
    creates and tells you to start the UI on), unless PREFECT_HOME or PREFECT_API_URL already says where;
    returns the home used, if any. Keeps the demo's runs and the tour's `retrain`/`predict` runs together."""
    home = config_path.resolve().parent / ".prefect"
    if "PREFECT_HOME" in os.environ or "PREFECT_API_URL" in os.environ or not home.is_dir():
        return None
    os.environ["PREFECT_HOME"] = str(home)
    print(f"fedforest: recording runs in {home} (this federation's Prefect home; browse them with "
          f"PREFECT_HOME={home} prefect server start)", file=sys.stderr)
    return home


def _quiet(verbose: bool) -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def _demo(args: argparse.Namespace) -> int:
    work = (args.work or demo_folder(args.setting, args.algorithm)).resolve()
    (work / ".prefect").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(work / ".prefect"))
    _quiet(args.verbose)
    if not args.verbose:  # Prefect's own lines are quieted: show training progress as plain lines
        from fedcore.progress import echo_progress

        echo_progress()
    if args.setting == "horizontal":
        from flows.demos.horizontal import run_horizontal_demo

        return run_horizontal_demo(work, algorithm=args.algorithm, privacy=args.privacy)
    from flows.demos.vertical import run_demo

    return run_demo(work)


def _retrain(args: argparse.Namespace) -> int:
    use_federation_prefect_home(args.config)
    _quiet(verbose=True)
    import json

    from flows.retrain import retrain

    result = retrain(str(args.config.resolve()), agents=args.agents, predict=not args.no_predict,
                     run_id=args.run_id)
    print(json.dumps(result, indent=2, default=str))
    return 0


def _predict(args: argparse.Namespace) -> int:
    use_federation_prefect_home(args.config)
    _quiet(verbose=True)
    import json

    from flows.batch_predict import batch_predict

    result = batch_predict(str(args.config.resolve()), model_name=args.model, version=args.version,
                           requester=args.requester, agents=args.agents)
    print(json.dumps(result, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `fedforest` with the pipeline commands available."""
    return core_cli.main(argv, extra=register)


if __name__ == "__main__":
    sys.exit(main())
