"""SpecBlock (issue 14): the network's shapes and causality, the training's masks and labels, the
rank-guided builder against references, losslessness of its trees, the bandit and the rollback,
bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.block_drafter.model import BlockDrafterModel, DrafterSpec, rank_labels, rank_statistics, valid_prefix_mask
from simlab import tree_verifiers
from simlab.decoding import greedy_decode, speculative_decode
from simlab.efficiency import emitted_sequence_law, expected_block_efficiency, target_sequence_law
from simlab.pairs import MarkovPair
from simlab.specblock import Block, PairBlockDrafter, RankGuided
from simlab.specblock.bandit import CostAwareBandit, Rollback, signal
from simlab.specblock.rank import statistics
from simlab.trees import NodeTable
from specblock_checks import (
    RepeatingDrafter,
    ScriptedDrafter,
    check_bandit_costs,
    check_block_one,
    check_later_blocks,
    check_official_losses,
    check_pruning,
    check_rank_labels,
    check_valid_prefix,
    check_widths,
    path_of,
    table,
)

FEATURES, VOCAB = 12, 40


def model(**changes) -> BlockDrafterModel:
    torch.manual_seed(0)
    return BlockDrafterModel(DrafterSpec.micro(**changes), FEATURES, VOCAB, 16).eval()


def run(m, slots=None, n=3):
    torch.manual_seed(1)
    feature, token = torch.randn(n, FEATURES), torch.randint(0, VOCAB, (n,))
    if slots is not None:
        with torch.no_grad():
            m.slots.copy_(slots)
    with torch.no_grad():
        return m(token, feature=feature)


# -- the network ------------------------------------------------------------------------------
def test_shapes():
    m = model()
    hidden, logits, ranks = run(m)
    K, W = m.spec.K, m.width
    assert hidden.shape == (3, K, W) and logits.shape == (3, K, VOCAB) and ranks.shape == (3, K, 4)
    with torch.no_grad():
        again = m(torch.tensor([1, 2, 3]), inherited=hidden[:, 2])
    assert again[1].shape == (3, K, VOCAB)


@pytest.mark.parametrize("arch", ["attention", "attention_free"])
@pytest.mark.parametrize("shift", [True, False])
def test_slot_k_does_not_depend_on_later_slots(shift, arch):
    """Changing slot j's input changes no slot before j.  It reaches every slot after j through the
    attention (with or without the shift); in the attention-free drafter only through the shift
    (without it only slot j itself changes: the slots are independent)."""
    m = model(shift=shift, arch=arch)
    base = m.slots.detach().clone()
    _, before, _ = run(m, base)
    for j in range(m.spec.K):
        changed = base.clone()
        changed[j] += 1.0
        _, after, _ = run(m, changed)
        for k in range(m.spec.K):
            same = torch.equal(before[:, k], after[:, k])
            assert same == (k < j or (arch == "attention_free" and not shift and k > j)), (shift, arch, j, k)


def truncated(m: BlockDrafterModel, K: int) -> BlockDrafterModel:
    """The same weights with only the first K slots."""
    one = BlockDrafterModel(
        DrafterSpec.micro(**{**{f: getattr(m.spec, f) for f in ("shift", "arch")}, "K": K}), FEATURES, VOCAB, 16
    ).eval()
    one.load_state_dict({name: (value[:K] if name == "slots" else value) for name, value in m.state_dict().items()})
    return one


@pytest.mark.parametrize("shift", [True, False])
def test_slot_k_of_the_attention_drafter_equals_a_k_plus_one_slot_model(shift):
    """Block-causal: slots 0..k of a K-slot drafter equal a (k+1)-slot drafter with the same weights."""
    m = model(shift=shift)
    _, logits, _ = run(m)
    for k in range(m.spec.K):
        _, short, _ = run(truncated(m, k + 1))
        assert torch.allclose(short, logits[:, : k + 1], atol=1e-6, rtol=0), k


def test_the_parallel_shift_is_w_times_h_k_and_h_k_minus_1():
    """One shift, written out: slot k becomes W [h_k; h_{k-1}], slot 0 W [h_0; h_0], the seed unchanged."""
    torch.manual_seed(3)
    m = model()
    h = torch.randn(2, 1 + m.spec.K, m.width)
    shift = m.shifts[0]
    with torch.no_grad():
        shift.weight.normal_()
        s = h[:, 1:]
        expected = torch.stack(
            [shift.weight @ torch.cat([s[i, k], s[i, max(k - 1, 0)]]) for i in range(2) for k in range(m.spec.K)]
        )
        m.attns[1].out.weight.zero_()  # isolate the shift: layer 1's attention and MLP add nothing
        m.mlps[1].down.weight.zero_()
        for module in (m.attns[0].out, m.mlps[0].down):
            module.weight.zero_()
        got = m._decode(h[:, 0], h[:, 1:])
    assert torch.allclose(got.reshape(-1, m.width), expected, atol=1e-5, rtol=0)


def test_without_the_shift_each_attention_free_slot_is_a_one_slot_model():
    """With the shift off, slot k of a K-slot attention-free model equals the only slot of a K = 1
    model with slot k's embedding."""
    m = model(shift=False, arch="attention_free")
    _, logits, _ = run(m)
    for k in range(m.spec.K):
        one = BlockDrafterModel(DrafterSpec.micro(K=1, shift=False, arch="attention_free"), FEATURES, VOCAB, 16).eval()
        state = {name: (value[k : k + 1] if name == "slots" else value) for name, value in m.state_dict().items()}
        one.load_state_dict(state)
        _, single, _ = run(one)
        assert torch.allclose(single[:, 0], logits[:, k], atol=1e-6, rtol=0)


