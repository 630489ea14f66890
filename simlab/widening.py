"""Tree-widening gain from rank statistics, and rejection sampling against argmax matching, exactly.

Three questions an engine asks before building a draft tree or changing its acceptance rule:

* ``rank_statistics``: along the draft's greedy chain (at each node its rank-1 candidate), the
  law of the rank, among the draft's candidates, of the token the target picks at each position
  (llama.cpp PR 28110, ``LLAMA_MTP_TOPK_STATS``: "when the target rejects a draft token, how often
  is the token the target picked the head's rank-2 candidate?");
* ``widening_gains``: the exact gain in E[tau + 1] (bonus included) of adding the draft's rank-2..w
  candidates to that chain, at one position at a time or at every position;
* ``rejection_sampling_gain``: E[tau + 1] of a D-token chain under argmax drafting with exact
  matching against sampled drafting with speculative sampling, as a function of temperature
  (llama.cpp PR 27694).

Vocabulary (the module's conventions in full, and why each value is what it is:
``docs/derivations/widening.md``):

* **rank** r of a candidate at a node: its place in the ranking law (``draft_law``: ``"raw"``, the
  drafter's untempered law, the default; ``"setting"``, the pair's q), most probable first, ties to
  the lowest id, tokens with q > 0 only (``simlab.drafting.top_tokens``); the target's token is
  always drawn from the pair's p;
* **position** k = 1..D: the k-th drafted token of the **greedy chain** of depth D (the rank-1
  candidate at every node, ``Static([(0,), (0, 0), ...])`` on the ranking law);
* **widening** to width w: the rank-2..w candidates added as leaves at the parent of one position
  (``"one_position"``, each k in turn) or of every position (``"every_position"``).

Contract: every value is an exact E[tau + 1] (bonus included) of a built tree, verified by a tree
verifier lossless for deterministic trees at the pair's settings (default
``simlab.tree_verifiers.deterministic_rule``: ``greedy`` at T = 0, else ``onehot``); outputs are
lists of plain dict rows; a ``simlab.pairs.Rooted`` pair is rooted at the context's length, a
``simlab.trees.NodeTable`` is used as it is.  Sources: llama.cpp PR 28110 and PR 27694.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from simlab import tree_verifiers
from simlab.builders import Static, chain
from simlab.checks import check_bool, check_choice, check_int
from simlab.drafting import Drafting, top_tokens
from simlab.efficiency import expected_block_efficiency, lossless_over
from simlab.pairs import ModelPair, WithSettings, rooted
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

DRAFT_LAWS = ("raw", "setting")
"""What the draft's candidates are ranked by (module docstring), as the studies' ``--draft-law``."""

MODES = ("one_position", "every_position")
"""The widenings of ``widening_gains`` (module docstring)."""

PAIRINGS = (("argmax", "exact_match"), ("argmax", "onehot"), ("sampled", "naive"), ("sampled", "exact_match"))
"""The lossless (draft, verifier) pairings of ``rejection_sampling_gain``, baseline first."""

LOSSY_PAIRING = ("argmax", "naive")
"""The declared lossy pairing: the ratio test with the draft's q on a token that was not drawn from q."""


def _table(source, context) -> NodeTable:
    """A NodeTable at the root: the source itself, or a new one over the (rooted) pair."""
    if isinstance(source, NodeTable):
        if context is not None and tuple(context) != source.context:
            raise ValueError(f"context: a NodeTable has its own root {source.context}; pass None or that root, got {context!r}")
        return source
    if not isinstance(source, ModelPair):
        raise ValueError(
            f"source: must be a ModelPair (vocab_size, distributions) or a simlab.trees.NodeTable, got {type(source).__name__}"
        )
    if context is None:
        raise ValueError("context: a pair needs a root context (a sequence of token ids)")
    if isinstance(context, (str, bytes)) or not hasattr(context, "__len__"):
        raise ValueError(f"context: must be a sequence of token ids, got {context!r}")
    return NodeTable(rooted(source, len(context)), context)


def ranking_table(table: NodeTable, draft_law: str) -> NodeTable:
    """The table the draft's candidates are ranked on: ``table.untempered()`` for ``"raw"``, else ``table``.

    Raises:
        ValueError: ``draft_law: ...`` for a value not in ``DRAFT_LAWS``.
    """
    check_choice(draft_law, "draft_law", DRAFT_LAWS, "draft law")
    return table.untempered() if draft_law == "raw" else table


