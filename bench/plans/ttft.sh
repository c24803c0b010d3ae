# Time to first token, 8B-shaped model (RANDOM bf16 weights), infinitehip default, one GPU (~20 minutes): resident
# and offloaded (FP8 host store) against dense in the same run (the engine's dense where its KV fits, layer-wise to
# 1M), then prefix caching's second-question TTFT (128K resident, 1M offloaded). Rows of docs/results.md's TTFT tables (file each JSON with `python -m bench.report add`).
#   bench/detached_gpu.sh start bench/plans/ttft.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run ttft_128k python3 -m bench prefill --contexts 131072 --methods infinitehip dense --modes resident offloaded --kv-dtype fp8_e4m3 --phase-times --dense-layerwise --dense-contexts 131072 262144 524288 1048576 --output $OUT_DIR/ttft_128k.json
run ttft_256k python3 -m bench prefill --contexts 262144 --methods infinitehip dense --modes resident offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_256k.json
run ttft_512k_1m python3 -m bench prefill --contexts 524288 1048576 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_512k_1m.json
run prefix_ttft python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --offloaded 1048576 --kv-dtype fp8_e4m3 --output $OUT_DIR/prefix_ttft.json
run hip_attn python3 -m bench hip-attn --contexts 131072 262144 524288 1048576 --output $OUT_DIR/hip_attn.json
# One layer's last 32K prefill chunk at 128K and 1M with the default preset against dense SDPA-flash (the speed issue's
# >= 40x), its parts timed apart: the stages, the block-sparse attention and the landmark saliency update (Triton)
# beside its CPU formulation on the same GPU (the form the GPU ran before the saliency kernel).
run layer_prefill python3 -m bench attention-latency --contexts 131072 1048576 --presets default --prefill-preset default --fast-preset default --skip-decode --budget-s 1 --output $OUT_DIR/attention_latency_prefill.json
