"""The cascade's cache update as one Triton kernel (same results as `reference.py`).

One program per (layer, KV head) walks the plan: push j carries the stride token's k/v row and score from slot
first + j; at each sub-cache the op says where the carried row goes (FILL: an empty slot; PASS: the oldest slot,
whose row is carried on; COMPARE: the newest slot, written only where the carried score is at least the newest's).
The rows move inside the circular buffers in place: no concatenation, no copy of the cache. Pushes are sequential
(each reads what the earlier ones wrote), layers and heads run in parallel; the row stays in the same threads'
registers throughout, with a barrier after each op all the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.host_values import host_to_device
from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _cascade_update_kernel(K, V, Scores, Flat, Ops, Slots, first, n, C, D,
                           stride_kl, stride_ks, stride_kh, stride_sl, stride_sh, BLOCK_D: tl.constexpr):
    layer = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    od = tl.arange(0, BLOCK_D)
    md = od < D
    k_base = K + layer * stride_kl + head * stride_kh + od
    v_base = V + layer * stride_kl + head * stride_kh + od
    s_base = Scores + layer * stride_sl + head * stride_sh
    for j in range(n):
        src = first + j
        row = tl.load(Flat + src) * stride_ks
        carry_k = tl.load(k_base + row, mask=md, other=0.0)
        carry_v = tl.load(v_base + row, mask=md, other=0.0)
        carry_s = tl.load(s_base + src)
        for i in range(C):
            op = tl.load(Ops + j * C + i)
            slot = tl.load(Slots + j * C + i).to(tl.int64)
            live = op != 0
            at = tl.load(Flat + slot, mask=live, other=0) * stride_ks
            held_k = tl.load(k_base + at, mask=md & live, other=0.0)
            held_v = tl.load(v_base + at, mask=md & live, other=0.0)
            held_s = tl.load(s_base + slot, mask=live, other=0.0)
            write = (op == 1) | (op == 2) | ((op == 3) & (carry_s >= held_s))
            tl.store(k_base + at, carry_k, mask=md & write)
            tl.store(v_base + at, carry_v, mask=md & write)
            tl.store(s_base + slot, carry_s, mask=write)
            tl.debug_barrier()
            passes = op == 2
            carry_k = tl.where(passes, held_k, carry_k)
            carry_v = tl.where(passes, held_v, carry_v)
            carry_s = tl.where(passes, held_s, carry_s)


def cascade_update_triton(k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, flat_slots: torch.Tensor,
                          ops: torch.Tensor, slots: torch.Tensor, first: int) -> None:
    """reference.cascade_update_reference's arguments; k/v share one layout, scores contiguous in its last dim."""
    n, C = ops.shape
    if n == 0:
        return
    L, _, Hkv, D = k.shape
    if k.stride() != v.stride() or k.stride(-1) != 1 or scores.stride(-1) != 1:
        raise ValueError("cascade update: k and v must share a layout with contiguous rows, scores contiguous slots")
    device = k.device
    # The plan is host-made: staged in pinned memory, so the copy does not wait for the step's queued kernels
    ops = host_to_device(ops.to(torch.int32).contiguous(), device)
    slots = host_to_device(slots.to(torch.int32).contiguous(), device)
    flat = flat_slots.to(device=device, dtype=torch.int64).contiguous()
    _cascade_update_kernel[(L, Hkv)](
        k, v, scores, flat, ops, slots, first, n, C, D,
        k.stride(0), k.stride(1), k.stride(2), scores.stride(0), scores.stride(1),
        BLOCK_D=triton.next_power_of_2(D))
