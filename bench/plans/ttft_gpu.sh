# Whole-model time to first token, 8B-shaped model (RANDOM bf16 weights), infinitehip default vs dense, 128K:
# resident (phase split, then a kernel profile) and offloaded (FP8 store), dense layer-wise to 1M, and the prefix
# cache's second-question TTFT at 128K. About 12 minutes on an H100.
run ttft_128k python3 bench/prefill_gpu.py --contexts 131072 --methods infinitehip dense --modes resident --phase-times --dense-layerwise --dense-contexts 131072 262144 524288 1048576 --output $OUT_DIR/ttft_128k.json
run ttft_128k_profile python3 bench/prefill_gpu.py --contexts 131072 --methods infinitehip --modes resident --cold-context 32768 --profile-rows 45 --output $OUT_DIR/ttft_128k_profile.json
run ttft_128k_offloaded python3 bench/prefill_gpu.py --contexts 131072 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_128k_offloaded.json
run prefix_128k python3 bench/prefix_ttft_gpu.py --resident 131072 --out $OUT_DIR/prefix_ttft_128k.json
