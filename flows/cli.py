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
    demo.add_argument("--work", type=Path, default=Path("work/demo"), help="workspace folder (default work/demo)")
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


def _quiet(verbose: bool) -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def _demo(args: argparse.Namespace) -> int:
    work = args.work.resolve()
    (work / ".prefect").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(work / ".prefect"))
    _quiet(args.verbose)
    if args.setting == "horizontal":
        from flows.horizontal_demo import run_horizontal_demo

        return run_horizontal_demo(work, algorithm=args.algorithm, privacy=args.privacy)
    from flows.demo import run_demo

    return run_demo(work)


def _retrain(args: argparse.Namespace) -> int:
    _quiet(verbose=True)
    import json

    from flows.retrain import retrain

    result = retrain(str(args.config.resolve()), agents=args.agents, predict=not args.no_predict,
                     run_id=args.run_id)
    print(json.dumps(result, indent=2, default=str))
    return 0


def _predict(args: argparse.Namespace) -> int:
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
