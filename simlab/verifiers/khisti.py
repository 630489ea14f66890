"""Khisti et al.'s canonical two-step verifier (arXiv 2410.18234; DDTE Sec. 3, App. B-D).

1. **Importance-weighted selection.**  Given the i.i.d. children x, select one of them, Y',
   with probabilities beta(x); this induces the selection law p_I(y) = sum_x Q(x) beta_y(x).
2. **Single-draft speculative sampling** of p against p_I on Y': accept with probability
   min(1, p(Y') / p_I(Y')), else output Y ~ norm((p - p_I)_+).

The scheme is lossless for *any* weights as long as p_I is the exact law of Y', which is
computed here exactly in both modes:

* ``mode="lp"``: the optimal weights, from Khisti's LP over the child multisets
  (maximise sum_y z_y, z_y <= p(y), z_y <= p_I(y), beta(x) on the simplex of set(x));
  its optimum equals the OT optimum alpha*.  Limited to ``KHISTI_LP_MAX_MULTISETS``.
* ``mode="truncated"``: the s-truncated pairwise LP with a tournament for k > 2 (Khisti
  App. I as the DDTE authors ran it).  Round r pairs the current champion (law c, c = q at
  r = 1) with the next child (law q).  The s tokens with the largest p - c q (one linear-time
  selection) get pairwise preferences w[i, j] = P(champion i beats challenger j) from a small
  LP (maximise sum_{t in top} min(p(t), c'(t))); a top token always beats a token outside the
  top; between two tokens outside the top the champion wins (linear time; the DDTE code ranks
  the tail with full sorts instead: ``tail="rank"``).  The champion's next law c' is exact, so
  p_I = the final c.  By default (``tail="guarded"``) the tournament that skips every round that
  would lower sum min(p, c) is used when it ends higher than the one that plays every round: the
  acceptance, at least sum min(p, p_I), never falls below one draft's sum min(p, q) = 1 - TV(p, q);
  with s covering the support at k = 2 the round is the full LP.
* ``mode="auto"`` (default): ``lp`` when the multisets fit, else ``truncated``.

``acceptance_rate`` enumerates the children (limit ``simlab.drafting.MAX_ENUMERATED_TUPLES``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from simlab.checks import check_int
from simlab.distributions import sample_categorical
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw
from simlab.verifiers.speculative import SingleDraft, accept_probabilities

TAILS = ("guarded", "champion", "rank")
KHISTI_LP_MAX_MULTISETS = 2_000
"""Largest number of child multisets for which ``mode="lp"`` solves the full LP."""


def _solve(c, a_ub, b_ub, a_eq, b_eq, bounds, what: str) -> np.ndarray:
    result = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if result.status != 0:
        raise ValueError(f"p, q: the Khisti {what} LP failed: {result.message}")
    return result.x


class _FullLPSelection:
    """Optimal weights beta(m) for every child multiset m (i.i.d. children)."""

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int):
        support = np.flatnonzero(q > 0)
        multisets = list(itertools.combinations_with_replacement(support.tolist(), k))
        entries = []  # (multiset index, token); a multiset's entries are contiguous, from starts[m]
        starts = np.empty(len(multisets) + 1, dtype=np.intp)
        probs = np.empty(len(multisets))
        for m, ms in enumerate(multisets):  # ms is sorted: its distinct tokens in order, with counts
            distinct = dict.fromkeys(ms)
            tokens = np.fromiter(distinct, dtype=np.intp, count=len(distinct))
            counts = np.array([ms.count(t) for t in distinct])
            ways = math.factorial(k) / np.prod([math.factorial(c) for c in counts])
            probs[m] = ways * np.prod(q[tokens] ** counts)
            starts[m] = len(entries)
            entries.extend((m, t) for t in distinct)
        starts[-1] = len(entries)
        m_idx = np.array([e[0] for e in entries])
        t_idx = np.array([e[1] for e in entries])
        n_beta, vocab = len(entries), p.size
        # variables: beta entries, then z (V)
        cost = np.concatenate([np.zeros(n_beta), -np.ones(vocab)])
        a_eq = sp.csr_matrix((np.ones(n_beta), (m_idx, np.arange(n_beta))), shape=(len(multisets), n_beta + vocab))
        a_ub = sp.hstack(
            [
                sp.csr_matrix((-probs[m_idx], (t_idx, np.arange(n_beta))), shape=(vocab, n_beta)),
                sp.identity(vocab, format="csr"),
            ]
        ).tocsr()
        bounds = np.column_stack([np.zeros(n_beta + vocab), np.concatenate([np.ones(n_beta), p])])
        beta = np.maximum(_solve(cost, a_ub, np.zeros(vocab), a_eq, np.ones(len(multisets)), bounds, "full")[:n_beta], 0.0)
        sums = np.bincount(m_idx, weights=beta, minlength=len(multisets))
        beta /= sums[m_idx]
        self.weights = {}
        for m, ms in enumerate(multisets):
            self.weights[ms] = (t_idx[starts[m] : starts[m + 1]], beta[starts[m] : starts[m + 1]])
        self.law = np.bincount(t_idx, weights=probs[m_idx] * beta, minlength=vocab)

    def distribution(self, children: np.ndarray):
        return self.weights[tuple(sorted(children.tolist()))]

    def draw(self, children: np.ndarray, rng: np.random.Generator) -> int:
        tokens, beta = self.distribution(children)
        return int(tokens[sample_categorical(beta, rng)])


def _top_s(p: np.ndarray, c: np.ndarray, q: np.ndarray, s: int) -> np.ndarray:
    """The s tokens with the largest key p - c q (ties: lowest index), in linear time."""
    key = np.multiply(c, q)
    np.subtract(p, key, out=key)
    top = np.empty(s, dtype=np.intp)
    for i in range(s):
        top[i] = int(np.argmax(key))
        key[top[i]] = -np.inf
    return top


class _Round:
    """One tournament round: champion (law c) against a challenger (law q).

    ``tail``: who wins between two tokens outside the top s: ``"champion"``, or ``"rank"`` (the
    higher key p - c q, ties: the lower id; the DDTE authors' rule).  ``keep``: the round is
    skipped (the champion always wins, c' = c)."""

    def __init__(self, p: np.ndarray, c: np.ndarray, q: np.ndarray, s: int, tail: str = "champion", keep: bool = False):
        vocab = p.size
        self.tail, self.keep = tail, keep
        if keep:
            self.top, self.w, self.law = {}, np.zeros((0, 0)), c
            return
        top = np.arange(vocab) if s >= vocab else _top_s(p, c, q, s)
        self.top = {int(t): i for i, t in enumerate(top)}
        n = top.size
        ct, qt = c[top], q[top]
        c_out, q_out = 1.0 - ct.sum(), 1.0 - qt.sum()
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
        # c'(t) = const_t + sum_j c_t q_j w[t, j] - sum_j c_j q_t w[j, t]
        const = ct * qt + ct * q_out + qt * c_out + qt * (ct.sum() - ct)
        lin = np.zeros((n, len(pairs)))
        for v, (i, j) in enumerate(pairs):
            lin[i, v] += ct[i] * qt[j]
            lin[j, v] -= ct[i] * qt[j]
        if pairs:
            cost = np.concatenate([np.zeros(len(pairs)), -np.ones(n)])
            a_ub = np.hstack([-lin, np.eye(n)])
            bounds = np.column_stack([np.zeros(len(pairs) + n), np.concatenate([np.ones(len(pairs)), p[top]])])
            w = np.clip(_solve(cost, a_ub, const, None, None, bounds, "truncated")[: len(pairs)], 0.0, 1.0)
        else:
            w = np.zeros(0)
        self.w = np.zeros((n, n))
        for v, (i, j) in enumerate(pairs):
            self.w[i, j] = w[v]
        # The champion's next law, exact for the clipped weights.
        if tail == "rank":
            law = self._rank_tail(p, c, q, top)
        else:
            law = c * q_out
        law[top] = const + lin @ w
        self.law = law

    def _rank_tail(self, p, c, q, top) -> np.ndarray:
        """c'(t) off the top: t wins as champion against the challengers ranked below it (or equal
        to t) and as challenger against the champions ranked below it; the top beats the tail."""
        tail = np.setdiff1d(np.arange(p.size), top)
        key = p[tail] - c[tail] * q[tail]
        order = tail[np.lexsort((tail, -key))]  # best first; ties: lower id first
        self.rank = {int(t): r for r, t in enumerate(order)}
        below_q = np.concatenate([np.cumsum(q[order][::-1])[::-1][1:], [0.0]])
        below_c = np.concatenate([np.cumsum(c[order][::-1])[::-1][1:], [0.0]])
        law = np.zeros(p.size)
        law[order] = c[order] * (q[order] + below_q) + q[order] * below_c
        return law

    def champion_wins(self, champion: int, challenger: int) -> float:
        if self.keep:
            return 1.0
        i, j = self.top.get(champion), self.top.get(challenger)
        if i is not None and j is not None:
            return self.w[i, j]
        if i is None and j is not None:
            return 0.0
        if i is not None:
            return 1.0
        if self.tail == "rank":
            return 1.0 if self.rank[champion] < self.rank[challenger] else 0.0
        return 1.0


class _TournamentSelection:
    """k - 1 rounds.  ``tail="guarded"``: the champion wins in the tail; of two tournaments, every
    round played, or a round played only if it raises sum min(p, c) (else skipped: the champion
    keeps its law), the one with the larger sum min(p, p_I) is used, so that sum never falls below
    sum min(p, q) = 1 - TV(p, q), one draft's acceptance, nor below the unguarded tournament's
    (the exact acceptance, which also counts corrections that land on another child, can)."""

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int, s: int, tail: str = "guarded"):
        played = self._rounds(p, q, k, s, "rank" if tail == "rank" else "champion", guard=False)
        if tail == "guarded" and k > 1:
            guarded = self._rounds(p, q, k, s, "champion", guard=True, played=played)
            if np.minimum(p, guarded[-1].law).sum() > np.minimum(p, played[-1].law).sum():
                played = guarded
        self.rounds = played
        self.law = played[-1].law if played else q

    @staticmethod
    def _rounds(p, q, k, s, tail, guard, played=None) -> list:
        rounds, law, skipped = [], q, False
        for r in range(k - 1):
            rnd = played[r] if played is not None and not skipped else _Round(p, law, q, s, tail)
            if guard and np.minimum(p, rnd.law).sum() < np.minimum(p, law).sum():
                rnd, skipped = _Round(p, law, q, s, keep=True), True
            rounds.append(rnd)
            law = rnd.law
        return rounds

    def distribution(self, children: np.ndarray):
        dist = {int(children[0]): 1.0}
        for rnd, challenger in zip(self.rounds, children[1:].tolist()):
            nxt: dict[int, float] = {}
            for champion, prob in dist.items():
                win = 1.0 if champion == challenger else rnd.champion_wins(champion, challenger)
                nxt[champion] = nxt.get(champion, 0.0) + prob * win
                nxt[challenger] = nxt.get(challenger, 0.0) + prob * (1.0 - win)
            dist = nxt
        tokens = np.fromiter(dist.keys(), dtype=np.int64)
        return tokens, np.fromiter(dist.values(), dtype=np.float64)

    def draw(self, children: np.ndarray, rng: np.random.Generator) -> int:
        champion = int(children[0])
        for rnd, challenger in zip(self.rounds, children[1:].tolist()):
            if champion != challenger and not accept_draw(rng, rnd.champion_wins(champion, challenger), 1.0):
                champion = challenger
        return champion


class _KhistiPlan(NodePlan):
    def __init__(self, verifier, p, q, k, selection):
        super().__init__(verifier, p, q, k)
        self.selection = selection
        self.selection_law = selection.law  # p_I, float64 (V,)
        self.single = SingleDraft(p, selection.law)

    def _law(self, children):
        tokens, weights = self.selection.distribution(children)
        accept = accept_probabilities(self.p[tokens], self.selection_law[tokens])
        out = float(np.dot(weights, 1.0 - accept)) * self.single.correction
        np.add.at(out, tokens, weights * accept)
        return out

    def _draw(self, children, rng):
        return self.single.draw(self.selection.draw(children, rng), rng)

    def selection_acceptance(self) -> float:
        """sum min(p, p_I): P(the selected draft passes the speculative test).  A lower bound on
        ``acceptance_rate`` (a correction token can still land on another child), computable
        at any vocabulary size; DDTE App. C reports this quantity for Khisti."""
        return float(np.minimum(self.p, self.selection_law).sum())


@dataclass(frozen=True)
class Khisti(NodeVerifier):
    """Importance-weighted selection, then speculative sampling against the exact p_I.

    Args:
        mode: ``"auto"`` (default), ``"lp"`` (optimal weights, small vocabularies) or
            ``"truncated"`` (s-truncated pairwise LP and tournament).
        s: the truncation size of ``"truncated"`` mode (2 <= s <= 15; DDTE default 5).
        tail: the truncated tournament's rule off the top s: ``"guarded"`` (default: the
            champion wins, and a round that would lower sum min(p, c) is skipped, so the
            acceptance is never below one draft's 1 - TV), ``"champion"`` (the champion wins,
            every round played: the lab's rule before the guard) or ``"rank"`` (the higher key
            p - c q wins: the DDTE authors' rule, an audit option).  All three are lossless
            (p_I is exact); they differ in acceptance.
    """

    name = "khisti"
    label = "Khisti"
    ot_based = True
    mode: Literal["auto", "lp", "truncated"] = "auto"
    s: int = 5
    tail: Literal["guarded", "champion", "rank"] = "guarded"

    def __post_init__(self):
        if self.mode not in ("auto", "lp", "truncated"):
            raise ValueError(f"mode: must be 'auto', 'lp' or 'truncated', got {self.mode!r}")
        if self.tail not in TAILS:
            raise ValueError(f"tail: must be one of {', '.join(TAILS)}, got {self.tail!r}")
        object.__setattr__(self, "s", check_int(self.s, "s", 2, 15))

    def _plan(self, p, q, k):
        n = int(np.count_nonzero(q))
        multisets = math.comb(n + k - 1, k)
        mode = self.mode
        if mode == "auto":
            mode = "lp" if multisets <= KHISTI_LP_MAX_MULTISETS else "truncated"
        if mode == "lp":
            if multisets > KHISTI_LP_MAX_MULTISETS:
                raise ValueError(
                    f"k: the full Khisti LP would have {multisets} child multisets, above the limit "
                    f"{KHISTI_LP_MAX_MULTISETS}; use mode='truncated'"
                )
            selection = _FullLPSelection(p, q, k)
        else:
            selection = _TournamentSelection(p, q, k, self.s, self.tail)
        return _KhistiPlan(self, p, q, k, selection)
