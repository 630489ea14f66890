"""The real-model backend on a micro pair trained offline in seconds (no network, ever)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from backends.hf import HFPair, check_tokenizers
from simlab.sampling import SamplingSettings
from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.decoding import greedy_decode, speculative_decode
from simlab.builders import Delayed, chain, iid
from simlab.trees import NodeTable
from stats import assert_sampler_matches


@pytest.fixture(scope="module")
def pair(micro_pair_dir):
    return HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


@pytest.fixture(scope="module")
def prompt(pair):
    return pair.encode("The for statement is used to iterate over")


def test_tree_forward_equals_sequential_forwards(pair, prompt):
    """Every node's p and q from one tree-attention forward equal a plain forward on its path (1e-4)."""
    tree = Delayed(3, 2, 3).sample(NodeTable(pair, prompt), np.random.default_rng(0))
    paths = tree.nodes()
    tree_p, tree_q = pair.node_distributions(prompt, paths)
    for i, path in enumerate(paths):
        p, q = pair.distributions([prompt + path])
        np.testing.assert_allclose(tree_p[i], p[0], atol=1e-4)
        np.testing.assert_allclose(tree_q[i], q[0], atol=1e-4)


def test_siblings_do_not_see_each_other(pair, prompt):
    """A node's distribution does not change when a sibling branch is added to the tree."""
    alone_p, _ = pair.node_distributions(prompt, [(5, 7)])
    crowded_p, _ = pair.node_distributions(prompt, [(5, 7), (9,), (9, 11), (5, 3)])
    np.testing.assert_allclose(alone_p[0], crowded_p[0], atol=1e-5)


def test_width_one_tree_equals_the_chain(pair, prompt):
    chain_tree = chain(3).sample(NodeTable(pair, prompt), np.random.default_rng(1))
    path = chain_tree.first_path()
    a = pair.node_distributions(prompt, [path[:d] for d in range(4)])
    b = pair.distributions([prompt + path[:d] for d in range(4)])
    np.testing.assert_allclose(a[0], b[0], atol=1e-4)


def test_path_batching_fallback_agrees(micro_pair_dir, pair, prompt):
    fallback = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", tree_attention=False)
    paths = [(), (4,), (4, 9)]
    np.testing.assert_allclose(
        fallback.node_distributions(prompt, paths)[0], pair.node_distributions(prompt, paths)[0], atol=1e-4
    )


@pytest.mark.parametrize("verifier", tree_verifiers.names())
def test_temperature_zero_equals_greedy_decoding(micro_pair_dir, prompt, verifier):
    if not getattr(getattr(tree_verifiers.get(verifier), "node", None), "exact_at_greedy_target", True):
        pytest.skip("declared lossy at a one-hot target too (NodeVerifier.exact_at_greedy_target)")
    greedy = HFPair(
        str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", settings=SamplingSettings(temperature=0.0)
    )
    declared_lossy = not tree_verifiers.get(verifier).lossless_for  # exact at T = 0 all the same: asked for anyway
    rule = tree_verifiers.get(verifier, allow_lossy=declared_lossy)
    drafting = getattr(getattr(rule, "node", None), "drafting", None)  # the node rule's own law, where it has one
    if drafting is Drafting.MIXED:
        from simlab.builders import GreedyDraftTree

        shape = GreedyDraftTree(budget=4, depth=1, top_k=2)
    else:
        shape = chain(3) if drafting is Drafting.WITHOUT_REPLACEMENT else iid(2, 2)
    tokens, _ = speculative_decode(greedy, prompt, shape, rule, 12, np.random.default_rng(2))
    assert tokens == greedy_decode(greedy, prompt, 12)


@pytest.mark.parametrize("verifier", ["specinfer", "traversal"])
def test_first_token_follows_the_target_at_temperature_one(pair, prompt, verifier):
    """G-test (stats.py design) of the first emitted token, its law binned into the target's 7 most
    probable tokens and 'other' (the false-alarm and power statements apply to the binned law)."""
    p = pair.distributions([prompt])[0][0]
    top = [int(t) for t in np.argsort(-p, kind="stable")[:7]]
    law = np.append(p[top], 1.0 - p[top].sum())
    cell = {t: i for i, t in enumerate(top)}
    table = NodeTable(pair, prompt)  # p, q and plans per node reused across draws
    tree_verifier, shape = tree_verifiers.get(verifier), iid(2, 1)

    def first_token(rng):
        path, token = tree_verifier.verify(shape.sample(table, rng), rng)
        return cell.get((path + (token,))[0], 7)

    assert_sampler_matches(first_token, law, seed=41)


