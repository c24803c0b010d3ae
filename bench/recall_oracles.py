"""Oracle chunk scorers for `recall_study.py` (diagnostics only; they read every key of every chunk).

`install(mode)` replaces the landmark scoring call of `pruning.run_stage`:
  exact  a chunk's representative per head is its key with the highest logit (max over the block's queries)
         under the stage's own RoPE style: the best any representative could do for that score definition
  mass   a chunk's score is its true attention mass: full-context causal softmax at original positions per
         (head, query), summed over the block's heads and queries: the ceiling of a block- and head-shared
         hierarchical chunk selection (what the recall metric rewards)
  recent a chunk's score is its position: the selection is the chunks nearest the window (a longer sliding
         window of the same budget; the floor any content-based scoring should beat)
  None   the method's own scoring (landmark representatives)
"""

from __future__ import annotations

import torch

import infinitehip.attention.infinitehip.pruning as pruning
from infinitehip.attention.infinitehip.saliency import KeySaliency
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary

_ORIG = {"reps": KeySaliency.representatives, "scores": pruning.representative_scores,
         "positions": pruning.scoring_positions, "rotary": pruning.apply_rotary}
_seen: dict = {}  # what run_stage handed to the patched calls of the current stage


def _reps(self, layer, starts, lens, page_table, page_size, chunk_size, impl="reference"):
    _seen.update(starts=starts, chunk=chunk_size)
    return _ORIG["reps"](self, layer, starts, lens, page_table, page_size, chunk_size, impl)


def _positions(style, query_orig_pos, *args, **kw):
    _seen["qpos"] = query_orig_pos  # [M, b]
    return _ORIG["positions"](style, query_orig_pos, *args, **kw)


def _rotary(x, cos, sin):
    if x.dim() == 4:
        _seen["q"] = x  # the blocks' pre-RoPE queries [M, b, H, d]
    return _ORIG["rotary"](x, cos, sin)


def _chunk_tokens(m, lens):
    starts, c = _seen["starts"], _seen["chunk"]
    tok = starts[m][:, None] + torch.arange(c)  # [N, c]
    ok = torch.arange(c)[None] < lens[m][:, None]
    return torch.where(ok, tok, starts[m][:, None]), ok


def exact_scores(q_rot, q_valid, k_flat, page_table, page_size, lens, base, group, rep_offset, cos, sin):
    """-> [M, N, H]: per head the max over the chunk's keys and the block's queries (stage RoPE positions)."""
    M, b, H, d = q_rot.shape
    kvh = torch.arange(H) // (H // k_flat.shape[1])
    out = torch.full((M, lens.shape[1], H), float("-inf"))
    for m in range(M):
        tok, ok = _chunk_tokens(m, lens)
        k = k_flat[token_slots(page_table, tok, page_size)][:, :, kvh].float()  # [N, c, H, d]
        pos = base[m][:, None] + rep_offset + (tok // group if group else 0)
        k = apply_rotary(k, cos[pos][:, :, None], sin[pos][:, :, None])
        s = torch.einsum("bhd,nchd->nhcb", q_rot[m].float(), k).masked_fill(~q_valid[m], -1e30).amax(-1)
        out[m] = s.masked_fill(~ok[:, None, :], -1e30).amax(-1)
    return out.masked_fill((lens == 0)[..., None], float("-inf"))


def mass_scores(q_valid, k_flat, page_table, page_size, lens, cos, sin):
    """-> [M, N]: true attention mass of each chunk, summed over the block's heads and valid queries."""
    qpos, q = _seen["qpos"], _seen["q"]
    M, b, H, d = q.shape
    kvh = torch.arange(H) // (H // k_flat.shape[1])
    L = int(qpos.max()) + 1
    keys = k_flat[token_slots(page_table, torch.arange(L), page_size)][:, kvh].float()
    keys = apply_rotary(keys, cos[:L][:, None], sin[:L][:, None])  # [L, H, d]
    out = torch.zeros(M, lens.shape[1])
    for m in range(M):
        qr = apply_rotary(q[m].float(), cos[qpos[m]][:, None], sin[qpos[m]][:, None])  # [b, H, d]
        s = torch.einsum("bhd,lhd->hbl", qr, keys) * d ** -0.5
        s = s.masked_fill(torch.arange(L)[None, None] > qpos[m][None, :, None], float("-inf"))
        p = torch.softmax(s, -1).masked_fill(~q_valid[m][None, :, None], 0).sum((0, 1))  # [L]
        tok, ok = _chunk_tokens(m, lens)
        out[m] = torch.where(ok, p[tok.clamp(max=L - 1)], 0).sum(1)
    return out.masked_fill(lens == 0, float("-inf"))


def install(mode: str | None) -> None:
    """Route run_stage's landmark scoring through the oracle `mode` ("exact", "mass", "recent") or back (None)."""
    KeySaliency.representatives = _reps
    pruning.scoring_positions, pruning.apply_rotary = _positions, _rotary
    if mode is None:
        pruning.representative_scores = _ORIG["scores"]
        return

    def scores(q_rot, q_valid, k_flat, page_table, page_size, reps, lens, base, group, rep_offset, cos, sin,
               impl="reference", per_head=False):
        if mode == "recent":
            x = _seen["starts"].float().masked_fill(lens == 0, float("-inf"))
            return x[..., None] if per_head else x
        if mode == "mass":  # already one score per chunk: aggregated over heads by construction
            x = mass_scores(q_valid, k_flat, page_table, page_size, lens, cos, sin)
            return x[..., None] if per_head else x
        x = exact_scores(q_rot, q_valid, k_flat, page_table, page_size, lens, base, group, rep_offset, cos, sin)
        return x if per_head else x.amax(-1)

    pruning.representative_scores = scores
