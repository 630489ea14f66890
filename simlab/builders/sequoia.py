"""Sequoia's static trees (Chen et al. 2024): positional acceptance, the tree DP, the hardware-aware size.

**Positional acceptance.**  Sequoia models the verification of a node as: the j-th sibling
(in sampling order; siblings drafted without replacement from q, verified by recursive rejection
sampling without replacement) is the accepted one with a probability p_j that depends on
nothing else.  ``acceptance_vector`` measures (p_1..p_W) at a node exactly by enumerating the
ordered prefixes of draws (``method="exact"``, up to ``simlab.drafting.MAX_ENUMERATED_TUPLES``)
or by Sequoia's semi-analytic estimator (``"mc"``: sampled children, exact conditional
P(first j - 1 rejected) min(1, p^(j)(x_j) / q^(j)(x_j)); unbiased); ``measure_acceptance``
averages it over roots.

**The DP** (``tree_dp``; Sequoia ``tree_search.py``): ``T[m][l][b]`` = the best expected number of
accepted tokens, root included (accepted drafts + 1), of a tree of m nodes, at most l levels
(the root is level 1) and b root children: ``T[1][l][0] = 1``;
``T[m][l][1] = 1 + p_1 max_b' T[m-1][l-1][b']``;
``T[m][l][b] = max_{1 <= y < m} T[y][l][b-1] + p_b max_b' T[m-y][l-1][b']`` (the b-th child's
subtree of m - y nodes weighted by p_b).  Ties go to the first strictly better y and the first arg-max b
(Sequoia's ``branch_map``).  Sequoia's m counts the root: a tree of m nodes has m - 1 draft
tokens (the lab's budget).

**Size.**  Sequoia's rule (``sequoia_size``, ``tree_search.py``): over its valid budgets m (nodes,
root included) with a measured target time t_target(m) each, and levels l, minimise
``(l t_draft + t_target(m)) / T[m][l]`` (the draft charged once per level, the root's included).
The lab's rule (``choose``, the studies' matched comparisons): among draft-token budgets and
depths, the tree minimising ``T-hat / T[m][l]``, with T-hat from ``simlab.latency`` (one draft
forward per level, one target forward over the tree) at a given context length
(``docs/departures.md``).

The builder (``Sequoia``) is that static topology (``simlab.builders.static.Static``): siblings
drafted without replacement (``Drafting.WITHOUT_REPLACEMENT``: verify with ``rrs_wor`` or
``traversal``) or, at T = 0, the top-k (``children="topk"``, greedy verification).  The DP is
optimal only under positional independence: the lab scores its trees exactly.
Source: Chen et al. 2024 (Sequoia); Infini-AI-Lab/Sequoia@0ff3ff7 ``tree_search.py``, ``Tree/SpecTree.py``,
``tests/test_accept.py`` (``docs/sources.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from simlab.builders.static import Static
from simlab.checks import check_generator, check_int
from simlab.distributions import check_pair, residual
from simlab.drafting import MAX_ENUMERATED_TUPLES, Drafting, draw_children
from simlab.trees import DraftTree, NodeTable


# -- positional acceptance ------------------------------------------------------------------------
def acceptance_vector(
    p, q, width: int, *, method: str = "exact", samples: int = 256, rng: np.random.Generator | None = None
) -> np.ndarray:
    """(p_1..p_W) at one node: P(the j-th sibling drafted without replacement is the accepted one).

    Args:
        p, q: target and draft distributions (V,).
        width: W, siblings (>= 1); positions beyond q's support get 0.
        method: ``"exact"`` (enumerate ordered prefixes) or ``"mc"`` (``samples`` drawn sibling
            lists, exact conditionals; needs ``rng``).

    Returns:
        float64 (W,); its sum is the node's acceptance rate with W siblings.

    Raises:
        ValueError: bad p, q, width or method, or (exact) more than ``MAX_ENUMERATED_TUPLES`` prefixes.
    """
    p, q = check_pair(p, q)
    width = check_int(width, "width", 1)
    if method == "exact":
        support = int(np.count_nonzero(q))
        prefixes = sum(math.perm(support, j) for j in range(1, min(width, support) + 1))
        if prefixes > MAX_ENUMERATED_TUPLES:
            raise ValueError(
                f"width: exact positional acceptance would enumerate {prefixes} prefixes, above the limit "
                f"{MAX_ENUMERATED_TUPLES}; use method='mc'"
            )
        out = np.zeros(width)
        _exact(p, q, 1.0, 0, out)
        return out
    if method == "mc":
        check_generator(rng)
        samples = check_int(samples, "samples", 1)
        out = np.zeros(width)
        k = min(width, int(np.count_nonzero(q)))
        for _ in range(samples):
            out[:k] += _conditional(p, q, draw_children(q, k, Drafting.WITHOUT_REPLACEMENT, rng))
        return out / samples
    raise ValueError(f"method: must be 'exact' or 'mc', got {method!r}")


def _exact(p: np.ndarray, q: np.ndarray, reach: float, j: int, out: np.ndarray) -> None:
    """Add P(reach this prefix) P(draw x) a(x) to out[j] for every next draw x, and recurse on rejections."""
    if j == out.size or reach == 0.0:
        return
    mass = q.sum()
    for x in np.flatnonzero(q > 0):
        drawn = q[x] / mass
        accept = min(1.0, p[x] / drawn)
        out[j] += reach * drawn * accept
        if accept < 1.0:
            rest = q.copy()
            rest[x] = 0.0
            if rest.sum() > 0.0:
                _exact(residual(p, q / mass), rest, reach * drawn * (1.0 - accept), j + 1, out)


def _conditional(p: np.ndarray, q: np.ndarray, children) -> np.ndarray:
    """P(the j-th of these siblings is the accepted one | they were drawn), j = 1..k."""
    out = np.zeros(len(children))
    target, draft, reach = p, q / q.sum(), 1.0
    for j, x in enumerate(children):
        accept = min(1.0, target[x] / draft[x])
        out[j] = reach * accept
        reach *= 1.0 - accept
        target = residual(target, draft)
        draft = draft.copy()
        draft[x] = 0.0
        if draft.sum() == 0.0:
            break
        draft /= draft.sum()
    return out


def measure_acceptance(
    pair, contexts, width: int, *, method: str = "exact", samples: int = 256, rng: np.random.Generator | None = None
) -> np.ndarray:
    """``acceptance_vector`` at each root context, averaged (Sequoia's measured vector)."""
    contexts = list(contexts)
    if not contexts:
        raise ValueError("contexts: name at least one root context")
    p_rows, q_rows = pair.distributions(contexts)
    return np.mean(
        [acceptance_vector(p, q, width, method=method, samples=samples, rng=rng) for p, q in zip(p_rows, q_rows)], axis=0
    )


def check_acceptance(acceptance) -> np.ndarray:
    """A positional acceptance vector (p_1..p_W): finite, in [0, 1], summing to at most 1 (+1e-9).

    Sequoia's files store [0, p_1..p_W, p_none]; pass the middle entries.

    Raises:
        ValueError: ``acceptance: ...``.
    """
    try:
        vector = np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"acceptance: must be a list of numbers, got {acceptance!r}") from None
    if vector.ndim != 1 or vector.size == 0:
        raise ValueError(f"acceptance: must be a non-empty 1-D list (p_1..p_W), got shape {vector.shape}")
    if not np.all(np.isfinite(vector)) or vector.min() < 0 or vector.max() > 1 or vector.sum() > 1 + 1e-9:
        raise ValueError(f"acceptance: entries must lie in [0, 1] and sum to at most 1, got {vector.tolist()}")
    return vector


