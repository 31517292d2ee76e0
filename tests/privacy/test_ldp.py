"""RAPPOR-style label LDP: Bloom patterns, both randomized responses, count estimation and epsilon."""

from __future__ import annotations

import hashlib
import itertools
import math

import numpy as np
import pytest

from fedcore.errors import LabelError, ParameterError
from fedcore.privacy.ldp import LabelLDP
from fedcore.privacy.nnls import SharedNNLS
from fedcore.randomness import counter_key
from tests.privacy.reports import instant_bits

COUNTS = np.array([10000, 6000, 3000, 1000, 0])
LABELS = np.repeat(np.arange(COUNTS.size), COUNTS)


def _bloom(**fields) -> LabelLDP:
    """The FET paper's Bloom mechanism (no longer the default) with `fields`."""
    return LabelLDP(mechanism="bloom", **fields)


def _key(seed: int, purpose: str = "ldp_instant") -> np.ndarray:
    return counter_key(seed, purpose)


def _reports(ldp: LabelLDP, seed: int) -> np.ndarray:
    return instant_bits(ldp, ldp.permanent_bits(LABELS, COUNTS.size, _key(seed, "ldp_permanent")),
                        _key(seed))


def test_epsilon_of_the_defaults_by_hand() -> None:
    # f = 0.5, k = 4: eps_inf = 8 ln(0.75 / 0.25); q* = 0.25 * 1.0 + 0.5 * 0.8 = 0.65, p* = 0.25 + 0.1 = 0.35
    eps = _bloom().epsilon()
    assert eps["permanent"] == pytest.approx(8.788898309344878, rel=1e-12)
    assert eps["instant"] == pytest.approx(4 * math.log(0.65 * 0.65 / (0.35 * 0.35)), rel=1e-12)
    assert eps["instant"] == pytest.approx(4.952313667249789, rel=1e-12)


