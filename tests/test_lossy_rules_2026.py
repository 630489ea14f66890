"""Fast-HSD's lossy rules (issue 42 item 4): lenience, CoS, SpecCascade and eta acceptance on its
speculative-decoding path, lenience, min-p and eta acceptance on its EAGLE-3 path, each a node
verifier declared lossy, and the truncation samplers the min-p and eta rules imitate.

Exact evidence: each rule's law against a written-out transcription of the official branch
(ZhouYuxuanYX/Fast-HSD@66ef1dc ``_speculative_sampling``, Fast-HSD@6750413
``evaluate_posterior``), integrated over its coins, by enumeration on small worlds; each marginal
against its closed form (lenience: the paper's Eq. 7 as ``fast_hsd/core/collaborative_verification.py``
writes it; CoS: the mixture r; SpecCascade and eta acceptance: q on the allowed set plus the
rejected mass times p); the truncation samplers' laws
against Hugging Face transformers' own warpers; the exact 2-token bias (``pairing_bias``) zero
where the knob makes a rule exact and positive on the stated world elsewhere.  Statistical
evidence: the samplers by designed G-tests (``stats.py``).  Planted faults:
``lossy_mutants.FAST_HSD_MUTANTS``, each caught here.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from lossy_mutants import FAST_HSD_MUTANTS
from simlab import tree_verifiers, verifiers
from simlab.builders import Static, chain, iid
from simlab.efficiency import expected_block_efficiency, pairing_bias
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.verifiers.cos import CoS
from simlab.verifiers.eagle_eta import EagleEta
from simlab.verifiers.eagle_lenience import EagleLenience
from simlab.verifiers.eagle_min_p import EagleMinP
from simlab.verifiers.eta_acceptance import EtaAcceptance, eta_law
from simlab.verifiers.lenience import Lenience
from simlab.verifiers.speccascade import SpecCascade, min_p_law
from stats import assert_sampler_matches
from variants import EDGE_CASES, edge_case

EXACT = 1e-12
PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)
NODE = (np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.2, 0.3, 0.4]))
"""The stated node world: TV(p, q) = 0.5."""
TIE = (np.array([0.4, 0.2, 0.2, 0.2]), np.array([0.1, 0.6, 0.1, 0.2]))
"""p(x) = 0.5 max p exactly at three tokens (SpecCascade's >= at min_p_spd = 0.5)."""
KNOBS = {
    "lenience": [{"lenience": v} for v in (0.2, 0.5, 0.8, 1.0)],
    "cos": [{"cos_lambda": v} for v in (0.0, 0.3, 0.8, 1.0)],
    "speccascade": [{"min_p_spd": v} for v in (0.0, 0.1, 0.5, 0.9, 1.0)],
    "eta_acceptance": [{"eta_spd": v} for v in (0.0, 0.05, 0.2, 0.5)],
    "eagle_lenience": [{"lenience": v} for v in (0.2, 0.5, 1.0)],
    "eagle_min_p": [{"min_p": v} for v in (0.0, 0.3, 0.5, 1.0)],
    "eagle_eta": [{"eta": v} for v in (0.0, 0.05, 0.2, 0.5)],
}


def _pairs():
    rng = np.random.default_rng(11)
    out = [NODE, TIE] + [edge_case(c) for c in EDGE_CASES]
    for _ in range(5):
        p, q = rng.dirichlet(np.full(5, 0.6)), rng.dirichlet(np.full(5, 0.6))
        p[rng.integers(5)] = 0.0
        out.append((p / p.sum(), q))
    return out


# -- written-out transcriptions of Fast-HSD@66ef1dc _speculative_sampling, one drafted token ------
def lenience_reference(p, q, x, lenience):
    """Branch ``lenience < 1``: q_i = q[x] * lenience, accept iff r <= p_i / q_i; on rejection
    p_prime = clamp(p - q, min=0), normalised."""
    accept = min(1.0, p[x] / (q[x] * lenience))
    return _with_correction(accept, np.clip(p - q, 0.0, None), x)


def _with_correction(accept, p_prime, x):
    """accept delta_x + (1 - accept) p_prime / sum(p_prime).  Where p_prime has no mass (p and q
    equal to rounding) the official ``div_`` gives NaN; a rejection there has probability below
    1e-15 in floating point and none in exact arithmetic, so the transcription leaves it out."""
    out = np.zeros_like(p_prime)
    if accept < 1.0 and p_prime.sum() > 0.0:
        out += (1.0 - accept) * p_prime / p_prime.sum()
    out[x] += accept
    return out


def cos_reference(p, q, x, cos_lambda):
    """Branch ``cos_lambda is not None``: r = cos_lambda * q + (1 - cos_lambda) * p, accept iff
    u <= r_i / q_i; on rejection p_prime = clamp(r - q, min=0), normalised."""
    r = cos_lambda * q + (1 - cos_lambda) * p
    return _with_correction(min(1.0, r[x] / q[x]), np.clip(r - q, 0.0, None), x)


def speccascade_reference(p, x, min_p_spd):
    """Branch ``min_p_spd is not None``: accepted iff p_i >= p_max * min_p_spd; the next token is
    drawn from p_n_plus_1 (the target row) whenever min_p_spd is set."""
    out = p.copy() if not p[x] >= p.max() * min_p_spd else np.eye(p.size)[x]
    return out


def eta_reference(p, x, eta_spd):
    """Branch ``eta_spd is not None``: entropy of the target row, threshold = min(eta_spd,
    sqrt(eta_spd) * exp(-entropy)), accepted iff p_i >= threshold; the next token from p."""
    positive = p[p > 0]
    threshold = min(eta_spd, math.sqrt(eta_spd) * math.exp(float(np.sum(positive * np.log(positive)))))
    return np.eye(p.size)[x] if p[x] >= threshold else p.copy()


def reference(v, p, q, x):
    if isinstance(v, Lenience):
        return lenience_reference(p, q, x, v.lenience)
    if isinstance(v, CoS):
        return cos_reference(p, q, x, v.cos_lambda)
    if isinstance(v, SpecCascade):
        return speccascade_reference(p, x, v.min_p_spd)
    return eta_reference(p, x, v.eta_spd)


EAGLE = (EagleLenience, EagleMinP, EagleEta)


def eagle_acceptance(v, gtp, xi):
    """``acp`` of ``evaluate_posterior``'s three branches, transcribed (gtp: the renormalised residual)."""
    px = gtp[xi]
    if isinstance(v, EagleMinP):
        return 1.0 if float(px) >= float(gtp.max()) * v.min_p else 0.0
    if isinstance(v, EagleEta):
        h = np.clip(gtp, 1e-10, None)
        entropy = -(h * np.log(h)).sum()
        threshold = float(min(v.eta, math.sqrt(v.eta) * math.exp(-entropy)))
        return min(float(px) / threshold, 1.0) if threshold > 1e-9 else 1.0
    return min(float(px) / v.lenience, 1.0)


def eagle_reference(v, p, children):
    """``evaluate_posterior`` at one level, integrated over its coins: the candidates in order, a
    repeated one skipped; on rejection gtp[xi] = 0, renormalised while s > 1e-9 (adjustflag), else
    the loop stops; the next token from gtp when adjustflag, from the target row otherwise."""
    out, gtp, reach, seen = np.zeros_like(p), p.copy(), 1.0, []
    adjust = False
    for xi in children:
        if xi in seen:
            continue
        seen.append(xi)
        acp = eagle_acceptance(v, gtp, xi)
        out[xi] += reach * acp
        reach *= 1.0 - acp
        gtp = gtp.copy()
        gtp[xi] = 0
        s = gtp.sum()
        if s > 1e-9:
            gtp = gtp / s
            adjust = True
        else:
            adjust = False
            break
    return out + reach * (gtp if adjust else p)


CHILD_LISTS = ([0], [1, 0], [2, 0, 1], [3, 2], [0, 3, 2, 1], [2, 2, 3], [4, 1])


def _check_eagle_laws(v, pairs):
    for p, q in pairs:
        for children in CHILD_LISTS:
            if max(children) >= p.size or (q[children] == 0).any():
                continue
            law = v.output_distribution(p, q, children)
            assert abs(law.sum() - 1.0) <= EXACT and law.min() >= 0.0
            assert np.abs(law - eagle_reference(v, p, children)).max() <= EXACT, ("law", v, p, children)


def _check_laws(v, pairs):
    """B(x, .) against the transcription for every drafted x (q(x) > 0), alone and as the first of
    two children (the later children are not tested: the chain rule on the first child); for the
    EAGLE-3 rules, B(children, .) for several ordered child lists."""
    if isinstance(v, EAGLE):
        return _check_eagle_laws(v, pairs)
    for p, q in pairs:
        for x in np.flatnonzero(q > 0):
            law = v.output_distribution(p, q, [x])
            assert abs(law.sum() - 1.0) <= EXACT and law.min() >= 0.0
            assert np.abs(law - reference(v, p, q, x)).max() <= EXACT, ("law", v, p, q, x)
            y = int(np.flatnonzero(q > 0)[-1])
            assert np.abs(v.output_distribution(p, q, [x, y]) - law).max() == 0.0, "first child"


@pytest.mark.parametrize("name", list(KNOBS))
def test_law_equals_the_official_branch_by_enumeration(name):
    for options in KNOBS[name]:
        _check_laws(verifiers.get(name, **options), _pairs())


def test_marginals_have_their_closed_forms():
    """sum_x q(x) B(x, .) at k = 1: the paper's Eq. 7 for lenience (Fast-HSD's
    ``lenience_yield_distribution``, transcribed), r for CoS, q 1_A + q(A^c) p for the truncation
    rules; and the written-out values on the stated node world."""
    for p, q in _pairs():
        if not (q > 0).all() or np.abs(p - q).sum() == 0.0:
            continue
        for ell in (0.2, 0.5, 0.8):
            tv = 0.5 * np.abs(q - p).sum()
            delta = (0.5 * np.abs(q - p / ell).sum() + 0.5 - 0.5 / ell) / tv
            eq7 = np.where(q <= p, delta * p + (1 - delta) * q, np.where(q >= p / ell, p / ell, q))
            got = verifiers.get("lenience", lenience=ell).prepare(p, q, 1).marginal_output_distribution()
            assert np.abs(got - eq7).max() <= 1e-12, (p, q, ell)
        for lam in (0.0, 0.3, 1.0):
            got = verifiers.get("cos", cos_lambda=lam).prepare(p, q, 1).marginal_output_distribution()
            assert np.abs(got - (lam * q + (1 - lam) * p)).max() <= 1e-12
        for v in (SpecCascade(min_p_spd=0.5), EtaAcceptance(eta_spd=0.2)):
            allowed = v.allowed(p)
            expected = np.where(allowed, q, 0.0) + q[~allowed].sum() * p
            assert np.abs(v.prepare(p, q, 1).marginal_output_distribution() - expected).max() <= 1e-12
    p, q = NODE
    written = {
        Lenience(lenience=0.5): [0.34, 0.26, 0.30, 0.10],
        CoS(cos_lambda=0.4): [0.34, 0.26, 0.21, 0.19],
        SpecCascade(min_p_spd=0.5): [0.45, 0.41, 0.105, 0.035],
        EtaAcceptance(eta_spd=0.2): [0.30, 0.32, 0.36, 0.02],
    }
    for v, law in written.items():
        assert np.abs(v.prepare(p, q, 1).marginal_output_distribution() - law).max() <= 1e-12, v


def test_cos_is_diverse_at_one_minus_lambda():
    """The shipped CoS weighs q by lambda: its law is DIVERSE's (``simlab.verifiers.diverse``) at
    w = 1 - lambda, child by child."""
    for p, q in _pairs():
        for lam in (0.0, 0.2, 0.6, 0.9):
            for x in np.flatnonzero(q > 0):
                cos = verifiers.get("cos", cos_lambda=lam).output_distribution(p, q, [x])
                diverse = verifiers.get("diverse", weight=1.0 - lam).output_distribution(p, q, [x])
                assert np.abs(cos - diverse).max() <= 1e-12


def test_truncation_sampler_laws_equal_the_transformers_warpers():
    """``min_p_law`` and ``eta_law`` against transformers' ``MinPLogitsWarper`` and
    ``EtaLogitsWarper`` (what Fast-HSD's min_p / eta_cutoff baselines apply), run on log p (float32)."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import EtaLogitsWarper, MinPLogitsWarper

    rng = np.random.default_rng(5)
    for _ in range(6):
        p = rng.dirichlet(np.full(8, 0.5))
        scores = torch.tensor(np.log(p), dtype=torch.float32)[None]
        for c in (0.1, 0.3, 0.5, 0.9):
            kept = MinPLogitsWarper(min_p=c)(None, scores.clone()).softmax(-1)[0].double().numpy()
            assert np.abs(min_p_law(p, c) - kept).max() <= 1e-6, c
        for eta in (0.05, 0.2, 0.5):
            kept = EtaLogitsWarper(epsilon=eta)(None, scores.clone()).softmax(-1)[0].double().numpy()
            assert np.abs(eta_law(p, eta) - kept).max() <= 1e-6, eta


def test_tv_to_the_truncation_sampler_on_the_node_world():
    """The rules' one-token law against the sampler each imitates, on NODE: SpecCascade at 0.5 keeps
    {0, 1} (min-p law (5/8, 3/8, 0, 0)), eta acceptance at 0.2 keeps {0, 1, 2} (tau = sqrt(0.2) e^-H)."""
    p, q = NODE
    assert np.abs(min_p_law(p, 0.5) - [0.625, 0.375, 0.0, 0.0]).max() <= EXACT
    assert np.abs(eta_law(p, 0.2) - np.array([0.5, 0.3, 0.15, 0.0]) / 0.95).max() <= EXACT
    for v, sampler in ((SpecCascade(min_p_spd=0.5), min_p_law(p, 0.5)), (EtaAcceptance(eta_spd=0.2), eta_law(p, 0.2))):
        law = v.prepare(p, q, 1).marginal_output_distribution()
        assert np.abs(v.sampler_law(p) - sampler).max() == 0.0
        assert 0.5 * np.abs(law - sampler).sum() > 0.1  # the rule's yield is q-shaped on A, not the sampler's


SHAPES = {"chain(2)": chain(2), "iid(2,2)": iid(2, 2)}
EXACT_KNOBS = {"lenience": {"lenience": 1.0}, "cos": {"cos_lambda": 0.0}}
LOSSY_KNOBS = {
    "lenience": {"lenience": 0.5},
    "cos": {"cos_lambda": 0.4},
    "speccascade": {"min_p_spd": 0.5},
    "eta_acceptance": {"eta_spd": 0.2},
}
TOP2 = Static([(0,), (1,), (0, 0), (1, 0)], "topk")
EAGLE_LOSSY = {"eagle_lenience": {"lenience": 0.5}, "eagle_min_p": {"min_p": 0.5}, "eagle_eta": {"eta": 0.2}}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(LOSSY_KNOBS))
def test_bias_is_zero_where_exact_and_positive_where_lossy(name, shape):
    """Stated world: PAIR (MarkovPair.random(3, seed 7, 0.7, 0.3)) from context (1,), 2 tokens.
    Exact: lenience 1 and CoS 0 (speculative sampling on the first child, which i.i.d. children
    leave lossless), SpecCascade and eta acceptance at 0 where p = q.  Lossy: the middle knobs."""
    lossy = tree_verifiers.get(name, allow_lossy=True, **LOSSY_KNOBS[name])
    assert pairing_bias(PAIR, (1,), SHAPES[shape], lossy, n=2) > 1e-3
    if name in EXACT_KNOBS:
        exact = tree_verifiers.get(name, allow_lossy=True, **EXACT_KNOBS[name])
        assert pairing_bias(PAIR, (1,), SHAPES[shape], exact, n=2) <= EXACT
    else:
        same = ContextFreePair([0.5, 0.3, 0.2], [0.5, 0.3, 0.2])
        assert pairing_bias(same, (), SHAPES[shape], tree_verifiers.get(name, allow_lossy=True), n=2) <= EXACT


@pytest.mark.parametrize("name", list(LOSSY_KNOBS))
def test_refused_without_allow_lossy(name):
    with pytest.raises(ValueError, match=f"^verifier: {name} is not lossless .*declared lossy"):
        expected_block_efficiency(PAIR, (1,), chain(2), name)
    lossy = tree_verifiers.get(name, allow_lossy=True, **LOSSY_KNOBS[name])
    assert 1.0 < expected_block_efficiency(PAIR, (1,), chain(2), lossy, allow_lossy=True).mean < 3.0


def test_option_refusals():
    for name, option, bad in (
        ("lenience", "lenience", [0.0, -0.1, 1.5, float("nan"), True, "1"]),
        ("cos", "cos_lambda", [-0.1, 1.5, float("nan"), True, "1"]),
        ("speccascade", "min_p_spd", [-0.1, 1.5, float("nan"), True, "1"]),
        ("eta_acceptance", "eta_spd", [-0.1, 1.0, float("nan"), True, "1"]),
        ("eagle_lenience", "lenience", [0.0, 1.5, float("nan"), True]),
        ("eagle_min_p", "min_p", [-0.1, 1.5, float("nan"), True]),
        ("eagle_eta", "eta", [-0.1, 1.0, float("nan"), True]),
    ):
        for value in bad:
            with pytest.raises(ValueError, match=f"^{option}: must lie in"):
                verifiers.get(name, **{option: value})
    with pytest.raises(ValueError, match="^allowed: keeps no mass"):
        from simlab.verifiers.speccascade import truncated_law

        truncated_law([0.5, 0.5, 0.0], np.array([False, False, True]))


def _sampler_check(v, seed):
    """The sampler against the law at a drafted child that the rule may reject (the correction path)."""
    p, q = NODE
    for x in (2, 3):
        law = v.output_distribution(p, q, [x])
        if law[x] < 1.0:
            plan = v.prepare(p, q, 1)
            assert_sampler_matches(lambda rng: plan.sample([x], rng), law, seed=seed)
            return
    raise AssertionError("no rejecting child on NODE")


@pytest.mark.parametrize("name", list(LOSSY_KNOBS))
def test_sampler_matches_the_law(name):
    _sampler_check(verifiers.get(name, **LOSSY_KNOBS[name]), seed=41)


@pytest.mark.parametrize("name", list(EAGLE_LOSSY))
def test_eagle_rules_bias_on_the_top_k_tree(name):
    """Stated world: PAIR from (1,), the top-k tree TOP2, 2 tokens: lenience 0.5, min-p 0.5 and eta
    0.2 lossy; EAGLE lenience 1 is the one-hot rule (bias 0), its law p at every child list."""
    lossy = tree_verifiers.get(name, allow_lossy=True, **EAGLE_LOSSY[name])
    assert pairing_bias(PAIR, (1,), TOP2, lossy, n=2) > 1e-3
    with pytest.raises(ValueError, match=f"^verifier: {name} is not lossless .*declared lossy"):
        expected_block_efficiency(PAIR, (1,), TOP2, name)
    exact = tree_verifiers.get("eagle_lenience", allow_lossy=True, lenience=1.0)
    assert pairing_bias(PAIR, (1,), TOP2, exact, n=2) <= EXACT
    for p, q in _pairs():
        for children in CHILD_LISTS:
            if max(children) < p.size and (q[children] > 0).all():
                law = verifiers.get("eagle_lenience").output_distribution(p, q, children)
                assert np.abs(law - verifiers.get("onehot").output_distribution(p, q, children)).max() <= 1e-12


def test_eagle_min_p_written_out():
    """NODE's p, min_p = 0.5: [2, 1] rejects 2 (0.15 < 0.25), accepts 1 (0.3 / 0.85 >= 0.25 / 0.85);
    [3, 2] rejects both, the correction is p without them: (0.625, 0.375, 0, 0)."""
    p, q = NODE
    v = EagleMinP(min_p=0.5)
    assert np.abs(v.output_distribution(p, q, [2, 1]) - [0.0, 1.0, 0.0, 0.0]).max() <= EXACT
    assert np.abs(v.output_distribution(p, q, [3, 2]) - [0.625, 0.375, 0.0, 0.0]).max() <= EXACT


@pytest.mark.parametrize("name", list(EAGLE_LOSSY))
def test_eagle_sampler_matches_the_law(name):
    p, q = NODE
    plan = verifiers.get(name, **EAGLE_LOSSY[name]).prepare(p, q, 3)
    assert_sampler_matches(lambda rng: plan.sample([3, 2, 1], rng), plan.output_distribution([3, 2, 1]), seed=43)


# -- planted faults ------------------------------------------------------------------------------
def _correct(mutant):
    return type(mutant).__mro__[1](**{f.name: getattr(mutant, f.name) for f in dataclasses.fields(mutant)})


def test_the_correct_rules_pass_the_checks_that_catch_their_mutants():
    for mutant in FAST_HSD_MUTANTS.values():
        _check_laws(_correct(mutant), _pairs())


@pytest.mark.parametrize("fault", list(FAST_HSD_MUTANTS))
def test_fast_hsd_planted_fault_is_caught(fault):
    with pytest.raises(AssertionError):
        _check_laws(FAST_HSD_MUTANTS[fault], _pairs())


# -- the study: analyses.lossy_rules --rules --------------------------------------------------------
def test_study_adds_the_rules_on_the_trees_of_their_law(tmp_path):
    """``--rules``: each added rule runs on the trees of its drafting law (drafted-child rules on the
    i.i.d. tree and the chain, the EAGLE-3 rules on the top-k tree), with exact E, gain and TV, and
    TV_sampler for the rules that imitate a truncation sampler; V = 3, one knob each."""
    import polars as pl

    from analyses import lossy_rules

    flags = ["--vocab", "3", "--tokens", "2", "--epsilons", "1", "--alphas", "1e9", "--singles", "1", "--accs", "1"]
    rules = ["--rules", "lenience,speccascade,eagle_min_p", "--leniences", "0.5", "--min-ps", "0.5"]
    assert lossy_rules.main([*flags, *rules, "--out", str(tmp_path), "--quiet"]) == 0
    table = pl.read_parquet(tmp_path / "lossy_rules.parquet")
    trees = {rule: set(table.filter(pl.col("rule") == rule)["tree"]) for rule in table["rule"].unique()}
    assert trees["lenience (Fast-HSD)"] == {"i.i.d. tree (2 x 2)", lossy_rules.CHAIN}
    assert trees["SpecCascade min-p (Fast-HSD)"] == {"i.i.d. tree (2 x 2)", lossy_rules.CHAIN}
    assert trees["SpecCascade min-p, EAGLE-3 path (Fast-HSD)"] == {lossy_rules.TOP_K}
    new = table.filter(pl.col("rule").str.contains("Fast-HSD"))
    assert (new["TV"] > 1e-3).all() and (new["gain"] > 1.0).all()
    sampled = new.filter(pl.col("rule").str.contains("min-p"))
    assert sampled["TV_sampler"].is_not_null().all() and sampled["TV_sampler_target"].is_not_null().all()
    assert new.filter(pl.col("rule") == "lenience (Fast-HSD)")["TV_sampler"].is_null().all()


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--rules", "bogus"], "--rules"),
        (["--rules", "lenience", "--leniences", "0"], "--leniences"),
        (["--rules", "eta_acceptance", "--etas", "1"], "--etas"),
        (["--etas", "0.1"], "--etas"),
        (["--rules", "lenience", "--weights", "0.5"], "--weights"),
    ],
)
def test_study_refuses_bad_rule_flags_in_one_line(flags, flag, tmp_path, capsys):
    """An unknown rule, a knob outside the rule's range, or a grid given without a rule that reads
    it: exit 2, one line naming the flag, nothing written."""
    from analyses import lossy_rules
    from conftest import one_error_line

    with pytest.raises(SystemExit) as exc:
        lossy_rules.parse_args([*flags, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and one_error_line(err) and f"{flag}: " in err, err
    assert not (tmp_path / "out").exists()
