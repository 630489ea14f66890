"""TreeGraft's official rules, written out plainly, and the checks a builder must pass (test-only).

``reference_tree`` re-implements the official layer loop (TreeGraft@f53e3a8
``graft/combine_tree/generator.py::CombineDraftGenerator._topK_genrate_combine`` with the
``direct_match`` skip of ``graft/ngram_tree/generator.py``) in the plainest form: flat lists by node
id, an n-gram search by scanning the context, a score cache computed on demand.  It shares no code
with ``simlab.treegraft`` but ``top_tokens`` (q's top-k, ties to the lowest id).

The checks (each raises AssertionError) take a builder factory ``make(**options)`` so that the
planted faults of ``treegraft_mutants.py`` can be run through them:

* ``check_reference``: trees, scores and drafting costs equal the reference's on a sweep of roots
  and all 2^D schedules;
* ``check_hand_cases``: hand-built cases where each official rule changes the tree, against
  hand-written expectations (empty frontier, fallback, truncated chain, coverage with existing
  children, max score / existing path, the last prompt row).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from backends.synthetic import RepetitiveWorld
from simlab.drafting import top_tokens
from simlab.pairs import ContextFreePair, MarkovPair, target_trajectory
from simlab.treegraft import NGramDrafter, TreeGraft
from simlab.treegraft.builder import Node
from simlab.trees import NodeTable

NEG = -math.inf


def _log(x: float) -> float:
    return math.log(x) if x > 0 else NEG


def reference_tree(pair, context, schedule, *, budget, k, lookback, N, cached=None):
    """The official tree: (children {path: tokens in id order}, {path: score} of the kept nodes,
    [(drafter, tokens) per forward])."""
    ctx, depth = list(context), len(schedule)
    prompt = len(ctx) if cached is None else cached
    rows = {}

    def cache(i, tok):  # row for continuation position i: p(. | ctx[:i]), cached for 1 <= i <= prompt
        if i < 1 or i > prompt:
            return 0.0
        if i not in rows:
            row = pair.distributions([tuple(ctx[:i])])[0][0]
            order = [int(t) for t in np.argsort(-row, kind="stable")[:10]]
            with np.errstate(divide="ignore"):
                logs = [float(np.log(row[t])) for t in order]
            rows[i] = (order, logs)
        order, logs = rows[i]
        return logs[order.index(tok)] if tok in order else logs[-1] - 5.0

    tok, par, kids, score, path = [None], [-1], [{}], [0.0], [()]
    cap = max(budget + 1, 1 + k + depth * k * k)

    def add(p, t, s):
        if len(tok) >= cap:
            return None
        tok.append(t), par.append(p), kids.append({}), score.append(s), path.append(path[p] + (t,))
        kids[p][t] = len(tok) - 1
        return len(tok) - 1

    def exists(u, chain):
        for t in chain:
            if t not in kids[u]:
                return False
            u = kids[u][t]
        return True

    frontier, forwards = [0], []
    for layer in range(1, depth + 1):
        if not frontier:
            break
        if schedule[layer - 1]:  # call: rescore everything, graft on the best of the depth window
            forwards.append(("draft", len(tok)))
            for v in range(1, len(tok)):
                score[v] = score[par[v]] + _log(pair.distributions([tuple(ctx) + path[par[v]]])[1][0][tok[v]])
            depths = {len(path[f]) for f in frontier}
            pool = [v for v in range(len(tok)) if any(d - lookback <= len(path[v]) <= d for d in depths)]
            produced = []
            for g in sorted(pool, key=lambda v: (-score[v], v))[:k]:
                q = pair.distributions([tuple(ctx) + path[g]])[1][0]
                for t in top_tokens(q, min(k, int(np.count_nonzero(q)))).tolist():
                    if t in kids[g]:
                        c = kids[g][t]
                        score[c] = score[g] + _log(q[t])
                    else:
                        c = add(g, t, score[g] + _log(q[t]))
                        if c is None:
                            break
                    produced.append(c)
            frontier = sorted(set(produced), key=lambda c: (-score[c], c))
        else:  # skip: the n-gram drafter
            forwards.append(("small", 1))
            length = max(1, N - (layer - 1))
            candidates, terminated = {}, 0
            for u in frontier:
                text = ctx + list(path[u])
                cover, found, mlen = set(kids[u]), {}, {}
                for n in range(min(N, len(text)), 0, -1):
                    for j in range(len(ctx) - n + 1):
                        i = j + n
                        if ctx[j:i] != text[-n:] or i + length > len(ctx):
                            continue
                        chain = tuple(ctx[i : i + length])
                        mlen.setdefault(chain[0], n)
                        cover.add(chain[0])
                        if chain not in found and not exists(u, chain):
                            found[chain] = (n, i)
                    if len(cover) >= k:
                        break
                for chain, (n, i) in sorted(found.items(), key=lambda e: (-e[1][0], -e[1][1], e[0])):
                    s, node = score[u] + cache(i, chain[0]), u
                    for d, t in enumerate(chain):
                        if t not in kids[node] and add(node, t, NEG) is None:
                            break
                        node = kids[node][t]
                        if d == 0:
                            score[node] = max(score[node], s)
                if len(cover) < k:
                    terminated += 1
                    continue
                for t, c in kids[u].items():
                    candidates[c] = max(candidates.get(c, 0), mlen.get(t, 0))
            if layer == 1 and terminated == len(frontier) and not kids[0]:
                count = {t: ctx.count(t) for t in ctx}
                last = {t: i for i, t in enumerate(ctx)}
                add(0, min(count, key=lambda t: (-count[t], -last[t])), 0.0)
                break
            frontier = sorted(candidates, key=lambda c: (-candidates[c], -score[c], c))
        if layer >= 2:
            frontier = frontier[:k]
        if len(tok) >= cap:
            break
    keep = set(range(len(tok)))
    if len(tok) > budget + 1:
        keep = {0}
        for v in sorted(range(1, len(tok)), key=lambda v: (-score[v], len(path[v]), v)):
            chain, u = [], v
            while u not in keep:
                chain.append(u)
                u = par[u]
            if len(keep) + len(chain) <= budget + 1:
                keep.update(chain)
            if len(keep) >= budget + 1:
                break
    children = {}
    for v in sorted(keep - {0}):
        children[path[par[v]]] = children.get(path[par[v]], ()) + (tok[v],)
    return children, {path[v]: score[v] for v in keep if v}, forwards


def factory(cls=TreeGraft, **fixed):
    """``make(N=5, **options)``: a ``cls`` builder (n-gram size N) with ``fixed`` options (e.g. ``rules``)."""
    return lambda N=5, **options: cls(schedule="mid", ngram=NGramDrafter(N), **fixed, **options)


def built(builder, pair, context, schedule=None):
    """(children, {path: score} of the kept nodes, [(drafter, tokens)]) of ``builder``'s tree."""
    state = builder.start(builder.prepare(NodeTable(pair, context)))
    for call in builder.schedule if schedule is None else schedule:
        state.step(bool(call))
    tree = state.finish()
    scores = {state.nodes[v].path: state.nodes[v].score for v in state.kept() if v}
    return tree.children, scores, [(f.model, f.tokens) for f in tree.cost.forwards]


