"""Throughput of the exact core on a CUDA device beside the CPU (issue 16): node, tree, grid labels, capture.

    python scripts/gpu_bench.py                     # V = 32,000 and 128,000 on cuda (under 5 minutes on one H200)
    python scripts/gpu_bench.py --dry-run           # tiny sizes on the CPU: checks the script runs (tests/test_gpu_bench.py)
    python scripts/gpu_bench.py --device cpu --vocab 32000   # the engine on the CPU at a real size

For each vocabulary size it prints, with the torch and CUDA versions and the thread count:

* **node**: children's branch masses of k = 4 i.i.d. children per node, nodes per second, for
  the numpy plans on the CPU (``prepare`` + ``children_mass``, one node at a time) and for the
  batched engine (``simlab.batched.children_mass``) on the device, float64, p and q resident there;
* **tree**: exact E[tau + 1 | tree] of delayed trees (4, 4, 4), trees per second, numpy on the CPU
  and the engine's batched masses (every node of ``--trees`` trees in one call per k) on the device;
* **grid**: one root's DDTE label grid (324 actions, s = 4 trees per L1), roots per second:
  ``grid_block_efficiency`` on the CPU, and on the device the engine over the same requests
  with rows resident there (the issue's target: >= 100 roots/s at V = 128,000 for SpecInfer).

* **capture**: a labelled grid capture's work per root (``backends.capture.capture_group``:
  the grid's trees of 8 roots drawn in lockstep on kept KV caches, ``--evaluation cached``, one
  forward per model and level, then the leaves; per-node summaries, labels for SpecInfer: numpy on the CPU; on CUDA the batched engine, with the
  logits resident on the device, summaries computed there), roots per second, on two randomly initialised GPT-2 models
  at this vocabulary (target 4 layers x 256, draft 1 x 128; built from configs, nothing
  downloaded), grid width 4, depth ``--capture-depth`` (4), 2 trees per L1, on the CPU and on
  the device.

* **alpha***: the OT optimum's acceptance of k = 4 i.i.d. children per node (``simlab.otlp.
  optimal_acceptance`` on the CPU, one node at a time; ``simlab.batched.optimal_acceptance`` on the
  device, every node in one sort per row), nodes per second;
* **ot_exact**: the OT-optimal rule's branch masses of one drafted tuple per node (the curtain's
  plan, then ``children_mass``), nodes per second on the CPU; it has no device path (the curtain is
  a sequential walk over the sorted atoms), so its device column is the CPU path fed from rows
  copied off the device.

Before any timing every device result is checked against the CPU reference on the same rows (node
masses 1e-12, SpecTr 1e-9 where rho* is ill-conditioned (``simlab.batched``); alpha* 1e-12; the
grid's labels from the torch engine against the numpy engine on the same table, 1e-9; a capture's
labels must be block efficiencies of their trees, in [1, L1 + L2 + 1]); a mismatch stops the script (exit 1)
naming the level.  ``--device cpu`` runs every level with the engine on the CPU (``--dry-run``: at
tiny sizes, the default suite's check).

p and q of the first three levels are softmaxes of N(0, 3^2) logits (the draft's perturbed by N(0, 1.5^2)),
drawn from a seeded torch Generator on the device.  Writes the table as JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from simlab.checks import check_device

VERIFIERS = ("nss", "naive", "specinfer", "spectr")


def _rows(n, vocab, device, generator, dtype):
    import torch

    z = 3.0 * torch.randn(n, vocab, generator=generator, device=device, dtype=dtype)
    P = torch.softmax(z, dim=1)
    Q = torch.softmax(z + 1.5 * torch.randn(n, vocab, generator=generator, device=device, dtype=dtype), dim=1)
    return P, Q


def _children(Q, k, generator):
    import torch

    return torch.multinomial(Q.float(), k, replacement=True, generator=generator)


def _timed(fn, sync, repeat):
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync()
    return (time.perf_counter() - start) / repeat


def bench(vocab: int, device: str, *, nodes: int, trees: int, repeat: int, cpu_nodes: int) -> list[dict]:
    import torch

    from simlab import batched, tree_verifiers, verifiers
    from simlab.grid import draw_grid, grid_block_efficiency
    from simlab.pairs import ContextFreePair
    from simlab.builders import Delayed
    from simlab.trees import DraftTree, NodeTable

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    P, Q = _rows(nodes, vocab, device, gen, torch.float64)
    X = _children(Q, 4, gen)
    P_cpu, Q_cpu, X_cpu = P[:cpu_nodes].cpu().numpy(), Q[:cpu_nodes].cpu().numpy(), X[:cpu_nodes].cpu().numpy()
    for name in VERIFIERS:
        v = verifiers.get(name)
        want = np.array([v.prepare(p, q, 4, checked=True).children_mass(x) for p, q, x in zip(P_cpu, Q_cpu, X_cpu)])
        got = batched.children_mass(v, P[:cpu_nodes], Q[:cpu_nodes], X[:cpu_nodes], checked=True).cpu().numpy()
        _agree(f"node {name}", got, want, 1e-9 if name == "spectr" else 1e-12)
        cpu = _timed(
            lambda: [v.prepare(p, q, 4, checked=True).children_mass(x) for p, q, x in zip(P_cpu, Q_cpu, X_cpu)], lambda: None, 1
        )
        dev = _timed(
            lambda: batched.children_mass(v, P, Q, X, checked=True), sync, repeat
        )  # rows valid by construction, as the CPU side's
        rows.append({"V": vocab, "level": "node", "verifier": name, "cpu_per_s": cpu_nodes / cpu, "device_per_s": nodes / dev})
    rows += _optimum_rows(vocab, P, Q, X, P_cpu, Q_cpu, X_cpu, sync, repeat)
    # Trees and the grid: structures drawn on the CPU from a context-free pair at this V (its p, q
    # rows are the device rows' first two), masses on the device from rows resident there.
    pair = ContextFreePair(P[0].cpu().numpy(), Q[0].cpu().numpy())
    tree_list = [Delayed(4, 4, 4).sample(NodeTable(pair, (0,)), np.random.default_rng(i)) for i in range(trees)]
    grid_table = NodeTable(pair, (0,))
    drafts = draw_grid(grid_table, K_max=4, L1_values=range(9), L2_max=8, samples=4, rng=np.random.default_rng(0))
    for name in ("specinfer", "spectr"):
        tv = tree_verifiers.get(name)
        cpu_tree = _timed(
            lambda: [tv.expected_block_efficiency(DraftTree(t.table.without_plans(), t.children)) for t in tree_list],
            lambda: None,
            1,
        )  # every round without memoised plans
        requests = [r for t in tree_list for r in tv.mass_requests(t)]
        cpu_labels = grid_block_efficiency(grid_table.without_plans(), drafts, tv)
        dev_labels = grid_block_efficiency(grid_table.without_plans(), drafts, tv, engine="torch", device=device)
        _agree(f"grid {name}", *(np.nan_to_num(_label_values(x), nan=-1.0) for x in (dev_labels, cpu_labels)), 1e-9)
        cpu_grid = _timed(lambda: grid_block_efficiency(grid_table.without_plans(), drafts, tv), lambda: None, 1)
        grid_requests = [
            r for d in drafts for K in (1, 2, 3, 4) for r in tv.mass_requests(Delayed.build(grid_table, d.trunk, d.branches[:K]))
        ]
        rows.append(
            {
                "V": vocab,
                "level": "tree",
                "verifier": name,
                "cpu_per_s": trees / cpu_tree,
                "device_per_s": 1.0 / _engine_time(requests, vocab, device, gen, sync, repeat) * trees,
            }
        )
        rows.append(
            {
                "V": vocab,
                "level": "grid",
                "verifier": name,
                "cpu_per_s": 1.0 / cpu_grid,
                "device_per_s": 1.0 / _engine_time(grid_requests, vocab, device, gen, sync, repeat),
            }
        )
    return rows


class Mismatch(RuntimeError):
    """A device result that differs from the CPU reference (the script stops, exit 1)."""


def _agree(level: str, got, want, atol: float) -> None:
    """Raise ``Mismatch`` naming ``level`` unless ``got`` equals ``want`` within ``atol``."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    if got.shape != want.shape or not np.allclose(got, want, rtol=0, atol=atol):
        gap = np.abs(got - want).max() if got.shape == want.shape else f"shapes {got.shape} and {want.shape}"
        raise Mismatch(f"{level}: the device result differs from the CPU reference (largest gap {gap}, allowed {atol})")


