# Tensor parallelism on 2 GPUs of one host (kind nvidia-h100-x2 or larger; 4M needs ~256 GiB of host memory or GPU
# spill), KV offloaded, 8B-shaped model (RANDOM bf16 weights), infinitehip default, CUDA-graph decode; TP=1 and
# TP=2 one after the other on the same machine. Rows of docs/results.md's tensor-parallel table: 1M with a real,
# warm prefill (~6 device minutes), the largest context with TP=2 (~6), then the short 32K/256K pair (~4).
#   bench/detached_gpu.sh start bench/plans/tensor_parallel.sh DIR; then bench/detached_gpu.sh poll DIR SECS
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run tp_1m python3 -m bench tensor-parallel --tp 1 2 --context 1048576 --cold-context 32768 --kv-dtype fp8_e4m3 --preset default --output $OUT_DIR/tp_1m.json
run tp_4m python3 -m bench tensor-parallel --tp 2 --find-max 4194304 3145728 --fast-prefill --kv-dtype fp8_e4m3 --preset default --output $OUT_DIR/tp_4m_fast.json
run tp_32k python3 -m bench tensor-parallel --tp 1 2 --context 32768 --preset default --output $OUT_DIR/tp_32k.json
run tp_256k python3 -m bench tensor-parallel --tp 2 1 --context 262144 --fast-prefill --kv-dtype fp8_e4m3 --preset default --output $OUT_DIR/tp_256k_fast.json
