"""A complete horizontal model as an ONNX model (`TreeEnsembleClassifier` / `TreeEnsembleRegressor`).

The operators of ONNX's `ai.onnx.ml` domain, opset 3: thresholds and leaf weights as float64 tensors
(`nodes_values_as_tensor`, `class_weights_as_tensor`), so with a float64 input every split compares exactly
as fedforest does (`x <= threshold`; NaN goes right: `nodes_missing_value_tracks_true = 0`). The operators
sum their leaf weights in float32, so outputs match fedforest's within float32 rounding. The input `X` is
the encoded matrix (`fedcore.models.export`); the schema that encodes it rides in the model's
metadata (`fedforest.schema`). A boosted model is a `TreeEnsembleRegressor` of its margins (base values
the base score) followed by its link in standard operators (Sigmoid, Softmax), so every runtime applies the
same link. Needs the optional `onnx` package (Apache-2.0).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fedcore.errors import ParameterError
from fedcore.models.export import INSTALL_HINT, ExportedTrees

ML_OPSET = 3
"""`ai.onnx.ml` opset 3: the first with float64 thresholds and weights (as tensors)."""
DEFAULT_OPSET = 17
INPUT = "X"
SCHEMA_KEY = "fedforest.schema"


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as error:
        raise ParameterError(f"ONNX export needs the onnx package: {INSTALL_HINT}") from error
    return onnx


def to_onnx(trees: ExportedTrees, algorithm: str = "") -> Any:
    """The ONNX `ModelProto` of `trees` (checked by onnx's own checker)."""
    onnx = _onnx()
    helper, tensor = onnx.helper, onnx.TensorProto
    forest = trees.forest
    rows = helper.make_tensor_value_info(INPUT, tensor.DOUBLE, [None, trees.n_features])
    if trees.boosted:
        graph_nodes, outputs = _boosted(trees)
    else:
        graph_nodes, outputs = _forest(trees)
    graph = helper.make_graph(graph_nodes, "fedforest", [rows], outputs)
    model = helper.make_model(graph, producer_name="fedforest",
                              opset_imports=[helper.make_opsetid("", DEFAULT_OPSET),
                                             helper.make_opsetid("ai.onnx.ml", ML_OPSET)])
    schema = forest.schema.to_dict() if forest.schema is not None else None
    helper.set_model_props(model, {SCHEMA_KEY: json.dumps(schema), "fedforest.algorithm": algorithm,
                                   "fedforest.input": "the rows encoded by the schema: numbers as they are, "
                                                      "categories as their code in the agreed list, missing "
                                                      "and unknown values as NaN"})
    onnx.checker.check_model(model)
    return model


def _tree_nodes(trees: ExportedTrees) -> dict[str, Any]:
    """Every node's attributes of a tree-ensemble operator (splits `x <= threshold`, NaN right)."""
    from onnx import numpy_helper

    forest, leaf = trees.forest, trees.is_leaf()
    return {"nodes_treeids": forest.tree.tolist(), "nodes_nodeids": forest.node.tolist(),
            "nodes_featureids": np.where(leaf, 0, forest.feature).tolist(),
            "nodes_modes": ["LEAF" if is_leaf else "BRANCH_LEQ" for is_leaf in leaf],
            "nodes_truenodeids": np.where(leaf, 0, forest.left).tolist(),
            "nodes_falsenodeids": np.where(leaf, 0, forest.right).tolist(),
            "nodes_missing_value_tracks_true": [0] * forest.n_nodes,
            "nodes_values_as_tensor": numpy_helper.from_array(
                np.where(leaf, 0.0, forest.threshold).astype(np.float64), "nodes_values")}


def _forest(trees: ExportedTrees) -> tuple[list, list]:
    """A forest: its leaves' values summed over the trees, each divided by their number (the mean)."""
    from onnx import TensorProto, helper, numpy_helper

    forest, leaf, width = trees.forest, trees.is_leaf(), trees.n_outputs
    weights = trees.leaf_weights()[leaf]
    leaf_tree, leaf_node = np.repeat(forest.tree[leaf], width), np.repeat(forest.node[leaf], width)
    output_ids = np.tile(np.arange(width), int(leaf.sum()))
    flat_weights = numpy_helper.from_array(weights.reshape(-1).astype(np.float64), "weights")
    if not trees.is_classifier:
        node = helper.make_node(
            "TreeEnsembleRegressor", [INPUT], ["variable"], domain="ai.onnx.ml", name="forest",
            post_transform="NONE", aggregate_function="SUM", n_targets=width,
            target_treeids=leaf_tree.tolist(), target_nodeids=leaf_node.tolist(),
            target_ids=output_ids.tolist(), target_weights_as_tensor=flat_weights, **_tree_nodes(trees))
        return [node], [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, width])]
    labels, label_type = _class_labels(trees.classes or ())
    ensemble = helper.make_node(
        "TreeEnsembleClassifier", [INPUT], ["tree_label", "probabilities"], domain="ai.onnx.ml",
        name="forest", post_transform="NONE", class_treeids=leaf_tree.tolist(),
        class_nodeids=leaf_node.tolist(), class_ids=output_ids.tolist(),
        class_weights_as_tensor=flat_weights, **labels, **_tree_nodes(trees))
    # The label is the most probable class (the first on a tie, as fedforest's argmax): onnxruntime's own
    # label output of two classes answers "class 1's score > 0" when both classes carry weights.
    return [ensemble, *_label_nodes(labels)], _classifier_outputs(label_type, width)


