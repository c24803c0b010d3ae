"""Offline register / spill report of the landmark kernels for sm_90a (H100), no GPU needed.

Compiles each kernel with the launch configuration the wrappers pick for Llama-3-8B shapes (32 q heads,
8 kv heads, d 128, bf16, page size 64), specialized like a real launch (16-byte aligned pointers, ints
divisible by 16 hinted, ints equal to 1 constant), and runs the bundled ptxas -v. A kernel that spills or
needs > 255 registers is slow on the GPU whatever its grid.

    python bench/ptxas_report.py
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from infinitehip.attention.infinitehip.representatives import triton as sal
from infinitehip.attention.infinitehip.scoring import representative_triton as rep


def compile_sm90(fn, args: dict, num_warps: int, num_stages: int):
    """args: name -> '*dtype' (pointer), an int sample value, or anything else (a constexpr)."""
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        v = args[name]
        if isinstance(v, str) and v.startswith("*"):
            sig[name], attrs[(i,)] = v, [["tt.divisibility", 16]]
        elif isinstance(v, int) and not isinstance(v, bool) and i not in fn.constexprs:
            if v == 1:
                sig[name], consts[name] = "constexpr", 1
            else:
                sig[name] = "i32"
                if v % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name], consts[name] = "constexpr", v
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))


def usage(kernel) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        out = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", ptx, "-o", ptx + ".cubin"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    mma = "wgmma" if "wgmma" in kernel.asm["ptx"] else ("mma.sync" if "mma.sync" in kernel.asm["ptx"] else "fma")
    return (f"{regs.group(1) if regs else '?'} regs, {spill.group(1) if spill else '?'} B spilled, "
            f"smem {kernel.metadata.shared} B, {mma}")


def rep_scores_case(M: int, N: int, b: int, group: bool, dtype: str = "bf16") -> tuple[dict, int, int]:
    H, Hkv, d = 32, 8, 128
    cfg, splits, per = rep._launch_config(M, N, H, b, d // 2, dtype != "fp32")
    op = {"bf16": tl.bfloat16, "fp32": tl.float32}[dtype] if cfg["USE_DOT"] else tl.float32
    args = dict(
        Q=f"*{dtype}", QValid="*u8", K=f"*{dtype}", PageTable="*i32", Reps="*i64", Lens="*i64", Base="*i64",
        Cos="*fp32", Sin="*fp32", Scores="*fp32", N=N, H=H, b=b, kv_group=H // Hkv, page_size=64,
        pos_group=3 if group else 1, rep_offset=1, num_tiles=triton.cdiv(N, cfg["BLOCK_N"]), head_splits=splits,
        heads_per_prog=per, stride_qm=b * H * d, stride_qb=H * d, stride_qh=d, stride_qd=1, stride_vm=b, stride_vb=1,
        stride_ks=Hkv * d, stride_kh=d, stride_kd=1, stride_cos=d // 2, stride_rm=N * H, stride_rn=H, stride_rh=1,
        stride_lm=N, stride_ln=1, stride_bm=N, stride_bn=1, HAS_POS_GROUP=group, HALF=d // 2,
        DOT_PRECISION="tf32x3" if op == tl.float32 else "tf32", OP_DTYPE=op,
        **{k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")},
    )
    return args, cfg["num_warps"], cfg["num_stages"]


def salient_case(U: int, chunk_size: int) -> tuple[dict, int, int]:
    H = 32
    cfg = sal._launch_config(chunk_size, H)
    args = dict(Sum="*fp32", Count="*fp32", PageTable="*i32", Starts="*i64", Lens="*i64", Out="*i64", U=U, H=H,
                page_size=64, chunk_size=chunk_size, stride_ss=H, stride_sh=1,
                **{k: v for k, v in cfg.items() if k != "num_warps"})
    return args, cfg["num_warps"], 3


def main() -> None:
    cases = [
        ("representative scores, prefill stage 1 (b 64, N 4096, relative)", rep._rep_scores_kernel, rep_scores_case(512, 4096, 64, False)),
        ("representative scores, prefill, token_pos_group (dynamic / none)", rep._rep_scores_kernel, rep_scores_case(512, 1024, 64, True)),
        ("representative scores, decode (b 1, N 4096)", rep._rep_scores_kernel, rep_scores_case(1, 4096, 1, False)),
        ("representative scores, prefill fp32 cache", rep._rep_scores_kernel, rep_scores_case(512, 4096, 64, False, "fp32")),
        ("salient tokens, chunk 256", sal._salient_tokens_kernel, salient_case(4096, 256)),
        ("salient tokens, chunk 8", sal._salient_tokens_kernel, salient_case(1 << 17, 8)),
    ]
    print("| kernel (sm_90a) | warps | stages | usage |\n| --- | ---: | ---: | --- |")
    for name, fn, (args, warps, stages) in cases:
        print(f"| {name} | {warps} | {stages} | {usage(compile_sm90(fn, args, warps, stages))} |", flush=True)


if __name__ == "__main__":
    main()
