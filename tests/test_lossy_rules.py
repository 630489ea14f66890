"""The engine rules (issue 26): strict exact-match (NSS's law under vLLM's name) and the two lossy
relaxations engines ship, SGLang's threshold rule and Medusa's typical acceptance.

Exact evidence: each rule's law against an independent transcription of the official code
(SGLang: the kernel run at one coin per interval of the coin's breakpoints; Medusa:
``evaluate_posterior`` over the candidate paths), by enumeration on small worlds; the exact
3-token bias (``pairing_bias``) zero where the parameters make the rule exact, positive elsewhere.
Statistical evidence: designed G-tests (``stats.py``: false alarm 1e-6, power 0.99 at TV 0.02).
Planted faults: ``lossy_mutants.py``, each caught here.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from lossy_mutants import NODE_MUTANTS, TREE_MUTANTS
from simlab import tree_verifiers, verifiers
from simlab.builders import Static, chain, iid
from simlab.drafting import Drafting, child_tuples
from simlab.efficiency import expected_block_efficiency, pairing_bias
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.sampling import sampling_distribution
from simlab.trees import DraftTree, NodeTable
from simlab.verifiers.exact_match import ExactMatch
from simlab.verifiers.nss import NSS
from stats import assert_sampler_matches
from variants import EDGE_CASES, edge_case

EXACT = 1e-12
LAWS = list(Drafting)
PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)
TOP2 = Static([(0,), (1,), (0, 0), (1, 0)], "topk")  # a deterministic (EAGLE-like) tree
SHAPES = {"top-k tree": TOP2, "iid(2,2)": iid(2, 2), "iid(2,2) w/o repl.": iid(2, 2, Drafting.WITHOUT_REPLACEMENT)}


def _laws(pq, k):
    """The drafting laws that can give k children from q (k distinct tokens for the distinct laws)."""
    _, q = pq
    distinct = int(np.count_nonzero(q))
    return [law for law in LAWS if law in (Drafting.IID, Drafting.REPEATED) or k <= distinct]


def _random_pairs(count=6, vocab=5, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        p, q = rng.dirichlet(np.full(vocab, 0.6)), rng.dirichlet(np.full(vocab, 0.6))
        p[rng.integers(vocab)] = 0.0
        out.append((p / p.sum(), q))
    return out


# -- strict exact-match ---------------------------------------------------------------------------
def test_exact_match_is_nss_under_the_engines_name():
    v = verifiers.get("exact_match")
    assert isinstance(v, NSS) and type(v) is ExactMatch and v.lossless_for == frozenset(Drafting)
    assert tree_verifiers.paper_name("exact_match") == "strict exact-match (vLLM)" and v.branch_is_target
    assert "exact_match" not in verifiers.ot_based()  # DDTE's OT family lists NSS under its own name


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_exact_match_law_is_nss_and_vllm_one_hot_mode(case):
    """B(x, .) = p for every children: NSS's law; with one child also the law of vLLM v1's mode
    without draft probabilities (the one-hot rule: accept w.p. p(x), else a draw from p without x)."""
    p, q = edge_case(case)
    for x in np.flatnonzero(q > 0):
        law = verifiers.get("exact_match").output_distribution(p, q, [x])
        assert np.abs(law - NSS().output_distribution(p, q, [x])).max() == 0.0
        assert np.abs(law - verifiers.get("onehot").output_distribution(p, q, [x])).max() <= EXACT


@pytest.mark.parametrize("k", [1, 2, 3])
def test_exact_match_acceptance_formula_per_drafting_law(k):
    """alpha = sum_t p(t) P(t is a child) equals the enumeration for every drafting law, and the
    closed forms: p(top-k of q) deterministic, sum_t p(t) (1 - (1 - q(t))^k) i.i.d., <p, q> repeated."""
    for p, q in _random_pairs() + [edge_case(c) for c in EDGE_CASES]:
        for law in _laws((p, q), k):
            plan = verifiers.get("exact_match").prepare(p, q, k, law)
            formula, enumerated = plan.acceptance_rate("formula"), plan.acceptance_rate("enumerate")
            assert abs(formula - enumerated) <= EXACT, (law, formula, enumerated)
            if law is Drafting.IID:
                assert abs(formula - float(np.sum(p * (1 - (1 - q) ** k)))) <= EXACT
            if law is Drafting.REPEATED:
                assert abs(formula - float(p @ q)) <= EXACT
            if law is Drafting.DETERMINISTIC:
                assert abs(formula - p[child_tuples(q, k, law)[0][0]].sum()) <= EXACT


# -- SGLang's threshold rule -----------------------------------------------------------------------
def sglang_reference(p, children, single, acc):
    """The kernel, transcribed, integrated over its coin: between consecutive breakpoints
    {0, 1, P_i / acc} the outcome is constant, so one coin per interval gives the exact law."""
    acc = max(acc, 1e-9)

    def run(coin):
        prob_acc = 0.0
        for x in children:
            prob_acc += p[x]
            if coin <= prob_acc / acc or p[x] >= single:
                return x
        return None

    cuts = np.unique(np.clip([0.0, 1.0] + [np.cumsum(p[children])[i] / acc for i in range(len(children))], 0.0, 1.0))
    out = np.zeros_like(p)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        x = run(0.5 * (lo + hi))
        if x is not None:
            out[x] += hi - lo
        else:
            rest = p.copy()
            rest[list(children)] = 0.0
            out += (hi - lo) * rest / rest.sum()
    return out


THRESHOLDS = [(1.0, 1.0), (1.0, 0.5), (0.3, 1.0), (0.3, 0.5), (0.0, 1.0), (1.0, 0.0), (0.5, 0.2)]


@pytest.mark.parametrize("single, acc", THRESHOLDS)
def test_sglang_law_equals_the_kernel_by_enumeration(single, acc):
    v = verifiers.get("sglang_threshold", threshold_single=single, threshold_acc=acc)
    for p, q in _random_pairs() + [edge_case(c) for c in EDGE_CASES]:
        for children in ([0], [1, 0], [2, 0, 1], [0, 0, 1], [1, 2]):
            if max(children) >= p.size:
                continue
            law = v.output_distribution(p, q, children)
            assert abs(law.sum() - 1.0) <= EXACT and law.min() >= 0.0
            rest = p.copy()
            rest[children] = 0.0
            if rest.any():  # (a zero residual: the kernel's fallback index, the lab's last child; docstring)
                assert np.abs(law - sglang_reference(p, children, single, acc)).max() <= EXACT, (children, p)


def test_sglang_default_thresholds_are_the_target_law():
    """At SGLang's defaults (1, 1) the output is a draw from p (B = p, as strict exact-match)."""
    v = verifiers.get("sglang_threshold")
    for p, q in _random_pairs() + [edge_case(c) for c in EDGE_CASES]:
        for children in ([0], [1, 0], [2, 0, 1]):
            if max(children) < p.size:
                assert np.abs(v.output_distribution(p, q, children) - p).max() <= EXACT


