"""The lab's declarations read where they are declared, never restated by name (issue 41, item 3):
measurable verifiers from the verifier registry, sampled and parallel builders from their classes,
draft kinds by prefix, one verifier coercion, the grid's default axes from ``GridAxes``, the
frozen ``TreeValue`` the sweep shares with every study."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import numpy as np
import pytest

from simlab import builders, grid, tree_verifiers, verifiers
from simlab.drafting import Drafting
from simlab.engine_metrics import aggregate, tree_metrics
from simlab.latency import LatencyModel
from simlab.pairs import MarkovPair
from simlab.trees import NodeTable
from simlab.valuation import TreeValue, draw_trees, tree_value, trees_value

ROOT = Path(__file__).resolve().parent.parent


# -- builders -------------------------------------------------------------------------------------
def test_the_builder_registry_holds_the_classes_themselves():
    """No wrapper between a name and its builder: ``treegraft`` and ``specblock`` are their classes."""
    from simlab.specblock.builder import RankGuided
    from simlab.treegraft.builder import TreeGraft

    assert builders.REGISTRY["treegraft"] is TreeGraft and builders.REGISTRY["specblock"] is RankGuided
    assert all(inspect.isclass(entry) or inspect.isfunction(entry) for entry in builders.REGISTRY.values())


def test_sampled_and_parallel_builders_are_read_from_their_declarations(monkeypatch):
    assert {n for n in builders.names() if builders.sampled(n)} == {"delayed", "iid", "chain", "sequoia", "greedy_draft"}
    assert {n for n in builders.names() if builders.parallel_draft(n)} == {"medusa", "ddtree"}

    @dataclasses.dataclass(frozen=True)
    class Toy:
        default_laws = frozenset({Drafting.WITHOUT_REPLACEMENT})
        parallel_draft = True

    monkeypatch.setitem(builders.REGISTRY, "toy", Toy)
    assert builders.sampled("toy") and builders.parallel_draft("toy")
    monkeypatch.setattr(Toy, "default_laws", frozenset({Drafting.DETERMINISTIC}))
    monkeypatch.delattr(Toy, "parallel_draft")
    assert not builders.sampled("toy") and not builders.parallel_draft("toy")
    for bad in ("nope", 3):
        with pytest.raises(ValueError, match="^name: "):
            builders.sampled(bad)
        with pytest.raises(ValueError, match="^name: "):
            builders.parallel_draft(bad)


def test_the_parallel_study_reads_each_trees_drafter_from_its_builder():
    from analyses import parallel_drafters

    expected = {"eagle2": "autoregressive", "static": "autoregressive", "medusa": "parallel", "ddtree": "parallel"}
    assert parallel_drafters.DRAFTERS == expected
    assert set(parallel_drafters.builders_at(8, 4)) == set(parallel_drafters.TREES)


# -- measures -------------------------------------------------------------------------------------
def test_every_registered_node_verifier_is_measurable():
    """A verifier added by ``register`` is measured by its own ``acceptance_rate``; the default set
    stays DDTE's seven methods."""
    from simlab import measures

    class Twin(verifiers.get("spectr").__class__):
        name = "twin_of_spectr"

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    rng = np.random.default_rng(0)
    assert measures.DDTE_METHODS == ("nss", "naive", "spectr", "specinfer", "rrs_wor", "khisti", "optimal")
    assert set(measures.node_acceptance(p, q, [2], rng)) == {f"alpha_{m}_k2" for m in measures.DDTE_METHODS}
    assert set(verifiers.names()) <= set(measures.measurable())
    verifiers.register(Twin)
    try:
        assert "twin_of_spectr" in measures.measurable()
        got = measures.node_acceptance(p, q, [1, 2], rng, methods=["twin_of_spectr", "spectr"])
        assert got["alpha_twin_of_spectr_k2"] == got["alpha_spectr_k2"] and got["alpha_twin_of_spectr_k1"] == 0.7
    finally:
        verifiers.unregister("twin_of_spectr")
    with pytest.raises(ValueError, match="^methods: unknown twin_of_spectr"):
        measures.node_acceptance(p, q, [2], rng, methods=["twin_of_spectr"])


