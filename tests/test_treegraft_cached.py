"""TreeGraft on live models with every root's nodes kept (``--evaluation cached``,
``backends.tree_cache.RootCache``) against the plain path (the pair's tree forward per fetch):
the same trees and per-root values to float32 rounding, the context prefilled once per root and
model, each node evaluated once for every schedule and table of its root."""

from __future__ import annotations

import numpy as np
import pytest

from analyses import treegraft
from backends import pretrained, tree_cache
from backends.drafts import quant
from backends.hf import HFPair
from backends.sources.base import Root
from simlab.latency import ForwardTime, LatencyModel
from simlab.sampling import SamplingSettings

TEXT = "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the"
FLAGS = ["--budget", "8", "--top-k", "3", "--depth", "2", "--fixed", "1,0", "--trajectories", "2"]


class Prompts:
    """Roots per setting as a live source yields them (one trajectory each)."""

    def __init__(self, pair, contexts):
        self.pair, self.contexts = pair, contexts

    def count(self, settings):
        return len(self.contexts)

    def roots(self, settings):
        pair = self.pair.with_settings(settings)
        for i, context in enumerate(self.contexts):
            yield Root(settings.name, i, i, context, pair, prompt_length=len(context) - 2, category=None)


@pytest.fixture(scope="module")
def pair(smollm2_folder):
    model, tokenizer = pretrained.load_target(smollm2_folder, layers=2)
    draft = quant.build(model, "quant:4:64")
    return HFPair("smollm2", "quant:4:64", device="cpu", models=((model, tokenizer), (draft, tokenizer)))


@pytest.fixture
def prefills(monkeypatch):
    """Counts the contexts each CachedTree prefills (one per model and evaluation)."""
    count = {"prefills": 0}
    original = tree_cache.CachedTree.__init__

    def init(self, pair, model, roots, **options):
        count["prefills"] += len(roots)
        original(self, pair, model, roots, **options)

    monkeypatch.setattr(tree_cache.CachedTree, "__init__", init)
    return count


def test_the_cached_evaluation_gives_the_plain_values_and_prefills_once_per_root(pair, prefills):
    context = pair.encode(TEXT)
    source = Prompts(pair, [context])
    settings = [SamplingSettings(temperature=0.0), SamplingSettings()]
    latency = LatencyModel.from_cost_ratio(0.3).with_drafter("small", ForwardTime.constant(0.011))
    out, long = {}, []
    hook = pair.target.register_forward_hook(lambda m, args, o: long.append(args[0].shape[1] >= len(context) - 2))
    for evaluation in ("plain", "cached"):
        config, _ = treegraft.parse_args(FLAGS + ["--evaluation", evaluation])
        prefills["prefills"], long[:] = 0, []
        out[evaluation] = treegraft.measure(config, source, settings, latency)
        out[evaluation + " prefills"], out[evaluation + " long"] = prefills["prefills"], sum(long)
    hook.remove()
    assert out["cached prefills"] == 2 * len(settings)  # two models, once per root and setting
    assert out["cached long"] == len(settings)  # the target over the context: once, the prompt score cache too
    assert out["plain prefills"] > 10 * out["cached prefills"]  # a prefill per fetch
    (plain_rows, plain_schedules, plain_margins), (rows, schedules, margins) = out["plain"], out["cached"]
    assert len(rows) == len(plain_rows) > 0 and len(schedules) == len(plain_schedules) > 0
    for got, want in zip(rows + schedules, plain_rows + plain_schedules):
        assert {k: v for k, v in got.items() if not isinstance(v, float)} == {
            k: v for k, v in want.items() if not isinstance(v, float)
        }  # the same trees: schedules, tokens, stops, graft positions
        for k, v in want.items():
            if isinstance(v, float):
                assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for name in plain_margins:
        for got, want in zip(margins[name], plain_margins[name]):
            np.testing.assert_allclose(got["z"], want["z"], rtol=1e-5, atol=1e-6)
            assert got["y"] == pytest.approx(want["y"], rel=1e-5, abs=1e-6)


