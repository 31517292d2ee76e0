"""Registering a trained model version, promoting it, and describing it in a model card."""

from __future__ import annotations

import subprocess
from importlib.metadata import version as package_version
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from fedcore.config import FederationConfig
from fedcore.errors import ArtifactError, ConfigError
from fedcore.models.publish import register_everywhere
from fedcore.models.registry import PRODUCTION, ModelRegistry
from fedcore.vertical.session import VerticalSession
from tasks.common import DATA_LOCAL


def master_registry(config: FederationConfig) -> ModelRegistry:
    """The master's registry: signing with master.signing_key (training, promoting), or, where only the
    public key is at hand, trusting master.public_key (resolving versions to predict with)."""
    if config.master_signing_key is not None:
        return ModelRegistry(config.master_registry, signing_key=config.master_signing_key)
    if config.master_public_key is not None:
        return ModelRegistry(config.master_registry, public_key=config.master_public_key)
    raise ConfigError(f"{config.path}: master.signing_key is not set, but every model version and alias move is "
                      "signed by the master: create a key (fedforest models keygen --out keys/master.key) and name "
                      "it as master.signing_key")


def code_version() -> str:
    """The installed fedforest version, plus the git commit when run from a checkout."""
    text = package_version("fedforest")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{text}+{commit}" if commit else text


def build_manifest(config: FederationConfig, session: VerticalSession, metrics: dict, validation: dict,
                   alignment: dict, training: dict) -> dict:
    """The master's manifest: what was trained, on what, how well, and with which code (docs/design.md)."""
    info = session.master.info
    counts = {name: int((info.feature_owner == i).sum()) for i, name in enumerate(info.parties)}
    return {
        "algorithm": config.algorithm, "setting": config.setting, "task": session.params.task,
        "params": session.params.to_dict(),
        "parties": [{**party, "feature_count": counts[party["name"]],
                     "owned_nodes": training["owned_nodes"].get(party["name"], 0)}
                    for party in session.manifest_parties()],
        "metrics": metrics,
        "training": {"rows": alignment["train_rows"], "holdout_rows": alignment["holdout_rows"],
                     "overlap": alignment["overlap"], "seconds": training["seconds"], "rounds": training["rounds"],
                     "bytes": training["bytes"], "nodes": training["nodes"]},
        "lineage": {"federation": config.federation, "contracts": validation, "data_fingerprints": session.fingerprints,
                    "code_version": code_version()},
    }


@task(**DATA_LOCAL)
def register_model(config: FederationConfig, session: VerticalSession, model_name: str, manifest: dict) -> str:
    """Write the signed master version, then every institution's partial model under the same version, two-phase
    (`fedcore.models.publish`): an earlier run's uncommitted version is withdrawn everywhere first."""
    registry = master_registry(config)
    version, stored = register_everywhere(registry, session, model_name, manifest, session.master_tables())
    if hasattr(session, "drop_checkpoints"):
        session.drop_checkpoints()  # the version is stored everywhere: the run's checkpoints are done
    markdown = model_version_markdown(config, model_name, version, registry.read_manifest(model_name, version))
    create_markdown_artifact(markdown, key="model-version", description=f"{model_name} {version}: where it is, "
                                                                        "how to load it")
    get_run_logger().info("registered %s %s in %s; institutions stored theirs at %s", model_name, version,
                          config.master_registry / model_name / version, sorted(stored))
    return version


def model_version_markdown(config: FederationConfig, model_name: str, version: str, manifest: dict) -> str:
    """Where a registered version is (registry folders, on the master's and institutions' own hosts), its
    digests and signing key, and how to inspect, predict with or load it."""
    folder = config.master_registry / model_name / version
    signature = manifest.get("signature") or {}
    lines = [f"# {model_name} {version}", "",
             f"Registered in the master's registry on the master's host: `{folder}`, signed by key "
             f"`{signature.get('key_id', '-')}` ({signature.get('algorithm', 'unsigned')}).", "",
             "| file | bytes | sha256 |", "|---|---|---|"]
    lines += [f"| {f['name']} | {f['bytes']} | `{f['sha256']}` |" for f in manifest.get("files", [])]
    lines += ["", "Each institution keeps its own part in its own registry; the master's signature covers these "
              "digests:", "", "| institution | role | table sha256 |", "|---|---|---|"]
    lines += [f"| {p['name']} | {p.get('role', '-')} | `{p.get('table_sha256', '-')}` |"
              for p in manifest.get("parties", [])]
    public_key = config.master_public_key or "<the master's public key (PEM)>"
    lines += ["", "## Use it", "", "```", f"fedforest models show --config {config.path} --model {model_name} "
              f"--version {version}", f"fedforest predict --config {config.path} --model {model_name} "
              f"--version {version}", "```", "", "In Python (verifies the signature and every file's SHA-256):", "",
              "```python", "from fedcore.models.registry import ModelRegistry", "",
              f'registry = ModelRegistry("{config.master_registry}", public_key="{public_key}")',
              f'manifest, tables = registry.load("{model_name}", "{version}")', "```"]
    return "\n".join(lines)