def test_epsilon_extremes() -> None:
    assert _bloom(keep_probability=1.0).epsilon()["permanent"] == math.inf
    certain = _bloom(keep_probability=1.0, p_one_if_zero=0.0, p_one_if_one=1.0)
    assert certain.epsilon()["instant"] == math.inf
    no_information = _bloom(keep_probability=0.0).epsilon()
    assert no_information == {"permanent": 0.0, "instant": 0.0}
    # fewer hashes, smaller epsilon: both are linear in k
    assert _bloom(n_hashes=2).epsilon()["permanent"] == pytest.approx(_bloom().epsilon()["permanent"] / 2)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_bits": 1},
     "n_bits must be an integer >= 2, got 1: use a larger Bloom filter (e.g. n_bits=32), or leave it unset "
     "to size it to the classes"),
    ({"n_bits": 8.0},
     "n_bits must be an integer >= 2, got 8.0: use a larger Bloom filter (e.g. n_bits=32), or leave it unset "
     "to size it to the classes"),
    ({"n_bits": True},
     "n_bits must be an integer >= 2, got True: use a larger Bloom filter (e.g. n_bits=32), or leave it "
     "unset to size it to the classes"),
    ({"n_hashes": 0}, "n_hashes must be an integer with 1 <= n_hashes <= n_bits (32), got 0: "
                      "use fewer hashes or more bits"),
    ({"n_bits": 8, "n_hashes": 9}, "n_hashes must be an integer with 1 <= n_hashes <= n_bits (8), got 9: "
                                   "use fewer hashes or more bits"),
    ({"n_hashes": 33}, "n_hashes must be an integer with 1 <= n_hashes <= n_bits (32), got 33: "
                       "use fewer hashes or more bits"),
    ({"keep_probability": 1.5}, "keep_probability must be a number in [0, 1], got 1.5: it is the chance of "
                                "keeping the true Bloom bit (smaller = more privacy)"),
    ({"keep_probability": float("nan")},
     "keep_probability must be a number in [0, 1], got nan: it is the chance of keeping the true Bloom bit "
     "(smaller = more privacy)"),
    ({"p_one_if_zero": 0.8, "p_one_if_one": 0.8},
     "need 0 <= p_one_if_zero < p_one_if_one <= 1, got p_one_if_zero=0.8, p_one_if_one=0.8: a report must be "
     "more likely 1 when its bit is 1 (e.g. 0.2 and 0.8)"),
    ({"p_one_if_zero": -0.1}, "need 0 <= p_one_if_zero < p_one_if_one <= 1, got p_one_if_zero=-0.1, "
                              "p_one_if_one=0.8: a report must be more likely 1 when its bit is 1 (e.g. 0.2 "
                              "and 0.8)"),
    ({"p_one_if_one": 1.2}, "need 0 <= p_one_if_zero < p_one_if_one <= 1, got p_one_if_zero=0.2, "
                            "p_one_if_one=1.2: a report must be more likely 1 when its bit is 1 (e.g. 0.2 "
                            "and 0.8)"),
    ({"estimator": "ols"}, "estimator must be 'nnls' or 'lasso', got 'ols'"),
    ({"lasso_alpha": -1.0}, "lasso_alpha must be a finite number >= 0, got -1.0: it is the L1 penalty on "
                            "estimated class proportions (e.g. 0.01)"),
    ({"mechanism": "rappor"}, "mechanism must be one of ['auto', 'krr', 'oue', 'bloom'], got 'rappor'"),
    ({"mechanism": "krr", "report_epsilon": 0.0},
     "mechanism 'krr' needs report_epsilon, a finite number > 0, got 0.0: each row's label epsilon (e.g. 2)"),
    ({"mechanism": "oue", "report_epsilon": math.inf},
     "mechanism 'oue' needs report_epsilon, a finite number > 0, got inf: each row's label epsilon (e.g. 2)"),
    ({"mechanism": "auto", "report_epsilon": True},
     "mechanism 'auto' needs report_epsilon, a finite number > 0, got True: each row's label epsilon (e.g. "
     "2)"),
    ({"mechanism": "krr", "report_epsilon": 2.0, "n_bits": 32},
     "mechanism 'krr' reports one bit per class: leave n_bits unset"),
    ({"mechanism": "oue", "n_bits": 32}, "mechanism 'oue' reports one bit per class: leave n_bits unset"),
    ({"report_epsilon": 2.0},
     "report_epsilon applies to mechanisms 'auto', 'krr' and 'oue'; the Bloom mechanism's epsilon follows "
     "from n_hashes and keep_probability"),
])
def test_bad_parameters_raise_exact_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(ParameterError) as excinfo:
        LabelLDP(**{"mechanism": "bloom", **kwargs})
    assert str(excinfo.value) == message


def test_class_patterns_follow_sha256_and_are_deterministic() -> None:
    ldp = _bloom(n_bits=16, n_hashes=3)
    patterns = ldp.class_patterns(6)
    assert patterns.shape == (6, 16) and patterns.dtype == np.uint8
    for c in range(6):
        expected = {int.from_bytes(hashlib.sha256(f"{c}:{i}".encode()).digest(), "big") % 16
                    for i in range(3)}
        assert set(np.flatnonzero(patterns[c])) == expected
    np.testing.assert_array_equal(patterns,
                                  _bloom(n_bits=16, n_hashes=3, keep_probability=0.9).class_patterns(6))
    patterns[0] = 1  # a copy: the cached patterns stay intact
    assert ldp.class_patterns(6)[0].sum() <= 3


