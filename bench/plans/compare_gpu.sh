#!/usr/bin/env bash
# Baselines vs InfiniteHiP on the GPU: passkey + NIAH accuracy, prefill time, decode tok/s, peak KV memory,
# dropped tokens (truncate). Dense runs up to --max-context past the model's trained length, to show it fail.
# Usage: bench/plans/compare_gpu.sh [MODEL] [OUT_DIR]   (MODEL: HF dir or .gguf; default: the embedded SmolLM2-135M, trained to 8K)
set -eu
model=${1:-}; out=${2:-bench/results/compare_gpu}
python3 -m infinitehip.cli.main eval compare ${model:+--model "$model"} \
  --methods dense infinitehip streaming truncate --tasks passkey niah \
  --lengths 4096 8192 16384 32768 65536 --depths 0.1 0.5 0.9 --samples 1 \
  --max-context 70000 --show-progress false --output-dir "$out"
