"""SpecTr-GBV as released: K i.i.d. draft blocks of L tokens verified by per-prefix acceptances
from joint prefix probabilities (Lin, Sheng, Cai and Zhou, arXiv 2604.25925), valued exactly.

Source: the official code junemily/SpecTr-GBV@e399f44631b5b46e28d3fed13840cf666efc2016,
``src/engine.py::Decoding.speculative_decoding`` (defaults K = 7 ``--num_candidates``, L = 6
``--gamma`` in ``src/util.py``, which refuses L < 2).  With K = 1 the official code names its
run ``"gbv"`` (``official_gbv``), after Sun et al.'s greedy block verification (arXiv 2403.10444;
not Thomas & Pal's greedy multi-path block verification); it is not that algorithm as published:
its acceptances use the raw joint ratio M_b / M_s where Sun et al.'s Block Verification uses the
running capped weight p_i = min(1, p_(i-1) p / q), and replacing M_b by M_s p_i (capped) gives
Block Verification's law exactly (checked by an independent transcription of the official loops;
the lab's ``bv`` is Block Verification).  Uncapped, the K = 1 rule is lossy: its
E[tau] is sum_u min(M_b(u), M_s(u)), above Block Verification's, the lossless optimum.

Vocabulary: K **blocks** x_1..x_K of L tokens drawn i.i.d. from q; for a prefix u, M_s(u) and
M_b(u) the products of q and of p over its tokens; **alpha(u)**, a prefix's acceptance, and
**beta(x)**, a whole block's, used as computed (U < value); the **residual** R the next token is
drawn from after a rejection; ``undefined_mass``, the probability of an all-zero R (where the
official ``torch.multinomial`` raises).  The round's formulas, its scan order and how the exact
law is computed (``SpecTrGBV.stop_law``, tested equal to a written-out run of the official loops):
``docs/derivations/spectr_gbv.md``.  Float64 throughout.

**Declared lossy** (``lossless = False``): the enumeration over the worlds of
``tests/test_spectr_gbv.py`` and ``analyses/spectr_gbv.py`` finds emitted laws off the target's
for every K, K = 1 included.  ``outcome_law``, ``accepted_length_distribution``,
``expected_block_efficiency`` and ``verify`` refuse without ``allow_lossy=True``; ``block_bias``
and ``sequence_bias`` give the exact bias (lossy or not, as ``simlab.efficiency.pairing_bias``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from simlab.checks import check_bool, check_generator, check_int
from simlab.distributions import sample_categorical
from simlab.efficiency import sequence_tv
from simlab.pairs import ModelPair, check_context, eos_of

Prefix = tuple[int, ...]
OFFICIAL = "junemily/SpecTr-GBV@e399f44631b5b46e28d3fed13840cf666efc2016 src/engine.py::speculative_decoding"
MAX_BLOCKS = 200_000
"""The most draft blocks (q-positive sequences of L tokens) one round enumerates."""


@dataclass(frozen=True)
class World:
    """p and q at every q-positive prefix of one round (the rows the official code reads).

    Attributes:
        vocab_size: V.
        gamma: L, the block length.
        p, q: prefix (tuple of token ids, length 0..L for p, 0..L-1 for q) -> float64 (V,).
        blocks: the q-positive blocks of L tokens, in lexicographic order.
        draft_mass, target_mass: prefix -> M_s, M_b (products left to right; 1.0 for ()).
    """

    vocab_size: int
    gamma: int
    p: dict
    q: dict
    blocks: list
    draft_mass: dict
    target_mass: dict

    @classmethod
    def build(cls, pair: ModelPair, context: Sequence[int], gamma: int) -> World:
        """Fetch p and q after ``context`` at every q-positive prefix of up to ``gamma`` tokens.

        Raises:
            ValueError: a bad context or gamma, a pair with an EOS id (the official rule has no
                end-of-sequence handling inside a round), or more than ``MAX_BLOCKS`` blocks.
        """
        if eos_of(pair) is not None:
            raise ValueError("pair: has an EOS id; the official SpecTr-GBV round has no end-of-sequence handling")
        vocab = pair.vocab_size
        root = check_context(context, vocab)
        p, q, draft_mass, target_mass = {}, {}, {(): 1.0}, {(): 1.0}
        level = [()]
        for depth in range(gamma + 1):
            rows_p, rows_q = pair.distributions([root + u for u in level])
            nxt = []
            for u, row_p, row_q in zip(level, rows_p, rows_q):
                p[u] = np.asarray(row_p, dtype=np.float64)
                if depth == gamma:
                    continue
                q[u] = np.asarray(row_q, dtype=np.float64)
                for t in np.flatnonzero(q[u] > 0.0):
                    child = u + (int(t),)
                    draft_mass[child] = draft_mass[u] * q[u][t]
                    target_mass[child] = target_mass[u] * p[u][t]
                    nxt.append(child)
            if depth < gamma:
                if len(nxt) > MAX_BLOCKS:
                    raise ValueError(f"gamma: {len(nxt)} draft prefixes of {depth + 1} tokens, above the limit {MAX_BLOCKS}")
                level = nxt
        return cls(vocab, gamma, p, q, sorted(level), draft_mass, target_mass)


@dataclass(frozen=True)
class SpecTrGBV:
    """SpecTr-GBV's released round (docs/derivations/spectr_gbv.md), K blocks of ``gamma`` tokens.

    Attributes:
        k: K, the number of i.i.d. draft blocks (``--num_candidates``, default 7; 1 is the
            code's ``"gbv"``, ``official_gbv``).
        gamma: L, the block length (``--gamma``, default 6; at least 2, as the official CLI).
        eps: the official 1e-20 in every ratio and denominator.
        allow_lossy: compute results of this lossy rule instead of raising ``ValueError``.

    Raises:
        ValueError: k < 1, gamma < 2, eps not a finite float >= 0, allow_lossy not a bool.
    """

    k: int = 7
    gamma: int = 6
    eps: float = 1e-20
    allow_lossy: bool = field(default=False, kw_only=True)

    name: ClassVar[str] = "spectr_gbv"
    lossless: ClassVar[bool] = False  # by enumeration (tests/test_spectr_gbv.py)

    def __post_init__(self):
        check_int(self.k, "k", 1)
        check_int(self.gamma, "gamma", 2)
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0.0 <= self.eps < math.inf:
            raise ValueError(f"eps: must be a finite number >= 0, got {self.eps!r}")
        check_bool(self.allow_lossy, "allow_lossy")

    @property
    def label(self) -> str:
        """The lab's label: ``"SpecTr-GBV (K=k)"``, or ``"SpecTr-GBV code's gbv (K=1)"`` (not Sun
        et al.'s Block Verification, module docstring)."""
        return f"SpecTr-GBV (K={self.k})" if self.k > 1 else "SpecTr-GBV code's gbv (K=1)"

    @property
    def official_method(self) -> str:
        """The official metrics' ``method`` field: ``"spectr-gbv"``, ``"gbv"`` for K = 1."""
        return "spectr-gbv" if self.k > 1 else "gbv"

    # -- the official formulas ------------------------------------------------------------------
    def _power(self, z):
        return (1.0 - z) ** self.k

    def prefix_acceptance(self, m_s: float, m_b: float, p_next: np.ndarray, q_next: np.ndarray) -> float:
        """alpha of a prefix of 1..L-1 tokens with joint masses ``m_s``, ``m_b`` and next-token
        laws ``p_next``, ``q_next`` (float64 (V,)), as computed (it may leave [0, 1])."""
        eps = self.eps
        ratio = np.minimum((m_s * q_next) / (m_b * p_next + eps), 1.0)
        raw = min(m_s / (m_b + eps), 1.0)
        weights = m_b * p_next
        numerator = float(np.sum(weights * self._power(ratio))) - m_b * self._power(raw)
        denominator = 1.0 - self._power(m_s) - float(np.sum(weights * (1.0 - self._power(ratio))))
        return numerator / (denominator + eps)

    def block_acceptance(self, m_s: float, m_b: float) -> float:
        """beta of a whole block with joint masses ``m_s``, ``m_b``."""
        ratio = min(m_s / (m_b + self.eps), 1.0)
        return m_b * (1.0 - self._power(ratio)) / (1.0 - self._power(m_s) + self.eps)

    def residual_weights(self, m_s: float, m_b: float, p_next: np.ndarray, q_next: np.ndarray) -> np.ndarray:
        """The unnormalised residual R (float64 (V,)) after an accepted prefix with masses
        ``m_s``, ``m_b`` (1, 1 for none)."""
        weights = m_b * p_next
        return weights * (1.0 - np.minimum(m_s * q_next / (weights + self.eps), 1.0) ** self.k)

    # -- per-world tables -----------------------------------------------------------------------
    def world(self, pair: ModelPair, context: Sequence[int]) -> World:
        """``World.build(pair, context, self.gamma)``."""
        return World.build(pair, context, self.gamma)

    def acceptances(self, world: World) -> dict[Prefix, float]:
        """alpha at every q-positive prefix of 1..L-1 tokens and beta at every block, as computed."""
        out = {}
        for u in world.draft_mass:
            if 1 <= len(u) < self.gamma:
                out[u] = self.prefix_acceptance(world.draft_mass[u], world.target_mass[u], world.p[u], world.q[u])
            elif len(u) == self.gamma:
                out[u] = self.block_acceptance(world.draft_mass[u], world.target_mass[u])
        return out

    def next_token_law(self, world: World, accepted: Prefix, whole: bool) -> np.ndarray | None:
        """The law of the token after ``accepted`` (float64 (V,)): p after a whole block, else the
        normalised residual; None where the residual is all zero (the official draw raises)."""
        if whole:
            return world.p[accepted]
        weights = self.residual_weights(
            world.draft_mass[accepted], world.target_mass[accepted], world.p[accepted], world.q[accepted]
        )
        total = float(weights.sum())
        return weights / total if total > 0.0 else None

    # -- the exact law ---------------------------------------------------------------------------
    def stop_law(self, world: World) -> dict[tuple[Prefix, bool], float]:
        """Exact P(accepted prefix, whole block accepted) of one round.

        Each distinct prefix is checked at most once in a round (a rejected one is skipped
        after, an accepted one lies at or above the scan's start after), so the round has the
        law of one with an independent accept bit A_u ~ Bernoulli(alpha(u)) per prefix and one
        B_j ~ Bernoulli(beta(x_j)) per block: the first block with B_j = 1 is emitted whole;
        else the accepted prefix is the deepest u of depth <= L - 1 with A_u = 1 on any block,
        ties to the first block holding one.  With c (a block's B = 0 and no accepted node at
        depth >= d on it), e (B = 0 and its deepest accepted node at depth d) and b_u (B = 0 and
        its deepest accepted node u, of depth d), P(u) = sum_r C(K, r + 1) E[c^(K-1-r) e^r b_u]
        over the A's and the i.i.d. blocks, each moment a recursion over the prefix tree with
        the blocks' counts per child (multinomial); P(()) = E[c^K] at d = 0, and the whole
        block x with probability q(x) beta(x) sum_j (1 - E[beta])^(j-1).
        """
        alpha = {u: min(1.0, max(0.0, v)) for u, v in self.acceptances(world).items()}
        k, gamma = self.k, self.gamma
        children = {}
        for u in world.draft_mass:
            if u:
                children.setdefault(u[:-1], []).append(u)
        below: dict = {}

        def node_factor(w, m):
            if len(w) == gamma:
                return (1.0 - alpha[w]) ** m
            return 1.0 - alpha[w]

        def spread(v, counts):
            """Every way to send labelled blocks of each type (counts) to v's children."""
            kids = children.get(v, [])
            per_type = [list(_compositions(c, len(kids))) for c in counts]
            for parts in itertools.product(*per_type):
                weight = 1.0
                for c, part in zip(counts, parts):
                    weight *= _multinomial(c, part)
                    for w, m in zip(kids, part):
                        if m:
                            weight *= world.q[v][w[-1]] ** m
                yield weight, [tuple(part[i] for part in parts) for i in range(len(kids))], kids

        def deep(v, m):
            """E over m blocks through v: no accepted node below v, no whole acceptance."""
            if len(v) == gamma or m == 0:
                return 1.0
            if (v, m) not in below:
                total = 0.0
                for weight, split, kids in spread(v, (m,)):
                    term = weight
                    for w, (mw,) in zip(kids, split):
                        if mw:
                            term *= node_factor(w, mw) * deep(w, mw)
                    total += term
                below[(v, m)] = total
            return below[(v, m)]

        def top(v, counts, target, depth, memo):
            """E over blocks through v of depth < depth: counts = (c, e, b_target) blocks."""
            key = (v, counts)
            if key in memo:
                return memo[key]
            total = 0.0
            for weight, split, kids in spread(v, counts):
                term = weight
                for w, (ci, ei, bi) in zip(kids, split):
                    if bi and w != target[: len(w)]:
                        term = 0.0
                        break
                    if not ci + ei + bi:
                        continue
                    if len(w) < depth:
                        term *= top(w, (ci, ei, bi), target, depth, memo)
                        continue
                    if ci and (ei or bi):
                        term = 0.0
                        break
                    term *= (1.0 - alpha[w] if ci else alpha[w]) * deep(w, ci + ei + bi)
                total += term
            memo[key] = total
            return total

        out: dict = {((), False): deep((), k)}
        for u in world.draft_mass:
            if not 1 <= len(u) < gamma or alpha[u] <= 0.0:
                continue
            memo: dict = {}
            mass = sum(math.comb(k, r + 1) * top((), (k - 1 - r, r, 1), u, len(u), memo) for r in range(k))
            if mass > 0.0:
                out[(u, False)] = mass
        whole = {x: world.draft_mass[x] * alpha[x] for x in world.blocks}
        stay = 1.0 - sum(whole.values())
        scale = sum(stay**j for j in range(k))
        for x, mass in whole.items():
            if mass > 0.0:
                out[(x, True)] = mass * scale
        return out

    def _laws(self, world: World) -> tuple[dict[Prefix, np.ndarray], float]:
        law: dict[Prefix, np.ndarray] = {}
        undefined = 0.0
        for (acc, whole), mass in self.stop_law(world).items():
            nxt = self.next_token_law(world, acc, whole)
            if nxt is None:
                undefined += mass
                continue
            law[acc] = law.get(acc, np.zeros(world.vocab_size)) + mass * nxt
        return law, undefined

    # -- entry points ---------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ``ValueError`` unless ``allow_lossy`` (the rule is declared lossy)."""
        if not self.allow_lossy and not self.lossless:
            raise ValueError(
                f"verifier: {self.name} ({self.label}, {OFFICIAL}) is declared lossy; pass allow_lossy=True "
                "for its biased result (simlab.spectr_gbv.block_bias gives the exact bias)"
            )

    def undefined_mass(self, pair: ModelPair, context: Sequence[int]) -> float:
        """P(the round stops where the residual is all zero): the official draw raises there."""
        return self._laws(self.world(pair, context))[1]

    def outcome_law(self, pair: ModelPair, context: Sequence[int]) -> dict[Prefix, np.ndarray]:
        """Exact P(accepted prefix, next token) of one round at ``context``: prefix -> float64 (V,).

        Raises:
            ValueError: refused without ``allow_lossy``; a bad context; a pair with an EOS id;
                positive probability of an all-zero residual (``undefined_mass``).
        """
        self.check()
        law, undefined = self._laws(self.world(pair, context))
        if undefined > 0.0:
            raise ValueError(f"context: the round stops at an all-zero residual with probability {undefined:.3g}")
        return law

    def accepted_length_distribution(self, pair: ModelPair, context: Sequence[int]) -> np.ndarray:
        """P(tau = j) for j = 0..L, float64 (L + 1,) (raises as ``outcome_law``)."""
        out = np.zeros(self.gamma + 1)
        for acc, vector in self.outcome_law(pair, context).items():
            out[len(acc)] += float(vector.sum())
        return out

    def expected_block_efficiency(self, pair: ModelPair, context: Sequence[int]) -> float:
        """E[tau + 1] in tokens of one round (raises as ``outcome_law``)."""
        dist = self.accepted_length_distribution(pair, context)
        return float(np.dot(np.arange(1, dist.size + 1), dist))

    def verify(self, pair: ModelPair, context: Sequence[int], rng: np.random.Generator) -> tuple[Prefix, int]:
        """One round as the official code runs it: K blocks drawn from q, one uniform per check
        (drawn before the skip), the next token from its law.  Returns (accepted prefix, token).

        Raises:
            ValueError: as ``outcome_law`` (an all-zero residual when the run reaches one).
        """
        self.check()
        rng = check_generator(rng)
        world = self.world(pair, context)
        blocks = []
        for _ in range(self.k):
            u: Prefix = ()
            for _ in range(self.gamma):
                u = u + (sample_categorical(world.q[u], rng),)
            blocks.append(u)
        accept = self.acceptances(world)
        acc: Prefix = ()
        rejected: set = set()
        whole = False
        for block in blocks:
            for length in range(len(acc) + 1, self.gamma):
                key = block[:length]
                draw = rng.random()
                if key in rejected:
                    continue
                if draw < accept[key]:
                    acc = key
                else:
                    rejected.add(key)
            if rng.random() < accept[block]:
                acc, whole = block, True
                break
        law = self.next_token_law(world, acc, whole)
        if law is None:
            raise ValueError(f"context: the run stopped after {acc} where the residual is all zero")
        return acc, sample_categorical(law, rng)


def official_gbv(gamma: int = 6, *, allow_lossy: bool = False) -> SpecTrGBV:
    """The SpecTr-GBV code's K = 1 run, named ``"gbv"`` there: ``SpecTrGBV(k=1)`` (module docstring:
    Sun et al.'s greedy block verification with an uncapped ratio, lossy)."""
    return SpecTrGBV(k=1, gamma=gamma, allow_lossy=allow_lossy)


# -- exact bias and bounds --------------------------------------------------------------------------
def _emitted(rule: SpecTrGBV, pair: ModelPair, context: Sequence[int]) -> tuple[dict[Prefix, float], float]:
    law, undefined = rule._laws(rule.world(pair, context))
    out = {}
    for acc, vector in law.items():
        for t in np.flatnonzero(vector > 0.0):
            out[acc + (int(t),)] = float(vector[t])
    return out, undefined


def emitted_law(rule: SpecTrGBV, pair: ModelPair, context: Sequence[int]) -> dict[Prefix, float]:
    """Exact law of the tokens one round emits (accepted prefix plus the next token), lossy or
    not; the mass of an all-zero residual is left out (``SpecTrGBV.undefined_mass``)."""
    return _emitted(rule, pair, context)[0]


def _target_extend(pair: ModelPair, context: Sequence[int], law: dict[Prefix, float], n: int) -> dict[Prefix, float]:
    """The law of ``n`` tokens: each sequence of ``law`` (at most n tokens) continued by the target."""
    root = tuple(context)
    out: dict = {}
    current = dict(law)
    while current:
        short = [s for s in current if len(s) < n]
        for s, w in current.items():
            if len(s) >= n:
                out[s[:n]] = out.get(s[:n], 0.0) + w
        if not short:
            break
        rows, _ = pair.distributions([root + s for s in short])
        nxt: dict = {}
        for s, row in zip(short, rows):
            for t in np.flatnonzero(row > 0.0):
                key = s + (int(t),)
                nxt[key] = nxt.get(key, 0.0) + current[s] * float(row[t])
        current = nxt
    return out


def block_bias(rule: SpecTrGBV, pair: ModelPair, context: Sequence[int]) -> float:
    """Exact TV between the law of L + 1 tokens from one round of ``rule`` continued by the
    target and the target's law of L + 1 tokens: 0 (to rounding) iff the round is lossless at
    ``context``.  The mass of an all-zero residual counts as wholly off the target."""
    n = rule.gamma + 1
    law = _target_extend(pair, context, emitted_law(rule, pair, context), n)
    return sequence_tv(law, _target_extend(pair, context, {(): 1.0}, n))


def sequence_bias(rule: SpecTrGBV, pair: ModelPair, context: Sequence[int], n: int) -> float:
    """Exact TV between the law of the first ``n`` tokens emitted by repeated rounds of ``rule``
    from ``context`` and the target's (as ``simlab.efficiency.pairing_bias``)."""
    n = check_int(n, "n", 1)
    root = tuple(context)
    memo: dict = {}

    def law(ctx: Prefix, need: int) -> dict:
        if (ctx, need) not in memo:
            out: dict = {}
            for emitted, w in emitted_law(rule, pair, ctx).items():
                if len(emitted) >= need:
                    out[emitted[:need]] = out.get(emitted[:need], 0.0) + w
                    continue
                for tail, v in law(ctx + emitted, need - len(emitted)).items():
                    out[emitted + tail] = out.get(emitted + tail, 0.0) + w * v
            memo[(ctx, need)] = out
        return memo[(ctx, need)]

    return sequence_tv(law(root, n), _target_extend(pair, root, {(): 1.0}, n))


def prefix_bound(world: World, k: int) -> float:
    """sum over prefixes u of 1..L tokens of min(M_b(u), 1 - (1 - M_s(u))^k): an upper bound on
    E[tau] of any lossless verifier of k i.i.d. blocks (P(the accepted prefix starts with u) is at
    most the target's M_b(u) and at most P(some block starts with u)).  Derived by the lab."""
    return float(sum(min(world.target_mass[u], 1.0 - (1.0 - world.draft_mass[u]) ** k) for u in world.draft_mass if u))


def code_prefix_mass(world: World, k: int) -> float:
    """sum over prefixes u of 1..L tokens of M_b(u) (1 - (1 - min(1, M_s(u) / M_b(u)))^k): the
    per-prefix mass the official acceptances are built from, read from the code (not the paper's
    closed form); equal to ``prefix_bound`` at k = 1.  float64; ``world`` as ``SpecTrGBV.world``."""
    total = 0.0
    for u in world.draft_mass:
        if u and world.target_mass[u] > 0.0:
            ratio = min(1.0, world.draft_mass[u] / world.target_mass[u])
            total += world.target_mass[u] * (1.0 - (1.0 - ratio) ** k)
    return total


def _compositions(total: int, parts: int):
    """Every tuple of ``parts`` non-negative ints summing to ``total``."""
    if parts == 0:
        if total == 0:
            yield ()
        return
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _compositions(total - first, parts - 1):
            yield (first,) + rest


def _multinomial(total: int, part) -> float:
    out = math.factorial(total)
    for m in part:
        out //= math.factorial(m)
    return float(out)
