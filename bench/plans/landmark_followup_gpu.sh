#!/usr/bin/env bash
# Follow-ups for landmark representatives (GPU): the failed passkey samples re-run with every-step mask
# refresh, top-k recall at 32K, one-layer latency at 1M. Usage: bench/plans/landmark_followup_gpu.sh MODEL.gguf OUT_DIR
set -u
model=$1; out=$2
for case in "65536 0.5" "262144 0.3" "524288 0.1" "1048576 0.5"; do
  set -- $case
  echo "== AR refresh, length $1 depth $2"
  timeout 150 python3 bench/passkey_sweep.py --model "$model" --model-cache-dir /root/cache --lengths $1 --depths $2 \
    --set 'refresh_intervals=[1,1,1]' --output "$out/ar_$1_$2.json" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+/|Error"
done
echo "== top-k recall NIAH 32K"
timeout 150 python3 bench/topk_recall.py --model "$model" --model-cache-dir /root/cache --output "$out/topk_recall_landmark.json" 2>&1 | tail -4
echo "== latency 1M 3k-fast (eager, landmark)"
timeout 200 python3 bench/attention_latency.py --contexts 1048576 --presets 3k-fast --no-graphs --budget-s 10 2>&1 | tail -12
