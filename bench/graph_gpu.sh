#!/usr/bin/env bash
# GPU batch for the sync-free / CUDA-graph decode (device time is scarce: two calls, the GGUF carried in parts).
#   bench/graph_gpu.sh latency OUT   one Llama-3-8B layer: engine decode step replayed from CUDA graphs vs dense
#   bench/graph_gpu.sh model OUT     embedded model graph == eager tokens; 8B-shaped random model tok/s vs dense
set -u
part=$1; out=$2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$part" = latency ]; then
  timeout 400 python3 bench/attention_latency.py --presets 3k 3k-fast 3k-flash --skip-prefill --budget-s 1.5 \
    --output "$out/attention_latency_graph.json" > "$out/attention_latency_graph.log" 2>&1
  tail -22 "$out/attention_latency_graph.log"
else
  timeout 200 python3 bench/graph_decode_check.py --model /root/smol.gguf --model-cache-dir /root/cache \
    --lengths 32768 131072 --preset 3k-fast --max-tokens 48 2>&1 | grep -v -i warn | tee "$out/graph_decode_check.log" | tail -12
  timeout 330 python3 bench/decode_gpu.py --contexts 131072 262144 --steps 64 --warmup-steps 40 \
    --methods dense infinitehip:3k-fast infinitehip:3k-flash --no-graphs 2>&1 | tee "$out/decode_gpu_8b.log" | tail -14
fi