# -- the DP -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeTable:
    """The solved DP: ``T[m, l, b]`` (-inf where no tree exists) and the choices behind it."""

    acceptance: tuple[float, ...]
    T: np.ndarray = field(repr=False)
    split_y: np.ndarray = field(repr=False)

    def value(self, m: int, l: int) -> float:
        """The best expected accepted tokens (root included) with m nodes and at most l levels."""
        return float(self.T[m, l].max())

    def spec(self, m: int, l: int) -> tuple[tuple[int, ...], ...]:
        """The optimal tree in tuple notation (child ranks), as the DP's choices rebuild it.

        Raises:
            ValueError: no tree with m nodes fits in l levels.
        """
        if not math.isfinite(self.value(m, l)):
            raise ValueError(
                f"budget: no tree of {m} nodes (root included) fits in {l} levels (root = level 1) with width "
                f"{len(self.acceptance)}"
            )
        out: list[tuple[int, ...]] = []
        queue = [((), m, l)]
        while queue:
            ranks, size, depth = queue.pop(0)
            b = int(np.argmax(self.T[size, depth]))  # the first arg-max, as the DP chose it
            sizes = []
            while b >= 1:  # peel the last child off: T[size][depth][b] = T[y][depth][b-1] + p_b S[size-y][depth-1]
                y = 1 if b == 1 else int(self.split_y[size, depth, b])
                sizes.append((b - 1, size - y))
                size, b = y, b - 1
            for rank, child in sorted(sizes):
                out.append(ranks + (rank,))
                queue.append((ranks + (rank,), child, depth - 1))
        return tuple(sorted(out, key=lambda r: (len(r), r)))