def test_tokenizer_disagreement_is_an_error(pair):
    class Shifted:
        def __init__(self, inner):
            self.inner = inner

        def __len__(self):
            return len(self.inner)

        def convert_ids_to_tokens(self, ids):
            tokens = self.inner.convert_ids_to_tokens(ids)
            return tokens[:5] + ["<changed>"] + tokens[6:]

    with pytest.raises(ValueError, match=r"^draft: tokenizer disagrees with the target's at id 5"):
        check_tokenizers(pair.target_tokenizer, Shifted(pair.draft_tokenizer))


def test_missing_model_folder(tmp_path):
    with pytest.raises(ValueError, match=r"^target: model folder .* does not exist"):
        HFPair(str(tmp_path / "nope"), str(tmp_path / "nope"))


def test_context_longer_than_the_model(pair):
    with pytest.raises(ValueError, match=r"^context: .* exceed the model's context"):
        pair.distributions([(1,) * (pair.max_context + 1)])


# -- issue 11: settings without mutation, bad ids, the tree-attention probe, out-of-memory errors ----------
def test_with_settings_shares_the_models_and_leaves_the_pair_alone(pair, prompt):
    from simlab.pairs import HiddenStates, NodeBatch, NodeLogits, WithSettings

    assert all(isinstance(pair, c) for c in (NodeBatch, NodeLogits, HiddenStates, WithSettings))
    greedy = pair.with_settings(SamplingSettings(0.0))
    assert greedy.target is pair.target and pair.settings == SamplingSettings()
    p_greedy = greedy.distributions([prompt])[0][0]
    assert sorted(set(p_greedy.tolist())) == [0.0, 1.0] and pair.distributions([prompt])[0][0].min() > 0


def test_a_tiny_temperature_gives_laws_not_index_errors(pair, prompt):
    p, q = pair.with_settings(SamplingSettings(1e-310)).node_distributions(prompt, [(), (3,)])
    assert np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0) and np.allclose(q.sum(axis=1), 1.0)


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_out_of_range_ids_are_value_errors(pair, prompt, bad):
    bad = bad if bad < 0 else pair.vocab_size
    with pytest.raises(ValueError, match="^context: "):
        pair.distributions([prompt + (bad,)])
    with pytest.raises(ValueError, match="^context: "):
        pair.node_distributions(prompt, [(bad,)])


def test_chunked_tree_forwards_equal_one_forward(pair, prompt):
    paths = Delayed(3, 1, 3).sample(NodeTable(pair, prompt), np.random.default_rng(5)).nodes()
    whole = pair.node_logits(prompt, paths)
    for chunk in (1, 3):
        part = pair.node_logits(prompt, paths, max_batch=chunk)
        np.testing.assert_allclose(part[0], whole[0], atol=1e-4)
        np.testing.assert_allclose(part[1], whole[1], atol=1e-4)


def test_out_of_memory_in_a_tree_forward_reaches_the_caller(pair, prompt, monkeypatch):
    import torch

    calls = {"n": 0}
    real = type(pair.target).forward

    def forward(self, *args, **kwargs):
        if kwargs.get("attention_mask") is not None and kwargs["attention_mask"].dim() == 4:
            calls["n"] += 1
            raise torch.cuda.OutOfMemoryError("simulated")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(pair.target), "forward", forward)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        pair.node_logits(prompt, [(1,), (1, 2)])
    assert calls["n"] == 1 and pair.tree_attention  # not switched off for the rest of the run