def test_check_classes_refuses_shared_patterns_and_rank_deficiency() -> None:
    with pytest.raises(ParameterError) as shared:
        _bloom(n_bits=4, n_hashes=1).check_classes(3)
    assert str(shared.value) == ("LDP Bloom patterns with n_bits=4, n_hashes=1 cannot represent n_classes=3: "
                                 "classes 1 and 2 share a Bloom pattern; use more bits or fewer hashes: "
                                 "n_bits=8 with n_hashes=1 works (more bits cost bandwidth, not privacy)")
    with pytest.raises(ParameterError) as rank:  # distinct patterns, but linearly dependent
        _bloom(n_bits=5, n_hashes=5).check_classes(4)
    assert str(rank.value) == ("LDP Bloom patterns with n_bits=5, n_hashes=5 cannot represent n_classes=4: "
                               "the estimation design matrix has rank 3 < n_classes; use more bits or fewer "
                               "hashes: n_bits=8 with n_hashes=5, or n_hashes=4 with n_bits=5 works (more "
                               "bits cost bandwidth, not privacy)")
    with pytest.raises(ParameterError,
                       match="n_bits=8, n_hashes=4 cannot represent n_classes=9: the estimation "
                             "design matrix has rank 8 < n_classes"):
        _bloom(n_bits=8, n_hashes=4).check_classes(9)
    with pytest.raises(ParameterError, match="keep_probability=0 makes reports independent of the label"):
        _bloom(keep_probability=0.0).check_classes(2)
    with pytest.raises(ParameterError, match="n_classes must be an integer >= 1, got 0"):
        _bloom().check_classes(0)
    _bloom(n_bits=32).check_classes(26)  # 32 bits represent 26 classes (the letter table)
    assert _bloom().bits_for(26) == 64 and _bloom().bits_for(16) == 32 and _bloom().bits_for(40) == 128
    _bloom().check_classes(60)  # unset n_bits is sized to the classes
    with pytest.raises(ParameterError) as many:  # more classes than bits: the fix names working parameters
        _bloom(n_bits=32).check_classes(40)
    assert str(many.value) == ("LDP Bloom patterns with n_bits=32, n_hashes=4 cannot represent n_classes=40: "
                               "the estimation design matrix has rank 32 < n_classes; use more bits or fewer "
                               "hashes: n_bits=64 with n_hashes=4 works (more bits cost bandwidth, not "
                               "privacy)")
    _bloom(n_bits=64).check_classes(40)
    with pytest.raises(ParameterError,
                       match=r"n_bits=32, n_hashes=4 cannot represent n_classes=32: the estimation design "
                             r"matrix is ill-conditioned \(condition number 1\.77e\+04 > 10000: estimates "
                             r"would be mostly noise\); use more bits or fewer hashes: n_bits=64 with "
                             r"n_hashes=4, or n_hashes=3 with n_bits=32 works"):
        _bloom(n_bits=32).check_classes(32)
    # hash collisions, yet still 3 distinct, independent patterns
    _bloom(n_bits=4, n_hashes=4).check_classes(3)


def test_permanent_bits_keep_or_flip_a_fair_coin() -> None:
    ldp = _bloom()
    perm = ldp.permanent_bits(LABELS, 5, _key(1))
    assert perm.shape == (LABELS.size, 32) and perm.dtype == np.uint8
    bloom = ldp.class_patterns(5)[LABELS].astype(bool)
    # P(1 | Bloom 1) = p + (1 - p) / 2 = 0.75, P(1 | Bloom 0) = 0.25; binomial sd < 0.002 here
    assert perm[bloom].mean() == pytest.approx(0.75, abs=0.01)
    assert perm[~bloom].mean() == pytest.approx(0.25, abs=0.01)
    exact = _bloom(keep_probability=1.0).permanent_bits(LABELS, 5, _key(1))
    np.testing.assert_array_equal(exact, bloom.astype(np.uint8))


def test_instant_bits_report_with_the_configured_probabilities() -> None:
    ldp = _bloom(p_one_if_one=0.9, p_one_if_zero=0.3)
    perm = np.random.default_rng(2).integers(0, 2, size=(20000, 32), dtype=np.uint8)
    inst = instant_bits(ldp, perm, _key(3))
    assert inst.shape == perm.shape and inst.dtype == np.uint8
    assert inst[perm == 1].mean() == pytest.approx(0.9, abs=0.01)
    assert inst[perm == 0].mean() == pytest.approx(0.3, abs=0.01)


def test_report_probabilities_match_simulated_reports() -> None:
    ldp = _bloom()
    probabilities = ldp.report_probabilities(5)
    assert probabilities.shape == (5, 32)
    assert set(np.unique(probabilities).round(12)) == {0.35, 0.65}  # 0.2 + 0.6 * 0.25, 0.2 + 0.6 * 0.75
    reports = _reports(ldp, 4)
    for c in range(4):
        np.testing.assert_allclose(reports[LABELS == c].mean(axis=0), probabilities[c], atol=0.05)


