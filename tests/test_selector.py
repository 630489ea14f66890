"""The neural selector: loss, TPS-hat, features, deterministic training, and the two studies."""

from __future__ import annotations

import io

import numpy as np
import polars as pl
import pytest
import torch

from analyses import evaluate_selector, train_selector
from simlab.selector.features import KL_CAP, SCALARS, root_features
from simlab.selector.loss import policy_throughput, selector_loss
from simlab.selector.model import Selector, SelectorConfig
from simlab.selector.train import SelectorData, TrainConfig, split_by_trajectory, train
from conftest import one_error_line


def toy_batch(seed=0, B=16, A=12):
    g = torch.Generator().manual_seed(seed)
    E = 1 + 4 * torch.rand(B, A, generator=g, dtype=torch.float64)
    T = 0.5 + torch.rand(B, A, generator=g, dtype=torch.float64)
    base = E[:, 0] / T[:, 0]
    return E, T, base


def test_tps_of_a_one_hot_policy_is_that_actions_E_over_T():
    E, T, _ = toy_batch()
    for a in range(E.shape[1]):
        probs = torch.nn.functional.one_hot(torch.full((E.shape[0],), a), E.shape[1]).double()
        assert torch.allclose(policy_throughput(probs, E, T), E[:, a] / T[:, a], rtol=1e-15, atol=0)


def test_the_oracle_policy_minimises_the_loss():
    """TPS_pi(c) <= max_a E/T for every policy, with equality at the oracle: no policy does better."""
    E, T, base = toy_batch(1)
    oracle = torch.where(torch.nn.functional.one_hot((E / T).argmax(-1), E.shape[1]).bool(), 50.0, -50.0).double()
    best = selector_loss(oracle, E, T, base)
    g = torch.Generator().manual_seed(2)
    for scale in (0.1, 1.0, 10.0, 100.0):
        for _ in range(50):
            logits = scale * torch.randn(E.shape, generator=g, dtype=torch.float64)
            assert selector_loss(logits, E, T, base) >= best - 1e-12
    static = torch.zeros_like(E)
    static[:, 0] = 50.0
    assert selector_loss(static - 25, E, T, base) > best


def test_loss_rejects_bad_options():
    E, T, base = toy_batch()
    with pytest.raises(ValueError, match="alpha"):
        selector_loss(torch.zeros_like(E), E, T, base, alpha=0.0)
    with pytest.raises(ValueError, match="lam"):
        selector_loss(torch.zeros_like(E), E, T, base, lam=-1.0)


def test_split_by_trajectory_is_disjoint_and_seeded():
    trajectories = np.repeat(np.arange(10), 3)
    split = split_by_trajectory(trajectories, seed=4)
    assert (split == split_by_trajectory(trajectories, seed=4)).all()
    for t in range(10):
        assert len(set(split[trajectories == t])) == 1
    assert set(split) == {"train", "validation", "test"}


def small_data(seed=0, N=40, A=6, best=None):
    g = torch.Generator().manual_seed(seed)
    E = 1 + 3 * torch.rand(N, A, generator=g, dtype=torch.float64)
    T = torch.ones(N, A, dtype=torch.float64)
    if best is not None:
        E[:, best] = 5.0
    h = tuple(torch.randn(N, n, generator=g) for n in (5, 4, 4))
    return SelectorData(h, torch.randn(N, len(SCALARS), generator=g), E, T, E[:, 0] / T[:, 0])


def test_training_is_bit_for_bit_repeatable_and_inference_deterministic():
    data = small_data()
    config = TrainConfig(epochs=5, batch=8, d=8, hidden=(16, 8))
    a, _ = train(data.subset(range(30)), data.subset(range(30, 40)), config)
    b, _ = train(data.subset(range(30)), data.subset(range(30, 40)), config)
    for (k, v), (_, w) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(v, w), k
    first = a.choose(*data.h, data.scalars)
    assert torch.equal(first, a.choose(*data.h, data.scalars))
    again = Selector.from_checkpoint(a.checkpoint())
    assert torch.equal(again.choose(*data.h, data.scalars), first)


def test_training_learns_an_action_that_is_best_everywhere():
    data = small_data(best=4)
    model, _ = train(data.subset(range(30)), data.subset(range(30, 40)), TrainConfig(epochs=60, batch=8, d=8, hidden=(16, 8)))
    assert (model.choose(*data.h, data.scalars) == 4).all()


def test_selector_shapes():
    model = Selector(SelectorConfig((7, 5, 5), 11, 324))
    x = [torch.zeros(3, 7), torch.zeros(3, 5), torch.zeros(3, 5), torch.zeros(3, 11)]
    assert model(*x).shape == (3, 324)


