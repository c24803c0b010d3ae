#!/usr/bin/env bash
# GPU batch for the sync-free / CUDA-graph decode (device time is scarce: two calls, the GGUF carried in parts).
#   bench/plans/graph_gpu.sh latency OUT   one Llama-3-8B layer: decode step profile, engine decode step replayed from
#                                    CUDA graphs vs dense, offloaded-KV resolve latency
#   bench/plans/graph_gpu.sh model OUT     embedded model graph == eager tokens; 8B-shaped random model tok/s vs dense
set -u
part=$1; out=$2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$part" = latency ]; then
  timeout 120 python3 bench/decode_profile.py --context 1048576 --preset 3k-fast --top 12 2>&1 | grep -v -i warn > "$out/decode_profile.log"
  grep "###" "$out/decode_profile.log"
  timeout 200 python3 bench/attention_latency.py --presets 3k 3k-fast 3k-flash --skip-prefill --budget-s 1 \
    --output "$out/attention_latency_graph.json" > "$out/attention_latency_graph.log" 2>&1
  grep -A6 "## Summary" "$out/attention_latency_graph.log"
  timeout 100 python3 bench/offload_resolve.py --output "$out/offload_resolve.json" > "$out/offload_resolve.log" 2>&1
  timeout 60 python3 bench/offload_resolve.py --kv-dtype fp8_e4m3 > "$out/offload_resolve_fp8.log" 2>&1
  tail -12 "$out/offload_resolve.log"; tail -4 "$out/offload_resolve_fp8.log"
else
  timeout 200 python3 bench/graph_decode_check.py --model /root/smol.gguf --model-cache-dir /root/cache \
    --lengths 32768 131072 --preset 3k-fast --max-tokens 48 2>&1 | grep -v -i warn | tee "$out/graph_decode_check.log" | tail -8
  timeout 360 python3 bench/decode_gpu.py --contexts 131072 262144 --steps 96 --warmup-steps 100 \
    --methods dense infinitehip:3k-fast infinitehip:3k-flash --no-graphs 2>&1 | tee "$out/decode_gpu_8b.log" | tail -12
fi
