# Real-text retrieval (issue 16): the RULER suite with question-time selection (tokenselect default, infinitehip 3k-question) against the
# paper's settings, needle trace on. Settings were chosen on bench/needle_screen.py prompts (CPU, 16K): every
# RULER seed is held out. Not run yet (2026-11-25: the session's device time ran out).
wait_file /root/smol.gguf
R="python3 -m infinitehip.cli.main eval ruler --model /root/smol.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --trace true --plots false --samples-per-depth 1"
run ts_word $R --method tokenselect --tasks niah_single_word niah_single_number --lengths 32768 131072 --seeds 0 1 2 --output $OUT_DIR/ruler_tokenselect.json
run ih_word $R --method infinitehip --preset 3k-question --tasks niah_single_word niah_single_number --lengths 32768 131072 --seeds 0 1 2 --output $OUT_DIR/ruler_infinitehip.json
run ts_paper $R --method tokenselect --preset paper --tasks niah_single_word --lengths 131072 --seeds 0 1 2 --output $OUT_DIR/ruler_tokenselect_paper.json
run ih_default $R --method infinitehip --tasks niah_single_word --lengths 131072 --seeds 0 1 2 --output $OUT_DIR/ruler_infinitehip_paper.json
run ts_long $R --method tokenselect --tasks niah_single_word --lengths 524288 --depths 0.1 0.5 0.9 --seeds 2 --output $OUT_DIR/ruler_tokenselect_long.json
run ih_long $R --method infinitehip --preset 3k-question --tasks niah_single_word --lengths 524288 --depths 0.1 0.5 0.9 --seeds 2 --output $OUT_DIR/ruler_infinitehip_long.json
