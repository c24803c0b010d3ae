#!/usr/bin/env bash
# The GPU runs the second 2026-11-24 session left open (issues 3, 4, 6), batched for device calls.
#   bench/plans/next_gpu.sh model OUT    needs /root/smol.gguf (carried in parts, see the device README): where the
#                                  offloaded prefill's time goes (embedded model, 64K, profile), then the passkey
#                                  sweep 64K-512K with the paper's 3k preset on the current code (1M: ~40 s/sample)
#   bench/plans/next_gpu.sh offload OUT  8B-shaped random model offloaded at 256K: 3k and 3k-fast (per-preset table)
set -u
part=$1; out=$2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "$part" = model ]; then
  timeout 200 python3 bench/offload_decode_gpu.py --model embedded --gguf /root/smol.gguf --model-cache-dir /root/cache \
    --passkey --contexts 65536 --steps 16 --warmup-steps 8 --compare-resident --profile-prefill --profile-rows 30 2>&1 \
    | grep -v -i warn > "$out/offload_prefill_profile_64k.log"; grep "^| \|==" "$out/offload_prefill_profile_64k.log"
  timeout 330 python3 bench/passkey_sweep.py --model /root/smol.gguf --model-cache-dir /root/cache --method infinitehip \
    --preset 3k --lengths 65536 131072 262144 524288 --depths 0.1 0.3 0.5 0.7 0.9 --budget-s 280 \
    --output "$out/passkey_sweep_3k.json" 2>&1 | tail -6
else
  for p in 3k 3k-fast; do
    timeout 280 python3 bench/offload_decode_gpu.py --contexts 262144 --steps 64 --warmup-steps 40 --preset $p 2>&1 \
      | grep -v -i warn > "$out/offload_8b_256k_$p.log"; grep "^| 262" "$out/offload_8b_256k_$p.log"
  done
fi