def test_synthetic_features_are_the_documented_stand_in():
    from backends.sources import SyntheticSource
    from simlab.sampling import SamplingSettings
    from simlab.latency import LatencyModel

    settings = SamplingSettings(0.6, top_p=0.9)
    root = next(SyntheticSource(vocab=8, trajectories=1, roots_per_trajectory=1).roots(settings))
    embeddings, scalars = root_features(root.pair, root.context, settings, LatencyModel.from_cost_ratio(0.2))
    _, q_root = root.pair.distributions([root.context])
    assert np.allclose(embeddings["h_q_root"], np.log(np.maximum(q_root[0], 1e-12)), atol=1e-6)
    assert set(scalars) == set(SCALARS) and all(np.isfinite(v) for v in scalars.values())
    assert scalars["temperature"] == 0.6 and scalars["top_p"] == 0.9 and scalars["t_q"] == pytest.approx(0.2)
    assert scalars["kl_pq_prev"] <= KL_CAP and scalars["context_length"] == len(root.context)
    with pytest.raises(ValueError, match="context"):
        root_features(root.pair, root.context[:1], settings, LatencyModel.from_cost_ratio(0.2))


def test_real_model_hidden_states(micro_pair_dir):
    from backends.hf import HFPair

    pair = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    h_p, h_q, h_root = pair.hidden_states((5, 6, 7))
    assert h_p.shape == (pair.target.config.n_embd,) and h_q.shape == h_root.shape == (pair.draft.config.n_embd,)
    assert not np.allclose(h_q, h_root)


SMALL = [
    "--trajectories",
    "6",
    "--roots-per-trajectory",
    "2",
    "--settings",
    "1",
    "--K-max",
    "2",
    "--L-max",
    "2",
    "--samples",
    "2",
    "--vocab",
    "8",
    "--epochs",
    "40",
    "--verifiers",
    "specinfer",
    "--jobs",
    "1",
    "--quiet",
]


@pytest.fixture(scope="module")
def costly_drafts(tmp_path_factory):
    """A world where drafting costs 5 target forwards: the no-draft action is best at every root."""
    out = tmp_path_factory.mktemp("ts")
    assert train_selector.main(SMALL + ["--cost-ratio", "5", "--out", str(out)]) == 0
    return out


def test_train_outputs(costly_drafts):
    for name in (
        "labels.parquet",
        "roots.parquet",
        "embeddings.npz",
        "selector-specinfer.pt",
        "history.parquet",
        "training.html",
        "training.png",
        "latency.json",
        "run.json",
    ):
        assert (costly_drafts / name).stat().st_size > 0, name
    roots = pl.read_parquet(costly_drafts / "roots.parquet")
    assert roots.group_by("trajectory").agg(pl.col("split").n_unique())["split"].max() == 1


def test_study_learns_the_no_draft_action_everywhere(costly_drafts, tmp_path):
    assert evaluate_selector.main(["--run", str(costly_drafts), "--out", str(tmp_path), "--split", "train", "--quiet"]) == 0
    picks = pl.read_parquet(tmp_path / "per_root.parquet").filter(pl.col("policy") == "selector")
    assert picks.height > 0 and (picks["L1"] == 0).all() and (picks["L2"] == 0).all()


def test_same_seed_same_selector(costly_drafts, tmp_path):
    assert train_selector.main(SMALL + ["--cost-ratio", "5", "--out", str(tmp_path)]) == 0
    a = torch.load(io.BytesIO((tmp_path / "selector-specinfer.pt").read_bytes()), weights_only=False)
    b = torch.load(io.BytesIO((costly_drafts / "selector-specinfer.pt").read_bytes()), weights_only=False)
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])


