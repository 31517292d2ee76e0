"""A complete horizontal forest as a Treelite model (its model builder; float64 thresholds and leaves).

Every split is Treelite's numerical test `x <= threshold` with `default_left=False` (NaN goes right, as in
fedforest), leaves carry the class probabilities (a leaf vector) or the value, and the trees' outputs are
averaged (`average_tree_output`), as a forest's are. Predictions through Treelite's own predictor
(`treelite.gtil.predict`) or a compiled library (TL2cgen) equal fedforest's up to the order of a float64
sum. Needs the optional `treelite` package (Apache-2.0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcore.errors import ParameterError
from fedcore.models.export import INSTALL_HINT, ExportedTrees


def _model_builder() -> Any:
    try:
        from treelite import model_builder
    except ImportError as error:
        raise ParameterError(f"Treelite export needs the treelite package: {INSTALL_HINT}") from error
    return model_builder


def to_treelite(trees: ExportedTrees) -> Any:
    """The `treelite.Model` of `trees` (save it with its `serialize(path)`)."""
    builder_module = _model_builder()
    forest, width = trees.forest, trees.n_outputs
    classifier = trees.is_classifier
    metadata = builder_module.Metadata(
        num_feature=trees.n_features, task_type="kMultiClf" if classifier else "kRegressor",
        average_tree_output=True, num_target=1, num_class=[width if classifier else 1],
        leaf_vector_shape=(1, width))
    annotation = builder_module.TreeAnnotation(num_tree=forest.n_trees, target_id=[0] * forest.n_trees,
                                               class_id=[-1 if classifier else 0] * forest.n_trees)
    builder = builder_module.ModelBuilder(
        threshold_type="float64", leaf_output_type="float64", metadata=metadata, tree_annotation=annotation,
        postprocessor=builder_module.PostProcessorFunc("identity_multiclass" if classifier else "identity"),
        base_scores=[0.0] * width)
    offsets = forest.tree_offsets()
    for tree in range(forest.n_trees):
        builder.start_tree()
        for row in range(int(offsets[tree]), int(offsets[tree + 1])):
            builder.start_node(int(forest.node[row]))
            if forest.feature[row] < 0:
                value = forest.value[row]
                builder.leaf([float(v) for v in value] if classifier else float(value[0]))
            else:
                builder.numerical_test(int(forest.feature[row]), float(forest.threshold[row]),
                                       default_left=False, opname="<=", left_child_key=int(forest.left[row]),
                                       right_child_key=int(forest.right[row]))
            builder.end_node()
        builder.end_tree()
    return builder.commit()


def treelite_predict(model: Any, X: np.ndarray) -> np.ndarray:
    """Treelite's own predictor on the encoded rows: (n_rows, n_outputs) probabilities or values."""
    import treelite

    out = treelite.gtil.predict(model, np.ascontiguousarray(X, dtype=np.float64))
    return np.asarray(out, dtype=np.float64).reshape(len(X), -1)