def sweep_roots():
    """Roots of the repetitive world where every official rule is exercised: small vocabularies
    (coverage fails often), contexts of 6 to 120 tokens, some with a prompt shorter than the context."""
    out = []
    for seed in range(6):
        vocab = (4, 6, 12)[seed % 3]
        world = RepetitiveWorld(vocab=vocab, seed=seed)
        rng = np.random.default_rng(seed)
        for length in (6, 25, 120):
            context = target_trajectory(world, length, rng, prefix=(int(rng.integers(vocab)),))
            out.append((world, context, None if seed % 2 else len(context) - 3))
    return out


SWEEP_OPTIONS = (dict(top_k=2, budget=6, lookback=1, N=3), dict(top_k=3, budget=15, lookback=5, N=5))


def check_reference(make, roots=None, options=SWEEP_OPTIONS):
    """``make(**options)``'s trees, kept scores and costs equal the reference's on every root and schedule."""
    for world, context, cached in sweep_roots() if roots is None else roots:
        for o in options:
            builder = make(budget=o["budget"], depth=5, top_k=o["top_k"], lookback=o["lookback"], N=o["N"], cached=cached)
            for schedule in itertools.product((0, 1), repeat=5):
                want = reference_tree(
                    world, context, schedule, budget=o["budget"], k=o["top_k"], lookback=o["lookback"], N=o["N"], cached=cached
                )
                got = built(builder, world, context, schedule)
                assert got[0] == want[0] and got[2] == want[2], (context, o, schedule, got, want)
                assert got[1].keys() == want[1].keys() and all(
                    math.isclose(got[1][p], want[1][p], abs_tol=1e-12) or got[1][p] == want[1][p] for p in want[1]
                ), (context, o, schedule)


