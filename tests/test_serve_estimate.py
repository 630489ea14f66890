"""The serving estimator (``analyses.serve_estimate``): its rows are the core's exact values, both
aggregations match hand computations, its exports parse back, its bad flags exit 2 with one line,
and the engine's adjustments and refusals reach its table.  One full run (charts included) is
shared; the others stub the chart writer."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import one_error_line

from analyses import _engine_valuation as valuation
from analyses import serve_estimate
from analyses._engine_configs import EngineConfig
from backends.sources import SyntheticSource
from simlab import acceptance_profiles as profiles
from simlab import builders, tree_verifiers
from simlab.efficiency import expected_block_efficiency
from simlab.engine_metrics import tree_metrics
from simlab.latency import ForwardTime, LatencyModel
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

VLLM = [{"engine": "vllm", "num_speculative_tokens": k} for k in (1, 3)]
SOURCE = [
    "--world",
    "repetitive_diverse",
    "--vocab",
    "16",
    "--trajectories",
    "2",
    "--roots-per-trajectory",
    "2",
    "--spacing",
    "8",
]
COMMON = [*SOURCE, "--engine", "vllm", "--modes", "one_hot", "--draft-prices", "0.05,0.3", "--quiet"]


def write_config(folder, entries) -> str:
    path = folder / "engine.json"
    path.write_text(json.dumps(entries))
    return str(path)


def no_chart(monkeypatch):
    monkeypatch.setattr(serve_estimate, "chart_writer", lambda chart, fmt: lambda tmp: open(tmp, "w").close())
    monkeypatch.setattr(serve_estimate, "chart", lambda *args, **kwargs: None)


LATENCY = LatencyModel(
    ForwardTime.affine(0.1, 0.01, 0.002), ForwardTime.affine(1.0, 0.01, 0.002), "a context-dependent test profile"
)
"""A target whose one-token forward grows with the context, so that plain decoding's time varies by root."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    out = folder / "out"
    LATENCY.save(folder / "latency.json")
    argv = [*COMMON, "--settings", "0,1", "--config", write_config(folder, VLLM), "--latency", str(folder / "latency.json")]
    assert serve_estimate.main([*argv, "--out", str(out)]) == 0
    return out