def _label_values(labels) -> np.ndarray:
    """Every grid label's mean and standard error, in a fixed order (a dict of ``Estimate``s)."""
    return np.array([[labels[key].mean, labels[key].stderr] for key in sorted(labels, key=repr)], dtype=float)


def _optimum_rows(vocab, P, Q, X, P_cpu, Q_cpu, X_cpu, sync, repeat) -> list[dict]:
    """alpha* (CPU numpy, one node at a time; device batched) and ot_exact (CPU only), checked first."""
    from simlab import batched, verifiers
    from simlab.otlp import optimal_acceptance

    n = len(P_cpu)
    want = np.array([optimal_acceptance(p, q, 4) for p, q in zip(P_cpu, Q_cpu)])
    _agree("alpha*", batched.optimal_acceptance(P[:n], Q[:n], 4, checked=True).cpu().numpy(), want, 1e-12)
    cpu = _timed(lambda: [optimal_acceptance(p, q, 4) for p, q in zip(P_cpu, Q_cpu)], lambda: None, 1)
    dev = _timed(lambda: batched.optimal_acceptance(P, Q, 4, checked=True), sync, repeat)
    rows = [{"V": vocab, "level": "alpha*", "verifier": "optimal", "cpu_per_s": n / cpu, "device_per_s": P.shape[0] / dev}]
    v = verifiers.get("ot_exact")
    masses = np.array([v.prepare(p, q, 4, checked=True).children_mass(x) for p, q, x in zip(P_cpu, Q_cpu, X_cpu)])
    # the rule reaches alpha*: its acceptance sum min(mu, p) is checked by its own tests; here the
    # masses of one tuple's distinct tokens (a repeated child carries its token's whole mass) must
    # be a sub-probability vector
    distinct = [m[np.unique(x, return_index=True)[1]].sum() for m, x in zip(masses, X_cpu)]
    if not (np.isfinite(masses).all() and (masses >= -1e-15).all() and max(distinct) <= 1 + 1e-12):
        raise Mismatch("ot_exact: branch masses of a tuple are not a sub-probability vector")
    cpu = _timed(
        lambda: [v.prepare(p, q, 4, checked=True).children_mass(x) for p, q, x in zip(P_cpu, Q_cpu, X_cpu)], lambda: None, 1
    )

    def from_device():
        P_host, Q_host, X_host = P[:n].cpu().numpy(), Q[:n].cpu().numpy(), X[:n].cpu().numpy()
        return [v.prepare(p, q, 4, checked=True).children_mass(x) for p, q, x in zip(P_host, Q_host, X_host)]

    dev = _timed(from_device, sync, 1)
    rows.append({"V": vocab, "level": "ot_exact", "verifier": "ot_exact", "cpu_per_s": n / cpu, "device_per_s": n / dev})
    return rows


