"""Every study's node table is its source's (``Root.table()``, ``backends.sources.base.Tables``):
live models evaluate each tree node once on the root's kept KV caches (``--evaluation cached``,
``backends.tree_cache.RootCache``) and give the plain evaluation's values to float32 rounding;
synthetic worlds and captures keep the plain ``NodeTable``; ``--evaluation`` is an hf-only flag."""

from __future__ import annotations

import importlib

import itertools
import json
from collections import Counter

import numpy as np
import polars as pl
import pytest
from conftest import live_pair_flags, one_error_line, write_prompts

from analyses import sweep
from backends import tree_cache
from backends.sources import HFSource, SyntheticSource
from backends.sources.base import Root
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

CONFIGS = [{"engine": "eagle", "total_token": 6, "depth": 2, "top_k": 3}]


@pytest.fixture
def forwards(monkeypatch):
    """Counts, while a ``NodeTable`` fetches nodes (not the pair's probe at load), the contexts
    ``CachedTree``s prefill and the nodes fed to each."""
    seen, made = {"prefills": 0, "fed": {}, "fetching": False}, itertools.count()
    init, feed, fetch = tree_cache.CachedTree.__init__, tree_cache.CachedTree.feed, NodeTable.fetch

    def counted_init(self, pair, model, roots):
        seen["prefills"] += len(roots) if seen["fetching"] else 0
        self.counted_as = next(made)  # not id(self): a freed instance's id is reused
        init(self, pair, model, roots)

    def counted_feed(self, blocks, chunk, takes):
        if seen["fetching"]:
            seen["fed"].setdefault(self.counted_as, Counter()).update(n for block in blocks for n in block)
        return feed(self, blocks, chunk, takes)

    def counted_fetch(self, paths):
        seen["fetching"] = True
        try:
            return fetch(self, paths)
        finally:
            seen["fetching"] = False

    monkeypatch.setattr(tree_cache.CachedTree, "__init__", counted_init)
    monkeypatch.setattr(tree_cache.CachedTree, "feed", counted_feed)
    monkeypatch.setattr(NodeTable, "fetch", counted_fetch)
    return seen


@pytest.mark.slow  # two live runs on the micro pair: about 4 s
def test_a_live_sweep_gives_the_plain_values_with_each_node_evaluated_once(micro_pair_dir, tmp_path, forwards):
    config = tmp_path / "engines.json"
    config.write_text(json.dumps(CONFIGS))
    flags = [*live_pair_flags(micro_pair_dir), "--prompts", write_prompts(tmp_path, 1), "--trajectories", "1"]
    flags += ["--roots-per-trajectory", "1", "--spacing", "4", "--settings", "1,0", "--device", "cpu", "--quiet"]
    flags += ["--config", str(config), "--latency", "sequoia-demo"]
    counts = {}
    for evaluation in ("plain", "cached"):
        forwards["prefills"], forwards["fed"] = 0, {}
        assert sweep.main([*flags, "--evaluation", evaluation, "--out", str(tmp_path / evaluation)]) == 0
        counts[evaluation] = forwards["prefills"], dict(forwards["fed"])
    tables = 1 * 2  # roots x settings: one table per root and setting
    prefills, fed = counts["cached"]
    assert prefills == 2 * tables and len(fed) == 2 * tables  # each root's context once per model
    assert all(max(nodes.values()) == 1 for nodes in fed.values())  # each node through each model once
    assert counts["plain"][0] > 2 * prefills  # the reference prefills the context per fetch
    assert sum(map(sum, (c.values() for c in counts["plain"][1].values()))) > sum(sum(c.values()) for c in fed.values())
    key = ["setting", "root", "config", "mode"]
    plain = pl.read_parquet(tmp_path / "plain" / "per_root.parquet").sort(key)
    cached = pl.read_parquet(tmp_path / "cached" / "per_root.parquet").sort(key)
    assert cached.height == plain.height == 2 * 1 * 1 * 2  # settings x roots x configs x modes
    floats = [c for c, t in plain.schema.items() if t == pl.Float64]
    assert {"E", "accept_length"} <= set(floats)
    assert cached.drop(floats).equals(plain.drop(floats))  # the same trees
    for column in floats:
        np.testing.assert_allclose(cached[column].to_numpy(), plain[column].to_numpy(), rtol=0, atol=1e-6, err_msg=column)


def test_the_live_source_table_follows_its_evaluation(micro_pair_dir, tmp_path):
    folders = [str(micro_pair_dir / w) for w in ("target", "draft")]
    with pytest.raises(ValueError, match="^evaluation: "):
        HFSource(*folders, evaluation="fast")
    pairs = {}
    for evaluation in ("cached", "plain"):
        source = HFSource(*folders, write_prompts(tmp_path, 1), 1, 1, 3, depth=2, device="cpu", evaluation=evaluation)
        root = next(iter(source.roots(SamplingSettings())))
        table = root.table()
        assert type(table) is NodeTable and table.context == root.context and root.source is source
        pairs[evaluation] = table.pair, root.pair
    assert isinstance(pairs["cached"][0], tree_cache.RootCache) and pairs["plain"][0] is pairs["plain"][1]


def test_synthetic_roots_and_hand_made_roots_keep_the_plain_table():
    source = SyntheticSource("depth_profile", 8, 1, 2, 4, 0)
    for root in source.roots(SamplingSettings(0.7)):
        table = root.table()
        assert root.source is source and type(table) is NodeTable and table.pair is root.pair
        np.testing.assert_array_equal(table.p((1, 2)), NodeTable(root.pair, root.context).p((1, 2)))
    bare = Root(root.setting, root.trajectory, root.root, root.context, root.pair)
    assert bare.table().pair is root.pair and bare == root  # the source is not compared


@pytest.mark.parametrize(
    "flags",
    [["--evaluation", "plain"], ["--evaluation", "cached", "--world", "depth_profile"], ["--trajectory", "cached"]],
)
def test_evaluation_is_refused_off_live_models(flags, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        sweep.main([*flags, "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and f"{flags[0]}: the synthetic source cannot honour it" in err, err
    assert "it applies to live models only: --backend hf or --pair" in err, err


@pytest.mark.parametrize(
    "study, flag",
    [
        ("sweep", ["--evaluation", "plain"]),
        ("sweep", ["--dtype", "bfloat16"]),
        ("compare_verifiers", ["--device", "cpu"]),
        ("treegraft", ["--trajectory", "forward"]),
    ],
)
def test_live_model_flags_on_a_capture_say_they_apply_to_live_models_only(study, flag, tmp_path, capsys):
    """A capture's p and q are recorded: ``--evaluation``, ``--trajectory``, ``--dtype`` and (in a study with no live
    models of its own beside a capture; the sweep's feature models take ``--device``) ``--device``
    are refused with their own reason, not the capture source's general one (refused before the
    folder is read)."""
    main = importlib.import_module(f"analyses.{study}").main
    with pytest.raises(SystemExit) as exc:
        main(["--capture", str(tmp_path / "cap"), *flag, "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err), err
    assert f"error: {flag[0]}: the capture source cannot honour it (it applies to live models only: --backend hf or --pair" in err
    assert ("at the dtype the capture recorded" in err) == (flag[0] == "--dtype"), err
    assert "brings its own roots" not in err and not (tmp_path / "o").exists()
