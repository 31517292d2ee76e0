"""Laplace mechanism: noise scale, epsilon validation and budget accounting."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ParameterError
from fedcore.privacy.laplace import PrivacyAccountant, check_epsilon, laplace_counts

HINT = "smaller epsilon = more noise and stronger privacy, larger = less noise (typical values 0.1 to 10)"


@pytest.mark.parametrize(("epsilon", "shown"), [
    (0, "0"), (-1.5, "-1.5"), (float("nan"), "nan"), (float("inf"), "inf"), (True, "True"), ("1", "'1'"),
    (None, "None"), (np.bool_(True), "np.True_"),
])
def test_bad_epsilons_raise_exact_messages(epsilon: object, shown: str) -> None:
    with pytest.raises(ParameterError) as excinfo:
        check_epsilon(epsilon)  # type: ignore[arg-type]
    assert str(excinfo.value) == f"epsilon must be a finite number > 0, got {shown}: {HINT}"


def test_good_epsilons_come_back_as_floats() -> None:
    assert check_epsilon(2) == 2.0 and isinstance(check_epsilon(2), float)
    assert check_epsilon(np.float32(0.5)) == 0.5
    with pytest.raises(ParameterError) as excinfo:
        check_epsilon(0.0, "epsilon_per_tree")
    assert str(excinfo.value).startswith("epsilon_per_tree must be a finite number > 0, got 0.0")


def test_noise_has_the_laplace_scale() -> None:
    noise = laplace_counts(np.zeros(200_000, dtype=np.int64), 0.5, np.random.default_rng(0), sensitivity=2.0)
    assert noise.dtype == np.float64
    # Laplace(0, b) has variance 2 b^2 = 2 (2 / 0.5)^2 = 32; the sample variance's sd here is ~0.25
    assert noise.var() == pytest.approx(32.0, rel=0.05)
    assert abs(noise.mean()) < 0.06
    assert np.median(np.abs(noise)) == pytest.approx(4.0 * np.log(2), rel=0.03)  # median |X| = b ln 2


def test_noise_is_added_to_the_counts_and_keeps_their_shape() -> None:
    counts = np.arange(12).reshape(3, 4)
    noisy = laplace_counts(counts, 1.0, np.random.default_rng(5))
    noise = laplace_counts(np.zeros((3, 4)), 1.0, np.random.default_rng(5))
    assert noisy.shape == (3, 4)
    np.testing.assert_allclose(noisy - counts, noise)
    assert (noise != 0).all()
    with pytest.raises(ParameterError, match="sensitivity must be a finite number > 0, got -1"):
        laplace_counts(counts, 1.0, np.random.default_rng(5), sensitivity=-1)
    with pytest.raises(ParameterError, match="epsilon must be a finite number > 0, got 0"):
        laplace_counts(counts, 0, np.random.default_rng(5))


def test_accountant_composes_sequentially() -> None:
    accountant = PrivacyAccountant()
    assert accountant.to_dict() == {"mechanism": "laplace", "queries": 0, "epsilon_per_query": None,
                                    "total_epsilon": 0.0}
    accountant.spend(0.1, queries=30)
    accountant.spend(0.1)
    assert accountant.total_epsilon() == pytest.approx(3.1)
    assert accountant.to_dict() == {"mechanism": "laplace", "queries": 31, "epsilon_per_query": 0.1,
                                    "total_epsilon": pytest.approx(3.1)}
    accountant.spend(1.0, 2)
    assert accountant.total_epsilon() == pytest.approx(5.1)
    assert accountant.to_dict()["epsilon_per_query"] is None and accountant.queries == 33


def test_accountant_refuses_bad_spends_without_recording_them() -> None:
    accountant = PrivacyAccountant()
    with pytest.raises(ParameterError, match="epsilon must be a finite number > 0, got -1"):
        accountant.spend(-1)
    with pytest.raises(ParameterError, match="queries must be an integer >= 1, got 0"):
        accountant.spend(1.0, 0)
    with pytest.raises(ParameterError, match="queries must be an integer >= 1, got 2.5"):
        accountant.spend(1.0, 2.5)  # type: ignore[arg-type]
    assert accountant.queries == 0 and accountant.total_epsilon() == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_compiled_noise_is_numpys_laplace_draw_for_draw(seed: int) -> None:
    counts = np.random.default_rng(seed).integers(0, 50, (300, 4, 2, 26)).astype(np.uint16)
    fast, reference = (np.random.Generator(np.random.PCG64(seed)) for _ in range(2))
    noisy = laplace_counts(counts, 0.7, fast, sensitivity=2.0)
    expected = counts.astype(np.float64) + reference.laplace(0.0, 2.0 / 0.7, size=counts.shape)
    np.testing.assert_array_equal(noisy, expected)  # bit for bit, so seeded GDP models do not change
    assert fast.random() == reference.random()  # and the generator continues where NumPy's would


def test_a_zero_uniform_falls_back_to_numpys_redraw(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedcore.privacy import laplace

    # a word whose top 53 bits are all 0 is the uniform 0.0, which NumPy rejects and redraws
    assert not laplace._add_laplace(np.zeros(3), np.array([5, 1 << 20, 1 << 12], np.uint64), 1.0)
    assert laplace._add_laplace(np.zeros(2), np.array([1 << 11, 1 << 63], np.uint64), 1.0)
    # then the generator is rewound and NumPy draws: the same values and the same continuation
    monkeypatch.setattr(laplace, "_add_laplace", lambda out, words, scale: False)
    rng, reference = (np.random.Generator(np.random.PCG64(9)) for _ in range(2))
    np.testing.assert_array_equal(laplace.laplace_counts(np.arange(4), 1.0, rng),
                                  np.arange(4) + reference.laplace(0.0, 1.0, 4))
    assert rng.random() == reference.random()


def test_no_draw_exceeds_the_noise_bound() -> None:
    from fedcore.privacy import laplace

    # the 2,000 most extreme non-zero uniforms, k * 2^-53 and 1 - k * 2^-53 (low bits: dropped, set anyway)
    k = np.arange(1, 1001, dtype=np.uint64)
    top = (np.uint64(1 << 53) - k) << np.uint64(11)
    words = np.concatenate([k << np.uint64(11), top | np.uint64(2047)])
    out = np.zeros(len(words))
    assert laplace._add_laplace(out, words, 1.0)
    assert np.abs(out).max() <= laplace.LAPLACE_NOISE_BOUND * (1 + 2.0 ** -50)
    # both ends are reached: 2u = 2^-52 below 1/2; 2 - u - u rounds to 2^-53 at u = 1 - 2^-53
    assert out[0] == pytest.approx(-52 * np.log(2), rel=1e-15)
    assert out[1000] == pytest.approx(laplace.LAPLACE_NOISE_BOUND, rel=1e-15)
    # NumPy's own sampler, which a party without PCG64 falls back to, draws the same
    scale = 2.5
    rng = np.random.Generator(np.random.PCG64(3))
    assert np.abs(rng.laplace(0.0, scale, 100_000)).max() <= laplace.LAPLACE_NOISE_BOUND * scale
