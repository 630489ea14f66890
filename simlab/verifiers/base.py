"""The node-level verifier protocol (an OTLP solver, DDTE Def. 3.2) and what all verifiers share.

Vocabulary (fixed for the whole lab):

* **target** ``p`` and **draft** ``q``: next-token distributions at one draft-tree node, float64 (V,);
* **children** (drafts) ``x = (x_1..x_k)``: the ordered token ids drafted below the node,
  duplicates kept; their joint law Q is the verifier's ``drafting`` law;
* **output** token: what the verifier emits at the node.  It is an **accepted** token when
  it is one of the children (verification descends into that child), otherwise it is the
  **correction** (residual) token and verification stops.  At a leaf (k = 0) the tree
  verifier emits the **bonus** token by the verifier's leaf rule (``leaf_law``/``leaf_draw``):
  a draw from p, except the greedy rule's argmax of p; node verifiers require k >= 1;
* **branch probability** B(x, t) = P(output = t | x) (DDTE Def. 5.3; ``output_distribution``);
* **acceptance rate** alpha = P(output in set(x)) with x ~ Q (DDTE Def. 5.1);
* **lossless**: sum_x Q(x) B(x, .) = p.  Each verifier declares the drafting laws it is
  lossless for (``lossless_for``); a tree verifier refuses any other pairing unless asked to
  compute the biased result (``simlab.tree_verifiers``).

A verifier is a small frozen dataclass (its options).  ``prepare(p, q, k)`` validates the
inputs and does the per-node work once (residual chains, SpecTr's rho*, Khisti's weights,
the OT coupling), returning a ``NodePlan`` that answers for any children at that node.  The
convenience methods ``output_distribution`` / ``acceptance_rate`` / ``sample`` prepare a
plan and use it once.  ``NodePlan.children_mass`` gives only the children's entries of B: O(k)
after ``prepare`` for NSS, NaiveTree, SpecTr and SpecInfer (what block efficiency and labels
read), the full law's entries for the others.

Optional capabilities (class attributes, default off):

* ``speculative_at_one``: with k = 1 the verifier's law is speculative sampling's (NaiveTree's),
  so a tree computation shares one speculative-sampling plan across such verifiers
  (``simlab.trees.NodeTable.plan``); declared by NaiveTree, SpecTr, SpecInfer, RRS without
  replacement and checked by enumeration in the tests;
* ``label``, ``ot_based``: the papers' name and membership of DDTE's OT-based family (tables and
  the selector study read them; ``simlab.tree_verifiers.paper_name``);
* a closed-form acceptance rate: a plan that overrides ``NodePlan.acceptance_formula`` has one
  (``has_formula``); ``acceptance_rate(method="auto"|"formula"|"enumerate")`` reaches the
  formula and the enumeration alike, and the tests check they agree where both exist;
* ``branch_is_target``: B(x, .) = p whatever the children x (the output is a draw from p, accepted
  when it is a child), hence lossless for every drafting law, and a tree's reach probabilities are
  products of p along paths (``simlab.reach_grid``); declared by NSS and checked in the tests.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from simlab.distributions import check_pair, sample_categorical
from simlab.drafting import Drafting, check_k, child_tuples, draw_children

ACCEPTANCE_RATE_METHODS = ("auto", "formula", "enumerate")
"""The ``method`` values of ``acceptance_rate`` (``NodePlan`` and ``NodeVerifier``)."""

ALL_LAWS = frozenset(Drafting)
"""Every drafting law (verifiers whose branch law is p whatever the children: NSS, one-hot)."""


def accept_draw(rng: np.random.Generator, numerator: float, denominator: float) -> bool:
    """The rejection test ``U < numerator / denominator`` with U ~ Uniform[0, 1) from ``rng``.

    Written as ``U * denominator < numerator`` (denominator > 0): strict, so a token with
    numerator 0 is never accepted, even when U = 0, and a ratio >= 1 always accepts.
    Consumes exactly one ``rng.random()``.
    """
    return rng.random() * denominator < numerator


def summed_over_copies(children: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Each child's mass summed over every copy of its token: out[j] = sum_{i: x_i = x_j} mass[i];
    float64 (k,) from int (k,) children and float64 (k,) per-copy masses (what ``children_mass``
    reports for repeated children), or row by row for (M, k) children and masses (the same sums
    in the same order: ``children_masses``)."""
    return ((children[..., :, None] == children[..., None, :]) * mass[..., None, :]).sum(axis=-1)