# -- one verifier coercion ------------------------------------------------------------------------
def test_one_public_verifier_coercion():
    v = tree_verifiers.as_verifier("specinfer")
    assert isinstance(v, tree_verifiers.TreeVerifier) and not v.allow_lossy
    assert tree_verifiers.as_verifier(v) is v
    lossy = tree_verifiers.as_verifier(v, allow_lossy=True)
    assert lossy.allow_lossy and lossy is not v and not v.allow_lossy
    assert tree_verifiers.as_verifier("specinfer", allow_lossy=True).allow_lossy
    for bad in (3, None, verifiers.get("nss")):  # a node verifier is no tree verifier
        with pytest.raises(ValueError, match="^verifier: must be a tree-verifier name or object"):
            tree_verifiers.as_verifier(bad)
    with pytest.raises(ValueError, match="^name: "):
        tree_verifiers.as_verifier("no_such_verifier")
    table = NodeTable(MarkovPair.random(6, np.random.default_rng(1)), (0,))
    latency = LatencyModel.from_cost_ratio(0.3)
    with pytest.raises(ValueError, match="^verifier: "):  # the valuation and the grid take it too
        tree_value(builders.get("iid", K=2, L=1), table, 3, latency, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="^verifier: "):
        grid.action_grid_block_efficiency(table.pair, (0,), 3, K_values=(1,), L1_values=(0,), L2_values=(1,), samples=1)


# -- the grid's default axes ------------------------------------------------------------------------
def test_the_grids_defaults_are_ddte_axes():
    axes = grid.DDTE_AXES
    assert axes == grid.GridAxes() and (axes.width, axes.depth) == (4, 8)
    expected = {
        "K_values": axes.K_values,
        "L1_values": axes.L1_values,
        "L2_values": axes.L2_values,
        "K_max": axes.width,
        "L2_max": axes.depth,
    }
    seen = 0
    for _, fn in inspect.getmembers(grid, inspect.isfunction):
        for name, parameter in inspect.signature(fn).parameters.items():
            if name in expected and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == expected[name], (fn.__name__, name)
                seen += 1
    assert seen >= 14
    source = (ROOT / "simlab" / "grid.py").read_text()
    assert source.count("(1, 2, 3, 4)") == 1 and source.count("tuple(range(9))") == 2  # in GridAxes only


# -- the frozen value of a builder at a root --------------------------------------------------------
@pytest.fixture(scope="module")
def root():
    pair = MarkovPair.random(5, np.random.default_rng(4), eos_id=4)
    return NodeTable(pair, (0, 1)), LatencyModel.from_cost_ratio(0.3, per_token=0.002)


def test_tree_value_is_a_frozen_value_object(root):
    table, latency = root
    value = tree_value(builders.get("iid", K=2, L=2), table, "specinfer", latency, samples=3, rng=np.random.default_rng(5))
    assert isinstance(value, TreeValue) and len(value.trees) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.E = 0.0
    assert value["E"] == value.E and value.TPS == value.E / value.T
    with pytest.raises(KeyError):
        value["TPS_typo"]
    with pytest.raises(ValueError, match="^trees: "):
        trees_value([], "specinfer", latency)