def greedy_chain(ranking: NodeTable, depth: int) -> list[tuple[int, ...]]:
    """The parents of positions 1..``depth`` on the draft's greedy chain: ``[(), (c_1,), (c_1, c_2), ...]``
    (c_k the rank-1 candidate of the ranking table's q at the k-th; ``top_tokens``), fetched one level at a time."""
    paths: list[tuple[int, ...]] = [()]
    for _ in range(depth - 1):
        ranking.fetch([paths[-1]])
        paths.append(paths[-1] + (int(top_tokens(ranking.q(paths[-1]), 1)[0]),))
    ranking.fetch([paths[-1]])
    return paths


def rank_statistics(source, context: Sequence[int] | None, depth: int, ranks: int = 8, *, draft_law: str = "raw") -> list[dict]:
    """The law of the rank of the target's token among the draft's candidates, per position of the greedy chain.

    For position k = 1..``depth`` (parent: the chain node of k - 1 tokens, reached with
    probability R_k = p_1(c_1) ... p_{k-1}(c_1), the product of p at the chain's tokens; 0 below an
    EOS on the chain, where decoding ends) and rank
    r = 1..min(``ranks``, number of tokens with q > 0 there), with c_r the draft's rank-r
    candidate and Y ~ p the target's token there (module docstring for the rank rule):

    * ``p`` = P(Y = c_r | reached): the unconditional rank histogram of the position (PR 28110's
      histogram, over the steps that reached the position); r = 1 is the chain's acceptance rate;
    * ``conditional`` = P(Y = c_r | reached, Y not among c_1..c_{r-1}) = p(c_r) / (1 - p(c_1..c_{r-1})):
      r = 2 is PR 28110's "rank-2 given rejection"; NaN where the ranks above hold all of p's mass
      (e.g. a greedy target whose argmax is among them);
    * ``beyond`` = P(Y not among c_1..c_r | reached);
    * ``joint`` = R_k p(c_r): the probability, per verification step, that the chain reaches the
      position and the target picks c_r there (the per-step gain of adding c_r as a leaf).

    Args:
        source: a ``simlab.pairs.ModelPair`` (rooted at ``len(context)`` when ``Rooted``) or a
            ``simlab.trees.NodeTable`` (then ``context`` is None or its root).
        context: the root context (token ids).
        depth: D >= 1, the chain's length.
        ranks: R >= 1, the most ranks reported per position.
        draft_law: ``"raw"`` or ``"setting"``, the ranking law (module docstring).

    Returns:
        One dict per (position, rank): ``position``, ``rank``, ``token`` (int), ``q`` (the ranking
        law's probability of the candidate), ``reach`` (R_k), ``p``, ``conditional``, ``beyond``,
        ``joint`` (floats, float64 arithmetic).

    Raises:
        ValueError: naming ``source``, ``context``, ``depth``, ``ranks`` or ``draft_law``.
    """
    depth = check_int(depth, "depth", 1)
    ranks = check_int(ranks, "ranks", 1)
    table = _table(source, context)
    ranking = ranking_table(table, draft_law)
    parents = greedy_chain(ranking, depth)
    table.fetch(parents)
    rows: list[dict] = []
    reach = 1.0
    for k, parent in enumerate(parents, start=1):
        p, q = table.p(parent), ranking.q(parent)
        candidates = top_tokens(q, min(ranks, int(np.count_nonzero(q))))
        above = 0.0
        for r, token in enumerate(candidates.tolist(), start=1):
            left = 1.0 - above
            mass = float(p[token])
            rows.append(
                {
                    "position": k,
                    "rank": r,
                    "token": int(token),
                    "q": float(q[token]),
                    "reach": reach,
                    "p": mass,
                    "conditional": mass / left if left > 0.0 else float("nan"),
                    "beyond": max(left - mass, 0.0),
                    "joint": reach * mass,
                }
            )
            above += mass
        reach = 0.0 if int(candidates[0]) == table.eos_id else reach * float(p[candidates[0]])
    return rows


def _settings_of(table: NodeTable):
    settings = getattr(table.pair, "settings", None)
    return settings if isinstance(settings, SamplingSettings) else None


def _deterministic_verifier(verifier, settings) -> str:
    """The verifier for deterministic trees: the default rule, or a named one lossless for them."""
    basis = settings if settings is not None else SamplingSettings(1.0)  # unknown settings: a sampled target
    if verifier is None:
        return tree_verifiers.deterministic_rule(basis)
    allowed = tree_verifiers.lossless_names({Drafting.DETERMINISTIC}, basis)
    if not isinstance(verifier, str) or verifier not in allowed:
        raise ValueError(
            f"verifier: must be one of {', '.join(allowed)} (lossless for deterministic trees at {basis.name}), got {verifier!r}"
        )
    return verifier


