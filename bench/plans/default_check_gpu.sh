# infinitehip's default (question-time selection, 16-token final chunks, refresh 96/24/8) against the speed
# targets, baselines from the same run, then the Gemma 3 270M real-text cells not yet measured: dense calibration
# at 4K/7K per task, InfiniPot with the prompt's question in its catalyst, the defaults at 1M, the baselines at 32K.
# Run by bench/detached_gpu.sh. Gemma's GGUF arrives in parts under /root/ and is prepared by .gguf/gemma_prep.sh
# (see bench/plans/question_default_gpu.sh for why its tokenizer files are copied in).
run lat python3 bench/attention_latency.py --contexts 1048576 --presets 3k-fast 3k-flash default --fast-preset default --skip-prefill --budget-s 1 --output $OUT_DIR/attention_latency_default.json
run merge python3 bench/chunk_merge_latency.py --output $OUT_DIR/chunk_merge_latency.json
run off python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --dense-layerwise
wait_file /root/gemma_ready
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false"
run g_cal $G --method dense --tasks niah_single_word niah_single_number niah_multikey --lengths 4096 7000 --samples-per-depth 2 --output $OUT_DIR/gemma_dense_calibration.json
# InfiniPot: variants chosen on seeds 0-1 at 32K (10 samples each), the winner then run on held-out seed 2.
P="$G --method infinipot --tasks niah_single_word --lengths 32000 --seeds 0 1 --samples-per-depth 1"
run pot_4k $P --preset 4k --output $OUT_DIR/pot_sel_4k.json
run pot_q64 $P --preset 4k --question-tokens 64 --output $OUT_DIR/pot_sel_q64.json
run pot_rq64 $P --preset 4k-retrieval --question-tokens 64 --output $OUT_DIR/pot_sel_rq64.json
run pot_q64n25 $P --preset 4k --question-tokens 64 --novelty-fraction 0.25 --output $OUT_DIR/pot_sel_q64n25.json
python3 bench/pick_setting.py "q64=$OUT_DIR/pot_sel_q64.json=--preset 4k --question-tokens 64" \
  "q64n25=$OUT_DIR/pot_sel_q64n25.json=--preset 4k --question-tokens 64 --novelty-fraction 0.25" \
  "rq64=$OUT_DIR/pot_sel_rq64.json=--preset 4k-retrieval --question-tokens 64" \
  "4k=$OUT_DIR/pot_sel_4k.json=--preset 4k" > $OUT_DIR/pot_winner.args 2> $OUT_DIR/pot_pick.log
run pot_held $G --method infinipot $(cat $OUT_DIR/pot_winner.args) --tasks niah_single_word --lengths 32000 131072 --seeds 2 --samples-per-depth 2 --output $OUT_DIR/gemma_infinipot_heldout.json
run g_1m_ih $G --method infinitehip --tasks niah_single_word --lengths 1048576 --seeds 2 --samples-per-depth 1 --trace true --output $OUT_DIR/gemma_1m_infinitehip.json
run g_1m_ts $G --method tokenselect --tasks niah_single_word --lengths 1048576 --seeds 2 --samples-per-depth 1 --trace true --output $OUT_DIR/gemma_1m_tokenselect.json
run g_base $G --method streaming --tasks niah_single_word --lengths 32000 --samples-per-depth 1 --output $OUT_DIR/gemma_streaming.json
run g_trunc $G --method truncate --tasks niah_single_word --lengths 32000 --samples-per-depth 1 --output $OUT_DIR/gemma_truncate.json
