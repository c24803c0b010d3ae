#!/usr/bin/env bash
# Runs a plan of GPU benchmarks detached from the device call (a device call lasts at most 10 minutes; the plan
# may last longer) and polls it back. A plan is a bash file of `run NAME COMMAND...` lines; each command's
# output goes to DIR/NAME.log, and `wait_file PATH` waits for a file another call brings (the joined GGUF); the
# commands are `python3 -m bench SUITE ...` (bench/README.md).
#   bench/detached_gpu.sh start PLAN[,PLAN...] DIR   (returns at once; several plans run one after another, so
#                                           the most needed go first when device time is short; ONLY="NAME..."
#                                           runs only the `run` lines whose names match those shell patterns)
#   bench/detached_gpu.sh poll DIR SECS    (waits up to SECS for the plan to end, prints each log's tail and
#                                           archives DIR to $OUT/results.tgz)
# The machine is given back 30 s after a call ends, detached runs with it: poll back to back.
set -u
cmd=$1
if [ "$cmd" = start ]; then
  plan=$2; dir=$3
  mkdir -p "$dir/tree"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
  # The plan runs from its own copy of the tree: each later device call re-copies the working tree, and a module
  # imported while that happens is missing (seen: ModuleNotFoundError mid-plan).
  tar --exclude=./.gguf --exclude=./.venv -cf - . | tar -xf - -C "$dir/tree"
  cd "$dir/tree"
  setsid bash -c "export PYTHONPATH=/tmp/site:$dir/tree PYTHONUNBUFFERED=1 OUT_DIR=$dir
    run() { local name=\$1; shift; keep \$name || return 0; echo \"\$(date +%T) \$name\" >> $dir/progress; \"\$@\" > $dir/\$name.log 2>&1; }
    keep() { [ -z \"\${ONLY:-}\" ] && return 0; local - p; set -f; for p in \$ONLY; do case \$1 in \$p) return 0;; esac; done; return 1; }
    wait_file() { while [ ! -e \"\$1\" ]; do sleep 2; done; }
    for p in ${plan//,/ }; do source \$p; done
    touch $dir/done" < /dev/null > /dev/null 2>&1 &
  echo started
else
  dir=$2; end=$((SECONDS + ${3:-500}))
  # A fresh machine (the last one was given back) has no plan: say so at once instead of polling nothing.
  [ -e "$dir/progress" ] || [ -d "$dir/tree" ] || { echo "no plan in $dir: this is a fresh machine"; exit 3; }
  # Results go to $OUT as one archive (a device call brings back at most 8 files), rewritten on every pass: a poll
  # killed at the call's limit (which shrinks to the session's last device seconds) still brings back what was
  # written so far.
  save() { [ -n "${OUT:-}" ] && tar czf "$OUT/results.tgz.tmp" -C "$dir" --exclude=./tree . && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
  while [ ! -e "$dir/done" ] && [ $SECONDS -lt $end ]; do
    save
    sleep 5
  done
  cat "$dir/progress"
  for f in "$dir"/*.log; do echo "== $f"; grep -v -i warn "$f" | tail -${TAIL:-12}; done
  save
  [ -e "$dir/done" ] && echo DONE
fi