def _chain_spec(depth: int) -> list[tuple[int, ...]]:
    return [(0,) * k for k in range(1, depth + 1)]


def _widened(depth: int, width: int, positions: Sequence[int]) -> list[tuple[int, ...]]:
    """The chain with rank-2..w leaves below the chain nodes at ``positions`` (rank tuples)."""
    return _chain_spec(depth) + [(0,) * (k - 1) + (r,) for k in positions for r in range(1, width)]


def widening_gains(
    source,
    context: Sequence[int] | None,
    depth: int,
    widths: Sequence[int] = (2, 3),
    *,
    modes: Sequence[str] = MODES,
    verifier: str | None = None,
    draft_law: str = "raw",
) -> list[dict]:
    """The exact gain in E[tau + 1] of widening the greedy chain of ``depth`` tokens.

    Why each gain is what it is: ``docs/derivations/widening.md``.

    Each value is the exact E[tau + 1] of the ``Static`` tree (top-k children of the ranking law,
    read back on the setting's table) verified by ``verifier``; the chain's own value is in every row.

    Args:
        source: as ``rank_statistics``.
        context: as ``rank_statistics``.
        depth: D >= 1.
        widths: each w >= 2 (the candidates kept at a widened node, the chain's own included).
        modes: a non-empty subset of ``MODES``.
        verifier: a tree-verifier name lossless for deterministic trees at the pair's settings
            (``lossless_names``; a pair without ``settings`` counts as T > 0); None: ``greedy``
            at T = 0, else ``onehot`` (``deterministic_rule``).
        draft_law: ``"raw"`` or ``"setting"``, the ranking law (module docstring).

    Returns:
        One dict per (mode, position, width): ``mode``, ``position`` (k; None for
        ``"every_position"``), ``width``, ``tokens`` (draft tokens of the tree), ``verifier``,
        ``chain`` (E[tau + 1] of the chain), ``value`` (of the widened tree), ``gain``
        (value - chain), ``lossless`` (the ``Estimate``'s flag).

    Raises:
        ValueError: naming ``source``, ``context``, ``depth``, ``widths``, ``modes``, ``verifier``
            or ``draft_law``; ``widths`` also when a widened node has fewer than w tokens with q > 0
            under the ranking law.
    """
    depth = check_int(depth, "depth", 1)
    if isinstance(widths, (str, bytes)) or not hasattr(widths, "__iter__") or not list(widths):
        raise ValueError(f"widths: must be a non-empty sequence of integers >= 2, got {widths!r}")
    widths = [check_int(w, "widths", 2) for w in widths]
    if isinstance(modes, str) or not hasattr(modes, "__iter__") or not list(modes) or set(modes) - set(MODES):
        raise ValueError(f"modes: must be a non-empty subset of {MODES}, got {modes!r}")
    table = _table(source, context)
    verifier = _deterministic_verifier(verifier, _settings_of(table))
    ranking = ranking_table(table, draft_law)
    rule = tree_verifiers.get(verifier)
    parents = greedy_chain(ranking, depth)
    support = [int(np.count_nonzero(ranking.q(parent))) for parent in parents]
    if max(widths) > min(support):
        k = int(np.argmin(support)) + 1
        raise ValueError(f"widths: width {max(widths)} needs that many tokens with q > 0 at position {k}, q has {min(support)}")

    def value(spec):
        tree = Static(spec).sample(ranking).on(table)
        return rule.expected_block_efficiency(tree), lossless_over(rule, [tree])

    base, base_lossless = value(_chain_spec(depth))
    rows: list[dict] = []
    for mode in [m for m in MODES if m in modes]:
        groups = [(k, [k]) for k in range(1, depth + 1)] if mode == "one_position" else [(None, list(range(1, depth + 1)))]
        for k, positions in groups:
            for w in widths:
                spec = _widened(depth, w, positions)
                mean, lossless = value(spec)
                rows.append(
                    {
                        "mode": mode,
                        "position": k,
                        "width": w,
                        "tokens": len(spec),
                        "verifier": verifier,
                        "chain": base,
                        "value": mean,
                        "gain": mean - base,
                        "lossless": lossless and base_lossless,
                    }
                )
    return rows


def _temperatures(temperatures) -> list[float]:
    if isinstance(temperatures, (str, bytes)) or not hasattr(temperatures, "__iter__"):
        raise ValueError(f"temperatures: must be a non-empty sequence of temperatures >= 0, got {temperatures!r}")
    out = list(temperatures)
    if not out:
        raise ValueError("temperatures: must be a non-empty sequence of temperatures >= 0, got none")
    for t in out:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)) or not t >= 0:
            raise ValueError(f"temperatures: each must be a number >= 0, got {t!r}")
    return [float(t) for t in out]


