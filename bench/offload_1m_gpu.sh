#!/usr/bin/env bash
# Issue 4's long runs: 8B-shaped random model offloaded with 3k-flash, 512K with a BF16 host store, then 1M with
# an FP8 (e4m3) store (1M BF16 would need 128 GiB of host memory). Each prefill takes minutes, so the script runs
# detached and a poll reads its log:
#   bench/offload_1m_gpu.sh start LOGDIR      (returns at once; the runs go on in their own session)
#   bench/offload_1m_gpu.sh poll LOGDIR SECS  (waits up to SECS for the runs to end, then prints the tables)
set -u
cmd=$1; dir=$2
if [ "$cmd" = start ]; then
  mkdir -p "$dir"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
  setsid bash -c "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    python3 bench/offload_decode_gpu.py --contexts 524288 --steps 64 --warmup-steps 40 --preset 3k-flash \
      > $dir/offload_8b_512k_bf16.log 2>&1
    python3 bench/offload_decode_gpu.py --contexts 1048576 --steps 64 --warmup-steps 40 --preset 3k-flash \
      --kv-dtype fp8_e4m3 > $dir/offload_8b_1m_fp8.log 2>&1
    touch $dir/done" < /dev/null > /dev/null 2>&1 &
  echo started
else
  end=$((SECONDS + ${3:-500}))
  while [ ! -e "$dir/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  for f in "$dir"/*.log; do echo "== $f"; grep -v -i warn "$f" | grep "^| \|KV capacity\|Error\|error\|==" | tail -8; done
  grep -h -o "Prefill[^|]*" "$dir"/*.log 2>/dev/null | tail -2
  [ -e "$dir/done" ] && echo DONE
fi
