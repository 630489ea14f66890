"""Tree-widening gains and rejection sampling against argmax matching on a synthetic world (docs/results.md
section 14; about 20 s on one thread).

    OMP_NUM_THREADS=1 python scripts/widening_report.py
"""

from backends.synthetic import DepthProfileWorld
from simlab.sampling import SamplingSettings
from simlab import widening as W

world = DepthProfileWorld(8, seed=0, settings=SamplingSettings(1.0))  # profile TV 0.1 -> 0.5 over 8 depths
ctx, D = (3,), 4
print("rank statistics, T=1, raw ranking: position rank token p conditional joint")
for r in W.rank_statistics(world, ctx, D, ranks=3):
    print(f"  {r['position']} {r['rank']} {r['token']} {r['p']:.4f} {r['conditional']:.4f} {r['joint']:.4f}")
for T in (0.0, 1.0):
    w = world.with_settings(SamplingSettings(T))
    print(f"widening gains T={T:g}: mode position width value gain (verifier)")
    for r in W.widening_gains(w, ctx, D, (2, 3, 4)):
        print(
            f"  {r['mode']} {r['position']} {r['width']} {r['value']:.4f} {r['gain']:+.4f} ({r['verifier']}, chain {r['chain']:.4f})"
        )
print("rejection sampling vs argmax matching, D=4: T draft verifier E[tau+1] gain lossless")
for r in W.rejection_sampling_gain(world, ctx, D, [0.0, 0.3, 0.6, 1.0, 1.5], lossy=True):
    print(f"  {r['temperature']:g} {r['draft']} {r['verifier']} {r['value']:.4f} {r['gain']:.4f} {r['lossless']}")
