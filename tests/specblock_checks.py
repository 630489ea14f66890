"""Reusable checks of the SpecBlock pieces (used by test_specblock.py and its planted-fault suite).

Each check compares an implementation with a plain reference (a loop, the rule written out, or
a brute force over subsets) on fixed inputs, so it is deterministic: no false alarms, and every
planted fault in specblock_mutants.py must make it fail.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from simlab.pairs import ContextFreePair
from simlab.specblock import CLASS_DEFAULT, SLIM_R2, Block, RankGuided
from simlab.specblock.bandit import CostAwareBandit
from simlab.specblock.rank import bucket, rank_of
from simlab.trees import NodeTable

V = 30


class ScriptedDrafter:
    """Blocks from a seeded generator keyed by the seed path: a deterministic drafter of any shape."""

    def __init__(self, K: int, seed: int = 0, classes=None, peaked: float = 3.0):
        self.K, self.vocab_size, self.seed, self.classes, self.peaked = K, V, seed, classes, peaked

    def _block(self, path) -> Block:
        rng = np.random.default_rng([self.seed, len(path), *path])
        z = rng.normal(size=(self.K, V)) * self.peaked
        logprobs = z - np.log(np.exp(z).sum(1, keepdims=True))
        classes = np.array(self.classes if self.classes is not None else rng.integers(0, 4, self.K), dtype=np.int64)
        return Block(logprobs, classes, tuple(path for _ in range(self.K)))

    def first_block(self, table):
        return self._block(())

    def next_blocks(self, table, seeds):
        return [self._block(path) for path, _ in seeds]


def table():
    return NodeTable(ContextFreePair(np.full(V, 1.0 / V), np.full(V, 1.0 / V)), ())


def reference_width(builder: RankGuided, k: int, first: bool, p: float, cls: int) -> int:
    """The width rule of SpecBlock's code, written out."""
    if not builder.rank_head:
        return builder.fixed_width
    if k == 0 and first:
        if builder.adaptive_slot0:
            if p >= 0.9:
                return min(3, builder.beam_width)
            if p >= 0.8:
                return min(5, builder.beam_width)
            if p >= 0.6:
                return min(8, builder.beam_width)
        return builder.beam_width
    width = builder.table[cls]
    if builder.adaptive_all and width:
        if p >= 0.95:
            return min(2, width)
        if p >= 0.85:
            return min(3, width)
    return width


def check_widths(make=RankGuided) -> None:
    """Widths per slot equal the written-out rule over every class and probability band, both tables."""
    for table_, slot0, caps, head in itertools.product((SLIM_R2, CLASS_DEFAULT), (True, False), (True, False), (True, False)):
        for cls in range(4):
            for p in (0.5, 0.65, 0.82, 0.87, 0.93, 0.97):
                builder = make(
                    ScriptedDrafter(4),
                    table=table_,
                    adaptive_slot0=slot0,
                    adaptive_all=caps,
                    rank_head=head,
                    beam_width=4 if cls % 2 else 10,
                )
                logprobs = np.full((4, V), np.log((1 - p) / (V - 1)))
                logprobs[:, 0] = np.log(p)
                block = Block(logprobs, np.full(4, cls, dtype=np.int64), (None,) * 4)
                for first in (True, False):
                    expected = []
                    for k in range(4):
                        expected.append(reference_width(builder, k, first, p, cls))
                        if expected[-1] == 0:
                            break
                    got = builder.widths(block, first)
                    assert got == expected, (table_, slot0, caps, head, cls, p, first, got, expected)


def check_block_one(make=RankGuided) -> None:
    """One block with classes (0, 0, 1, 0) and no caps: the chain of the greedy tokens, siblings by rank
    where the table says, all within budget (hand-derived from the rule)."""
    drafter = ScriptedDrafter(4, seed=3, classes=(0, 0, 1, 0))
    builder = make(drafter, budget=1000, blocks=1, beam_width=2, adaptive_slot0=False, adaptive_all=False)
    tree = builder.sample(table())
    block = drafter.first_block(None)
    order = [list(np.argsort(-block.logprobs[k], kind="stable")) for k in range(4)]
    g = [int(o[0]) for o in order]
    expected = {
        (): tuple(int(t) for t in order[0][:2]),  # slot 0: beam_width 2
        (g[0],): tuple(int(t) for t in order[1][:2]),  # slot 1: class 0 -> table[0] = 2
        (g[0], g[1]): tuple(int(t) for t in order[2][:4]),  # slot 2: class 1 -> 4
        (g[0], g[1], g[2]): tuple(int(t) for t in order[3][:2]),
    }  # slot 3: class 0 -> 2
    got = {path: tuple(kids) for path, kids in tree.children.items() if kids}
    assert got == expected, (got, expected)