# -- hand-built cases ------------------------------------------------------------------------------
P6 = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.25])
Q6 = np.array([0.05, 0.05, 0.1, 0.5, 0.3, 0.0])


def hand_pair(vocab=10):
    """p = q on tokens 0..5 (as P6 / Q6), zero elsewhere (V = ``vocab``)."""
    pad = np.zeros(vocab - 6)
    return ContextFreePair(np.concatenate([P6, pad]), np.concatenate([Q6, pad]))


def state_with(builder, pair, context, nodes, frontier, layers_done):
    """A GraftState whose tree is ``nodes`` [(token, parent id, score)], frontier and layers done set by hand."""
    state = builder.start(builder.prepare(NodeTable(pair, context)))
    state.nodes = []
    for token, parent, score in nodes:
        depth = 0 if parent < 0 else state.nodes[parent].depth + 1
        path = () if parent < 0 else state.nodes[parent].path + (token,)
        state.nodes.append(Node(token, parent, depth, score, 0, path))
        if parent >= 0:
            state.nodes[parent].children[token] = len(state.nodes) - 1
    state.size = len(state.nodes)
    state.frontier, state.frontier_depths = list(frontier), {state.nodes[f].depth for f in frontier}
    state.calls = [1] * layers_done
    state.ran = layers_done
    return state


def case_empty_frontier(make):
    """Layer 1 (skip, N = 2, k = 2): the suffix (5, 1) and then (1,) both propose only the chain
    (2, 5): the root covers one token < k, is terminated, and the frontier is empty: the call
    scheduled at layer 2 never runs (one n-gram step, no mid forward)."""
    pair, context = hand_pair(), (5, 1, 2, 5, 1)
    children, scores, forwards = built(make(budget=10, depth=2, top_k=2, N=2), pair, context, (0, 1))
    assert children == {(): (2,), (2,): (5,)}, children
    assert forwards == [("small", 1)], forwards
    assert math.isclose(scores[(2,)], math.log(0.15), abs_tol=1e-12) and scores[(2, 5)] == NEG


def case_fallback(make):
    """Nothing matches after the root token 0: layer 1 leaves the root childless; the fallback adds
    one token, the most frequent of the context (1 and 2 twice each: the most recent, 2), score 0.0,
    and the layer loop stops (the later calls and skips never run)."""
    pair, context = hand_pair(), (2, 1, 1, 2, 0)
    children, scores, forwards = built(make(budget=10, depth=5, top_k=2, N=2), pair, context, (0, 1, 0, 1, 0))
    assert children == {(): (2,)} and scores == {(2,): 0.0}, (children, scores)
    assert forwards == [("small", 1)], forwards


