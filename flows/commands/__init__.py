"""The Prefect-backed subcommands of `fedforest`: `demo`, `retrain` and `predict`, one module each.

Each command module defines `register(commands)` like fedcore's (`fedcore/commands/`) and is listed with
them in the `fedforest.commands` entry-point group of pyproject.toml. It imports Prefect and the flows only
inside its handler, so `fedforest --help` and fedcore's commands never load Prefect. `environment` holds
the Prefect settings the three share.
"""
