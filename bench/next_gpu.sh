#!/usr/bin/env bash
# The GPU runs the 2026-11-24 session left open (issues 3 and 4), batched for two device calls.
#   bench/next_gpu.sh model OUT    needs /root/smol.gguf (carried in parts, see the device README): offloaded vs
#                                  resident vs resident-again tokens at 128K on the embedded model (passkey), then
#                                  the passkey sweep 64K-1M with the current decode path (graphs on)
#   bench/next_gpu.sh offload OUT  8B-shaped random model offloaded at 512K (host KV 64 GiB) and 1M if it fits
set -u
part=$1; out=$2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$part" = model ]; then
  timeout 280 python3 bench/offload_decode_gpu.py --model embedded --gguf /root/smol.gguf --model-cache-dir /root/cache \
    --passkey --contexts 131072 --steps 24 --warmup-steps 8 --compare-resident --repeat-resident 2>&1 \
    | grep -v -i warn | tee "$out/offload_embedded_128k.log" | grep "==\|^| "
  timeout 300 python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --method infinitehip \
    --preset 3k --lengths 65536 131072 262144 1048576 --depths 0.1 0.5 0.9 --budget-s 240 \
    --output "$out/passkey_sweep_graphs.json" 2>&1 | tail -6
else
  timeout 560 python3 bench/offload_decode_gpu.py --contexts 524288 --steps 64 --warmup-steps 40 --preset 3k-flash 2>&1 \
    | grep -v -i warn | tee "$out/offload_8b_512k.log" | tail -6
fi
