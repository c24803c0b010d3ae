# Whole-model TTFT, 8B-shaped model (RANDOM bf16 weights), infinitehip default: resident vs offloaded (FP8 store,
# prefill from a staged copy of each layer) at 128K and 256K, then offloaded at 512K and 1M. Cold requests of 32K
# tokens first (kernels compiled), then the measured one. About 15 minutes on an H100.
run ttft_128k_256k python3 bench/prefill_gpu.py --contexts 131072 262144 --methods infinitehip --modes resident offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_128k_256k.json
run ttft_512k python3 bench/prefill_gpu.py --contexts 524288 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_512k.json
run ttft_1m python3 bench/prefill_gpu.py --contexts 1048576 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 --cold-context 32768 --phase-times --output $OUT_DIR/ttft_1m.json
