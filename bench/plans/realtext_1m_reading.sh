# Why Gemma 3 misses at 1M with the needle attended (docs/real-text.md, "1M is a reading problem"), one GPU:
# repetition apart from length (the essays are ~154K tokens, so 1M repeats them ~7 times): 128K whose haystack
# repeats an 18,724-token stretch 7 times, against the suite's 128K (results.md, 29/30); tokenselect's 1M misses
# traced; then the decode-speed question of docs/tensor-parallel.md: the 8B-shaped offloaded decode at 1M after a
# real prefill, against the fast-prefill figure, on one machine. MODEL_DIR as in realtext_gemma.sh.
#   bench/detached_gpu.sh start bench/plans/realtext_1m_reading.sh DIR; then bench/detached_gpu.sh poll DIR SECS
MODEL_DIR=${MODEL_DIR:-/root}
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --haystacks essays --plots false --tasks niah_single_word"
run span128k $G --method infinitehip --lengths 131072 --seeds 0 1 --haystack-span 18724 --output $OUT_DIR/ih_128k_span18724.json
run ts_trace_1m $G --method tokenselect --lengths 1048576 --trace true --output $OUT_DIR/ts_trace_1m.json
run off_real python3 -m bench offload-decode --kv-dtype fp8_e4m3 --graph-times --contexts 1048576 --preset default --output $OUT_DIR/offload_default_real_prefill.json
run off_fast python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --output $OUT_DIR/offload_default_fast_prefill.json
