"""The accountant's answers kept on disk: reused by later processes only when they pass the exact bound."""

from __future__ import annotations

import json
import math

import pytest

from fedcore.privacy import accounting, remembered
from fedcore.privacy.remembered import gaussian_delta


@pytest.fixture
def kept(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A fresh process's view: the answers file in an empty cache folder, nothing read or cached yet."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(remembered, "_kept", None)
    accounting.gaussian_noise_multiplier.cache_clear()
    accounting.gaussian_epsilon.cache_clear()
    yield tmp_path / remembered.FILE_NAME
    accounting.gaussian_noise_multiplier.cache_clear()
    accounting.gaussian_epsilon.cache_clear()


def _next_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process read and computed: the next call starts from the file."""
    monkeypatch.setattr(remembered, "_kept", None)
    accounting.gaussian_noise_multiplier.cache_clear()
    accounting.gaussian_epsilon.cache_clear()


def _no_accountant():
    raise AssertionError("the accountant was asked")


def test_the_bound_is_exact_at_the_accountants_calibration():
    """The PLD accountant's multiplier meets the analytic bound; 0.01% less noise does not."""
    for epsilon, delta in ((0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-9)):
        z = accounting.gaussian_noise_multiplier(epsilon, delta)
        assert gaussian_delta(epsilon, z) <= delta < gaussian_delta(epsilon, z * 0.9999)
    assert math.isnan(gaussian_delta(1000.0, 0.5))  # e^1000 overflows: nothing passes


def test_a_later_process_reuses_the_accountants_answers_without_asking_it(kept, monkeypatch):
    z = accounting.gaussian_noise_multiplier(1.0, 1e-6)
    total = accounting.gaussian_epsilon(z / math.sqrt(30), 1e-6)
    assert len(json.loads(kept.read_text())) == 2
    _next_process(monkeypatch)
    monkeypatch.setattr(accounting, "_accountant", _no_accountant)
    assert accounting.gaussian_noise_multiplier(1.0, 1e-6) == z  # the same float
    assert accounting.gaussian_epsilon(z / math.sqrt(30), 1e-6) == total


def test_a_kept_answer_claiming_less_noise_or_less_spent_is_asked_again(kept, monkeypatch):
    z = accounting.gaussian_noise_multiplier(1.0, 1e-6)
    total = accounting.gaussian_epsilon(z, 1e-6)
    answers = json.loads(kept.read_text())
    for key in answers:  # a multiplier 1% below the need, an epsilon 1% below the true one
        answers[key] *= 0.99
    kept.write_text(json.dumps(answers))
    _next_process(monkeypatch)
    assert accounting.gaussian_noise_multiplier(1.0, 1e-6) == z
    assert accounting.gaussian_epsilon(z, 1e-6) == total
    assert sorted(json.loads(kept.read_text()).values()) == sorted([z, total])  # the file is mended


def test_answers_of_another_version_or_an_unreadable_file_are_not_used(kept, monkeypatch):
    kept.write_text("not json")
    z = accounting.gaussian_noise_multiplier(2.0, 1e-6)
    key, = json.loads(kept.read_text())
    assert key == f"gaussian_noise_multiplier|2.0|1e-06|{accounting._answers_version()}"
    kept.write_text(json.dumps({key.replace("dp-accounting", "dp-accounting 0.0.0 of"): z * 2}))
    _next_process(monkeypatch)
    assert accounting.gaussian_noise_multiplier(2.0, 1e-6) == z
