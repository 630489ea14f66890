"""Side-by-side timing in one process: calls interleaved round by round, wall and thread CPU time."""

from __future__ import annotations

import os
import time

import numpy as np
import torch


def interleaved(runs: dict, rounds: int) -> dict:
    """name -> (wall seconds, thread CPU seconds) per round; the calls alternate A B C, C B A, ...
    so a change of load hits every workload alike; round 0 warms up and is dropped."""
    names = list(runs)
    times = {name: ([], []) for name in names}
    for r in range(rounds + 1):
        for name in names if r % 2 == 0 else names[::-1]:
            wall, cpu = time.perf_counter(), time.thread_time()
            runs[name]()
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            if r:
                times[name][0].append(wall)
                times[name][1].append(cpu)
    return times


def report(title: str, times: dict, lab: str = "lab", benchmark=None) -> str:
    """A table of medians and lab / other ratios (printed; kept in ``benchmark.extra_info``)."""
    median = {n: (float(np.median(w)), float(np.median(c))) for n, (w, c) in times.items()}
    rounds = len(next(iter(times.values()))[0])
    lines = [
        f"{title}: torch threads {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
        f"load {os.getloadavg()[0]:.2f}, {rounds} rounds (medians; ratios are {lab} / other)"
    ]
    lab_w, lab_c = median[lab]
    for other, (w, c) in median.items():
        lines.append(
            f"  {other:13s} wall {w * 1e3:9.2f} ms  cpu {c * 1e3:9.2f} ms   {lab}/{other}: wall {lab_w / w:.3f}  cpu {lab_c / c:.3f}"
        )
    text = "\n".join(lines)
    print("\n" + text)
    if benchmark is not None:
        benchmark.extra_info.update(
            {f"{n}_{kind}_ms": v * 1e3 for n, (w, c) in median.items() for kind, v in (("wall", w), ("cpu", c))}
        )
    return text