MAX_BUDGET = 8192
"""The most draft tokens (root excluded) the DP solves for: its time grows as nodes^2 x levels x
width and its two tables hold 16 bytes per (node, level, width) cell (depth 8, width 8, one thread,
CPU time on the lab's 2-core machine under load: 2,048 draft tokens 1.3 s, 8,192 17 s; a budget of
10^8 asked for 10^11 bytes).  Sequoia's own budgets reach 768."""


def tree_dp(acceptance, nodes: int, levels: int) -> TreeTable:
    """Solve Sequoia's DP for up to ``nodes`` nodes (root included) and ``levels`` levels (root = level 1).

    Raises:
        ValueError: a bad acceptance vector, nodes < 1 or above ``MAX_BUDGET + 1``, levels < 1.
    """
    p = check_acceptance(acceptance)
    nodes, levels = check_int(nodes, "nodes", 1, MAX_BUDGET + 1), check_int(levels, "levels", 1)
    width = p.size
    T = np.full((nodes + 1, levels + 1, width + 1), -math.inf)
    split_y = np.zeros((nodes + 1, levels + 1, width + 1), dtype=np.int64)
    S = np.full((nodes + 1, levels + 1), -math.inf)  # max_b T[m][l][b]
    T[1, 1:, 0] = 1.0
    S[1, 1:] = 1.0
    for m in range(2, nodes + 1):
        for l in range(2, levels + 1):
            if math.isfinite(S[m - 1, l - 1]):
                T[m, l, 1] = 1.0 + p[0] * S[m - 1, l - 1]
            right = S[m - 1 : 0 : -1, l - 1]  # S[m - y][l - 1] for y = 1..m-1
            for b in range(2, width + 1):
                left = T[1:m, l, b - 1]  # T[y][l][b - 1] for y = 1..m-1
                candidates = np.where(
                    np.isfinite(left) & np.isfinite(right), left + p[b - 1] * np.where(np.isfinite(right), right, 0.0), -math.inf
                )
                y = int(np.argmax(candidates))  # the first strictly better y wins ties
                if math.isfinite(candidates[y]):
                    T[m, l, b] = candidates[y]
                    split_y[m, l, b] = y + 1
            S[m, l] = T[m, l].max()
    return TreeTable(tuple(p.tolist()), T, split_y)


def positional_value(spec, acceptance) -> float:
    """Expected accepted tokens (root included) of a tree under the positional model:
    1 + sum over nodes of the product of p_rank along the path."""
    p = check_acceptance(acceptance)
    total = 1.0
    for node in spec:
        total += float(np.prod([p[r] if r < p.size else 0.0 for r in node]))
    return total


def choose(acceptance, latency, *, context: int, budgets: Sequence[int], levels: int) -> tuple[tuple[tuple[int, ...], ...], dict]:
    """The hardware-aware tree: over the draft budgets and every depth up to ``levels``, the one
    minimising ``T-hat / T[m][l]`` (seconds per accepted token) under ``latency`` at ``context``.

    Returns:
        (spec, facts): the tree in tuple notation and a dict with ``budget``, ``levels``,
        ``expected_tokens`` (T, root included), ``T`` (seconds) and ``tokens_per_second``.

    Raises:
        ValueError: an empty ``budgets``, a bad acceptance vector or latency model.
    """
    budgets = sorted({check_int(b, "budgets", 1) for b in budgets})
    if not budgets:
        raise ValueError("budgets: name at least one budget")
    levels = check_int(levels, "levels", 1)
    table = tree_dp(acceptance, budgets[-1] + 1, levels + 1)
    best = None
    for budget in budgets:
        for l in range(2, levels + 2):
            value = table.value(budget + 1, l)
            if not math.isfinite(value):
                continue
            spec = table.spec(budget + 1, l)
            seconds = latency.step_time(context, Static(spec).cost())
            rate = value / seconds
            if best is None or rate > best[1]["tokens_per_second"]:
                best = (
                    spec,
                    {"budget": budget, "levels": l - 1, "expected_tokens": value, "T": seconds, "tokens_per_second": rate},
                )
    if best is None:
        raise ValueError("budgets: no tree fits")
    return best