DRAWN_FROM_Q = (Drafting.IID, Drafting.WITHOUT_REPLACEMENT, Drafting.REPEATED)
"""Laws whose every child is a draw from q (repeated copies are copies of one draw)."""

DISTINCT_LAWS = (Drafting.WITHOUT_REPLACEMENT, Drafting.MIXED)
"""The drafting laws of verifiers that take distinct children only."""


def check_child_ids(children, k: int, vocab: int) -> np.ndarray:
    """Validate a child list's shape and ids (every path, reference and fast, refuses as this does).

    Args:
        children: a 1-D integer sequence of token ids.
        k: the expected number of children.
        vocab: V.

    Returns:
        int64 (k,).

    Raises:
        ValueError: ``children: ...`` for a list that is not 1-D, not of length k, not integer,
            or holds an id outside [0, V).
    """
    x = np.asarray(children)
    if x.ndim != 1:
        raise ValueError(f"children: must be a 1-D sequence of token ids, got shape {x.shape}")
    if x.size != k:
        raise ValueError(f"children: expected k = {k} token ids, got {x.size}")
    if x.dtype.kind not in "iu":
        raise ValueError(f"children: token ids must be integers, got dtype {x.dtype}")
    x = x.astype(np.int64, copy=False)
    if x.size and (x.min() < 0 or x.max() >= vocab):  # two reductions, not a mask (k is small)
        bad = (x < 0) | (x >= vocab)
        raise ValueError(f"children: token id {x[bad][0]} is outside [0, V) with V = {vocab}")
    return x


def drafted_mask(law: Drafting, k: int) -> np.ndarray:
    """Which of k children ``law`` drew from q (so q > 0 there): bool (k,); every child of an
    i.i.d., without-replacement or repeated law, the tail (last child) of a mixed one, none of a
    deterministic one (deterministic children need not come from q)."""
    if law in DRAWN_FROM_Q:
        return np.ones(k, dtype=bool)
    mask = np.zeros(k, dtype=bool)
    if law is Drafting.MIXED:
        mask[-1:] = True
    return mask


def check_drafted(verifier: "NodeVerifier", law: Drafting, children: np.ndarray, q_at: np.ndarray) -> None:
    """Refuse children that ``law`` cannot have drawn, or that ``verifier`` cannot test: the one
    check of every path that values children (``NodePlan.check_children``, the batched engine).
    O(k).

    Args:
        verifier: the node verifier that will value them (its ``drafting`` and ``divides_by_q``).
        law: the drafting law of the node's children.
        children: int64 (k,) valid ids (``check_child_ids``).
        q_at: float64 (k,), q at them.

    Raises:
        ValueError: ``children: ...`` for a child drawn from q with q = 0 (an impossible draw),
            any child with q = 0 for a verifier that divides by q at every child, or repeated
            children for a verifier of distinct children.
    """
    zero = np.asarray(q_at) == 0
    impossible = zero & drafted_mask(law, children.size)
    if impossible.any():
        raise ValueError(f"children: token {children[impossible][0]} has q = 0 and cannot have been drafted")
    if verifier.divides_by_q and zero.any():
        raise ValueError(f"children: token {children[zero][0]} has q = 0; {verifier.name}'s acceptance test divides by q there")
    if verifier.drafting in DISTINCT_LAWS and len(set(children.tolist())) != children.size:
        raise ValueError(
            f"children: {children.tolist()} repeats a token, impossible when drafting {verifier.drafting.description}"
        )