def test_rows_are_the_core_exact_values(run):
    """E, the engines' metrics, 1 - TV along the top-1 chain and the speed-up at both prices,
    recomputed here from the core at every root."""
    per_root = pl.read_parquet(run / "per_root.parquet")
    speed = pl.read_parquet(run / "speedup.parquet")
    tv = pl.read_parquet(run / "one_minus_tv.parquet")
    source = SyntheticSource("repetitive_diverse", 16, 2, 2, 8, 0, stream="per_trajectory")
    latency = LATENCY
    checked = 0
    for setting in (SamplingSettings(0.0), SamplingSettings(1.0)):
        roots = list(source.roots(setting))
        requests = np.array([root.trajectory for root in roots])
        psi = {"a": {}, "b": {}}

        def clustered(values):
            sums = np.array([values[requests == g].sum() for g in np.unique(requests)])
            return np.sqrt(sums.size / (sums.size - 1) * np.sum(sums**2))

        chains = {}
        for root in roots:  # 1 - TV along the untempered draft's argmax chain, p and q under the setting
            table = NodeTable(root.pair, root.context)
            raw, path, values = table.untempered(), (), []
            for _ in range(3):
                values.append(float(np.minimum(table.p(path), table.q(path)).sum()))
                path += (int(np.argmax(raw.q(path))),)
            chains[root.root] = values
        for d in range(3):
            row = tv.filter((pl.col("setting") == setting.name) & (pl.col("position") == d + 1))
            assert row["one_minus_tv"][0] == pytest.approx(np.mean([v[d] for v in chains.values()]), abs=1e-12)
        for k in (1, 3):
            name = f"vllm num_speculative_tokens={k}"
            E, T, Tp = {}, {0.05: [], 0.3: []}, []
            for root in roots:
                builder = builders.EAGLE2(k, k - 1, 1)
                exact = expected_block_efficiency(root.pair, root.context, builder, "onehot", method="exact").mean
                table = NodeTable(root.pair, root.context)
                tree = builder.sample(table.untempered()).on(table)
                metrics = tree_metrics(tree, tree_verifiers.get("onehot"), eos=False)
                row = per_root.filter(
                    (pl.col("setting") == setting.name) & (pl.col("root") == root.root) & (pl.col("config") == name)
                )
                assert row["E"][0] == pytest.approx(exact, abs=1e-12)
                assert row["accept_length"][0] == pytest.approx(metrics.accept_length, abs=1e-12)
                assert row["accepted"][0] == pytest.approx(metrics.accepted, abs=1e-12)
                E[root.root] = exact
                for r in T:
                    priced = LatencyModel(latency.target.scaled(r), latency.target)
                    T[r].append(priced.tree_step_time(len(root.context), tree))
                Tp.append(latency.target(len(root.context), 1))
                checked += 1
            for label, r in (("a", 0.05), ("b", 0.3)):
                e, t, tp = np.array(list(E.values())), np.array(T[r]), np.array(Tp)
                want = e.mean() * tp.mean() / t.mean()
                got = speed.filter((pl.col("setting") == setting.name) & (pl.col("config") == name) & (pl.col("price") == label))
                assert got["speedup"][0] == pytest.approx(want, rel=1e-12)
                # the delta method's linearisation, summed per request: sqrt(G / (G - 1) sum_g s_g^2)
                psi[label][k] = (
                    want / e.size * ((e - e.mean()) / e.mean() - (t - t.mean()) / t.mean() + (tp - tp.mean()) / tp.mean())
                )
                assert got["speedup_se"][0] == pytest.approx(clustered(psi[label][k]), rel=1e-9, abs=1e-15)
        for label in ("a", "b"):  # the runner-up's gap to the best, paired on the same roots
            ranked = speed.filter((pl.col("setting") == setting.name) & (pl.col("price") == label)).sort("rank")
            best, second = (int(c.rsplit("=", 1)[1]) for c in ranked["config"])
            gap_se = clustered(psi[label][best] - psi[label][second])
            assert ranked["gap_se"][1] == pytest.approx(gap_se, rel=1e-9, abs=1e-15)
            assert ranked["within_2se"].to_list() == [True, bool(ranked["gap_to_best"][1] <= 2 * gap_se)]
    assert checked == 16
    assert {"speedup.html", "speedup.png", "serve.parquet", "exports.json", "profile-T=1.json"} <= {p.name for p in run.iterdir()}


def test_exports_parse_back_to_the_best_configurations_profile(run):
    """The JSON profile round-trips, and each engine's flag carries its per-position survival (the
    best configuration's pooled P(tau >= d), as vLLM counts it, from by_position.parquet)."""
    document = json.loads((run / "exports.json").read_text())
    speed = pl.read_parquet(run / "speedup.parquet")
    positions = pl.read_parquet(run / "by_position.parquet")
    assert {e["setting"] for e in document} == {"T=0", "T=1"}
    for e in document:
        best = speed.filter((pl.col("setting") == e["setting"]) & (pl.col("price") == "a")).sort("speedup")[-1]
        assert (e["config"], e["mode"]) == (best["config"][0], best["mode"][0])
        assert e["draft_price"] == "0.05 x the target's forward"  # the first price's best
        u = (
            positions.filter((pl.col("setting") == e["setting"]) & (pl.col("config") == e["config"]))
            .sort("position")["unconditional"]
            .to_numpy()
        )
        profile = profiles.AcceptanceProfile.from_json((run / f"profile-{e['setting']}.json").read_text())
        assert profile == profiles.AcceptanceProfile.from_json(json.dumps(e["profile"]))
        np.testing.assert_allclose(profile.unconditional, u, atol=1e-12)
        flag, values = e["llama.cpp"]["rates"]
        assert flag == "--spec-synthetic-acceptance-rates" and [float(x) for x in values.split(",")] == list(
            profile.unconditional
        )
        config = json.loads(e["vllm"]["rates"]["flag"][1])
        assert config == e["vllm"]["rates"]["speculative_config"] and config["rejection_sample_method"] == "synthetic"
        assert config["synthetic_acceptance_rates"] == list(profile.unconditional)
        assert config["num_speculative_tokens"] == profile.depth
        assert float(e["sglang"]["SGLANG_SIMULATE_ACC_LEN"]) == profile.accept_length
        assert e["constant_rate_misstatement"]["rate"] == profiles.geometric_rate(profile.accept_length, profile.depth)