def test_same_seed_same_bits_different_seed_different_bits() -> None:
    ldp = _bloom()
    np.testing.assert_array_equal(_reports(ldp, 7), _reports(ldp, 7))
    assert (_reports(ldp, 7) != _reports(ldp, 8)).mean() > 0.3
    from_keys = [instant_bits(ldp, ldp.permanent_bits(LABELS, 5, counter_key(11, "ldp_permanent")),
                                  counter_key(11, "ldp_instant"), report=3, slot=2) for _ in range(2)]
    np.testing.assert_array_equal(*from_keys)
    # another report, or another tree slot, draws fresh words
    permanent = ldp.permanent_bits(LABELS, 5, counter_key(11, "ldp_permanent"))
    for other in ({"report": 4, "slot": 2}, {"report": 3, "slot": 1}):
        fresh = instant_bits(ldp, permanent, counter_key(11, "ldp_instant"), **other)
        assert (fresh != from_keys[0]).mean() > 0.3


@pytest.mark.parametrize("estimator", ["nnls", "lasso"])
def test_estimates_of_a_20000_sample_group_are_within_two_percent(estimator: str) -> None:
    ldp = _bloom(estimator=estimator)
    estimate = ldp.estimate_counts(_reports(ldp, 0).sum(axis=0), np.array(LABELS.size), 5)
    assert estimate.shape == (5,) and estimate.dtype == np.float64 and (estimate >= 0).all()
    np.testing.assert_allclose(estimate, COUNTS, atol=0.02 * LABELS.size)
    assert estimate.sum() == pytest.approx(LABELS.size, rel=1e-5)


def test_noise_free_bit_sums_give_the_exact_counts() -> None:
    ldp = _bloom()
    counts = np.array([[50.0, 0, 25, 5, 20], [0, 0, 0, 0, 7]])
    expected_bits = counts @ ldp.report_probabilities(5)
    np.testing.assert_allclose(ldp.estimate_counts(expected_bits, counts.sum(axis=1), 5), counts, atol=1e-4)


def test_lasso_zeroes_an_absent_class_that_nnls_keeps() -> None:
    bit_sums = _reports(_bloom(), 0).sum(axis=0)
    plain = _bloom().estimate_counts(bit_sums, np.array(LABELS.size), 5)
    lasso = _bloom(estimator="lasso", lasso_alpha=0.3).estimate_counts(bit_sums, np.array(LABELS.size), 5)
    assert plain[4] > 50 and lasso[4] == 0.0
    assert lasso.sum() == pytest.approx(LABELS.size, rel=1e-5)
    np.testing.assert_allclose(lasso, COUNTS, atol=0.02 * LABELS.size)


def test_estimates_vectorise_over_groups_including_empty_and_tiny_ones() -> None:
    ldp = _bloom()
    reports = _reports(ldp, 5)
    group = np.random.default_rng(6).integers(0, 6, size=LABELS.size)
    group[LABELS == 4] = 6  # class 4 is empty, so group 6 is empty
    sums = np.zeros((7, 32))
    np.add.at(sums, group, reports)
    sums[5] = reports[:20].sum(axis=0)  # 20 samples of class 0: noisy, the unconstrained fit goes negative
    totals = np.bincount(group, minlength=7).astype(float)
    totals[5] = 20
    estimate = ldp.estimate_counts(sums.reshape(7, 1, 32), totals.reshape(7, 1), 5)
    assert estimate.shape == (7, 1, 5) and (estimate >= 0).all()
    estimate = estimate[:, 0]
    np.testing.assert_allclose(estimate.sum(axis=1), totals, rtol=1e-5)
    assert (estimate[6] == 0).all()
    assert (estimate[5] == 0).any()  # the constrained solve ran: an unconstrained fit is never exactly 0
    truth = np.stack([np.bincount(LABELS[group == g], minlength=5) for g in range(5)])
    assert (np.abs(estimate[:5] - truth) <= 0.05 * totals[:5, None]).all()


