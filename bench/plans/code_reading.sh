# Why infinitehip reads the code word wrong on code at 1M while every decode step attends it (docs/real-text.md,
# "What the genres show": reading misses, not selection misses), Gemma 3 270M, one GPU (~10 minutes). Each variant
# changes one part of the attended set towards tokenselect's (which reads 9/10 on these prompts): fewer pruned
# final-stage tokens, tokenselect's sink and window, finer final chunks, the question's chunks nearly alone. Code is a
# tuning genre (seeds 0-1, 10 prompts a cell; the default's 5/10 is filed). A variant that reads >= 9/10
# goes next on licences, pydoc, sotu and essays (tuning) before any held-out genre. MODEL_DIR holds gemma.gguf
# (bench/device_models.py); CORPORA the exported texts (`python -m bench.device_corpora pack .corpora`, carried).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
wait_file $MODEL_DIR/gemma_ready
G="python3 -m bench ruler --model $MODEL_DIR/gemma.gguf --model-cache-dir $MODEL_DIR/cache --prefill-chunk-size 32768 --plots false --haystack-dir $CORPORA --tasks niah_single_word"
CODE="--haystacks code --lengths 1048576 --seeds 0 1 --samples-per-depth 1 --method infinitehip"
run keep1024 $G $CODE --keep-tokens 32768 8192 1024 --early-last-keep-tokens 2048 --output $OUT_DIR/code_keep1024.json
run sink_window $G $CODE --sink-tokens 128 --stream-tokens 512 --output $OUT_DIR/code_sink128_stream512.json
run chunk8 $G $CODE --chunk-sizes 256 32 8 --output $OUT_DIR/code_chunk8.json
run question_alone $G $CODE --keep-tokens 32768 8192 256 --early-last-keep-tokens 256 --question-keep-tokens 2048 --trace true --output $OUT_DIR/code_question_alone.json
