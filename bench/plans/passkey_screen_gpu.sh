#!/usr/bin/env bash
# Screen config variants on the passkey cases the 64K-1M sweep missed (needs /root/smol.gguf, see the device README).
#   bench/plans/passkey_screen_gpu.sh OUT [VARIANT=JSON ...]
set -u
out=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
args=()
for v in "$@"; do args+=(--variant "$v"); done
timeout 560 python3 bench/passkey_variants.py --model /root/smol.gguf --model-cache-dir /root/cache \
  --cases 65536:0.5 262144:0.3 524288:0.1 "${args[@]}" --output "$out/passkey_screen.json" 2>&1 \
  | grep -v -i warn | tee "$out/passkey_screen.log" | tail -12
