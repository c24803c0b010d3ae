# Haystack genres and the held-out protocol (eval/ruler/haystacks.py), Gemma 3 270M, one GPU (~15 minutes).
# Tuning (seeds 0-1, one prompt a depth, 10 a cell) on the three tuning genres where long-context misses are:
# code (SymPy's source, 1M; held-out until its misses were seen, now tuning), licences (1M) and pydoc (512K), for
# three candidates: infinitehip's default, a question budget of 512 (1,024 read the same on the old cells) and
# tokenselect's default (the method `auto` would run past the trained length instead). A cell already filed under
# bench/results (same command, seeds and prompts) is read from there instead of rerun (FILED=none reruns all). The
# default's code cell is traced (`--trace true`: which pruning stage loses the needle). bench/pick_setting.py picks
# the winner on those files alone (it refuses held-out ones); then the winner and the default on the held-out genres
# at 1M (shakespeare, cmudict, catalogs; seed 2, one prompt a depth, never used to choose). The dense calibration at
# 4K is on the results page already and is not rerun.
# File the results with `python -m bench.report add` (bench/README.md). MODEL_DIR holds gemma.gguf and its
# conversion (bench/device_models.py); CORPORA the exported texts (`python -m bench.device_corpora pack .corpora`,
# carried).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
FILED=${FILED:-bench/results/ruler/h200/gemma3-270m}
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --plots false --haystack-dir $CORPORA --tasks niah_single_word"
TUNE="--seeds 0 1 --samples-per-depth 1"
declare -A FLAGS=([default]="--method infinitehip" [qk512]="--method infinitehip --question-keep-tokens 512"
                  [tokenselect]="--method tokenselect")
declare -A FILE_TAG=([default]="infinitehip-default" [qk512]="infinitehip-qk512" [tokenselect]="tokenselect-default")
# tune V GENRE LENGTH SUFFIX: the cell's result file, the filed one when there is one
tune() {
  local filed=$FILED/$2.niah_single_word.${FILE_TAG[$1]}.$4.s0-1.json
  if [ -e "$filed" ]; then cp "$filed" $OUT_DIR/tune_$1_$2.json; echo "$(date +%T) tune_$1_$2 filed" >> $OUT_DIR/progress
  else run tune_$1_$2 $G ${FLAGS[$1]} ${TRACE:-} $TUNE --haystacks $2 --lengths $3 --output $OUT_DIR/tune_$1_$2.json; fi
}
PICK=()
for v in default qk512 tokenselect; do
  TRACE=$([ $v = default ] && echo "--trace true") tune $v code 1048576 1m
  tune $v licenses 1048576 1m
  tune $v pydoc 524288 512k
  python3 -c "import json,sys; json.dump({'samples': [s for f in sys.argv[1:] for s in json.load(open(f))['samples']]}, open('$OUT_DIR/tune_$v.json','w'))" \
    $OUT_DIR/tune_${v}_code.json $OUT_DIR/tune_${v}_licenses.json $OUT_DIR/tune_${v}_pydoc.json
  PICK+=("$v=$OUT_DIR/tune_$v.json=${FLAGS[$v]}")  # one word each: the flags hold spaces
done
W=$(python3 bench/pick_setting.py "${PICK[@]}" 2> $OUT_DIR/pick.log)
echo "winner flags: '$W'" >> $OUT_DIR/pick.log
HELD="--seeds 2 --samples-per-depth 1 --haystacks shakespeare cmudict catalogs --lengths 1048576"
run heldout_winner $G $W $HELD --output $OUT_DIR/heldout_winner.json
[ "$W" != "${FLAGS[default]}" ] && run heldout_default $G ${FLAGS[default]} $HELD --output $OUT_DIR/heldout_default.json
