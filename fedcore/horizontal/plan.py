"""The horizontal DP plans: the releases a row can take part in, from a training's terms and a party's budget.

FET-GDP's Gaussian plan (`gaussian_plan`) and PPD-ERT secagg-dp's distributed discrete Gaussian plan
(`distributed_plan`, `fedcore.privacy.distributed`) read the same terms from the master's `hello` and count
releases alike: one per level of every tree, so n_estimators x max_depth per row, each moving one count per
candidate. Both are charged by one `PrivacyLedger` (`fedcore.privacy.accounting`).

FET-GDP:
A party answers one `fet_stats` per level of every tree it grows: one release per (tree, level) a row's node
is open in, so at most n_estimators x max_depth releases per row. A release is the vector of the node's
branch statistics over its k candidates; one row moves one class count of one branch per candidate, so its
L2 sensitivity is sqrt(k). Regression sends (count, sum of quantised targets) per branch: a row moves the
count by 1 and the sum by at most 2**q_bound_bits, whose noise is scaled by 2**q_bound_bits, so sqrt(2k).
Before them, each party releases its marginal histograms once (`fet/marginals.py`: L2 sensitivity sqrt(d)
over d features), charged as `marginal_releases` releases: its noise is that of `marginal_releases`
releases of the plan's noise multiplier composed (`GaussianPlan.sigma_for`), and its row count once
(L2 sensitivity 1), charged as `COUNT_RELEASES` release: no exact count leaves a gdp party. The master sends
these terms in `hello`; each party builds the plan from them and its own configured budget, and the master
computes the same plan to bound and weigh the noisy counts.

FET-GDP's leaf-release plan (`leaf_release` 1, issue #31): the first `split_levels` levels of every tree are
chosen as above (one release each); below them each node's feature and threshold are drawn by the master
alone (the seed, the declared domains and the released marginal CDFs: no budget), and once a tree is grown
each party releases its leaves' class counts (`fet_leaves`): one row is in one leaf of one class, so L2
sensitivity 1, charged as one release of the plan (noise `leaf_sigma`, the plan's multiplier). Releases per
row: n_estimators x (split_levels + leaf_release), whatever the depth, so the depth may be chosen after
hello from the noisy row count (`default_gdp_plan`, `leaf_depth`).
"""

from __future__ import annotations

import math
from typing import Any

from fedcore.errors import ParameterError
from fedcore.horizontal.fet.class_marginals import CLASS_MARGINAL_SHARE
from fedcore.horizontal.fet.marginals import (
    MARGINAL_BINS,
    MARGINAL_SHARE,
    MAX_MARGINAL_BINS,
    marginal_releases,
)
from fedcore.privacy.accounting import GAUSSIAN_NOISE_BOUND, GaussianPlan
from fedcore.privacy.distributed import DistributedPlan
from fedcore.privacy.settings import DistributedDP, GlobalDP, PrivacySetting

PLAN_TERMS = ("n_estimators", "max_depth", "k", "task")
"""The `hello` header fields a DP party plans its releases from."""
GDP_PLAN_TERMS = ("n_estimators", "k", "task", "split_levels", "leaf_release", "n_features", "marginal_bins",
                  "marginal_releases", "marginal_classes")
"""FET-GDP's: the trees, the levels chosen by noisy counts per tree, whether each tree's leaves are released
once, and the marginal histograms' (`marginal_classes` > 0: per class, plan marginals; the depth is not one:
random levels release nothing)."""
NOISY_ROW_COUNTS = ("gdp", "secagg-dp")
"""The modes whose parties state no exact training-row count: none at setup, a noisy one at hello."""
COUNT_RELEASES = 1
"""FET-GDP: the releases a party's noisy row count (hello) is charged as (about 0.2% of a 50 x 8 plan)."""
UNBOUNDED_DEPTH = ("privacy {mode!r} needs a bounded depth: set params.max_depth (the model's budget is "
                   "spread over trees x levels)")


def check_bounded_depth(privacy: PrivacySetting, max_depth: int | None) -> None:
    """Refuse an unbounded depth before any party starts (the master does too).

    secagg-dp, and gdp's plan `splits`, spread the budget over the levels; gdp's `auto` and `leaves` choose
    the depth from the noisy row count when none is given (random levels cost no budget).
    """
    if max_depth is not None:
        return
    if isinstance(privacy, DistributedDP) or (isinstance(privacy, GlobalDP) and privacy.plan == "splits"):
        raise ParameterError(UNBOUNDED_DEPTH.format(mode=privacy.mode))