def test_both_aggregations_against_a_hand_computed_case(tmp_path, monkeypatch):
    """Requests of unequal steps (one root dropped from the first trajectory): pooled is
    1 + sum accepted / 3 steps, the per-request mean averages 1 + acc_0 and 1 + (acc_1 + acc_2) / 2."""
    make_source = serve_estimate.make_source

    class Fewer:
        def __init__(self, source):
            self.source = source

        def __getattr__(self, name):
            return getattr(self.source, name)

        def roots(self, setting):
            return [r for r in self.source.roots(setting) if r.root != 1]  # trajectory 0 keeps root 0 only

    def fewer(*args, **kwargs):
        source, settings = make_source(*args, **kwargs)
        return Fewer(source), settings

    monkeypatch.setattr(serve_estimate, "make_source", fewer)
    no_chart(monkeypatch)
    out = tmp_path / "out"
    assert serve_estimate.main([*COMMON, "--config", write_config(tmp_path, VLLM), "--out", str(out)]) == 0
    per_root = pl.read_parquet(out / "per_root.parquet")
    table = pl.read_parquet(out / "serve.parquet")
    for name in ("vllm num_speculative_tokens=1", "vllm num_speculative_tokens=3"):
        rows = per_root.filter(pl.col("config") == name).sort("root")
        assert rows["root"].to_list() == [0, 2, 3] and rows["trajectory"].to_list() == [0, 1, 1]
        a = rows["accepted"].to_list()
        row = table.filter(pl.col("config") == name)
        assert row["pooled"][0] == pytest.approx(1 + sum(a) / 3, abs=1e-12)
        means = (1 + a[0], 1 + (a[1] + a[2]) / 2)
        assert row["per_request_mean"][0] == pytest.approx(sum(means) / 2, abs=1e-12)
        assert row["pooled_equal_tokens"][0] == pytest.approx(2 / (1 / means[0] + 1 / means[1]), abs=1e-12)
        assert row["requests"][0] == 2