@pytest.mark.parametrize("shape", list(SHAPES))
def test_sglang_bias_is_zero_where_exact_and_positive_where_lossy(shape):
    """Exact at (1, 1) on distinct siblings; on i.i.d. trees a repeated sibling is cumulated at each
    copy (the kernel's prob_acc), so even (1, 1) is lossy there."""
    exact = tree_verifiers.get("sglang_threshold", allow_lossy=True)
    bias = pairing_bias(PAIR, (1,), SHAPES[shape], exact, n=2)
    assert bias > 1e-3 if shape == "iid(2,2)" else bias <= EXACT
    for single, acc in [(1.0, 0.5), (0.3, 1.0)]:
        lossy = tree_verifiers.get("sglang_threshold", allow_lossy=True, threshold_single=single, threshold_acc=acc)
        assert pairing_bias(PAIR, (1,), SHAPES[shape], lossy, n=2) > 1e-3, (single, acc)


def test_sglang_refusals():
    with pytest.raises(ValueError, match="^verifier: sglang_threshold is not lossless .* declared lossy"):
        expected_block_efficiency(PAIR, (1,), TOP2, "sglang_threshold")
    for bad in (-0.1, 1.5, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="^threshold_acc: must be a number in"):
            verifiers.get("sglang_threshold", threshold_acc=bad)
        with pytest.raises(ValueError, match="^threshold_single: must be a number in"):
            tree_verifiers.get("sglang_threshold", threshold_single=bad)


