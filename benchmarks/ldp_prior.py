"""Label DP with a prior (issue #31), throwaway: do two or three stages close FET-LDP's gap on many classes?

Ghazi, Golowich, Kumar, Manurangsi and Zhang, "Deep Learning with Label Differential Privacy" (NeurIPS 2021):
the training rows are split into stages; stage 1 reports its labels by FET-LDP's `auto` oracle (k-RR or OUE
at --epsilon, `ldp_leaves.reports`); a model trained on the reports so far (post-processing) gives each row of
the next stage a prior over the classes from its features, and that row reports by RR-with-prior: k-RR on
the top-k classes of its prior, k maximising prior(top k) e^eps / (e^eps + k - 1), a label outside the set
giving a uniform member of it. Every row reports once at the same epsilon.

The learner stands in for FET-LDP (pooled rows, scikit-learn): ExtraTreesRegressor (--trees, max_features
sqrt, min_samples_leaf from --leaf-sizes) on each row's label vector, every tree's leaf mean projected onto
the simplex and the trees' projections summed (FET-LDP's leaf estimate). A one-oracle report's vector is its
debiased bits, (bits - q) / (p - q) (unbiased for the one-hot label, as FET-LDP's count estimates); an
RR-with-prior report's vector is, by --stage-target, its one-hot ("hard": the paper's, taken as the label) or
the posterior of the label given the row's prior and the report ("soft"). Schedules (--schedules, ';'
between schedules, ',' between stage fractions): "1" is one stage (today's FET-LDP, the in-run reference of
the same learner); "0.3,0.7" two stages; "0.1,0.2,0.7" three. ExtraTreesClassifier on the true labels is the
non-private reference. Prints accuracy and points below ExtraTrees per (table, epsilon, schedule, target,
leaf size), means over --seeds (each its own split, as bench_dp). --learner fet runs the same stages in our
FET-LDP instead (`fet_staged`; --exact counts the later stages' reports as their one-hots);
docs/benchmarks.md, "Label DP with a prior, measured again", has both.

    .venv/bin/python -m benchmarks.ldp_prior --tables letter --epsilons 2,4 --seeds 3
    .venv/bin/python -m benchmarks.ldp_prior --learner fet --exact --schedules "1;0.2,0.8;0.4,0.6;0.1,0.2,0.7"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.bench_dp import LABELS
from benchmarks.ldp_leaves import reports
from benchmarks.markdown import markdown_table
from fedcore.data.split import split_horizontal
from fedcore.privacy.nnls import simplex_projection
from fedcore.simulation import build_estimator, declared_ranges, split_train_test


def top_k(prior: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """Each row's classes by descending prior (n, C) and its k: the paper's choice (ties: the smallest k)."""
    order = np.argsort(-prior, axis=1, kind="stable")
    mass = np.cumsum(np.take_along_axis(prior, order, axis=1), axis=1)
    e = math.exp(epsilon)
    k = np.argmax(mass * (e / (e + np.arange(prior.shape[1]))), axis=1) + 1
    return order, k


def rr_with_prior(y: np.ndarray, prior: np.ndarray, epsilon: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's report under RR-with-prior, with its ranked classes and k (for the posterior)."""
    order, k = top_k(prior, epsilon)
    e = math.exp(epsilon)
    rank = np.argmax(order == y[:, None], axis=1)  # where the true label sits in the row's ranking
    inside = rank < k
    keep = rng.random(len(y)) < e / (e + k - 1)
    other = rng.integers(0, np.maximum(k - 1, 1))  # another member of the set, uniformly
    other_rank = np.where(other >= rank, other + 1, other)
    uniform = rng.integers(0, k)  # a label outside the set: a uniform member
    picked = np.where(inside, np.where(keep | (k == 1), rank, other_rank), uniform)
    return order[np.arange(len(y)), picked], order, k


def posterior(report: np.ndarray, prior: np.ndarray, order: np.ndarray, k: np.ndarray,
              epsilon: float) -> np.ndarray:
    """P(label = c | prior, report) (n, C): the prior times the mechanism's law of the report."""
    n, n_classes = prior.shape
    e = math.exp(epsilon)
    member = np.zeros((n, n_classes), dtype=bool)
    member[np.arange(n)[:, None], order] = np.arange(n_classes)[None, :] < k[:, None]
    law = np.where(member, 1 / (e + k[:, None] - 1), 1 / k[:, None])  # a member not reported; outside
    law[np.arange(n), report] = np.where(k == 1, 1.0, e / (e + k - 1))
    weights = prior * law
    return weights / weights.sum(axis=1, keepdims=True)


