# Second pass over infinitehip's default and the real-text cells (run by bench/detached_gpu.sh): the tiled chunk
# join, the speed targets re-measured (one layer at 1M; the 8B-shaped model offloaded at 1M with the default
# banks and with a 128K-token attention bank), InfiniPot with pooled catalyst scores (chosen on seeds 0-1 at 32K,
# the winner run on held-out seed 2 to 1M), no loss against dense at 4K/7K, more 1M samples of the defaults.
# Gemma 3's GGUF arrives in parts and is prepared by .gguf/gemma_prep.sh (see question_default_gpu.sh).
run merge python3 bench/chunk_merge_latency.py --output $OUT_DIR/chunk_merge_latency.json
run lat python3 bench/attention_latency.py --contexts 1048576 --presets 3k-fast default --fast-preset default --skip-prefill --budget-s 1 --output $OUT_DIR/attention_latency_default.json
run off python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --dense-layerwise --output $OUT_DIR/offload_default.json
run off_bank python3 bench/offload_decode_gpu.py --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset default --min-attention-bank 131072 --output $OUT_DIR/offload_default_bank128k.json
wait_file /root/gemma_ready
G="python3 -m infinitehip.cli.main eval ruler --model /root/gemma.gguf --model-cache-dir /root/cache --prefill-chunk-size 32768 --haystacks essays --plots false --tasks niah_single_word"
P="$G --method infinipot --lengths 32000 --seeds 0 1 --samples-per-depth 1"
run pot_q64p7 $P --preset 4k --question-tokens 64 --pool-tokens 7 --output $OUT_DIR/pot_sel_q64p7.json
run pot_q64p15 $P --preset 4k --question-tokens 64 --pool-tokens 15 --output $OUT_DIR/pot_sel_q64p15.json
run pot_q64p7n0 $P --preset 4k --question-tokens 64 --pool-tokens 7 --novelty-fraction 0 --output $OUT_DIR/pot_sel_q64p7n0.json
run pot_p7 $P --preset 4k --pool-tokens 7 --output $OUT_DIR/pot_sel_p7.json
python3 bench/pick_setting.py "q64p7=$OUT_DIR/pot_sel_q64p7.json=--preset 4k --question-tokens 64 --pool-tokens 7" \
  "q64p15=$OUT_DIR/pot_sel_q64p15.json=--preset 4k --question-tokens 64 --pool-tokens 15" \
  "q64p7n0=$OUT_DIR/pot_sel_q64p7n0.json=--preset 4k --question-tokens 64 --pool-tokens 7 --novelty-fraction 0" \
  "p7=$OUT_DIR/pot_sel_p7.json=--preset 4k --pool-tokens 7" > $OUT_DIR/pot_winner.args 2> $OUT_DIR/pot_pick.log
run pot_held $G --method infinipot $(cat $OUT_DIR/pot_winner.args) --lengths 32000 131072 --seeds 2 --samples-per-depth 2 --output $OUT_DIR/gemma_infinipot_heldout.json
run short_ih $G --method infinitehip --lengths 4096 7000 --samples-per-depth 2 --output $OUT_DIR/gemma_short_infinitehip.json
run short_ts $G --method tokenselect --lengths 4096 7000 --samples-per-depth 2 --output $OUT_DIR/gemma_short_tokenselect.json
run g_1m_ih $G --method infinitehip --lengths 1048576 --seeds 0 --samples-per-depth 1 --trace true --output $OUT_DIR/gemma_1m_infinitehip_s0.json
run pot_1m $G --method infinipot $(cat $OUT_DIR/pot_winner.args) --lengths 1048576 --seeds 2 --depths 0.1 0.5 0.9 --samples-per-depth 1 --output $OUT_DIR/gemma_infinipot_1m.json
run g_1m_ts $G --method tokenselect --lengths 1048576 --seeds 0 --samples-per-depth 1 --trace true --output $OUT_DIR/gemma_1m_tokenselect_s0.json