# -- Medusa's typical acceptance -------------------------------------------------------------------
def medusa_reference(tree, epsilon, alpha):
    """``evaluate_posterior`` (typical, fast) transcribed: the candidates are the root-to-leaf
    paths in ``retrieve_indices`` order, ``generate_medusa_buffers`` walking the choices sorted by
    (length, ranks) from the end, so in decreasing (length, ranks); the first best one wins
    (``torch.argmax``); returns the accepted path."""
    rank = {(): ()}
    for path in tree.nodes():
        for r, t in enumerate(dict.fromkeys(tree.child_list(path))):
            rank[path + (t,)] = rank[path] + (r,)
    leaves = sorted(
        (path for path in tree.nodes() if not tree.child_list(path)), key=lambda leaf: (len(leaf), rank[leaf]), reverse=True
    )
    best_length, best_likelihood, best = 0, -math.inf, ()
    for leaf in leaves:
        length, likelihood = 0, 0.0
        for i, token in enumerate(leaf):
            p = tree.table.p(leaf[:i])
            entropy = -float(np.sum(p * np.log(p + 1e-5)))
            if not p[token] > min(epsilon, alpha * math.exp(-entropy)):
                break
            length, likelihood = length + 1, likelihood + math.log(p[token])
        if length > best_length or (length == best_length and length > 0 and likelihood > best_likelihood):
            best_length, best_likelihood, best = length, likelihood, leaf[:length]
    return best


TIE_WORLD = ContextFreePair([0.3, 0.6, 0.1], [0.6, 0.3, 0.1])  # q ranks 0 first, p prefers 1
OFFSET_WORLD = ContextFreePair([0.5, 0.5], [0.5, 0.5])  # p(x) = 0.5 sits between the two entropies' thresholds
WORLDS = {"markov": (PAIR, (1,)), "ties": (TIE_WORLD, ()), "offset": (OFFSET_WORLD, ())}
TYPICAL_KNOBS = [(0.09, 0.3), (0.05, 0.2), (0.3, 0.09), (1.0, 0.99999), (0.0, 0.3), (1.0, 1e9)]


def _trees(world):
    pair, context = WORLDS[world]
    table = NodeTable(pair, context)
    out = [tree for shape in (TOP2, Static([(0,), (1,), (0, 0), (0, 1), (1, 0)], "topk")) for tree, _ in shape.enumerate(table)]
    return out + [tree for tree, _ in iid(2, 2).enumerate(table)][:12]


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize("epsilon, alpha", TYPICAL_KNOBS)
def test_typical_path_equals_evaluate_posterior(world, epsilon, alpha):
    v = tree_verifiers.get("typical", allow_lossy=True, posterior_threshold=epsilon, posterior_alpha=alpha)
    for tree in _trees(world):
        path = medusa_reference(tree, epsilon, alpha)
        assert v.accepted_path(tree) == path
        law = v.outcome_law(tree)
        p = tree.table.p(path)
        assert list(law) == [path] and law[path][int(np.argmax(p))] == 1.0


def test_typical_likelihood_tie_goes_to_medusas_first_candidate():
    """p = (.5, .5): both children of the root pass with the same likelihood.  Medusa's candidates
    run in decreasing (length, ranks) (``sorted_medusa_choices[-i-1]``), so ``torch.argmax`` takes
    the leaf of the highest rank: (1,) on the one-level tree, (1, 0) on TOP2 (the tie at depth 2)."""
    table = NodeTable(OFFSET_WORLD, ())
    v = tree_verifiers.get("typical", allow_lossy=True, posterior_threshold=0.3, posterior_alpha=1.0)
    one_level = next(iter(Static([(0,), (1,)], "topk").enumerate(table)))[0]
    assert v.accepted_path(one_level) == (1,)
    assert v.accepted_path(next(iter(TOP2.enumerate(table)))[0]) == (1, 0)


def test_typical_is_exact_on_a_greedy_target():
    """T = 0 (one-hot target rows, a sampled draft): the typical rule is the greedy rule, bias 0."""
    rng = np.random.default_rng(8)
    target = np.array([sampling_distribution(r, temperature=0) for r in rng.standard_normal((4, 4))])
    greedy = MarkovPair(target, rng.dirichlet(np.ones(4), size=4))
    for next_token in ("argmax", "target"):
        v = tree_verifiers.get("typical", allow_lossy=True, next_token=next_token)
        for shape in (chain(3), TOP2, iid(2, 2)):
            assert pairing_bias(greedy, (0,), shape, v, n=2) <= EXACT


@pytest.mark.parametrize("shape", list(SHAPES))
def test_typical_bias_is_zero_where_exact_and_positive_where_lossy(shape):
    """Exact: next_token="target" with a threshold no child can pass (plain sampling; the greedy
    target: the test above).  Lossy: the defaults and the sweep's knobs at T > 0."""
    never = tree_verifiers.get("typical", allow_lossy=True, next_token="target", posterior_threshold=1.0, posterior_alpha=1e9)
    assert pairing_bias(PAIR, (1,), SHAPES[shape], never, n=2) <= EXACT
    assert expected_block_efficiency(PAIR, (1,), SHAPES[shape], never, allow_lossy=True).mean == 1.0
    for (epsilon, alpha), next_token in zip(TYPICAL_KNOBS[:2], ("argmax", "target")):
        v = tree_verifiers.get(
            "typical", allow_lossy=True, posterior_threshold=epsilon, posterior_alpha=alpha, next_token=next_token
        )
        assert pairing_bias(PAIR, (1,), SHAPES[shape], v, n=2) > 1e-3, (epsilon, alpha, next_token)


