"""Trees evaluated on kept KV caches (``backends.tree_cache``): the same logits as one tree forward
(float32 rounding), every node fed once, roots of different lengths in one batch, and the
capture's ``--evaluation cached`` against ``forward``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from backends import tree_cache
from backends.capture import main
from backends.capture_store import load_settings, read_capture
from backends.hf import HFPair
from conftest import capture_flags, write_prompts
from simlab.grid import draw_grid, draw_grids
from simlab.pairs import MarkovPair
from simlab.trees import NodeTable

LEVELS = [[(), (5,), (9,), (11,)], [(5, 7), (9, 3), (9, 8), (11, 2)], [(5, 7, 1), (9, 3, 4), (11, 2, 2)]]


@pytest.fixture(scope="module")
def pair(micro_pair_dir):
    return HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", max_batch=3)


@pytest.fixture(scope="module")
def roots(pair):
    return [pair.encode("The for statement is used to iterate over"), pair.encode("A class")]


@pytest.fixture
def fed(monkeypatch):
    """Counts the real (non-padding) tokens every CachedTree.feed call appends, per model."""
    count = {"tokens": 0}
    original = tree_cache.CachedTree.feed

    def feed(self, blocks, chunk, takes):
        count["tokens"] += sum(len(block) for block in blocks)
        return original(self, blocks, chunk, takes)

    monkeypatch.setattr(tree_cache.CachedTree, "feed", feed)
    return count


def test_a_session_fed_level_by_level_gives_the_tree_forward_logits_and_feeds_each_node_once(pair, roots, fed):
    session = pair.session(roots)  # two contexts of different lengths: left padding in one batch
    got = [{}, {}]
    for level in LEVELS:
        requests = [level, level[:2]]  # the second root's tree is smaller
        for b, both in enumerate(session.logits(requests)):
            for i, path in enumerate(requests[b]):
                got[b][path] = (both[0][i], both[1][i])
    nodes = [sorted(g) for g in got]
    closure = [{n[:d] for n in ns for d in range(1, len(n) + 1)} for ns in nodes]  # (9,) of root 1: a missing ancestor
    assert fed["tokens"] == 2 * sum(len(c) for c in closure)  # two models, each node once
    for b, root in enumerate(roots):
        want_p, want_q = pair.node_logits(root, nodes[b])
        for i, path in enumerate(nodes[b]):
            np.testing.assert_allclose(got[b][path][0], want_p[i], rtol=0, atol=1e-4)
            np.testing.assert_allclose(got[b][path][1], want_q[i], rtol=0, atol=1e-4)


def test_a_node_asked_again_is_evaluated_again_as_a_copy(pair, roots):
    session = pair.session(roots[:1])
    first = session.logits([[(5,), (5, 7)]])[0]
    again = session.logits([[(5, 7), (5, 7, 1)]])[0]
    np.testing.assert_allclose(again[0][0], first[0][1], rtol=0, atol=1e-4)
    want = pair.node_logits(roots[0], [(5, 7, 1)])[0][0]
    np.testing.assert_allclose(again[0][1], want, rtol=0, atol=1e-4)  # its child still sees the first (5, 7)


def test_a_session_member_is_a_node_logits_pair(pair, roots):
    session = pair.session(roots)
    table = NodeTable(session.member(1), roots[1], rows="logits")
    table.fetch([(), (4,), (4, 2)])
    np.testing.assert_allclose(table.p((4, 2)), NodeTable(pair, roots[1]).p((4, 2)), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="another root"):
        session.member(0).node_logits(roots[1], [(1,)])
    with pytest.raises(ValueError, match="one list of paths per root"):
        session.logits([[(1,)]])
    with pytest.raises(ValueError, match="roots: at least one"):
        pair.session([])


def test_draw_grids_in_lockstep_draw_what_draw_grid_draws():
    pair = MarkovPair.random(12, np.random.default_rng(3))
    options = dict(K_max=3, L1_values=range(4), L2_max=3, samples=2)
    tables = [NodeTable(pair, (1,)), NodeTable(pair, (2, 5))]
    calls = []

    def fetch(frontiers):
        calls.append(frontiers)
        for table, paths in zip(tables, frontiers):
            table.fetch(paths)

    together = draw_grids(tables, [np.random.default_rng(s) for s in (7, 8)], fetch=fetch, **options)
    alone = [draw_grid(NodeTable(pair, t.context), rng=np.random.default_rng(s), **options) for t, s in zip(tables, (7, 8))]
    assert together == alone
    assert len(calls) == 3 + 3  # one fetch per level for both roots
    with pytest.raises(ValueError, match="rngs: one per table"):
        draw_grids(tables, [np.random.default_rng(0)], **options)


def test_cached_and_forward_evaluation_capture_the_same_trees_and_statistics(micro_pair_dir, tmp_path, capsys):
    prompts = write_prompts(tmp_path, 3)
    grid = ["--shape", "grid", "--width", "2", "--depth", "2", "--samples", "2", "--full", "--roots-per-forward", "2"]
    assert main(capture_flags(micro_pair_dir, prompts, tmp_path / "cached", *grid)) == 0
    assert main(capture_flags(micro_pair_dir, prompts, tmp_path / "forward", *grid, "--evaluation", "forward")) == 0
    cached, forward = read_capture(str(tmp_path / "cached")), read_capture(str(tmp_path / "forward"))
    assert cached.select("root", "path").equals(forward.select("root", "path"))
    for column in ("tv", "kl_pq", "h_p", "h_q"):
        assert (cached[column] - forward[column]).abs().max() < 1e-5, column
    # settings.json from before the flag: the forward evaluation, resumed only with --evaluation forward
    out = tmp_path / "forward"
    data = json.loads((out / "settings.json").read_text())
    del data["format"], data["evaluation"]  # format 0: a settings.json from before the field
    (out / "settings.json").write_text(json.dumps(data))
    assert load_settings(out).evaluation == "forward"
    assert main(capture_flags(micro_pair_dir, prompts, out, *grid, "--evaluation", "forward")) == 0
    with pytest.raises(SystemExit) as exc:
        main(capture_flags(micro_pair_dir, prompts, out, *grid))
    assert exc.value.code == 2 and "evaluation" in capsys.readouterr().err


def test_without_tree_attention_a_session_batches_paths(micro_pair_dir, roots, fed):
    plain = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", tree_attention=False)
    session = plain.session(roots)
    got = session.logits([LEVELS[1], LEVELS[0]])
    for b, paths in enumerate([LEVELS[1], LEVELS[0]]):
        for a, want in zip(got[b], plain.node_logits(roots[b], paths)):
            np.testing.assert_array_equal(a, want)
    assert fed["tokens"] == 0  # no cache was built


def test_a_session_keeps_only_the_root_logits_and_refuses_too_long_roots(pair, roots):
    session = pair.session(roots)
    session.logits([[(1,)], [(2,)]])
    kept = session._trees[0].root_logits  # review: a view kept the (rows, context, V) prefix logits alive
    assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()
    with pytest.raises(ValueError, match="exceed the model's context"):
        pair.session([roots[0], (1,) * (pair.max_context + 2)])