def previous_production(config: FederationConfig, model_name: str) -> dict | None:
    """The manifest of the current production version, if there is one."""
    registry = master_registry(config)
    try:
        return registry.read_manifest(model_name, PRODUCTION)
    except ArtifactError:
        return None


@task
def promote_if_not_worse(config: FederationConfig, model_name: str, version: str, metrics: dict,
                         production: dict | None, metric: str, margin: float) -> bool:
    """Make `version` production unless it is worse than production by more than `margin` on `metric`."""
    logger = get_run_logger()
    if production is not None and metric in metrics and metric in production.get("metrics", {}):
        higher_is_better = metric not in ("rmse", "log_loss")
        change = metrics[metric] - production["metrics"][metric]
        worse = -change if higher_is_better else change
        if worse > margin:
            logger.warning("not promoting %s: %s %.4f vs production %.4f (margin %.4f)", version, metric,
                           metrics[metric], production["metrics"][metric], margin)
            return False
    master_registry(config).promote(model_name, version)
    logger.info("promoted %s %s to production", model_name, version)
    return True


@task
def publish_model_card(model_name: str, version: str, manifest: dict, production: dict | None, promoted: bool,
                       prediction: dict | None) -> str:
    """A markdown model card: data sizes, overlap, parameters, metrics vs the previous version, features per
    institution (counts only: names never leave their institution), timings and communication."""
    t, previous = manifest["training"], (production or {}).get("metrics", {})
    vertical = manifest["setting"] == "vertical"
    title = "Federated Forest" if vertical else {"extra-trees": "Federated Extra-Trees", "ppd-ert": "PPD-ERT"}.get(
        manifest["algorithm"], manifest["algorithm"])
    privacy = "" if vertical else f", privacy {manifest['privacy']['mode']}"
    lines = [f"# {model_name} {version}", "",
             f"{title} ({manifest['setting']}, {manifest['task']}{privacy}); "
             f"{'promoted to production' if promoted else 'not promoted'}.", "",
             "## Metrics (held-out rows, computed at the label holder)" if vertical else
             "## Metrics (held-out rows, aggregated from every institution)", "",
             "| metric | this version | previous production |", "|---|---|---|"]
    lines += [f"| {k} | {v:.4f} | {previous[k]:.4f} |" if k in previous else f"| {k} | {v:.4f} | - |"
              for k, v in manifest["metrics"].items()]
    if vertical:
        lines += ["", "## Data", "", f"- aligned rows (ID overlap): {t['overlap']}; training {t['rows']}, "
                  f"held out {t['holdout_rows']}", "", "| institution | role | features | splits owned |",
                  "|---|---|---|---|"]
        lines += [f"| {p['name']} | {p['role']} | {p['feature_count']} | {p['owned_nodes']} |"
                  for p in manifest["parties"]]
    else:
        lines += ["", "## Data", "", f"- {len(manifest['schema']['columns'])} agreed feature columns; training "
                  f"{t['rows']} rows, held out {t['holdout_rows']}", "",
                  "| institution | training rows | held-out rows |", "|---|---|---|"]
        lines += [f"| {p['name']} | {p['train_rows']} | {p['holdout_rows']} |" for p in manifest["parties"]]
    params = manifest["params"]
    lines += ["", "## Training", "",
              f"- {params['n_estimators']} trees, max_depth {params['max_depth']}, max_features "
              f"{params['max_features']}, criterion {params['criterion']}", f"- {t['seconds']:.1f} s, {t['rounds']} "
              f"rounds, {t['bytes'] / 2**20:.1f} MiB exchanged, {t['nodes']} nodes",
              f"- code {manifest['lineage']['code_version']}"]
    if prediction and "requester" in prediction:
        lines += ["", "## Batch prediction", "", f"- {prediction['rows']} rows delivered to "
                  f"{prediction['requester']} in {prediction['seconds']:.1f} s"]
    elif prediction:
        lines += ["", "## Batch prediction", "", f"- {prediction['rows']} rows predicted locally at "
                  + ", ".join(f"{name} ({count})" for name, count in prediction["counts"].items())
                  + f" in {prediction['seconds']:.1f} s"]
    markdown = "\n".join(lines)
    create_markdown_artifact(markdown, key="model-card", description=f"{model_name} {version}")
    return markdown
