"""EAGLE-2's tree construction as its official code runs it, in torch: the in-run reference of
the builder benchmark (EAGLE@cb7e084 ``eagle/model/cnets.py::topK_genrate``, the draft model's
calls excluded).

Transcribed step by step from that function's tree-building part: one ``topk`` over the root's
log-probabilities; per round, one ``topk`` over the stacked frontier rows (top_k x V), the
cumulative scores, one ``topk`` over the top_k^2 of them for the next frontier, the parent
indices with EAGLE's index bias and the growing tree mask; then the ``total_token - 1`` best of
all scores, sorted, their parents found by ``searchsorted`` and the final tree mask and depths.
The frontier rows are what the draft model returns (its log-softmax, here precomputed per round
and excluded, as the lab's table holds p and q before its builder is timed).
"""

from __future__ import annotations

import torch


def official_tree(root_row: torch.Tensor, frontier_rows, *, total_tokens: int = 60, depth: int = 7, top_k: int = 10):
    """(draft tokens, parent positions, depths): ``root_row`` (1, V) log q at the root and
    ``frontier_rows(i, parents, tokens)`` the (top_k, V) log q rows of round i's frontier (what the
    model returns when fed the frontier's token ids ``tokens`` (1, top_k) and the hidden states of
    their ``parents``, positions in the previous frontier; None in round 0, below the root)."""
    top = torch.topk(root_row, top_k, dim=-1)
    scores = top.values[0]
    scores_list, parents_list, tokens_list = [scores[None]], [torch.zeros(1, dtype=torch.long)], [top.indices]
    frontier_tokens = top.indices
    frontier_index = torch.arange(top_k)
    out_ids = None
    mask_init = torch.eye(top_k)[None, None]
    tree_mask = mask_init
    for i in range(depth):
        bias = 1 + top_k**2 * max(0, i - 1) + (top_k if i > 0 else 0)
        parents_list.append(frontier_index + bias)
        rows = frontier_rows(i, out_ids, frontier_tokens)
        top = torch.topk(rows, top_k, dim=-1)
        cumulative = top.values + scores[:, None]
        best = torch.topk(cumulative.view(-1), top_k, dim=-1)
        frontier_index, scores = best.indices, best.values
        out_ids = frontier_index // top_k
        frontier_tokens = top.indices.view(-1)[frontier_index][None]
        tokens_list.append(top.indices)
        scores_list.append(cumulative)
        tree_mask = torch.cat((tree_mask[:, :, out_ids], mask_init), dim=3)
    all_scores = torch.cat(scores_list, dim=0).view(-1)
    all_tokens = torch.cat(tokens_list, dim=0).view(-1)
    kept = torch.sort(torch.topk(all_scores, total_tokens - 1, dim=-1).indices).values
    draft_tokens = all_tokens[kept]
    draft_parents = torch.cat(parents_list, dim=0)[kept // top_k].long()
    mask_index = torch.searchsorted(kept, draft_parents - 1, right=False)
    mask_index[draft_parents == 0] = -1
    mask_index = (mask_index + 1).tolist()
    mask = torch.eye(total_tokens).bool()
    mask[:, 0] = True
    for j in range(total_tokens - 1):
        mask[j + 1].add_(mask[mask_index[j]])
    return draft_tokens, mask_index, mask.sum(dim=1) - 1