def test_disagreements_are_the_pairs_ordered_oppositely():
    """A: one request of 1 step accepting 3 and one of 3 steps accepting none (per-request means 4 and
    1: pooled over roots 1 + 3/4 = 1.75, over equal tokens 2 / (1/4 + 1) = 1.6, SpecForge's mean 2.5);
    B: two requests of one step accepting 1 (2 on every count): both pooled means say A < B, SpecForge's
    A > B.  C (another setting) is never compared."""

    def request(*accepted):
        u = np.array([[1.0] * a + [0.0] * (3 - a) for a in accepted])
        return profiles.RequestLaw(np.array(accepted, dtype=float), u)

    laws = {
        ("T=1", "A", "one_hot"): [request(3), request(0, 0, 0)],
        ("T=1", "B", "one_hot"): [request(1), request(1)],
        ("T=0", "C", "one_hot"): [request(3), request(3)],
    }
    frame = serve_estimate.disagreements(laws)
    assert frame["steps"].to_list() == ["roots", "equal tokens"]
    assert set(frame["a"]) == {"A / one_hot"} and set(frame["b"]) == {"B / one_hot"}
    roots, tokens = frame.row(0, named=True), frame.row(1, named=True)
    assert (roots["pooled_a"], roots["per_request_a"], roots["pooled_b"], roots["per_request_b"]) == (1.75, 2.5, 2.0, 2.0)
    assert (tokens["pooled_a"], tokens["per_request_a"], tokens["pooled_b"]) == (pytest.approx(1.6, abs=1e-15), 2.5, 2.0)
    assert "disagree in sign" in roots["note"] and "disagree in sign" in tokens["note"]
    # A: one step accepting 3 and one accepting 1 (means 4, 2: pooled 3, equal tokens 8/3, mean 3); B: 2.9 on all
    laws[("T=1", "A", "one_hot")] = [request(3), request(1)]
    laws[("T=1", "B", "one_hot")] = [profiles.RequestLaw(np.array([1.9]), np.array([[1.0, 0.9, 0.0]]))] * 2
    assert serve_estimate.disagreements(laws)["steps"].to_list() == ["equal tokens"]  # 8/3 < 2.9 < 3
    laws[("T=1", "B", "one_hot")] = [request(1), request(0, 0, 0)]  # A ahead on every count
    assert serve_estimate.disagreements(laws).height == 0
    laws[("T=1", "B", "one_hot")] = laws[("T=1", "A", "one_hot")]  # a tie on both is no disagreement
    assert serve_estimate.disagreements(laws).height == 0


def test_clustered_standard_errors_by_hand():
    """Two requests of two roots: the cluster sums of the influence, sqrt(G / (G - 1) sum s_g^2); the
    speed-up's influence is the delta method's (it sums to 0 and is linear in each root's change)."""
    psi = {0: 0.1, 1: -0.3, 2: 0.5, 3: -0.3}
    cluster = {0: 0, 1: 0, 2: 1, 3: 1}
    assert serve_estimate.clustered_se(psi, cluster) == pytest.approx(np.sqrt(2 * ((-0.2) ** 2 + 0.2**2)), rel=1e-12)
    assert np.isnan(serve_estimate.clustered_se(psi, dict.fromkeys(psi, 0)))
    E, T, Tp = {0: 2.0, 1: 3.0, 2: 1.5}, {0: 1.2, 1: 1.5, 2: 1.1}, {0: 1.0, 1: 1.0, 2: 1.2}
    s, psi = serve_estimate.speedup_influence(E, T, Tp)
    assert s == pytest.approx(np.mean(list(E.values())) * np.mean(list(Tp.values())) / np.mean(list(T.values())), rel=1e-12)
    assert sum(psi.values()) == pytest.approx(0.0, abs=1e-12)

    def weighted(j, h):  # S with root j weighted 1 + h: (sum w E)(sum w Tp) / ((sum w T)(sum w))
        w = {r: 1.0 + (h if r == j else 0.0) for r in E}
        total = sum(w.values())
        return sum(w[r] * E[r] for r in E) * sum(w[r] * Tp[r] for r in E) / (sum(w[r] * T[r] for r in E) * total)

    for j in E:  # psi_j is the derivative of S along root j's weight
        assert (weighted(j, 1e-7) - weighted(j, -1e-7)) / 2e-7 == pytest.approx(psi[j], rel=1e-6, abs=1e-9)


