"""Serving a prompt stream with the block drafter and adapting it (the SpecBlock study's bandit part).

``serve`` decodes one prompt by speculative decoding: at each step the rank-guided tree of the
current drafter, verified by the setting's lossless rule (greedy at T = 0, one-hot at T > 0, with
a seeded generator), its **exact** E[tau + 1] (the tree verifier's law) and T-hat (the latency
model, the "block" drafter's forwards), and the free signal s of the step: over the drafter's
block-1 chain (each node's first child from the root), s = sum over the chain positions past
the accepted ones of (1 - r_k), r_k the target's probability of the chain token given the chain
before it (at T = 0, p is one-hot: s counts the rejected chain positions).  A prompt's
acceptance is its mean exact E[tau + 1], its throughput sum E / sum T.

``stream`` serves the prompts in order under a policy: ``none`` (never update), ``heads`` and
``full`` (always that update after each prompt) or ``bandit`` (``simlab.specblock.bandit``: the
arm from the EWMA gains net of the modelled update cost; forced ``skip`` when the prompt's s is
0 or nothing was served).  The gain observed for the arm chosen after prompt i is throughput(i + 1) - throughput(i).
Every adapting policy keeps a snapshot each window and rolls back to the one three windows
earlier when ``Rollback`` says acceptance dropped.  Net throughput counts the modelled update
seconds (the paper runs them on a side stream; the lab charges them in full).
"""

from __future__ import annotations

import copy

import numpy as np

from simlab import tree_verifiers
from simlab.specblock import RankGuided
from simlab.specblock.bandit import CostAwareBandit, Rollback, signal
from simlab.trees import NodeTable

POLICIES = ("none", "heads", "full", "bandit")


def chain_signal(table: NodeTable, tree, accepted: tuple[int, ...]) -> float:
    """s of one step (module docstring): ``simlab.specblock.bandit.signal`` over the first-child chain,
    r_k = p(chain token | chain before it), the accepted part being the chain's prefix that was accepted."""
    path, r, matched = (), [], 0
    while tree.child_list(path):
        token = tree.child_list(path)[0]
        if matched == len(path) and len(accepted) > len(path) and accepted[len(path)] == token:
            matched += 1
        r.append(float(table.p(path)[token]))
        path = path + (token,)
    return signal(r, matched)


def serve(
    pair, prompt: tuple[int, ...], builder: RankGuided, latency, new_tokens: int, rng: np.random.Generator, room: int
) -> dict:
    """Decode ``new_tokens`` after ``prompt`` (fewer if the context would exceed ``room`` tokens);
    returns the step count, tokens, sum E, sum T, sum s and the served sequence."""
    greedy = pair.settings.greedy
    verifier = tree_verifiers.get("greedy" if greedy else "onehot")
    context, sum_e, sum_t, signal, steps = tuple(prompt), 0.0, 0.0, 0.0, 0
    depth = builder.blocks * builder.drafter.K
    while len(context) - len(prompt) < new_tokens and len(context) + depth <= room:
        table = NodeTable(pair, context)
        tree = builder.sample(table)
        table.fetch(tree.nodes())
        sum_e += verifier.expected_block_efficiency(tree)
        sum_t += latency.tree_step_time(len(context), tree)
        accepted, bonus = verifier.verify(tree, rng)
        signal += chain_signal(table, tree, accepted)
        context = context + accepted + (bonus,)
        steps += 1
    return {"steps": steps, "tokens": len(context) - len(prompt), "E": sum_e, "T": sum_t, "signal": signal, "sequence": context}


def stream(
    policy: str,
    model,
    pair,
    prompts,
    make_adapter,
    builder_for,
    latency,
    *,
    new_tokens: int,
    room: int,
    seed: int,
    ewma: float,
    explore: float,
    window: int,
    progress=None,
) -> list[dict]:
    """One row per prompt: acceptance, throughput, signal, the arm applied after it, its modelled
    and wall seconds, roll-backs.  ``model`` is copied (the caller's weights stay as they are)."""
    model = copy.deepcopy(model)
    adapter = make_adapter(model)
    builder = builder_for(model)
    block = latency.forward("block")
    bandit = CostAwareBandit(np.random.default_rng([seed, 1]), ewma=ewma, explore=explore)
    rollback, snapshots = Rollback(window=window), [adapter.snapshot()]
    rng = np.random.default_rng([seed, 2])
    rows, pending = [], None
    for i, prompt in enumerate(prompts):
        served = serve(pair, prompt, builder, latency, new_tokens, rng, room)
        tps = served["E"] / served["T"] if served["T"] else 0.0
        if pending is not None and policy == "bandit":
            bandit.observe(pending[0], tps - rows[-1]["throughput"], pending[1])
        arm = {"none": "skip", "heads": "heads", "full": "full"}.get(policy)
        if policy == "bandit":
            arm = "skip" if served["signal"] == 0 or served["steps"] == 0 else bandit.choose(tps, served["T"])
        roots, wall = adapter.update(arm, [served["sequence"]])
        cost = adapter.cost(arm, roots, block)
        rolled = False
        if policy != "none":
            if rollback.record(served["E"] / max(served["steps"], 1)):
                adapter.restore(snapshots[max(0, len(snapshots) - 3)])
                rolled = True
            if (i + 1) % window == 0:
                snapshots.append(adapter.snapshot())
        pending = (arm, cost)
        rows.append(
            {
                "policy": policy,
                "prompt": i,
                "steps": served["steps"],
                "tokens": served["tokens"],
                "acceptance": served["E"] / max(served["steps"], 1),
                "throughput": tps,
                "serving_seconds": served["T"],
                "signal": served["signal"],
                "arm": arm,
                "update_roots": roots,
                "update_seconds": cost,
                "update_wall_seconds": wall,
                "rolled_back": rolled,
            }
        )
        if progress is not None:
            progress()
    return rows
