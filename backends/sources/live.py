"""Roots along target continuations of prompts, with p and q from two live models (``backends.hf.HFPair``):
two model folders, or a named pretrained pair (``backends.pretrained``, ``--pair``).

Prompt i (the first ``trajectories`` of the prompt file; default the shipped reference prompts)
is continued by the target with ``seeded_rng(seed, Stream.PROMPT, i)``; roots sit at the prompt's end and
every ``spacing`` tokens after it (``backends.roots.prompt_roots``), exactly as the capture tool
places them, so a live run and a replayed capture of the same settings see the same roots.

A root's node table (``table``, ``Root.table()``) evaluates each tree node once on the root's
context prefilled once (``evaluation="cached"``: ``backends.tree_cache.RootCache``), or runs the
pair's tree forward per fetch (``"plain"``, the reference); the values agree to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from backends.hf import check_model_folder
from backends.latency_probe import measure
from backends.pretrained import linear_weights, open_pair, parse_draft, precision_ratio
from backends.roots import SHIPPED_PROMPTS, RootPlacement, prompt_roots, prompt_texts, read_prompt_records
from backends.sources.base import Root, register_source, slug
from backends.tree_cache import EVALUATIONS, node_table
from simlab.checks import check_int, check_seed
from simlab.pairs import TRAJECTORY_METHODS
from simlab.sampling import SamplingSettings


def check_models(target: str | None, draft: str | None, pair: str | None = None) -> None:
    """Check the models ``HFSource`` would load, without loading them: a named ``pair`` and no
    ``target``, or both ``target`` and ``draft``, each a hub id or a local model folder with a
    ``config.json`` (``backends.hf.check_model_folder``).

    Raises:
        ValueError: ``target: ...`` or ``draft: ...``.
    """
    if pair and target:
        raise ValueError("target: a named pair brings its own target; give --pair or --target, not both")
    for name, value in (("target", target), ("draft", draft)):
        if not pair and not value:
            raise ValueError(f"{name}: --backend hf needs --target and --draft (or --pair)")
    if not pair:
        check_model_folder(str(target), "target")
        check_model_folder(str(draft), "draft")


@register_source("hf")
class HFSource:
    """Live Hugging Face models (see the module docstring).

    Args:
        target, draft: model folders or hub ids.
        prompts: prompt file (text or .jsonl) or prompt set (``backends.prompt_sets``); None = the
            shipped reference prompts.  Chat prompts are wrapped in the target's chat template;
            each root carries its prompt's category.
        trajectories: how many prompts to use, from the top of the file (None: all).
        roots_per_trajectory, spacing: root placement along each continuation.
        depth: the deepest tree a study will draw below a root (checked against the context).
        seed: seed of the continuations.
        device, dtype: of the models.
        evaluation: how ``table`` evaluates a root's nodes: ``"cached"`` (kept KV caches, each
            node once per table) or ``"plain"`` (the pair's tree forward per fetch; ``EVALUATIONS``).
        pair: a named pair (``backends.pretrained.PAIRS``) instead of ``target``; ``draft`` is then
            its draft spec (``early-exit:L``, ``adapter:L``, ``quant:B:G``; None: the pair's default).
        trajectory: how the continuations' target p is evaluated (``simlab.pairs.target_trajectory``,
            ``TRAJECTORY_METHODS``): ``"cached"`` (the target's KV cache, one prefill per prompt,
            the capture tool's default) or ``"forward"`` (the whole context at every token, the
            reference).

    Each setting's root contexts are kept when its last root is yielded: ``roots`` called again
    under the same settings (as a sharded run's merge does) samples nothing.

    Raises:
        ValueError: ``target: ...``, ``draft: ...``, ``prompts: ...``, ``device: ...``,
            ``dtype: ...``, ``evaluation: ...``, ``trajectory: ...``, or a bad placement or seed.
    """

    honours: ClassVar[frozenset[str]] = frozenset(
        {
            "pair",
            "target",
            "draft",
            "prompts",
            "trajectories",
            "roots_per_trajectory",
            "spacing",
            "seed",
            "device",
            "dtype",
            "settings",
            "evaluation",
            "trajectory",
        }
    )

    def __init__(
        self,
        target: str,
        draft: str,
        prompts: str | None = None,
        trajectories: int | None = None,
        roots_per_trajectory: int = 2,
        spacing: int = 16,
        depth: int = 16,
        seed: int = 0,
        device: str = "auto",
        dtype: str = "float32",
        pair: str | None = None,
        evaluation: str = "cached",
        trajectory: str = "cached",
    ):
        if evaluation not in EVALUATIONS:
            raise ValueError(f"evaluation: must be one of {', '.join(EVALUATIONS)}, got {evaluation!r}")
        if trajectory not in TRAJECTORY_METHODS:
            raise ValueError(f"trajectory: must be one of {', '.join(TRAJECTORY_METHODS)}, got {trajectory!r}")
        self.evaluation, self.trajectory = evaluation, trajectory
        self._contexts: dict[SamplingSettings, list[tuple]] = {}
        check_models(target, draft, pair)
        self.target, self.draft = (pair, parse_draft(draft, pair)) if pair else (target, draft)
        self.named_pair = pair or None
        self.placement = RootPlacement(roots_per_trajectory, spacing, first=0)
        self.depth = check_int(depth, "depth", 0)
        self.seed = check_seed(seed)
        records = read_prompt_records(prompts or SHIPPED_PROMPTS)
        records = records[: check_int(trajectories, "trajectories", 1)] if trajectories is not None else records
        self.pair = open_pair(pair, target, draft, device=device, dtype=dtype)
        self.texts = prompt_texts(self.pair, records)  # chat prompts in the target's template
        self.categories = [r.category for r in records]

    def describe(self) -> str:
        return f"{self.target} / {self.draft}"

    def draft_weight_ratio(self) -> float | None:
        """Weight bytes the draft reads per token over the target's (``backends.pretrained.linear_weights``
        times ``precision_ratio``: a quantised self-draft reads fewer bits per weight) on a named pair,
        else None: how a published GPU profile times this pair's draft."""
        if not self.named_pair:
            return None
        return linear_weights(self.pair.draft) / linear_weights(self.pair.target) * precision_ratio(self.draft)

    def slug(self) -> str:
        return slug(f"hf-{Path(self.target).name}-{Path(self.draft).name}")

    def fixed_settings(self) -> None:
        return None

    def latency(self, largest_tree: int):
        """A warm-up benchmark of the two models on this machine (``backends.latency_probe``),
        sized to trees of ``largest_tree`` tokens and the model's context."""
        largest = 1 + largest_tree  # the target's forward over the root and the biggest tree
        tokens = tuple(sorted({n for n in (1, 4, 16, largest) if n <= largest}))
        room = (self.pair.max_context or 10**9) - 1  # positions are depths: only the prefix must fit
        contexts = tuple(c for c in (16, 64, 256) if c <= room) or (max(1, room),)
        return measure(self.pair, contexts=contexts, tokens=tokens)

    def table(self, root: Root):
        """``root``'s ``simlab.trees.NodeTable`` under this source's ``evaluation``
        (``backends.tree_cache.node_table``): on a ``RootCache`` of ``root.context`` for
        ``"cached"``, on ``root.pair`` for ``"plain"``."""
        return node_table(root.pair, root.context, self.evaluation)

    def count(self, settings: SamplingSettings) -> int:
        return len(self.texts) * self.placement.roots_per_trajectory

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        pair = self.pair.with_settings(settings)
        for root, prompt, context, length in self._placed(pair, settings):
            yield Root(
                settings.name,
                prompt,
                root,
                context,
                pair,
                prompt_length=length,
                category=self.categories[prompt],
                offset=len(context) - length,
                source=self,
            )

    def _placed(self, pair, settings: SamplingSettings) -> Iterator[tuple]:
        """``(root id, prompt, context, prompt length)`` of every root under ``settings``: sampled
        (``prompt_roots``) the first time, kept when the last root is yielded."""
        if settings in self._contexts:
            yield from self._contexts[settings]
            return
        placed, total = [], self.count(settings)
        for entry in prompt_roots(pair, self.texts, self.placement, self.seed, self.depth, True, self.trajectory):
            placed.append(entry)
            if len(placed) == total:
                self._contexts[settings] = placed
            yield entry
