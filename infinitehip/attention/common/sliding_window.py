"""Sliding-window layers (Gemma 3's local layers): exact local attention over a ring buffer of the window.

A query at token position p sees the keys at positions p - window + 1 .. p (transformers' sliding mask:
kv > q - window). Each running sequence owns one row of a ring buffer per sliding layer holding the last
`window` keys (after RoPE, at their token positions; key of position t in slot t % window) and values, so
these layers' KV memory does not grow with the context. No attention method governs them: they are the
model's own exact attention at any context length.

Prefill chunk of n tokens at position p: its queries are cut into blocks of `window` queries; block b sees
the window - 1 keys before it and its own keys, all gathered as one unfold over [ring keys before p | chunk
keys] and computed by one batched SDPA call with a banded mask. Decode: one query per sequence over its
ring row. Both read positions from host values (prefill) or device tensors (decode, CUDA-graph safe).
"""

from __future__ import annotations

import torch

from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.host_values import device_tensor
from infinitehip.attention.common.softcap import attend
from infinitehip.config.model import ModelConfig
from infinitehip.model.rope import apply_rotary, inverse_frequencies, rotary_at


class SlidingWindowAttention:
    def __init__(self, config: ModelConfig, max_rows: int, device: torch.device, dtype: torch.dtype):
        if not config.sliding_layers:
            raise ValueError("the model has no sliding-window layers")
        local = config.sliding_view()
        self.window = config.sliding_window
        self.softcap = config.attn_logit_softcapping  # Gemma 2 (None: plain SDPA)
        # On the ring's device: a CPU copy would be moved at every decode step, which CUDA-graph capture refuses.
        self.inv_freq = inverse_frequencies(local.head_dim, local.rope_theta, local.rope_scaling).to(device)
        shape = (len(config.sliding_layers), max_rows, self.window, config.num_kv_heads, config.head_dim)
        # Zeroed: a slot never written by the row's sequence is masked, but must not hold NaN bit patterns.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._rows: dict[int, int] = {}  # seq_id -> ring row
        self._free = list(range(max_rows - 1, -1, -1))
        # The ring rows of a decode batch as a device tensor [B], built once per composition: a CUDA graph of the
        # batch (engine/graph_decode.py) reads it, so it lives until one of its rows is released.
        self._row_tensors: dict[tuple[int, ...], torch.Tensor] = {}
        # seq_id -> (boundary, k, v [layers, window, kv_heads, head_dim]): the rings as they were at a prefix
        # boundary inside the sequence's last prefill chunk (SequenceSlice.ring_boundary)
        self._at_boundary: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}

    @property
    def bytes(self) -> int:
        """Device memory of the ring buffers (fixed: it does not grow with the context)."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def bytes_per_sequence(self) -> int:
        return self.bytes // self.k.shape[1]

    def row(self, seq_id: int) -> int:
        row = self._rows.get(seq_id)
        if row is None:
            if not self._free:
                raise RuntimeError(f"no free sliding-window ring row for sequence {seq_id} "
                                   f"({self.k.shape[1]} rows: max_num_seqs + 1)")
            row = self._rows[seq_id] = self._free.pop()
        return row

    def release(self, seq_id: int) -> None:
        self._at_boundary.pop(seq_id, None)
        row = self._rows.pop(seq_id, None)
        if row is not None:
            self._free.append(row)
            for rows in [r for r in self._row_tensors if row in r]:
                del self._row_tensors[rows]

    def snapshot(self, seq_id: int, boundary: int, num_computed: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Host copies of a sequence's rings at token `boundary`, k and v [layers, window, kv_heads, head_dim] (a
        prefix boundary's state: kept with the cached prefix, engine/prefix_pages.py): its rings now when the
        boundary is the sequence's end (num_computed), the copy its last chunk kept there, or None."""
        if boundary == num_computed:
            row = self.row(seq_id)
            return self.k[:, row].to("cpu", copy=True), self.v[:, row].to("cpu", copy=True)  # a copy on the CPU too
        kept = self._at_boundary.get(seq_id)
        if kept is None or kept[0] != boundary:
            return None
        return kept[1].to("cpu", copy=True), kept[2].to("cpu", copy=True)

    def restore(self, seq_id: int, rings: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Write a snapshot into a sequence's ring row (a prefix hit, before its first forward): slot t % window
        holds position t's key, so the rings of the boundary serve any sequence resuming there."""
        row = self.row(seq_id)
        self.k[:, row].copy_(rings[0])
        self.v[:, row].copy_(rings[1])

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """layer: index among the sliding layers; q [T, H, d], k/v [T, Hkv, d] without RoPE -> [T, H, d]."""
        out = torch.empty_like(q)
        for s in batch.prefill:
            rows = s.query_rows
            out[rows] = self._prefill(layer, q[rows], k[rows], v[rows], s)
        if batch.decode:
            rows = batch.decode_rows
            out[rows] = self._decode(layer, q[rows], k[rows], v[rows], batch)
        return out

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary(x, cos[:, None], sin[:, None])

    def _prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: SequenceSlice) -> torch.Tensor:
        n, W, p, device = q.shape[0], self.window, s.token_start, q.device
        ring_k, ring_v = self.k[layer, self.row(s.seq_id)], self.v[layer, self.row(s.seq_id)]  # [W, Hkv, d]
        cos, sin = rotary_at(torch.arange(p, p + n, device=device), self.inv_freq)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        # Keys at positions p - W + 1 .. p + n - 1: the ring's W - 1 before the chunk, then the chunk's own.
        before = torch.arange(p - W + 1, p, device=device)
        slots = before.remainder(W)
        nb = -(-n // W)
        pad = nb * W - n
        keys = torch.cat([ring_k[slots], k, k.new_zeros(pad, *k.shape[1:])])  # [W - 1 + nb * W, Hkv, d]
        vals = torch.cat([ring_v[slots], v, v.new_zeros(pad, *v.shape[1:])])
        # Block b: queries b*W .. b*W+W-1, keys (window index j) at positions p + b*W - W + 1 + j, j < 2W - 1.
        kb = keys.unfold(0, 2 * W - 1, W).permute(0, 1, 3, 2)  # [nb, Hkv, 2W - 1, d]
        vb = vals.unfold(0, 2 * W - 1, W).permute(0, 1, 3, 2)
        qb = torch.cat([q, q.new_zeros(pad, *q.shape[1:])]).view(nb, W, *q.shape[1:]).transpose(1, 2)  # [nb, H, W, d]
        i = torch.arange(W, device=device)[:, None]
        j = torch.arange(2 * W - 1, device=device)[None, :]
        band = (j >= i) & (j <= i + W - 1)  # causal and inside the window: [W, 2W - 1]
        key_pos = p - W + 1 + W * torch.arange(nb, device=device)[:, None] + j[0][None, :]  # [nb, 2W - 1]
        mask = band[None] & (key_pos >= 0)[:, None, :]  # keys before the sequence's start do not exist
        out = attend(qb, kb, vb, mask[:, None], self.softcap)
        out = out.transpose(1, 2).reshape(nb * W, *q.shape[1:])[:n]
        if s.ring_boundary is not None and not s.scratch:  # the ring as it stands at the boundary, kept aside
            self._keep_at(layer, s, keys, vals, s.ring_boundary - (p - W + 1))
        if not s.scratch:  # the chunk's last W keys become the ring (extra_forward tokens are never kept)
            m = min(n, W)
            kept = torch.arange(p + n - m, p + n, device=device).remainder(W)
            ring_k.index_copy_(0, kept, k[n - m :].to(ring_k.dtype))
            ring_v.index_copy_(0, kept, v[n - m :].to(ring_v.dtype))
        return out

    def _keep_at(self, layer: int, s: SequenceSlice, keys: torch.Tensor, vals: torch.Tensor, end: int) -> None:
        """keys/vals [W - 1 + ..., Hkv, d] from position p - W + 1 on; the W positions before index `end` (the
        boundary b, p < b: end >= W) into a ring laid out as the live one (position t in slot t % W)."""
        W, b = self.window, s.ring_boundary
        kept = self._at_boundary.get(s.seq_id)
        if kept is None or kept[0] != b:
            shape = (self.k.shape[0], W, *self.k.shape[3:])
            kept = self._at_boundary[s.seq_id] = (b, self.k.new_zeros(shape), self.v.new_zeros(shape))
        slots = torch.arange(b - W, b, device=keys.device).remainder(W)  # negative positions: masked when read
        kept[1][layer].index_copy_(0, slots, keys[end - W : end].to(kept[1].dtype))
        kept[2][layer].index_copy_(0, slots, vals[end - W : end].to(kept[2].dtype))

    def _decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        seqs, W, device = batch.decode, self.window, q.device
        if all(s.token_start == s.start_pos for s in seqs):
            pos = batch.decode_positions  # [B] device tensor (a graph's static buffer under CUDA graphs)
        else:  # a method that compacts its cache: cache index != token position
            pos = device_tensor([s.token_start for s in seqs], torch.long, device)
        cos, sin = rotary_at(pos, self.inv_freq)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        B, R = len(seqs), self.k.shape[1]
        rows = [self.row(s.seq_id) for s in seqs]
        flat_k, flat_v = self.k[layer].view(R * W, *k.shape[1:]), self.v[layer].view(R * W, *v.shape[1:])
        if B == 1:  # a host int: no index tensor to build (the graph decoder's case)
            slot = rows[0] * W + pos.remainder(W)
        else:
            row_t = self._row_tensors.get(tuple(rows))
            if row_t is None:  # built by the eager step before a graph of the batch is captured
                row_t = self._row_tensors[tuple(rows)] = device_tensor(rows, torch.long, device)
            slot = row_t * W + pos.remainder(W)
        flat_k.index_copy_(0, slot, k.to(flat_k.dtype))
        flat_v.index_copy_(0, slot, v.to(flat_v.dtype))
        if B == 1:
            ring_k, ring_v = self.k[layer, rows[0]][None], self.v[layer, rows[0]][None]  # [1, W, Hkv, d]
        else:
            ring_k, ring_v = self.k[layer, row_t], self.v[layer, row_t]  # [B, W, Hkv, d]
        # Slot j holds position pos - ((pos - j) mod W): present when >= 0 (the window is always in the ring).
        j = torch.arange(W, device=device)[None, :]
        valid = (pos[:, None] - (pos[:, None] - j).remainder(W)) >= 0  # [B, W]
        out = attend(q[:, :, None], ring_k.transpose(1, 2), ring_v.transpose(1, 2), valid[:, None, None],
                     self.softcap)  # [B, H, 1, d]
        return out[:, :, 0]