def test_estimate_counts_refuses_bad_shapes() -> None:
    ldp = _bloom()
    with pytest.raises(ParameterError, match=r"bit_sums must have shape \(\.\.\., 32\), got \(3, 16\)"):
        ldp.estimate_counts(np.zeros((3, 16)), np.ones(3), 5)
    with pytest.raises(ParameterError, match=r"totals must have shape \(3,\)"):
        ldp.estimate_counts(np.zeros((3, 32)), np.ones(4), 5)
    with pytest.raises(ParameterError, match="totals >= 0"):
        ldp.estimate_counts(np.zeros((3, 32)), -np.ones(3), 5)


def test_labels_must_be_class_codes() -> None:
    ldp = _bloom(n_bits=32)
    key = _key(0)
    with pytest.raises(LabelError, match=r"class codes in 0\.\.2, found values from 0 to 3"):
        ldp.permanent_bits(np.array([0, 1, 3]), 3, key)
    with pytest.raises(LabelError, match="integer class codes, got dtype float64"):
        ldp.permanent_bits(np.array([0.0, 1.0]), 3, key)
    with pytest.raises(ParameterError) as error:
        ldp.permanent_bits(np.array([0, 1]), 3, np.random.default_rng(0))
    assert str(error.value) == "key must be 2 uint64 (fedcore.randomness.counter_key), got object ()"


def test_nnls_matches_brute_force_over_supports() -> None:
    rng = np.random.default_rng(9)
    for _ in range(100):
        matrix, target = rng.normal(size=(8, 4)), rng.normal(size=8)
        x = SharedNNLS(matrix).solve(target[None, :])[0]
        assert (x >= 0).all()
        best = math.inf
        for size in range(5):
            for support in itertools.combinations(range(4), size):
                z = np.zeros(4)
                if support:
                    z[list(support)] = np.linalg.lstsq(matrix[:, list(support)], target, rcond=None)[0]
                if (z >= 0).all():
                    best = min(best, float(np.sum((matrix @ z - target) ** 2)))
        assert np.sum((matrix @ x - target) ** 2) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_a_block_of_rows_draws_exactly_what_the_whole_table_draws_for_it() -> None:
    """Every word is addressed by the row's position: rows a..b alone, told they start at a, draw the same."""
    for ldp in (_bloom(n_bits=32), LabelLDP(mechanism="krr", report_epsilon=1.0),
                LabelLDP(mechanism="oue", report_epsilon=1.0)):
        whole = ldp.permanent_bits(LABELS, 5, _key(30, "ldp_permanent"))
        reports = instant_bits(ldp, whole, _key(31), report=7, slot=3)
        for a, b in ((0, 1), (5, 977), (19999, 20000)):
            block = ldp.permanent_bits(LABELS[a:b], 5, _key(30, "ldp_permanent"), first_row=a)
            np.testing.assert_array_equal(block, whole[a:b])
            np.testing.assert_array_equal(instant_bits(ldp, block, _key(31), report=7, slot=3, first_row=a),
                                          reports[a:b])
        # and not another position's: the same labels one row further draw other bits
        shifted = ldp.permanent_bits(LABELS[5:977], 5, _key(30, "ldp_permanent"), first_row=6)
        assert (shifted != whole[5:977]).any()


def test_krr_reports_the_true_class_with_its_probability_and_estimates_counts() -> None:
    ldp = LabelLDP(mechanism="krr", report_epsilon=3.0)
    keep = math.exp(3.0) / (math.exp(3.0) + 4)  # 5 classes
    perm = ldp.permanent_bits(LABELS, 5, _key(20))
    assert perm.shape == (LABELS.size, 5) and (perm.sum(axis=1) == 1).all()  # one-hot reports
    assert (perm.argmax(axis=1) == LABELS).mean() == pytest.approx(keep, abs=0.01)
    np.testing.assert_array_equal(instant_bits(ldp, perm, _key(21)), perm)  # no instant step
    np.testing.assert_allclose(ldp.report_probabilities(5),
                               np.where(np.eye(5, dtype=bool), keep, (1 - keep) / 4))
    estimate = ldp.estimate_counts(perm.sum(axis=0), np.array(LABELS.size), 5)
    np.testing.assert_allclose(estimate, COUNTS, atol=0.01 * LABELS.size)
    assert ldp.epsilon() == {"permanent": 3.0, "instant": 3.0} and ldp.bits_for(26) == 26


