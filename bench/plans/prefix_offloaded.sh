# Prefix caching's second question on a 1M-token document with the KV offloaded (FP8 host store), the 8B-shaped model
# (RANDOM bf16 weights), real prefill, one GPU (~5 minutes); the 128K resident rows are bench/plans/short_chunk.sh's.
#   bench/detached_gpu.sh start bench/plans/prefix_offloaded.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run prefix_1m python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident --offloaded 1048576 --kv-dtype fp8_e4m3 --output $OUT_DIR/prefix_ttft_1m_offloaded.json
