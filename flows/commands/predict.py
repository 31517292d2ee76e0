"""`fedforest predict`: batch predict with a registered model version, no training.

    fedforest predict --config federation.yaml [--version production] [--requester NAME] [--agents local]
                      [--until 2026-11-27T06:00:00Z]

Runs the batch prediction flow (`flows.batch_predict`) and prints its result as JSON, then, on stderr, where
each institution wrote its predictions (the same paths as the result's `prediction.paths`).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any, cast

from flows.commands.environment import (
    add_agents_option,
    add_config_option,
    quiet,
    use_federation_prefect_home,
)


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest predict`."""
    predict = commands.add_parser("predict",
                                  help="batch predict with a registered model version (no training)")
    add_config_option(predict)
    predict.add_argument("--model", metavar="NAME",
                         help="model name (default: training.model_name or the federation)")
    predict.add_argument("--version", default="production", metavar="V",
                         help="version or alias, e.g. v0003, latest (default production)")
    predict.add_argument("--requester", metavar="NAME",
                         help="institution that receives the predictions (default: training.predict_for or "
                              "the label holder)")
    predict.add_argument("--until", type=scheduled_time, metavar="TIME",
                         help="end of the batch a predict_data query selects by :until, e.g. "
                              "2026-11-27T06:00:00Z (default: this run's start); rerun a day's batch with it")
    add_agents_option(predict)
    predict.set_defaults(handler=_predict)


def scheduled_time(value: str) -> datetime:
    """`--until`: an ISO 8601 time with a time zone, as UTC (argparse reports a bad one in one line)."""
    from fedcore.data.sql import timestamp

    stamp = timestamp(value)
    if stamp is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a time with a time zone, like "
                                         "2026-11-27T06:00:00Z")
    return stamp


def _predict(args: argparse.Namespace) -> int:
    use_federation_prefect_home(args.config)
    quiet(verbose=True)
    from flows.batch_predict import batch_predict
    from flows.ui import prediction_files

    # the flow returns `finished(...)`: called, it gives that State's data (Prefect types it as the State)
    result = cast(dict[str, Any], batch_predict(str(args.config.resolve()), model_name=args.model,
                                                version=args.version, requester=args.requester,
                                                agents=args.agents, until=args.until))
    print(json.dumps(result, indent=2, default=str))
    for line in prediction_files(result):
        print(line, file=sys.stderr)
    return 0