def scores(tree, drafter) -> dict:
    """Each node's cumulative draft log-probability under a drafter whose blocks depend on the seed path
    only through block 1 (``blocks=1``)."""
    block = drafter.first_block(None)
    out = {(): 0.0}
    for path in sorted(tree.nodes(), key=len):
        if path:
            out[path] = out[path[:-1]] + block.logprobs[len(path) - 1][path[-1]]
    return out


def check_pruning(make=RankGuided) -> None:
    """Pruned to budget B, the tree keeps exactly B nodes, is ancestor-closed, and its total score is
    the largest over every ancestor-closed B-subset of the unpruned tree (brute force)."""
    for seed, budget in itertools.product(range(4), (1, 3, 5)):
        drafter = ScriptedDrafter(3, seed=seed, classes=(0, 1, 0), peaked=1.0)
        full = make(drafter, budget=10_000, blocks=1, beam_width=3, adaptive_slot0=False, adaptive_all=False).sample(table())
        pruned = make(drafter, budget=budget, blocks=1, beam_width=3, adaptive_slot0=False, adaptive_all=False).sample(table())
        s = scores(full, drafter)
        nodes = [p for p in full.nodes() if p]
        kept = [p for p in pruned.nodes() if p]
        assert len(kept) == min(budget, len(nodes)), (len(kept), budget)
        assert all(p[:-1] in set(kept) | {()} for p in kept), "ancestor closure"
        best = max(
            sum(s[p] for p in subset)
            for subset in itertools.combinations(nodes, min(budget, len(nodes)))
            if all(p[:-1] in set(subset) | {()} for p in subset)
        )
        assert abs(sum(s[p] for p in kept) - best) <= 1e-12, (seed, budget)
        assert pruned.cost.verified == len(kept) and pruned.tokens() == len(kept)


