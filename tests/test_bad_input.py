"""Invalid input raises ValueError naming the argument; nothing is renormalised silently."""

from __future__ import annotations

import numpy as np
import pytest

from simlab import tree_verifiers, verifiers
from simlab.drafting import Drafting
from simlab.otlp import optimal_acceptance, solve_ot_lp

P = np.array([0.2, 0.3, 0.5])
Q = np.array([0.5, 0.25, 0.25])

BAD_DISTRIBUTIONS = {
    "2-D": (np.full((1, 3), 1 / 3), "must be 1-D"),
    "empty": (np.array([]), "empty"),
    "NaN": (np.array([0.5, np.nan, 0.5]), "NaN"),
    "inf": (np.array([0.5, np.inf, 0.5]), "infinite"),
    "negative": (np.array([0.6, -0.1, 0.5]), "negative"),
    "sum off": (np.array([0.2, 0.3, 0.5 + 2e-9]), "sums to"),
    "wrong length": (np.array([0.5, 0.5]), "length"),
    "text": (["a", "b", "c"], "numeric"),
    "numbers as text": (["0.2", "0.3", "0.5"], "numeric"),  # a cast would parse them
    "too large for float64": ([10**400, 0, 0], "numeric"),
    "text in an object array": (np.array(["0.2", "0.3", "0.5"], dtype=object), "numeric"),
    "dates": (np.array(["1970-01-01", "1970-01-02", "1970-01-03"], dtype="datetime64[D]"), "numeric"),
    "complex": (np.array([0.2 + 0j, 0.3 + 0j, 0.5 + 1j]), "must be real"),
    "None inside": ([0.2, None, 0.8], "None"),  # a cast makes it NaN
    "masked entries": (np.ma.masked_array([0.2, 0.3, 0.5], mask=[False, False, True]), "masked"),  # a cast drops the mask
}


@pytest.mark.parametrize("name", verifiers.names())
@pytest.mark.parametrize("case", list(BAD_DISTRIBUTIONS))
@pytest.mark.parametrize("argument", ["p", "q"])
def test_bad_distribution(name, case, argument):
    bad, message = BAD_DISTRIBUTIONS[case]
    p, q = (bad, Q) if argument == "p" else (P, bad)
    if case == "wrong length" and argument == "p":
        message = "length"  # then q is the one that disagrees
        argument = "q"
    verifier = verifiers.get(name)
    for call in (
        lambda: verifier.output_distribution(p, q, [0, 1]),
        lambda: verifier.acceptance_rate(p, q, 2),
        lambda: verifier.sample(p, q, [0, 1], np.random.default_rng(0)),
    ):
        with pytest.raises(ValueError, match=rf"^{argument}: .*{message}"):
            call()


BAD_CHILDREN = {
    "out of range": ([0, 3], "outside"),
    "negative id": ([0, -1], "outside"),
    "float ids": ([0.0, 1.0], "integers"),
    "2-D": ([[0, 1]], "1-D"),
    "empty (k=0)": ([], "k = 0"),
}


@pytest.mark.parametrize("name", verifiers.names())
@pytest.mark.parametrize("case", list(BAD_CHILDREN))
def test_bad_children(name, case):
    children, message = BAD_CHILDREN[case]
    verifier = verifiers.get(name)
    with pytest.raises(ValueError, match=rf"^children: .*{message}"):
        verifier.output_distribution(P, Q, children)
    with pytest.raises(ValueError, match=rf"^children: .*{message}"):
        verifier.sample(P, Q, children, np.random.default_rng(0))


@pytest.mark.parametrize("name", [n for n in verifiers.names() if verifiers.get(n).drafting.value != "deterministic"])
def test_child_with_zero_draft_probability_is_an_impossible_draw(name):
    q = np.array([0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match=r"^children: token 2 has q = 0"):
        verifiers.get(name).output_distribution(P, q, [0, 2])


@pytest.mark.parametrize("name", ["onehot", "greedy", "nss"])
def test_deterministic_children_need_not_come_from_q(name):
    """A deterministic child (an n-gram match, say) can have q = 0: it was not drawn from q."""
    q = np.array([0.5, 0.5, 0.0])
    law = verifiers.get(name).prepare(P, q, 2, law=Drafting.DETERMINISTIC).output_distribution([0, 2])
    assert law.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"^children: token 2 has q = 0"):  # claimed to be sampled: impossible
        verifiers.get(name).prepare(P, q, 2, law=Drafting.IID).output_distribution([0, 2])


