# Prefix caching on a real model with sliding-window layers: Gemma 3 270M (needs the GGUF joined under /root, as the
# real-text plans), infinitehip default, a second question on a 128K resident document (random token ids: timing
# only), --verify against caching off, one GPU (~2 minutes).
#   bench/detached_gpu.sh start bench/plans/prefix_gemma.sh DIR; then bench/detached_gpu.sh poll DIR SECS
wait_file /root/gemma_ready
run gemma_prefix python3 -m bench prefix-ttft --model /root/gemma.gguf --model-cache-dir /root/cache --preset default --warmup-tokens 65536 --resident 131072 --verify --output $OUT_DIR/prefix_ttft_gemma_128k.json