@pytest.mark.parametrize("top1", ["top20", "vocabulary"])
def test_rank_statistics_equal_the_numpy_reference(top1):
    z = torch.randn(7, 3, 50, dtype=torch.float64) * 3
    assert np.allclose(rank_statistics(z, top1).numpy(), statistics(z.numpy(), top1), atol=1e-12, rtol=0)


def test_the_top1_statistic_is_the_official_cumprob_top1(tmp_path):
    """The 14th statistic is SpecBlock@b7938c5's ``cumprob_top1`` (``llama3_specblock.py``,
    ``forward_parallel``): exp of the top-1 logit minus the log-sum-exp of the top 20, written out;
    the drafter uses it by default, and a drafter saved without ``rank_top1`` loads with the
    statistic it was trained with (over the whole vocabulary)."""
    import json

    from backends.block_drafter.drafter import load, save

    z = np.random.default_rng(2).normal(size=(5, 60)) * 2
    for row, got in zip(z, statistics(z)):
        top = sorted(row, reverse=True)[:20]
        assert abs(got[13] - np.exp(top[0] - np.log(sum(np.exp(t) for t in top)))) <= 1e-12
        assert abs(statistics(row, "vocabulary")[13] - np.exp(top[0] - np.log(np.exp(row).sum()))) <= 1e-12
    m = model()
    assert m.spec.rank_top1 == "top20"
    save(m, tmp_path, {})
    assert load(tmp_path)[0].spec.rank_top1 == "top20"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["spec"]["rank_top1"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert load(tmp_path)[0].spec.rank_top1 == "vocabulary"
    with pytest.raises(ValueError, match="^rank_top1: "):
        DrafterSpec(rank_top1="top10")
    with pytest.raises(ValueError, match="^top1: "):
        statistics(z, "top10")


def test_valid_prefix_mask_equals_a_loop():
    check_valid_prefix(valid_prefix_mask)


def test_official_losses_equal_plain_loops():
    """The draft loss's chain mask against the target's argmax, the rank loss's own chain mask, class
    budget weights, distance weight and ordinal kernel: the official block losses equal loops."""
    from backends.block_drafter.train import official_block_losses

    check_official_losses(official_block_losses)


def test_rank_labels_equal_the_rank_buckets():
    check_rank_labels(rank_labels)


# -- the builder ------------------------------------------------------------------------------
def test_widths_follow_the_table_caps_and_the_slot0_rule():
    check_widths()


def test_block_one_branch_points_and_sibling_counts():
    check_block_one()


def test_pruning_to_budget_is_the_best_ancestor_closed_subset():
    check_pruning()


def test_later_blocks_follow_the_official_production_path():
    check_later_blocks()


INF = float("inf")


@pytest.mark.parametrize(
    "buffer, strict, parents, scores",
    [
        # a worse copy (1) merges into the better (2); its child (3) moves under 2, where it is a copy of 4
        (
            [(-1, 5, -0.1), (0, 7, -0.5), (0, 7, -0.3), (1, 9, -0.9), (2, 9, -0.8), (0, 8, -0.6)],
            False,
            [-1, 0, 0, 2, 2, 0],
            [-0.1, -INF, -0.3, -INF, -0.8, -0.6],
        ),
        # tied copies: the first created wins; read literally (strict), nothing merges
        ([(-1, 5, -0.1), (0, 7, -0.4), (0, 7, -0.4), (2, 9, -0.9)], False, [-1, 0, 0, 1], [-0.1, -0.4, -INF, -0.9]),
        ([(-1, 5, -0.1), (0, 7, -0.4), (0, 7, -0.4), (2, 9, -0.9)], True, [-1, 0, 0, 2], [-0.1, -0.4, -0.4, -0.9]),
        # three passes: copies at depth 3 merge (4 into 3), the copies their move makes at depth 4 (5, 6) stay
        (
            [(-1, 1, -0.1), (0, 2, -0.2), (1, 3, -0.3), (2, 4, -0.4), (2, 4, -0.5), (3, 6, -0.7), (4, 6, -0.6)],
            False,
            [-1, 0, 1, 2, 2, 3, 3],
            [-0.1, -0.2, -0.3, -0.4, -INF, -0.7, -0.6],
        ),
        # the root's children are never grouped; a node already at -inf is not merged again
        ([(-1, 5, -0.1), (-1, 5, -0.2), (0, 3, -INF), (0, 3, -0.5)], False, [-1, -1, 0, 0], [-0.1, -0.2, -INF, -0.5]),
    ],
)
def test_merge_duplicates_equals_the_official_kernel_written_out(buffer, strict, parents, scores):
    """``merge_duplicates`` on hand-built buffers, the expected outputs derived by hand from
    SpecBlock@b7938c5 ``tree_finalize_triton.py::_dbd_dedup_kernel`` (three depth passes; winner:
    best score, then lowest index; the kernel masks only copies strictly below the best)."""
    from simlab.specblock.builder import merge_duplicates

    got_parents, got_scores = merge_duplicates(*zip(*buffer), strict=strict)
    assert got_parents == parents and got_scores == scores


def test_the_default_finalize_is_the_shipped_one():
    """The default merges duplicates before pruning exactly where the official code takes its GPU
    path (two blocks, a give-up width above 0); at a matched budget its tree holds more distinct
    paths than pruning with the copies counted, and its cost counts only what it verifies."""
    drafter = RepeatingDrafter(3, classes=(1, 1, 0), slope=0.5)
    assert RankGuided(drafter).merges == "merge_strict"
    for changes in (dict(table=(2, 4, 10, 0)), dict(blocks=1), dict(blocks=3), dict(later_blocks="cut"), dict(duplicates="keep")):
        assert RankGuided(drafter, **changes).merges is None, changes
    assert RankGuided(drafter, rank_head=False).merges == "merge_strict"
    assert RankGuided(drafter, duplicates="merge", blocks=3).merges == "merge"
    merged, kept = (
        RankGuided(drafter, budget=25, beam_width=3, adaptive_slot0=False, adaptive_all=False, duplicates=d).sample(table())
        for d in ("official", "keep")
    )
    assert merged.cost.verified == kept.cost.verified == 25
    assert merged.tokens() == 25 > kept.tokens()


def test_valid_length_and_the_cut_reading():
    drafter = ScriptedDrafter(4, seed=1)
    b = RankGuided(drafter)
    block = lambda classes: Block(np.zeros((4, 3)), np.array(classes), (None,) * 4)
    assert b.valid_length(block([0, 0, 0, 0])) == 4
    assert b.valid_length(block([0, 1, 0, 0])) == 2
    assert RankGuided(drafter, table=(2, 4, 10, 0)).valid_length(block([0, 0, 3, 0])) == 2  # gives up at slot 2
    assert b.gives_up(block([0, 3, 1, 0])) and not b.gives_up(block([0, 1, 3, 0])) and not b.gives_up(block([0, 0, 0, 0]))
    for later in ("official", "cut"):
        tree, origin = RankGuided(drafter, budget=200, blocks=3, later_blocks=later).build(table())
        assert {b for b, _ in origin.values()} == {0, 1, 2} and set(origin) == set(tree.nodes()) - {()}
        assert tree.cost.forwards[0].tokens == 4 and len(tree.cost.forwards) == 3 and tree.tokens() <= tree.cost.verified == 200
        assert tree.depth() <= 12
    official, cut = (RankGuided(drafter, budget=10_000, later_blocks=later).sample(table()) for later in ("official", "cut"))
    assert official.cost.verified > cut.cost.verified and official.depth() == 8 >= cut.depth()


def test_the_tree_is_a_trie_and_deterministic():
    tree = RankGuided(ScriptedDrafter(4, seed=2), budget=60).sample(table())
    again = RankGuided(ScriptedDrafter(4, seed=2), budget=60).sample(table())
    assert tree.children == again.children
    assert all(len(set(kids)) == len(kids) for kids in tree.children.values())


def buffer_block_efficiency(pair, context, buffer, greedy: bool) -> float:
    """E[tau+1] of a flat buffer with duplicate siblings, written out as the official verifier reads
    it: the target's continuation x is drawn token by token (greedy: its argmax) and the accepted
    length is the longest buffer path that is a prefix of x, plus the bonus token."""
    paths = {()}
    for i in range(len(buffer)):
        paths.add(path_of(buffer, i))
    depth = max(len(p) for p in paths)

    def walk(prefix, mass):
        if len(prefix) == depth or prefix not in paths:
            accepted = max(len(p) for p in paths if p == prefix[: len(p)])
            return mass * (accepted + 1)
        p = pair.distributions([tuple(context) + prefix])[0][0]
        if greedy:
            return walk(prefix + (int(np.argmax(p)),), mass)
        return sum(walk(prefix + (x,), mass * p[x]) for x in range(len(p)) if p[x] > 0)

    return walk((), 1.0)


@pytest.mark.parametrize("duplicates", ["keep", "merge_strict", "official"])
def test_merging_duplicate_siblings_keeps_the_exact_block_efficiency(duplicates):
    """The official buffer can keep duplicate siblings (pruned with the copies counted, copies tied
    at the best score under the literal merge, merged copies when nothing is pruned); the lab's trie
    merges them.  Under one-hot (T = 1) and greedy (T = 0) verification the merged tree's exact
    E[tau+1] equals the buffer's, written out."""
    from backends.synthetic import make_world
    from simlab.sampling import SamplingSettings

    worlds = [
        (MarkovPair.random(4, np.random.default_rng(9), concentration=0.7), "onehot"),
        (make_world("depth_profile", vocab=5, seed=2, settings=SamplingSettings(0.0)), "greedy"),
    ]
    for pair, verifier in worlds:
        for classes, budget in (((1, 1, 0), 14), ((1, 0, 1), 30), ((2, 1, 1), 200)):
            builder = RankGuided(
                RepeatingDrafter(3, classes, vocab=pair.vocab_size),
                budget=budget,
                beam_width=3,
                adaptive_slot0=False,
                adaptive_all=False,
                duplicates=duplicates,
            )
            t = NodeTable(pair, (1,))
            buffer, tree = builder.buffer(t), builder.sample(t)
            assert len(buffer) > tree.tokens() or (duplicates == "official" and budget < 200)  # copies were merged
            want = buffer_block_efficiency(pair, (1,), buffer, greedy=verifier == "greedy")
            assert abs(tree_verifiers.get(verifier).expected_block_efficiency(tree) - want) <= 1e-12, (verifier, classes)


# -- losslessness ------------------------------------------------------------------------------
WORLD = MarkovPair.random(4, np.random.default_rng(3), concentration=0.6, closeness=0.4)


@pytest.mark.parametrize("verifier", ["onehot", "nss"])
@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_one_hot_and_nss_emit_the_target_three_token_law(verifier, noise):
    builder = RankGuided(PairBlockDrafter(4, K=2, noise=noise), budget=5, beam_width=2, blocks=2)
    law = emitted_sequence_law(WORLD, (0,), builder, verifier, 3)
    target = target_sequence_law(WORLD, (0,), 3)
    assert 0.5 * sum(abs(law.get(k, 0.0) - target.get(k, 0.0)) for k in set(law) | set(target)) <= 1e-12


@pytest.mark.parametrize("verifier", ["naive", "specinfer", "spectr"])
def test_lossy_verifiers_are_refused(verifier):
    builder = RankGuided(PairBlockDrafter(4, K=2), budget=5, beam_width=2)
    with pytest.raises(ValueError, match="is not lossless for children drafted deterministically"):
        expected_block_efficiency(WORLD, (0,), builder, verifier)


def test_greedy_verification_equals_greedy_decoding():
    from backends.synthetic import make_world
    from simlab.sampling import SamplingSettings

    pair = make_world("depth_profile", vocab=25, seed=4, settings=SamplingSettings(0.0))
    builder = RankGuided(PairBlockDrafter(25, K=3, noise=0.3), budget=12, beam_width=3)
    tokens, steps = speculative_decode(pair, (1,), builder, "greedy", 30, np.random.default_rng(0))
    assert tokens == greedy_decode(pair, (1,), 30) and len(steps) < 30


def test_trees_ranked_by_the_untempered_law_are_verified_under_the_setting():
    """At T = 0 the tempered q is one-hot (a chain); the untempered table gives EAGLE-2 its tree, read
    back on the T = 0 table and verified greedily; sampled trees cannot be moved."""
    from backends.synthetic import make_world
    from simlab.builders import EAGLE2
    from simlab.sampling import SamplingSettings
    from simlab.builders import iid
    from simlab.trees import NodeTable

    pair = make_world("depth_profile", vocab=25, seed=4, settings=SamplingSettings(0.0))
    greedy = NodeTable(pair, (1,))
    raw = greedy.untempered()
    assert raw is not greedy and raw.untempered() is raw and NodeTable(WORLD, (0,)).untempered().pair is WORLD
    chain = EAGLE2(budget=10, depth=3, top_k=3).sample(greedy)
    tree = EAGLE2(budget=10, depth=3, top_k=3).sample(raw).on(greedy)
    assert chain.tokens() == 4 and tree.tokens() == 10 and tree.table is greedy
    with pytest.raises(ValueError, match="^table: "):
        iid(2, 1).sample(raw, np.random.default_rng(0)).on(greedy)
    with pytest.raises(ValueError, match="^table: "):
        tree.on(NodeTable(pair, (2,)))


# -- the bandit ------------------------------------------------------------------------------
def test_bandit_learns_to_update_when_free_and_to_skip_when_costly():
    check_bandit_costs()


def test_bandit_is_deterministic_under_a_seed():
    histories = []
    for _ in range(2):
        bandit = CostAwareBandit(np.random.default_rng(7), explore=0.3)
        for i in range(50):
            arm = bandit.choose(5.0, 1.0)
            bandit.observe(arm, np.sin(i) + (arm == "full"), 0.01)
        histories.append(bandit.history)
    assert histories[0] == histories[1]


def test_rollback_windows_and_signal():
    rollback = Rollback(window=3, drop=0.05)
    assert [rollback.record(a) for a in (2, 2, 2, 2, 2, 2.0)] == [False] * 6
    assert [rollback.record(a) for a in (1, 1, 1)] == [False, False, True]
    assert signal([0.9, 0.5, 0.2], accepted=1) == pytest.approx(0.5 + 0.8)


@pytest.mark.parametrize("losses, arch", [("official", "attention"), ("corpus_masks", "attention_free")])
def test_training_steps_under_both_losses(losses, arch):
    """One optimiser step of each loss option and architecture on a tiny target: finite losses, moved weights."""
    from backends.block_drafter.train import Trainer
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    target = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=8, n_layer=2, n_head=2)).eval()
    spec = DrafterSpec.micro(K=2, roots_per_step=8, windows=2, steps=2, rank_freeze=0, losses=losses, arch=arch)
    trainer = Trainer(spec, target, (1, 1, 2), torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(1)), 0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    out = trainer.step()
    assert np.isfinite(out["draft"]) and np.isfinite(out["rank"]) and out["rank"] > 0
    assert not torch.equal(before["lm_head.weight"], trainer.model.state_dict()["lm_head.weight"])


