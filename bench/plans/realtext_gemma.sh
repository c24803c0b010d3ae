# Real-text retrieval, Gemma 3 270M, a code word in the essays (niah_single_word), each method at its defaults, each
# sample in its own text (the suite's default --vary-haystack true; the tables before 2026-11-26 used false), one
# GPU: dense calibration at 4K/7K, then each method to 1M. Makes docs/results.md's accuracy tables (several
# sessions: the long lengths take most of a device session each; rerun the plan, `ruler` resumes its files).
# MODEL_DIR holds gemma.gguf (carried in parts; the carrier touches gemma_ready when it is whole) and the
# conversion cache. EXTRA: flags added to every run (e.g. EXTRA="--dtype float32", the precision check of
# docs/real-text.md; results go to the same file names, so give such a run its own OUT_DIR).
MODEL_DIR=${MODEL_DIR:-/root}
EXTRA=${EXTRA:-}
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --haystacks essays --plots false $EXTRA"
run dense $G --method dense --tasks niah_single_word niah_single_number niah_multikey --lengths 4096 7000 --samples-per-depth 2 --output $OUT_DIR/gemma_dense_calibration.json
for m in infinitehip tokenselect; do
  run $m $G --method $m --tasks niah_single_word --lengths 4096 7000 32000 131072 524288 1048576 --output $OUT_DIR/gemma_$m.json
done
run infinipot $G --method infinipot --tasks niah_single_word --seeds 2 --lengths 32000 131072 1048576 --output $OUT_DIR/gemma_infinipot.json
for m in streaming truncate; do
  run $m $G --method $m --tasks niah_single_word --lengths 32000 --output $OUT_DIR/gemma_$m.json
done
