"""`fedforest models`: inspect and manage a model registry (see fedcore.models.registry).

    fedforest models list     TRUST [--model NAME] [--json]
    fedforest models show     TRUST --model NAME [--version REF] [--json] [--pictures DIR [--metric NAME]]
    fedforest models promote  TRUST --model NAME --version REF [--alias production]
    fedforest models rollback TRUST --model NAME [--alias production]
    fedforest models keygen   --out FILE      (writes FILE, mode 0600, and FILE.pub, mode 0644)
    fedforest models export   TRUST --model NAME [--version REF] --format onnx|treelite|structure --out FILE

TRUST says which registry and which key to trust: `--config federation.yaml` (the master's registry, its
master.public_key, and master.signing_key to promote), or `--registry DIR` with `--public-key FILE`
(`--signing-key FILE` to promote). Unsigned manifests, and manifests or alias entries signed by any other
key, are refused. `--trust-any-key` inspects a registry without a trusted key: each signature is checked
against the key it carries, which proves nothing about who wrote it (a loud warning says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedcore.errors import ConfigError
from fedcore.metrics import default_metric
from fedcore.models.export import FORMATS, export_version
from fedcore.models.pictures import version_pictures
from fedcore.models.registry import LATEST, PRODUCTION, ModelRegistry
from fedcore.models.signing import generate_signing_key, key_id, public_key_path

TRUST_ANY_KEY_WARNING = ("WARNING: --trust-any-key: no trusted key; signatures are only checked against "
                         "the key each file carries, which anyone who can write the registry can replace. "
                         "Nothing shown here is proven to come from the master.")


def register(commands: argparse._SubParsersAction) -> None:
    """Add `fedforest models` and its list/show/promote/rollback/keygen subcommands."""
    models = commands.add_parser("models", help="list, show, promote and roll back registered model versions",
                                 description="Inspect and manage a versioned model registry.")
    sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    listing = sub.add_parser("list", help="models in a registry, or the versions of one model")
    _registry_options(listing, model_required=False)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=_list)

    show = sub.add_parser("show", help="one version's manifest summary, signature and integrity")
    _registry_options(show)
    show.add_argument("--version", default=LATEST, metavar="REF", help="v0003, an alias or latest (default)")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.add_argument("--pictures", metavar="DIR", help="also write the version's pictures into DIR as "
                                                        "SVG files (confusion, ROC, PR, calibration, "
                                                        "importances, the metric across versions)")
    show.add_argument("--metric", metavar="NAME", help="the metric drawn across versions (default: the "
                                                       "task's promotion default, log_loss or r2)")
    show.set_defaults(handler=_show)

    promote = sub.add_parser("promote", help="point an alias (default production) at a verified version")
    _registry_options(promote, moves_aliases=True)
    promote.add_argument("--version", required=True, metavar="REF",
                         help="the version to promote (e.g. v0003)")
    promote.add_argument("--alias", default=PRODUCTION, help="alias to move (default production)")
    promote.set_defaults(handler=_promote)

    rollback = sub.add_parser("rollback", help="move an alias back to its previous version")
    _registry_options(rollback, moves_aliases=True)
    rollback.add_argument("--alias", default=PRODUCTION, help="alias to move back (default production)")
    rollback.set_defaults(handler=_rollback)

    export = sub.add_parser("export", help="write a verified horizontal version as ONNX or Treelite "
                                           "(the [export] extra), or any version's tree tables as JSON")
    _registry_options(export)
    export.add_argument("--version", default=LATEST, metavar="REF",
                        help="v0003, an alias or latest (default)")
    export.add_argument("--format", required=True, choices=FORMATS, help="onnx (TreeEnsembleClassifier/"
                        "Regressor) or treelite, horizontal only; structure: the tree tables this registry "
                        "holds, as JSON (vertical: the master's structure, or an institution's own splits)")
    export.add_argument("--out", required=True, metavar="FILE", help="the file to write (replaced whole)")
    export.set_defaults(handler=_export)

    keygen = sub.add_parser("keygen", help="create an Ed25519 signing key (FILE) and its public key "
                                           "(FILE.pub)")
    keygen.add_argument("--out", required=True, metavar="FILE", help="private key file to create (never "
                                                                     "overwritten)")
    keygen.set_defaults(handler=_keygen)


def _registry_options(parser: argparse.ArgumentParser, model_required: bool = True,
                      moves_aliases: bool = False) -> None:
    parser.add_argument("--config", metavar="FILE", help="federation config: the master's registry, its "
                                                         "trusted "
                        "master.public_key" + (" and master.signing_key" if moves_aliases else ""))
    parser.add_argument("--registry", metavar="DIR", help="the registry directory (default with --config: "
                                                          "the master's)")
    parser.add_argument("--model", required=model_required, metavar="NAME", help="the model name")
    parser.add_argument("--public-key", metavar="FILE", help="the master's public key (PEM); every signature "
                                                             "must "
                        "verify under it")
    if moves_aliases:
        parser.add_argument("--signing-key", metavar="FILE", help="the master's signing key: every alias "
                                                                  "move is a "
                            "signed entry of the registry's alias log")
    else:
        parser.add_argument("--trust-any-key", action="store_true", help="inspect without a trusted key "
                                                                         "(integrity "
                            "only: anyone who can write the registry can re-sign); prints a warning")


def _open(args: argparse.Namespace) -> ModelRegistry:
    """The registry the options name, with the trust they give; none given is an error, not a default."""
    from fedcore.config import load_config

    config = load_config(args.config) if args.config else None
    root = args.registry or (config.master_registry if config else None)
    if root is None:
        raise ConfigError("models: name the registry: --config federation.yaml (the master's) or --registry "
                          "DIR")
    moves_aliases = hasattr(args, "signing_key")
    if moves_aliases:  # the signing key is also the trusted key (its public half)
        signing, public = args.signing_key or (config.master_signing_key if config else None), args.public_key
        if signing is None:
            raise ConfigError("models: moving an alias needs the master's signing key (each move is a signed "
                              "entry of the alias log): pass --config with master.signing_key, or "
                              "--signing-key FILE")
        return ModelRegistry(root, signing_key=signing, public_key=public)
    public = args.public_key or (config.master_public_key if config else None)
    if public is None and not args.trust_any_key:
        raise ConfigError("models: no trusted key: pass --config federation.yaml or --public-key FILE (the "
                          "master's public key, e.g. keys/master.key.pub); --trust-any-key inspects without "
                          "trust")
    if public is None:
        print(TRUST_ANY_KEY_WARNING, file=sys.stderr)
    return ModelRegistry(root, public_key=public, trust_any_key=args.trust_any_key)


def _list(args: argparse.Namespace) -> int:
    """Exit 1 when a listed version fails its checks (signature and every file's SHA-256)."""
    registry = _open(args)
    rows = _version_rows(registry, args.model) if args.model else _model_rows(registry)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no models in {registry.root}")
    else:
        print(format_table([{k: v for k, v in row.items() if k != "alias_moves"} for row in rows]))
        if args.model:
            print("checked: each version's signature and the SHA-256 of every file it lists")
            moves = registry.alias_log(args.model)
            if moves:
                print("\nalias log (each entry signed by the master's key):")
                print(_indent(format_table([_move_row(entry) for entry in moves])))
    if not args.json:
        for name in [args.model] if args.model else registry.models():
            pending = registry.pending(name)
            if pending:
                print(f"{name}: uncommitted {', '.join(pending)} (a run stopped before every institution "
                      "stored it; not listed, and withdrawn everywhere by the next retrain)")
    return 1 if any(row.get("integrity", "ok") != "ok" for row in rows) else 0


def _model_rows(registry: ModelRegistry) -> list[dict]:
    rows = []
    for name in registry.models():
        aliases = registry.aliases(name)
        rows.append({"model": name, "versions": len(registry.versions(name)),
                     "latest": registry.resolve(name, LATEST), "production": aliases.get(PRODUCTION, "-")})
    return rows


def _version_rows(registry: ModelRegistry, model: str) -> list[dict]:
    registry.resolve(model, LATEST)  # a clear error when the model has no versions
    aliases = registry.aliases(model)
    moves = registry.alias_log(model)
    rows = []
    for version in registry.versions(model):
        info = registry.describe(model, version, verify=True)
        rows.append({"version": version, "created_at": _short_time(info["created_at"]),
                     "algorithm": info["algorithm"] or "-",
                     "aliases": ",".join(sorted(a for a, v in aliases.items() if v == version)) or "-",
                     "metrics": _metrics_text(info["metrics"]), "signature": _short_status(info["signature"]),
                     "integrity": "ok" if info["integrity"] == "ok" else "FAILED",
                     "alias_moves": [_move_row(entry) for entry in moves if entry["version"] == version]})
    return rows


def _move_row(entry: dict) -> dict:
    """One alias-log entry for people: when, what, which alias to which version, by whom (and which key)."""
    by = entry["by"] if isinstance(entry["by"], dict) else {}
    return {"at": _short_time(entry["at"]), "action": entry["action"], "alias": entry["alias"],
            "version": entry["version"], "by": f"{by.get('user', '?')}@{by.get('host', '?')}",
            "key": by.get("key_id", "?")}


def _show(args: argparse.Namespace) -> int:
    """Exit 1 when the version fails its checks (signature or files)."""
    registry = _open(args)
    info = registry.describe(args.model, args.version)
    failed = 1 if info["integrity"] != "ok" else 0
    if args.pictures and not failed:
        written = _write_pictures(registry, args.model, info["version"], args.metric or default_metric(
            info["task"]), Path(args.pictures))
        print(f"wrote {len(written)} pictures into {args.pictures}: {', '.join(written)}", file=sys.stderr)
    if args.json:
        print(json.dumps(info, indent=2))
        return failed
    aliases = f"  [{', '.join(info['aliases'])}]" if info["aliases"] else ""
    lines = [f"{info['model_name']} {info['version']}{aliases}"]
    for key in ("created_at", "algorithm", "setting", "task"):
        lines.append(f"  {key + ':':<12}{info[key] if info[key] is not None else '-'}")
    lines.append(f"  {'metrics:':<12}{_metrics_text(info['metrics'])}")
    lines.append(f"  {'signature:':<12}{info['signature']}")
    lines.append(f"  {'integrity:':<12}{info['integrity']}")
    if info["parties"]:
        lines += ["", _indent(format_table([_rounded(party) for party in info["parties"]]))]
    if info["importances"]:
        lines += ["", _indent(_importance_text(info["importances"], info["parties"]))]
    if info["files"]:
        lines += ["", _indent(format_table(info["files"]))]
    print("\n".join(lines))
    return failed


def _rounded(row: dict) -> dict:
    """A table row with its floats to 4 digits."""
    return {k: f"{v:.4f}" if isinstance(v, float) else v for k, v in row.items()}


def _importance_text(importances: dict, parties: list[dict]) -> str:
    """The version's feature importances, most important first: an institution's own, or the whole model's.

    A vertical institution's registry copy holds its own features' (the master holds only each one's share,
    the parties table's importance_share); a horizontal version every agreed feature's.
    """
    from fedcore.models.card import importance_rows  # here: the card's imports are a session's

    whose = ("this institution's own features (they never left it)"
             if any("importance_share" in p for p in parties) else "every feature")
    rows = [_rounded(row) for row in importance_rows(importances)]
    return f"importances of {whose}, summing to {sum(importances.values()):.4f}:\n{format_table(rows)}"


def _write_pictures(registry: ModelRegistry, model: str, version: str, metric: str,
                    folder: Path) -> list[str]:
    """Write `version_pictures` as `<model>-<version>-<picture>.svg` files into `folder`; their names."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, svg in version_pictures(registry, model, version, metric).items():
        path = folder / f"{model}-{version}-{name}.svg"
        path.write_text(svg)
        written.append(path.name)
    return written


def _export(args: argparse.Namespace) -> int:
    """Write the version's forest in the format asked; the input is the schema-encoded matrix."""
    version, path = export_version(_open(args), args.model, args.version, args.format, args.out)
    if args.format == "structure":
        print(f"{args.model} {version}: wrote {path} (structure: the tree tables this registry holds, as "
              "JSON; docs/design.md, Export)")
        return 0
    print(f"{args.model} {version}: wrote {path} ({args.format}; input X: the rows encoded by the schema in "
          "its metadata, see docs/design.md, Export)")
    return 0


def _promote(args: argparse.Namespace) -> int:
    version = _open(args).promote(args.model, args.version, args.alias)
    print(f"{args.model}: {args.alias} -> {version}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    version = _open(args).rollback(args.model, args.alias)
    print(f"{args.model}: {args.alias} rolled back to {version}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    private_path = Path(args.out)
    public_path = public_key_path(private_path)
    key = generate_signing_key(private_path)
    print(f"signing key {private_path} (keep it secret; mode 0600)\npublic key  {public_path} "
          f"(give it to everyone who loads models)\nkey id      {key_id(key)}")
    return 0


def format_table(rows: list[dict]) -> str:
    """Rows of equal keys as an aligned text table (None shows as '-')."""
    headers = list(rows[0])
    cells = [[("-" if row[h] is None else str(row[h])) for h in headers] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _metrics_text(metrics: object) -> str:
    if not isinstance(metrics, dict) or not metrics:
        return "-"
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def _short_status(status: str) -> str:
    """'valid', 'unsigned' or 'INVALID' (prefixed for a master manifest copy), without the details."""
    copy = "master manifest copy: "
    core = status.removeprefix(copy)
    verdict = "INVALID" if core.startswith("INVALID") else core.split(" (")[0]
    return ("master copy " if status.startswith(copy) else "") + verdict


def _short_time(stamp: str | None) -> str:
    """An ISO timestamp to the second, for tables (JSON output keeps the full value)."""
    return stamp[:19].replace("T", " ") + ("Z" if stamp.endswith("+00:00") else "") if stamp else "-"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
