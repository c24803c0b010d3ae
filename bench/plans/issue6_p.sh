# 2026-11-25: InfiniPot KV memory vs input length on the embedded model with the 4k-retrieval preset, 64K-1M.
wait_file /root/smol.gguf
run ip_memory_retrieval python3 bench/infinipot_memory.py --lengths 65536 262144 1048576 --preset 4k-retrieval --model /root/smol.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --output $OUT_DIR/infinipot_memory_retrieval.json