def test_adapter_restore_is_bit_for_bit():
    from backends.block_drafter.adapt import Adapter
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    target = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=8, n_layer=2, n_head=2)).eval()
    m = BlockDrafterModel(DrafterSpec.micro(), 24, VOCAB, 16)
    adapter = Adapter(m, target, (1, 1, 2), steps=2, learning_rate=1e-2)
    before = adapter.snapshot()
    sequence = list(range(1, 20))
    for arm, changed in (("heads", {"lm_head.weight"}), ("full", {"embed.weight", "lm_head.weight", "fuse.weight"})):
        adapter.restore(before)
        roots, _ = adapter.update(arm, [sequence])
        assert roots > 0
        after = m.state_dict()
        moved = {k for k in after if not torch.equal(after[k], before[k])}
        assert changed <= moved and (arm == "full" or "fuse.weight" not in moved), (arm, moved)
        adapter.restore(before)
        assert all(torch.equal(m.state_dict()[k], before[k]) for k in before)
    assert adapter.cost("full", 10, lambda c, n: 1e-3 * n) > adapter.cost("heads", 10, lambda c, n: 1e-3 * n) > 0
    assert adapter.update("skip", [sequence]) == (0, 0.0)


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="^K: "):
        PairBlockDrafter(4, K=0)
    with pytest.raises(ValueError, match="^K: "):
        DrafterSpec(K=0)
    with pytest.raises(ValueError, match="^budget: "):
        RankGuided(PairBlockDrafter(4), budget=0)
    with pytest.raises(ValueError, match="^table: "):
        RankGuided(PairBlockDrafter(4), table=(2, 4, 6))
    with pytest.raises(ValueError, match="^duplicates: "):
        RankGuided(PairBlockDrafter(4), duplicates="dedup")
    with pytest.raises(ValueError, match="^drafter: "):
        RankGuided(object())
    with pytest.raises(ValueError, match="^vocab_size: "):
        RankGuided(PairBlockDrafter(10), budget=3).sample(table())
    with pytest.raises(ValueError, match="^arm: "):
        CostAwareBandit(np.random.default_rng(0)).observe("half", 0.0, 0.0)
    with pytest.raises(ValueError, match="^feature: "):
        model()(torch.tensor([1]))
    assert tree_verifiers.get("onehot").expected_block_efficiency(RankGuided(ScriptedDrafter(2), budget=3).sample(table())) >= 1