def test_the_best_and_those_within_2_se_by_hand():
    """Equal step times: the speed-up is the mean E.  Against A (E = 2 everywhere), B (1.88, 1.88,
    1.72, 1.72 over two requests of two roots) trails by 0.2 with paired SE sqrt(2 (0.04^2 + 0.04^2))
    = 0.08, 2.5 SE: not within; C (1.96, 1.96, 1.84, 1.84) by 0.1 with SE 0.06, 1.67 SE: within."""
    E = {"A": (2.0, 2.0, 2.0, 2.0), "B": (1.88, 1.88, 1.72, 1.72), "C": (1.96, 1.96, 1.84, 1.84)}
    rows = [
        {
            "setting": "T=1",
            "config": c,
            "mode": "one_hot",
            "trajectory": i // 2,
            "root": i,
            "E": e,
            "E_se": 0.0,
            "_prices": {"p": 1.0, "q": 2.0},
        }
        for c, values in E.items()
        for i, e in enumerate(values)
    ]
    prices = (serve_estimate.Price("p", "p", None), serve_estimate.Price("q", "q", None))
    frame = serve_estimate.estimates(rows, prices, dict.fromkeys((("T=1", i) for i in range(4)), 1.0))
    a = frame.filter(pl.col("price") == "a").sort("rank")
    assert a["config"].to_list() == ["A", "C", "B"]
    np.testing.assert_allclose(a["speedup"].to_numpy(), [2.0, 1.9, 1.8], rtol=1e-12)
    np.testing.assert_allclose(a["gap_se"].to_numpy(), [0.0, 0.06, 0.08], rtol=1e-9)
    assert a["within_2se"].to_list() == [True, True, False]
    np.testing.assert_allclose(frame.filter(pl.col("price") == "b").sort("rank")["speedup"].to_numpy(), [1.0, 0.95, 0.9])
    # one request: no standard error, so "within 2 SE" is unknown (null), not False
    one = serve_estimate.estimates(
        [{**r, "trajectory": 0} for r in rows], prices, dict.fromkeys((("T=1", i) for i in range(4)), 1.0)
    )
    assert one.filter(pl.col("price") == "a").sort("rank")["within_2se"].to_list() == [True, None, None]


def test_a_request_whose_llama_cpp_drafts_are_all_dropped(tmp_path, monkeypatch):
    """draft_min above every chain's length: each step is a plain one (E = 1, its draft forwards
    still paid) and the run finishes (a request of empty trees crashed the aggregation)."""
    no_chart(monkeypatch)
    entries = [
        {"engine": "llama.cpp", "draft_max": 4, "draft_min": 4, "draft_p_min": 0.99},
        {"engine": "llama.cpp", "draft_max": 2, "draft_min": 0, "draft_p_min": 0},
    ]
    out = tmp_path / "out"
    argv = [*SOURCE, "--engine", "llama.cpp", "--modes", "exact_match", "--draft-prices", "0.05,0.3"]
    assert serve_estimate.main([*argv, "--config", write_config(tmp_path, entries), "--out", str(out), "--quiet"]) == 0
    table = pl.read_parquet(out / "serve.parquet")
    dropped = table.filter(pl.col("config").str.contains("draft_max=4"))
    assert dropped.height >= 1 and (dropped["pooled"] == 1.0).all() and (dropped["per_request_mean"] == 1.0).all()
    assert (dropped["speedup_a"] < 1).all()  # the draft's forwards were paid for nothing


def test_draft_p_min_is_refused_where_the_drafting_law_cannot_honour_it(tmp_path, monkeypatch):
    """llama.cpp's draft_p_min reads the draft's untempered probabilities: under --draft-law setting
    at T = 0 (one-hot q: every confidence 1) it would be silently ignored, so the chain is not run."""
    no_chart(monkeypatch)
    entries = [{"engine": "llama.cpp", "draft_max": 4, "draft_min": 0, "draft_p_min": 0.9}]
    config = write_config(tmp_path, entries)
    argv = [*SOURCE, "--engine", "llama.cpp", "--modes", "exact_match", "--settings", "0", "--config", config, "--quiet"]
    with pytest.raises(SystemExit) as exc:  # its only configuration cannot run: one line, exit 2
        serve_estimate.main([*argv, "--draft-law", "setting", "--out", str(tmp_path / "s")])
    assert exc.value.code == 2 and not any((tmp_path / "s").iterdir())  # nothing written
    assert serve_estimate.main([*argv, "--draft-law", "raw", "--out", str(tmp_path / "r")]) == 0