def test_the_design_check_uses_the_configured_probabilities() -> None:
    # 26 classes on 32 bits pass at the default responses (condition 237), not with nearly random ones
    _bloom(n_bits=32).check_classes(26)
    with pytest.raises(ParameterError,
                       match=r"n_bits=32, n_hashes=4 cannot represent n_classes=26: the estimation "
                             r"design matrix is ill-conditioned \(condition number 1\.84e\+04"):
        _bloom(n_bits=32, p_one_if_zero=0.495, p_one_if_one=0.505).check_classes(26)
    with pytest.raises(ParameterError) as krr:
        LabelLDP(mechanism="krr", report_epsilon=0.001).check_classes(26)
    assert str(krr.value).startswith("mechanism 'krr' at epsilon 0.001 cannot represent n_classes=26: the "
                                     "estimation design matrix is ill-conditioned")
    assert str(krr.value).endswith("use a larger epsilon or fewer classes")


def test_oue_reports_each_bit_with_its_probability() -> None:
    """The class's own bit is 1 with probability 1/2, every other bit with 1 / (e^eps + 1), independently.

    200,000 rows (40,000 per class but the empty last one, repeated from LABELS' proportions): each frequency
    is a binomial proportion of standard deviation sqrt(p (1 - p) / n_c), at most 0.0035 for the rarest class
    (10,000 rows); 5 of those bound all 20 (class, bit) cells at once with probability > 1 - 1e-5.
    """
    ldp = LabelLDP(mechanism="oue", report_epsilon=2.0)
    labels = np.tile(LABELS, 10)
    bits = ldp.permanent_bits(labels, 5, _key(40, "ldp_permanent"))
    assert bits.shape == (labels.size, 5) and bits.dtype == np.uint8
    expected = ldp.report_probabilities(5)
    q = 1 / (math.exp(2.0) + 1)
    np.testing.assert_array_equal(expected, np.where(np.eye(5, dtype=bool), 0.5, q))
    for c in range(4):
        rows = bits[labels == c]
        sd = np.sqrt(expected[c] * (1 - expected[c]) / rows.shape[0])
        assert (np.abs(rows.mean(axis=0) - expected[c]) <= 5 * sd).all(), (c, rows.mean(axis=0), expected[c])
    # independent bits: two other classes' bits of class-0 rows are both 1 with probability q^2
    both = (bits[labels == 0][:, 1] & bits[labels == 0][:, 2]).mean()
    assert abs(both - q * q) <= 5 * math.sqrt(q * q * (1 - q * q) / COUNTS[0] / 10)
    np.testing.assert_array_equal(instant_bits(ldp, bits[:500], _key(41)), bits[:500])  # no instant step
    assert ldp.epsilon() == {"permanent": 2.0, "instant": 2.0} and ldp.bits_for(26) == 26


def test_oue_count_estimates_are_unbiased_on_a_large_sample() -> None:
    """26 classes (OUE's side of the rule at epsilon 2), 192,400 rows, counts 2,400 .. 12,400.

    `standard_error` bounds the standard deviation of one class proportion estimated from one report (each
    bit's variance is at most 1/4), so a count's is at most se sqrt(n) (here 565); every class is over 6 of
    those inside the simplex, where the NNLS estimate is the linear, unbiased one. Each of 16 independent
    draws is within 5 bounds, their mean within 5 / sqrt(16): estimating with a 1-bit probability of 0.6 or
    0.45 instead of 1/2 puts that mean over 7 away.
    """
    counts = 2000 + np.arange(1, 27) * 400
    labels = np.repeat(np.arange(26), counts)
    ldp = LabelLDP(report_epsilon=2.0)
    assert ldp.resolved(26).mechanism == "oue"
    bound = ldp.standard_error(26) * math.sqrt(labels.size)
    estimates = np.array([ldp.estimate_counts(ldp.permanent_bits(labels, 26, _key(seed, "ldp_permanent"))
                                              .sum(axis=0), np.array(labels.size), 26) for seed in range(16)])
    assert (np.abs(estimates - counts) <= 5 * bound).all()
    assert (np.abs(estimates.mean(axis=0) - counts) <= 5 * bound / 4).all()


