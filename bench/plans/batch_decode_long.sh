# Serving throughput at 127K (the prompt and its 80 decoded tokens within the 128K trained length, which every method but auto refuses to pass) (~5 minutes): one and four sequences, dense and infinitehip, KV resident and offloaded,
# random Llama-3-8B-shaped bf16 weights (say so wherever reported). Rows of docs/results.md.
run batch128k python3 -m bench batch-decode --model random8b --contexts 130048 --batch-sizes 1 4 --methods dense infinitehip --modes resident offloaded --output $OUT_DIR/batch_decode_128k.json
# Offloaded batches from one graph of all their sequences (OffloadConfig.batch_decode_graph: the weights read once a
# step, each key list resolved every step) beside each sequence's graph in turn (the default, which keeps the bank
# rows of a sequence alone): four at 127K (~3 minutes), then two at 1M, FP8 store, `--fast-prefill` (the prefill's
# attention replaced by zeros: six 1M prefills, ~10 minutes; host memory for two 1M stores, or the planner refuses).
run batch128k_one_graph python3 -m bench batch-decode --model random8b --contexts 130048 --batch-sizes 1 4 --methods infinitehip --modes offloaded offloaded-one-graph --output $OUT_DIR/batch_decode_128k_one_graph.json
run batch1m_one_graph python3 -m bench batch-decode --model random8b --contexts 1048576 --batch-sizes 1 2 --methods infinitehip --modes offloaded-one-graph offloaded --kv-dtype fp8_e4m3 --fast-prefill --output $OUT_DIR/batch_decode_1m_one_graph.json
