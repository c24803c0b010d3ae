# The graph-captured short chunk (`short_chunk_graphs`, attention/infinitehip/short_chunk.py) on one GPU (~6 minutes):
# its CUDA test (replay against the eager static work), then a second question's TTFT on a 128K resident document
# with and without it, same machine, the 8B-shaped model (RANDOM bf16 weights); --verify checks the hit's greedy
# tokens against caching off. Then the one real-text cell not run at the current default (sotu 512K; needs the
# Gemma 3 GGUF joined under /root, as the real-text plans).
#   bench/detached_gpu.sh start bench/plans/short_chunk.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run sc_test python3 -m pytest -q tests/attention/test_short_chunk.py -p no:cacheprovider
run ttft_default python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --kv-dtype fp8_e4m3 --output $OUT_DIR/prefix_ttft_default.json
run ttft_graphs python3 -m bench prefix-ttft --preset default --warmup-tokens 65536 --resident 131072 --kv-dtype fp8_e4m3 --method-config '{"short_chunk_graphs": true}' --verify --output $OUT_DIR/prefix_ttft_short_graphs.json
wait_file /root/gemma_ready
run sotu512 python3 -m bench ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --plots false --tasks niah_single_word --method infinitehip --haystacks sotu --lengths 524288 --seeds 0 1 2 --output $OUT_DIR/ruler_ih_sotu512k.json
