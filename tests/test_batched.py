"""The batched torch engine equals the numpy plans (the reference) to 1e-12, float64, on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simlab import batched, verifiers
from simlab.drafting import child_tuples

VARIANTS = [
    verifiers.get("nss"),
    verifiers.get("naive"),
    verifiers.get("specinfer"),
    verifiers.get("specinfer", order="fixed"),
    verifiers.get("spectr"),
    verifiers.get("spectr", rho="four_step"),
]
EDGES = [
    ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),
    ([0.0, 1.0, 0.0], [0.4, 0.3, 0.3]),
    ([0.4, 0.3, 0.3], [0.0, 0.0, 1.0]),
    ([0.5, 0.5, 0.0], [0.0, 0.3, 0.7]),
    ([0.3, 0.3, 0.4], [0.0, 0.5, 0.5]),
    ([1.0, 1e-300, 0.0], [0.5, 0.5 - 1e-300, 1e-300]),
    ([0.4, 0.4, 0.2], [0.4, 0.2, 0.4]),
]


def reference(verifier, rows_p, rows_q, rows_x):
    return np.array([verifier.prepare(p, q, len(x)).children_mass(x) for p, q, x in zip(rows_p, rows_q, rows_x)])


def engine(verifier, rows_p, rows_q, rows_x):
    P, Q, X = torch.tensor(np.array(rows_p)), torch.tensor(np.array(rows_q)), torch.tensor(np.array(rows_x))
    return batched.children_mass(verifier, P, Q, X).numpy()


@pytest.mark.parametrize("verifier", VARIANTS, ids=repr)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_edge_cases_every_child_tuple(verifier, k):
    rows_p, rows_q, rows_x = [], [], []
    for p, q in EDGES:
        p, q = np.array(p), np.array(q)
        for x in child_tuples(q, k, verifier.drafting)[0]:
            rows_p.append(p), rows_q.append(q), rows_x.append(x)
    np.testing.assert_allclose(
        engine(verifier, rows_p, rows_q, rows_x), reference(verifier, rows_p, rows_q, rows_x), rtol=0, atol=1e-12
    )


@st.composite
def batches(draw):
    vocab, k, n = draw(st.integers(2, 7)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    weight = st.one_of(st.just(0.0), st.floats(1e-4, 1.0))
    rows = []
    for _ in range(n):
        w = [np.array(draw(st.lists(weight, min_size=vocab, max_size=vocab))) for _ in range(2)]
        for v in w:
            if v.sum() == 0:
                v[draw(st.integers(0, vocab - 1))] = 1.0
        p, q = w[0] / w[0].sum(), w[1] / w[1].sum()
        support = np.flatnonzero(q > 0)
        x = np.array([support[draw(st.integers(0, support.size - 1))] for _ in range(k)])
        rows.append((p, q, x))
    return [list(c) for c in zip(*rows)]


@pytest.mark.parametrize("verifier", VARIANTS, ids=repr)
@settings(max_examples=30, deadline=None)
@given(batch=batches())
def test_random_batches(verifier, batch):
    np.testing.assert_allclose(engine(verifier, *batch), reference(verifier, *batch), rtol=0, atol=1e-12)


@pytest.mark.parametrize("verifier", VARIANTS, ids=repr)
def test_a_large_vocabulary(verifier):
    rng = np.random.default_rng(3)
    rows = [[], [], []]
    for _ in range(6):
        p, q = rng.dirichlet(np.full(20_000, 0.05)), rng.dirichlet(np.full(20_000, 0.05))
        rows[0].append(p), rows[1].append(q), rows[2].append(rng.choice(p.size, size=4, p=q))
    np.testing.assert_allclose(engine(verifier, *rows), reference(verifier, *rows), rtol=0, atol=1e-12)


def test_bad_input_names_the_argument():
    P = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    X = torch.zeros((2, 2), dtype=torch.int64)
    with pytest.raises(ValueError, match="verifier"):
        batched.children_mass(verifiers.get("khisti"), P, P, X)
    with pytest.raises(ValueError, match="X"):
        batched.children_mass(verifiers.get("nss"), P, P, X + 3)
    with pytest.raises(ValueError, match="P, Q"):
        batched.children_mass(verifiers.get("nss"), P, P.float(), X)
    with pytest.raises(ValueError, match="X"):
        batched.children_mass(verifiers.get("nss"), P, P, X[:1])


@pytest.mark.parametrize("name", ["nss", "naive", "spectr", "specinfer", "naive_chain"])
@pytest.mark.parametrize("trunk_children", ["shared", "per_path"])
def test_grid_labels_from_the_torch_engine_equal_the_numpy_path(name, trunk_children):
    from simlab import tree_verifiers
    from simlab.grid import draw_grid, grid_block_efficiency
    from simlab.pairs import MarkovPair
    from simlab.trees import NodeTable

    pair = MarkovPair.random(12, np.random.default_rng(4), concentration=0.5, closeness=0.5)
    table = NodeTable(pair, (1, 2))
    drafts = draw_grid(table, K_max=3, L1_values=(0, 1, 3), L2_max=3, samples=3, rng=np.random.default_rng(5))
    verifier = tree_verifiers.get(name, allow_lossy=trunk_children == "per_path")
    kwargs = dict(K_values=(1, 2, 3), L2_values=(0, 1, 2, 3), trunk_children=trunk_children)
    fast = grid_block_efficiency(table, drafts, verifier, engine="torch", **kwargs)
    plain = grid_block_efficiency(table, drafts, verifier, **kwargs)
    assert fast.keys() == plain.keys()
    for key in plain:
        assert abs(fast[key].mean - plain[key].mean) <= 1e-12, key
        assert fast[key].stderr == pytest.approx(plain[key].stderr, abs=1e-12, nan_ok=True)


def test_the_torch_grid_refuses_what_it_cannot_compute():
    from simlab.grid import draw_grid, grid_block_efficiency
    from simlab.pairs import MarkovPair
    from simlab.trees import NodeTable

    table = NodeTable(MarkovPair.random(5, np.random.default_rng(1)), (0,))
    drafts = draw_grid(table, K_max=2, L1_values=(1,), L2_max=1, samples=1, rng=np.random.default_rng(0))
    for name in ("traversal", "khisti"):
        with pytest.raises(ValueError, match="verifier|engine"):
            grid_block_efficiency(table, drafts, name, K_values=(1, 2), L2_values=(0, 1), engine="torch")
    with pytest.raises(ValueError, match="engine"):
        grid_block_efficiency(table, drafts, "nss", K_values=(1, 2), L2_values=(0, 1), engine="cupy")


def test_float32_terminates_and_stays_close():
    rng = np.random.default_rng(8)
    p, q = rng.dirichlet(np.ones(50), size=3), rng.dirichlet(np.ones(50), size=3)
    X = torch.tensor(np.array([rng.choice(50, size=3, p=row) for row in q]))
    fast = batched.children_mass(verifiers.get("spectr"), torch.tensor(p).float(), torch.tensor(q).float(), X).double().numpy()
    plain = reference(verifiers.get("spectr"), p, q, X.numpy())
    np.testing.assert_allclose(fast, plain, atol=1e-5)


def test_grid_labels_refuse_a_bad_engine_and_uneven_drafts():
    from simlab.grid import draw_grid
    from simlab.labels import grid_labels
    from simlab.pairs import MarkovPair
    from simlab.trees import NodeTable

    table = NodeTable(MarkovPair.random(5, np.random.default_rng(1)), (0,))
    drafts = draw_grid(table, K_max=2, L1_values=(0, 1), L2_max=1, samples=2, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="engine"):
        list(grid_labels(table, drafts, ["traversal"], K_values=(1, 2), L2_values=(0, 1), engine="cupy"))
    with pytest.raises(ValueError, match="drafts"):
        list(grid_labels(table, drafts[:3], ["nss"], K_values=(1, 2), L2_values=(0, 1)))


def test_a_missing_cuda_device_is_a_value_error():
    if torch.cuda.is_available():
        return
    from simlab.batched import table_masses
    from simlab.pairs import MarkovPair
    from simlab.trees import NodeTable

    table = NodeTable(MarkovPair.random(5, np.random.default_rng(1)), (0,))
    with pytest.raises(ValueError, match="device"):
        table_masses(table, [((), verifiers.get("nss"), (1, 2))], device="cuda")


TIES = [
    ([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]),  # every ratio 1
    ([0.1, 0.2, 0.3, 0.4], [0.05, 0.1, 0.15, 0.7]),  # three tokens at ratio 2
    ([0.3, 0.3, 0.2, 0.2], [0.15, 0.15, 0.35, 0.35]),  # two tie blocks
]


def alpha_rows(pairs, k):
    P = torch.tensor(np.array([p for p, _ in pairs], dtype=float))
    Q = torch.tensor(np.array([q for _, q in pairs], dtype=float))
    return batched.optimal_acceptance(P, Q, k).numpy()


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_alpha_star_equals_the_numpy_closed_form_on_edges_and_ties(k):
    from simlab.otlp import optimal_acceptance

    for pairs in (EDGES, TIES):  # one batch per vocabulary size
        want = [optimal_acceptance(p, q, k) for p, q in pairs]
        np.testing.assert_allclose(alpha_rows(pairs, k), want, rtol=0, atol=1e-12)
    # tied ratios in other orders (the tokens permuted): the same value, as the docstring proves
    for perm in ([3, 1, 0, 2], [2, 3, 1, 0], [1, 0, 3, 2]):
        permuted = [(np.array(p)[perm], np.array(q)[perm]) for p, q in TIES]
        np.testing.assert_allclose(alpha_rows(permuted, k), want, rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(batch=batches())
def test_alpha_star_random_batches(batch):
    from simlab.otlp import optimal_acceptance

    P, Q, X = batch
    k = len(X[0])
    want = [optimal_acceptance(p, q, k) for p, q in zip(P, Q)]
    np.testing.assert_allclose(alpha_rows(list(zip(P, Q)), k), want, rtol=0, atol=1e-12)


def test_alpha_star_at_a_large_vocabulary_and_a_planted_fault():
    from simlab.otlp import optimal_acceptance

    rng = np.random.default_rng(5)
    z = rng.normal(0, 2, (4, 20_000))
    P = torch.softmax(torch.tensor(z), dim=1)
    Q = torch.softmax(torch.tensor(z + rng.normal(0, 1, z.shape)), dim=1)
    want = np.array([optimal_acceptance(p, q, 4) for p, q in zip(P.numpy(), Q.numpy())])
    np.testing.assert_allclose(batched.optimal_acceptance(P, Q, 4).numpy(), want, rtol=0, atol=1e-12)
    # planted fault: prefixes taken in the descending order of p/q instead: the comparison fails
    order = torch.sort(P / Q, dim=1, descending=True).indices
    wrong = (torch.cumsum(P.gather(1, order), 1) + 1 - torch.cumsum(Q.gather(1, order), 1) ** 4).min(1).values.clamp(0, 1)
    assert np.abs(wrong.numpy() - want).max() > 1e-3


def test_alpha_star_refuses_bad_input():
    P = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="k"):
        batched.optimal_acceptance(P, P, 0)
    with pytest.raises(ValueError, match="P, Q"):
        batched.optimal_acceptance(P, P.float(), 2)
    with pytest.raises(ValueError, match="Q row 1"):
        batched.optimal_acceptance(P, torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.6, 0.0]], dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="P"):
        batched.optimal_acceptance(P[0], P[0], 2)