class Forest:
    """ExtraTreesRegressor on label vectors; predictions are the trees' simplex-projected leaves, summed."""

    def __init__(self, trees: int, leaf: int, seed: int) -> None:
        """Trees of at least `leaf` rows a leaf, drawn from `seed`."""
        from sklearn.ensemble import ExtraTreesRegressor

        self.model = ExtraTreesRegressor(trees, max_features="sqrt", min_samples_leaf=leaf, random_state=seed,
                                         n_jobs=1)

    def fit(self, x: np.ndarray, targets: np.ndarray) -> Forest:
        """Grow the trees on the rows' label vectors."""
        self.model.fit(x, targets)
        return self

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities (m, C): the mean over trees of each leaf's projected estimate."""
        trees = self.model.estimators_
        total = sum(simplex_projection(tree.predict(x), np.ones((len(x), 1))) for tree in trees)
        return np.asarray(total) / len(trees)


def staged(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, n_classes: int, epsilon: float,
           fractions: list[float], target: str, trees: int, leaf: int, seed: int) -> np.ndarray:
    """Test class scores of the final forest after the stages (each row reports once)."""
    rng = np.random.default_rng([seed, 7])
    order = rng.permutation(len(y))
    bounds = np.round(np.cumsum([0.0, *fractions]) / sum(fractions) * len(y)).astype(int)
    stages = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    first = stages[0]
    bits, own, other = reports(y[first], n_classes, epsilon, rng)
    rows, vectors = [first], [(bits - other) / (own - other)]
    kept = []
    for stage in stages[1:]:
        seen = np.concatenate(rows)
        prior = Forest(trees, leaf, seed).fit(x[seen], np.vstack(vectors)).scores(x[stage])
        prior = np.maximum(prior, 0.0) + 1e-12  # a class no leaf supports keeps a sliver (a defined ranking)
        report, ranked, k = rr_with_prior(y[stage], prior / prior.sum(axis=1, keepdims=True), epsilon, rng)
        kept.append(float((report == y[stage]).mean()))
        vectors.append(np.eye(n_classes)[report] if target == "hard"
                       else posterior(report, prior / prior.sum(axis=1, keepdims=True), ranked, k, epsilon))
        rows.append(stage)
    if kept:
        print(f"    stage reports equal to the label: {', '.join(f'{v:.3f}' for v in kept)}", file=sys.stderr)
    return Forest(trees, leaf, seed).fit(x[np.concatenate(rows)], np.vstack(vectors)).scores(x_test)


