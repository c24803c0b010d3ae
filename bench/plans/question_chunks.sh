# Does infinitehip's `question-chunks` preset (keep_tokens 32768 8192 256, early_last_keep_tokens 256: the question's
# chosen chunks nearly alone beside the sink and the window; 9/10 on code at 1M where the default reads 5/10) hold on
# the other tuning genres, and at 128K? Gemma 3 270M, one GPU (~20 minutes). The rule, fixed before the run:
# bench/pick_setting.py compares it with the default on the tuning cells alone (code, licences and sotu/essays at 1M,
# pydoc at 512K; seeds 0-1, one prompt a depth), ties to the default; the winner becomes the default. The held-out
# genres (shakespeare, cmudict, catalogs; seed 2) run for the candidate after the pick and are reported, never used to
# choose (the default's held-out cells are filed). Then the speed the change would move: the whole 8B-shaped model's
# offloaded decode at 1M (random weights) for both presets, and the batch-decode cells the last plan lost.
# A tuning cell already filed under bench/results is read from there (FILED=none reruns all). MODEL_DIR holds
# gemma.gguf (bench/device_models.py); CORPORA the exported texts (`python -m bench.device_corpora pack .corpora`).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
FILED=${FILED:-bench/results/ruler}
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --plots false --haystack-dir $CORPORA --tasks niah_single_word --method infinitehip"
TUNE="--seeds 0 1 --samples-per-depth 1"
QC="--preset question-chunks"
# cell NAME FILED_NAME ARGS...: a tuning cell of the candidate, the filed file when there is one
cell() {
  local name=$1 filed=$FILED/$2; shift 2
  if [ "$FILED" != none ] && [ -e "$filed" ]; then cp "$filed" $OUT_DIR/$name.json; echo "$(date +%T) $name filed" >> $OUT_DIR/progress
  else run $name $G "$@" --output $OUT_DIR/$name.json; fi
}
cell qc_licenses h200/gemma3-270m/licenses.niah_single_word.infinitehip-question-chunks.1m.s0-1.json $QC $TUNE --haystacks licenses --lengths 1048576
cell qc_pydoc h200/gemma3-270m/pydoc.niah_single_word.infinitehip-question-chunks.512k.s0-1.json $QC $TUNE --haystacks pydoc --lengths 524288
cell qc_sotu h200/gemma3-270m/sotu.niah_single_word.infinitehip-question-chunks.1m.s0-1.json $QC $TUNE --haystacks sotu --lengths 1048576
cell qc_essays h200/gemma3-270m/essays.niah_single_word.infinitehip-question-chunks.1m.s0-1.json $QC $TUNE --haystacks essays --lengths 1048576
cp bench/results/ruler/h200/gemma3-270m/code.niah_single_word.infinitehip-question-alone.1m.s0-1.json $OUT_DIR/qc_code.json
D=bench/results/ruler
# pool OUT FILE...: the samples of the files, each file's first prompt a depth only (rep 0 of sample_seed): the
# default's sotu and essays cells hold two a depth, the candidate's one
pool() { python3 -c "import json,sys; json.dump({'samples': [s for f in sys.argv[2:] for s in json.load(open(f))['samples'] if s['seed'] % 100000 < 1000]}, open(sys.argv[1],'w'))" "$@"; }
pool $OUT_DIR/tune_default.json $D/h200/gemma3-270m/code.niah_single_word.infinitehip-default.1m.s0-1.json \
  $D/h200/gemma3-270m/licenses.niah_single_word.infinitehip-default.1m.s0-1.json \
  $D/h200/gemma3-270m/pydoc.niah_single_word.infinitehip-default.512k.s0-1.json \
  $D/h100/gemma3-270m/sotu.niah_single_word.infinitehip-default.1m.s0-1.json \
  $D/h100/gemma3-270m/essays.niah_single_word.infinitehip-default.1m.s0-1.json
pool $OUT_DIR/tune_qc.json $OUT_DIR/qc_code.json $OUT_DIR/qc_licenses.json $OUT_DIR/qc_pydoc.json $OUT_DIR/qc_sotu.json \
  $OUT_DIR/qc_essays.json
python3 bench/pick_setting.py "default=$OUT_DIR/tune_default.json=" "question-chunks=$OUT_DIR/tune_qc.json=$QC" > $OUT_DIR/pick.out 2> $OUT_DIR/pick.log
cell qc_128k h200/gemma3-270m/code+sotu.niah_single_word.infinitehip-question-chunks.128k.s0-1.json $QC $TUNE --haystacks code sotu --lengths 131072
run heldout_qc $G $QC --seeds 2 --samples-per-depth 1 --haystacks shakespeare cmudict catalogs --lengths 1048576 --output $OUT_DIR/heldout_qc.json
run offload_qc python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset question-chunks --output $OUT_DIR/offload_qc.json
run offload_default python3 -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --output $OUT_DIR/offload_default.json
run batch128k_ih python3 -m bench batch-decode --model random8b --contexts 130048 --batch-sizes 1 4 --methods infinitehip --modes resident offloaded --output $OUT_DIR/batch_decode_128k_ih.json