def test_typical_sampler():
    """``verify`` draws from ``outcome_law``: the argmax next token deterministically, the "target"
    one by a designed G-test over the next token at the accepted path."""
    table = NodeTable(PAIR, (1,))
    tree = next(iter(TOP2.enumerate(table)))[0]
    argmax = tree_verifiers.get("typical", allow_lossy=True)
    rng = np.random.default_rng(4)
    ((path, vector),) = argmax.outcome_law(tree).items()
    assert all(argmax.verify(tree, rng) == (path, int(np.argmax(vector))) for _ in range(50))
    sampled = tree_verifiers.get("typical", allow_lossy=True, next_token="target", posterior_threshold=0.3)
    ((path, vector),) = sampled.outcome_law(tree).items()

    def draw(rng):
        got, token = sampled.verify(tree, rng)
        assert got == path
        return token

    assert_sampler_matches(draw, vector, seed=31)


def test_typical_refusals():
    with pytest.raises(ValueError, match="^verifier: typical is not lossless on any tree"):
        expected_block_efficiency(PAIR, (1,), chain(1), "typical")
    with pytest.raises(ValueError, match="^verifier: typical is not lossless"):  # the root alone: its next token is the argmax
        tree_verifiers.get("typical").outcome_law(DraftTree(NodeTable(PAIR, (1,)), {}))
    for options, name in (
        ({"posterior_threshold": -1.0}, "posterior_threshold"),
        ({"posterior_alpha": math.inf}, "posterior_alpha"),
    ):
        with pytest.raises(ValueError, match=f"^{name}"):
            tree_verifiers.get("typical", **options)
    with pytest.raises(ValueError, match="^next_token"):
        tree_verifiers.get("typical", next_token="sample")
    with pytest.raises(ValueError, match="^options: typical takes only"):
        tree_verifiers.get("typical", top_p=0.8)
    with pytest.raises(ValueError, match="^options: traversal takes no options"):
        tree_verifiers.get("traversal", posterior_alpha=0.3)


# -- planted faults ------------------------------------------------------------------------------
def _node_checks(v):
    """The checks above, at node level, for a mutant of one of the node rules."""
    if isinstance(v, ExactMatch):
        for p, q in _random_pairs():
            for law in _laws((p, q), 2):
                plan = v.prepare(p, q, 2, law)
                assert abs(plan.acceptance_rate("formula") - plan.acceptance_rate("enumerate")) <= EXACT, law
        return
    p, q = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25]), np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
    for children in ([1, 0, 3], [0, 3, 2]):  # the single threshold fires at child 1 (p = 0.3); [0, 3, 2] is rejected w.p. 0.6
        law = v.output_distribution(p, q, children)
        assert np.abs(law - sglang_reference(p, children, v.threshold_single, v.threshold_acc)).max() <= EXACT, "law"
    plan = v.prepare(p, q, len(children))
    assert_sampler_matches(lambda rng: plan.sample(children, rng), law, seed=32)


def _correct(mutant):
    return type(mutant).__mro__[1](**{f.name: getattr(mutant, f.name) for f in dataclasses.fields(mutant)})


def test_the_correct_rules_pass_the_checks_that_catch_their_mutants():
    """One run per distinct correct rule (the SGLang mutants share their thresholds)."""
    for correct in {_correct(m) for m in NODE_MUTANTS.values()}:
        _node_checks(correct)
    for mutant in TREE_MUTANTS.values():
        _tree_checks(_correct(mutant))


@pytest.mark.parametrize("fault", list(NODE_MUTANTS))
def test_node_planted_fault_is_caught(fault):
    with pytest.raises(AssertionError):
        _node_checks(NODE_MUTANTS[fault])


def _tree_checks(v):
    for world in WORLDS:
        for tree in _trees(world):
            path = medusa_reference(tree, v.posterior_threshold, v.posterior_alpha)
            law = v.outcome_law(tree)
            assert list(law) == [path], "accepted path"
            assert law[path][int(np.argmax(tree.table.p(path)))] == 1.0, "next token"


@pytest.mark.parametrize("fault", list(TREE_MUTANTS))
def test_tree_planted_fault_is_caught(fault):
    with pytest.raises(AssertionError):
        _tree_checks(TREE_MUTANTS[fault])