def plain_official_buffer(builder, drafter, table_=None) -> list[tuple[int, int, float]]:
    """The official production path written out plainly (``later_blocks="official"``): the
    finalized buffer as (parent index, token, cumulative log q) per kept node in creation order.

    From SpecBlock@b7938c5: ``_build_tree_from_block1_gpu`` / ``tree_build_triton.py`` (two
    blocks, a give-up width above 0) and the eager ``_build_tree_from_block1`` (other tables and
    block counts): chains first, then alternatives; pending = branching greedy nodes, then
    alternatives, then the hitchhiking g_{K-1}; ``finalize_tree_gpu`` with ``TREE_DEDUP_MODE`` = 1
    on the GPU path (the merge of duplicate (parent, token) siblings, depth by depth, three
    passes), ``_prune_tree_np`` on the eager one."""
    K, nodes = drafter.K, []  # [parent, token, score]
    stop_rule = builder.rank_head and builder.table[3] == 0

    def add(parent, token, logprob):
        nodes.append([parent, int(token), (nodes[parent][2] if parent >= 0 else 0.0) + float(logprob)])
        return len(nodes) - 1

    def path(i):
        return path_of(nodes, i)

    def ranked(logprobs):
        return sorted(range(len(logprobs)), key=lambda t: (-logprobs[t], t))

    def widths(block, first):
        out, stopped = [], False
        for k in range(K):
            cls = int(block.classes[k])
            stopped = stopped or (stop_rule and cls == 3 and (k > 0 or not first))
            p = float(np.exp(block.logprobs[k].max()))
            out.append(0 if stopped else reference_width(builder, k, first, p, cls))
        return out

    def blocks_below(seeds, blocks, first):
        chains = []
        for seed, block in zip(seeds, blocks):  # every chain first, whole
            chain, parent = [], seed
            for k in range(K):
                lp = block.logprobs[k]
                parent = add(parent, ranked(lp)[0], lp[ranked(lp)[0]])
                chain.append(parent)
            chains.append(chain)
        active, alternatives, hitchhikers = [], [], []
        for seed, block, chain in zip(seeds, blocks, chains):
            w = widths(block, first)
            for k in range(K):
                lp = block.logprobs[k]
                for t in ranked(lp)[1 : w[k]]:
                    alternatives.append(add(chain[k - 1] if k else seed, t, lp[t]))
            active += [chain[k] for k in range(K) if w[k] > 1]
            classes = [int(c) for c in block.classes]
            others = [c for c in classes if c != 0]
            if w[K - 1] <= 1:
                if first and not (others and others[0] == 3):  # the rank walk does not give up
                    hitchhikers.append(chain[-1])
                if not first and not (stop_rule and 3 in classes):  # stop_at == K
                    hitchhikers.append(chain[-1])
        return active + alternatives + hitchhikers

    t = table() if table_ is None else table_
    pending = blocks_below([-1], [drafter.first_block(t)], True)
    for b in range(1, builder.blocks):
        if b >= 2:  # the eager path's beam before a third block
            beam = min(builder.beam_width, max(1, (builder.budget - len(nodes)) // K))
            best = sorted(range(len(pending)), key=lambda i: (-nodes[pending[i]][2], i))[:beam]
            pending = [pending[i] for i in sorted(best)]
        if not pending:
            break
        blocks = drafter.next_blocks(t, [(path(s), None) for s in pending])
        pending = blocks_below(pending, blocks, False)

    rule = builder.duplicates
    if rule == "official":
        rule = "merge_strict" if builder.blocks == 2 and not stop_rule else "keep"
    if rule != "keep":  # dedup_depth_by_depth_triton, max_tree_depth 3
        depth = []
        for i in range(len(nodes)):
            d, j = 0, i
            while nodes[j][0] >= 0 and d < 3:
                d, j = d + 1, nodes[j][0]
            depth.append(d)
        for d in (1, 2, 3):
            winner = {}
            for i in range(len(nodes)):
                key = (nodes[i][0], nodes[i][1])
                if depth[i] == d and (key not in winner or nodes[i][2] > nodes[winner[key]][2]):
                    winner[key] = i
            moved = {}
            for i in range(len(nodes)):
                w = winner.get((nodes[i][0], nodes[i][1])) if depth[i] == d else None
                if w is not None and i != w and nodes[i][2] != -np.inf:
                    if nodes[i][2] < nodes[w][2] or rule == "merge":
                        moved[i] = w
            for i in moved:
                nodes[i][2] = -np.inf
            for node in nodes:
                node[0] = moved.get(node[0], node[0])
    best = sorted(sorted(range(len(nodes)), key=lambda i: (-nodes[i][2], i))[: builder.budget])
    index = {old: new for new, old in enumerate(best)}
    return [(index[nodes[i][0]] if nodes[i][0] >= 0 else -1, nodes[i][1], nodes[i][2]) for i in best]


def check_later_blocks(make=RankGuided) -> None:
    """Later blocks and the finalize as the official production path builds them, against the plain
    reference (the buffer node by node, in creation order), on hand-built cases where each rule
    changes the tree:

    * seeds: block 1 branches 6 wide at slot 1 (class 2, beam_width 2): all 6 depth-2 seeds (and
      the depth-1 ones) get block 2, where the lab's earlier reading kept 2 per depth;
    * whole chains (the eager fallback of the class default): block 1's classes (1, 0, 3, 0) stop
      its alternatives at the give-up slot 2 but not its chain; block 2's chains go on past the
      class-1 slot (valid length 1) and past a give-up slot, without alternatives from it on;
    * duplicates: drafters that re-draft block 1's tokens in block 2, with other scores (merged
      before pruning: the budget goes to distinct paths) or the same scores (ties), under every
      ``duplicates`` rule;
    * the hitchhiker (a table whose class 0 does not branch, so g_{K-1} is not already a seed):
      block-1 classes (0, 3, 0) give up in the rank walk (no g_{K-1} seed) although the table
      still branches at the give-up slot; classes (0, 1, 0) do not (g_{K-1} gets block 2);
    * a third block (the eager path): its seeds are the best of block 2's pending ones.
    """
    cases = [
        (ScriptedDrafter(3, seed=5, classes=(0, 2, 0)), dict(table=SLIM_R2, beam_width=2, budget=10_000)),
        (ScriptedDrafter(3, seed=5, classes=(0, 2, 0)), dict(table=SLIM_R2, beam_width=2, budget=40)),
        (ScriptedDrafter(4, seed=6, classes=(1, 0, 3, 0)), dict(table=CLASS_DEFAULT, beam_width=3, budget=10_000)),
        (ScriptedDrafter(4, seed=6, classes=(1, 0, 3, 0)), dict(table=CLASS_DEFAULT, beam_width=3, budget=30)),
        (RepeatingDrafter(3, classes=(1, 1, 0), slope=0.5), dict(table=SLIM_R2, beam_width=3, budget=25)),
        (RepeatingDrafter(3, classes=(1, 1, 0), slope=0.5), dict(table=SLIM_R2, beam_width=3, budget=10_000)),
        (ScriptedDrafter(3, seed=7, classes=(0, 3, 0)), dict(table=(1, 4, 6, 4), beam_width=2, budget=10_000)),
        (ScriptedDrafter(3, seed=8, classes=(0, 1, 0)), dict(table=(1, 4, 6, 4), beam_width=2, budget=10_000)),
        (ScriptedDrafter(3, seed=9, classes=(1, 0, 3)), dict(table=SLIM_R2, beam_width=2, budget=60, blocks=3)),
        (ScriptedDrafter(3, seed=9, classes=(1, 0, 3)), dict(table=CLASS_DEFAULT, beam_width=2, budget=60, blocks=3)),
    ]
    for duplicates in ("official", "merge", "merge_strict", "keep"):
        for drafter, options in cases + [(RepeatingDrafter(3, classes=(1, 1, 0)), dict(beam_width=3, budget=25))]:
            options = {"blocks": 2, **options}
            builder = make(drafter, adaptive_slot0=False, adaptive_all=False, duplicates=duplicates, **options)
            expected = plain_official_buffer(builder, drafter)
            buffer = builder.buffer(table())
            assert len(buffer) == len(expected), (duplicates, drafter.K, options)
            for got, want in zip(buffer, expected):
                assert got[:2] == want[:2] and (got[2] == want[2] or abs(got[2] - want[2]) <= 1e-12), (
                    duplicates,
                    options,
                    got,
                    want,
                )
            tree = builder.sample(table())
            kids = {}
            for i in range(len(expected)):
                p = path_of(expected, i)
                kids.setdefault(p[:-1], set()).add(p[-1])
            assert {p: set(c) for p, c in tree.children.items() if c} == kids
            assert tree.cost.verified == len(expected) and tree.tokens() == len(
                {path_of(expected, i) for i in range(len(expected))}
            )


def path_of(buffer, i) -> tuple[int, ...]:
    """The token path of node ``i`` of a buffer of (parent index, token, score)."""
    path = ()
    while i >= 0:
        path = (buffer[i][1],) + path
        i = buffer[i][0]
    return path


class RepeatingDrafter:
    """Every block ranks the vocabulary the same way (token 0 first), with given classes: block 2
    re-drafts the tokens block 1 already placed, so the official buffer holds duplicate siblings.
    Later blocks' log-probabilities fall by ``slope`` per rank (default: block 1's 0.7, so copies
    tie exactly; another slope gives copies other scores)."""

    def __init__(self, K: int, classes, vocab: int = V, slope: float | None = None):
        self.K, self.vocab_size, self.classes = K, vocab, classes
        self.logprobs, self.later = (self._ranking(s, vocab, K) for s in (0.7, 0.7 if slope is None else slope))

    @staticmethod
    def _ranking(slope, vocab, K):
        z = -slope * np.arange(vocab, dtype=np.float64)
        return np.tile(z - np.log(np.exp(z).sum()), (K, 1))

    def first_block(self, table):
        return Block(self.logprobs, np.array(self.classes, dtype=np.int64), (None,) * self.K)

    def next_blocks(self, table, seeds):
        return [Block(self.later, np.array(self.classes, dtype=np.int64), (None,) * self.K) for _ in seeds]


def check_valid_prefix(mask_fn) -> None:
    """The valid-prefix mask equals a plain loop on a hand-built batch."""
    correct = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    expected = torch.zeros(correct.shape)
    for i in range(correct.shape[0]):
        ok = True
        for k in range(correct.shape[1]):
            expected[i, k] = 1.0 if ok else 0.0
            ok = ok and bool(correct[i, k])
    assert torch.equal(mask_fn(correct), expected), mask_fn(correct)


def loss_batch():
    """A hand-built block (float64): 6 roots, K = 3, V = 25, where the drafter's argmax equals the
    target's at planted slots, the corpus token differs from the target's argmax at others, and
    the rank head is right at planted slots."""
    g = torch.Generator().manual_seed(4)
    N, K, V = 6, 3, 25
    target_logits = torch.randn(N, K, V, generator=g, dtype=torch.float64) * 2
    target_p = torch.softmax(target_logits, -1)
    logits = torch.randn(N, K, V, generator=g, dtype=torch.float64)
    agree = torch.tensor([[1, 1, 1], [1, 0, 1], [0, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    logits[agree] = target_logits[agree] * 3  # the same argmax
    corpus = target_p.argmax(-1).clone()
    corpus[0, 0], corpus[3, 1], corpus[4, 1] = (corpus[0, 0] + 1) % V, (corpus[3, 1] + 2) % V, (corpus[4, 1] + 1) % V
    ranks = torch.randn(N, K, 4, generator=g, dtype=torch.float64)
    labels = torch.stack(
        [
            torch.stack(
                [torch.tensor(int(bucket(rank_of(int(target_p[i, k].argmax()), logits[i, k].numpy())))) for k in range(K)]
            )
            for i in range(N)
        ]
    )
    right = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 1, 1], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    for i, k in right.nonzero().tolist():  # plant the rank head's correct classes
        ranks[i, k, int(labels[i, k])] = 10.0
    return logits, ranks, target_p, corpus, labels


def plain_official_losses(logits, ranks, target_p, corpus, valid_prefix, budget) -> tuple[float, float]:
    """The official draft and rank losses of one block written out with loops over roots and slots."""
    N, K, _ = logits.shape
    draft = 0.0
    for k in range(K):
        total = count = 0.0
        for i in range(N):
            ok = all(int(logits[i, j].argmax()) == int(target_p[i, j].argmax()) for j in range(k)) or not valid_prefix
            if ok:
                total += float(-(target_p[i, k] * torch.log_softmax(logits[i, k], -1)).sum())
                count += 1
        draft += total / max(count, 1.0)
    labels = [[int(bucket(rank_of(int(target_p[i, k].argmax()), logits[i, k].numpy()))) for k in range(K)] for i in range(N)]
    predicted = [[int(ranks[i, k].argmax()) for k in range(K)] for i in range(N)]
    inside = [[all(predicted[i][j] == labels[i][j] for j in range(k)) for k in range(K)] for i in range(N)]
    numerator = denominator = 0.0
    for k in range(K):
        counts = [sum(1 for i in range(N) if inside[i][k] and labels[i][k] == c) for c in range(4)]
        for i in range(N):
            if not inside[i][k]:
                continue
            t, p = labels[i][k], predicted[i][k]
            weight = min(1.0, budget / max(counts[t], 1))
            kernel = [1.0 / (1 + abs(c - t) + max(t - c, 0)) ** 2 for c in range(4)]
            log_soft = torch.log_softmax(ranks[i, k], -1)
            ce = -sum(kernel[c] / sum(kernel) * float(log_soft[c]) for c in range(4))
            numerator += ce * (1 + abs(t - p) + max(t - p, 0)) * weight
            denominator += weight
    return draft, numerator / denominator


def check_official_losses(loss_fn) -> None:
    """The official block losses equal the written-out loops on ``loss_batch``, with and without the
    valid prefix, at class budgets that bind (1) and do not (100)."""
    logits, ranks, target_p, corpus, _ = loss_batch()
    for valid_prefix, budget in itertools.product((True, False), (1, 100)):
        draft, rank = loss_fn(logits, ranks, target_p, corpus, valid_prefix, budget, True)
        want_draft, want_rank = plain_official_losses(logits, ranks, target_p, corpus, valid_prefix, budget)
        assert abs(float(draft) - want_draft) <= 1e-9 and abs(float(rank) - want_rank) <= 1e-9, (valid_prefix, budget)


def check_rank_labels(label_fn) -> None:
    """Rank labels equal ``bucket(rank_of(...))`` on integer logits full of ties."""
    rng = np.random.default_rng(5)
    logits = rng.integers(0, 6, size=(200, 25)).astype(np.float32)
    tokens = rng.integers(0, 25, size=200)
    got = label_fn(torch.from_numpy(logits), torch.from_numpy(tokens)).numpy()
    expected = np.array([bucket(rank_of(int(t), row)) for t, row in zip(tokens, logits)])
    assert np.array_equal(got, expected)


def check_bandit_costs(make=CostAwareBandit) -> None:
    """In a drifting world (throughput falls by 1 per prompt without an update, an update restores 0.5 of
    it): with free updates the bandit updates at least 80% of the time; with prohibitive update costs it
    skips at least 80% of the time (200 prompts, fixed seed: a deterministic check)."""
    for cost, want in ((0.0, ("heads", "full")), (1e9, ("skip",))):
        bandit = make(np.random.default_rng(0), explore=0.1)
        for _ in range(200):
            arm = bandit.choose(throughput=10.0, seconds=1.0)
            gain = -1.0 if arm == "skip" else 0.5
            bandit.observe(arm, gain, 0.0 if arm == "skip" else cost)
        share = np.mean([a in want for a in bandit.history])
        assert share >= 0.8, (cost, share)