def fet_staged(parties: list[pd.DataFrame], test: pd.DataFrame, label: str, classes: list, epsilon: float,
               fractions: list[float], trees: int, seed: int, ranges: dict[str, tuple[float, float]],
               exact: bool = False) -> np.ndarray:
    """The same stages in our FET-LDP (3 parties, in process): test predictions of the final forest.

    Each party's reports are set in place of its drawn permanent responses (`PartyRows.draw_permanent`
    patched for this run only): stage 1 by `reports`, a later stage's rows by RR-with-prior on the prior of
    the forest trained (FET-LDP, the same epsilon) on the earlier stages' rows of all parties; the final
    forest trains on every row. An RR-with-prior report is sent as its one-hot, which the master debiases as
    a k-RR / OUE report (so it weighs 1 / (p - q) times a one-oracle report's expectation); with `exact`
    each party also sends its later stages' one-hot sums apart (`_StagesApart`) and the master counts each
    such report as its one-hot (the estimator a protocol with stages would have).
    """
    from benchmarks.bench_dp import fet
    from fedcore.horizontal import rows as party_rows

    rng = np.random.default_rng([seed, 7])
    code = {c: i for i, c in enumerate(classes)}
    names = [f"party{i}" for i in range(len(parties))]
    frames = dict(zip(names, parties, strict=True))
    labels = {n: f[label].map(code).to_numpy() for n, f in frames.items()}
    stage_of = {}
    for n, y in labels.items():
        cut = np.round(np.cumsum([0.0, *fractions]) / sum(fractions) * len(y)).astype(int)
        stage_of[n] = np.searchsorted(cut[1:], rng.permutation(len(y)), side="right")
    bits = {n: reports(y, len(classes), epsilon, rng)[0].astype(np.uint8) for n, y in labels.items()}
    using: dict[str, np.ndarray] = {}

    def draw_permanent(self: party_rows.PartyRows, ldp: object, key: np.ndarray) -> None:
        self.permanent = bits[self.name][using[self.name]]

    params = {"n_estimators": trees, "max_depth": None, "max_features": "sqrt", "random_state": seed}
    privacy = {"mode": "ldp", "epsilon": epsilon}
    original = party_rows.PartyRows.draw_permanent
    party_rows.PartyRows.draw_permanent = draw_permanent  # type: ignore[method-assign]
    try:
        for stage in range(1, len(fractions)):
            using.update({n: np.flatnonzero(stage_of[n] < stage) for n in names})
            model = build_estimator("extra-trees", privacy, "classification", params, feature_ranges=ranges)
            model.fit({n: frames[n].iloc[using[n]] for n in names}, label=label)
            columns = [code[c] for c in model.classes_]
            for n in names:
                rows = np.flatnonzero(stage_of[n] == stage)
                prior = np.full((len(rows), len(classes)), 1e-12)
                prior[:, columns] += model.predict_proba(frames[n].iloc[rows].drop(columns=[label]))
                report = rr_with_prior(labels[n][rows], prior / prior.sum(axis=1, keepdims=True), epsilon,
                                       rng)[0]
                bits[n][rows] = np.eye(len(classes), dtype=np.uint8)[report]
        using.update({n: np.arange(len(labels[n])) for n in names})
        later = {n: stage_of[n] > 0 for n in names}
        with _StagesApart(later) if exact else contextlib.nullcontext():
            return fet(privacy, list(frames.values()), test, label, params, ranges)[0]
    finally:
        party_rows.PartyRows.draw_permanent = original  # type: ignore[method-assign]


class _StagesApart:
    """Patches for one fit: parties add their later-stage rows' sums apart, the master counts them exactly.

    The party's reply gains `stage2`, the sums of its later-stage rows' reports alone (the same kernel over
    the permanent bits with the stage-1 rows zeroed); the master re-estimates every branch it estimated from
    S1 + (p - q) S2 + q n2 in place of S1 + S2, whose debiasing (x - q) / (p - q) gives each later-stage row
    its one-hot.
    """

    def __init__(self, later: dict[str, np.ndarray]) -> None:
        """`later`: per party name, which of its rows report in a later stage."""
        self.later = later

    def __enter__(self) -> None:
        """Patch the party's LDP reply and the master's estimate."""
        from fedcore.horizontal.fet import master, party

        self.originals = (party.HorizontalParty._ldp_reply, master.FederatedExtraTreesMaster._estimate)
        reply, estimate = self.originals
        later = self.later

        def ldp_reply(self: party.HorizontalParty) -> object:
            message = reply(self)
            rows, kept = self.rows, self.rows.permanent
            rows.permanent = np.where(later[self.name][:, None], kept, 0).astype(np.uint8)
            try:  # GRR's and OUE's reports are their permanent bits: the key draws nothing
                sums = rows.ldp_report_sums(self.label_ldp(), party.counter_key(0, "ldp_instant"), 0)[0]
            finally:
                rows.permanent = kept
            message.arrays["stage2"] = sums.reshape(message.arrays["bit_sums"].shape)
            return message

        def estimate_apart(self: master.FederatedExtraTreesMaster, replies: dict, shape: tuple, valid: object,
                           depth: int) -> tuple[np.ndarray, np.ndarray]:
            branch, sizes = estimate(self, replies, shape, valid, depth)
            apart = sum(replies[n].arrays["stage2"].astype(np.int64) for n in self.parties)
            total = sum(replies[n].arrays["bit_sums"].astype(np.int64) for n in self.parties)
            ldp, n_classes = self._label_ldp(), self.schema.n_classes
            p, q = ldp.report_probabilities(n_classes)[0, :2]
            effective = total + (p - q - 1) * apart + q * apart.sum(axis=-1, keepdims=True)
            needed = branch.sum(axis=-1) > 0
            branch[needed] = ldp.estimate_counts(effective[needed], sizes[needed], n_classes)
            return branch, sizes

        party.HorizontalParty._ldp_reply = ldp_reply  # type: ignore[method-assign]
        master.FederatedExtraTreesMaster._estimate = estimate_apart  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        """Restore both."""
        from fedcore.horizontal.fet import master, party

        party.HorizontalParty._ldp_reply, master.FederatedExtraTreesMaster._estimate = self.originals


