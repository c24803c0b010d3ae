# The TTFT table in one run (8B-shaped model, RANDOM bf16 weights, infinitehip default, H100): resident and
# offloaded (FP8 store) against dense in the same run (engine dense where its KV fits: 128K, 256K; layer-wise to 1M),
# then prefix caching's second-question TTFT (128K resident,
# 1M offloaded, real prefill). About 20 minutes.
run ttft_128k python3 bench/prefill_gpu.py --contexts 131072 --methods infinitehip dense --modes resident offloaded --kv-dtype fp8_e4m3 --phase-times --dense-layerwise --dense-contexts 131072 262144 524288 1048576 --output $OUT_DIR/ttft_128k.json
run ttft_256k python3 bench/prefill_gpu.py --contexts 262144 --methods infinitehip dense --modes resident offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_256k.json
run ttft_512k_1m python3 bench/prefill_gpu.py --contexts 524288 1048576 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_512k_1m.json
run prefix_ttft python3 bench/prefix_ttft_gpu.py --preset default --warmup-tokens 65536 --resident 131072 --offloaded 1048576 --kv-dtype fp8_e4m3 --out $OUT_DIR/prefix_ttft.json