def _boosted(trees: ExportedTrees) -> tuple[list, list]:
    """Boosting: its margins, then its link as ONNX operators.

    The margins: base score plus every tree's leaf weight, tree t to margin t mod K. The link: identity
    (regression), Sigmoid as (1 - p, p) for two classes, Softmax for more.
    """
    from onnx import TensorProto, helper, numpy_helper

    forest, leaf, k = trees.forest, trees.is_leaf(), trees.n_margins
    combination = forest.combination
    margins = helper.make_node(
        "TreeEnsembleRegressor", [INPUT], ["margins"], domain="ai.onnx.ml", name="boosting",
        post_transform="NONE", aggregate_function="SUM", n_targets=k,
        base_values_as_tensor=numpy_helper.from_array(np.asarray(combination.base_score, np.float64),
                                                      "base_values"),
        target_treeids=forest.tree[leaf].tolist(), target_nodeids=forest.node[leaf].tolist(),
        target_ids=(forest.tree[leaf] % k).tolist(),
        target_weights_as_tensor=numpy_helper.from_array(trees.leaf_weights()[leaf, 0].astype(np.float64),
                                                         "weights"),
        **_tree_nodes(trees))
    if not trees.is_classifier:
        identity = helper.make_node("Identity", ["margins"], ["variable"])
        return [margins, identity], [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, k])]
    if combination.link == "sigmoid":
        one = numpy_helper.from_array(np.ones(1, np.float32), "one")
        link = [helper.make_node("Sigmoid", ["margins"], ["positive"]),
                helper.make_node("Constant", [], ["one"], value=one),
                helper.make_node("Sub", ["one", "positive"], ["negative"]),
                helper.make_node("Concat", ["negative", "positive"], ["probabilities"], axis=1)]
    else:
        link = [helper.make_node("Softmax", ["margins"], ["probabilities"], axis=1)]
    labels, label_type = _class_labels(trees.classes or ())
    width = len(trees.classes or ())
    return [margins, *link, *_label_nodes(labels)], _classifier_outputs(label_type, width)


def _label_nodes(labels: dict[str, Any]) -> list:
    """The most probable class's label from `probabilities` (the first on a tie, as fedforest's argmax)."""
    from onnx import helper

    return [helper.make_node("ArgMax", ["probabilities"], ["label_index"], axis=1, keepdims=0),
            helper.make_node("Constant", [], ["class_labels"], value=_label_tensor(labels)),
            helper.make_node("Gather", ["class_labels", "label_index"], ["label"], axis=0)]


def _classifier_outputs(label_type: int, width: int) -> list:
    """A classifier's graph outputs: the label and the class probabilities."""
    from onnx import TensorProto, helper

    return [helper.make_tensor_value_info("label", label_type, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, width])]


def _label_tensor(labels: dict[str, Any]) -> Any:
    """The class labels as a constant tensor (strings or int64), indexed by the label's class code."""
    from onnx import TensorProto, helper, numpy_helper

    if "classlabels_strings" in labels:
        return helper.make_tensor("class_labels", TensorProto.STRING, [len(labels["classlabels_strings"])],
                                  [s.encode() for s in labels["classlabels_strings"]])
    return numpy_helper.from_array(np.array(labels["classlabels_int64s"], dtype=np.int64), "class_labels")


def _class_labels(classes: tuple) -> tuple[dict[str, Any], int]:
    """The classifier's labels: the classes themselves when ints or strings, else their codes 0..k-1."""
    from onnx import TensorProto

    if all(isinstance(c, str) for c in classes):
        return {"classlabels_strings": list(classes)}, TensorProto.STRING
    if all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in classes):
        return {"classlabels_int64s": [int(c) for c in classes]}, TensorProto.INT64
    return {"classlabels_int64s": list(range(len(classes)))}, TensorProto.INT64
