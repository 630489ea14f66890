"""Node-level acceptance and TV of the 2026 lossy rules on one stated node (docs/results.md section 13c;
``NODE`` in tests/test_lossy_rules_2026.py).

    python scripts/lossy_node_world.py
"""

import numpy as np
from simlab import verifiers

p, q = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.2, 0.3, 0.4])
print("NODE: p =", p.tolist(), " q =", q.tolist(), " TV(p, q) =", 0.5 * np.abs(p - q).sum())
print(f"{'rule':<16}{'knob':<18}{'k':>2}  {'alpha':>8}  {'TV(out, p)':>10}  {'TV(out, sampler)':>16}  {'TV(sampler, p)':>14}")
rows = [("exact_match", {}, 1), ("naive", {}, 1)]
rows += [("lenience", {"lenience": v}, 1) for v in (0.2, 0.5, 0.8)]
rows += [("cos", {"cos_lambda": v}, 1) for v in (0.2, 0.5, 0.8)]
rows += [("diverse", {"weight": v}, 1) for v in (0.2, 0.5, 0.8)]
rows += [("speccascade", {"min_p_spd": v}, 1) for v in (0.1, 0.3, 0.5, 0.7, 0.9)]
rows += [("eta_acceptance", {"eta_spd": v}, 1) for v in (0.05, 0.1, 0.2, 0.25)]
rows += [("onehot", {}, 2)]
rows += [("eagle_lenience", {"lenience": v}, 2) for v in (0.2, 0.5, 0.8)]
rows += [("eagle_min_p", {"min_p": v}, 2) for v in (0.1, 0.3, 0.5, 0.7, 0.9)]
rows += [("eagle_eta", {"eta": v}, 2) for v in (0.05, 0.1, 0.2, 0.25)]
for name, opts, k in rows:
    v = verifiers.get(name, **opts)
    plan = v.prepare(p, q, k)
    out = plan.marginal_output_distribution()
    alpha = plan.acceptance_rate("enumerate")
    tv = 0.5 * np.abs(out - p).sum()
    if hasattr(v, "sampler_law"):
        s = v.sampler_law(p)
        extra = f"{0.5 * np.abs(out - s).sum():>16.4f}  {0.5 * np.abs(s - p).sum():>14.4f}"
    else:
        extra = f"{'-':>16}  {'-':>14}"
    knob = ",".join(f"{a}={b:g}" for a, b in opts.items()) or "-"
    print(f"{name:<16}{knob:<18}{k:>2}  {alpha:>8.4f}  {tv:>10.4f}  {extra}")
