"""NodeTable.add's block validation of a batch of rows against its plain per-row reference.

``NodeTable.add`` (``method="blocks"``, the default, through ``simlab.trees.checked_rows``) must
keep the same rows bit for bit as ``method="reference"`` (``check_distribution`` row by row) and
refuse the same batches with the same message: float64 rows kept as they are, float32 rows
renormalised, rows near the sum tolerance, ragged or masked batches, and every kind of bad row at
every position of a batch longer than one block.
"""

from __future__ import annotations

import numpy as np
import pytest

from simlab import trees
from simlab.trees import NodeTable, checked_rows

V = 7
ROW_BLOCK = 4  # rows per block in these tests (BLOCK_BYTES set to match)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(trees, "BLOCK_BYTES", ROW_BLOCK * 8 * V)


class RowsPair:
    """A pair that answers with the rows it was given (the table's ``fetch`` is not used here)."""

    vocab_size = V

    def distributions(self, contexts):
        raise AssertionError("not fetched in these tests")


def rows(n: int, seed: int = 0, dtype=np.float64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.random((n, V)) + 0.01
    out /= out.sum(axis=1, keepdims=True)
    return out.astype(dtype)


def both(paths, p, q):
    """(blocks table, reference table) after adding the same batch, or the two messages raised."""
    out = []
    for method in ("blocks", "reference"):
        table = NodeTable(RowsPair(), [0])
        try:
            table.add(paths, p, q, method=method)
            out.append(table)
        except ValueError as exc:
            out.append(str(exc))
    return out


def assert_same(paths, p, q):
    fast, plain = both(paths, p, q)
    if isinstance(plain, str):
        assert fast == plain
        return plain
    assert not isinstance(fast, str), fast
    for pth in paths:
        for a, b in ((fast.p(pth), plain.p(pth)), (fast.q(pth), plain.q(pth))):
            assert a.dtype == b.dtype == np.float64
            assert a.tobytes() == b.tobytes()
    return None


N = 2 * ROW_BLOCK + 3  # more than one block, the last one partial
PATHS = [(i,) for i in range(N)]


def test_good_rows_are_kept_as_they_are_and_as_views():
    p, q = rows(N, 1), rows(N, 2)
    assert assert_same(PATHS, p, q) is None
    table = NodeTable(RowsPair(), [0])
    table.add(PATHS, p, q)
    assert all(np.shares_memory(table.p(pth), p) and np.shares_memory(table.q(pth), q) for pth in PATHS)


def test_float32_rows_and_lists_of_rows_agree_with_the_reference():
    p32, q32 = rows(N, 3, np.float32), rows(N, 4, np.float32)
    assert assert_same(PATHS, p32, q32) is None
    assert assert_same(PATHS, list(rows(N, 5)), [r for r in rows(N, 6)]) is None


@pytest.mark.parametrize("off", [0.4e-9, 0.7e-9, 0.99e-9, 1.2e-9, 5e-9])
def test_rows_near_the_sum_tolerance(off):
    p, q = rows(N, 7), rows(N, 8)
    p[ROW_BLOCK + 1] *= 1.0 + off  # sums to 1 + off (within rounding): accepted below 1e-9, refused above
    message = assert_same(PATHS, p, q)
    assert (message is None) == (off < 1e-9)


def _negative_zero(r):
    r[3] += r[2]
    r[2] = -0.0


def _negative_summing_to_one(r):
    r[3] += 2 * r[2]
    r[2] = -r[2]


BAD = {
    "negative": lambda r: r.__setitem__(2, -r[2]),
    "negative, summing to 1": _negative_summing_to_one,
    "negative zero kept": _negative_zero,
    "NaN": lambda r: r.__setitem__(0, np.nan),
    "inf": lambda r: r.__setitem__(1, np.inf),
    "unnormalised": lambda r: r.__setitem__(slice(None), r * 0.9),
    "zero row": lambda r: r.__setitem__(slice(None), 0.0),
}


@pytest.mark.parametrize("which", ["p", "q"])
@pytest.mark.parametrize("where", [0, ROW_BLOCK - 1, ROW_BLOCK, N - 1])
@pytest.mark.parametrize("kind", list(BAD))
def test_a_bad_row_anywhere_is_refused_as_the_reference_refuses_it(kind, where, which):
    p, q = rows(N, 9), rows(N, 10)
    BAD[kind]((p if which == "p" else q)[where])
    message = assert_same(PATHS, p, q)
    if kind == "negative zero kept":
        assert message is None  # -0.0 is no negative entry (check_distribution: min < 0 is False)
    else:
        assert message is not None and message.startswith(f"{which} at node ({where},)")


def test_the_first_bad_row_in_order_is_named():
    p, q = rows(N, 11), rows(N, 12)
    q[3, 0] = -1.0
    p[5, 0] = np.nan
    assert assert_same(PATHS, p, q).startswith("q at node (3,)")


@pytest.mark.parametrize(
    "batch",
    [
        "ragged",
        "masked",
        "wrong length",
        "one row too few",
        "complex",
    ],
)
def test_batches_the_blocks_cannot_take_whole_fall_back_to_the_reference(batch):
    p, q = rows(N, 13), rows(N, 14)
    if batch == "ragged":
        p = [r for r in p]
        p[4] = np.append(p[4], 0.0)
    elif batch == "masked":
        p = np.ma.masked_array(p, mask=np.zeros_like(p, dtype=bool))
        p.mask[2, 3] = True
    elif batch == "wrong length":
        p = np.hstack([p, np.zeros((N, 1))])
    elif batch == "one row too few":
        p = p[:-1]
    else:
        p = p.astype(complex)
    fast, plain = both(PATHS, p, q)
    assert isinstance(plain, str) and fast == plain
    if batch == "one row too few":
        assert plain == f"p: has {N - 1} rows, expected {N} (one per path)"


def test_a_path_known_with_other_rows_or_as_logits_is_refused_alike():
    p, q = rows(N, 15), rows(N, 16)
    tables = [NodeTable(RowsPair(), [0]) for _ in range(2)]
    messages = []
    for table, method in zip(tables, ("blocks", "reference")):
        table.add(PATHS, p, q, method=method)
        table.add(PATHS, p.copy(), q.copy(), method=method)  # the same values: accepted
        other = p.copy()
        other[[6, 6]] = other[[6, 6]][:, ::-1]
        with pytest.raises(ValueError) as exc:
            table.add(PATHS, other, q, method=method)
        messages.append(str(exc.value))
    assert messages[0] == messages[1] == "paths: node (6,) is already known with other p, q"


def test_checked_rows_flags_each_row():
    p = rows(N, 17)
    p[1, 0] = -0.5
    p[ROW_BLOCK + 2] *= 2.0
    arr, ok = checked_rows(p, N, V)
    assert arr is p and ok.dtype == bool and ok.shape == (N,)
    assert not ok[1] and not ok[ROW_BLOCK + 2] and ok.sum() == N - 2
    assert checked_rows(p, N + 1, V)[0] is None and not checked_rows(p, N + 1, V)[1].any()
    big = np.full((2, 10**6 + 1), 1.0 / (10**6 + 1))  # beyond the vocabulary the sum margin covers
    arr, ok = checked_rows(big, 2, 10**6 + 1)
    assert arr is None and not ok.any()


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="method: must be 'blocks' or 'reference'"):
        NodeTable(RowsPair(), [0]).add(PATHS, rows(N), rows(N), method="fast")
