"""llama.cpp's draft chain (``simlab.builders.ConfidentChain``) against its rule written out.

The rule, from ggml-org/llama.cpp@6c8a045 ``common/speculative.cpp::common_speculative_use_draft_model``
(draft sampler ``top_k = 10`` then ``dist``: the probability of a candidate is its draft probability
renormalised over the 10 kept; the first sorted candidate is pushed, then the loop breaks at
``n_draft`` tokens or when ``cur_p->data[0].p < params.p_min``) and @6c8a045
``tools/server/server-context.cpp`` (a draft shorter than ``n_min`` is ignored: a plain step), is
written below with ``numpy.argsort`` on the pair's own rows, not with the builder's helpers.
"""

from __future__ import annotations

import numpy as np
import pytest

from simlab import builders, tree_verifiers
from simlab.builders import EAGLE2, ConfidentChain
from simlab.builders.confident_chain import confidence
from simlab.engine_metrics import tree_metrics
from simlab.pairs import MarkovPair
from simlab.trees import NodeTable


def llama_chain(pair, context, n_max: int, n_min: int, p_min: float, top_k: int = 10) -> tuple[int, ...]:
    """The chain llama.cpp's server verifies at ``context`` (the module docstring's rule)."""
    tokens: list[int] = []
    while True:
        _, q = pair.distributions([tuple(context) + tuple(tokens)])
        q = q[0]
        kept = np.argsort(-q, kind="stable")[:top_k]  # top_k sampler, ties to the lowest id
        p = q[kept] / q[kept].sum()  # dist: softmax of the kept logits
        tokens.append(int(kept[0]))
        if len(tokens) >= n_max:
            break
        if p[0] < p_min:  # checked after the push: the token is kept
            break
    return tuple(tokens) if len(tokens) >= n_min else ()


WINDOW = np.array([0.3] + [0.05] * 9 + [0.025] * 10)
"""A draft row whose top token has 0.3 of the mass and 0.4 of the top 10's."""


def random_markov(vocab: int, seed: int, sharp: float) -> MarkovPair:
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.5), size=vocab)
    draft = rng.dirichlet(np.full(vocab, sharp), size=vocab)
    return MarkovPair(target, draft)


WORLDS = {
    "V=5 sharp": random_markov(5, 1, 0.3),
    "V=14 flat": random_markov(14, 2, 1.5),  # above the window of 10: renormalisation matters
    "V=14 sharp": random_markov(14, 3, 0.2),
    "window": MarkovPair(np.full((20, 20), 0.05), np.tile(WINDOW, (20, 1))),
    "ties": MarkovPair(
        np.full((4, 4), 0.25),
        np.array([[0.4, 0.4, 0.1, 0.1], [0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, 0.0]]),
    ),
}
OPTIONS = [(n, m, p) for n in (1, 3, 8) for m in (0, 2, 3) for p in (-0.5, 0.0, 0.3, 0.35, 0.5, 0.75, 1.0, 1.5) if m <= n]


def tree_chain(tree) -> tuple[int, ...]:
    """The chain of a one-path tree (empty for the root alone)."""
    path: tuple[int, ...] = ()
    while tree.child_list(path):
        (child,) = tree.child_list(path)
        path += (child,)
    return path


def check_rule(builder_class, world: str, context, n_max, n_min, p_min) -> None:
    pair = WORLDS[world]
    tree = builder_class(budget=n_max, p_min=p_min, n_min=n_min).sample(NodeTable(pair, context))
    expected = llama_chain(pair, context, n_max, n_min, p_min)
    assert tree_chain(tree) == expected and tree.tokens() == len(expected), (world, context, n_max, n_min, p_min)


@pytest.mark.parametrize("world", WORLDS)
def test_the_chain_is_llama_cpps_rule(world):
    for context in ((0,), (1,), (3,)):
        for n_max, n_min, p_min in OPTIONS:
            check_rule(ConfidentChain, world, context, n_max, n_min, p_min)


def test_a_token_at_exactly_p_min_continues_and_the_token_below_is_kept():
    """q = (0.5, 0.25, 0.25) after token 0: confidence 0.5 = p_min continues; 0.25 < 0.3 stops after the token."""
    draft = np.array([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]])
    pair = MarkovPair(np.full((3, 3), 1 / 3), draft)
    tree = ConfidentChain(budget=5, p_min=0.5).sample(NodeTable(pair, (0,)))
    assert tree_chain(tree) == (0, 0, 0, 0, 0)
    tree = ConfidentChain(budget=5, p_min=0.5 + 1e-12).sample(NodeTable(pair, (0,)))
    assert tree_chain(tree) == (0,)  # below p_min: the token is drafted, the chain stops


def test_the_confidence_is_renormalised_over_the_draft_top_10():
    q = WINDOW  # q(0) = 0.3; over the top 10: 0.3 / 0.75 = 0.4
    assert np.isclose(q.sum(), 1.0)
    token, conf = confidence(q)
    assert token == 0 and np.isclose(conf, 0.4)
    assert np.isclose(confidence(q, top_k=20)[1], 0.3)


