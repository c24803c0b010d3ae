# Haystack genres and the held-out protocol (eval/ruler/haystacks.py), Gemma 3 270M, one GPU (~15 minutes): dense
# calibration of every task on every genre at 4K; infinitehip's default and two question-vote budgets on the tuning
# genres where the unseen-genre misses were (1M licences, 512K pydoc; seeds 0-1); bench/pick_setting.py picks the
# winner on those alone (it refuses held-out files); then the winner, the default (when another) and tokenselect's
# default on the held-out genres at 1M (seed 2, never used to choose).
# File the results with `python -m bench.report add` (bench/README.md). MODEL_DIR holds gemma.gguf and its conversion (bench/device_models.py); CORPORA the exported texts
# (`python -m bench.device_corpora pack .corpora`, carried).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --plots false --haystack-dir $CORPORA"
run calib $G --method dense --tasks niah_single_word niah_multivalue niah_multiquery vt_chain niah_paraphrase niah_two_part --haystacks sotu essays pydoc licenses code shakespeare cmudict --lengths 4096 --seeds 0 --samples-per-depth 1 --output $OUT_DIR/calibration_dense_4k.json
declare -A FLAGS=([default]="" [qk1024]="--question-keep-tokens 1024" [qk512]="--question-keep-tokens 512")
PICK=()
for v in default qk1024 qk512; do
  run tune_$v $G --method infinitehip ${FLAGS[$v]} --tasks niah_single_word --seeds 0 1 --samples-per-depth 1 --haystacks licenses --lengths 1048576 --output $OUT_DIR/tune_${v}_licenses.json
  run tune_${v}_p $G --method infinitehip ${FLAGS[$v]} --tasks niah_single_word --seeds 0 1 --samples-per-depth 1 --haystacks pydoc --lengths 524288 --output $OUT_DIR/tune_${v}_pydoc.json
  python3 -c "import json,sys; a=[json.load(open(f))['samples'] for f in sys.argv[1:]]; json.dump({'samples': a[0]+a[1]}, open('$OUT_DIR/tune_$v.json','w'))" $OUT_DIR/tune_${v}_licenses.json $OUT_DIR/tune_${v}_pydoc.json
  PICK+=("$v=$OUT_DIR/tune_$v.json=${FLAGS[$v]}")  # one word each: the flags hold spaces
done
W=$(python3 bench/pick_setting.py "${PICK[@]}" 2> $OUT_DIR/pick.log)
echo "winner flags: '$W'" >> $OUT_DIR/pick.log
run heldout_winner $G --method infinitehip $W --tasks niah_single_word --seeds 2 --samples-per-depth 2 --haystacks code shakespeare cmudict --lengths 1048576 --output $OUT_DIR/heldout_infinitehip_winner.json
[ -n "$W" ] && run heldout_default $G --method infinitehip --tasks niah_single_word --seeds 2 --samples-per-depth 2 --haystacks code shakespeare cmudict --lengths 1048576 --output $OUT_DIR/heldout_infinitehip_default.json
run heldout_ts $G --method tokenselect --tasks niah_single_word --seeds 2 --samples-per-depth 1 --haystacks code shakespeare cmudict --lengths 1048576 --output $OUT_DIR/heldout_tokenselect.json
