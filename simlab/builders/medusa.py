"""Medusa's static trees (Cai et al. 2024) over a parallel drafter's per-position top-k.

A Medusa tree is a list of index paths (``medusa_choices``): the node (r_1, ..., r_d) holds the
r_d-th most probable token of head d, the head that predicts position d below the root, whatever
its parent's token (FasterDecoding/Medusa@e2a5d20 ``medusa/model/utils.py::generate_medusa_buffers``,
``tree_indices = r_d + TOPK (d - 1) + 1``, and ``generate_candidates``, ``torch.topk`` of each
head).  Over a parallel drafter (``simlab.pairs.ParallelDraft``: row d - 1 of its
per-position distributions is head d) the children of a node of depth d are the top tokens of
row d, so the law is ``Drafting.DETERMINISTIC`` (a function of the root) and the lossless
verifiers are those of deterministic trees (one-hot, NSS, greedy at T = 0).  Medusa's own
verification at T > 0 is typical acceptance, which is not lossless: the lab has no such rule
(``docs/departures.md``).

``CHOICES`` holds the official trees the lab reproduces as configuration data (same source):
``mc_sim_7b_63``, the default of Medusa's evaluation scripts (``llm_judge/gen_model_answer_medusa.py``),
63 nodes, depth 4, grown greedily by simulated acceptance, so each of its prefixes is a tree;
``budget=B`` keeps its first B entries (matched budgets).  Ranks: the lab's top tokens have
q > 0, ties to the lowest id (Medusa leaves ties to ``torch.topk``).  Cost: one draft forward
(``simlab.builders.parallel``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from simlab.builders.parallel import parallel_tree, position_rows
from simlab.checks import check_int
from simlab.drafting import Drafting, top_tokens
from simlab.trees import DraftTree, NodeTable, parse_tuples, rank_paths

# fmt: off
CHOICES: dict[str, tuple[tuple[int, ...], ...]] = {
    # FasterDecoding/Medusa@e2a5d20 medusa/model/medusa_choices.py::mc_sim_7b_63 (configuration data, as published)
    "mc_sim_7b_63": tuple(tuple(c) for c in [
        [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5], [0, 0, 1],
        [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9], [1, 0, 0],
        [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1], [0, 0, 6],
        [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0], [0, 1, 2],
        [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0], [0, 0, 0, 1],
        [1, 6], [0, 7, 0],
    ]),
}
# fmt: on


@dataclass(frozen=True)
class Medusa:
    """A Medusa tree over a parallel drafter (module docstring).

    Args:
        choices: a name in ``CHOICES`` or index paths (tuple notation, ``simlab.trees.parse_tuples``).
        budget: keep the first ``budget`` paths (None: all); the kept ones must form a tree.

    Raises:
        ValueError: ``choices: ...`` for an unknown name or paths that are no tree; ``budget: ...``
            out of [1, len(choices)].
    """

    choices: object = "mc_sim_7b_63"
    budget: int | None = None

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = True
    parallel_draft: ClassVar[bool] = True

    @classmethod
    def example(cls, vocab_size: int = 4) -> "Medusa":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(((0,), (1,), (0, 0), (1, 0)))

    def __post_init__(self):
        if isinstance(self.choices, str):
            if self.choices not in CHOICES:
                raise ValueError(f"choices: unknown Medusa tree {self.choices!r}; choose one of {', '.join(CHOICES)}")
            paths = CHOICES[self.choices]
        else:
            try:
                paths = rank_paths(self.choices)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"choices: a name or a sequence of index paths, got {self.choices!r} ({exc})") from None
            object.__setattr__(self, "choices", paths)
        if not paths:
            raise ValueError("choices: a Medusa tree needs at least one path")
        budget = len(paths) if self.budget is None else check_int(self.budget, "budget", 1, len(paths))
        try:
            parse_tuples(paths[:budget])
        except ValueError as exc:
            raise ValueError(f"choices: the first {budget} paths are no tree ({exc})") from None
        object.__setattr__(self, "budget", budget)

    @property
    def spec(self) -> tuple[tuple[int, ...], ...]:
        """The kept index paths."""
        paths = CHOICES[self.choices] if isinstance(self.choices, str) else self.choices
        return paths[: self.budget]

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used).

        Raises:
            ValueError: ``pair: ...`` for a pair that is not a parallel drafter; ``k: ...`` when a
                head has fewer tokens with q > 0 than the tree ranks.
        """
        spec = self.spec
        depth = max(len(node) for node in spec)
        rows = position_rows(table, depth, "Medusa")
        width = [1 + max(node[-1] for node in spec if len(node) == d + 1) for d in range(depth)]
        heads = [top_tokens(rows[d], width[d]) for d in range(depth)]
        children: dict[tuple[int, ...], list[int]] = {}
        for node in sorted(spec, key=lambda n: (len(n), n)):
            parent = tuple(int(heads[i][r]) for i, r in enumerate(node[:-1]))
            children.setdefault(parent, []).append(int(heads[len(node) - 1][node[-1]]))
        return parallel_tree(table, {path: tuple(kids) for path, kids in children.items()}, rows)

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        yield self.sample(table), 1.0