def check_params(privacy: PrivacySetting, params: Any) -> None:
    """A config's check of its parameters against its privacy (the algorithm registry's `check_params`).

    gdp: its plan resolved as the master will (`choose_gdp_plan`), so what the master would refuse after the
    agents connect is refused here (the class count does not decide a refusal).
    """
    check_bounded_depth(privacy, params.max_depth)
    if isinstance(privacy, GlobalDP):
        from fedcore.horizontal.fet.plans import choose_gdp_plan

        choose_gdp_plan(privacy.plan, privacy.split_levels, privacy.epsilon, 0, params)


def plan_terms(n_estimators: int, max_depth: int | None, k: int, task: str, *,
               mode: str = "secagg-dp") -> dict[str, Any]:
    """secagg-dp's plan terms as the master's `hello` carries them; refuse an unbounded depth."""
    if max_depth is None:
        raise ParameterError(UNBOUNDED_DEPTH.format(mode=mode))
    return {"n_estimators": n_estimators, "max_depth": max_depth, "k": k, "task": task}


def gdp_terms(n_estimators: int, split_levels: int, leaf_release: bool, k: int, task: str, n_features: int,
              marginal_bins: int = MARGINAL_BINS, marginal_classes: int = 0) -> dict[str, Any]:
    """FET-GDP's plan terms as the master's `hello` carries them (`GDP_PLAN_TERMS`).

    Plan splits: `split_levels` = max_depth, no leaf release; plan leaves: the chosen upper levels and a
    leaf release. `marginal_bins` 0: no marginal histograms (thresholds uniform in the declared domains).
    `marginal_classes` (plan marginals): the class count the histograms are per, charged CLASS_MARGINAL_SHARE.
    """
    tree_releases = n_estimators * (split_levels + int(leaf_release))
    share = CLASS_MARGINAL_SHARE if marginal_classes else MARGINAL_SHARE
    releases = marginal_releases(tree_releases, share) if marginal_bins else 0
    return {"n_estimators": n_estimators, "k": k, "task": task, "split_levels": split_levels,
            "leaf_release": int(leaf_release), "n_features": n_features, "marginal_bins": marginal_bins,
            "marginal_releases": releases, "marginal_classes": marginal_classes}


def gaussian_plan(epsilon: float, delta: float, terms: dict[str, Any]) -> GaussianPlan:
    """The Gaussian plan of a training with `terms` (`gdp_terms`) under the budget (epsilon, delta).

    Refuses terms out of range (`_check_gdp_terms`). Every release has the plan's noise multiplier: a level's
    branch counts (sensitivity sqrt(k), or sqrt(2k) for regression) the plan's sigma, a leaf release
    (sensitivity 1) `leaf_sigma`.
    """
    _check_gdp_terms(terms)
    _check_marginal_terms(terms)
    per_candidate = 2 if terms["task"] == "regression" else 1
    per_tree = terms["split_levels"] + terms["leaf_release"]
    return GaussianPlan(epsilon, delta,
                        releases=terms["n_estimators"] * per_tree + terms["marginal_releases"]
                        + COUNT_RELEASES,
                        sensitivity=math.sqrt(per_candidate * terms["k"]))


def leaf_sigma(plan: GaussianPlan) -> float:
    """The noise of a tree's leaf class counts (plan leaves): L2 sensitivity 1, charged as one release."""
    return plan.sigma_for(1.0, 1)


def _check_gdp_terms(terms: dict[str, Any]) -> None:
    """Refuse gdp terms out of range.

    Trees and k >= 1, split levels >= 0, a leaf release 0 or 1, some release per tree, a task, and no leaf
    release for regression (it releases class counts).
    """
    for name, least in (("n_estimators", 1), ("k", 1), ("split_levels", 0), ("leaf_release", 0)):
        value = terms.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least \
                or (name == "leaf_release" and value > 1):
            bound = "0 or 1" if name == "leaf_release" else f"an integer >= {least}"
            raise ParameterError(f"privacy 'gdp': the plan's {name} must be {bound}, got {value!r}")
    if terms["split_levels"] + terms["leaf_release"] == 0:
        raise ParameterError("privacy 'gdp': the plan releases nothing per tree (split_levels 0, no leaf "
                             "release)")
    task = terms.get("task")
    if task not in ("classification", "regression"):
        raise ParameterError(f"privacy 'gdp': the plan's task must be classification or regression, got "
                             f"{task!r}")
    if task == "regression" and terms["leaf_release"]:
        raise ParameterError("privacy 'gdp': plan 'leaves' releases class counts; a regression trains with "
                             "plan 'splits'")