def test_a_root_cache_evaluates_each_node_once_for_every_table_and_refuses_another_root(pair, prefills):
    context = pair.encode(TEXT)
    cache = tree_cache.RootCache(pair.with_settings(SamplingSettings(temperature=0.0)), context)
    raw = cache.with_settings(SamplingSettings())
    paths = [(), (11,), (11, 12), (13,)]
    p, q = cache.node_distributions(context, paths)
    raw_p, raw_q = raw.node_distributions(context, paths[::-1])  # all kept: no forward
    assert prefills["prefills"] == 2 and len(cache.kept) == 4
    want_p, want_q = pair.with_settings(SamplingSettings()).node_distributions(context, paths[::-1])
    np.testing.assert_allclose(raw_p, want_p, atol=1e-5)
    np.testing.assert_allclose(raw_q, want_q, atol=1e-5)
    assert set(np.flatnonzero(p[2])) == {int(np.argmax(want_p[1]))}  # T = 0: one-hot at the target's argmax
    with pytest.raises(ValueError, match="^root: "):
        cache.node_logits(context[:-1], paths)
    with pytest.raises(ValueError, match="^evaluation: "):
        tree_cache.node_table(pair, context, "fast")
    assert isinstance(tree_cache.node_table(pair, context, "cached").pair, tree_cache.RootCache)
    assert tree_cache.node_table(pair, context, "plain").pair is pair


def test_the_prefix_rows_of_one_forward_are_the_plain_rows_of_every_prefix(pair):
    from simlab.treegraft import prompt_cache

    context = pair.encode(TEXT)
    plain, _ = pair.distributions([context[:i] for i in range(1, 11)])
    np.testing.assert_allclose(pair.prefix_distributions(context, 10, rows=3), plain, atol=1e-5)
    cold = pair.with_settings(SamplingSettings(temperature=0.5))
    np.testing.assert_allclose(
        cold.prefix_distributions(context, 4), cold.distributions([context[:i] for i in range(1, 5)])[0], atol=1e-5
    )
    fast, slow = prompt_cache(pair, context, 10), prompt_cache(Plain(pair), context, 10)
    assert fast.last == slow.last == 10 and [sorted(fast.top[i]) for i in fast.top] == [sorted(slow.top[i]) for i in slow.top]
    for i in fast.top:
        assert fast.floor[i] == pytest.approx(slow.floor[i], abs=1e-4)
    for bad, match in ((0, "^last: "), (len(context) + 1, "^last: ")):
        with pytest.raises(ValueError, match=match):
            pair.prefix_distributions(context, bad)


def test_a_root_cache_takes_the_prompt_rows_from_its_own_prefill(pair, prefills):
    """TreeGraft's prompt score cache on a fresh ``RootCache``: the rows come from the prefill that
    builds the caches (the target runs once over the context, not twice), equal to the pair's own
    forward to float32 rounding, and so are the root's row and the nodes evaluated after it; asked
    again (the caches built), at another context or past the root, the pair's forward answers."""
    context = pair.encode(TEXT)
    calls = []
    hook = pair.target.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[1] if args else None))
    try:
        cache = tree_cache.RootCache(pair.with_settings(SamplingSettings(temperature=0.5)), context)
        rows = cache.prefix_distributions(context, len(context) - 1)
        assert prefills["prefills"] == 2 and len(calls) == 1  # the two caches' prefills; one target forward
        assert rows.shape == (len(context) - 1, pair.vocab_size) and rows.dtype == np.float64
        cold = pair.with_settings(SamplingSettings(temperature=0.5))
        np.testing.assert_allclose(rows, cold.prefix_distributions(context, len(context) - 1), atol=1e-5)
        paths = [(), (11,), (11, 12)]
        p, q = cache.node_distributions(context, paths)
        assert prefills["prefills"] == 2 and calls == [len(context), len(context) - 1, 2]  # prefill, reference, nodes
        want_p, want_q = cold.node_distributions(context, paths)  # the reference: a tree forward of its own
        np.testing.assert_allclose(p, want_p, atol=1e-5)
        np.testing.assert_allclose(q, want_q, atol=1e-5)
        calls.clear()
        before = prefills["prefills"]
        again = cache.prefix_distributions(context, 4)  # the caches exist: the pair's own forward
        assert calls == [4] and prefills["prefills"] == before
        np.testing.assert_allclose(again, rows[:4], atol=1e-5)
        other = tree_cache.RootCache(cold, context)
        calls.clear()
        np.testing.assert_allclose(other.prefix_distributions(context[:-1], 3), rows[:3], atol=1e-5)
        assert calls == [3] and other.session._trees is None  # another context: nothing prefilled
    finally:
        hook.remove()
    for bad in (0, len(context) + 1, True):
        with pytest.raises(ValueError, match="^last: "):
            tree_cache.RootCache(cold, context).prefix_distributions(context, bad)


class Plain:
    """The pair without ``prefix_distributions``: one ``distributions`` row per prefix."""

    def __init__(self, pair):
        self.pair, self.vocab_size = pair, pair.vocab_size

    def distributions(self, contexts):
        return self.pair.distributions(contexts)