@pytest.mark.parametrize("name", verifiers.names())
def test_plan_checks_number_of_children(name):
    plan = verifiers.get(name).prepare(P, Q, 2)
    with pytest.raises(ValueError, match=r"^children: expected k = 2"):
        plan.output_distribution([0])


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2"])
@pytest.mark.parametrize("name", verifiers.names())
def test_bad_k(name, k):
    with pytest.raises(ValueError, match=r"^k: "):
        verifiers.get(name).acceptance_rate(P, Q, k)


def test_repeated_children_without_replacement():
    with pytest.raises(ValueError, match=r"^children: .*repeats"):
        verifiers.get("rrs_wor").output_distribution(P, Q, [1, 1])


def test_rng_must_be_a_generator():
    with pytest.raises(ValueError, match=r"^rng: "):
        verifiers.get("naive").sample(P, Q, [0], 42)


@pytest.mark.parametrize("name", [["hsd"], ("naive",), {"hsd": 1}, None, 3])
def test_registries_refuse_a_name_that_is_not_a_string_alike(name):
    """Issue 40 item 12: ``tree_verifiers.get(["hsd"])`` raised a raw ``TypeError: unhashable type``;
    node and tree registries refuse any non-name with one ValueError naming the argument."""
    with pytest.raises(ValueError, match=r"^name: unknown verifier .*; choose one of nss, "):
        verifiers.get(name)
    with pytest.raises(ValueError, match=r"^name: unknown tree verifier .*; choose one of nss, .*, hsd, "):
        tree_verifiers.get(name)
    with pytest.raises(ValueError, match=r"^name: unknown tree verifier "):
        tree_verifiers.paper_name(name)


def test_unknown_verifier_and_options():
    with pytest.raises(ValueError, match=r"^name: unknown verifier 'bogus'"):
        verifiers.get("bogus")
    with pytest.raises(ValueError, match=r"^options: "):
        verifiers.get("nss", order="fixed")
    with pytest.raises(ValueError, match=r"^order: "):
        verifiers.get("specinfer", order="sorted")
    with pytest.raises(ValueError, match=r"^mode: "):
        verifiers.get("khisti", mode="fast")
    with pytest.raises(ValueError, match=r"^s: "):
        verifiers.get("khisti", s=1)


def test_size_limits_raise_clearly():
    big = np.full(60, 1 / 60)
    with pytest.raises(ValueError, match=r"^k: the OT LP would have"):
        verifiers.get("optimal").acceptance_rate(big, big, 3)
    with pytest.raises(ValueError, match=r"^k: exact enumeration would list"):
        verifiers.get("rrs_wor").acceptance_rate(np.full(200, 1 / 200), np.full(200, 1 / 200), 3)
    with pytest.raises(ValueError, match=r"^k: the full Khisti LP"):
        verifiers.get("khisti", mode="lp").prepare(big, big, 3)
    with pytest.raises(ValueError, match=r"^k: "):
        optimal_acceptance(big, big, 4, replacement=False, method="enumerate")
    with pytest.raises(ValueError, match=r"^k: "):
        solve_ot_lp(P, np.array([1.0, 0.0, 0.0]), 2, replacement=False)


@pytest.mark.parametrize("k", [None, "2", 2.0, True, 0])
def test_node_acceptance_checks_k_before_any_method(k):
    """``optimal_wor`` compares k with the support: a k that is not an integer >= 1 is refused
    by name first, never a TypeError from the comparison."""
    from simlab.measures import MEASURABLE, node_acceptance

    for method in MEASURABLE:
        with pytest.raises(ValueError, match=r"^k: "):
            node_acceptance(P, Q, [k], np.random.default_rng(0), methods=[method])
