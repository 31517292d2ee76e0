"""Exporting a complete horizontal model: the form both exporters read, and writing a registered version.

Both exporters (`fedcore.models.onnx_export`, `fedcore.models.treelite_export`) walk the same per-node arrays
of a `HorizontalForest`: a node is internal when its feature is >= 0 and sends a row left when
`x[feature] <= threshold`; NaN (a missing value, or a category outside the agreed list) goes right. Their
input is the matrix `HorizontalSchema.encode` makes (numbers as they are, categories as codes in the agreed
list); the schema travels with the export so a server encodes rows the same way. A forest's outputs are its
trees' mean; a boosted model's (`TreeCombination` "sum") its base score plus the trees' leaf weights (tree t
to margin t mod K) through its link: identity, sigmoid (two classes) or softmax.

Only a horizontal model can be exported: every institution holds it whole. A vertical model's thresholds
stay at the parties that own them (docs/design.md), so it cannot leave the federation.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcore.errors import ArtifactError, ParameterError
from fedcore.horizontal.model import MODEL_TABLE, HorizontalForest
from fedcore.models.registry import ModelRegistry

RUNNABLE_FORMATS = ("onnx", "treelite")
"""What a serving runtime runs: a complete (horizontal) model only."""
FORMATS = (*RUNNABLE_FORMATS, "structure")
"""`structure`: the version's tree tables as JSON, any setting (`fedcore.models.structure_export`)."""
INSTALL_HINT = "install the export extra: pip install 'fedforest[export]'"
NOT_EXPORTABLE = ("its split thresholds stay at the institutions that own them, so it cannot run outside the "
                  "federation (docs/design.md, Export): only horizontal models export to onnx or treelite")
"""Why a vertical model is refused by ONNX and Treelite (the CLI's and the estimators' refusal)."""


@dataclass(frozen=True)
class ExportedTrees:
    """The nodes of a complete model in the form both exporters write (see module doc)."""

    forest: HorizontalForest
    classes: tuple | None
    """Classification: the class labels in output order; None for regression."""
    feature_names: tuple[str, ...]

    @property
    def n_features(self) -> int:
        """Columns of the encoded input matrix."""
        return len(self.feature_names)

    @property
    def n_outputs(self) -> int:
        """Values per leaf: class probabilities, or one value (a boosted tree's leaf weight)."""
        return int(self.forest.value.shape[1])

    @property
    def is_classifier(self) -> bool:
        """True when the model predicts classes."""
        return self.classes is not None

    @property
    def boosted(self) -> bool:
        """Boosting: base score plus the trees' leaf weights through a link, not a forest's mean."""
        return self.forest.combination.kind == "sum"

    @property
    def n_margins(self) -> int:
        """Boosting: the margins a round's trees add to (tree t to margin t mod K), before the link."""
        return self.forest.combination.trees_per_round

    def leaf_weights(self) -> np.ndarray:
        """Each node's contribution to the output when a row ends there, (n_nodes, n_outputs).

        A forest's mean becomes a sum of leaf values over the trees divided by their number, so both
        exporters sum (their one aggregate that every runtime implements alike); a boosted tree's leaf weight
        is added as it is.
        """
        return self.forest.value if self.boosted else self.forest.value / self.forest.n_trees

    def is_leaf(self) -> np.ndarray:
        """Mask of leaves (no split feature)."""
        return self.forest.feature < 0


def exported_trees(forest: HorizontalForest) -> ExportedTrees:
    """The export form of a complete horizontal forest, refused without the schema that encodes its input."""
    if forest.schema is None:
        raise ArtifactError("this model carries no schema: its input encoding (column order, category "
                            "codes) is unknown, so it cannot be exported")
    classes = tuple(forest.schema.classes or ()) if forest.task == "classification" else None
    return ExportedTrees(forest, classes, tuple(forest.schema.names))


def write_export(trees: ExportedTrees, fmt: str, out: str | os.PathLike, algorithm: str = "") -> Path:
    """Write `trees` as an ONNX or Treelite file at `out` (replaced whole, never half-written)."""
    if fmt not in RUNNABLE_FORMATS:
        raise ParameterError(f"export format must be one of {list(RUNNABLE_FORMATS)}, got {fmt!r}")
    if fmt == "onnx":
        from fedcore.models.onnx_export import to_onnx

        document = to_onnx(trees, algorithm).SerializeToString()
        return _replace_whole(out, lambda path: path.write_bytes(document))
    from fedcore.models.treelite_export import to_treelite

    return _replace_whole(out, lambda path: to_treelite(trees).serialize(str(path)))


def _replace_whole(out: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """`write` a staging file beside `out`, then move it over `out`: never a half-written export."""
    target = Path(out)
    staging = target.with_name(f".{target.name}.partial")
    write(staging)
    os.replace(staging, target)
    return target


def export_version(registry: ModelRegistry, model_name: str, ref: str, fmt: str,
                   out: str | os.PathLike) -> tuple[str, Path]:
    """Export a registered version (verified as `load` verifies it): (its version, the file written).

    `structure` writes the tables this registry holds of it as JSON (a vertical version's: the master's
    structure, or an institution's own splits); ONNX and Treelite refuse a vertical version: no single place
    holds its thresholds.
    """
    version = registry.resolve(model_name, ref)
    manifest, tables = registry.load(model_name, version)
    if fmt == "structure":
        from fedcore.models.structure_export import structure_json

        document = structure_json(manifest, tables)
        return version, _replace_whole(out, lambda path: path.write_bytes(document))
    if manifest.get("setting") != "horizontal":
        raise ArtifactError(f"model {model_name!r} {version} is a {manifest.get('setting')} model: "
                            f"{NOT_EXPORTABLE}; --format structure writes the tables this registry holds")
    if MODEL_TABLE not in tables:
        raise ArtifactError(f"model {model_name!r} {version}: no {MODEL_TABLE!r} table in {registry.root}")
    forest = HorizontalForest.from_table(tables[MODEL_TABLE])
    return version, write_export(exported_trees(forest), fmt, out, str(manifest.get("algorithm") or ""))
