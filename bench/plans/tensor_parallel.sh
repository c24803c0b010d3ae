# Tensor parallelism on 2 GPUs of one host (kind nvidia-h100-x2 or nvidia-h200-x2), KV offloaded, 8B-shaped model
# (RANDOM bf16 weights), infinitehip default, CUDA-graph decode; TP=1 and TP=2 one after the other on the same
# machine: real prefill and decode at 32K, then decode at 256K with the fast prefill (a few device minutes).
# Makes docs/results.md's tensor-parallel table. NVLink multicast stays off, in the torchrun children too.
#   bench/detached_gpu.sh start bench/plans/tensor_parallel.sh DIR; then bench/detached_gpu.sh poll DIR SECS
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run tp_32k python3 -m bench tensor-parallel --tp 1 2 --context 32768 --preset default --output $OUT_DIR/tp_32k.json
run tp_256k python3 -m bench tensor-parallel --tp 2 1 --context 262144 --fast-prefill --kv-dtype fp8_e4m3 --preset default --output $OUT_DIR/tp_256k_fast.json
