#!/usr/bin/env bash
# TokenSelect and InfiniPot on the GPU in one time-boxed batch (issue 6): passkey with the embedded model,
# TokenSelect single-layer latency, InfiniPot memory vs length.
# Usage: bench/plans/methods_gpu.sh PART MODEL.gguf OUT_DIR   (PART: accuracy | speed)
set -u
part=$1; model=$2; out=$3
sweep() { method=$1; budget=$2; shift 2; echo "== passkey $method"; python3 bench/passkey_sweep.py --method "$method" --model "$model" \
  --model-cache-dir /root/cache --depths 0.1 0.5 0.9 --budget-s "$budget" --output "$out/passkey_$method.json" "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+/|Error|budget" ; }
if [ "$part" = accuracy ]; then
  sweep tokenselect 200 --lengths 16384 65536 131072 262144
  sweep infinipot 200 --lengths 16384 65536 131072 262144
else
  echo "== tokenselect latency"; timeout 300 python3 bench/tokenselect_latency.py 2>&1 | tail -8
  echo "== infinipot memory"; timeout 200 python3 bench/infinipot_memory.py --lengths 8192 32768 131072 --pot-tokens 4096 --random-8b \
    --output "$out/infinipot_memory.json" 2>&1 | tail -8
fi
