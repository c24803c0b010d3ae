# The graph-captured short chunk (`short_chunk_graphs`, attention/methods/infinitehip/short_chunk.py) on one GPU (~4 minutes):
# its CUDA tests (replay against the eager static work, the Triton selection against the eager prefill), then a
# second question's TTFT on a 128K resident document at the default (graphs on) and with the eager prefill, same
# machine, the 8B-shaped model (RANDOM bf16 weights); --verify checks the hit's greedy tokens against caching off.
#   bench/detached_gpu.sh start bench/plans/short_chunk.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run sc_test python3 -m pytest -q tests/attention/test_short_chunk.py -p no:cacheprovider
run ttft_default python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --kv-dtype fp8_e4m3 --verify --output $OUT_DIR/prefix_ttft_default.json
run ttft_eager python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --kv-dtype fp8_e4m3 --method-config '{"short_chunk_graphs": false}' --verify --output $OUT_DIR/prefix_ttft_eager_short_chunk.json