def _check_marginal_terms(terms: dict[str, Any]) -> None:
    """Refuse marginal-histogram terms out of range, or bins without releases (or the reverse)."""
    for name in ("n_features", "marginal_bins", "marginal_releases"):
        value = terms.get(name)
        least = 0 if name.startswith("marginal") else 1
        most = MAX_MARGINAL_BINS if name == "marginal_bins" else None
        if isinstance(value, bool) or not isinstance(value, int) or value < least \
                or (most is not None and value > most):
            bound = f"in [{least}, {most}]" if most is not None else f">= {least}"
            raise ParameterError(f"privacy 'gdp': the plan's {name} must be an integer {bound}, got "
                                 f"{value!r}")
    classes = terms.get("marginal_classes")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 0 \
            or (classes and (terms["marginal_bins"] == 0 or terms["task"] != "classification")):
        raise ParameterError(f"privacy 'gdp': the plan's marginal_classes must be 0, or a classification's "
                             f"class count with marginal histograms, got {classes!r}")
    if (terms["marginal_bins"] == 0) != (terms["marginal_releases"] == 0):
        raise ParameterError(f"privacy 'gdp': marginal histograms need both bins and releases, got "
                             f"{terms['marginal_bins']} bins charged as {terms['marginal_releases']} "
                             "releases")


def marginal_sigma(plan: GaussianPlan, terms: dict[str, Any]) -> float:
    """The noise of the marginal histograms: L2 sensitivity sqrt(d), charged as `marginal_releases`.

    Per class too (plan marginals): a row is in one (cell, class) of each feature, so still sqrt(d).
    """
    return plan.sigma_for(math.sqrt(terms["n_features"]), terms["marginal_releases"])


def count_sigma(plan: GaussianPlan) -> float:
    """The noise of a party's row count at hello: L2 sensitivity 1, charged as `COUNT_RELEASES`."""
    return plan.sigma_for(1.0, COUNT_RELEASES)


def count_reach(plan: GaussianPlan) -> int:
    """How far below a party's true row count its stated noisy one can be (the master's bound on its counts).

    The noise is at most GAUSSIAN_NOISE_BOUND count sigmas, and the stated count is rounded (half a row).
    """
    return math.ceil(GAUSSIAN_NOISE_BOUND * count_sigma(plan) + 0.5)


def distributed_plan(epsilon: float, delta: float, terms: dict[str, Any], parties: int) -> DistributedPlan:
    """PPD-ERT secagg-dp: each of `parties` parties' share of the noise for a classification's `terms`.

    One release per (tree, level) a row's node is open in; in each the row moves one class count of one branch
    per candidate: k counts by 1.
    """
    check_terms(terms, "secagg-dp")
    if terms["task"] != "classification":
        raise ParameterError(f"privacy 'secagg-dp': PPD-ERT classifies, the plan's task is {terms['task']!r}")
    return DistributedPlan(epsilon, delta, releases=terms["n_estimators"] * terms["max_depth"], k=terms["k"],
                           parties=parties)


def check_terms(terms: dict[str, Any], mode: str) -> None:
    """Refuse plan terms that are not integers >= 1 (an unbounded depth named), or another task."""
    for name in ("n_estimators", "max_depth", "k"):
        value = terms.get(name)
        if name == "max_depth" and value is None:
            raise ParameterError(UNBOUNDED_DEPTH.format(mode=mode))
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ParameterError(f"privacy {mode!r}: the plan's {name} must be an integer >= 1, got "
                                 f"{value!r}")
    task = terms.get("task")
    if task not in ("classification", "regression"):
        raise ParameterError(f"privacy {mode!r}: the plan's task must be classification or regression, got "
                             f"{task!r}")
