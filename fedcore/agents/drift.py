"""An institution's drift check at batch prediction: its own features against its own training rows.

The snapshot (`fedcore.drift.training_snapshot`) is made when the institution stores a version and kept in
its registry copy's manifest; the batch's per-feature PSI goes to the agent's own run (`reports["drift"]`),
and only the features whose PSI reaches its configured `drift.psi_threshold`, with their scores, go to the
master, which names them in the run's final message. With `drift.on_drift: fail` the institution refuses to
predict such a batch instead (`BatchDrift`, naming them).
"""

from __future__ import annotations

import logging

from fedcore.drift import DriftSettings
from fedcore.errors import BatchDrift

log = logging.getLogger(__name__)


def check_batch(institution: str, settings: DriftSettings | None, scores: dict[str, float] | None,
                reports: dict[str, list[dict]]) -> dict[str, float]:
    """The batch's drifted features {name: PSI to 4 digits}, most drifted first, from its `scores`.

    `scores` None: not checked (no snapshot). The full table goes to `reports["drift"]`. Refused
    (BatchDrift) when any drifted and `settings.on_drift` is fail.
    """
    settings = settings or DriftSettings()
    if scores is None:  # no snapshot (a version stored before snapshots were kept), or no batch
        log.info("%s: batch drift not checked (no training snapshot for this version, or no batch)",
                 institution)
        reports.pop("drift", None)
        return {}
    ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
    reports["drift"] = [{"feature": name, "psi": round(value, 4),
                         "drifted": value >= settings.psi_threshold} for name, value in ranked]
    drifted = {name: round(value, 4) for name, value in ranked if value >= settings.psi_threshold}
    if drifted:
        listed = ", ".join(f"{name} {value:.4f}" for name, value in drifted.items())
        if settings.on_drift == "fail":
            raise BatchDrift(f"institution {institution!r} refuses to predict: its batch drifted from its "
                             f"training rows (PSI >= {settings.psi_threshold:g}): {listed}; "
                             "drift.on_drift is fail (retrain on recent rows, or set on_drift: warn)")
        log.warning("%s: batch drifted from its training rows (PSI >= %g): %s", institution,
                    settings.psi_threshold, listed)
    return drifted
