# Speed of infinitehip's default (question-time selection, 16-token final chunks, refresh 32/16/8) against the
# speed targets, baselines in the same run: one Llama-3-8B layer at 1M (dense SDPA-flash, the paper's 3k-fast) and
# the 8B-shaped model (random weights) decoding 1M tokens with the KV offloaded (FP8 store), dense layer-wise; then
# the default with 3k-flash's refresh intervals (96/24/8).
run lat python3 bench/attention_latency.py --contexts 1048576 --presets 3k-fast default --fast-preset default --skip-prefill --budget-s 1 --output $OUT_DIR/attention_latency_default.json
run off python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --dense-layerwise
run off_flash python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --set refresh_intervals=[96,24,8]
