# Where 1M offloaded decode's refresh steps lose time: the default's bank and store sizes against larger ones, one
# GPU, one plan (~12 minutes). The 8B-shaped model (RANDOM bf16 weights), KV offloaded (FP8 store), `--fast-prefill`.
# Bank and store sizes change which rows cross PCIe, never the attention's arithmetic: a setting that wins here is a
# speed-only default (same tokens). Rows: the default (mask bank sized for one stage, 8 of 32 store layers in GPU
# memory), a 2x mask bank, 3/4 of the free GPU memory for store layers, both.
#   bench/detached_gpu.sh start bench/plans/decode_banks.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run base python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --output $OUT_DIR/banks_default.json
run mask2x python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --mask-bank-tokens 262144 --output $OUT_DIR/banks_mask2x.json
run store75 python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --gpu-store-fraction 0.75 --output $OUT_DIR/banks_store075.json
run both python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --mask-bank-tokens 262144 --gpu-store-fraction 0.75 --output $OUT_DIR/banks_both.json