def _engine_time(requests, vocab, device, gen, sync, repeat) -> float:
    """Seconds for the engine to answer ``requests`` (grouped by (verifier, k)) with rows on the device."""
    import torch

    from simlab import batched

    groups: dict = {}
    for _, node, kids, *_ in requests:  # (path, node verifier, children, law)
        groups.setdefault((node, len(kids)), []).append(kids)
    batches = []
    for (node, k), kids in groups.items():
        P, Q = _rows(len(kids), vocab, device, gen, torch.float64)
        batches.append((node, P, Q, _children(Q, k, gen)))

    def run():
        for node, P, Q, X in batches:
            batched.children_mass(node, P, Q, X, checked=True)  # as table_masses: rows validated once by the table

    return _timed(run, sync, repeat)


def bench_capture(vocab: int, device: str, *, depth: int, roots: int) -> dict:
    """Roots per second of ``capture_group`` (labels for SpecInfer) on the CPU and on ``device``."""
    import tempfile

    from backends import capture_store
    from backends.capture import capture_group, label_engine
    from backends.hf import HFPair
    from backends.reference_pair import random_pair

    with tempfile.TemporaryDirectory() as tmp:
        random_pair(Path(tmp), vocab)
        settings = capture_store.CaptureSettings(
            f"{tmp}/target",
            f"{tmp}/draft",
            "",
            shape="grid",
            width=4,
            depth=depth,
            samples=2,
            labels="specinfer",
            roots_per_forward=roots,
        )
        group = [(r, 0, tuple(int(t) for t in np.random.default_rng(r).integers(0, vocab, 16))) for r in range(roots)]
        rates = {}
        for where in ("cpu", device):
            pair = HFPair(f"{tmp}/target", f"{tmp}/draft", device=where)
            engine = label_engine(pair.device, "auto")  # the torch engine on CUDA
            for _, _, _, labels in capture_group(pair, settings, group, pair.max_batch, pair.forest_tokens, engine):
                bad = [r for r in labels if not 1.0 <= r["E"] <= r["L1"] + r["L2"] + 1 + 1e-9]
                if bad:
                    raise Mismatch(f"capture on {where}: label {bad[0]} is not a block efficiency of its tree")
            seconds = _timed(
                lambda: capture_group(pair, settings, group, pair.max_batch, pair.forest_tokens, engine), lambda: None, 1
            )
            rates[where] = roots / seconds
    return {"V": vocab, "level": "capture", "verifier": "specinfer", "cpu_per_s": rates["cpu"], "device_per_s": rates[device]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device for the engine (default cuda)")
    parser.add_argument("--vocab", type=int, nargs="+", default=[32_000, 128_000])
    parser.add_argument("--nodes", type=int, default=2048, help="nodes per batched node call")
    parser.add_argument("--trees", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--capture-depth", type=int, default=4, help="grid depth of the capture level (largest L1 and L2)")
    parser.add_argument("--capture-roots", type=int, default=8, help="roots of the capture level (one multi-root forward)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (V = 512, 16 nodes, 2 trees)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    import torch

    if args.dry_run:
        args.device, args.vocab, args.nodes, args.trees, args.repeat, args.capture_depth, args.capture_roots = (
            "cpu",
            [512],
            16,
            2,
            1,
            1,
            2,
        )
    try:
        check_device(args.device, "--device")
    except ValueError as exc:
        print(f"scripts/gpu_bench.py: {exc} (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    if min(args.vocab) < 2 or min(args.nodes, args.trees, args.repeat, args.capture_depth, args.capture_roots) < 1:
        print(
            "scripts/gpu_bench.py: --vocab, --nodes, --trees, --repeat, --capture-* must be positive (vocab >= 2)",
            file=sys.stderr,
        )
        return 2
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }
    print(" ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    rows = []
    for vocab in args.vocab:
        start = time.perf_counter()
        try:
            rows += bench(
                vocab, args.device, nodes=args.nodes, trees=args.trees, repeat=args.repeat, cpu_nodes=min(args.nodes, 64)
            )
            rows.append(bench_capture(vocab, args.device, depth=args.capture_depth, roots=args.capture_roots))
        except Mismatch as exc:
            print(f"scripts/gpu_bench.py: V = {vocab}: {exc}", file=sys.stderr)
            return 1
        print(f"V = {vocab}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    print(f"{'V':>7} {'level':<8} {'verifier':<10} {'cpu /s':>12} {'device /s':>12}")
    for r in rows:
        print(f"{r['V']:>7} {r['level']:<8} {r['verifier']:<10} {r['cpu_per_s']:>12.1f} {r['device_per_s']:>12.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