def test_adjusted_and_refused_configurations_are_in_the_table(tmp_path, monkeypatch, capsys):
    """SGLang resets num_draft_tokens at topk 1 (adjusted: shown with the written value) and cannot
    build 15 draft tokens from 2 + 1 * 4 candidates (refused: listed with the key, not valued)."""
    no_chart(monkeypatch)
    entries = [
        {"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2},
        {"engine": "sglang", "speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 16},
    ]
    out = tmp_path / "out"
    argv = [*SOURCE, "--engine", "sglang", "--modes", "one_hot", "--config", write_config(tmp_path, entries), "--out", str(out)]
    assert serve_estimate.main(argv) == 0
    printed = capsys.readouterr().out
    table = pl.read_parquet(out / "serve.parquet")
    status = dict(zip(table["config"].to_list(), table["status"].to_list()))
    adjusted = next(k for k in status if "topk=1" in k)
    refused = next(k for k in status if "num_draft_tokens=16" in k)
    assert status[adjusted].startswith("adjusted: speculative_num_draft_tokens written 2, runs 4")
    assert status[refused].startswith("refused: speculative_num_draft_tokens: 16 - 1 = 15 draft tokens exceeds")
    assert table.filter(pl.col("config") == refused)["accept_length"][0] is None
    assert "refused" in printed and "adjusted" in printed and "accept_length" in printed and "simulated_acc_len" in printed


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "the following arguments are required: --engine"),
        (["--engine", "tgi"], "--engine: invalid choice"),
        (["--engine", "vllm", "--draft-prices", "0.1"], "--draft-prices: name two prices"),
        (["--engine", "vllm", "--draft-prices", "0.1,0.1"], "--draft-prices: the two prices are the same"),
        (["--engine", "vllm", "--draft-prices", "0.1,-1"], "--draft-prices: a ratio must be a finite number > 0"),
        (["--engine", "vllm", "--draft-prices", "weights,0.1"], "--draft-prices: 'weights' needs known models"),
        (["--engine", "vllm", "--positions", "0"], "--positions: must be >= 1"),
        (["--engine", "vllm", "--modes", "lossy"], "--modes:"),
        (["--engine", "vllm", "--fill"], "--fill: fills the nodes a capture lacks"),
        (["--engine", "vllm", "--config", "CONFIG"], "--config[0]: a setting of engine 'sglang'; the engine is vllm"),
        (["--engine", "vllm", "--config", "MISSING"], "--config: cannot read"),
        (["--engine", "vllm", "--vocab", "1"], "--vocab"),
    ],
)
def test_bad_flags_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    entries = [{"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}]
    argv = [
        write_config(tmp_path, entries) if a == "CONFIG" else str(tmp_path / "none.json") if a == "MISSING" else a for a in argv
    ]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        serve_estimate.main([*argv, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and message in err, err
    assert not out.exists()


def test_builders_get_is_generic_for_deterministic_kinds():
    """A configuration naming any registered kind with no per-root extras gets
    ``builders.get(kind, **options)`` (a new engine's builder needs no code in the valuation)."""
    made = valuation.Builders(None, None, None)
    root, setting = object(), SamplingSettings(1.0)
    chain = EngineConfig("x", (("k", 3),), lab={"kind": "chain", "L": 3})
    assert made.get(chain, root, setting) == builders.chain(3)
    eagle = EngineConfig("x", (("k", 3),), lab={"kind": "eagle2", "budget": 3, "depth": 2, "top_k": 1})
    assert made.get(eagle, root, setting) == builders.EAGLE2(3, 2, 1)
    assert made.get(EngineConfig("x", (), lab={"kind": "specblock", "budget": 4}), root, setting) is None