def test_p_min_at_or_below_zero_is_the_top_1_chain():
    """The mapping's claim: llama.cpp with draft_p_min <= 0 is vLLM's chain, ``EAGLE2(n, n - 1, 1)``."""
    for world, pair in WORLDS.items():
        for n in (1, 4, 9):
            for p_min in (0.0, -1.0):
                table = NodeTable(pair, (2,))
                chain = tree_chain(ConfidentChain(budget=n, p_min=p_min, n_min=n).sample(table))
                assert chain == tree_chain(EAGLE2(budget=n, depth=n - 1, top_k=1).sample(table)) and len(chain) == n, world


def test_exact_match_on_the_chain_accepts_the_product_of_target_probabilities():
    """E[accepted] of exact matching on a chain x_1..x_m: sum over i of prod_{j <= i} p(x_j | x_<j)."""
    pair = WORLDS["V=14 sharp"]
    for p_min in (0.2, 0.6):
        table = NodeTable(pair, (4,))
        tree = ConfidentChain(budget=6, p_min=p_min).sample(table)
        chain = tree_chain(tree)
        survive, expected = 1.0, 0.0
        for i, x in enumerate(chain):
            p, _ = pair.distributions([(4,) + chain[:i]])
            survive *= p[0][x]
            expected += survive
        got = tree_metrics(tree, tree_verifiers.get("exact_match"), eos=False)
        assert np.isclose(got.accepted, expected, rtol=0, atol=1e-12) and np.isclose(got.accept_length, 1 + expected, atol=1e-12)


def test_a_dropped_chain_is_a_plain_step_that_still_paid_its_draft_forwards():
    pair = WORLDS["V=14 flat"]
    table = NodeTable(pair, (1,))
    kept = ConfidentChain(budget=8, p_min=0.9).sample(table)
    m = kept.tokens()
    assert 1 <= m < 8  # a flat draft stops early
    dropped = ConfidentChain(budget=8, p_min=0.9, n_min=m + 1).sample(NodeTable(pair, (1,)))
    assert dropped.tokens() == 0 and dropped.cost.verified == 0
    assert len(dropped.cost.forwards) == len(kept.cost.forwards) == m
    assert [f.context for f in kept.cost.forwards] == list(range(m)) and all(f.tokens == 1 for f in kept.cost.forwards)
    assert tree_metrics(dropped, tree_verifiers.get("exact_match"), eos=False).accept_length == 1.0


def test_the_builder_is_registered_deterministic_and_refuses_bad_options():
    assert builders.get("confident_chain", budget=4, p_min=0.5, n_min=1) == ConfidentChain(4, 0.5, 1)
    assert ConfidentChain.deterministic and builders.laws("confident_chain") == ConfidentChain.laws
    for options, name in (
        ({"budget": 0}, "budget"),
        ({"budget": 2, "n_min": 3}, "n_min"),
        ({"n_min": -1}, "n_min"),
        ({"p_min": float("nan")}, "p_min"),
        ({"p_min": True}, "p_min"),
        ({"p_min": "0.5"}, "p_min"),
        ({"top_k": 0}, "top_k"),
    ):
        with pytest.raises(ValueError, match=f"^{name}: "):
            ConfidentChain(**options)


# -- planted faults: each breaks one clause of the rule; the rule check must catch it --------------------------------------
class DropsTheUnsureToken(ConfidentChain):
    """Drops the token whose confidence is below p_min instead of keeping it."""

    def chain(self, table):
        tokens = super().chain(table)
        path = tokens[:-1]
        if tokens and len(tokens) < self.budget and confidence(table.q(path), self.top_k)[1] < self.p_min:
            return path
        return tokens


class NoRenormalisation(ConfidentChain):
    """Compares q itself with p_min (no top-10 window)."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "top_k", 10**9)


class StopsAtEquality(ConfidentChain):
    """Stops when the confidence equals p_min (``<=`` for ``<``)."""

    def chain(self, table):
        tokens: list[int] = []
        while True:
            token, conf = confidence(table.q(tuple(tokens)), self.top_k)
            tokens.append(token)
            if len(tokens) >= self.budget or conf <= self.p_min:
                return tuple(tokens)


class KeepsShortChains(ConfidentChain):
    """Ignores n_min."""

    def sample(self, table, rng=None):
        return ConfidentChain(self.budget, self.p_min, 0, self.top_k).sample(table)


def rule_holds(builder_class) -> bool:
    """Every world, context and option of the rule test, plus the p_min boundary case."""
    try:
        for world in WORLDS:
            for context in ((0,), (1,), (3,)):
                for n_max, n_min, p_min in OPTIONS:
                    check_rule(builder_class, world, context, n_max, n_min, p_min)
        boundary = MarkovPair(np.full((3, 3), 1 / 3), np.array([[0.5, 0.25, 0.25]] * 3))
        WORLDS["boundary"] = boundary
        check_rule(builder_class, "boundary", (0,), 4, 0, 0.5)
    except AssertionError:
        return False
    finally:
        WORLDS.pop("boundary", None)
    return True


@pytest.mark.parametrize("fault", [DropsTheUnsureToken, NoRenormalisation, StopsAtEquality, KeepsShortChains])
def test_planted_fault_is_caught(fault):
    assert not rule_holds(fault)


def test_the_correct_builder_passes_the_check_that_catches_the_faults():
    assert rule_holds(ConfidentChain)
