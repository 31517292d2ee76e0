"""Registering a trained model version, promoting it, and describing it in a model card."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from fedcore.config import FederationConfig
from fedcore.errors import ArtifactError, ConfigError
from fedcore.metrics import promotion_refusal
from fedcore.models.card import importance_kind, importance_rows, model_card, version_markdown
from fedcore.models.pictures import pictures_markdown, version_pictures
from fedcore.models.publish import register_everywhere
from fedcore.models.registry import PRODUCTION, ModelRegistry
from fedcore.session import MasterSession
from tasks.common import DATA_LOCAL, NOT_PERSISTED


def master_registry(config: FederationConfig) -> ModelRegistry:
    """The master's registry, signing or only trusting the master's key.

    It signs with master.signing_key (training, promoting), or, where only the public key is at hand, trusts
    master.public_key (resolving versions to predict with).
    """
    if config.master_signing_key is not None:
        return ModelRegistry(config.master_registry, signing_key=config.master_signing_key)
    if config.master_public_key is not None:
        return ModelRegistry(config.master_registry, public_key=config.master_public_key)
    raise ConfigError(f"{config.path}: master.signing_key is not set, but every model version and alias move "
                      "is signed by the master: create a key (fedforest models keygen --out "
                      "keys/master.key) and name it as master.signing_key")


@task(**DATA_LOCAL)
def register_model(config: FederationConfig, session: MasterSession, model_name: str, manifest: dict) -> str:
    """Write the signed master version, then every institution's partial model under the same version.

    It is two-phase (`fedcore.models.publish`): an earlier run's uncommitted version is withdrawn everywhere
    first.
    """
    registry = master_registry(config)
    version, stored = register_everywhere(registry, session, model_name, manifest, session.master_tables())
    session.drop_checkpoints()  # the version is stored everywhere: the run's checkpoints are done
    markdown = version_markdown(config, model_name, version, registry.read_manifest(model_name, version))
    create_markdown_artifact(markdown, key="model-version",
                             description=f"{model_name} {version}: where it is, how to load it")
    get_run_logger().info("registered %s %s in %s; institutions stored theirs at %s", model_name, version,
                          config.master_registry / model_name / version, sorted(stored))
    return version


def previous_production(config: FederationConfig, model_name: str) -> dict | None:
    """The manifest of the current production version, if there is one."""
    registry = master_registry(config)
    try:
        return registry.read_manifest(model_name, PRODUCTION)
    except ArtifactError:
        return None


@task(**NOT_PERSISTED)
def promote_if_not_worse(config: FederationConfig, model_name: str, version: str, metrics: dict,
                         production: dict | None, metric: str, margin: float) -> bool:
    """Make `version` production unless it is worse than production by more than `margin` on `metric`."""
    logger = get_run_logger()
    refusal = promotion_refusal(metric, metrics, None if production is None else production.get("metrics"),
                                margin)
    if refusal is not None:
        logger.warning("not promoting %s: %s", version, refusal)
        return False
    master_registry(config).promote(model_name, version)
    logger.info("promoted %s %s to production", model_name, version)
    return True


@task(**NOT_PERSISTED)
def publish_model_card(model_name: str, version: str, manifest: dict, production: dict | None, promoted: bool,
                       prediction: dict | None) -> str:
    """Publish the version's model card (`fedcore.models.card.model_card`) as the `model-card` artifact."""
    markdown = model_card(model_name, version, manifest, production, promoted, prediction)
    create_markdown_artifact(markdown, key="model-card", description=f"{model_name} {version}")
    if manifest.get("importances"):  # horizontal: the whole table (every institution holds the forest)
        create_table_artifact(importance_rows(manifest["importances"]), key="feature-importances",
                              description=f"{model_name} {version}: {importance_kind(manifest)} importances, "
                                          "summing to 1")
    shares = [{"institution": p["name"], "importance_share": round(p["importance_share"], 6)}
              for p in manifest.get("parties", []) if "importance_share" in p]
    if shares:  # vertical: each institution's share only; its features' are in its own agent run
        create_table_artifact(shares, key="importance-shares",
                              description=f"{model_name} {version}: each institution's share of the "
                                          "importances (its features' stay at home)")
    return markdown


@task(**NOT_PERSISTED)
def publish_pictures(config: FederationConfig, model_name: str, version: str) -> list[str]:
    """Publish the version's pictures (`fedcore.models.pictures`) as the `model-pictures` artifact.

    Data-URI SVG images in markdown, which Prefect's UI shows inline (checked in a headless browser:
    `tools/ui_screenshot.py`); returns the pictures' names.
    """
    pictures = version_pictures(master_registry(config), model_name, version, config.promotion_metric)
    create_markdown_artifact(pictures_markdown(f"{model_name} {version}", pictures), key="model-pictures",
                             description=f"{model_name} {version}: held-out pictures, importances, "
                                         f"{config.promotion_metric} across versions")
    return list(pictures)
