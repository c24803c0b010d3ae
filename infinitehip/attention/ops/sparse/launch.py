"""Launch configurations of the sparse attention kernels (triton.py): tile sizes, warps and stages of the prefill
kernel within the shared-memory budget, the decode kernel's tiles, and how many splits a decode's key lists get.
`DecodeLaunch` is also the dense paged decode's (attention/methods/dense/paged_decode/)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


SHARED_MEMORY_BUDGET = 160 * 1024  # bytes of tiles per program: under sm_80's 164 KiB, with room for layout scratch


def prefill_shared_bytes(cfg: dict, half_pad: int, group_pad: int, elem_bytes: int) -> int:
    """The tiles the prefill kernel keeps in shared memory: Q [BLOCK_M, d] plus K and V [BLOCK_N, d] per stage."""
    d_pad = 2 * half_pad
    return (cfg["BLOCK_Q"] * group_pad + 2 * cfg["num_stages"] * cfg["BLOCK_N"]) * d_pad * elem_bytes


def prefill_config(half_pad: int, group_pad: int, query_block_size: int, elem_bytes: int = 2) -> dict:
    """Launch config of the prefill kernel: BLOCK_Q queries x GROUP_PAD heads make the M = BLOCK_M rows.

    Measured on an H100 (Llama-3-8B shapes, bf16, d=128, 2048 listed keys per 64-query block): M=256 with
    BLOCK_N=64 and 8 warps ran best (184 TFLOP/s); M=128 is best with BLOCK_N=32 and 4 warps (144); M=512
    or M=256 on 4 warps spill. More rows per program also means fewer programs gathering and rotating the
    same keys. d > 128 halves the target M (the fp32 accumulator is M x d).
    """
    block_m_target = 256 if half_pad <= 64 else 128
    block_q = max(1, min(triton.next_power_of_2(query_block_size), block_m_target // group_pad))
    block_q = max(block_q, triton.cdiv(16, group_pad))  # tl.dot needs M >= 16
    block_m = block_q * group_pad
    num_warps = 8 if block_m * 2 * half_pad >= 256 * 128 else 4
    block_n = 64 if num_warps == 8 and half_pad <= 64 else 32
    cfg = dict(BLOCK_Q=block_q, BLOCK_N=block_n, num_warps=num_warps, num_stages=2)
    # fp32 caches at d = 256 (Gemma 3 in float32) would need 256 KiB: fewer query rows, then one stage
    while prefill_shared_bytes(cfg, half_pad, group_pad, elem_bytes) > SHARED_MEMORY_BUDGET:
        if cfg["BLOCK_Q"] * group_pad > 16 and cfg["BLOCK_Q"] > 1:
            cfg["BLOCK_Q"] //= 2
        elif cfg["num_stages"] > 1:
            cfg["num_stages"] -= 1
        else:
            break
    return cfg


@dataclass(frozen=True)
class DecodeLaunch:
    """Launch parameters of a split-K decode kernel (tile of keys, warps, software-pipeline stages); None: the
    kernel's default for the shape."""

    block_n: int | None = None  # keys a tile
    num_warps: int | None = None
    num_stages: int | None = None
    fused_merge: bool | None = None  # the last split of a (sequence, kv head) merges it (split_k.merge_if_last_split);
    # None: off

    def __post_init__(self):
        if self.block_n is not None and (self.block_n < 16 or self.block_n & (self.block_n - 1)):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")
        if self.num_warps not in (None, 1, 2, 4, 8, 16) or not 1 <= (self.num_stages or 1) <= 8:
            raise ValueError(f"num_warps in 1..16 (a power of two) and num_stages in 1..8 expected, "
                             f"got {self.num_warps}, {self.num_stages}")

    def over(self, default: "DecodeLaunch") -> "DecodeLaunch":
        """This launch with its unset fields taken from `default`."""
        return DecodeLaunch(self.block_n or default.block_n, self.num_warps or default.num_warps,
                            self.num_stages or default.num_stages,
                            default.fused_merge if self.fused_merge is None else self.fused_merge)


def sparse_decode_launch(batch: int, num_kv_heads: int, half_pad: int) -> DecodeLaunch:
    """Default launch of the sparse decode kernel (BLOCK_H rows = the GQA group padded to >= 16). Measured on an H100
    (bench/suites/paged_decode.py --op sparse: Llama-3-8B's layer, ~3K listed keys, fp16 tables): the 8 (sequence,
    kv head) pairs of one sequence read fastest in 64-key tiles, the 64 of eight sequences in 32-key tiles (shorter
    tiles: more of them in flight per split); both 4 warps, 2 stages. Head dims above 128 keep 32-key tiles."""
    if half_pad > 64 or batch * num_kv_heads > 8:
        return DecodeLaunch(block_n=32, num_warps=4, num_stages=2)
    return DecodeLaunch(block_n=64, num_warps=4, num_stages=2)


def default_num_splits(batch: int, num_kv_heads: int, max_keys: int, device: torch.device) -> int:
    """Splits of the key list in decode: ~8 programs per SM (they are small: one GQA group, 4 warps) and
    at most ~512 keys per split, but at least 128 keys per split (each split costs a partial write + merge).

    Measured on an H100 (Hkv=8, d=128, bf16, CUDA graphs): B=1/K=4096 -> 32 splits, 26 us (400 us
    unsplit); B=8/K=3072 -> 17, ~79 us (best seen 73); B=32/K=2048 -> 5, 163 us (best seen 157);
    B=128/K=2048 -> 4, ~576 us (best seen 562).
    """
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    want = max(triton.cdiv(8 * sms, max(1, batch * num_kv_heads)), triton.cdiv(max_keys, 512))
    return max(1, min(want, triton.cdiv(max_keys, 128), 64))
