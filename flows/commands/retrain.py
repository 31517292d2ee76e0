"""`fedforest retrain`: run the retrain flow for a federation config.

    fedforest retrain --config federation.yaml [--agents local] [--no-predict] [--run-id ID]

Runs `flows.retrain` (training, evaluation, registration and, unless --no-predict, batch prediction) and
prints its result as JSON, then, on stderr, where each institution wrote its predictions (the result's
`prediction.paths`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, cast

from flows.commands.environment import (
    add_agents_option,
    add_config_option,
    quiet,
    use_federation_prefect_home,
)


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest retrain`."""
    retrain = commands.add_parser("retrain", help="run the retrain flow for a federation config")
    add_config_option(retrain)
    add_agents_option(retrain)
    retrain.add_argument("--no-predict", action="store_true", help="skip the batch prediction step")
    retrain.add_argument("--run-id", metavar="ID",
                         help="training run id (default: the flow run id); give a crashed run's id to resume "
                              "its vertical training from its checkpoints")
    retrain.set_defaults(handler=_retrain)


def _retrain(args: argparse.Namespace) -> int:
    use_federation_prefect_home(args.config)
    quiet(verbose=True)
    from flows.retrain import retrain
    from flows.ui import prediction_files

    # the flow returns `finished(...)`: called, it gives that State's data (Prefect types it as the State)
    result = cast(dict[str, Any], retrain(str(args.config.resolve()), agents=args.agents,
                                          predict=not args.no_predict, run_id=args.run_id))
    print(json.dumps(result, indent=2, default=str))
    for line in prediction_files(result):
        print(line, file=sys.stderr)
    return 0