@pytest.mark.parametrize(("n_classes", "mechanism"), [(5, "krr"), (26, "oue")])
def test_auto_draws_and_estimates_as_the_mechanism_it_resolves_to(n_classes, mechanism) -> None:
    auto = LabelLDP(report_epsilon=2.0)
    resolved = LabelLDP(mechanism=mechanism, report_epsilon=2.0)
    assert auto.resolved(n_classes) == resolved == auto.sized_for(n_classes)
    labels = np.arange(3000) % n_classes
    np.testing.assert_array_equal(auto.permanent_bits(labels, n_classes, _key(42, "ldp_permanent")),
                                  resolved.permanent_bits(labels, n_classes, _key(42, "ldp_permanent")))
    np.testing.assert_array_equal(auto.report_probabilities(n_classes),
                                  resolved.report_probabilities(n_classes))
    assert auto.leaf_floor(n_classes) == resolved.leaf_floor(n_classes)


@pytest.mark.parametrize("mechanism, epsilon", [("krr", 3.0), ("oue", 2.0)])
def test_unary_estimates_are_the_least_squares_on_the_simplex(mechanism: str, epsilon: float) -> None:
    """k-RR and OUE: the closed form is the best fit of the bit proportions with x >= 0, sum x = 1 exactly.

    Checked against brute force over supports (least squares with the sum equation on each support), on
    groups of a few rows, where many classes are estimated at 0.
    """
    n_classes = 4
    ldp = LabelLDP(mechanism=mechanism, report_epsilon=epsilon)
    probabilities = ldp.report_probabilities(n_classes).T  # (bits, classes)
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 6, 60).astype(np.float64)
    sums = np.minimum(rng.integers(0, 6, (60, n_classes)), sizes[:, None])
    if mechanism == "krr":  # one reported class per row: the bits of a group add up to its size
        sums = np.stack([np.bincount(rng.integers(0, n_classes, int(n)), minlength=n_classes) for n in sizes])
    got = ldp.estimate_counts(sums, sizes, n_classes) / sizes[:, None]
    for x, observed in zip(got, sums / sizes[:, None], strict=True):
        assert (x >= 0).all() and x.sum() == pytest.approx(1.0, abs=1e-12)
        best = math.inf
        for size in range(1, n_classes + 1):
            for support in itertools.combinations(range(n_classes), size):
                columns = probabilities[:, list(support)]
                # minimise ||A z - o|| with sum z = 1: z = z0 + N w over the null space of the sum
                basis = np.linalg.svd(np.ones((1, size)))[2][1:].T
                start = np.full(size, 1.0 / size)
                w = np.linalg.lstsq(columns @ basis, observed - columns @ start, rcond=None)[0] if size > 1 \
                    else np.zeros(0)
                z = start + basis @ w
                if (z >= -1e-12).all():
                    best = min(best, float(np.sum((columns @ z - observed) ** 2)))
        assert np.sum((probabilities @ x - observed) ** 2) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_unary_estimates_of_a_group_do_not_depend_on_the_other_groups() -> None:
    ldp = LabelLDP(mechanism="oue", report_epsilon=2.0)
    rng = np.random.default_rng(2)
    sizes = rng.integers(1, 40, 300).astype(np.float64)
    sums = np.floor(rng.random((300, 26)) * sizes[:, None])
    whole = ldp.estimate_counts(sums, sizes, 26)
    for part in (slice(0, 1), slice(7, 150), slice(299, 300)):
        np.testing.assert_array_equal(ldp.estimate_counts(sums[part], sizes[part], 26), whole[part])