@pytest.mark.parametrize("builder,samples", [("eagle2", 1), ("sequoia", 3), ("iid", 4)])
def test_trees_value_agrees_with_the_per_tree_reference(root, builder, samples):
    """What the sweep reads from a ``TreeValue`` (EOS-truncated and plain metrics, their mean, its
    standard error, T, tokens) equals the per-tree reference (``tree_metrics`` tree by tree, the
    sweep's valuation before it shared this one), bit for bit."""
    table, latency = root
    options = {"iid": {"K": 2, "L": 2}, "sequoia": {"acceptance": (0.6, 0.3, 0.1), "budget": 4}, "eagle2": {"budget": 6}}[builder]
    made = builders.get(builder, **options)
    trees = draw_trees(made, table, drafting=table.untempered(), samples=samples, rng=np.random.default_rng(7))
    name = "onehot" if made.deterministic else ("rrs_wor" if builder == "sequoia" else "specinfer")
    value = trees_value(trees, name, latency)
    v = tree_verifiers.get(name)
    eos = [tree_metrics(t, v, eos=True) for t in trees]
    plain = [tree_metrics(t, v, eos=False) for t in trees]
    lengths = [m.accept_length for m in eos]
    assert value.metrics.accept_length == float(np.mean(lengths))
    assert value.metrics_se == (float(np.std(lengths, ddof=1) / np.sqrt(len(lengths))) if len(lengths) > 1 else 0.0)
    assert value.metrics.row() == aggregate(eos).row() and value.plain.row() == aggregate(plain).row()
    assert value.T == float(np.mean([latency.tree_step_time(len(table.context), t) for t in trees]))
    assert value.tokens == float(np.mean([t.tokens() for t in trees]))
    assert value.E == float(np.mean([v.expected_block_efficiency(t) for t in trees]))
    assert value.E == pytest.approx(value.metrics.accept_length, abs=1e-12)


# -- draft kinds by prefix --------------------------------------------------------------------------
def test_draft_kinds_are_found_by_prefix(monkeypatch, tmp_path):
    from backends import drafts, pretrained

    assert list(drafts.KINDS) == ["early-exit", "adapter", "quant"]
    assert drafts.kind_of("quant:4:64").prefix == "quant" and drafts.kind_of("adapter:6").prefix == "adapter"
    assert drafts.kind_of("medusa:3") is None and drafts.kind_of(None) is None
    assert pretrained.draft_folder("quant:4:64") is None and pretrained.draft_folder("early-exit:3") is None
    assert pretrained.draft_folder("adapter:14") == pretrained.adapter_folder("adapter:14")
    config = {"num_hidden_layers": 4, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2}
    config |= {"num_key_value_heads": 1, "vocab_size": 32, "tie_word_embeddings": True}
    toy = drafts.DraftKind(
        "toy",
        "toy:N (a toy)",
        lambda spec: f"toy:{int(spec.partition(':')[2])}",
        lambda spec, cfg, adapter_layers: 2,
        lambda spec: 0.5,
        lambda spec, root: root / spec.replace(":", "-"),
        lambda target, spec, folder: ("built", target, spec, folder),
    )
    with pytest.raises(ValueError, match="^draft: a named pair takes .* or quant:B:G"):
        pretrained.parse_draft("toy:03")
    monkeypatch.setitem(drafts.KINDS, "toy", toy)
    monkeypatch.setattr(pretrained, "SHIPPED_DRAFTS", tmp_path / "shipped")
    monkeypatch.setattr(pretrained, "cache_dir", lambda: tmp_path / "user")
    assert pretrained.parse_draft("toy:03") == "toy:3"
    assert pretrained.draft_folder("toy:3") == tmp_path / "user" / "drafts" / "toy-3"
    (tmp_path / "shipped" / "toy-3").mkdir(parents=True)
    (tmp_path / "shipped" / "toy-3" / "manifest.json").write_text("{}")
    assert pretrained.draft_folder("toy:3") == tmp_path / "shipped" / "toy-3"  # shipped where the cache has none
    assert pretrained.draft_model("T", "toy:3") == ("built", "T", "toy:3", tmp_path / "shipped" / "toy-3")
    half = pretrained.weight_ratio("toy:3", config)
    assert half == pytest.approx(pretrained.weight_ratio("early-exit:2", config) / 2, abs=1e-15)
    assert "toy:N (a toy)" in drafts.listed()
    with pytest.raises(ValueError, match="^kind: the prefix 'toy' is already registered"):
        drafts.register(toy)
    with pytest.raises(ValueError, match="^kind: must be a DraftKind"):
        drafts.register("toy")