class NodePlan(abc.ABC):
    """A verifier prepared at one node: validated ``p``, ``q`` (V,), the number of children ``k``
    and the drafting ``law`` of the children it will be given (default: the verifier's own)."""

    def __init__(self, verifier: "NodeVerifier", p: np.ndarray, q: np.ndarray, k: int):
        self.verifier = verifier
        self.p = p
        self.q = q
        self.k = k
        self.law = verifier.drafting

    # -- to implement -------------------------------------------------------------------
    @abc.abstractmethod
    def _law(self, children: np.ndarray) -> np.ndarray:
        """B(children, .) for validated children; float64 (V,)."""

    @abc.abstractmethod
    def _draw(self, children: np.ndarray, rng: np.random.Generator) -> int:
        """Run the algorithm once on validated children."""

    def acceptance_formula(self) -> float:
        """Optional: alpha in closed form.  A plan that overrides it has a formula
        (``has_formula``); the base class has none."""
        raise ValueError(f"method: {self.verifier.name} has no closed-form acceptance rate; use 'enumerate' or 'auto'")

    @classmethod
    def has_formula(cls) -> bool:
        """True when the plan overrides ``acceptance_formula`` (found by override, as scipy.stats
        finds a distribution's own ``_cdf``)."""
        return cls.acceptance_formula is not NodePlan.acceptance_formula

    def acceptance_rate(self, method: str = "auto") -> float:
        """Exact alpha = P(output in set(X)), X ~ Q.

        Args:
            method: ``"formula"`` (the plan's closed form), ``"enumerate"`` (sum over every child
                tuple of the plan's ``law`` of its probability times B(x, set(x))), or ``"auto"``: the formula when the
                plan has one, else the enumeration.

        Raises:
            ValueError: ``method`` unknown, ``"formula"`` on a plan without one, or an enumeration
                beyond ``simlab.drafting.MAX_ENUMERATED_TUPLES``.
        """
        if method not in ACCEPTANCE_RATE_METHODS:
            raise ValueError(f"method: must be one of {', '.join(ACCEPTANCE_RATE_METHODS)}, got {method!r}")
        if method == "formula" or (method == "auto" and self.has_formula()):
            return self.acceptance_formula()
        tuples, probs = child_tuples(self.q, self.k, self.law)
        total = 0.0
        for x, prob in zip(tuples, probs):
            law = self._law(x)
            total += prob * law[np.unique(x)].sum()
        return float(total)

    def _children_mass(self, children: np.ndarray) -> np.ndarray:
        """B(children, children[j]) for validated children; float64 (k,).  Default: read from the
        full law (plans with a closed form override it without building the V-vector)."""
        return self._law(children)[children]

    # -- validated entry points ------------------------------------------------------------
    def check_children(self, children) -> np.ndarray:
        """Validate children against this node; return them as int64 (k,) (``check_child_ids``, then
        ``check_drafted`` with this plan's law and q at the children).

        Raises:
            ValueError: as ``check_child_ids`` and ``check_drafted``.
        """
        x = check_child_ids(children, self.k, self.p.size)
        check_drafted(self.verifier, self.law, x, self.q[x])
        return x

    def check_children_rows(self, rows) -> np.ndarray:
        """``check_children`` for M child lists of this node at once, in a fixed number of numpy
        calls (what a label grid pays per node instead of once per list); int64 (M, k).

        Raises:
            ValueError: as ``check_children`` (the first offending list, in row order, is named
                by the first rule it breaks).
        """
        x = np.asarray(rows)
        if x.ndim != 2:
            raise ValueError(f"children: must be a 2-D array of child lists (M, k), got shape {x.shape}")
        if x.shape[1] != self.k:
            raise ValueError(f"children: expected k = {self.k} token ids, got {x.shape[1]}")
        if x.size and x.dtype.kind not in "iu":
            raise ValueError(f"children: token ids must be integers, got dtype {x.dtype}")
        x = x.astype(np.int64, copy=False)
        if x.size and (x.min() < 0 or x.max() >= self.p.size):
            bad = (x < 0) | (x >= self.p.size)
            raise ValueError(f"children: token id {x[bad][0]} is outside [0, V) with V = {self.p.size}")
        zero = self.q[x] == 0
        bad = np.any(zero & drafted_mask(self.law, self.k), axis=1)
        if self.verifier.divides_by_q:
            bad |= np.any(zero, axis=1)
        if self.verifier.drafting in DISTINCT_LAWS and self.k > 1:
            ordered = np.sort(x, axis=1)
            bad |= np.any(ordered[:, 1:] == ordered[:, :-1], axis=1)
        if bad.any():  # the first offending list, refused by the one per-list check with its message
            first = int(np.argmax(bad))
            check_drafted(self.verifier, self.law, x[first], self.q[x[first]])
        return x

    def _children_masses(self, rows: np.ndarray) -> np.ndarray:
        """``_children_mass`` of every row of validated int64 (M, k) children; float64 (M, k).
        Default: row by row (plans with a closed form override it with one vectorised call whose
        rows equal ``_children_mass`` bit for bit: tests)."""
        out = np.empty(rows.shape)
        for i, x in enumerate(rows):
            out[i] = self._children_mass(x)
        return out

    def children_masses(self, rows) -> np.ndarray:
        """``children_mass`` of M child lists of this node at once: row i of the float64 (M, k)
        result is ``children_mass(rows[i])`` bit for bit, the lists validated together
        (``check_children_rows``) and answered by one vectorised call for NSS, NaiveTree,
        SpecTr and SpecInfer (what a label grid asks of each node: the child lists of every
        tree of the grid that passes through it).

        Raises:
            ValueError: as ``check_children_rows``.
        """
        return self._children_masses(self.check_children_rows(rows))

    def output_distribution(self, children) -> np.ndarray:
        """Exact law of the output token given the ordered children; float64 (V,)."""
        return self._law(self.check_children(children))

    def children_mass(self, children) -> np.ndarray:
        """B(children, children[j]) = P(output = children[j] | children) for j = 1..k; float64 (k,)
        (a repeated child gets its token's whole mass at every copy).  Equal to
        ``output_distribution(children)[children]``; O(k) after ``prepare`` for NSS, NaiveTree,
        SpecTr, SpecInfer.

        Raises:
            ValueError: as ``check_children``.
        """
        return self._children_mass(self.check_children(children))

    def sample(self, children, rng: np.random.Generator) -> int:
        """Run the verification algorithm once; returns the output token id."""
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng: must be a numpy.random.Generator, got {type(rng).__name__}")
        return self._draw(self.check_children(children), rng)

    def marginal_output_distribution(self) -> np.ndarray:
        """sum_x Q(x) B(x, .) by exact enumeration of the children (drawn by the plan's ``law``);
        equals p iff lossless."""
        tuples, probs = child_tuples(self.q, self.k, self.law)
        out = np.zeros_like(self.p)
        for x, prob in zip(tuples, probs):
            out += prob * self._law(x)
        return out


