#!/usr/bin/env bash
# One time-boxed GPU batch per part (device time is scarce). Usage: bench/plans/session_gpu.sh PART MODEL.gguf OUT_DIR
#   recall   top-k recall at 32K (passkey, NIAH), TokenSelect single-layer latency, all six methods compared at 16K/128K
#   long     methods compared at 1M (all but dense and infinitehip, whose 1M runs are in the passkey sweeps), latency
set -u
part=$1; model=$2; out=$3
cache=/root/cache
compare() { python3 -m infinitehip.cli.main eval compare --model "$model" --model-cache-dir "$cache" --show-progress false \
  --prefill-chunk-size 32768 --tasks passkey --depths 0.1 0.5 0.9 "$@" 2>&1 | grep -vE "Warning|warn" | tail -40 ; }
if [ "$part" = recall ]; then
  for task in passkey niah; do
    echo "== top-k recall $task 32K"
    timeout 150 python3 bench/topk_recall.py --model "$model" --model-cache-dir "$cache" --task $task --length 32768 \
      --chunk 32768 --sample-rows 64 --output "$out/topk_recall_landmark_${task}_32768.json" 2>&1 | tail -4
  done
  echo "== tokenselect latency"
  timeout 200 python3 bench/tokenselect_latency.py --output "$out/tokenselect_latency.json" 2>&1 | tail -9
  echo "== compare 16K, 128K"
  timeout 240 bash -c "$(declare -f compare); model=$model cache=$cache; compare --lengths 16384 131072 --max-context 140000 \
    --output-dir $out/compare_16k_128k"
else
  echo "== compare 1M"
  timeout 300 bash -c "$(declare -f compare); model=$model cache=$cache; compare --lengths 1048576 --max-context 1100000 \
    --methods tokenselect infinipot streaming truncate --output-dir $out/compare_1m"
  echo "== attention latency"
  timeout 270 python3 bench/attention_latency.py --presets 3k 3k-fast 3k-flash --budget-s 3 --output "$out/attention_latency.json" 2>&1 | tail -14
fi
