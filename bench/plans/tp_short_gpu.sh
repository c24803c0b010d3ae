# Tensor parallelism on 2 GPUs within a few device minutes (run by bench/detached_gpu.sh, COMMIT exported by the
# caller): Llama-3.1-8B shape, RANDOM bf16 weights, infinitehip's default, KV offloaded, TP=1 and TP=2 on the same
# machine: real prefill and decode at 32K, then decode at 256K with the fast prefill. The full plan (1M, the
# largest context, real 1M TTFT) is bench/plans/tp_gpu.sh (~30 minutes). NVLink multicast stays off (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run tp_32k python3 bench/tp_offload_decode_gpu.py --tp 1 2 --context 32768 --preset default --steps 32 --commit $COMMIT --output $OUT_DIR/tp_32k.json
run tp_256k python3 bench/tp_offload_decode_gpu.py --tp 2 1 --context 262144 --fast-prefill --kv-dtype fp8_e4m3 --preset default --steps 32 --commit $COMMIT --output $OUT_DIR/tp_256k_fast.json