def case_truncated_chain(make):
    """Layer 1 (N = 2: chains of 2): (7,) occurs at 0 (chain (5, 3)) and at 3, whose chain would run
    past the end (only (7,) left): that occurrence is skipped, so the root covers one token and
    is terminated, and the second skip never runs."""
    pair, context = hand_pair(), (7, 5, 3, 7, 7)
    children, _, forwards = built(make(budget=10, depth=2, top_k=2, N=2), pair, context, (0, 0))
    assert children == {(): (5,), (5,): (3,)}, children
    assert forwards == [("small", 1)], forwards


def case_coverage_counts_existing_children(make):
    """Layer 2 (a skip, chains of 1), the root already has the child 8 (score -1.0): its matches
    propose only 5 (after (4,)), but with 8 it covers k = 2 tokens and is not terminated; the
    frontier is both children, 5 first (matched, n = 1), then 8 (unmatched, match length 0)."""
    builder = make(budget=10, depth=3, top_k=2, N=2)
    state = state_with(builder, hand_pair(), (4, 5, 6, 4), [(None, -1, 0.0), (8, 0, -1.0)], [0], layers_done=1)
    state.step(False)
    five = state.nodes[0].children[5]
    assert state.frontier == [five, 1] and state.stop is None, (state.frontier, state.stop)
    assert math.isclose(state.nodes[five].score, math.log(0.25), abs_tol=1e-12)


def case_max_score_and_existing_path(make):
    """Layer 1, the root has the child 5 with the child 6.  (a) The match (4,) proposes the chain
    (5, 9): 9 is attached below 5 and 5's score becomes max(-0.1, log 0.25) = -0.1 (not
    overwritten).  (b) The match proposes (5, 6), an existing path: nothing changes, 5 keeps -3.0."""
    builder = make(budget=10, depth=2, top_k=2, N=2)
    tree = [(None, -1, 0.0), (5, 0, -0.1), (6, 1, NEG)]
    state = state_with(builder, hand_pair(), (5, 7, 4, 5, 9, 4), tree, [0], layers_done=0)
    state.step(False)
    assert set(state.nodes[1].children) == {6, 9} and state.nodes[1].score == -0.1, state.nodes[1]
    tree = [(None, -1, 0.0), (5, 0, -3.0), (6, 1, NEG)]
    state = state_with(builder, hand_pair(), (5, 7, 4, 5, 6, 4), tree, [0], layers_done=0)
    state.step(False)
    assert len(state.nodes) == 3 and state.nodes[1].score == -3.0, state.nodes[1]


def case_last_prompt_row(make):
    """A prompt of 2 tokens (2, 3) continued by (5, 2, 3): the match (2, 3) at the start continues
    at position 2 = the prompt's end, scored by the cached row p(. | whole prompt) = p(. | 3):
    log 0.6 (the lab's ``cache_without_last_row``: 0.0, as if beyond the prompt)."""
    target = np.full((6, 6), 0.04)
    target[3] = [0.1, 0.1, 0.1, 0.05, 0.05, 0.6]
    target /= target.sum(axis=1, keepdims=True)
    pair = MarkovPair(target, target)
    builder = make(budget=10, depth=1, top_k=1, N=2, cached=2)
    state = state_with(builder, pair, (2, 3, 5, 2, 3), [(None, -1, 0.0)], [0], layers_done=0)
    state.step(False)
    five = state.nodes[0].children[5]
    assert math.isclose(state.nodes[five].score, math.log(target[3][5]), abs_tol=1e-12), state.nodes[five].score


HAND_CASES = {
    "empty frontier": case_empty_frontier,
    "fallback": case_fallback,
    "truncated chain": case_truncated_chain,
    "coverage with existing children": case_coverage_counts_existing_children,
    "max score / existing path": case_max_score_and_existing_path,
    "last prompt row": case_last_prompt_row,
}


def check_hand_cases(make):
    for case in HAND_CASES.values():
        case(make)
