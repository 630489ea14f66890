"""Planted faults in the SpecBlock pieces; test_specblock_mutants.py proves each check catches its fault."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simlab.specblock import RankGuided
from simlab.specblock import builder as specblock_builder
from simlab.specblock.bandit import CostAwareBandit


@dataclass(frozen=True)
class CapsIgnored(RankGuided):
    """The probability caps of the shipped default are not applied to slots >= 1."""

    def widths(self, block, first):
        return RankGuided(
            self.drafter,
            table=self.table,
            adaptive_slot0=self.adaptive_slot0,
            adaptive_all=False,
            rank_head=self.rank_head,
            fixed_width=self.fixed_width,
            beam_width=self.beam_width,
        ).widths(block, first)


class _NodeScored(specblock_builder._Growth):
    def kept(self):
        """Prunes by each node's own log q instead of the cumulative score (ancestors may go)."""
        own = [self.score[n] - (self.score[self.parent[n]] if self.parent[n] >= 0 else 0.0) for n in range(len(self.path))]
        return sorted(sorted(range(len(own)), key=lambda n: (-own[n], n))[: self.b.budget])


@dataclass(frozen=True)
class PrunedByNodeLogProb(RankGuided):
    def _growth(self, table):
        return _NodeScored(self, table)


class _SiblingsBelow(specblock_builder._Growth):
    def _add(self, parent, token, logprob):
        """Alternatives hang below the previous greedy node's greedy child (one level too deep)."""
        kids = [n for n in range(len(self.path)) if self.parent[n] == parent]
        if kids and int(token) != self.token[kids[0]]:
            parent = kids[0]
        return super()._add(parent, token, logprob)


@dataclass(frozen=True)
class SiblingsOneLevelDown(RankGuided):
    def _growth(self, table):
        return _SiblingsBelow(self, table)


class _SeedsCapped(specblock_builder._Growth):
    def _chosen(self, pending):
        """Only the best beam_width seeds per depth get a block (the lab's earlier reading)."""
        return self._seeds(pending)


class _MergedWhileGrowing(specblock_builder._Growth):
    def _add(self, parent, token, logprob):
        """A re-drafted sibling reuses the existing node (a trie while growing): duplicates lost."""
        path = (self.path[parent] if parent >= 0 else ()) + (int(token),)
        return self.index[path] if path in self.index else super()._add(parent, token, logprob)


@dataclass(frozen=True)
class SeedsCappedPerDepth(RankGuided):
    def _growth(self, table):
        return _SeedsCapped(self, table)


@dataclass(frozen=True)
class DuplicatesMergedWhileGrowing(RankGuided):
    def _growth(self, table):
        return _MergedWhileGrowing(self, table)


@dataclass(frozen=True)
class ChainCutAtValidLength(RankGuided):
    """Later blocks stop at the rank walk's valid length."""

    def widths(self, block, first, whole=False):
        widths = super().widths(block, first, whole)
        return widths if first else widths[: self.valid_length(block)]


@dataclass(frozen=True)
class HitchhikerDespiteGiveUp(RankGuided):
    """g_{K-1} is a seed even when the rank walk gives up."""

    @staticmethod
    def gives_up(block):
        return False


@dataclass(frozen=True)
class PrunedThenMergedByDefault(RankGuided):
    """The default prunes with the copies counted and merges them only in the trie (the official
    non-default ``_prune_tree_np`` path) where the shipped GPU finalize merges before pruning."""

    @property
    def merges(self):
        return None if self.duplicates == "official" else super().merges


@dataclass(frozen=True)
class TiedCopiesMerged(RankGuided):
    """The default merge also merges copies tied at the best score (``duplicates="merge"``), which
    the kernel's strict comparison keeps."""

    @property
    def merges(self):
        rule = super().merges
        return "merge" if rule == "merge_strict" and self.duplicates == "official" else rule


