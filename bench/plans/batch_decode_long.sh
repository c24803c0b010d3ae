# Serving throughput at 127K (the prompt and its 80 decoded tokens within the 128K trained length, which every method but auto refuses to pass) (~5 minutes): one and four sequences, dense and infinitehip, KV resident and offloaded,
# random Llama-3-8B-shaped bf16 weights (say so wherever reported). Rows of docs/results.md.
run batch128k python3 -m bench batch-decode --model random8b --contexts 130048 --batch-sizes 1 4 --methods dense infinitehip --modes resident offloaded --output $OUT_DIR/batch_decode_128k.json
