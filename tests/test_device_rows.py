"""p and q kept where the model produced them (``simlab.device_rows``, ``NodeTable`` with tensor
logits, ``HFPair.with_resident_logits``): the torch twins equal the numpy references, and the
batched engine reads a resident table without a host row (here the device is the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backends.capture import node_rows
from backends.hf import HFPair
from simlab import batched, tree_verifiers, verifiers
from simlab.device_rows import SUMMARY_COLUMNS, probabilities, summaries
from simlab.grid import draw_grid, grid_block_efficiency
from simlab.measures import node_divergences
from simlab.sampling import SamplingSettings, sampling_distribution
from simlab.trees import NodeTable


def logit_rows(seed, n=6, vocab=40):
    """Random float32 logits with -inf entries, tied maxima and tied values (edge cases included)."""
    rng = np.random.default_rng(seed)
    z = (3.0 * rng.standard_normal((n, vocab))).astype(np.float32)
    z[0, ::3] = -np.inf
    z[1, :] = 0.0  # uniform: every token tied
    z[2, [4, 9]] = z[2].max() + 1.0  # two tied maxima
    z[3, 1:] = -np.inf  # one-hot
    z[4, :5] = z[4, 5]  # ties in the middle (top-k boundary)
    return z


@pytest.mark.parametrize(
    "settings",
    [SamplingSettings(t) for t in (0.0, 0.3, 1.0, 2.5)]
    + [SamplingSettings(1.0, top_k=k) for k in (1, 3, 5, 40)]
    + [SamplingSettings(0.7, top_k=4)],
)
def test_probabilities_equal_the_host_transform(settings):
    for seed in range(5):
        z = logit_rows(seed)
        host = sampling_distribution(z, temperature=settings.temperature, top_k=settings.top_k)
        device = probabilities(settings, torch.from_numpy(z)).numpy()
        np.testing.assert_array_equal(device == 0, host == 0)  # the same support: the same kept tokens
        np.testing.assert_allclose(device, host, rtol=0, atol=1e-15)


def test_probabilities_refuse_what_they_cannot_compute():
    z = torch.from_numpy(logit_rows(0))
    with pytest.raises(ValueError, match="settings: top-p"):
        probabilities(SamplingSettings(1.0, top_p=0.9), z)
    for bad, match in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
        broken = z.clone()
        broken[2, 3] = bad
        with pytest.raises(ValueError, match=match):
            probabilities(SamplingSettings(), broken)
    broken = z.clone()
    broken[5] = float("-inf")
    with pytest.raises(ValueError, match="every entry -inf"):
        probabilities(SamplingSettings(), broken)
    with pytest.raises(ValueError, match="logits: must be a 2-D"):
        probabilities(SamplingSettings(), z[0])


def summary_pairs():
    rng = np.random.default_rng(3)
    vocab = 30
    rows = [rng.dirichlet(np.full(vocab, 0.4)) for _ in range(6)]
    one_hot = np.eye(vocab)[7]
    disjoint_p, disjoint_q = np.r_[np.full(15, 1 / 15), np.zeros(15)], np.r_[np.zeros(15), np.full(15, 1 / 15)]
    sparse = rows[0] * (np.arange(vocab) % 2)
    sparse /= sparse.sum()
    P = [rows[0], rows[1], one_hot, disjoint_p, rows[2], sparse, np.full(vocab, 1 / vocab)]
    Q = [rows[3], rows[1], rows[4], disjoint_q, one_hot, rows[5], np.full(vocab, 1 / vocab)]
    return np.array(P), np.array(Q)


def test_summaries_equal_the_host_measures():
    P, Q = summary_pairs()
    out = summaries(torch.from_numpy(P), torch.from_numpy(Q), top=8)
    for i, (p, q) in enumerate(zip(P, Q)):
        reference = node_divergences(p, q)
        for name in SUMMARY_COLUMNS:
            assert out[name][i] == pytest.approx(reference[name], abs=1e-12, rel=0), (i, name)  # inf == inf too
        for label, row in (("p", p), ("q", q)):
            order = np.argsort(-row, kind="stable")[:8]
            np.testing.assert_array_equal(out[f"{label}_top_ids"][i], order)  # ties: lowest id first
            np.testing.assert_array_equal(out[f"{label}_top_probs"][i], row[order])
    assert np.isinf(out["kl_pq"][3]) and np.isinf(out["kl_pq"][4]) and np.isinf(out["kl_qp"][2]) and out["kl_pq"][6] == 0.0


@pytest.fixture(scope="module")
def pair(micro_pair_dir):
    return HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


@pytest.fixture(scope="module")
def tables(pair):
    """One grid root drafted twice: logits as host arrays and as resident tensors (same seed)."""
    context = pair.encode("The for statement is used to iterate over")
    out = []
    for source in (pair, pair.with_resident_logits()):
        table = NodeTable(source, context, rows="logits")
        drafts = draw_grid(table, K_max=2, L1_values=range(3), L2_max=2, samples=2, rng=np.random.default_rng(5))
        out.append((table, drafts))
    return out


def test_resident_logits_are_the_host_logits(pair):
    context = pair.encode("The for statement is used to iterate over")
    paths = [(), (5,), (5, 7), (9,)]
    resident = pair.with_resident_logits()
    for host, device in (
        (pair.node_logits(context, paths), resident.node_logits(context, paths)),
        (pair.forest_logits([(context, paths)])[0], resident.forest_logits([(context, paths)])[0]),
    ):
        for a, b in zip(host, device):
            assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor)
            np.testing.assert_array_equal(a, b.numpy())
    assert not pair.resident and resident.resident  # a new pair; the original is unchanged
    with pytest.raises(ValueError, match="top-p"):
        pair.with_settings(SamplingSettings(1.0, top_p=0.9)).with_resident_logits()
    with pytest.raises(ValueError, match="top-p"):
        resident.with_settings(SamplingSettings(1.0, top_p=0.9))


def test_a_resident_table_draws_the_same_tree_and_rows(tables):
    (host, host_drafts), (device, device_drafts) = tables
    assert host_drafts == device_drafts  # drafting read the same q (a host copy of the same float32 logits)
    nodes = sorted(device._logits)
    assert nodes and all(device.resident(n) for n in nodes) and not any(host.resident(n) for n in nodes)
    for path in nodes:
        np.testing.assert_array_equal(device.p(path), host.p(path))
        np.testing.assert_array_equal(device.q(path), host.q(path))
    P, Q = device.torch_rows(nodes)
    np.testing.assert_allclose(P.numpy(), np.stack([host.p(n) for n in nodes]), rtol=0, atol=1e-15)
    np.testing.assert_allclose(Q.numpy(), np.stack([host.q(n) for n in nodes]), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(device.logits(nodes)[0], host.logits(nodes)[0])


def test_the_engine_reads_a_resident_table_on_the_device_only(tables, monkeypatch):
    """No host row is built for the engine: table.p and table.q are never called; the masses and
    the grid's block efficiency equal the numpy reference's (1e-12)."""
    (host, drafts), (device, _) = tables
    for name in ("p", "q"):
        monkeypatch.setattr(device, name, lambda path: pytest.fail(f"a host row was built at {path}"))
    for verifier in ("specinfer", "spectr", "naive", "nss"):
        tree_verifier = tree_verifiers.TopDown(verifiers.get(verifier))
        torch_grid = grid_block_efficiency(device, drafts, tree_verifier, K_values=(1, 2), L2_values=(0, 1, 2), engine="torch")
        numpy_grid = grid_block_efficiency(host, drafts, tree_verifier, K_values=(1, 2), L2_values=(0, 1, 2))
        assert torch_grid.keys() == numpy_grid.keys()
        for key in numpy_grid:
            assert abs(torch_grid[key].mean - numpy_grid[key].mean) <= 1e-12, (verifier, key)


def test_resident_summaries_equal_the_host_rows(tables):
    (host, _), (device, _) = tables
    nodes = sorted(device._logits)
    for a, b in zip(node_rows(device, nodes, 8), node_rows(host, nodes, 8)):
        assert a.keys() == b.keys()
        assert a["p_top_ids"] == b["p_top_ids"] and a["q_top_ids"] == b["q_top_ids"]
        for name in SUMMARY_COLUMNS:
            assert a[name] == pytest.approx(b[name], abs=1e-12, rel=0), name
        np.testing.assert_allclose(a["p_top_probs"], b["p_top_probs"], rtol=0, atol=1e-15)


def test_bad_resident_input_raises(pair, tables):
    (_, _), (device, _) = tables
    context = pair.encode("The for statement")
    table = NodeTable(pair, context, rows="logits")
    z = torch.zeros((1, pair.vocab_size))
    with pytest.raises(ValueError, match="both as torch tensors or both as arrays"):
        table.add_logits([(1,)], z, np.zeros((1, pair.vocab_size), dtype=np.float32))
    bad = z.clone()
    bad[0, 3] = float("nan")
    table.add_logits([(1,)], bad, z)
    with pytest.raises(ValueError, match="NaN"):
        table.torch_rows([(1,)])
    with pytest.raises(ValueError, match="already known with other logits"):
        table.add_logits([(1,)], z, z)
    with pytest.raises(ValueError, match="verifier: the batched engine"):
        batched.table_masses(device, [((), verifiers.get("khisti"), (1, 2))])


def test_float32_masses_of_a_resident_table_equal_the_host_tables(tables):
    """Review: resident rows were built and validated in float32 (a sum off 1 by 1e-7 refused);
    now float64 first, validated, then cast, as the host rows."""
    (host, _), (device, _) = tables
    requests = [((), verifiers.get("spectr"), (5, 9)), ((), verifiers.get("naive"), (5,))]
    a = batched.table_masses(device, requests, dtype=torch.float32)
    b = batched.table_masses(host, requests, dtype=torch.float32)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
