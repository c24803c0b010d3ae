#!/usr/bin/env bash
# Passkey accuracy of InfiniteHiP variants on the embedded model (GPU), one short sweep each.
# Usage: bench/plans/variants_gpu.sh MODEL.gguf OUT_DIR
set -u
model=$1; out=$2; lengths="16384 65536 131072"
run() { name=$1; shift; echo "== $name"; timeout 120 python3 bench/passkey_sweep.py --model "$model" --model-cache-dir /root/cache \
  --lengths $lengths --output "$out/variant_$name.json" "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+/" ; }
run 3k_ar --set 'refresh_intervals=[1,1,1]'
run 5k --preset 5k
run 3k_stream2048 --set 'stream_tokens=2048'
run 3k_all_chunk_indexed --set 'late_pruning_rope="chunk_indexed"'
run 3k_all_relative --set 'early_pruning_rope="relative"'
run dense_16k --method dense --lengths 16384