@pytest.mark.parametrize("failure", ["raises", "ignores"])
def test_models_without_tree_masks_fall_back_once_with_a_warning(micro_pair_dir, prompt, monkeypatch, failure):
    from transformers import GPT2LMHeadModel

    real = GPT2LMHeadModel.forward

    @functools.wraps(real)  # keeps the signature HFPair reads (the cache keyword)
    def forward(self, *args, **kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            if failure == "raises":
                raise RuntimeError("custom 4D attention masks are not supported")
            kwargs["attention_mask"] = None  # silently ignored: siblings see each other
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GPT2LMHeadModel, "forward", forward)
    with pytest.warns(RuntimeWarning, match="tree attention"):
        fallback = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    assert not fallback.tree_attention
    monkeypatch.setattr(GPT2LMHeadModel, "forward", real)
    plain = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    paths = [(), (4,), (4, 9), (5,)]
    np.testing.assert_allclose(
        fallback.node_distributions(prompt, paths)[0], plain.node_distributions(prompt, paths)[0], atol=1e-4
    )


def test_the_reference_pair_manifest_records_its_machine(micro_pair_dir):
    import json

    import torch

    manifest = json.loads((micro_pair_dir / "manifest.json").read_text())
    assert manifest["torch"] == torch.__version__ and manifest["threads"] == 1 and manifest["device"] == "cpu"
    assert manifest["cpu"] and manifest["seed"] == 0


def _forest(pair, prompt):
    """Three roots of different lengths with their own sampled trees (one of them a chain)."""
    roots = [prompt, prompt[:-3], prompt + (7, 11)]
    shapes = [Delayed(3, 1, 3), chain(4), Delayed(2, 2, 2)]
    return [(r, s.sample(NodeTable(pair, r), np.random.default_rng(i)).nodes()) for i, (r, s) in enumerate(zip(roots, shapes))]


@pytest.mark.parametrize("budget, packs", [("default", 1), ("one row", 3), ("below a row", 0)])
def test_forest_forward_equals_one_tree_forward_per_root(pair, prompt, monkeypatch, budget, packs):
    """Several roots' trees in one masked forward (or one pack per tree, or each through its own
    tree forward when the budget is below one row) give every node the logits of its own tree
    forward (1e-4)."""
    trees = _forest(pair, prompt)
    longest = max(len(r) + len({p[:d] for p in n for d in range(1, len(p) + 1)}) for r, n in trees)
    max_tokens = {"default": None, "one row": longest + 1, "below a row": 1}[budget]
    calls, real = [], HFPair._forest_rows
    monkeypatch.setattr(HFPair, "_forest_rows", lambda self, model, items: calls.append(len(items)) or real(self, model, items))
    got = pair.forest_logits(trees, max_tokens=max_tokens)
    assert len(calls) == 2 * packs  # one forward per model and pack
    for (root, paths), (got_p, got_q) in zip(trees, got):
        want_p, want_q = pair.node_logits(root, paths)
        assert got_p.shape == want_p.shape == (len(paths), pair.vocab_size) and got_p.dtype == np.float32
        np.testing.assert_allclose(got_p, want_p, atol=1e-4)
        np.testing.assert_allclose(got_q, want_q, atol=1e-4)


def test_forest_rows_do_not_see_each_other(pair, prompt):
    """A root's logits do not change when another root's tree joins its forward, and paths may be
    asked in any order, repeated, or without the root."""
    trees = _forest(pair, prompt)
    alone = pair.forest_logits(trees[:1])[0]
    shuffled = list(reversed(trees[0][1])) + [trees[0][1][1]]
    together = pair.forest_logits([(trees[0][0], shuffled), *trees[1:]])[0]
    index = {pth: i for i, pth in enumerate(trees[0][1])}
    np.testing.assert_allclose(together[0], alone[0][[index[pth] for pth in shuffled]], atol=1e-5)


def test_forest_without_tree_attention_batches_paths(micro_pair_dir, pair, prompt):
    fallback = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", tree_attention=False)
    trees = _forest(pair, prompt)
    for got, want in zip(fallback.forest_logits(trees), pair.forest_logits(trees)):
        np.testing.assert_allclose(got[0], want[0], atol=1e-4)


