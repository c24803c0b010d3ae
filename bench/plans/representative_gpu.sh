#!/usr/bin/env bash
# Passkey accuracy with landmark vs bisection representatives on the embedded model (GPU).
# Usage: bench/plans/representative_gpu.sh MODEL.gguf OUT_DIR [LENGTHS...]
set -u
model=$1; out=$2; shift 2; lengths=${*:-"16384 65536 131072 262144"}
run() { name=$1; budget=$2; shift 2; echo "== $name"; python3 bench/passkey_sweep.py --model "$model" --model-cache-dir /root/cache \
  --lengths $lengths --depths 0.1 0.5 0.9 --budget-s "$budget" --output "$out/representative_$name.json" "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+/|Error" ; }
run landmark 200 --set 'representative="landmark"'
run landmark_5k 120 --preset 5k --set 'representative="landmark"'
