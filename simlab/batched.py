"""The batched torch engine: the children's branch masses of many nodes at once.

The numpy plans (``simlab.verifiers``) are the reference; this module computes the same
quantity, ``NodePlan.children_mass``, for N nodes in one pass over [N, V] tensors on whatever
device they are on (CPU or CUDA), float64 by default.  Only the [N, k] masses leave the
device.  Supported: NSS, NaiveTree, SpecInfer (random and fixed order), SpecTr (rho* by
bisection to 1e-14 over the batch, or the four-step audit rho); the tests assert agreement
with the numpy plans to 1e-12 on random and edge-case inputs.  Exception: SpecTr at nodes where
rho* is ill-conditioned (p and q nearly equal or nearly disjoint, ``simlab.verifiers.spectr.
optimal_rho``), where the two searches may find different valid roots; the masses then differ
by up to about 1e-10 (found by review; both laws are lossless to rounding).

Vocabulary as in ``simlab.verifiers.base``: target P, draft Q ([N, V], rows are
distributions), children X ([N, k] token ids, every node of a batch has k children).

Sources: NaiveTree (DDTE Alg. 2), SpecInfer's closed-form residual chain p_i = norm((p - c_i
q)_+) (``simlab.verifiers.specinfer``, DDTE App. D), SpecTr's K-SEQ (Sun et al. 2023).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simlab.checks import check_device
from simlab.distributions import SUM_TOLERANCE, check_distribution
from simlab.drafting import Drafting
from simlab.trees import mass_request
from simlab.verifiers import is_lab_verifier
from simlab.verifiers.base import DISTINCT_LAWS, check_child_ids, check_drafted, drafted_mask

if TYPE_CHECKING:  # torch is imported on first use: simlab's numpy core does not need it
    import torch

SUPPORTED = ("nss", "naive", "specinfer", "spectr")
"""Node verifiers with a batched implementation (by ``NodeVerifier.name``)."""

RHO_TOLERANCE = 1e-14
"""Width of the final bisection bracket of SpecTr's rho* in float64 (below the numpy plan's 1e-12);
in another dtype, 64 machine epsilons times k (float32 cannot resolve 1e-14)."""


def supports(verifier) -> bool:
    """True when ``children_mass`` implements ``verifier``: one of the lab's own classes named in
    ``SUPPORTED`` (``simlab.verifiers.is_lab_verifier``; a user class that inherits a name is not)."""
    return getattr(verifier, "name", None) in SUPPORTED and is_lab_verifier(verifier)


def children_mass(
    verifier, P: "torch.Tensor", Q: "torch.Tensor", X: "torch.Tensor", *, laws=None, checked: bool = False
) -> "torch.Tensor":
    """B(X[n], X[n, j]) for every node n and child j: the batched ``NodePlan.children_mass``.

    Validates its inputs as the numpy reference does (``NodeVerifier.prepare`` and
    ``NodePlan.check_children``), with the same messages: the rows on the device (only booleans
    and the one offending row reach the host), the children by the reference's own
    ``simlab.verifiers.base.check_drafted`` on the [N, k] values of Q at them.

    Args:
        verifier: a node verifier with ``supports(verifier)`` (its options are honoured:
            SpecInfer's ``order``, SpecTr's ``rho``).
        P: [N, V] floating tensor of target rows on one device; the computation runs in its dtype.
        Q: [N, V] floating tensor of draft rows, same device and dtype.
        X: [N, k] integer tensor of child token ids, k >= 1, on the same device.
        laws: the drafting law of each node's children (N ``simlab.drafting.Drafting`` values;
            default: the verifier's ``drafting`` for every node): the children a law drew from q
            must have Q > 0 there.
        checked: True when every row of P and Q was validated already (a
            ``simlab.trees.NodeTable`` validates each node's rows once): the rows are not checked
            again, the children still are (O(k) per node).

    Returns:
        [N, k] tensor (P's dtype and device); a repeated child gets its token's whole mass.

    Raises:
        ValueError: an unsupported verifier; tensors of the wrong rank, shape, dtype or device;
            ``P row n: ...`` / ``Q row n: ...`` for a row that is not a distribution (NaN, inf,
            negative, a sum off 1; ``simlab.distributions.check_distribution``); ``X row n:
            children: ...`` with ``NodePlan.check_children``'s message (an id outside [0, V), a
            drafted child with Q = 0, repeats for a verifier of distinct children); ``laws: ...``
            not N laws.
    """
    import torch

    if not supports(verifier):
        raise ValueError(
            f"verifier: the batched engine implements {', '.join(SUPPORTED)}, not {getattr(verifier, 'name', verifier)!r}"
        )
    for name, t in (("P", P), ("Q", Q), ("X", X)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            raise ValueError(f"{name}: must be a 2-D torch tensor, got {type(t).__name__} {getattr(t, 'shape', '')}")
    if P.shape != Q.shape or not P.dtype.is_floating_point or P.dtype != Q.dtype:
        raise ValueError(
            f"P, Q: must be floating tensors of one shape and dtype, got {P.shape} {P.dtype} and {Q.shape} {Q.dtype}"
        )
    if X.shape[0] != P.shape[0] or X.shape[1] < 1 or X.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"X: must be an [N, k >= 1] integer tensor with N = {P.shape[0]}, got {tuple(X.shape)} {X.dtype}")
    if not (P.device == Q.device == X.device):
        raise ValueError(f"P, Q, X: must be on one device, got {P.device}, {Q.device}, {X.device}")
    X = X.long()
    if not checked:
        _check_rows(P, Q)
    _check_children(verifier, Q, X, laws)
    return _IMPLEMENTATIONS[verifier.name](verifier, P, Q, X)


def _check_rows(P, Q) -> None:
    """Refuse a row of P or Q that is not a distribution, with ``check_distribution``'s message for
    the first one (found on the device; float64 rows at its 1e-9, other dtypes at V machine epsilons)."""
    import torch

    tolerance = max(SUM_TOLERANCE, P.shape[1] * torch.finfo(P.dtype).eps)
    for name, rows in (("P", P), ("Q", Q)):
        bad = ~torch.isfinite(rows).all(dim=1) | (rows.min(dim=1).values < 0) | ((rows.sum(dim=1) - 1.0).abs() > tolerance)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            row = rows[i].to("cpu", torch.float64).numpy()
            if P.dtype == torch.float64:
                check_distribution(row, f"{name} row {i}")  # raises: the reference's message
            raise ValueError(
                f"{name} row {i}: not a probability vector (NaN, inf or negative entries, or a sum off 1 "
                f"by more than {tolerance:.3g})"
            )


def _check_children(verifier, Q, X, laws) -> None:
    """The reference's children check (``check_child_ids`` ranges, ``check_drafted``) on every node,
    from the [N, k] ids and values of Q at them (one small copy to the host)."""
    N, k = X.shape
    if laws is None:
        laws = [verifier.drafting] * N
    laws = list(laws)
    if len(laws) != N or not all(isinstance(law, Drafting) for law in laws):
        raise ValueError(f"laws: must be {N} simlab.drafting.Drafting values, one per node")
    ids = X.cpu().numpy()
    out_of_range = (ids < 0) | (ids >= Q.shape[1])
    try:
        for i in np.flatnonzero(out_of_range.any(axis=1))[:1]:
            check_child_ids(ids[i], k, Q.shape[1])  # raises
        q_at = Q.gather(1, X).cpu().numpy()
        masks = {law: drafted_mask(law, k) for law in set(laws)}
        suspect = ((q_at == 0) & np.stack([masks[law] for law in laws])).any(axis=1)
        if verifier.divides_by_q:
            suspect |= (q_at == 0).any(axis=1)
        if verifier.drafting in DISTINCT_LAWS:
            ordered = np.sort(ids, axis=1)
            suspect |= (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        for i in np.flatnonzero(suspect):
            check_drafted(verifier, laws[i], ids[i], q_at[i])  # raises
    except ValueError as exc:  # the reference's message, after the row it is about
        raise ValueError(f"X row {i}: {exc}") from None


def _copies(X: "torch.Tensor", mass: "torch.Tensor") -> "torch.Tensor":
    """Sum each child's mass over the copies of its token: [N, k]."""
    same = (X[:, :, None] == X[:, None, :]).to(mass.dtype)
    return (same * mass[:, None, :]).sum(dim=2)


def _residual_at(P, S, X, mass):
    """norm((P - S)_+) at X, with the numpy reference's rule for a zero residual (the law is p)."""
    diff = (P.gather(1, X) - S.gather(1, X)).clamp_min(0.0)
    safe = _where(mass > 0, mass, 1.0)
    return _where(mass[:, None] > 0, diff / safe[:, None], P.gather(1, X) / P.sum(dim=1, keepdim=True))


def _where(condition, a, b):
    """torch.where with a Python number allowed for ``b`` (cast to a's dtype and device)."""
    import torch

    return torch.where(condition, a, b if isinstance(b, torch.Tensor) else torch.full_like(a, b))


def _nss(verifier, P, Q, X):
    return P.gather(1, X)


def _naive(verifier, P, Q, X):
    excess = (P - Q).clamp_min(0.0).sum(dim=1)
    p1, q1 = P.gather(1, X[:, :1]), Q.gather(1, X[:, :1])
    a = _where(q1 > 0, (p1 / _where(q1 > 0, q1, 1.0)).clamp_max(1.0), (p1 > 0).to(P.dtype))
    return (1.0 - a) * _residual_at(P, Q, X, excess) + a * (X == X[:, :1]).to(P.dtype)


def _specinfer(verifier, P, Q, X):
    import torch

    N, k = X.shape
    scale = [torch.zeros(N, dtype=P.dtype, device=P.device)]
    mass = [torch.ones(N, dtype=P.dtype, device=P.device)]
    stalled = torch.zeros(N, dtype=torch.bool, device=P.device)
    for _ in range(k):
        c = scale[-1] + mass[-1]
        z = (P - c[:, None] * Q).clamp_min(0.0).sum(dim=1)
        stall = (z == 0.0) | stalled  # p_i = q: the next trial accepts surely; keep the current target
        scale.append(torch.where(stall, scale[-1], c))
        mass.append(torch.where(stall, mass[-1], z))
        stalled = stall
    px, qx = P.gather(1, X), Q.gather(1, X)

    def target_at(i):  # p_i at the children, [N, k]
        return (px - scale[i][:, None] * qx).clamp_min(0.0) / mass[i][:, None]

    accept = torch.stack([(target_at(i) / qx).clamp_max(1.0) for i in range(k)], dim=1)  # [N, trial, child]
    out = torch.zeros(N, k, dtype=P.dtype, device=P.device)
    if verifier.order == "fixed":
        reach = torch.ones(N, dtype=P.dtype, device=P.device)
        for i in range(k):
            out[:, i] = reach * accept[:, i, i]
            reach = reach * (1.0 - accept[:, i, i])
    else:
        by_mask = torch.zeros(N, 1 << k, dtype=P.dtype, device=P.device)
        by_mask[:, (1 << k) - 1] = 1.0
        for m in sorted(range(1, 1 << k), key=lambda m: -m.bit_count()):
            remaining = m.bit_count()
            trial = k - remaining
            for j in range(k):
                if m >> j & 1:
                    a = accept[:, trial, j]
                    out[:, j] += by_mask[:, m] * a / remaining
                    by_mask[:, m ^ (1 << j)] += by_mask[:, m] * (1.0 - a) / remaining
        reach = by_mask[:, 0]
    return _copies(X, out) + reach[:, None] * target_at(k)


def _p_acc(beta, k):
    import torch

    return torch.where(beta < 1.0, -torch.expm1(k * torch.log1p(-beta.clamp_max(1.0))), torch.ones_like(beta))


def _rho(verifier, P, Q, k):
    """rho per node: the smallest root of g(rho) = p_acc(beta(rho)) - rho beta(rho) in [1, k]
    (upper end of the final bracket), by bisection over the whole batch; or the four-step rho."""
    import torch

    N = P.shape[0]
    one = torch.ones(N, dtype=P.dtype, device=P.device)
    if k == 1:
        return one

    def g(rho):
        beta = torch.minimum(Q, P / rho[:, None]).sum(dim=1)
        return _p_acc(beta, k) - rho * beta

    done = g(one) <= 8 * torch.finfo(P.dtype).eps
    lo, hi = one.clone(), torch.full((N,), float(k), dtype=P.dtype, device=P.device)
    tol = RHO_TOLERANCE if P.dtype == torch.float64 else 64 * torch.finfo(P.dtype).eps * k
    steps = 4 if verifier.rho == "four_step" else None
    count = 0
    while (steps is not None and count < steps) or (steps is None and bool(((hi - lo) > tol).any()) and count < 200):
        mid = 0.5 * (lo + hi)
        below = g(mid) <= 0.0
        hi, lo = torch.where(below, mid, hi), torch.where(below, lo, mid)
        count += 1
    return torch.where(done, one, hi)


def _spectr(verifier, P, Q, X):
    import torch

    N, k = X.shape
    rho = _rho(verifier, P, Q, k)
    matched = torch.minimum(Q, P / rho[:, None])
    beta = matched.sum(dim=1)
    p_acc = _p_acc(beta, k)
    c = torch.where(beta > 0, p_acc / torch.where(beta > 0, beta, 1.0), torch.full_like(beta, float(k)))
    S = c[:, None] * matched
    excess = (P - S).clamp_min(0.0).sum(dim=1)
    px, qx = P.gather(1, X), Q.gather(1, X)
    b = (px / (rho[:, None] * qx)).clamp_max(1.0)
    out = torch.empty_like(b)
    reach = torch.ones(N, dtype=P.dtype, device=P.device)
    for j in range(k):
        out[:, j] = reach * b[:, j]
        reach = reach * (1.0 - b[:, j])
    return _copies(X, out) + reach[:, None] * _residual_at(P, S, X, excess)


_IMPLEMENTATIONS = {"nss": _nss, "naive": _naive, "specinfer": _specinfer, "spectr": _spectr}


def optimal_acceptance(P: "torch.Tensor", Q: "torch.Tensor", k: int, *, checked: bool = False) -> "torch.Tensor":
    """alpha* of N nodes with k i.i.d. children at once: the batched ``simlab.otlp.optimal_acceptance``.

    alpha* = min over H of [p(H) + 1 - q(H)^k], H the prefixes of the tokens with q > 0 in p/q
    ascending order (H = {} gives 1; Hu et al. ICLR 2025, arXiv 2502.18779).  One sort per row on
    the device: a token with q = 0 gets the ratio +inf and sorts after the support; adding it to a
    prefix raises p(H) and leaves q(H), so the minimum over every prefix of the sorted row is the
    minimum over the support's prefixes.  Tied ratios are sorted in any order: within a block of
    equal ratio r, p(H) = a + r t and q(H) = b + t along the block, and a + r t + 1 - (b + t)^k is
    concave in t, so its minimum over the block is at an end, which every order reaches.

    Args:
        P: [N, V] floating tensor of target rows on one device (float64 for the 1e-12 agreement
            the tests check with the numpy reference); rows are distributions.
        Q: [N, V] floating tensor of draft rows, same device and dtype.
        k: children per node (integer >= 1).
        checked: True when every row was validated already (not checked again).

    Returns:
        [N] tensor of alpha* in [0, 1], P's dtype and device.

    Raises:
        ValueError: tensors of the wrong rank, shape, dtype or device; ``k`` not an integer >= 1;
            ``P row n: ...`` / ``Q row n: ...`` for a row that is not a distribution.
    """
    import torch

    from simlab.drafting import check_k

    k = check_k(k)
    for name, t in (("P", P), ("Q", Q)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            raise ValueError(f"{name}: must be a 2-D torch tensor, got {type(t).__name__} {getattr(t, 'shape', '')}")
    if P.shape != Q.shape or not P.dtype.is_floating_point or P.dtype != Q.dtype or P.device != Q.device:
        raise ValueError(
            f"P, Q: must be floating tensors of one shape, dtype and device, got {tuple(P.shape)} {P.dtype} {P.device} "
            f"and {tuple(Q.shape)} {Q.dtype} {Q.device}"
        )
    if not checked:
        _check_rows(P, Q)
    ratio = torch.where(Q > 0, P / torch.where(Q > 0, Q, 1.0), torch.full_like(P, float("inf")))
    order = torch.sort(ratio, dim=1).indices
    p_prefix = torch.cumsum(P.gather(1, order), dim=1)
    q_prefix = torch.cumsum(Q.gather(1, order), dim=1).clamp_max(1.0)
    best = (p_prefix + 1.0 - q_prefix**k).min(dim=1).values
    return best.clamp(0.0, 1.0)  # the empty prefix's 1 is the clamp's upper end


def table_masses(table, requests, *, device=None, dtype=None, chunk: int = 256) -> dict:
    """Answer a tree verifier's mass requests (``TopDown.mass_requests``) over one
    ``simlab.trees.NodeTable`` with the batched engine.

    Requests are de-duplicated and grouped by (node verifier, k); each group goes through
    ``children_mass`` in chunks of ``chunk`` nodes (so at V = 128,000 a chunk's P and Q take
    2 * chunk MB in float64), its rows from ``NodeTable.torch_rows``: computed on the device
    from resident logits (they never leave it; only the [chunk, k] masses do), or the table's
    host rows moved there once per chunk.

    Args:
        table: the NodeTable holding every requested node's p and q.
        requests: iterable of (path, node verifier, children, law) (``simlab.trees.mass_request``;
            without the law, the node verifier's own).
        device: a torch device (default: where the table's resident logits are, else the CPU);
            dtype: default torch.float64.

    Returns:
        (node verifier, path, children) -> float64 numpy (k,).

    Raises:
        ValueError: a node verifier the engine does not implement, chunk < 1, or children the
            numpy plans refuse (``children_mass``: the same message).
    """
    import torch

    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk: must be an integer >= 1, got {chunk!r}")
    dtype = torch.float64 if dtype is None else dtype
    device = None if device is None else torch.device(check_device(str(device), "device"))

    groups: dict = {}
    for request in requests:
        path, node, kids, law = mass_request(request)
        if not supports(node):
            raise ValueError(f"verifier: the batched engine implements {', '.join(SUPPORTED)}, not {node.name!r}")
        groups.setdefault((node, len(kids)), {})[(path, kids, law)] = None
    out = {}
    for (node, _), keys in groups.items():
        keys = list(keys)
        for start in range(0, len(keys), chunk):
            part = keys[start : start + chunk]
            P, Q = table.torch_rows([path for path, _, _ in part], device=device, dtype=dtype)
            X = torch.tensor([kids for _, kids, _ in part], dtype=torch.int64, device=P.device)
            # the table validated every row once (torch_rows); the children are checked here
            mass = children_mass(node, P, Q, X, laws=[law for _, _, law in part], checked=True).to("cpu", torch.float64).numpy()
            for (path, kids, _), row in zip(part, mass):
                out[(node, path, kids)] = row
    return out
