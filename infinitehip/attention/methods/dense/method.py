"""`dense`: exact causal attention over every cached token (torch SDPA, GQA), original RoPE positions.

Prefill chunks gather their sequence's keys, rotate them and run causal SDPA. Decode runs every decode sequence of
the step in one paged op (`paged_decode/`): each cache page read once, keys rotated as they are read, split-K over
the pages on CUDA; it reads positions and page tables from the batch's device tensors and its shapes follow the
page-table width only, so a step replays from a CUDA graph (GraphDecode) at any position of its capacity bucket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import GraphDecode, KVOffload, PrefixCaching
from infinitehip.attention.methods.dense.paged_decode.op import paged_decode
from infinitehip.attention.common.softcap import attend
from infinitehip.kv.paged_cache import is_offloaded
from infinitehip.kv.prefix_reuse import PrefixReuse
from infinitehip.model.rotary.op import rotate_at

ROWS_PER_PASS = 512  # soft-capped queries per pass: their scores are materialised, heads x rows x context floats


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
    """q [n, H, d] are the last n of the k/v [L, Hkv, d] positions (q_offset = L - n) -> [n, H, d].

    Query i may see keys 0..q_offset+i (causal mask aligned to the bottom-right corner).
    """
    n, L = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    gqa = q.shape[1] != k.shape[1]
    if n == 1:
        out = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=gqa)
    elif q_offset == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=gqa)
    else:
        # a causal bias aligned to the bottom-right corner keeps SDPA on its flash / memory-efficient kernels; a
        # boolean mask would send a chunk of a long prompt to the math kernel (n x L scores materialised)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(n, L), enable_gqa=gqa)
    return out[0].transpose(0, 1)


def softcapped_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, cap: float) -> torch.Tensor:
    """causal_sdpa with Gemma 2's logit soft-capping, in passes of ROWS_PER_PASS queries -> [n, H, d]."""
    out = torch.empty_like(q)
    kh, vh = k.transpose(0, 1), v.transpose(0, 1)
    for a in range(0, q.shape[0], ROWS_PER_PASS):
        b = min(a + ROWS_PER_PASS, q.shape[0])
        end = q_offset + b  # keys the pass's last query sees
        visible = torch.arange(end, device=q.device)[None, :] <= (q_offset + torch.arange(a, b, device=q.device))[:, None]
        out[a:b] = attend(q[a:b].transpose(0, 1), kh[:, :end], vh[:, :end], visible, cap).transpose(0, 1)
    return out


class DenseAttention(AttentionMethod, GraphDecode, KVOffload, PrefixCaching):
    name = "dense"
    supports_attn_softcapping = True

    def graph_key(self, seq: SequenceSlice) -> tuple | None:
        """Every resident step launches the same paged op (no host state); an offloaded one reads its bank from the
        host per sequence: eager."""
        return None if is_offloaded(seq.cache) else ("dense",)

    def check_offload(self, offload, max_context_tokens: int, max_num_seqs: int) -> None:
        """Dense reads every key with `cache.read`, which an offloaded cache serves through its attention bank in
        pieces: correct at any size (slow at long contexts; meant for validating the offloaded path)."""

    def prefix_reuse(self) -> PrefixReuse:
        """Causal and stateless: a token's k/v depend on the tokens up to it only; any page boundary is exact."""
        return PrefixReuse()

    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        k, v = seq.cache.read(layer, seq.context_slots)
        k = batch.rope.apply_range(k, 0)
        q = batch.rope.apply_range(q, seq.start_pos)
        cap = self.model_config.attn_logit_softcapping
        return causal_sdpa(q, k, v, seq.start_pos) if cap is None else softcapped_causal(q, k, v, seq.start_pos, cap)

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        """q [B, H, d] pre-RoPE, one token per sequence -> [B, H, d]: all sequences in one paged decode call."""
        if is_offloaded(batch.cache):  # no resident pages: each sequence reads through its bank
            return super().decode(layer, q, seqs, batch)
        return resident_decode(layer, q, batch, softcap=self.model_config.attn_logit_softcapping)


def resident_decode(layer: int, q: torch.Tensor, batch: ForwardBatch, rows: slice | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """Exact decode over a resident paged cache: q [B, H, d] pre-RoPE, one new token for each of the step's decode
    sequences (or for those of `rows`) -> [B, H, d], every key at its original position, one paged op."""
    rope = batch.rope
    positions, page_tables = batch.decode_positions, batch.decode_page_tables  # [B] cache index of the new token
    if rows is not None:
        positions, page_tables = positions[rows], page_tables[rows]
    rope.ensure(batch.decode_capacity)
    q = rotate_at(q, positions, rope.cos, rope.sin)
    cos, sin = rope.decode_tables(q.dtype)
    return paged_decode(q, batch.cache.k[layer], batch.cache.v[layer], page_tables, positions + 1, cos, sin,
                        softcap=softcap)