def test_forest_bad_input_is_a_value_error(pair, prompt):
    with pytest.raises(ValueError, match="^max_tokens"):
        pair.forest_logits([(prompt, [(1,)])], max_tokens=0)
    with pytest.raises(ValueError, match="^context: empty"):
        pair.forest_logits([(prompt, [(1,)]), ((), [(1,)])])
    with pytest.raises(ValueError, match="^context: "):
        pair.forest_logits([(prompt, [(pair.vocab_size,)])])


def test_a_logits_table_gives_the_same_bits_as_a_rows_table(pair, prompt):
    """NodeTable(rows="logits") keeps float32 logits and computes p, q on access: the same bits as
    the float64 rows, the same draws, the same labels."""
    from simlab.grid import draw_grid
    from simlab.labels import grid_labels

    tables = {mode: NodeTable(pair, prompt, rows=mode) for mode in ("float64", "logits")}
    drafts = {
        mode: draw_grid(t, K_max=2, L1_values=(0, 1, 2), L2_max=2, samples=2, rng=np.random.default_rng(3))
        for mode, t in tables.items()
    }
    assert drafts["float64"] == drafts["logits"]
    rows, logits = tables["float64"], tables["logits"]
    assert not logits._p and logits._logits  # nothing float64 kept
    for path in rows._p:
        assert np.array_equal(rows.p(path), logits.p(path)) and np.array_equal(rows.q(path), logits.q(path))
    labels = {
        mode: list(grid_labels(t, drafts[mode], ["specinfer", "traversal"], K_values=(1, 2), L2_values=(0, 1, 2)))
        for mode, t in tables.items()
    }
    import polars as pl

    assert pl.DataFrame(labels["float64"]).equals(pl.DataFrame(labels["logits"]))  # NaN standard errors compare equal


def test_logits_table_bad_input(pair, prompt):
    from simlab.pairs import MarkovPair

    with pytest.raises(ValueError, match="^rows"):
        NodeTable(pair, prompt, rows="float32")
    with pytest.raises(ValueError, match="^rows: 'logits' needs"):
        NodeTable(MarkovPair.random(3, np.random.default_rng(0)), (0,), rows="logits")
    table = NodeTable(pair, prompt, rows="logits")
    z = np.zeros((1, pair.vocab_size), dtype=np.float32)
    with pytest.raises(ValueError, match="^logits"):
        table.add_logits([(1,)], z, z[:, :-1])
    table.add_logits([(1,)], z, z)
    with pytest.raises(ValueError, match="already known"):
        table.add_logits([(1,)], z + 1, z)
    table.add_logits([(2,)], np.full_like(z, -np.inf), z)
    with pytest.raises(ValueError, match="^logits"):
        table.p((2,))
    row = np.full((1, pair.vocab_size), 1.0 / pair.vocab_size)
    with pytest.raises(ValueError, match="already known as logits"):
        table.add([(1,)], row, row)
    table.add([(3,)], row, row)
    with pytest.raises(ValueError, match="already known as rows"):
        table.add_logits([(3,)], z, z)
    with pytest.raises(ValueError, match="no logits kept"):
        table.logits([(1,), (3,)])
    assert table.logits([(1,)])[0].shape == (1, pair.vocab_size)


def test_an_error_of_our_own_in_the_probe_is_raised_not_taken_for_a_mask_refusal(micro_pair_dir, monkeypatch):
    """MASK_REJECTIONS covers the model's refusals only: a TypeError raised by backends/hf.py's own
    code (here a stand-in compiled under that file name) reaches the caller."""
    import backends.hf as hf

    namespace = {}
    exec(
        compile("def broken(self, model, items):\n    raise TypeError('a bug in the forest mask')\n", hf.__file__, "exec"),
        namespace,
    )
    monkeypatch.setattr(HFPair, "_forest_rows", namespace["broken"])
    with pytest.raises(TypeError, match="a bug in the forest mask"):
        HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


def test_an_error_of_tree_cache_in_the_probe_is_raised_too(micro_pair_dir, monkeypatch):
    """The same for backends/tree_cache.py (the kept-cache path the probe checks): its own errors are ours."""
    import backends.tree_cache as tree_cache

    namespace = {}
    exec(
        compile(
            "def broken(self, blocks, chunk, takes):\n    raise IndexError('a bug in the cached mask')\n",
            tree_cache.__file__,
            "exec",
        ),
        namespace,
    )
    monkeypatch.setattr(tree_cache.CachedTree, "feed", namespace["broken"])
    with pytest.raises(IndexError, match="a bug in the cached mask"):
        HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


