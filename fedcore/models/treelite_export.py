"""A complete horizontal model as a Treelite model (its model builder; float64 thresholds and leaves).

Every split is Treelite's numerical test `x <= threshold` with `default_left=False` (NaN goes right, as in
fedforest), leaves carry the class probabilities (a leaf vector) or the value, and the trees' outputs are
averaged (`average_tree_output`), as a forest's are; a boosted model's leaf weights are summed onto its base
score per class (tree t to class t mod K) and go through its link (Treelite's sigmoid or softmax).
Predictions through Treelite's own predictor (`treelite.gtil.predict`) or a compiled library (TL2cgen) equal
fedforest's up to the order of a float64 sum (a boosted model's margins too; Treelite's own softmax runs at
float32's precision, about 6e-8 from fedforest's). Needs the optional `treelite` package (Apache-2.0).
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
    forest = trees.forest
    header = _boosted_header(trees) if trees.boosted else _forest_header(trees)
    builder = builder_module.ModelBuilder(threshold_type="float64", leaf_output_type="float64", **header)
    offsets = forest.tree_offsets()
    vector_leaves = trees.is_classifier and not trees.boosted
    for tree in range(forest.n_trees):
        builder.start_tree()
        for row in range(int(offsets[tree]), int(offsets[tree + 1])):
            builder.start_node(int(forest.node[row]))
            if forest.feature[row] < 0:
                value = forest.value[row]
                builder.leaf([float(v) for v in value] if vector_leaves else float(value[0]))
            else:
                builder.numerical_test(int(forest.feature[row]), float(forest.threshold[row]),
                                       default_left=False, opname="<=", left_child_key=int(forest.left[row]),
                                       right_child_key=int(forest.right[row]))
            builder.end_node()
        builder.end_tree()
    return builder.commit()


def _forest_header(trees: ExportedTrees) -> dict[str, Any]:
    """A forest: leaf vectors of class probabilities (or one value), averaged over the trees."""
    builder_module = _model_builder()
    width, n_trees, classifier = trees.n_outputs, trees.forest.n_trees, trees.is_classifier
    return {"metadata": builder_module.Metadata(
                num_feature=trees.n_features, task_type="kMultiClf" if classifier else "kRegressor",
                average_tree_output=True, num_target=1, num_class=[width if classifier else 1],
                leaf_vector_shape=(1, width)),
            "tree_annotation": builder_module.TreeAnnotation(num_tree=n_trees, target_id=[0] * n_trees,
                                                             class_id=[-1 if classifier else 0] * n_trees),
            "postprocessor": builder_module.PostProcessorFunc(
                "identity_multiclass" if classifier else "identity"),
            "base_scores": [0.0] * width}


def _boosted_header(trees: ExportedTrees) -> dict[str, Any]:
    """Boosting: one leaf weight a tree, summed onto the base score (tree t to class t mod K), then the link.

    Identity (regression), sigmoid (two classes: Treelite answers the second's p alone), softmax.
    """
    builder_module = _model_builder()
    k, n_trees, combination = trees.n_margins, trees.forest.n_trees, trees.forest.combination
    task, postprocessor = {"identity": ("kRegressor", "identity"), "sigmoid": ("kBinaryClf", "sigmoid"),
                           "softmax": ("kMultiClf", "softmax")}[combination.link]
    classes = k if task == "kMultiClf" else 1
    return {"metadata": builder_module.Metadata(
                num_feature=trees.n_features, task_type=task, average_tree_output=False,
                num_target=1, num_class=[classes], leaf_vector_shape=(1, 1)),
            "tree_annotation": builder_module.TreeAnnotation(
                num_tree=n_trees, target_id=[0] * n_trees,
                class_id=[t % k for t in range(n_trees)] if classes > 1 else [0] * n_trees),
            "postprocessor": builder_module.PostProcessorFunc(postprocessor),
            "base_scores": [float(b) for b in combination.base_score]}


BINARY_TASK = 0
"""Treelite's task type `kBinaryClf` as its header reports it."""


def treelite_predict(model: Any, X: np.ndarray) -> np.ndarray:
    """Treelite's own predictor on the encoded rows: (n_rows, n_outputs) probabilities or values.

    A two-class boosted model's Treelite output is the second class's probability p alone: (1 - p, p) here,
    as fedforest answers.
    """
    import treelite

    out = treelite.gtil.predict(model, np.ascontiguousarray(X, dtype=np.float64))
    out = np.asarray(out, dtype=np.float64).reshape(len(X), -1)
    if int(model.get_header_accessor().get_field("task_type")[0]) == BINARY_TASK:
        return np.column_stack([1.0 - out[:, 0], out[:, 0]])
    return out
