"""`fedforest models`: inspect and manage a model registry (see fedcore.models.registry).

    fedforest models list     --registry DIR [--model NAME] [--public-key FILE] [--json]
    fedforest models show     --registry DIR --model NAME [--version REF] [--public-key FILE] [--json]
    fedforest models promote  --registry DIR --model NAME --version REF [--alias production] [--public-key FILE]
    fedforest models rollback --registry DIR --model NAME [--alias production] [--public-key FILE]
    fedforest models keygen   --out FILE      (writes FILE, mode 0600, and FILE.pub)

Without --public-key, signatures are checked against the key each manifest carries (integrity, not trust).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedcore.errors import ArtifactError
from fedcore.models.registry import LATEST, PRODUCTION, ModelRegistry
from fedcore.models.signing import generate_signing_key, key_id, public_key_pem, write_new_file

PUBLIC_SUFFIX = ".pub"


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
    show.set_defaults(handler=_show)

    promote = sub.add_parser("promote", help="point an alias (default production) at a verified version")
    _registry_options(promote)
    promote.add_argument("--version", required=True, metavar="REF", help="the version to promote (e.g. v0003)")
    promote.add_argument("--alias", default=PRODUCTION, help="alias to move (default production)")
    promote.set_defaults(handler=_promote)

    rollback = sub.add_parser("rollback", help="move an alias back to its previous version")
    _registry_options(rollback)
    rollback.add_argument("--alias", default=PRODUCTION, help="alias to move back (default production)")
    rollback.set_defaults(handler=_rollback)

    keygen = sub.add_parser("keygen", help="create an Ed25519 signing key (FILE) and its public key (FILE.pub)")
    keygen.add_argument("--out", required=True, metavar="FILE", help="private key file to create (never overwritten)")
    keygen.set_defaults(handler=_keygen)


def _registry_options(parser: argparse.ArgumentParser, model_required: bool = True) -> None:
    parser.add_argument("--registry", required=True, metavar="DIR", help="the registry directory")
    parser.add_argument("--model", required=model_required, metavar="NAME", help="the model name")
    parser.add_argument("--public-key", metavar="FILE", help="trusted public key (PEM); signatures must verify under it")


def _open(args: argparse.Namespace) -> ModelRegistry:
    return ModelRegistry(args.registry, public_key=Path(args.public_key) if args.public_key else None)


def _list(args: argparse.Namespace) -> int:
    """Exit 1 when a listed version fails its checks (signature and every file's SHA-256)."""
    registry = _open(args)
    rows = _version_rows(registry, args.model) if args.model else _model_rows(registry)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no models in {registry.root}")
    else:
        print(format_table(rows))
        if args.model:
            print("checked: each version's signature and the SHA-256 of every file it lists")
    if not args.json:
        for name in [args.model] if args.model else registry.models():
            pending = registry.pending(name)
            if pending:
                print(f"{name}: uncommitted {', '.join(pending)} (a run stopped before every institution stored "
                      "it; not listed, and withdrawn everywhere by the next retrain)")
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
    rows = []
    for version in registry.versions(model):
        info = registry.describe(model, version, verify=True)
        rows.append({"version": version, "created_at": _short_time(info["created_at"]),
                     "algorithm": info["algorithm"] or "-",
                     "aliases": ",".join(sorted(a for a, v in aliases.items() if v == version)) or "-",
                     "metrics": _metrics_text(info["metrics"]), "signature": _short_status(info["signature"]),
                     "integrity": "ok" if info["integrity"] == "ok" else "FAILED"})
    return rows


def _show(args: argparse.Namespace) -> int:
    """Exit 1 when the version fails its checks (signature or files)."""
    info = _open(args).describe(args.model, args.version)
    failed = 1 if info["integrity"] != "ok" else 0
    if args.json:
        print(json.dumps(info, indent=2))
        return failed
    lines = [f"{info['model_name']} {info['version']}" + (f"  [{', '.join(info['aliases'])}]" if info["aliases"] else "")]
    for key in ("created_at", "algorithm", "setting", "task"):
        lines.append(f"  {key + ':':<12}{info[key] if info[key] is not None else '-'}")
    lines.append(f"  {'metrics:':<12}{_metrics_text(info['metrics'])}")
    lines.append(f"  {'signature:':<12}{info['signature']}")
    lines.append(f"  {'integrity:':<12}{info['integrity']}")
    if info["parties"]:
        lines += ["", _indent(format_table(info["parties"]))]
    if info["files"]:
        lines += ["", _indent(format_table(info["files"]))]
    print("\n".join(lines))
    return failed


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
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    if public_path.exists():
        raise ArtifactError(f"{public_path}: already exists; refusing to overwrite a key file")
    key = generate_signing_key(private_path)
    write_new_file(public_path, public_key_pem(key).encode(), 0o644)
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
    return ("master copy " if status.startswith(copy) else "") + ("INVALID" if core.startswith("INVALID") else core.split(" (")[0])


def _short_time(stamp: str | None) -> str:
    """An ISO timestamp to the second, for tables (JSON output keeps the full value)."""
    return stamp[:19].replace("T", " ") + ("Z" if stamp.endswith("+00:00") else "") if stamp else "-"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
