"""RR-with-prior (fedcore.privacy.rr_prior): its k, its exact law, its epsilon, and its draws by position."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedcore.errors import ParameterError
from fedcore.privacy import ldp_draws, rr_prior
from fedcore.randomness import counter_key
from tests.test_philox import numpy_words

KEY = counter_key(7, "ldp_permanent")


def test_k_and_law_of_a_row_by_hand() -> None:
    prior = np.array([[0.05, 0.5, 0.3, 0.15]])
    e = math.exp(1.0)
    # kept mass of the top k: 0.5 e/e, 0.8 e/(e+1), 0.95 e/(e+2), 1.0 e/(e+3): the largest is k = 2
    kept = [0.5, 0.8 * e / (e + 1), 0.95 * e / (e + 2), e / (e + 3)]
    assert max(range(4), key=kept.__getitem__) == 1
    order, k = rr_prior.top_k(prior, 1.0)
    assert order.tolist() == [[1, 2, 3, 0]] and k.tolist() == [2]
    law = rr_prior.report_probabilities(np.repeat(prior, 3, axis=0), np.array([1, 2, 0]), 1.0)
    np.testing.assert_array_equal(law, [[0, e / (e + 1), 1 / (e + 1), 0],  # label in the top 2: k-RR on them
                                        [0, 1 / (e + 1), e / (e + 1), 0],
                                        [0, 0.5, 0.5, 0]])  # label outside: uniform on the top 2


def test_k_is_the_brute_force_argmax() -> None:
    rng = np.random.default_rng(3)
    prior = rng.dirichlet(np.full(6, 0.4), size=300)
    prior[0] = 1 / 6  # all equal: the smaller codes first, and all six (plain k-RR)
    for epsilon in (0.5, 2.0, 4.0):
        order, k = rr_prior.top_k(prior, epsilon)
        e = math.exp(epsilon)
        for i in range(prior.shape[0]):
            ranked = sorted(range(6), key=lambda c: (-prior[i, c], c))
            kept = [sum(prior[i, ranked[:s]]) * e / (e + (s - 1)) for s in range(1, 7)]
            assert order[i].tolist() == ranked and k[i] == kept.index(max(kept)) + 1
    order, k = rr_prior.top_k(prior[:1], 4.0)
    assert order.tolist() == [[0, 1, 2, 3, 4, 5]] and k.tolist() == [6]


def test_every_report_is_at_most_e_to_the_epsilon_likelier_under_any_other_label() -> None:
    prior = np.random.default_rng(4).dirichlet(np.full(5, 0.3), size=200)
    for epsilon in (1.0, 2.0, 4.0):
        laws = np.stack([rr_prior.report_probabilities(prior, np.full(200, c), epsilon) for c in range(5)])
        np.testing.assert_allclose(laws.sum(axis=2), 1.0, rtol=1e-12)
        for a, b in itertools.permutations(range(5), 2):
            ratio = np.divide(laws[a], laws[b], out=np.ones_like(laws[a]), where=laws[b] > 0)
            assert (laws[a][laws[b] == 0] == 0).all()  # no report possible under one label only
            assert ratio.max() <= math.exp(epsilon) * (1 + 1e-12)


def test_draws_follow_the_rule_on_numpys_philox() -> None:
    rng = np.random.default_rng(5)
    prior = rng.dirichlet(np.full(5, 0.5), size=60)
    labels = rng.integers(0, 5, 60)
    got = rr_prior.randomize(labels, prior, 1.5, KEY, first_row=40)
    order, sizes = rr_prior.top_k(prior, 1.5)
    k = sizes.tolist()
    e = math.exp(1.5)
    for i, label in enumerate(labels):
        words = [int(w) for w in numpy_words(KEY, 40 + i, 0, 0, 2)]  # no rejection at these odds
        members = order[i, :k[i]].tolist()
        if label not in members:
            expected = members[words[1] % k[i]]
        elif words[0] >> 1 < int(ldp_draws.threshold63(e / (e + (k[i] - 1)))):
            expected = label
        else:
            place = members.index(label)
            other = words[1] % max(k[i] - 1, 1)
            expected = members[other + (other >= place)]
        assert got[i] == expected


def test_report_frequencies_match_the_law_and_blocks_draw_what_the_whole_draws() -> None:
    prior = np.tile([[0.1, 0.45, 0.35, 0.1]], (40_000, 1))  # eps 1: k = 2
    labels = np.random.default_rng(6).choice(4, size=40_000, p=[0.1, 0.45, 0.35, 0.1])
    reports = rr_prior.randomize(labels, prior, 1.0, KEY)
    law = rr_prior.report_probabilities(prior, labels, 1.0)
    assert rr_prior.top_k(prior[:1], 1.0)[1].tolist() == [2]
    for c in (1, 2):  # the two members' shares among rows of label 1, 2 and outside
        for group in (labels == 1, labels == 2, labels == 0):
            share = (reports[group] == c).mean()
            expected = law[group, c][0]
            assert abs(share - expected) < 4 * math.sqrt(expected * (1 - expected) / group.sum())
    assert set(np.unique(reports)) == {1, 2}
    np.testing.assert_array_equal(rr_prior.randomize(labels[123:4567], prior[123:4567], 1.0, KEY, 123),
                                  reports[123:4567])


@pytest.mark.parametrize(("prior", "labels", "message"), [
    (np.ones(3), np.zeros(3, dtype=int), "prior must be (rows, classes), got shape (3,)"),
    (np.array([[0.5, -0.1]]), np.zeros(1, dtype=int),
     "prior must be finite and >= 0: a class probability per row and class"),
    (np.ones((2, 3)), np.array([0, 3]), "labels must be 2 class codes in [0, 3) beside the prior's rows"),
])
def test_bad_input_raises_the_exact_message(prior, labels, message) -> None:
    with pytest.raises(ParameterError) as caught:
        rr_prior.randomize(labels, prior, 2.0, KEY)
    assert str(caught.value) == message
