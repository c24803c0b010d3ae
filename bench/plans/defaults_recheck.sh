# The defaults after the short-chunk graphs joined them, one GPU (~12 minutes): the short chunk's CUDA tests; multi-key
# NIAH at 128K with infinitehip's and tokenselect's defaults (Gemma 3 270M; needs the GGUF joined under /root, as the
# real-text plans); then the decode speed at 1M as the issue states it, alone on the machine: one Llama-3-8B layer
# (dense SDPA-flash, the paper's 3k-fast) and the 8B-shaped model (RANDOM bf16 weights) with the KV offloaded.
#   bench/detached_gpu.sh start bench/plans/defaults_recheck.sh DIR; then bench/detached_gpu.sh poll DIR SECS
run sc_test python3 -m pytest -q tests/attention/test_short_chunk.py -p no:cacheprovider
wait_file /root/gemma_ready
run mk_ih python3 -m bench ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --plots false --tasks niah_multikey --method infinitehip --haystacks essays --lengths 131072 --seeds 0 1 2 --output $OUT_DIR/ruler_mk_ih_128k.json
run mk_ts python3 -m bench ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --plots false --tasks niah_multikey --method tokenselect --haystacks essays --lengths 131072 --seeds 0 1 2 --output $OUT_DIR/ruler_mk_ts_128k.json
run lat python3 -m bench attention-latency --contexts 1048576 --presets 3k-fast default --fast-preset default --skip-prefill --budget-s 1 --output $OUT_DIR/attention_latency_default.json
run off python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --dense-layerwise --output $OUT_DIR/offload_default.json