def rejection_sampling_gain(
    pair, context: Sequence[int], depth: int, temperatures: Sequence[float] | None, *, lossy: bool = False
) -> list[dict]:
    """E[tau + 1] of a ``depth``-token chain under each (draft, verifier) pairing at each temperature (PR 27694).

    The pair is re-tempered with ``pair.with_settings`` (its top-k and top-p kept, the
    temperature replaced; the same transform on p and q, as ``SamplingSettings``), rooted at the
    context's length when ``Rooted``; with ``temperatures=None`` the pair is valued as it is, one
    set of rows (a pair that cannot be re-tempered: ``MarkovPair``, a capture, which holds q under
    its own setting only).  The argmax chain is the same under every temperature, top-k and top-p
    (they keep q's order).  Pairings: ``PAIRINGS`` (lossless), and ``LOSSY_PAIRING``
    with ``lossy=True`` (its rows have ``lossless`` False; ``simlab.efficiency.pairing_bias``
    gives its bias).  At T = 0, p and q are one-hot and every pairing has the same value.

    Args:
        pair: a model pair; with a grid, a ``simlab.pairs.WithSettings`` one whose ``settings`` is a
            ``SamplingSettings``.
        context: the root context (token ids).
        depth: D >= 1.
        temperatures: the grid, each T >= 0; None: the pair's own setting only.
        lossy: include the lossy pairing.

    Returns:
        One dict per (temperature, pairing): ``temperature`` and ``setting`` (its name; None for a
        pair without ``SamplingSettings`` valued as it is), ``draft``
        (``"argmax"`` or ``"sampled"``), ``verifier``, ``lossless``, ``value`` (E[tau + 1]),
        ``gain`` (value / the argmax, exact_match value at that temperature), ``trees`` (the
        chains enumerated).

    Raises:
        ValueError: naming ``pair``, ``context``, ``depth``, ``temperatures`` or ``lossy``; the
            lab's enumeration limit (``simlab.builders.MAX_TREES``) for a sampled chain with too
            many outcomes.
    """
    depth = check_int(depth, "depth", 1)
    lossy = check_bool(lossy, "lossy")
    if not isinstance(pair, ModelPair):
        raise ValueError(f"pair: must implement the ModelPair protocol (vocab_size, distributions), got {type(pair).__name__}")
    own = getattr(pair, "settings", None)
    own = own if isinstance(own, SamplingSettings) else None
    if temperatures is None:
        grid = [(own, pair)]
    else:
        temperatures = _temperatures(temperatures)
        if own is None or not isinstance(pair, WithSettings):
            raise ValueError(
                f"pair: a temperature grid needs settings (a SamplingSettings) and with_settings, got {type(pair).__name__}; "
                "pass temperatures=None to value it as it is"
            )
        grid = [(s, pair.with_settings(s)) for s in (dataclasses.replace(own, temperature=t) for t in temperatures)]
    if isinstance(context, (str, bytes)) or not hasattr(context, "__len__"):
        raise ValueError(f"context: must be a sequence of token ids, got {context!r}")
    shapes = {"argmax": Static(_chain_spec(depth)), "sampled": chain(depth)}
    pairings = list(PAIRINGS) + ([LOSSY_PAIRING] if lossy else [])
    rows: list[dict] = []
    for settings, source in grid:
        tempered = rooted(source, len(context))
        table = NodeTable(tempered, context)  # one per setting: every pairing reads its nodes
        values = {}
        for draft, name in pairings:
            lossy_pairing = (draft, name) == LOSSY_PAIRING
            est = expected_block_efficiency(tempered, context, shapes[draft], name, allow_lossy=lossy_pairing, table=table)
            values[(draft, name)] = est
        base = values[PAIRINGS[0]].mean
        for draft, name in pairings:
            est = values[(draft, name)]
            rows.append(
                {
                    "temperature": None if settings is None else settings.temperature,
                    "setting": None if settings is None else settings.name,
                    "draft": draft,
                    "verifier": name,
                    "lossless": est.lossless,
                    "value": est.mean,
                    "gain": est.mean / base,
                    "trees": est.samples,
                }
            )
    return rows


__all__ = [
    "DRAFT_LAWS",
    "LOSSY_PAIRING",
    "MODES",
    "PAIRINGS",
    "greedy_chain",
    "rank_statistics",
    "ranking_table",
    "rejection_sampling_gain",
    "widening_gains",
]
