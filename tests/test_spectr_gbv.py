"""SpecTr-GBV as released (simlab.spectr_gbv): the exact law against a written-out brute force of the
official loops (junemily/SpecTr-GBV@e399f44 src/engine.py::speculative_decoding), its declared
lossiness confirmed by enumeration, the K = 1 case (the code's "gbv") against Block Verification,
and planted mutants of the scan caught."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from simlab.builders import chain
from simlab.efficiency import expected_block_efficiency
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.spectr_gbv import SpecTrGBV, block_bias, emitted_law, prefix_bound, sequence_bias, official_gbv

EPS = 1e-20


def markov(seed: int, vocab: int = 2, closeness: float = 0.5) -> MarkovPair:
    return MarkovPair.random(vocab, np.random.default_rng(seed), closeness=closeness)


# -- a plain transcription of the official round, every draw enumerated ---------------------------
def rows(pair, context, prefix):
    p, q = pair.distributions([tuple(context) + tuple(prefix)])
    return p[0], q[0]


def masses(pair, context, prefix):
    m_s = m_b = 1.0
    for i, t in enumerate(prefix):
        p, q = rows(pair, context, prefix[:i])
        m_s, m_b = m_s * q[t], m_b * p[t]
    return m_s, m_b


def alpha_ref(pair, context, prefix, k):
    m_s, m_b = masses(pair, context, prefix)
    p, q = rows(pair, context, prefix)
    e = lambda z: (1.0 - z) ** k  # noqa: E731
    ratio = np.minimum(m_s * q / (m_b * p + EPS), 1.0)
    raw = min(m_s / (m_b + EPS), 1.0)
    num = np.sum(m_b * p * e(ratio)) - m_b * e(raw)
    den = 1.0 - e(m_s) - np.sum(m_b * p * (1.0 - e(ratio)))
    return num / (den + EPS)


def beta_ref(pair, context, block, k):
    m_s, m_b = masses(pair, context, block)
    ratio = min(m_s / (m_b + EPS), 1.0)
    return m_b * (1.0 - (1.0 - ratio) ** k) / (1.0 - (1.0 - m_s) ** k + EPS)


def next_law_ref(pair, context, accepted, whole, k, residual="official"):
    p, q = rows(pair, context, accepted)
    if whole:
        return p
    m_s, m_b = masses(pair, context, accepted)
    ratio = np.minimum(m_s * q / (m_b * p + EPS), 1.0)
    r = m_b * p * (1.0 - ratio**k if residual == "official" else 1.0 - (1.0 - (1.0 - ratio) ** k))
    return r / r.sum()


def brute_force(pair, context, k, gamma, skip=True, scan="forward", restart=False, residual="official"):
    """{emitted tokens: probability}: every K-tuple of blocks and every accept/reject outcome of
    every check, the official loops written out (mutant switches: ``skip`` the rejected-prefix
    skip, ``scan`` the prefix order in a block, ``restart`` each block's scan from length 1,
    ``residual`` the power on 1 - min as in the acceptances)."""
    vocab = pair.vocab_size
    blocks = [
        (x, np.prod([rows(pair, context, x[:i])[1][x[i]] for i in range(gamma)]))
        for x in itertools.product(range(vocab), repeat=gamma)
    ]
    blocks = [(x, w) for x, w in blocks if w > 0]
    memo = {}

    def a(u):
        if u not in memo:
            memo[u] = min(1.0, max(0.0, alpha_ref(pair, context, u, k) if len(u) < gamma else beta_ref(pair, context, u, k)))
        return memo[u]

    out = {}

    def run(combo, j, accepted, seen, prob):
        if j == k:
            finish(accepted, False, prob)
            return
        x = combo[j]
        lengths = list(range(1 if restart else len(accepted) + 1, gamma))
        if scan == "backward":
            lengths = lengths[::-1]

        def step(i, accepted, seen, prob):
            if i == len(lengths):
                b = a(x)
                if b > 0:
                    finish(x, True, prob * b)
                if b < 1:
                    run(combo, j + 1, accepted, seen, prob * (1 - b))
                return
            key = x[: lengths[i]]
            if skip and key in seen:
                step(i + 1, accepted, seen, prob)
                return
            v = a(key)
            if v > 0:
                step(i + 1, key, seen, prob * v)
            if v < 1:
                step(i + 1, accepted, seen | {key}, prob * (1 - v))

        step(0, accepted, seen, prob)

    def finish(accepted, whole, prob):
        law = next_law_ref(pair, context, accepted, whole, k, residual)
        for t in range(vocab):
            if law[t] > 0:
                out[accepted + (t,)] = out.get(accepted + (t,), 0.0) + prob * law[t]

    for combo in itertools.product(blocks, repeat=k):
        run([x for x, _ in combo], 0, (), frozenset(), float(np.prod([w for _, w in combo])))
    return out


def tv(a, b):
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


WORLDS = [(markov(1), 2, 3), (markov(2), 3, 2), (markov(3, 3), 2, 2), (markov(4), 1, 4), (markov(5, 3, 0.8), 2, 2)]


@pytest.mark.parametrize("pair, k, gamma", WORLDS)
def test_exact_law_matches_the_written_out_official_round(pair, k, gamma):
    rule = SpecTrGBV(k=k, gamma=gamma, allow_lossy=True)
    law = emitted_law(rule, pair, [0])
    ref = brute_force(pair, [0], k, gamma)
    assert tv(law, ref) < 1e-12
    assert abs(sum(law.values()) - 1.0) < 1e-12


def test_exact_law_at_k_four_against_the_brute_force():
    pair = markov(6)
    rule = SpecTrGBV(k=4, gamma=2, allow_lossy=True)
    assert tv(emitted_law(rule, pair, [1]), brute_force(pair, [1], 4, 2)) < 1e-12


@pytest.mark.parametrize("mutant", [{"skip": False}, {"scan": "backward"}, {"restart": True}, {"residual": "acceptance_form"}])
def test_mutants_of_the_scan_are_caught(mutant):
    pair = markov(1)
    rule = SpecTrGBV(k=3, gamma=3, allow_lossy=True)
    assert tv(emitted_law(rule, pair, [0]), brute_force(pair, [0], 3, 3, **mutant)) > 1e-4


def test_declared_lossy_and_the_enumeration_agrees():
    assert SpecTrGBV.lossless is False
    biases = [block_bias(SpecTrGBV(k=k, gamma=3, allow_lossy=True), markov(seed), [0]) for seed in range(3) for k in (1, 2, 3)]
    assert min(biases) > 1e-3


def test_refused_without_allow_lossy():
    pair = markov(1)
    with pytest.raises(ValueError, match="declared lossy"):
        SpecTrGBV(k=2, gamma=3).outcome_law(pair, [0])
    with pytest.raises(ValueError, match="declared lossy"):
        SpecTrGBV().verify(pair, [0], np.random.default_rng(0))


def test_official_gbv_is_k_one_and_beats_the_lossless_optimum():
    """K = 1 (the code's "gbv") accepts more than Block Verification, the optimum of lossless
    single-draft block verifiers: only a lossy rule can."""
    pair = markov(1)
    rule = official_gbv(3, allow_lossy=True)
    assert rule.k == 1 and rule.official_method == "gbv" and SpecTrGBV().official_method == "spectr-gbv"
    bv = expected_block_efficiency(pair, [0], chain(3), "bv").mean
    value = rule.expected_block_efficiency(pair, [0])
    assert value > bv + 0.1
    assert value == pytest.approx(1.0 + prefix_bound(rule.world(pair, [0]), 1), abs=1e-12)


def test_equal_models_stop_at_an_all_zero_residual():
    """p == q: every prefix's alpha is 0 (its numerator cancels exactly), beta < 1 for K > 1, and
    the residual after no accepted prefix is all zero: the official torch.multinomial raises with
    that probability; the lab counts it and refuses the law."""
    pair = ContextFreePair([0.5, 0.3, 0.2], [0.5, 0.3, 0.2])
    rule = SpecTrGBV(k=2, gamma=2, allow_lossy=True)
    world = rule.world(pair, [])
    assert all(v == 0.0 for u, v in rule.acceptances(world).items() if len(u) < 2)
    stop = 1.0 - sum(w * rule.block_acceptance(w, w) for w in (world.draft_mass[x] for x in world.blocks))
    assert rule.undefined_mass(pair, []) == pytest.approx(stop**2, rel=1e-12)
    with pytest.raises(ValueError, match="all-zero residual"):
        rule.outcome_law(pair, [])


def test_k_one_acceptances_above_one_are_zero_over_zero_and_do_not_move_the_law():
    """At K = 1, alpha = 1 - (M_s - M_b)+ / sum_y (M_s q - M_b p)+ in exact arithmetic: it leaves
    [0, 1] only by rounding where it is 1, or where numerator and denominator are both zero up to
    eps (M_s q <= M_b p for every child): there the law is the same whatever the value."""
    pair = markov(1)
    rule = SpecTrGBV(k=1, gamma=4, allow_lossy=True)
    world = rule.world(pair, [0])
    values = {u: v for u, v in rule.acceptances(world).items() if len(u) < 4}
    degenerate = {u for u in values if np.all(world.draft_mass[u] * world.q[u] <= world.target_mass[u] * world.p[u])}
    outside = [u for u, v in values.items() if not 0.0 <= v <= 1.0]
    assert degenerate & set(outside)
    for u in outside:
        assert world.draft_mass[u] <= world.target_mass[u]
        assert u in degenerate or abs(values[u] - 1.0) < 1e-12
    laws = []
    for fill in (0.0, 1.0):

        @dataclass(frozen=True)
        class Filled(SpecTrGBV):
            def prefix_acceptance(self, m_s, m_b, p_next, q_next):
                if np.all(m_s * q_next <= m_b * p_next):
                    return fill
                return super().prefix_acceptance(m_s, m_b, p_next, q_next)

        laws.append(emitted_law(Filled(k=1, gamma=4, allow_lossy=True), pair, [0]))
    assert tv(laws[0], laws[1]) < 1e-12 and tv(laws[0], emitted_law(rule, pair, [0])) < 1e-12


def test_verify_follows_the_exact_law():
    pair = markov(2)
    rule = SpecTrGBV(k=2, gamma=3, allow_lossy=True)
    law = emitted_law(rule, pair, [0])
    rng = np.random.default_rng(7)
    n = 4000
    counts = {}
    for _ in range(n):
        acc, t = rule.verify(pair, [0], rng)
        counts[acc + (t,)] = counts.get(acc + (t,), 0) + 1
    assert tv({s: c / n for s, c in counts.items()}, law) < 0.06


def test_sequence_bias_of_one_token_is_the_first_token_tv():
    pair = markov(1)
    rule = SpecTrGBV(k=2, gamma=2, allow_lossy=True)
    first = {}
    for s, w in emitted_law(rule, pair, [0]).items():
        first[s[:1]] = first.get(s[:1], 0.0) + w
    p = pair.distributions([(0,)])[0][0]
    assert sequence_bias(rule, pair, [0], 1) == pytest.approx(tv(first, {(t,): p[t] for t in range(2)}), abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, match", [({"k": 0}, "k:"), ({"gamma": 1}, "gamma:"), ({"eps": -1.0}, "eps:"), ({"allow_lossy": 1}, "allow_lossy:")]
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpecTrGBV(**kwargs)


def test_a_pair_with_an_eos_id_is_refused():
    pair = ContextFreePair([0.5, 0.5], [0.5, 0.5], eos_id=1)
    with pytest.raises(ValueError, match="EOS"):
        SpecTrGBV(k=1, gamma=2, allow_lossy=True).outcome_law(pair, [])


def test_study_writes_its_table(tmp_path):
    import polars as pl

    from analyses import spectr_gbv

    flags = ["--seeds", "1", "--closeness", "0.5", "--ks", "1,2", "--gammas", "2", "--quiet", "--out", str(tmp_path)]
    assert spectr_gbv.main(flags) == 0
    table = pl.read_parquet(tmp_path / "spectr_gbv.parquet")
    assert table.height == 2 and table["TV_block"].min() > 1e-3
    assert (table.filter(pl.col("K") == 1)["E_spectr_gbv"] > table.filter(pl.col("K") == 1)["E_bv"]).all()


@pytest.mark.parametrize(
    "flags, message",
    [(["--vocab", "9"], "--vocab"), (["--ks", "0"], "--ks"), (["--gammas", "7"], "--gammas"), (["--seeds", "x"], "--seeds")],
)
def test_study_bad_flags_exit_2_with_one_line(flags, message, capsys, tmp_path):
    from analyses import spectr_gbv

    with pytest.raises(SystemExit) as exit_info:
        spectr_gbv.main(flags + ["--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()
