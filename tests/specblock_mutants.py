"""Planted faults in the SpecBlock pieces; test_specblock_mutants.py proves each check catches its fault."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simlab.drafting import Drafting
from simlab.latency import DraftCost
from simlab.specblock import RankGuided
from simlab.specblock import builder as specblock_builder
from simlab.specblock.bandit import CostAwareBandit
from simlab.trees import DraftTree


@dataclass(frozen=True)
class CapsIgnored(RankGuided):
    """The probability caps of the shipped default are not applied to slots >= 1."""

    def widths(self, block, first):
        return RankGuided(self.drafter, table=self.table, adaptive_slot0=self.adaptive_slot0, adaptive_all=False,
                          rank_head=self.rank_head, fixed_width=self.fixed_width, beam_width=self.beam_width).widths(block, first)


class _NodeScored(specblock_builder._Growth):
    def _prune(self):
        """Prunes by each node's own log q instead of the cumulative score (ancestors may go)."""
        own = {p: self.score[p] - self.score[p[:-1]] for p in self.score if p}
        ranked = sorted(own, key=lambda p: (-own[p], self.order[p]))[: self.b.budget]
        children = {}
        for path in sorted(ranked, key=lambda p: self.order[p]):
            children[path[:-1]] = children.get(path[:-1], ()) + (path[-1],)
        return DraftTree(self.table, children, Drafting.DETERMINISTIC, cost=DraftCost(tuple(self.forwards), len(ranked)))


@dataclass(frozen=True)
class PrunedByNodeLogProb(RankGuided):
    def build(self, table):
        growth = _NodeScored(self, table)
        return growth.tree(), growth.origin


class _SiblingsBelow(specblock_builder._Growth):
    def _add(self, parent, token, logprob):
        """Alternatives hang below the previous greedy node's greedy child (one level too deep)."""
        kids = [node[-1] for node in sorted(self.order, key=self.order.get) if node and node[:-1] == parent]
        if kids and int(token) != kids[0]:
            parent = parent + (kids[0],)
        return super()._add(parent, token, logprob)


@dataclass(frozen=True)
class SiblingsOneLevelDown(RankGuided):
    def build(self, table):
        growth = _SiblingsBelow(self, table)
        return growth.tree(), growth.origin


def mask_including_the_slot(correct):
    """Slot k counts only if slots 0..k (itself included) are correct."""
    return torch.cumprod(correct.float(), dim=1)


def zero_based_rank_labels(logits, tokens):
    """Ranks counted from 0, so rank 1 lands in class 0 but rank 4 in class 2."""
    from simlab.specblock.rank import EDGES

    value = logits.gather(-1, tokens[..., None])
    rank = (logits > value).sum(-1)
    return torch.bucketize(rank, torch.tensor(EDGES), right=False)


@dataclass
class CostBlindBandit(CostAwareBandit):
    """Chooses by the estimated gain alone."""

    def value(self, arm, throughput, seconds):
        return self.gains.get(arm, 0.0)


SPECBLOCK_MUTANTS = {
    "caps ignored": ("widths", CapsIgnored),
    "pruned by the node's own log q": ("pruning", PrunedByNodeLogProb),
    "siblings one level down": ("block one", SiblingsOneLevelDown),
    "valid prefix includes the slot": ("valid prefix", mask_including_the_slot),
    "zero-based rank labels": ("rank labels", zero_based_rank_labels),
    "cost-blind bandit": ("bandit costs", CostBlindBandit),
}
