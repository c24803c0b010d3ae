#!/usr/bin/env bash
# Runs a plan of GPU benchmarks detached from the device call (a device call lasts at most 10 minutes; the plan
# may last longer) and polls it back. A plan is a bash file of `run NAME COMMAND...` lines; each command's
# output goes to DIR/NAME.log, and `wait_file PATH` waits for a file another call brings (the joined GGUF).
#   bench/detached_gpu.sh start PLAN DIR   (returns at once)
#   bench/detached_gpu.sh poll DIR SECS    (waits up to SECS for the plan to end, prints each log's tail and
#                                           copies the logs and JSON files to $OUT)
# The machine is given back 30 s after a call ends, detached runs with it: poll back to back.
set -u
cmd=$1
if [ "$cmd" = start ]; then
  plan=$2; dir=$3
  mkdir -p "$dir"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
  setsid bash -c "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT_DIR=$dir
    run() { name=\$1; shift; echo \"\$(date +%T) \$name\" >> $dir/progress; \"\$@\" > $dir/\$name.log 2>&1; }
    wait_file() { while [ ! -e \"\$1\" ]; do sleep 2; done; }
    source $plan
    touch $dir/done" < /dev/null > /dev/null 2>&1 &
  echo started
else
  dir=$2; end=$((SECONDS + ${3:-500}))
  # Results are copied to $OUT on every pass: a poll killed at the call's limit (which shrinks to the session's
  # last device seconds) still brings back what was written so far.
  while [ ! -e "$dir/done" ] && [ $SECONDS -lt $end ]; do
    [ -n "${OUT:-}" ] && cp "$dir"/*.log "$dir"/*.json "$OUT"/ 2>/dev/null
    sleep 5
  done
  cat "$dir/progress"
  for f in "$dir"/*.log; do echo "== $f"; grep -v -i warn "$f" | tail -${TAIL:-12}; done
  [ -n "${OUT:-}" ] && cp "$dir"/*.log "$dir"/*.json "$OUT"/ 2>/dev/null  # a device call's results come back from $OUT
  [ -e "$dir/done" ] && echo DONE
fi