def sequoia_size(
    table: TreeTable, *, draft_time: float, budgets: Sequence[int], target_times: Sequence[float], levels: int
) -> tuple[int, int, float]:
    """Sequoia's own size rule (``tree_search.py``; module docstring) on a solved DP.

    Args:
        table: ``tree_dp`` solved for at least max(budgets) nodes and ``levels`` levels.
        draft_time: seconds (or any unit) of one draft forward, charged per level, root included.
        budgets: Sequoia's valid budgets m, in nodes, root included (its ``valid_budget``).
        target_times: the target's verify time for each budget, in the unit of ``draft_time``.
        levels: the most levels l (root = level 1; its ``max_depth``).

    Returns:
        (m, l, time per accepted token): the first minimum over budgets in order, then l ascending
        (strict improvement), as ``tree_search.py`` scans them.

    Raises:
        ValueError: mismatched or empty budgets and times, a budget beyond the table, non-positive
            or non-finite times, no tree that fits.
    """
    budgets = [check_int(m, "budgets", 1) for m in budgets]
    times = [float(t) for t in target_times]
    levels = check_int(levels, "levels", 1)
    if not budgets or len(budgets) != len(times):
        raise ValueError(f"budgets: need one target time per budget, got {len(budgets)} budgets and {len(times)} times")
    if max(budgets) >= table.T.shape[0] or levels >= table.T.shape[1]:
        raise ValueError(f"budgets: the DP table holds {table.T.shape[0] - 1} nodes and {table.T.shape[1] - 1} levels")
    if not all(math.isfinite(t) and t > 0 for t in [float(draft_time), *times]):
        raise ValueError(f"draft_time: times must be finite and positive, got {draft_time!r} and {times}")
    best = None
    for m, target in zip(budgets, times):
        for l in range(1, levels + 1):
            value = table.value(m, l)
            if math.isfinite(value) and value > 0:
                seconds = (l * float(draft_time) + target) / value
                if best is None or seconds < best[2]:
                    best = (m, l, seconds)
    if best is None:
        raise ValueError("budgets: no tree fits")
    return best


# -- the builder ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sequoia:
    """Sequoia's DP tree for a positional acceptance vector (module docstring).

    Args:
        acceptance: (p_1..p_W), measured (``measure_acceptance``) or given.
        budget: draft tokens of the tree (the DP's m - 1), 1 to ``MAX_BUDGET``.
        depth: the most draft levels (the DP's l - 1), >= 1.
        children: ``"without_replacement"`` (stochastic Sequoia) or ``"topk"`` (greedy Sequoia).

    Raises:
        ValueError: a bad acceptance vector, budget, depth or children, or no tree that fits.
    """

    acceptance: tuple[float, ...]
    budget: int = 63
    depth: int = 8
    children: Literal["without_replacement", "topk"] = "without_replacement"
    shape: Static = field(init=False, repr=False, compare=False)

    default_laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.WITHOUT_REPLACEMENT})

    @classmethod
    def example(cls, vocab_size: int = 4) -> "Sequoia":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls((0.6, 0.25), budget=3, depth=2)

    def __post_init__(self):
        object.__setattr__(self, "acceptance", tuple(check_acceptance(self.acceptance).tolist()))
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1, MAX_BUDGET))
        object.__setattr__(self, "depth", check_int(self.depth, "depth", 1, 64))
        table = tree_dp(self.acceptance, self.budget + 1, self.depth + 1)
        if not math.isfinite(table.value(self.budget + 1, self.depth + 1)):  # said in the caller's units, not the DP's m and l
            width = len(self.acceptance)
            most = sum(width**d for d in range(1, self.depth + 1))
            raise ValueError(
                f"budget: no tree of {self.budget} draft tokens (root excluded) fits in depth {self.depth} with width "
                f"{width} (at most {most} draft tokens)"
            )
        object.__setattr__(self, "shape", Static(table.spec(self.budget + 1, self.depth + 1), self.children))

    @property
    def deterministic(self) -> bool:
        return self.shape.deterministic

    @classmethod
    def fitted(cls, pair, contexts, width: int = 8, **options) -> "Sequoia":
        """The builder for the acceptance vector measured at ``contexts`` (exact where it fits)."""
        return cls(tuple(measure_acceptance(pair, contexts, width).tolist()), **options)

    @property
    def spec(self) -> tuple[tuple[int, ...], ...]:
        return self.shape.spec

    @property
    def laws(self) -> frozenset[Drafting]:
        return self.shape.laws

    @property
    def expected_tokens(self) -> float:
        """T of the DP (root included) under the positional model."""
        return positional_value(self.spec, self.acceptance)

    def sample(self, table: NodeTable, rng: np.random.Generator | None = None) -> DraftTree:
        return self.shape.sample(table, rng)

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        yield from self.shape.enumerate(table)