class NodeVerifier(abc.ABC):
    """Base class of every node-level verifier (one per module, registered by ``name``).

    Attributes:
        name: registry name (``simlab.verifiers.get(name)``).
        drafting: the drafting law the node-level enumeration assumes (``acceptance_rate``,
            ``marginal_output_distribution``): the law the verifier is designed for.
        lossless_for: every drafting law for which sum_x Q(x) B(x, .) = p.
        needs_greedy_target: True when the verifier is lossless only for a one-hot target
            (temperature 0), whatever the drafting law.
        speculative_at_one: optional capability: True when, with one child, the law is
            speculative sampling's (the module docstring).
        branch_is_target: optional capability: True when B(x, .) = p for all children x (the
            module docstring).
        divides_by_q: True when the acceptance test divides by q at every child (SpecTr,
            SpecInfer), so a child with q = 0 is refused whatever its law (``check_drafted``).
        label: the name the papers and the studies' tables use (DDTE Tables 2-3: "SpecTr",
            "NaiveTree", ...); None: the registry name (``display_name``).
        ot_based: True for DDTE's OT-based verifiers of i.i.d. children (NSS, NaiveTree, SpecTr,
            SpecInfer, Khisti; DDTE Sec. 3), those the neural selector is trained for.
        exact_tuples: ``acceptance_rate(method="auto", rng=...)`` enumerates at most this many
            child tuples before it estimates instead (verifiers without a formula).
        exact_at_greedy_target: False for a declared-lossy rule that stays lossy at a one-hot
            target (T = 0), because it can accept a child the target never emits (DIVERSE); the
            generic temperature-0 tests skip it.

    A closed-form acceptance rate is found by override (``NodePlan.acceptance_formula``).
    """

    name: ClassVar[str]
    drafting: Drafting = Drafting.IID
    lossless_for: ClassVar[frozenset[Drafting]] = frozenset({Drafting.IID})
    needs_greedy_target: ClassVar[bool] = False
    speculative_at_one: ClassVar[bool] = False
    divides_by_q: ClassVar[bool] = False
    branch_is_target: ClassVar[bool] = False
    label: ClassVar[str | None] = None
    ot_based: ClassVar[bool] = False
    exact_tuples: ClassVar[int] = 2_000
    exact_at_greedy_target: ClassVar[bool] = True

    @classmethod
    def display_name(cls) -> str:
        """``label``, or the registry ``name`` when the class declares none."""
        return cls.label or cls.name

    def leaf_law(self, p: np.ndarray) -> np.ndarray:
        """The law of the bonus token at a leaf (no children) with target ``p`` (validated float64
        (V,)); float64 (V,).  Default: p itself (the bonus is a draw from p)."""
        return p.copy()

    def leaf_draw(self, p: np.ndarray, rng: np.random.Generator) -> int:
        """One bonus token at a leaf with target ``p``, from the law ``leaf_law(p)``; consumes
        ``rng`` as ``simlab.distributions.sample_categorical`` does (one uniform) by default."""
        return sample_categorical(p, rng)

    def for_law(self, law: Drafting) -> "NodeVerifier":
        """The verifier to run at a node whose children were drawn by ``law`` (itself by
        default; a verifier for mixed nodes runs the one-hot rule on all-deterministic ones)."""
        return self

    def is_lossless(self, law: Drafting, k: int) -> bool:
        """True when children of ``law`` (k of them) give the target law."""
        from simlab.drafting import lossless_pairing

        return lossless_pairing(self.lossless_for, law, k)

    @abc.abstractmethod
    def _plan(self, p: np.ndarray, q: np.ndarray, k: int) -> NodePlan:
        """Per-node precomputation on validated inputs."""

    def prepare(self, p, q, k: int, law: Drafting | None = None, *, checked: bool = False) -> NodePlan:
        """Validate ``p``, ``q`` (shape (V,)) and ``k`` and precompute the node's plan for children
        drawn by ``law`` (default: the verifier's ``drafting``).

        ``checked=True`` skips the validation of p and q for callers that already validated
        them (``simlab.trees.NodeTable`` checks each node's p and q once when it fetches them):
        they must be float64 (V,) arrays of one length that passed ``check_distribution``.

        Raises:
            ValueError: invalid probability vectors (see ``check_distribution``), lengths
                that differ, k not a positive integer, or a law that is not a ``Drafting``.
        """
        if not checked:
            p, q = check_pair(p, q)
        plan = self._plan(p, q, check_k(k))
        if law is not None:
            if not isinstance(law, Drafting):
                raise ValueError(f"law: must be a simlab.drafting.Drafting, got {law!r}")
            plan.law = law
        return plan

    def output_distribution(self, p, q, children) -> np.ndarray:
        """Exact law B(children, .) of the output token; float64 (V,), sums to 1.

        Raises:
            ValueError: invalid ``p``, ``q`` or ``children`` (see ``NodePlan.check_children``).
        """
        return self.prepare(p, q, _count(children)).output_distribution(children)

    def acceptance_rate(
        self, p, q, k: int, method: str = "auto", *, rng: np.random.Generator | None = None, samples: int = 32
    ) -> float:
        """Acceptance rate alpha = P(output in set(X)) for X ~ Q with k children.

        Args:
            method: as ``NodePlan.acceptance_rate``: ``"formula"``, ``"enumerate"`` or ``"auto"``.
                With ``"auto"`` and an ``rng``, a verifier without a formula is enumerated when
                at most ``exact_tuples`` child tuples exist (support of q to the k), otherwise
                estimated without bias: the mean over ``samples`` child tuples drawn from its
                ``drafting`` law with ``rng`` of the exact P(output in set(x) | x) (only the
                children are sampled).
            rng: the estimate's randomness (``"auto"`` only).
            samples: the estimate's number of child tuples (``"auto"`` only).

        Raises:
            ValueError: as ``NodePlan.acceptance_rate``; ``rng`` given with another method.
        """
        plan = self.prepare(p, q, k)
        if rng is None or method != "auto" or plan.has_formula() or int(np.count_nonzero(plan.q)) ** plan.k <= self.exact_tuples:
            if rng is not None and method != "auto":
                raise ValueError(f"rng: only method='auto' estimates, got method={method!r}")
            return plan.acceptance_rate(method)
        return float(
            np.mean(
                [
                    plan.output_distribution(x)[np.unique(x)].sum()
                    for x in (draw_children(plan.q, plan.k, self.drafting, rng) for _ in range(samples))
                ]
            )
        )

    def sample(self, p, q, children, rng: np.random.Generator) -> int:
        """Run the algorithm once with randomness from ``rng``; returns the output token id."""
        return self.prepare(p, q, _count(children)).sample(children, rng)


def _count(children) -> int:
    x = np.asarray(children)
    if x.ndim != 1:
        raise ValueError(f"children: must be a 1-D sequence of token ids, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(
            "children: k = 0; a node verifier needs at least one child (a leaf emits the bonus token: NodeVerifier.leaf_law)"
        )
    return int(x.size)