def main() -> None:
    """Run every table, epsilon, seed, schedule, target and leaf size; print means over seeds."""
    from sklearn.ensemble import ExtraTreesClassifier

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path,
                        default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    parser.add_argument("--tables", default="spambase,satellite,letter")
    parser.add_argument("--epsilons", default="2,4")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--leaf-sizes", default="1,5")
    parser.add_argument("--schedules", default="1;0.2,0.8;0.4,0.6;0.1,0.2,0.7")
    parser.add_argument("--stage-targets", default="hard,soft")
    parser.add_argument("--learner", choices=("sklearn", "fet"), default="sklearn",
                        help="fet: our FET-LDP on --parties parties (`fet_staged`: hard targets)")
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--exact", action="store_true",
                        help="fet: later stages' reports counted as their one-hots (`_StagesApart`)")
    parser.add_argument("--json", type=Path, help="every run's row, for later summaries")
    args = parser.parse_args()
    results = []
    for name in args.tables.split(","):
        table = pd.read_parquet(args.data_dir / f"{name}.parquet")
        label = LABELS[name]
        features = [c for c in table.columns if c != label]
        code = {c: i for i, c in enumerate(sorted(table[label].unique()))}
        for seed in range(args.seeds):
            train, test = split_train_test(table, label, "classification", 0.2, seed)
            x, x_test = train[features].to_numpy(np.float64), test[features].to_numpy(np.float64)
            y, y_test = train[label].map(code).to_numpy(), test[label].map(code).to_numpy()
            et = ExtraTreesClassifier(args.trees, random_state=seed, n_jobs=1).fit(x, y)
            reference = float((et.predict(x_test) == y_test).mean())
            parties = split_horizontal(train, args.parties, label=label, seed=seed)
            ranges = declared_ranges(table, label)
            for epsilon in (float(e) for e in args.epsilons.split(",")):
                for schedule in args.schedules.split(";"):
                    fractions = [float(f) for f in schedule.split(",")]
                    targets = ["-"] if len(fractions) == 1 else args.stage_targets.split(",")
                    if args.learner == "fet":
                        targets, leaves = ["-"] if len(fractions) == 1 else ["hard"], ["fet"]
                    else:
                        leaves = args.leaf_sizes.split(",")
                    for target in targets:
                        for leaf in leaves:
                            print(f"{name} seed {seed} eps {epsilon:g} {schedule} {target} leaf {leaf}",
                                  file=sys.stderr)
                            if args.learner == "fet":
                                predicted = fet_staged(parties, test, label, list(code), epsilon, fractions,
                                                       args.trees, seed, ranges, args.exact)
                                accuracy = float((predicted == test[label].to_numpy()).mean())
                            else:
                                scores = staged(x, y, x_test, len(code), epsilon, fractions, target,
                                                args.trees, int(leaf), seed)
                                accuracy = float((scores.argmax(axis=1) == y_test).mean())
                            results.append({"table": name, "epsilon": epsilon, "schedule": schedule,
                                            "target": target, "leaf": leaf, "seed": seed,
                                            "accuracy": accuracy, "below_et_pp": 100 * (reference - accuracy),
                                            "extra_trees": reference})
                            print(f"    accuracy {accuracy:.4f}, {results[-1]['below_et_pp']:.2f} pp below "
                                  f"ExtraTrees ({reference:.4f})", file=sys.stderr)
    frame = pd.DataFrame(results)
    summary = frame.groupby(["table", "epsilon", "schedule", "target", "leaf"], sort=False)[
        ["accuracy", "below_et_pp", "extra_trees"]].mean()
    print(markdown_table(summary.reset_index().to_dict("records")))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
