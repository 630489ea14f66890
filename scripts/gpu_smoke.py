"""GPU smoke check for the real-model backend (run it when a CUDA machine is available).

    python scripts/gpu_smoke.py --pair ~/.cache/simlab/reference_pair/seed0 --trees 64

Captures a small set of draft trees with the reference pair in bfloat16 on CUDA and reports
tree nodes per second of the one-forward tree evaluation beside a plain batched target forward
over the same number of tokens (the capture-throughput comparison of the real-model issue).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> int:
    import torch

    from backends.hf import HFPair
    from simlab.builders import Delayed
    from simlab.trees import NodeTable

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", required=True, help="folder with target/ and draft/ (python -m backends.reference_pair)")
    parser.add_argument("--trees", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    pair = HFPair(f"{args.pair}/target", f"{args.pair}/draft", device="cuda", dtype=args.dtype)
    prompt = pair.encode("The for statement is used to iterate over the elements of a sequence")
    rng = np.random.default_rng(0)
    trees = [Delayed(4, 2, 4).sample(NodeTable(pair, prompt), rng) for _ in range(args.trees)]
    node_lists = [t.nodes() for t in trees]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for nodes in node_lists:
        pair.node_logits(prompt, nodes)
    torch.cuda.synchronize()
    tree_seconds = time.perf_counter() - start
    nodes_total = sum(len(n) for n in node_lists)
    tokens = torch.randint(0, pair.vocab_size, (len(node_lists), len(prompt) + max(len(n) for n in node_lists)), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        pair.target(tokens)
        pair.draft(tokens)
    torch.cuda.synchronize()
    plain_seconds = time.perf_counter() - start
    print(f"device {torch.cuda.get_device_name()} dtype {args.dtype}")
    print(f"tree evaluation: {nodes_total} nodes in {tree_seconds:.3f} s = {nodes_total / tree_seconds:.0f} nodes/s")
    print(
        f"plain batched forward (both models): {tokens.numel()} tokens in {plain_seconds:.3f} s = {tokens.numel() / plain_seconds:.0f} tokens/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
