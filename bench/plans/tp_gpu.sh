# Issue 23 on nvidia-h100-x2 (2 GPUs, 256 GiB host): tensor parallelism with the KV offloaded, Llama-3.1-8B shape,
# RANDOM bf16 weights, InfiniteHiP 3k-fast, CUDA-graph decode. TP=1 and TP=2 run one after the other on the same
# machine. Start:  bench/detached_gpu.sh start bench/plans/tp_gpu.sh /root/tp   then poll: bench/detached_gpu.sh poll /root/tp 540
# NVLink multicast stays off (KINDS.md), also in the torchrun children.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# 1. short and real: TTFT and decode at 32K, both sizes (~3 min); if CUDA graphs fail under NCCL, the eager run says so
run tp_32k python3 bench/tp_offload_decode_gpu.py --tp 1 2 --context 32768 --output $OUT_DIR/tp_32k.json
run tp_32k_eager python3 bench/tp_offload_decode_gpu.py --tp 2 --context 32768 --no-graphs --steps 32 --output $OUT_DIR/tp_32k_eager.json
# 2. decode tokens/s at 1M, FP8 host store (as docs/benchmarks.md's 1M rows), fast prefill (~6 min)
run tp_1m_fast python3 bench/tp_offload_decode_gpu.py --tp 1 2 --context 1048576 --fast-prefill --kv-dtype fp8_e4m3 --output $OUT_DIR/tp_1m_fast.json
# 3. largest context with TP=2 (first that the planners accept and that runs, largest first; ~5 min)
run tp2_max python3 bench/tp_offload_decode_gpu.py --tp 2 --find-max 4194304 3670016 3145728 2621440 2097152 --fast-prefill --kv-dtype fp8_e4m3 --steps 16 --output $OUT_DIR/tp2_max.json
# 4. real TTFT at 1M (real prefill: ~9 min at TP=1 on one H100, less at TP=2; ~15 min for both)
run tp_1m_real python3 bench/tp_offload_decode_gpu.py --tp 2 1 --context 1048576 --kv-dtype fp8_e4m3 --steps 16 --output $OUT_DIR/tp_1m_real.json
