"""A synthetic horizontal demo: three hospitals with the same columns and different patients.

`make_horizontal_scenario(out_dir)` writes, per hospital, ``<name>/train.parquet`` (past patients with
the label ``readmitted`` yes/no) and ``<name>/new.parquet`` (patients to score, without the label), keyed
by ``patient_id`` strings unique across hospitals ("RIV-000123"). The hospitals serve different
populations (age mix, smoking, diabetes prevalence), so each one alone sees a skewed sample and the
federated model generalises better. ``truth/new.parquet`` holds the true labels of every new patient:
DEMO-ONLY ground truth for scoring, which no real federation has.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedcore.errors import ParameterError

ID_COLUMN = "patient_id"
LABEL = "readmitted"
HOSPITALS = {  # name: (id prefix, share of patients, mean age, smoker rate, diabetes rate)
    "riverside": ("RIV", 0.45, 62.0, 0.18, 0.22),
    "lakeside": ("LAK", 0.35, 48.0, 0.30, 0.12),
    "hillcrest": ("HIL", 0.20, 70.0, 0.10, 0.30),
}
FEATURES = ["age", "bmi", "systolic_bp", "cholesterol", "prior_admissions", "length_of_stay", "smoker",
            "diabetes", "discharge_to"]


def _patients(rng: np.random.Generator, n: int, mean_age: float, smoker_rate: float,
              diabetes_rate: float) -> pd.DataFrame:
    """`n` patients of one hospital's population, with the readmission label drawn from a shared model."""
    age = np.clip(rng.normal(mean_age, 12, n), 18, 99).round().astype(np.int64)
    bmi = np.clip(rng.normal(27 + 0.03 * (age - 50), 4.5, n), 15, 55).round(1)
    systolic = np.clip(rng.normal(118 + 0.5 * (age - 40), 14, n), 85, 220).round().astype(np.int64)
    cholesterol = np.clip(rng.normal(5.2 + 0.01 * (age - 50), 1.0, n), 2.5, 10).round(2)
    prior = rng.poisson(0.3 + 0.02 * np.maximum(age - 50, 0), n).clip(0, 12).astype(np.int64)
    stay = np.clip(rng.gamma(2.0, 2.0 + 0.03 * (age - 40), n), 1, 60).round().astype(np.int64)
    smoker = rng.choice(["never", "former", "current"], n, p=[1 - smoker_rate - 0.15, 0.15, smoker_rate])
    diabetes = rng.choice(["none", "type1", "type2"], n, p=[1 - diabetes_rate, 0.1 * diabetes_rate,
                                                           0.9 * diabetes_rate])
    discharge = rng.choice(["home", "home_care", "rehab", "nursing"], n, p=[0.6, 0.2, 0.12, 0.08])
    logit = (-2.2 + 0.035 * (age - 60) + 0.55 * prior + 0.06 * (stay - 5) + 0.012 * (systolic - 130)
             + 0.5 * (smoker == "current") + 0.6 * (diabetes == "type2") + 0.9 * (diabetes == "type1")
             + 0.7 * (discharge == "nursing") + 0.35 * (discharge == "rehab") + 0.05 * (bmi - 27))
    readmitted = np.where(rng.random(n) < 1 / (1 + np.exp(-logit)), "yes", "no")
    frame = pd.DataFrame({"age": age, "bmi": bmi, "systolic_bp": systolic, "cholesterol": cholesterol,
                          "prior_admissions": prior, "length_of_stay": stay,
                          "smoker": pd.Categorical(smoker, categories=["current", "former", "never"]),
                          "diabetes": pd.Categorical(diabetes, categories=["none", "type1", "type2"]),
                          "discharge_to": pd.Categorical(discharge,
                                                         categories=["home", "home_care",
                                                                     "nursing", "rehab"]),
                          LABEL: readmitted})
    for column, rate in (("bmi", 0.06), ("cholesterol", 0.12), ("smoker", 0.04)):
        frame.loc[rng.random(n) < rate, column] = np.nan
    return frame


def make_horizontal_scenario(out_dir: str | Path, n_patients: int = 9000, new_share: float = 0.15,
                             seed: int = 0) -> dict:
    """Write the hospitals' train/new tables under `out_dir`.

    Returns where everything is and the row counts.
    """
    if n_patients < 300:
        raise ParameterError(f"n_patients must be at least 300 for three hospitals, got {n_patients}")
    out = Path(out_dir)
    rng = np.random.default_rng(seed)
    institutions, truth = {}, []
    for name, (prefix, share, mean_age, smoker, diabetes) in HOSPITALS.items():
        n = int(round(share * n_patients))
        frame = _patients(rng, n, mean_age, smoker, diabetes)
        frame.insert(0, ID_COLUMN, [f"{prefix}-{i:06d}" for i in rng.permutation(n)])
        n_new = int(round(new_share * n))
        new, train = frame.iloc[:n_new], frame.iloc[n_new:]
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        train.reset_index(drop=True).to_parquet(folder / "train.parquet", index=False)
        new.drop(columns=[LABEL]).reset_index(drop=True).to_parquet(folder / "new.parquet", index=False)
        truth.append(new[[ID_COLUMN, LABEL]].assign(hospital=name))
        institutions[name] = {"train": str(folder / "train.parquet"), "new": str(folder / "new.parquet"),
                              "train_rows": len(train), "new_rows": n_new}
    (out / "truth").mkdir(parents=True, exist_ok=True)
    pd.concat(truth, ignore_index=True).to_parquet(out / "truth" / "new.parquet", index=False)
    return {"institutions": institutions, "id_column": ID_COLUMN, "label": LABEL,
            "truth": {"new": str(out / "truth" / "new.parquet")}}