class _SeedBySeed(specblock_builder._Growth):
    def _blocks(self, seeds, blocks, first):
        """Each block's chain and alternatives are created together, seed after seed (the lab's
        earlier creation order): ties and merge winners follow another order."""
        pending = []
        for seed, block in zip(seeds, blocks):
            pending += super()._blocks([seed], [block], first)
        return pending


@dataclass(frozen=True)
class BlocksCreatedSeedBySeed(RankGuided):
    def _growth(self, table):
        return _SeedBySeed(self, table)


def _block_losses(
    logits,
    ranks,
    target_p,
    corpus,
    valid_prefix,
    budget,
    rank_on,
    *,
    mask_tokens=None,
    rank_chain=None,
    distance=True,
    weights=None,
):
    """The official block losses with one piece replaced (the planted faults below)."""
    from backends.block_drafter.model import rank_labels, valid_prefix_mask
    from backends.block_drafter.train import class_budget_weights, distance_weights, draft_loss, ordinal_targets

    target_argmax = target_p.argmax(-1)
    tokens = target_argmax if mask_tokens is None else mask_tokens
    mask = (valid_prefix_mask(logits.argmax(-1) == tokens) if valid_prefix else torch.ones(logits.shape[:2])).to(logits.dtype)
    labels, predicted = rank_labels(logits, target_argmax), ranks.argmax(-1)
    chain = (valid_prefix_mask(predicted == labels) if rank_chain is None else rank_chain).to(logits.dtype)
    weight = (weights or class_budget_weights)(labels, chain, budget)
    ce = -(ordinal_targets(labels, logits.dtype) * torch.log_softmax(ranks, -1)).sum(-1)
    dist = distance_weights(labels, predicted, logits.dtype) if distance else 1.0
    return draft_loss(logits, target_p, mask), (ce * dist * weight).sum() / weight.sum()


def draft_mask_on_the_corpus_token(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on):
    """The draft loss's chain mask checks the corpus token instead of the target's argmax."""
    return _block_losses(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on, mask_tokens=corpus)


def rank_loss_under_the_draft_mask(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on):
    """The rank loss counts the draft loss's chain (draft argmax right) instead of its own (rank head right)."""
    from backends.block_drafter.model import valid_prefix_mask

    chain = valid_prefix_mask(logits.argmax(-1) == target_p.argmax(-1))
    return _block_losses(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on, rank_chain=chain)


def rank_loss_without_the_distance_weight(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on):
    """Every rank error weighs the same."""
    return _block_losses(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on, distance=False)


def rank_loss_with_unbounded_class_weights(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on):
    """Class weights budget / count without the cap at 1."""
    import torch.nn.functional as F

    def weights(labels, mask, budget):
        counts = (F.one_hot(labels, 4).to(mask.dtype) * mask[..., None]).sum(0)
        return (budget / counts.clamp_min(1.0)).gather(1, labels.T).T * mask

    return _block_losses(logits, ranks, target_p, corpus, valid_prefix, budget, rank_on, weights=weights)


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
    "later-block seeds capped per depth": ("later blocks", SeedsCappedPerDepth),
    "later-block chains cut at the valid length": ("later blocks", ChainCutAtValidLength),
    "duplicate siblings merged while growing": ("later blocks", DuplicatesMergedWhileGrowing),
    "hitchhiker despite the rank walk's give-up": ("later blocks", HitchhikerDespiteGiveUp),
    "prune then merge as the default": ("later blocks", PrunedThenMergedByDefault),
    "tied copies merged by default": ("later blocks", TiedCopiesMerged),
    "later blocks created seed by seed": ("later blocks", BlocksCreatedSeedBySeed),
    "draft chain mask on the corpus token": ("official losses", draft_mask_on_the_corpus_token),
    "rank loss under the draft loss's mask": ("official losses", rank_loss_under_the_draft_mask),
    "rank loss without the distance weight": ("official losses", rank_loss_without_the_distance_weight),
    "rank loss with unbounded class weights": ("official losses", rank_loss_with_unbounded_class_weights),
}
