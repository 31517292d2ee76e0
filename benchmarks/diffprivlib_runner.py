"""IBM diffprivlib's RandomForestClassifier on one split, run in its own virtual environment (bench_dp.py).

diffprivlib needs scikit-learn below 1.7, older than fedforest's test suite uses, so `benchmarks/bench_dp.py`
runs this file with the interpreter of a separate virtual environment. It imports numpy and diffprivlib only.

    python diffprivlib_runner.py IN.npz OUT.json

IN.npz holds x_train, y_train, x_test (float64; labels as integer codes), low, high (the declared bounds),
classes, epsilon, trees, max_depth and seed; OUT.json gets the test predictions and the fit's seconds.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    """Fit on the training rows at the given total epsilon (centralized, declared bounds and classes)."""
    from diffprivlib.models import RandomForestClassifier

    source, target = sys.argv[1], sys.argv[2]
    data = np.load(source)
    model = RandomForestClassifier(
        n_estimators=int(data["trees"]), epsilon=float(data["epsilon"]),
        bounds=(data["low"], data["high"]), classes=list(data["classes"]),
        max_depth=int(data["max_depth"]), random_state=int(data["seed"]))
    started = time.process_time()
    model.fit(data["x_train"], data["y_train"])
    seconds = time.process_time() - started
    predicted = model.predict(data["x_test"])
    with open(target, "w") as handle:
        json.dump({"predicted": [int(v) for v in predicted], "fit_s": seconds}, handle)


if __name__ == "__main__":
    main()