def test_evaluation_tables(costly_drafts, tmp_path, capsys):
    assert evaluate_selector.main(["--run", str(costly_drafts), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "oracle" in out and "Traversal" in out and "more than 5%" in out
    table = pl.read_parquet(tmp_path / "evaluation.parquet")
    assert set(table["policy"]) == set(evaluate_selector.POLICIES)
    assert (table.filter(pl.col("policy") == "static_iid")["TPS_ratio_static"] == 1.0).all()
    assert (table.filter(pl.col("policy") == "traversal_static_iid")["TPS_ratio_traversal"] == 1.0).all()
    assert set(table["loss_baseline"]) == {"static_iid"}
    picks = pl.read_parquet(tmp_path / "per_root.parquet")
    assert (picks.filter(pl.col("policy").is_in(["static_iid", "traversal_static_iid"]))["L1"] == 0).all()
    assert "static_iid" in out and "static_all_actions" in out


def test_static_choice_iid_rollouts_or_all_actions():
    """DDTE's static baseline chooses among the i.i.d. rollouts (L1 = 0) only, the lab's option among
    every action; per setting, on the masked roots only; ties to the first candidate.  Actions
    (1, 0, 1), (2, 0, 2), (1, 2, 1).  Setting a, root 0: E / T = 3/1, 4/(2/3), 5/1 = 3, 6, 5, so
    (2, 0, 2) wins both ways; with T = 2 for (2, 0, 2) the ratios are 3, 2, 5: the rollouts' best
    is (1, 0, 1), all actions' (1, 2, 1).  Root 2 (setting a, unmasked, E = 99 for (1, 0, 1))
    would win for (1, 0, 1) if it counted.  Setting b, root 1: 3/1, 6/2, 2/2 = 3, 3, 1: a tie,
    to (1, 0, 1)."""
    from analyses._selector_data import static_candidates, static_choice

    actions = [(1, 0, 1), (2, 0, 2), (1, 2, 1)]
    E = np.array([[3.0, 4.0, 5.0], [3.0, 6.0, 2.0], [99.0, 0.0, 0.0]])
    T = np.array([[1.0, 2.0 / 3.0, 1.0], [1.0, 2.0, 2.0], [1.0, 1.0, 1.0]])
    settings, mask = np.array(["a", "b", "a"]), np.array([True, True, False])
    values = {"E": E, "T": T}
    assert static_candidates(actions, "static_iid").tolist() == [0, 1]
    assert static_candidates(actions, "static_all_actions").tolist() == [0, 1, 2]
    assert static_choice(values, settings, mask, actions) == {"a": 1, "b": 0}
    assert static_choice(values, settings, mask, actions, "static_all_actions") == {"a": 1, "b": 0}
    T[0, 1] = 2.0
    assert static_choice(values, settings, mask, actions) == {"a": 0, "b": 0}
    assert static_choice(values, settings, mask, actions, "static_all_actions") == {"a": 2, "b": 0}
    with pytest.raises(ValueError, match="^baseline: "):
        static_choice(values, settings, mask, actions, "static")
    with pytest.raises(ValueError, match="^actions: none"):
        static_candidates([(1, 1, 1)], "static_iid")


@pytest.mark.parametrize(
    "module, flags, message",
    [
        (train_selector, ["--verifiers", "traversal"], "--verifiers"),
        (train_selector, ["--trajectories", "2"], "--trajectories"),
        (train_selector, ["--alpha", "0"], "--alpha"),
        (train_selector, ["--settings", "x"], "--settings"),
        (train_selector, ["--samples", "1"], "--samples"),
        (train_selector, ["--loss-baseline", "static"], "--loss-baseline"),
        (evaluate_selector, ["--run", "/nonexistent"], "--run"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(module, flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        module.main(flags + ["--out", str(tmp_path), "--quiet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and one_error_line(err)


def test_loss_checks_shapes_and_signs():
    E, T, base = toy_batch()
    with pytest.raises(ValueError, match="base_tps"):
        selector_loss(torch.zeros_like(E), E, T, base[:, None])
    with pytest.raises(ValueError, match="logits, E, T"):
        selector_loss(torch.zeros_like(E)[:, :3], E, T, base)
    with pytest.raises(ValueError, match="T > 0"):
        selector_loss(torch.zeros_like(E), E, -T, base)


def test_diverging_training_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        train_selector.main(SMALL + ["--lam", "inf", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--lam" in capsys.readouterr().err
    data = small_data()
    with pytest.raises(ValueError, match="diverged"):
        train(data.subset(range(30)), data.subset(range(30, 40)), TrainConfig(epochs=3, batch=8, lr=1e30, d=8, hidden=(16, 8)))


def test_unavailable_train_device(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only build, wherever this runs
    with pytest.raises(SystemExit):
        train_selector.main(SMALL + ["--train-device", "cuda", "--out", str(tmp_path)])
    assert "--train-device" in capsys.readouterr().err


def test_foreign_run_folder(costly_drafts, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(costly_drafts, run)
    (run / "run.json").write_text("[]")
    with pytest.raises(SystemExit):
        evaluate_selector.main(["--run", str(run), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert "--run" in err and one_error_line(err)


def test_evaluate_selector_reads_train_selectors_default_run_by_default():
    """evaluate_selector's default --run (``_selector_data.DEFAULT_RUN``, so that neither study imports
    the other) is where train_selector writes with its default flags."""
    from analyses._grid_study import grid_source
    from analyses._selector_data import DEFAULT_RUN
    from analyses._flags import default_out

    config, parser = train_selector.parse_args([])
    source, _, _ = grid_source(train_selector.PROG, parser, config, study_honours={"capture": {"device"}})
    assert default_out(train_selector.PROG, source.slug()) == DEFAULT_RUN
