"""fedcore's subcommands of `fedforest`, one module each (`simulate`, `agent`, `certs`, `contract`, ...).

Every module here defines `register(commands)`, which adds its subparser(s) to the `fedforest`
subparsers and sets `handler=<function(args) -> exit code>`. A new module is listed in the
`fedforest.commands` entry-point group of pyproject.toml, where `fedcore.cli` finds every command,
the Prefect-backed ones of `flows/commands/` included.
"""
