# Decode speed of infinitehip's default at 1M tokens, baselines in the same run, one GPU (~10 minutes): one
# Llama-3-8B layer (dense SDPA-flash, the paper's 3k-fast), then the 8B-shaped model (RANDOM bf16 weights) decoding
# with the KV offloaded (FP8 store), dense layer-wise, with the default banks and a 128K-token attention bank; the
# bank resolve alone last. Rows of docs/results.md's decode tables (file each JSON with `python -m bench.report add`).
#   bench/detached_gpu.sh start bench/plans/decode_speed.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run lat python3 -m bench attention-latency --contexts 1048576 --presets 3k-fast default --fast-preset default --skip-prefill --budget-s 1 --output $OUT_DIR/attention_latency_default.json
run off python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --dense-layerwise --output $OUT_DIR/offload_default.json
run off_bank python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --min-attention-bank 131072 --output $OUT_DIR/offload_default_bank128k.json
run resolve python3 -m bench offload-resolve --kv-dtype fp8_e4m3 --output $OUT_DIR/offload_resolve.json
