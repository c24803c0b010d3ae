# Serving throughput at 128K (~5 minutes): one and four sequences, dense and infinitehip, KV resident and offloaded,
# random Llama-3-8B-shaped bf16 weights (say so wherever reported). Rows of docs/results.md.
run batch128k python3 -m bench batch-decode --model random8b --contexts 131072 --batch-sizes 1 4 --methods dense infinitehip --modes resident offloaded --output $OUT_DIR/batch_decode_128k.json
