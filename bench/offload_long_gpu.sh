#!/usr/bin/env bash
# Issue 4's long runs on the 8B-shaped random model, detached (a 2M run outlasts one device call) and polled:
#   bench/offload_long_gpu.sh start LOGDIR      (returns at once; the runs go on in their own session)
#   bench/offload_long_gpu.sh poll LOGDIR SECS  (waits up to SECS for the runs to end, then prints the tables)
# 1. 256K 3k-flash with the real prefill (phase times) and with --fast-prefill: the decode steps must match,
#    which is what licenses --fast-prefill for decode timing at 1M and 2M;
# 2. 1M FP8 store per preset (3k-flash with a decode profile after the timed steps, 3k, 3k-fast);
# 3. 2M FP8 store, 3k-flash: the host holds 28 of 32 layers, the planner spills 4 to GPU memory. The mask bank
#    is fixed at 1M's size (one stage-0 group at 1M, two at 2M) so the banks take the same GPU memory.
set -u
cmd=$1; dir=$2
if [ "$cmd" = start ]; then
  mkdir -p "$dir"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
  setsid bash -c "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    run() { name=\$1; shift; python3 bench/offload_decode_gpu.py --warmup-steps 40 \"\$@\" > $dir/\$name.log 2>&1; }
    run offload_8b_256k_real --contexts 262144 --steps 64 --preset 3k-flash --phase-times
    run offload_8b_256k_fast --contexts 262144 --steps 64 --preset 3k-flash --fast-prefill
    run offload_8b_1m_fp8_3k-flash --contexts 1048576 --steps 88 --profile-steps 24 --preset 3k-flash --kv-dtype fp8_e4m3 --fast-prefill
    run offload_8b_2m_fp8_3k-flash --contexts 2097152 --steps 64 --preset 3k-flash --kv-dtype fp8_e4m3 --fast-prefill --mask-bank-tokens 352256
    run offload_8b_1m_fp8_3k --contexts 1048576 --steps 64 --preset 3k --kv-dtype fp8_e4m3 --fast-prefill
    run offload_8b_1m_fp8_3k-fast --contexts 1048576 --steps 64 --preset 3k-fast --kv-dtype fp8_e4m3 --fast-prefill
    touch $dir/done" < /dev/null > /dev/null 2>&1 &
  echo started
else
  end=$((SECONDS + ${3:-500}))
  while [ ! -e "$dir/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  for f in "$dir"/*.log; do echo "== $f"; grep -v -i warn "$f" | grep "^| [0-9]\|KV capacity\|KV store\|Error\|error\|phases" | tail -6; done
  [ -e "$dir/done" ] && echo DONE
fi
