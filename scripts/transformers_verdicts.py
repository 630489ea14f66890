"""simlab.conformance on transformers' ``_speculative_sampling``, standard and ensemble (DIVERSE) modes:
its exact law against the lab's, designed G-tests, the edge cases, and the lab's own declared-lossless
verifiers through the public check (docs/results.md section 13; about 2.5 minutes on one thread).

    OMP_NUM_THREADS=1 python scripts/transformers_verdicts.py
"""

import numpy as np
import torch
from unittest import mock
from transformers.generation import utils as hf
from simlab import conformance, verifiers
from simlab.verifiers.diverse import Diverse, ensemble_law
from simlab.verifiers.naive import Naive
from backends.engine_samplers import transformers_inputs as _logits, transformers_law, transformers_sampler

ROUNDING = [-0.49839067459106445, -4.568305492401123, 1.1450517177581787, -3.0828258991241455]
"""Draft logits whose float32 softmax and a shifted copy's agree to rounding: p <= q everywhere."""

P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
TV = 0.5 * np.abs(P - Q).sum()


def marginal(p, q, w):
    return sum(q[x] * transformers_law(*_logits(p, q, x), w) for x in np.flatnonzero(q > 0))


print("## exact law of transformers' function (patched torch primitives) vs the lab's, max |diff| over CASES x drafted x")
for w in (None, 0.1, 0.25, 0.5, 0.75, 0.9):
    worst = 0.0
    for name, (p, q) in conformance.CASES.items():
        p, q = np.array(p), np.array(q)
        lab = Naive() if w is None else Diverse(weight=w)
        for x in np.flatnonzero(q > 0):
            if q[x] < 1e-30 or 0 < p[x] < 1e-30:
                continue
            worst = max(worst, np.abs(transformers_law(*_logits(p, q, x), w) - lab.output_distribution(p, q, [x])).max())
    m = marginal(P, Q, w)
    bias = 0.5 * np.abs(m - P).sum()
    lab_bias = 0.0 if w is None else (1 - w) * TV
    print(f"w={w}: max|B_hf - B_lab| = {worst:.2e}; on (P,Q): TV(hf marginal, p) = {bias:.6f}, lab (1-w)TV(p,q) = {lab_bias:.6f}")

print("\n## G-tests (false alarm 1e-6, power 0.99 at TV 0.02)")
r = conformance.check_sampler(transformers_sampler(None), P, Q, seed=1)
print("standard vs p:", r.summary())
for case in ("one-hot p", "p==q", "ties"):
    p, q = conformance.edge_case(case)
    r = conformance.check_sampler(transformers_sampler(None), p, q, seed=2)
    print(f"standard vs p, {case}: passed={r.passed} p-value={r.pvalue:.3g} N={r.n}")
for w in (0.25, 0.5, 0.9):
    v = ensemble_law(P, Q, w)
    a = conformance.check_sampler(transformers_sampler(w), P, Q, reference=v, seed=3)
    b = conformance.check_sampler(transformers_sampler(w), P, Q, seed=4)
    print(
        f"w={w}: vs lab law v: passed={a.passed} p-value={a.pvalue:.3g} N={a.n} est. TV(hf, v)={a.tv_estimate:.4f}; "
        f"vs p: passed={b.passed} p-value={b.pvalue:.3g} est. TV(hf, p)={b.tv_estimate:.4f} (exact {(1 - w) * TV:.4f})"
    )

print("\n## edge: p = q to rounding (float32 residual exactly 0)")
draft = torch.tensor(ROUNDING, dtype=torch.float32)[None, None, :]
target = (draft + torch.tensor(-5.630527496337891, dtype=torch.float32)).repeat(1, 2, 1)
p32, q32 = target[0, 0].softmax(-1), draft[0, 0].softmax(-1)
print("p-q:", (p32 - q32).tolist(), "ratio at 0:", float(p32[0] / q32[0]), "P(reject at x=0) =", 1 - float(p32[0] / q32[0]))
with mock.patch.object(torch, "rand_like", lambda t: torch.full_like(t, 1.0 - 2.0**-24)):
    for w in (None, 0.5):
        try:
            print(f"w={w}: rejected ->", hf._speculative_sampling(torch.tensor([[0]]), draft, 1, target, w))
        except RuntimeError as e:
            print(f"w={w}: rejected -> RuntimeError: {e}")

print("\n## edge: q = 0 at the drafted token; one-hot target")
p, q = np.array([0.3, 0.3, 0.4, 0.0]), np.array([0.0, 0.5, 0.5, 0.0])
for w in (None, 0.5):
    print(
        f"w={w}: x=0 (p>0=q) law {np.round(transformers_law(*_logits(p, q, 0), w), 6).tolist()}; x=3 (p=q=0) law {np.round(transformers_law(*_logits(p, q, 3), w), 6).tolist()}"
    )
p, q = np.eye(4)[1], np.array([0.4, 0.3, 0.2, 0.1])
for w in (None, 0.5):
    m = marginal(p, q, w)
    print(f"one-hot p, w={w}: hf marginal {np.round(m, 6).tolist()}, TV from p {0.5 * np.abs(m - p).sum():.6f}")

print("\n## the lab's declared-lossless node verifiers through the public path")
for name in verifiers.names():
    v = verifiers.get(name)
    if v.lossless_for:
        rep = conformance.check_verifier(v)
        print(
            f"{name}: lossless={rep.lossless} instances={len(rep.cases)} laws={[l.value for l in rep.laws]} max bias={rep.bias:.2e}"
        )