def _variant_draft(micro_pair_dir, folder, **changes):
    """A random draft like the micro pair's (same tokenizer) with ``changes`` to its config."""
    import shutil

    import torch
    from transformers import AutoConfig, GPT2LMHeadModel

    config = AutoConfig.from_pretrained(micro_pair_dir / "draft")
    for name, value in changes.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(micro_pair_dir / "draft" / name, folder / name)
    return str(folder)


def test_a_draft_with_a_shorter_context_is_refused_at_load(micro_pair_dir, tmp_path, capsys):
    """Issue 28: a draft of 64 positions beside a target of 128 loaded, then a deep root was an
    IndexError from the draft's position embedding (72 lines)."""
    from backends.capture import main
    from conftest import capture_flags, one_error_line, write_prompts

    short = _variant_draft(micro_pair_dir, tmp_path / "short", n_positions=64)
    capsys.readouterr()  # saving's own progress bar
    with pytest.raises(
        ValueError, match=r"^draft: its context \(64 tokens, '.*short'\) is shorter than the target's \(128 tokens, "
    ):
        HFPair(str(micro_pair_dir / "target"), short, device="cpu")
    flags = capture_flags(micro_pair_dir, write_prompts(tmp_path, 1), tmp_path / "o", "--depth", "1") + ["--draft", short]
    with pytest.raises(SystemExit) as exc:
        main(flags)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and "--draft: its context (64 tokens" in err, err


def test_a_draft_with_a_larger_vocabulary_is_cut_only_when_asked(micro_pair_dir, pair, prompt, tmp_path, capsys):
    """Issue 28: a draft of 408 ids beside a target of 400 was cut and q renormalised silently.
    Refused now unless asked (trim_draft_vocab / --trim-draft-vocab), and then q is exactly the
    draft's softmax over the target's 400 ids, renormalised, and the capture says and records so."""
    import json

    import torch

    from backends.capture import main
    from conftest import capture_flags, one_error_line, write_prompts

    wide = _variant_draft(micro_pair_dir, tmp_path / "wide", vocab_size=pair.vocab_size + 8)
    capsys.readouterr()  # saving's own progress bar
    with pytest.raises(ValueError, match=r"^draft: its vocabulary \(408 ids, '.*wide'\) is larger than the target's \(400 ids, "):
        HFPair(str(micro_pair_dir / "target"), wide, device="cpu")
    trimmed = HFPair(str(micro_pair_dir / "target"), wide, device="cpu", trim_draft_vocab=True)
    assert (trimmed.vocab_size, trimmed.draft_vocab_size) == (400, 408)
    _, q = trimmed.distributions([prompt])
    with torch.no_grad():
        z = trimmed.draft(torch.tensor([prompt])).logits[0, -1, :400].double()
    assert np.abs(q[0] - torch.softmax(z, 0).numpy()).max() <= 1e-6 and abs(q[0].sum() - 1) <= 1e-12

    prompts = write_prompts(tmp_path, 1)
    base = capture_flags(micro_pair_dir, prompts, tmp_path / "o", "--depth", "1", "--width", "2", "--roots-per-forward", "1")
    for extra, says in (
        ([], "--draft: its vocabulary (408 ids"),
        (["--trim-draft-vocab"], "--trim-draft-vocab: the draft's vocabulary (400 ids) is not larger than the target's (400)"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(base + extra + (["--draft", wide] if not extra else []))
        err = capsys.readouterr().err
        assert exc.value.code == 2 and one_error_line(err) and says in err, err
    out = tmp_path / "trimmed"
    assert (
        main(
            capture_flags(micro_pair_dir, prompts, out, "--depth", "1", "--width", "2") + ["--draft", wide, "--trim-draft-vocab"]
        )
        == 0
    )
    assert "renormalised (--trim-draft-vocab" in capsys.readouterr().err
    assert json.loads((out / "settings.json").read_text())["trim_draft_vocab"] is True
